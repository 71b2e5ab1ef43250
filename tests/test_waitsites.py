"""The trace-time wait table (cutedebug.instrument.waitsites): observe-only, in emission order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TMA_STREAM = ROOT / "kernels" / "tma_stream.py"
FLAG_SPIN = ROOT / "kernels" / "flag_spin.py"


def lines_containing(path: Path, needle: str) -> list[int]:
    return [i for i, text in enumerate(path.read_text().splitlines(), 1) if needle in text]


def compile_ptx(path: Path, entry: str, params: dict, record: bool, tmp_path, mp):
    pytest.importorskip("cutlass")
    from cutlass import cute

    from cutedebug import kernel_api
    from cutedebug.instrument import waitsites

    mp.chdir(tmp_path)
    obj = kernel_api.load_entry(path, entry)(**params)
    opts = (cute.GPUArch("sm_90a"), cute.KeepPTX())
    if not record:
        return cute.compile[opts](obj, *obj.fake_args()).__ptx__, None
    with waitsites.record() as sites:
        ptx = cute.compile[opts](obj, *obj.fake_args()).__ptx__
    return ptx, sites


def test_tma_stream_waits_in_emission_order_and_code_unchanged(tmp_path, monkeypatch):
    from cutlass.pipeline import helpers

    from cutedebug.instrument import waitsites

    orig_wait = helpers.MbarrierArray.__dict__["wait"]
    plain, _ = compile_ptx(TMA_STREAM, "TmaStream", {"stages": 4}, False, tmp_path, monkeypatch)
    ptx, sites = compile_ptx(TMA_STREAM, "TmaStream", {"stages": 4}, True, tmp_path, monkeypatch)
    assert helpers.MbarrierArray.__dict__["wait"] is orig_wait  # restored
    # observe-only: the same PTX, line table included
    assert ptx == plain
    got = [(s.kind, s.op, s.barrier) for s in sites]
    assert got == [
        ("sync_threads", "sync_threads", "named"),
        ("mbarrier_wait", "producer_acquire", "empty"),
        *[("mbarrier_wait", "producer_tail", "empty")] * 4,
        ("mbarrier_wait", "consumer_wait", "full"),
    ]
    # one try_wait loop per recorded mbarrier wait, in the same order as the PTX's
    assert len(re.findall(r"mbarrier\.try_wait", ptx)) == 6
    for s in sites[1:]:
        assert Path(s.file).resolve() == TMA_STREAM
        assert s.line in lines_containing(TMA_STREAM, f".{s.op}("), s
        assert s.pipeline_class == "PipelineTmaAsync" and s.stages == 4
    assert [s.seq for s in sites] == list(range(len(sites)))
    assert sites[0].barrier_id == 0
    roundtrip = waitsites.sites_from_json([s.to_json() for s in sites])
    assert roundtrip == list(sites)


def test_named_barriers_recorded_with_id_and_threads(tmp_path, monkeypatch):
    ptx, sites = compile_ptx(FLAG_SPIN, "FlagSpin", {}, True, tmp_path, monkeypatch)
    named = [s for s in sites if s.kind == "named_barrier_sync"]
    assert named, [s.kind for s in sites]
    assert {(s.barrier_id, s.threads) for s in named} == {(1, 128)}
    for s in named:
        assert Path(s.file).resolve() == FLAG_SPIN
    # bar.sync 1, 128 in the PTX once per recorded named barrier
    assert len(re.findall(r"\bbar\.sync\s+1, 128;", ptx)) == len(named)


def test_recorded_inside_the_faults_sees_what_is_emitted(tmp_path, monkeypatch):
    """The worker enters the recorder inside the fault patches: a faulted thread count is the
    one recorded, as in the SASS (bar.sync 1, 160)."""
    pytest.importorskip("cutlass")
    from cutlass import cute

    from cutedebug import kernel_api
    from cutedebug.instrument import faults, waitsites

    monkeypatch.chdir(tmp_path)
    obj = kernel_api.load_entry(FLAG_SPIN, "FlagSpin")()
    with waitsites.record() as sites, faults.inject("wrong_barrier_threads", {"delta": 32}):
        ptx = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](obj, *obj.fake_args()).__ptx__
    named = [s for s in sites if s.kind == "named_barrier_sync"]
    assert {(s.barrier_id, s.threads) for s in named} == {(1, 160)}
    assert len(re.findall(r"\bbar\.sync\s+1, 160;", ptx)) == len(named) == 2
