"""Probes: compile-level checks of the instrumented PTX (CPU, sm_90a) and the host side
(decode, stall detection, diagnosis, stuck map) on snapshots built byte by byte."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from cutedebug.instrument import probes
from cutedebug.instrument.probes import (
    MAGIC,
    RECORD_FMT,
    RECORD_VALID,
    VERSION,
    ProbeConfig,
    ProbeSnapshot,
    Site,
    SiteTable,
    StallDetector,
    StuckRecord,
)

ROOT = Path(__file__).resolve().parent.parent
MINIMAL = ROOT / "kernels" / "minimal.py"
PIPELINE_KERNELS = [
    (ROOT / "kernels" / "tma_stream.py", "TmaStream", {"m": 256, "n": 512, "ctas": 4}),
    (ROOT / "tests" / "pipeline_kernels" / "tma_copy.py", "TmaCopy", {}),
]
ADDR = 0x7F0000000000
BUDGET = 200_000_000


def lines_containing(path: Path, needle: str) -> list[int]:
    return [i for i, text in enumerate(path.read_text().splitlines(), 1) if needle in text]


def printf_formats(ptx: str) -> list[bytes]:
    return [
        bytes(int(x) for x in m.group(1).split(","))
        for m in re.finditer(r"printfFormat_\d+\[\d+\] = \{([^}]*)\}", ptx)
    ]


def compile_ptx(path: Path, entry: str, params: dict, cfg: ProbeConfig | None, tmp_path, mp):
    pytest.importorskip("cutlass")
    from cutlass import cute

    from cutedebug import kernel_api

    mp.chdir(tmp_path)  # KeepPTX writes the .ptx into the working directory
    obj = kernel_api.load_entry(path, entry)(**params)
    if cfg is None:
        compiled = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](obj, *obj.fake_args())
        return compiled.__ptx__, None
    with probes.instrument(cfg, ADDR) as table:
        compiled = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](obj, *obj.fake_args())
    return compiled.__ptx__, table


@pytest.fixture(scope="module")
def minimal_hang(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    try:
        cfg = ProbeConfig(budget_ns=BUDGET)
        return compile_ptx(
            MINIMAL,
            "Minimal",
            {"n": 4096, "spin_hang": True},
            cfg,
            tmp_path_factory.mktemp("ptx"),
            mp,
        )
    finally:
        mp.undo()


# ---------------------------------------------------------------------------------------------
# Compile level
# ---------------------------------------------------------------------------------------------


def test_unprobed_wait_is_the_library_spin(tmp_path, monkeypatch):
    ptx, _ = compile_ptx(
        MINIMAL, "Minimal", {"n": 4096, "spin_hang": True}, None, tmp_path, monkeypatch
    )
    assert "%globaltimer" not in ptx and ".sys" not in ptx and "exit;" not in ptx
    assert re.search(r"mbarrier\.try_wait\.parity\.shared\.b64 \S+, \[%r\d+\], 0, 10000000;", ptx)


def test_minimal_wait_becomes_bounded_loop(minimal_hang):
    ptx, _ = minimal_hang
    # the library's unbounded spin (suspend-hint form) is gone
    assert not re.search(r"mbarrier\.try_wait\S* \S+, \[[^\]]+\], \S+, \d+;", ptx)
    # loop: try_wait, read %globaltimer, compare the elapsed ns with the budget, branch back
    loop = re.search(
        r"\$(L__BB\d+_\d+):\n\s*mbarrier\.try_wait\.parity[^\n]*\n"
        r"(?:[^\n]*\n){0,3}?\s*mov\.u64\s+%rd\d+, %globaltimer;\n"
        r"\s*sub\.s64[^\n]*\n\s*setp\.lt\.s64\s+%p\d+, %rd\d+, (\d+);\n"
        r"[^\n]*\n\s*@%p\d+ bra\s+\$(L__BB\d+_\d+);",
        ptx,
    )
    assert loop, "no globaltimer-bounded try_wait loop"
    assert int(loop.group(2)) == BUDGET and loop.group(1) == loop.group(3)
    assert "exit;" in ptx
    assert "activemask.b32" in ptx and "%smid" in ptx


def test_minimal_stuck_record_stores_match_decoder_layout(minimal_hang):
    ptx, _ = minimal_hang
    rec_base = ADDR + probes.records_offset(ProbeConfig())
    assert re.search(rf"add\.s64\s+%rd\d+, %rd\d+, {rec_base};", ptx)
    offsets = {
        int(m.group(1) or 0)
        for m in re.finditer(r"st\.relaxed\.sys\.global\.b(?:32|64) \[%rd\d+(?:\+(\d+))?\]", ptx)
    }
    # every non-first field of RECORD_FMT is written with a relaxed sys-scope store
    field_offsets = set()
    off = 0
    for code in RECORD_FMT[1:]:
        field_offsets.add(off)
        off += struct.calcsize("<" + code)
    assert field_offsets - {0} <= offsets
    # the valid word goes last, with release semantics
    assert re.search(
        rf"mov\.b32\s+(%r\d+), {RECORD_VALID};\n\s*st\.release\.sys\.global\.b32 "
        r"\[%rd\d+\], \1;",
        ptx,
    )
    # the counter is a sys-scope atomic on header word 2, magic/version on words 0/1
    assert re.search(
        rf"mov\.b64\s+(%rd\d+), {ADDR + 8};\n\s*atom\.global\.sys\.add\.u32\s+"
        r"%r\d+, \[\1\], 1;",
        ptx,
    )
    assert f"{MAGIC};" in ptx


def test_minimal_beacon_word_matches_decoder(minimal_hang):
    ptx, table = minimal_hang
    site = table.sites[0]
    # the static part of the beacon: site id + 1, stage unknown (raw wait), phase 0
    assert f"{probes.pack_beacon(site.id, None, 0, 0, 0)};" in ptx
    assert re.search(r"st\.relaxed\.sys\.global\.b64 \[%rd\d+\], %rd\d+;", ptx)


def test_minimal_printf_line(minimal_hang):
    ptx, _ = minimal_hang
    fmts = [f for f in printf_formats(ptx) if f.startswith(b"cutedebug: STUCK")]
    assert len(fmts) == 1
    line = (
        MINIMAL.name.encode()
        + b":"
        + str(lines_containing(MINIMAL, "cute.arch.mbarrier_wait(")[0]).encode()
    )
    assert b"site 0 raw_wait mbarrier at " + line in fmts[0]
    assert b"block=(%d,%d,%d) warp=%d stage=%d phase=%d" in fmts[0]


def test_minimal_site_table_points_at_the_wait_line(minimal_hang):
    _, table = minimal_hang
    (site,) = table.sites
    assert Path(site.file).resolve() == MINIMAL
    assert [site.line] == lines_containing(MINIMAL, "cute.arch.mbarrier_wait(")
    assert (site.kind, site.op, site.barrier) == ("raw", "raw_wait", "")
    assert site.code == "cute.arch.mbarrier_wait(mbar, 0)"
    again = SiteTable.from_json(table.to_json())
    assert again.sites == table.sites


def test_clean_kernel_keeps_arrive_and_is_bounded(tmp_path, monkeypatch):
    cfg = ProbeConfig(budget_ns=BUDGET)
    ptx, table = compile_ptx(MINIMAL, "Minimal", {"n": 4096}, cfg, tmp_path, monkeypatch)
    assert "mbarrier.arrive" in ptx and "%globaltimer" in ptx and len(table.sites) == 1


def test_beacons_off_drops_only_the_beacon_store(minimal_hang, tmp_path, monkeypatch):
    ptx_on, _ = minimal_hang
    cfg = ProbeConfig(budget_ns=BUDGET, beacons=False)
    ptx_off, _ = compile_ptx(
        MINIMAL, "Minimal", {"n": 4096, "spin_hang": True}, cfg, tmp_path, monkeypatch
    )
    stores = "st.relaxed.sys.global.b64"
    assert ptx_on.count(stores) - ptx_off.count(stores) == 1
    assert "exit;" in ptx_off and "%globaltimer" in ptx_off


def test_patches_restored_after_context_and_after_error(tmp_path, monkeypatch):
    pytest.importorskip("cutlass")
    import cutlass.cute.arch.mbar as mbar_mod
    from cutlass import cute
    from cutlass.pipeline import helpers

    orig, orig_array = cute.arch.mbarrier_wait, helpers.MbarrierArray.__dict__["wait"]
    with probes.instrument(ProbeConfig(), ADDR):
        assert cute.arch.mbarrier_wait is not orig and mbar_mod.mbarrier_wait is not orig
        assert helpers.MbarrierArray.__dict__["wait"] is not orig_array
        with pytest.raises(RuntimeError), probes.instrument(ProbeConfig(), ADDR):
            pass  # not re-entrant
    assert cute.arch.mbarrier_wait is orig and mbar_mod.mbarrier_wait is orig
    assert helpers.MbarrierArray.__dict__["wait"] is orig_array
    with pytest.raises(ZeroDivisionError), probes.instrument(ProbeConfig(), ADDR):
        1 / 0  # noqa: B018
    assert cute.arch.mbarrier_wait is orig
    assert helpers.MbarrierArray.__dict__["wait"] is orig_array


@pytest.mark.parametrize(
    "path,entry,params", PIPELINE_KERNELS, ids=lambda v: getattr(v, "stem", "")
)
def test_pipeline_kernel_sites(path, entry, params, tmp_path, monkeypatch):
    if not path.exists():
        pytest.skip(f"{path.name} not present")
    cfg = ProbeConfig(budget_ns=BUDGET)
    ptx, table = compile_ptx(path, entry, params, cfg, tmp_path, monkeypatch)
    got = {(s.op, s.barrier): s for s in table.sites}
    expect = {
        ("producer_acquire", "empty"): ".producer_acquire(",
        ("consumer_wait", "full"): ".consumer_wait(",
        ("producer_tail", "empty"): ".producer_tail(",
    }
    assert set(expect) <= set(got)
    for key, needle in expect.items():
        site = got[key]
        assert Path(site.file).resolve() == path.resolve()
        assert site.line in lines_containing(path, needle), (key, site)
        assert site.kind == "pipeline" and site.pipeline_class == "PipelineTmaAsync"
        assert site.stages and site.stages >= 2
    assert got[("consumer_wait", "full")].tx_count > 0
    # every wait is bounded: no suspend-hint spin left, one budget compare per traced wait
    assert not re.search(r"mbarrier\.try_wait\S* \S+, \[[^\]]+\], \S+, \d+;", ptx)
    assert len(re.findall(rf"setp\.lt\.s64\s+%p\d+, %rd\d+, {BUDGET};", ptx)) >= 3
    fmts = b"".join(printf_formats(ptx))
    for (op, bar), site in got.items():
        assert f"site {site.id} {op} {bar} at {site.where}".encode() in fmts


# ---------------------------------------------------------------------------------------------
# Host side: recorded snapshots built with struct, following the documented layout
# ---------------------------------------------------------------------------------------------

SMALL = ProbeConfig(budget_ns=BUDGET, max_ctas=4, max_warps=8, max_records=16)
FILE = "/src/kernels/tma_stream.py"
SITES = [
    Site(
        0,
        "pipeline",
        "producer_acquire",
        "empty",
        "PipelineTmaAsync",
        "",
        FILE,
        227,
        "load",
        "ring.producer_acquire(state)",
        4,
        4,
        None,
    ),
    Site(
        1,
        "pipeline",
        "producer_tail",
        "empty",
        "PipelineTmaAsync",
        "",
        FILE,
        235,
        "load",
        "ring.producer_tail(state)",
        4,
        4,
        None,
    ),
    Site(
        2,
        "pipeline",
        "consumer_wait",
        "full",
        "PipelineTmaAsync",
        "",
        FILE,
        258,
        "compute",
        "ring.consumer_wait(state)",
        4,
        1,
        33024,
    ),
]
RAW_SITES = [
    Site(
        0,
        "raw",
        "raw_wait",
        "",
        "",
        "",
        "/src/kernels/minimal.py",
        60,
        "kernel",
        "cute.arch.mbarrier_wait(mbar, 0)",
    )
]
CONSUMERS, PRODUCER = (0, 1, 2, 3), 4


class Buf:
    """A probe buffer as the device would leave it."""

    def __init__(self, cfg: ProbeConfig = SMALL):
        self.cfg = cfg
        self.b = bytearray(probes.buffer_nbytes(cfg))
        self.n = 0

    def stuck(self, site, cta, warp, stage, phase, seq, waited=BUDGET + 1000, valid=True):
        struct.pack_into("<II", self.b, 0, MAGIC, VERSION)
        off = probes.records_offset(self.cfg) + self.n * probes.RECORD_BYTES
        struct.pack_into(
            RECORD_FMT,
            self.b,
            off,
            RECORD_VALID if valid else 0,
            site,
            cta,
            0,
            0,
            warp,
            stage,
            phase,
            waited,
            10**12 + self.n,
            7,
            0,
            seq,
            cta,
        )
        self.n += 1
        struct.pack_into("<I", self.b, 8, self.n)
        return self

    def beacon(self, site, cta, warp, stage, phase, seq):
        slot = (cta % self.cfg.max_ctas) * self.cfg.max_warps + warp % self.cfg.max_warps
        struct.pack_into(
            "<Q",
            self.b,
            probes.beacons_offset(self.cfg) + 8 * slot,
            probes.pack_beacon(site, stage, phase, seq, cta),
        )
        return self

    def snap(self) -> ProbeSnapshot:
        return probes.decode(bytes(self.b), self.cfg, SITES)


def expect_tx_too_large(ctas=(0, 1)) -> Buf:
    """Full barrier never completes: consumers stuck on full[0] phase 0 waiting for item 1;
    the producer acquired items 1..4 (all stages free) and is stuck on empty[0] for item 5."""
    buf = Buf()
    for c in ctas:
        buf.beacon(0, c, PRODUCER, 3, 1, 4)
        buf.stuck(0, c, PRODUCER, 0, 0, 5)
        for w in CONSUMERS:
            buf.stuck(2, c, w, 0, 0, 1)
    return buf


def test_decode_roundtrip_fields():
    buf = Buf().beacon(2, 1, 3, 2, 1, 7).stuck(2, 1, 3, 3, 1, 8, waited=123_456_789)
    snap = buf.snap()
    (r,) = snap.stuck
    assert r == StuckRecord(
        site_id=2,
        block=(1, 0, 0),
        block_linear=1,
        warp=3,
        stage=3,
        phase=1,
        seq=8,
        waited_ns=123_456_789,
        smid=7,
        lane=0,
        globaltimer=10**12,
    )
    (b,) = snap.beacons
    assert (b.cta, b.warp, b.site_id, b.stage, b.phase, b.seq) == (1, 3, 2, 2, 1, 7)
    assert snap.progress_counter_total == 7 + 1
    raw = probes.unpack_beacon(probes.pack_beacon(0, None, 1, 5, 3), 2)
    assert (raw.stage, raw.phase, raw.seq, raw.cta, raw.site_id) == (-1, 1, 5, 3, 0)


def test_decode_skips_unpublished_and_counts_dropped():
    cfg = ProbeConfig(max_ctas=2, max_warps=4, max_records=2)
    buf = Buf(cfg)
    buf.stuck(2, 0, 0, 0, 0, 1).stuck(2, 0, 1, 0, 0, 1, valid=False)
    struct.pack_into("<I", buf.b, 8, 5)  # 5 reports claimed, room for 2
    snap = probes.decode(bytes(buf.b), cfg, None)
    assert len(snap.stuck) == 1 and snap.n_stuck_reported == 5 and snap.dropped_records == 4
    assert any("did not fit" in line for line in probes.diagnose(snap, SITES))


def test_decode_rejects_foreign_buffers():
    buf = Buf()
    with pytest.raises(ValueError, match="bytes"):
        probes.decode(bytes(buf.b[:-1]), SMALL, None)
    bad = bytearray(buf.b)
    struct.pack_into("<I", bad, 0, 0xDEADBEEF)
    with pytest.raises(ValueError, match="magic"):
        probes.decode(bytes(bad), SMALL, None)
    other = bytearray(buf.b)
    probes.init_buffer(other, ProbeConfig(max_ctas=4, max_warps=8, max_records=8))
    with pytest.raises(ValueError, match="another ProbeConfig"):
        probes.decode(bytes(other), SMALL, None)
    probes.init_buffer(buf.b, SMALL)
    assert probes.decode(bytes(buf.b), SMALL, None).header_magic == MAGIC
    assert probes.buffer_nbytes(ProbeConfig()) == 64 + 1024 * 32 * 8 + 1024 * 64


def test_beacon_slots_wrap_modulo_capacity():
    buf = Buf().beacon(2, 5, 1, 0, 0, 3)  # CTA 5 with max_ctas 4 lands in slot row 1
    (b,) = buf.snap().beacons
    assert b.cta == 5 and b.warp == 1


def test_stall_detection():
    det = StallDetector(stall_s=1.0)
    t, seq = 0.0, 1
    for _ in range(10):  # progressing: a beacon moves every 50 ms
        assert not det.update(Buf().beacon(2, 0, 0, seq % 4, 0, seq).snap(), t)
        t, seq = t + 0.05, seq + 1
    frozen = Buf().beacon(2, 0, 0, 1, 0, seq).snap()
    start = t
    stalled_at = None
    while t < start + 2.0:
        if det.update(frozen, t) and stalled_at is None:
            stalled_at = t
        t += 0.05
    assert stalled_at is not None and 1.0 <= stalled_at - start <= 1.06
    # a stuck record appearing is movement, not stall
    assert not det.update(Buf().beacon(2, 0, 0, 1, 0, seq).stuck(2, 0, 0, 1, 0, seq + 1).snap(), t)
    snaps = [(i * 0.05, frozen) for i in range(30)]
    assert probes.detect_stall(snaps, 1.0) == 0.0
    assert probes.detect_stall(snaps[:10], 1.0) is None


def test_diagnose_expect_tx_too_large():
    lines = probes.diagnose(expect_tx_too_large().snap(), SITES)
    assert lines[0].startswith(
        "2 CTAs (0-1): consumers wait on full[0] phase 0 while the "
        "producer is past it (producer acquired #4, consumer waits for #1)"
    )
    assert "expect_tx larger than the bytes delivered" in lines[0]
    assert len(lines) == 1  # the producer's own wait on empty[0] is a consequence, not reported


def test_diagnose_missing_consumer_release_is_circular():
    buf = Buf()
    for w in CONSUMERS:  # consumed items 1..4, wait for item 5 on full[0] phase 1
        buf.beacon(2, 0, w, 3, 0, 4).stuck(2, 0, w, 0, 1, 5)
    buf.beacon(0, 0, PRODUCER, 3, 1, 4).stuck(0, 0, PRODUCER, 0, 0, 5)
    (line,) = probes.diagnose(buf.snap(), SITES)
    assert line.startswith(
        "CTA 0: circular wait: consumers wait on full[0] phase 1 (#5) and the "
        "producer waits on producer_acquire empty[0] phase 0"
    )
    assert "consumer_release missing" in line


def test_diagnose_producer_waits_while_consumers_done():
    buf = Buf()
    for w in CONSUMERS:
        buf.beacon(2, 0, w, 3, 1, 8)
    buf.beacon(0, 0, PRODUCER, 3, 0, 8).stuck(0, 0, PRODUCER, 0, 1, 9)
    (line,) = probes.diagnose(buf.snap(), SITES)
    assert (
        "producer waits on empty[0] phase 1 while the consumers are done (last "
        "consumer_wait #8)" in line
    )


def test_diagnose_producer_tail():
    buf = Buf()
    for w in CONSUMERS:
        buf.beacon(2, 0, w, 3, 1, 8)
    buf.beacon(0, 0, PRODUCER, 3, 0, 8).stuck(1, 0, PRODUCER, 0, 1, 9)
    (line,) = probes.diagnose(buf.snap(), SITES)
    assert "producer_tail waits on empty[0] phase 1 while the consumers are done" in line


def test_diagnose_phase_bookkeeping():
    buf = Buf()  # 5th item (count 4) of a 4-stage ring must be on phase 1, waits on phase 0
    buf.beacon(0, 0, PRODUCER, 3, 1, 8)
    for w in CONSUMERS:
        buf.beacon(2, 0, w, 3, 0, 4).stuck(2, 0, w, 0, 0, 5)
    (line,) = probes.diagnose(buf.snap(), SITES)
    assert (
        "consumer waits on full[0] phase 0 but its PipelineState count 4 implies full[0] "
        "phase 1" in line
    )


def test_diagnose_raw_nobody_arrived():
    buf = Buf()
    for c in range(3):
        for w in range(4):
            buf.stuck(0, c, w, -1, 0, 0)
    snap = probes.decode(bytes(buf.b), SMALL, None)
    (line,) = probes.diagnose(snap, RAW_SITES)
    assert line.startswith(
        "3 CTAs (0-2): every waiting warp (4) waits on raw_wait mbarrier "
        "phase 0 (minimal.py:60) and none passed it; no raw arrive / expect_tx / "
        "complete_tx on an mbarrier was traced"
    )
    assert "nobody arrives on it" in line


def test_diagnose_stall_without_stuck_records():
    snap = Buf().beacon(2, 0, 0, 1, 0, 6).beacon(0, 0, PRODUCER, 2, 1, 7).snap()
    assert probes.diagnose(snap, SITES) == []
    (line,) = probes.diagnose(snap, SITES, stalled=True)
    assert "outside mbarrier waits" in line and "producer warp 4: producer_acquire" in line


def test_snapshot_json_roundtrip_and_diagnose_from_json_sites():
    snap = expect_tx_too_large().snap()
    table = SiteTable(sites=list(SITES))
    d = probes.snapshot_to_json(snap, table)
    import json

    d = json.loads(json.dumps(d))
    back = probes.snapshot_from_json(d)
    assert back.stuck == snap.stuck and back.beacons == snap.beacons
    assert probes.diagnose(back, table.to_json()) == d["diagnosis"] == probes.diagnose(snap, SITES)
    first = d["warps"][0]
    assert (first["cta"], first["warp"], first["role"], first["state"]) == (
        0,
        0,
        "consumer",
        "stuck",
    )
    assert first["stuck"]["op"] == "consumer_wait" and first["stuck"]["barrier"] == "full"
    assert first["stuck"]["where"] == "tma_stream.py:258"
    producer = next(w for w in d["warps"] if w["warp"] == PRODUCER)
    assert producer["role"] == "producer" and producer["last"]["seq"] == 4


# ---------------------------------------------------------------------------------------------
# Diagnosis on records captured on the H200 (tests/data/runs), and what overflow changes
# ---------------------------------------------------------------------------------------------

RUNS = ROOT / "tests" / "data" / "runs"


def recorded(name: str) -> tuple[ProbeSnapshot, list]:
    import json

    from helpers import recorded_runs

    events = [json.loads(x) for x in recorded_runs.lines(name)]
    compiled = next(e for e in events if e["event"] == "compiled")
    report = next(e for e in events if e["event"] == "probe_report")
    return probes.snapshot_from_json(report), compiled["probe_sites"]


def test_recorded_expect_tx_hang_producer_past_the_consumers():
    snap, sites = recorded("wrong_expect_tx_plus")
    (line,) = probes.diagnose(snap, sites)
    assert line.startswith(
        "16 CTAs (0-15): consumers wait on full[0] phase 0 while the "
        "producer is past it (producer acquired #4, consumer waits for #1)"
    )


def test_a_stuck_producer_past_the_consumers_is_not_a_circular_wait():
    """The producer's beacons lost (slots shared by CTAs): its stuck record still says it
    completed 4 acquires, past the consumers' #1: not 'consumer_release missing'."""
    snap, sites = recorded("wrong_expect_tx_plus")
    by_id = {s["id"]: s for s in sites}
    producer = {b.warp for b in snap.beacons if by_id[b.site_id]["op"] == "producer_acquire"}
    assert producer and any(r.warp in producer for r in snap.stuck)
    snap.beacons = [b for b in snap.beacons if b.warp not in producer]
    (line,) = probes.diagnose(snap, sites)
    assert "circular wait" not in line and "consumer_release missing" not in line
    assert "while the producer is past it (producer acquired #4, consumer waits for #1)" in line


