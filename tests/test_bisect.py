"""printf-bisection: the search on simulated kernels (site list + oracle), the orchestration
with simulated runs, the host side of the marks, and compile-level checks (CPU, sm_90a) that
exactly one checkpoint is live per variant on kernels/tma_stream.py and kernels/flag_spin.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cutedebug.analyses import bisect as B
from cutedebug.analyses.bisect import CheckpointRun, Oracle, run_budget, search_all, search_role
from cutedebug.engine import scenario as S
from cutedebug.engine import verdict as V
from cutedebug.instrument import checkpoint as C
from cutedebug.reporting import bisect as R

ROOT = Path(__file__).resolve().parent.parent
TMA = ROOT / "kernels" / "tma_stream.py"
FLAG = ROOT / "kernels" / "flag_spin.py"
TMA_PARAMS = {"m": 256, "n": 512, "ctas": 4}
FLAG_PARAMS = {"n": 4096}


# ---------------------------------------------------------------------------------------------
# Simulated kernels
# ---------------------------------------------------------------------------------------------


class SimKernel:
    """What the search sees of a hanging kernel: which sites its warps get past, and the sites
    whose checkpoint changes the run (PASS: the hang vanishes; CRASH)."""

    def __init__(self, reached, vanish=(), crash=()):
        self.reached, self.vanish, self.crash = set(reached), set(vanish), set(crash)
        self.calls: list[int] = []

    def run(self, site: int, role: str) -> CheckpointRun:
        self.calls.append(site)
        if site in self.vanish:
            return CheckpointRun(site, None, "PASS")
        if site in self.crash:
            return CheckpointRun(site, None, "CRASH")
        return CheckpointRun(site, site in self.reached, "HANG")


def test_budget_is_ceil_log2_plus_two():
    assert [run_budget(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 1000)] == [
        2,
        3,
        4,
        4,
        5,
        5,
        6,
        6,
        7,
        12,
    ]


@pytest.mark.parametrize("n", list(range(1, 34)) + [64, 100])
def test_monotone_kernel_every_hang_point_is_found_exactly_within_the_bound(n):
    sites = [100 + 3 * i for i in range(n)]  # ids need not be contiguous
    for h in range(n + 1):
        k = SimKernel(sites[:h])
        st = search_role("r", sites, Oracle(k.run))
        assert (st.lo, st.hi) == (h - 1, h), (n, h)
        assert st.exact and st.between == []
        assert st.first_unreached == (sites[h] if h < n else None)
        assert st.last_reached == (sites[h - 1] if h else None)
        assert len(k.calls) == len(set(k.calls)) == st.runs <= run_budget(n)
        assert st.finished == (h == n) and st.started == (h > 0)


def test_a_role_that_never_starts_costs_one_run():
    sites = list(range(40))
    k = SimKernel(reached=())
    st = search_role("consumer", sites, Oracle(k.run))
    assert k.calls == [0] and not st.started and st.first_unreached == 0
    text = B.role_answer(st, {i: _site(i) for i in sites})
    assert "never reached its first site #0" in text


def test_the_exponential_probe_starts_at_the_role_start():
    sites = list(range(10))
    k = SimKernel(reached=range(1))  # hangs right after its first site
    st = search_role("r", sites, Oracle(k.run))
    assert k.calls == [0, 1] and (st.lo, st.hi) == (0, 1)
    k = SimKernel(reached=range(5))
    search_role("r", sites, Oracle(k.run))
    assert k.calls[:3] == [0, 1, 3]  # gallop lo+1, lo+2 while it fits the budget


def test_shared_sites_run_once_for_all_roles():
    # tma_stream's shape: site 0 is the pipeline-init sync every warp passes
    roles = {"producer": [0, 1, 2, 3], "consumer": [0, 4, 5]}
    k = SimKernel(reached={0, 1, 2})
    oracle = Oracle(k.run)
    res = search_all(roles, oracle)
    assert len(k.calls) == len(set(k.calls)) == len(oracle.order)
    assert (res["producer"].last_reached, res["producer"].first_unreached) == (2, 3)
    assert (res["consumer"].last_reached, res["consumer"].first_unreached) == (0, 4)
    assert res["consumer"].runs == 1  # site 0 came from the producer's search
    assert all(st.runs <= st.budget for st in res.values())


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 21])
def test_a_probe_that_makes_the_hang_vanish_is_flagged_and_never_misleads(n):
    sites = list(range(n))
    for h in range(n + 1):
        for t in range(n):
            k = SimKernel(reached=range(h), vanish={t})
            oracle = Oracle(k.run)
            st = search_role("r", sites, oracle)
            assert len(k.calls) == len(set(k.calls)) == st.runs <= run_budget(n)
            # the answer brackets the true hang point: reached end reached, unreached end not
            assert st.lo < h <= st.hi, (n, h, t)
            assert all(s == t or s not in k.calls for s in st.between)
            if t in k.calls:
                assert st.inconclusive == [t]
                assert [p.site for p in oracle.order if p.timing_bug] == [t]


def test_timing_bug_on_the_boundary_gives_an_interval_naming_it():
    sites = list(range(8))
    k = SimKernel(reached=range(4), vanish={4})
    st = search_role("r", sites, Oracle(k.run))
    assert (st.last_reached, st.first_unreached, st.between) == (3, 5, [4])
    text = B.role_answer(st, {i: _site(i) for i in sites})
    assert "unresolved: #4 consumer_wait full (k.py:14) (inconclusive)" in text


def test_a_crashing_probe_is_inconclusive_not_a_timing_bug():
    sites = list(range(6))
    k = SimKernel(reached=range(3), crash={2})
    oracle = Oracle(k.run)
    st = search_role("r", sites, oracle)
    assert st.inconclusive == [2] and not any(p.timing_bug for p in oracle.order)
    assert st.lo < 3 <= st.hi


def test_contradicting_answers_are_reported_not_hidden():
    oracle = Oracle(lambda s, r: pytest.fail("no run expected"))
    for sid, reached in ((0, True), (1, False), (2, True), (3, False)):
        oracle.results[sid] = CheckpointRun(sid, reached, "HANG")
    st = search_role("r", [0, 1, 2, 3], oracle)
    assert (st.lo, st.hi) == (2, 3) and st.runs == 0
    assert len(st.non_monotone) == 1 and "site 1 not reached" in st.non_monotone[0]


# ---------------------------------------------------------------------------------------------
# Grading and the probes' answer
# ---------------------------------------------------------------------------------------------

LOOP_P, LOOP_C = ["/k/tma_stream.py", 235], ["/k/tma_stream.py", 268]
TMA_TABLE = [
    {
        "id": 0,
        "op": "named_barrier",
        "kind": "named_barrier",
        "barrier": "named",
        "role": "all",
        "file": "/k/tma_stream.py",
        "line": 200,
        "loops": [],
    },
    {
        "id": 1,
        "op": "producer_acquire",
        "kind": "pipeline",
        "barrier": "empty",
        "role": "producer",
        "file": "/k/tma_stream.py",
        "line": 238,
        "loops": [LOOP_P],
    },
    {
        "id": 2,
        "op": "producer_commit",
        "kind": "pipeline",
        "barrier": "full",
        "role": "producer",
        "file": "/k/tma_stream.py",
        "line": 243,
        "loops": [LOOP_P],
    },
    {
        "id": 3,
        "op": "producer_tail",
        "kind": "pipeline",
        "barrier": "empty",
        "role": "producer",
        "file": "/k/tma_stream.py",
        "line": 246,
        "loops": [],
    },
    {
        "id": 4,
        "op": "consumer_wait",
        "kind": "pipeline",
        "barrier": "full",
        "role": "consumer",
        "file": "/k/tma_stream.py",
        "line": 269,
        "loops": [LOOP_C],
    },
    {
        "id": 5,
        "op": "consumer_release",
        "kind": "pipeline",
        "barrier": "empty",
        "role": "consumer",
        "file": "/k/tma_stream.py",
        "line": 279,
        "loops": [LOOP_C],
    },
]


def _site(i: int) -> C.CheckpointSite:
    return C.CheckpointSite(
        id=i,
        op="consumer_wait",
        kind="pipeline",
        barrier="full",
        role="consumer",
        file="/k/k.py",
        line=10 + i,
        loops=[],
    )


def _expect_tx_hang():
    """wrong_expect_tx on tma_stream: full[0] never completes."""
    roles = {"producer": [0, 1, 2, 3], "consumer": [0, 4, 5]}
    return search_all(roles, Oracle(SimKernel(reached={0, 1, 2}).run))


def test_probes_agree_or_are_consistent_with_the_bisection():
    by_id = {s.id: s for s in map(C.CheckpointSite.from_json, TMA_TABLE)}
    stuck = [
        {
            "role": "consumer",
            "op": "consumer_wait",
            "barrier": "full",
            "location": "tma_stream.py:269",
        },
        {
            "role": "producer",
            "op": "producer_acquire",
            "barrier": "empty",
            "location": "tma_stream.py:238",
        },
    ]
    cmp = B.compare_with_probes(_expect_tx_hang(), by_id, stuck)
    assert cmp.roles["consumer"].agreement == "agree"
    # the producer passed acquire (4 stages) and is stuck in a later lap of the same loop
    assert cmp.roles["producer"].agreement == "consistent"
    assert cmp.agree is True
    wrong = [
        {
            "role": "consumer",
            "op": "consumer_release",
            "barrier": "empty",
            "location": "tma_stream.py:279",
        }
    ]
    cmp = B.compare_with_probes(_expect_tx_hang(), by_id, wrong)
    assert cmp.roles["consumer"].agreement == "disagree" and cmp.agree is False
    assert B.compare_with_probes(_expect_tx_hang(), by_id, []).agree is None


def test_grade_matches_a_role_first_unreached_site_and_ignores_stage():
    by_id = {s.id: s for s in map(C.CheckpointSite.from_json, TMA_TABLE)}
    good = B.grade(
        {"role": "consumer", "op": "consumer_wait", "barrier": "full", "stage": 0},
        _expect_tx_hang(),
        by_id,
    )
    assert good.ok is True and good.matched.where == "tma_stream.py:269"
    assert (
        B.grade({"role": "producer", "op": "producer_acquire"}, _expect_tx_hang(), by_id).ok
        is False
    )
    assert B.grade({"role": "any", "op": "producer_tail"}, _expect_tx_hang(), by_id).ok
    assert B.grade({}, _expect_tx_hang(), by_id).ok is None


def test_loop_caveat_in_the_answer():
    by_id = {s.id: s for s in map(C.CheckpointSite.from_json, TMA_TABLE)}
    text = B.role_answer(_expect_tx_hang()["producer"], by_id)
    assert text.startswith(
        "never gets past #3 producer_tail empty (tma_stream.py:246); "
        "last reached #2 producer_commit full (tma_stream.py:243)"
    )
    assert "later iteration of the loop at tma_stream.py:235" in text


# ---------------------------------------------------------------------------------------------
# Marks: host side
# ---------------------------------------------------------------------------------------------


def test_marks_decode_counts_per_cta_and_warp():
    cfg = C.MarkConfig(max_ctas=4, max_warps=8)
    buf = bytearray(C.buffer_nbytes(cfg))
    C.init_buffer(buf, cfg, 7)
    mv = memoryview(buf).cast("I")
    base = C.slots_offset(cfg) // 4
    mv[base + 2 * 8 + 3] = 5  # CTA 2, warp 3
    mv[base + 0 * 8 + 1] = 1
    state = C.decode(buf, cfg)
    assert state == {"site": 7, "hits": 6, "n_warps": 2, "warps": [[0, 1, 1], [2, 3, 5]], "ctas": 2}
    with pytest.raises(ValueError):
        C.decode(bytearray(C.buffer_nbytes(cfg)), cfg)  # no header: not a marks buffer


class _Events:
    def __init__(self):
        self.got: list[tuple[str, dict]] = []
        self._lock = threading.Lock()

    def emit(self, event, **fields):
        with self._lock:
            self.got.append((event, fields))


def test_monitor_streams_hits_and_flushes_before_the_end_is_reported():
    cfg = C.MarkConfig(max_ctas=2, max_warps=4)
    buf = bytearray(C.buffer_nbytes(cfg))
    C.init_buffer(buf, cfg, 3)
    ev = _Events()
    C._Monitor(ev, buf, cfg, interval_s=0.005).start()
    slot = memoryview(buf).cast("I")
    slot[C.slots_offset(cfg) // 4 + 1] = 1
    deadline = time.monotonic() + 5
    while not any(f.get("reached") for e, f in ev.got) and time.monotonic() < deadline:
        time.sleep(0.005)
    slot[C.slots_offset(cfg) // 4 + 5] = 2  # written just before the kernel ends
    ev.emit("synced", kernel_s=0.1)
    names = [e for e, _ in ev.got]
    assert names[0] == "checkpoint" and not ev.got[0][1]["reached"]
    final = [f for e, f in ev.got if e == "checkpoint" and f["final"]]
    assert names.index("synced") == names.index("checkpoint", len(names) - 2) + 1
    assert final[-1]["hits"] == 3 and final[-1]["warps"] == [[0, 1, 1], [1, 1, 2]]


def test_the_package_stays_import_light_and_checkpoint_is_inert():
    code = (
        "import sys, cutedebug; cp = cutedebug.checkpoint; assert cp('x') is None; "
        "from cutedebug import checkpoint; assert checkpoint('y', role='consumer') is None; "
        "assert 'cutlass' not in sys.modules and 'torch' not in sys.modules, 'heavy'"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------------------------------------
# Orchestration with simulated runs (no GPU)
# ---------------------------------------------------------------------------------------------


def _hang(events: list[dict]) -> tuple[V.Classified, V.Outcome]:
    o = V.Outcome(
        phase="launched", killed_by_watchdog="deadline:launched:0.5s", events=events, returncode=-9
    )
    return V.classify(o), o


def _passed(events: list[dict]) -> tuple[V.Classified, V.Outcome]:
    o = V.Outcome(
        phase="done",
        returncode=0,
        events=events + [{"event": "checked", "ok": True}, {"event": "done"}],
    )
    return V.classify(o), o


def _fake_runs(monkeypatch, table, reached, vanish=()):
    calls: list[tuple] = []
    roles = C.roles_of([C.CheckpointSite.from_json(s) for s in table])

    def run(self, name, site, *, probes, limits, stall_s):
        calls.append((name, site, probes, limits.deadline_s, stall_s))
        sites_ev = {
            "event": "checkpoint_sites",
            "sites": table,
            "roles": roles,
            "emitted": 0 if site is None else 1,
            "enabled": site,
        }
        if site is None:
            return _hang([sites_ev])
        mark = {
            "event": "checkpoint",
            "reached": site in reached,
            "hits": 4 if site in reached else 0,
            "n_warps": 4 if site in reached else 0,
            "ctas": 1 if site in reached else 0,
        }
        return (_passed if site in vanish else _hang)([sites_ev, mark])

    monkeypatch.setattr(B._Runner, "run", run)
    return calls


@pytest.fixture(scope="module")
def flag_table():
    _, table = compile_variant(FLAG, "FlagSpin", {**FLAG_PARAMS, "never_set": True}, None)
    return table


def test_bisect_localizes_the_flag_spin_and_writes_the_report(monkeypatch, tmp_path, flag_table):
    sc = S.load(ROOT / "scenarios" / "bisect" / "flag_spin_never_set.toml")
    by_name = {s["name"]: s["id"] for s in flag_table if s["name"]}
    reached = {0, by_name["payload written"], by_name["flag published"]}
    calls = _fake_runs(monkeypatch, flag_table, reached)
    res = B.bisect(sc, runs_root=tmp_path, window_s=0.4, probes=False, forkserver=False)
    assert res.status == "localized" and res.ok and res.grade.ok is True
    assert res.searches["producer"].finished
    assert res.searches["consumer"].first_unreached == by_name["flag observed"]
    assert calls[0][1] is None and all(c[3] == 0.4 and c[2] is None for c in calls[1:])
    assert len({c[1] for c in calls[1:]}) == len(calls) - 1 == len(res.runs)
    jp, mp = R.write(res)
    data = json.loads(jp.read_text())
    assert data["n_runs"] == len(res.runs) and data["timing_bug"] == [] and data["ok"]
    assert B.BisectReport.from_json(data).to_json() == data  # the file reads back as its record
    md = mp.read_text()
    assert (
        "**consumer**: never gets past its first own site #3 checkpoint 'flag observed' "
        "(flag_spin.py:"
    ) in md
    assert "**producer**: reached every site" in md


def test_bisect_flags_the_probe_that_makes_the_hang_vanish(monkeypatch, tmp_path, flag_table):
    sc = S.load(ROOT / "scenarios" / "bisect" / "flag_spin_never_set.toml")
    observed = next(s["id"] for s in flag_table if s["name"] == "flag observed")
    _fake_runs(monkeypatch, flag_table, reached={0, 1, 2}, vanish={observed})
    res = B.bisect(sc, runs_root=tmp_path, probes=False, forkserver=False)
    assert [p.site for p in res.timing_bugs] == [observed]
    assert res.searches["consumer"].between == [observed]
    _, mp = R.write(res)
    md = mp.read_text()
    assert f"**timing bug**: enabling #{observed} checkpoint 'flag observed'" in md
    assert "TIMING BUG: checkpoint #3 makes the hang vanish (PASS)" in R.tldr(res)


def test_bisect_stops_when_the_baseline_does_not_hang(monkeypatch, tmp_path, flag_table):
    monkeypatch.setattr(
        B._Runner,
        "run",
        lambda self, name, site, **kw: _passed(
            [{"event": "checkpoint_sites", "sites": flag_table, "roles": {}, "emitted": 0}]
        ),
    )
    sc = S.load(ROOT / "scenarios" / "bisect" / "flag_spin_never_set.toml")
    res = B.bisect(sc, runs_root=tmp_path, forkserver=False)
    assert res.status == "nothing_to_bisect" and not res.ok and res.runs == []
    assert "baseline run is PASS" in res.reason


def test_bisect_through_the_real_worker_on_a_cpu(tmp_path):
    """No GPU here: the baseline compiles (site table from the worker) and stops."""
    pytest.importorskip("cutlass")
    sc = S.load(ROOT / "scenarios" / "bisect" / "flag_spin_barrier_threads_plus.toml")
    res = B.bisect(sc, runs_root=tmp_path, forkserver=False)
    if res.baseline.verdict != "UNSUPPORTED":
        pytest.skip("a GPU is present: tools/gpu_bisect_table.py covers the real runs")
    assert res.status == "nothing_to_bisect"
    assert [s.op for s in res.sites] == [
        "named_barrier",
        "checkpoint",
        "checkpoint",
        "checkpoint",
        "named_barrier",
        "named_barrier",
    ]
    assert res.roles == {"producer": [0, 1, 2], "consumer": [0, 3, 4, 5]}


# ---------------------------------------------------------------------------------------------
# Compile level: exactly one checkpoint live per variant
# ---------------------------------------------------------------------------------------------


def printf_formats(ptx: str) -> list[bytes]:
    return [
        bytes(int(x) for x in m.group(1).split(","))
        for m in re.finditer(r"printfFormat_\d+\[\d+\] = \{([^}]*)\}", ptx)
    ]


def compile_variant(
    path: Path,
    entry: str,
    params: dict,
    site,
    *,
    session: bool = True,
    fault: str | None = None,
    fault_args: dict | None = None,
):
    pytest.importorskip("cutlass")
    import tempfile

    from cutlass import cute
    from cutlass.base_dsl.compiler import DumpDir

    from cutedebug import kernel_api
    from cutedebug.instrument import faults

    obj = kernel_api.load_entry(path, entry)(**params)
    # a fresh dump directory per compile: the PTX is read back from there
    opts = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX(), DumpDir(tempfile.mkdtemp())]
    with faults.inject(fault, fault_args):
        if not session:
            return opts(obj, *obj.fake_args()).__ptx__, None
        with C.session({"site": site}) as sess:
            ptx = opts(obj, *obj.fake_args()).__ptx__
    assert sess.emitted == (0 if site is None else 1)
    return ptx, sess.table()


def lines_of(path: Path, needle: str) -> list[int]:
    return [i for i, t in enumerate(path.read_text().splitlines(), 1) if needle in t]


def _keys(table):
    return [(s["op"], s["line"], s["role"], s["name"]) for s in table]


@pytest.mark.slow
@pytest.mark.parametrize(
    "path,entry,params", [(TMA, "TmaStream", TMA_PARAMS), (FLAG, "FlagSpin", FLAG_PARAMS)]
)
def test_exactly_one_checkpoint_is_live_per_variant(path, entry, params):
    plain, _ = compile_variant(path, entry, params, None, session=False)
    inert, table = compile_variant(path, entry, params, None)
    assert inert == plain  # numbering sites emits nothing
    assert ".sys" not in plain and not printf_formats(plain)
    for site in table:
        ptx, t = compile_variant(path, entry, params, site["id"])
        assert _keys(t) == _keys(table)  # same numbering in every variant
        fmts = [f for f in printf_formats(ptx) if f.startswith(C.BANNER.encode())]
        assert len(fmts) == 1, site
        assert f" site {site['id']} ".encode() in fmts[0]
        assert f"{path.name}:{site['line']} reached".encode() in fmts[0]
        # the mark: one relaxed sys-scope load and store of a hit counter in the marks buffer
        assert len(re.findall(r"ld\.relaxed\.sys\.global\.b32", ptx)) == 1
        assert len(re.findall(r"st\.relaxed\.sys\.global\.b32", ptx)) == 1
        assert str(C.FAKE_ADDR + C.HEADER_BYTES) in ptx


def test_tma_stream_sites_follow_the_source_in_program_order():
    _, table = compile_variant(TMA, "TmaStream", TMA_PARAMS, None)
    src = TMA.read_text()
    loop_p, loop_c = (lines_of(TMA, "for tile in cutlass.range(")[i] for i in (0, 1))
    expect = [
        ("named_barrier", lines_of(TMA, "ring = pipeline.PipelineTmaAsync.create(")[0], "all"),
        ("producer_acquire", lines_of(TMA, "ring.producer_acquire(")[0], "producer"),
        ("producer_commit", lines_of(TMA, "ring.producer_commit(")[0], "producer"),
        ("producer_tail", lines_of(TMA, "ring.producer_tail(")[0], "producer"),
        ("consumer_wait", lines_of(TMA, "ring.consumer_wait(")[0], "consumer"),
        ("consumer_release", lines_of(TMA, "ring.consumer_release(")[0], "consumer"),
    ]
    assert [(s["op"], s["line"], s["role"]) for s in table] == expect
    assert "sync_warp" not in src or all(s["op"] != "sync_warp" for s in table)
    assert [s["barrier"] for s in table] == ["named", "empty", "full", "empty", "full", "empty"]
    assert table[0]["detail"] == "pipeline init sync (CTA)"
    assert [len(s["loops"]) for s in table] == [0, 1, 1, 0, 1, 1]
    assert table[1]["loops"][0][1] == loop_p and table[4]["loops"][0][1] == loop_c
    assert C.roles_of([C.CheckpointSite.from_json(s) for s in table]) == {
        "producer": [0, 1, 2, 3],
        "consumer": [0, 4, 5],
    }


def test_flag_spin_roles_come_from_the_role_functions():
    _, table = compile_variant(FLAG, "FlagSpin", FLAG_PARAMS, None)
    got = [(s["op"], s["name"], s["role"], s["line"]) for s in table]
    barrier_lines = lines_of(FLAG, "cute.arch.barrier(barrier_id=Barrier.CONSUMERS")
    assert got == [
        ("named_barrier", "", "all", lines_of(FLAG, "cute.arch.sync_threads()")[0]),
        (
            "checkpoint",
            "payload written",
            "producer",
            lines_of(FLAG, 'checkpoint("payload written")')[0],
        ),
        (
            "checkpoint",
            "flag published",
            "producer",
            lines_of(FLAG, 'checkpoint("flag published")')[0],
        ),
        (
            "checkpoint",
            "flag observed",
            "consumer",
            lines_of(FLAG, 'checkpoint("flag observed")')[0],
        ),
        ("named_barrier", "", "consumer", barrier_lines[0]),
        ("named_barrier", "", "consumer", barrier_lines[1]),
    ]
    assert table[4]["detail"] == "barrier(barrier_id=1, number_of_threads=128)"


def test_flag_spin_spins_on_an_acquire_load_and_never_set_drops_the_flag_store():
    ok, _ = compile_variant(FLAG, "FlagSpin", FLAG_PARAMS, None, session=False)
    hang, _ = compile_variant(
        FLAG, "FlagSpin", {**FLAG_PARAMS, "never_set": True}, None, session=False
    )
    assert len(re.findall(r"ld\.acquire\.gpu\.global\.b32", ok)) == 2  # before + in the loop
    assert len(re.findall(r"st\.release\.gpu\.global\.b32", ok)) == 1
    assert len(re.findall(r"st\.release\.gpu\.global\.b32", hang)) == 0


# ---------------------------------------------------------------------------------------------
# The faults bisection needs
# ---------------------------------------------------------------------------------------------


def _bar_syncs(ptx: str) -> list[str]:
    return re.findall(r"bar\.sync\s+(\d+(?:, \d+)?);", ptx)


@pytest.mark.parametrize(
    "which,expect", [(-1, ["0", "1, 160", "1, 160"]), (1, ["0", "1, 128", "1, 160"])]
)
def test_wrong_barrier_threads_shifts_counted_barriers_only(which, expect):
    ptx, table = compile_variant(
        FLAG,
        "FlagSpin",
        FLAG_PARAMS,
        None,
        fault="wrong_barrier_threads",
        fault_args={"delta": 32, "which": which},
    )
    assert _bar_syncs(ptx) == expect
    # the site table reads the kernel's own count (the fault acts below the checkpoint)
    assert table[4]["detail"] == "barrier(barrier_id=1, number_of_threads=128)"


def test_wrong_barrier_threads_rejects_partial_warps():
    from cutedebug.instrument import faults

    with pytest.raises(faults.FaultApplyError):
        compile_variant(
            FLAG,
            "FlagSpin",
            FLAG_PARAMS,
            None,
            session=False,
            fault="wrong_barrier_threads",
            fault_args={"delta": 16},
        )


@pytest.mark.parametrize(
    "role,op", [("consumer", "consumer_release"), ("producer", "producer_commit")]
)
def test_early_exit_leaves_before_the_op_and_its_checkpoint(role, op):
    plain, _ = compile_variant(TMA, "TmaStream", TMA_PARAMS, None, session=False)
    ptx, table = compile_variant(
        TMA, "TmaStream", TMA_PARAMS, None, fault="early_exit", fault_args={"role": role}
    )
    assert "exit;" not in plain and ptx.count("exit;") == 1
    site = next(s["id"] for s in table if s["op"] == op)
    ptx, _ = compile_variant(
        TMA, "TmaStream", TMA_PARAMS, site, fault="early_exit", fault_args={"role": role}
    )
    # the exit is guarded by the state count and comes before the checkpoint's mark
    assert ptx.index("exit;") < ptx.index("st.relaxed.sys.global.b32")


def _sim_site(i, op, func, kind="pipeline", arm=None):
    """A site traced in kernel() -> [if arm] -> func (func None: inline in the kernel body)."""
    frames = [["/k/g.py", "__call__"], ["/k/g.py", "kernel"]] + (
        [["/k/g.py", func]] if func else []
    )
    arms = [["/k/g.py", arm[0], arm[1], 1]] if arm else []
    return C.CheckpointSite(
        id=i,
        op=op,
        kind=kind,
        file="/k/g.py",
        line=100 + i,
        function=func or "kernel",
        frames=frames,
        arms=arms,
    )


def test_roles_of_a_blackwell_shaped_kernel():
    """load (producer), mma (consumer of A/B, producer of the accumulator: collides with load
    on "producer", so both keep function names), an epilogue that consumes the accumulator and
    feeds a TMA store (one role: consumer), TMEM-alloc waits inline in the dispatch arms."""
    mma_arm, epi_arm, odd_arm = ("then_block_5", 290), ("then_block_7", 297), ("then_block_9", 310)
    sites = [
        _sim_site(0, "named_barrier", None, "named_barrier"),  # pipeline init: every warp
        _sim_site(1, "producer_acquire", "load", arm=("then_block_3", 288)),
        _sim_site(2, "named_barrier", None, "named_barrier", arm=mma_arm),  # wait_for_alloc
        _sim_site(3, "producer_acquire", "mma", arm=mma_arm),
        _sim_site(4, "consumer_wait", "mma", arm=mma_arm),
        _sim_site(5, "named_barrier", None, "named_barrier", arm=epi_arm),
        _sim_site(6, "consumer_wait", "epilogue", arm=epi_arm),
        _sim_site(7, "producer_acquire", "epilogue", arm=epi_arm),  # TMA-store pipeline
        _sim_site(8, "named_barrier", None, "named_barrier", arm=odd_arm),  # arm, no role fn
    ]
    C.assign_roles(sites)
    assert [s.role for s in sites] == [
        "all",
        "load",
        "mma",
        "mma",
        "mma",
        "consumer",
        "consumer",
        "consumer",
        "kernel@310",
    ]
    assert C.roles_of(sites) == {
        "load": [0, 1],
        "mma": [0, 2, 3, 4],
        "consumer": [0, 5, 6, 7],
        "kernel@310": [0, 8],
    }
    sites[8].explicit_role = "consumer"
    C.assign_roles(sites)
    assert sites[8].role == "consumer"


def test_grade_accepts_the_pipeline_role_of_a_function_named_role():
    table = [dict(s) for s in TMA_TABLE]
    for s in table:
        if s["role"] == "producer":
            s["role"] = "load"
    res = search_all(
        {"load": [0, 1, 2, 3], "consumer": [0, 4, 5]}, Oracle(SimKernel(reached={0, 1}).run)
    )
    by_id = {s.id: s for s in map(C.CheckpointSite.from_json, table)}
    g = B.grade({"role": "producer", "op": "producer_commit"}, res, by_id)
    assert g.ok is True and g.matched.role == "load"


@pytest.mark.parametrize(
    "path,entry,params,fault,args",
    [
        (TMA, "TmaStream", TMA_PARAMS, "wrong_expect_tx", {"delta_bytes": 16}),
        (ROOT / "kernels" / "minimal.py", "Minimal", {"n": 4096, "spin_hang": True}, None, None),
    ],
)
def test_probes_do_not_change_the_site_numbering(path, entry, params, fault, args):
    """The baseline runs with bounded-wait probes, the checkpoint runs without: the site ids
    must mean the same sites (probes' own try_waits are not sites)."""
    from cutedebug.instrument import probes

    pytest.importorskip("cutlass")
    _, plain = compile_variant(path, entry, params, None, fault=fault, fault_args=args)
    with probes.instrument(probes.ProbeConfig(), C.FAKE_ADDR):
        _, probed = compile_variant(path, entry, params, None, fault=fault, fault_args=args)
    assert _keys(probed) == _keys(plain) and len(plain) >= 3


@pytest.mark.parametrize("verdict, rc", [("UNSUPPORTED", 4), ("PASS", 1)])
def test_bisect_exit_status_when_the_baseline_did_not_hang(monkeypatch, tmp_path, verdict, rc):
    """A baseline that could not run here (no GPU, another arch) is exit 4, as for `run`;
    one that ran and did not hang is not as expected (1)."""
    from cutedebug.commands import bisect as bisect_cmd
    from cutedebug.commands import cli

    path = ROOT / "scenarios" / "bisect" / "flag_spin_never_set.toml"

    def fake(sc, runs_root, **kw):
        run_dir = Path(runs_root) / "b"
        run_dir.mkdir(parents=True)
        res = B.BisectResult(
            scenario=sc,
            run_dir=run_dir,
            baseline=B.Baseline(
                verdict=verdict, reason="r", probes=True, seconds=1.0, dir="baseline", compile_s=1.0
            ),
            status="nothing_to_bisect",
            reason=f"the baseline run is {verdict}, not HANG: r",
        )
        return res

    monkeypatch.setattr(bisect_cmd.B, "bisect", fake)
    assert cli.main(["bisect", str(path), "--runs-dir", str(tmp_path)]) == rc
