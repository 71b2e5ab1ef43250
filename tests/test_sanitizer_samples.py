"""tools/sanitizer_samples/mbarrier_handoff.py compiles in its three modes, each with the
synchronisation its docstring promises (the GPU step `racecheck_idiom` runs them under
racecheck)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_sample():
    spec = importlib.util.spec_from_file_location(
        "mbarrier_handoff", ROOT / "tools" / "sanitizer_samples" / "mbarrier_handoff.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    "mode, waits, arrives, bar_syncs",
    [("mbarrier", 2, 2, 1), ("sync", 0, 0, 3), ("none", 0, 1, 1)],
)
def test_each_mode_orders_the_handoff_as_documented(mode, waits, arrives, bar_syncs, tmp_path):
    """mbarrier: waits on full and empty, arrives on both, one CTA barrier (after init);
    sync: no mbarrier traffic, CTA barriers around each round; none: the producer arrives,
    nobody waits. Counted in the PTX, per unrolled round pattern (by kind, not by number)."""
    import cutlass
    from cutlass import cute
    from cutlass.base_dsl.compiler import DumpDir
    from cutlass.cute.runtime import make_fake_tensor

    m = load_sample()
    fake = make_fake_tensor(cutlass.Int32, (m.THREADS,), stride=(1,), assumed_align=16)
    opts = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX(), DumpDir(str(tmp_path))]
    ptx = opts(m.handoff_host, fake, mode).__ptx__
    kinds = {
        "waits": "mbarrier.try_wait" in ptx,
        "arrives": "mbarrier.arrive" in ptx,
        "bar_syncs": ptx.count("bar.sync") + ptx.count("barrier.sync"),
    }
    assert kinds["waits"] == bool(waits)
    assert kinds["arrives"] == bool(arrives)
    assert (kinds["bar_syncs"] > 1) == (bar_syncs > 1)


def test_the_expected_sums_are_what_the_consumers_read():
    m = load_sample()
    want = m.expected()
    assert want[:32] == [0] * 32
    assert want[32] == sum(r * 4 for r in range(m.ROUNDS))
    assert os.path.basename(m.__file__) == "mbarrier_handoff.py"


def test_racecheck_reports_a_correct_mbarrier_handoff_the_basis_of_the_caveat():
    """The H200 capture (2026-12-02, step racecheck_idiom): racecheck reports WAR hazards on
    the correct mbarrier hand-off and on the real race alike, none on the sync_threads control
    (so it cannot tell them apart); a RACE in a kernel that orders shared memory by mbarriers
    carries that caveat, and keeps its class."""
    from cutedebug.analyses.sanitizer.parse import analyze
    from cutedebug.analyses.sanitizer.triage import mbarrier_caveat

    text = (ROOT / "tests/data/sanitizer/h200/racecheck_idiom_2026-12-02.txt").read_text()
    by_mode = {p.split()[0]: p for p in text.split("== --mode ")[1:]}
    kinds = {m: {f.kind for f in analyze("racecheck", None, t, 12)} for m, t in by_mode.items()}
    assert "WAR_HAZARD" in kinds["mbarrier"] and "WAR_HAZARD" in kinds["none"]
    assert "WAR_HAZARD" not in kinds["sync"]
    assert "output matches" in by_mode["mbarrier"] and "output differs" in by_mode["none"]
    assert "RACECHECK SUMMARY: 0 hazards" in by_mode["sync"]

    pipe = mbarrier_caveat("RACE", [{"kind": "PipelineAsync"}], None)
    assert "1 pipeline(s)" in pipe and "mbarrier_handoff.py" in pipe
    raw = mbarrier_caveat("RACE", None, [{"op": "raw_wait", "pipeline": None, "line": 9}])
    assert "1 raw mbarrier wait line(s)" in raw
    assert mbarrier_caveat("RACE", None, [{"op": "consumer_wait", "pipeline": 0}]) is None
    assert mbarrier_caveat("RACE", None, None) is None  # a kernel without mbarriers: no caveat
    assert mbarrier_caveat("CLEAN", [{"kind": "PipelineAsync"}], None) is None