def test_a_cta_whose_producer_records_overflowed_is_not_told_the_producer_never_ran():
    snap, sites = recorded("wrong_expect_tx_plus")
    by_id = {s["id"]: s for s in sites}
    producer = {b.warp for b in snap.beacons if by_id[b.site_id]["op"] == "producer_acquire"}
    kept = [r for r in snap.stuck if r.warp not in producer]
    # what a full buffer leaves: the producer's reports were the ones that did not fit
    lost = ProbeSnapshot(stuck=kept, beacons=[], n_stuck_reported=len(snap.stuck), max_ctas=1024)
    assert lost.dropped_records == len(snap.stuck) - len(kept) > 0
    lines = probes.diagnose(lost, sites)
    assert not any("never ran" in x for x in lines)
    assert any("the producer's state is unknown" in x for x in lines)
    assert any("stuck reports did not fit the buffer" in x for x in lines)
    # the same records with nothing lost: then the records do show that
    whole = ProbeSnapshot(stuck=kept, beacons=[], n_stuck_reported=len(kept), max_ctas=1024)
    assert any("the producer never ran" in x for x in probes.diagnose(whole, sites))


def test_sized_from_the_grid_every_warp_has_a_record_and_a_slot():
    cfg = probes.sized_for_grid(ProbeConfig(), (1320, 1, 1), (384, 1, 1))
    assert (cfg.max_ctas, cfg.max_warps, cfg.max_records) == (1320, 12, 1320 * 12)
    assert probes.sized_for_grid(
        ProbeConfig(size_from_grid=False), (1320, 1, 1), (384, 1, 1)
    ) == ProbeConfig(size_from_grid=False)
    # a run-time grid (dynamic shapes): room for RUNTIME_GRID_CTAS CTAs of the static block
    dyn = probes.sized_for_grid(ProbeConfig(), (None, 1, 1), (128, 1, 1))
    assert (dyn.max_ctas, dyn.max_warps, dyn.max_records) == (8192, 4, 8192 * 4)
    assert probes.sized_for_grid(ProbeConfig(), (4, 1, 1), (None, 1, 1)) == ProbeConfig()
    # a grid of 4096 CTAs of 8 warps, every warp stuck: nothing dropped
    cfg = probes.sized_for_grid(ProbeConfig(), (4096, 1, 1), (256, 1, 1))
    buf = bytearray(probes.buffer_nbytes(cfg))
    probes.init_buffer(buf, cfg)
    n = 4096 * 8
    struct.pack_into("<I", buf, 8, n)
    off = probes.records_offset(cfg)
    for i in range(n):
        struct.pack_into(
            RECORD_FMT,
            buf,
            off + i * 64,
            RECORD_VALID,
            2,
            i // 8,
            0,
            0,
            i % 8,
            0,
            0,
            10,
            20,
            0,
            0,
            1,
            i // 8,
        )
    snap = probes.decode(bytes(buf), cfg)
    assert len(snap.stuck) == n and snap.dropped_records == 0 and snap.complete


