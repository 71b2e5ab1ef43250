"""tools/triage_overlap.py's estimates, on small cases worked out by hand: the critical path
of J run workers sharing one GPU (triage), and pytest's run items one after another with the
run prefetch starting the next ones ahead (item_path)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import triage_overlap as T  # noqa: E402


@pytest.mark.parametrize(
    "runs, ahead, want",
    [
        # (compile, GPU) per item. In turn: every compile and every GPU part one after another.
        ([(1, 2), (1, 2), (1, 2)], 0, 9),
        # next item ahead: run 1 compiles during run 0's compile and GPU part (ready at 1),
        # launches at 3; run 2 starts when item 1 does (3), ready at 4, launches at 5
        ([(1, 2), (1, 2), (1, 2)], 1, 7),
        ([(1, 2), (1, 2), (1, 2)], 2, 7),  # the GPU is the bottleneck from the first launch
        # the item ahead compiles faster and takes the GPU first (1..2); item 0 launches 3..4
        ([(3, 1), (1, 1)], 1, 4),
        ([(3, 1), (1, 1)], 0, 6),
        # long compiles: run 1 compiles with run 0 (GPU 4..5, 5..6); run 2 starts with item 1
        # at 5, launches at 9; 2 ahead: all three compile at once (GPU 4..7)
        ([(4, 1), (4, 1), (4, 1)], 1, 10),
        ([(4, 1), (4, 1), (4, 1)], 2, 7),
    ],
)
def test_item_path(runs, ahead, want):
    assert T.item_path(runs, ahead) == pytest.approx(want)


def test_item_path_in_turn_is_the_sum_and_never_worse_ahead():
    runs = [(0.4, 1.3), (2.0, 0.2), (0.1, 0.9), (1.1, 1.1), (0.7, 0.3)]
    assert T.item_path(runs, 0) == pytest.approx(sum(c + g for c, g in runs))
    paths = [T.item_path(runs, a) for a in range(4)]
    assert all(b <= a + 1e-9 for a, b in zip(paths, paths[1:]))
    assert paths[-1] >= sum(g for _, g in runs)  # one GPU: its parts never overlap


def test_critical_path_one_worker_is_in_turn():
    runs = [(1, 2), (3, 1)]
    assert T.critical_path(runs, 1) == pytest.approx(7)
    # both compile at once: run 0 holds the GPU 1..3, run 1 (compiled at 3) 3..4
    assert T.critical_path(runs, 2) == pytest.approx(4)
