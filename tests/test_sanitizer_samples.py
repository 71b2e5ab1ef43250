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