def test_worker_allocates_the_buffer_at_the_traced_launch(tmp_path, monkeypatch):
    pytest.importorskip("cutlass")
    from cutlass import cute

    from cutedebug import kernel_api

    monkeypatch.chdir(tmp_path)
    obj = kernel_api.load_entry(PIPELINE_KERNELS[0][0], "TmaStream")(m=256, n=512, ctas=4)
    asked = []

    def allocate(cfg):
        asked.append(cfg)
        return bytearray(probes.buffer_nbytes(cfg)), ADDR

    with probes.instrument(ProbeConfig(budget_ns=BUDGET), allocate=allocate) as table:
        cute.compile[cute.GPUArch("sm_90a")](obj, *obj.fake_args())
    (cfg,) = asked
    assert table.config == cfg and (cfg.max_ctas, cfg.max_warps) == (4, 5)
    assert cfg.max_records == 20


def test_raw_barrier_diagnosis_names_who_arms_and_who_delivers(tmp_path, monkeypatch):
    """cluster_reduce (raw mbarriers, no cutlass.pipeline): the site table of a real compile,
    every warp stuck on the raw wait: the waiter is the consumer, the hypothesis is about the
    expect_tx arm and the st.async senders, not 'nobody arrived'."""
    path = ROOT / "kernels" / "cluster_reduce.py"
    ptx, table = compile_ptx(
        path, "ClusterReduce", {}, ProbeConfig(budget_ns=BUDGET), tmp_path, monkeypatch
    )
    (wait,) = [s for s in table.sites if s.kind == "raw"]
    assert (
        wait.role == "consumer"
        and wait.line == lines_containing(path, "cute.arch.mbarrier_wait(bar, phase)")[0]
    )
    ops = {s.op: s for s in table.raw_ops}
    arm = lines_containing(path, "cute.arch.mbarrier_arrive_and_expect_tx(bar,")[0]
    assert ops["mbarrier_arrive_and_expect_tx"].line == arm
    assert ops["store_async_dsmem"].line == lines_containing(path, "store_async_dsmem(")[0]
    buf = Buf()
    for c in range(2):
        for w in range(4):
            buf.stuck(wait.id, c, w, -1, 0, 0)
    snap = probes.decode(bytes(buf.b), SMALL, None)
    (line,) = probes.diagnose(snap, table)
    assert "nobody arrived" not in line
    assert "arms its raw barriers with arrive.expect_tx" in line
    assert f"cluster_reduce.py:{arm}" in line and "complete_tx at cluster_reduce.py:" in line
    assert "expect_tx larger than the bytes delivered" in line
    # JSON round trip keeps the raw ops after the waits
    again = probes.SiteTable.from_json(table.to_json())
    assert [s.op for s in again.raw_ops] == [s.op for s in table.raw_ops]


def test_monitor_reports_a_run_time_grid_of_timed_out_warps_in_time():
    """minimal/spin_hang: every warp of a grid sized at run time (8192 CTAs of 4 warps: the
    RUNTIME_GRID_CTAS buffer) times out on its raw wait. The monitor's first event after the
    records appear must carry the new counter (the stall detector watches it: before, it came
    only with the picture, whose diagnosis scanned every record once per CTA), and the picture
    must fit one event line (before: ~8 MB of records, cut by the reader, so no stuck site)."""
    import json
    import threading

    import torch

    from cutedebug.engine import launching, runner, watchdog
    from cutedebug.engine import verdict as V

    cfg = probes.sized_for_grid(ProbeConfig(), (None, 1, 1), (128, 1, 1))
    ctas, warps = cfg.max_ctas, cfg.max_warps
    n = ctas * warps
    assert n == cfg.max_records == 32768
    table = SiteTable()
    (line,) = lines_containing(MINIMAL, "cute.arch.mbarrier_wait(mbar, 0)")
    site = table.add(
        kind="raw",
        op="raw_wait",
        barrier="",
        pipeline_class="",
        pipeline_name="",
        stages=None,
        arrive_count=None,
        tx_count=None,
        pipeline_index=None,
        via="",
        file=str(MINIMAL),
        line=line,
        function="kernel",
        code="cute.arch.mbarrier_wait(mbar, 0)",
    )
    buf = torch.zeros(probes.buffer_nbytes(cfg), dtype=torch.uint8)
    probes.init_buffer(buf.numpy(), cfg)
    raw = buf.numpy()
    struct.pack_into("<II", raw, 0, MAGIC, VERSION)
    struct.pack_into("<I", raw, 8, n)
    off = probes.records_offset(cfg)
    for i in range(n):
        cta, warp = i // warps, i % warps
        struct.pack_into(
            RECORD_FMT, raw, off + i * 64, RECORD_VALID, site.id, cta, 0, 0, warp, -1, 0,
            500_000_000, 1_000 + i, cta % 132, 0, 0, cta,
        )  # fmt: skip

    class Events:
        def __init__(self):
            self.lines: list[tuple[str, dict]] = []

        def emit(self, name, **fields):
            self.lines.append((name, fields))
            if "picture" in fields:
                monitor._stop.set()

    events = Events()
    monitor = launching.ProbeMonitor(events, buf, cfg, table, interval_s=0.001)
    thread = threading.Thread(target=monitor._loop)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    first_name, first = events.lines[0]
    assert first_name == "progress" and first["counter"] == n and "picture" not in first
    pictured = [f for _, f in events.lines if "picture" in f]
    assert len(pictured) == 1
    event = json.dumps({"event": "progress", "t": 1.0, **pictured[0]})
    assert len(event) < watchdog.MAX_EVENT_LINE
    picture = json.loads(event)["picture"]
    assert picture["n_stuck_reported"] == n
    assert len(picture["stuck"]) + picture["stuck_unlisted"] == n
    # every record is in the diagnosis; none is called dropped by the buffer
    assert picture["diagnosis"][0].startswith(f"{ctas} CTAs (0-{ctas - 1}): ")
    back = probes.snapshot_from_json(picture)
    assert back.dropped_records == 0 and not back.complete
    # the runner's evidence from the last live picture: the stuck raw wait, localized
    o = V.Outcome()
    o.add({"event": "progress", "t": 1.0, **pictured[0]})
    sites = runner.probe_evidence(o)["stuck_sites"]
    assert sites and {s["op"] for s in sites} == {"raw_wait"}
    assert {s["location"] for s in sites} == {f"minimal.py:{line}"}
    graded = runner.grade_localization({"op": "raw_wait"}, sites)
    assert graded["ok"] is True
    from cutedebug.reporting import stuck_map

    drawn = stuck_map.build(back, table)
    assert drawn.dropped_records == 0
    assert drawn.dropped_note().startswith(f"{n - len(picture['stuck'])} of {n} stuck records")
    assert "not in this picture" in drawn.dropped_note()
