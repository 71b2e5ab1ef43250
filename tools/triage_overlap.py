"""Where a triage's wall time went, and what overlapping compiles with launches makes of it.

    python3 tools/triage_overlap.py MATRIX [--jobs J] [--pytest] [--families F1,F2,...]

MATRIX: a triage's matrix.json (or its folder). Prints, from its records (``--families``: of
those scenario families only):

- measured: the triage's wall (facts.total_s), its runs' own seconds (wall without the wait for
  the GPU token), the waits, the compile seconds inside the runs, and how many scenarios were
  compiled twice (a compile-only call and a run that compiled again: 0 when overlapping);
- an ESTIMATE (not a measurement) of the overlapped critical path from the same records: J run
  workers that compile at once (each run's compile_s) while one at a time holds the GPU for the
  rest of its run (wall_s - compile_s: an upper bound, since spawn, imports and inputs overlap
  too), simulated in scenario order, plus the triage's time outside its runs (startup, the first
  compile, the final health check: total_s - the runs' walls, from a serial triage).
- ``--pytest``: the same ESTIMATE for `pytest -n 1` over those scenarios (the gpu_pending
  ``xdist`` step): its compile items (each compile-only call's wall), then its run items, in
  turn (the earlier order, ``--cutedebug-prefetch off``) or with the prefetch (under xdist each
  item starts the worker's next one ahead, compile or run; 2 runs ahead without xdist):
  :func:`item_path`.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cutedebug import records  # noqa: E402
from cutedebug.engine.triage_record import TriageMatrix  # noqa: E402


def critical_path(runs: list[tuple[float, float]], jobs: int) -> float:
    """Seconds until the last run ends: ``jobs`` workers, each compiling (first of each pair)
    on its own, then holding the one GPU (second) in the order their compiles finished."""
    events = [(c, "ready", i) for i, (c, _) in enumerate(runs[:jobs])]
    heapq.heapify(events)
    started, gpu_busy, ready, end = min(jobs, len(runs)), False, [], 0.0
    while events:
        t, kind, i = heapq.heappop(events)
        if kind == "ready":
            heapq.heappush(ready, (t, i))
        else:  # a run ended: its worker starts the next scenario
            gpu_busy, end = False, t
            if started < len(runs):
                heapq.heappush(events, (t + runs[started][0], "ready", started))
                started += 1
        if not gpu_busy and ready:
            _, j = heapq.heappop(ready)
            gpu_busy = True
            heapq.heappush(events, (t + runs[j][1], "done", j))
    return end


def item_path(runs: list[tuple[float, float]], ahead: int) -> float:
    """Seconds until the last of pytest's run items ends, one item after another: when item k
    starts, the runs of items k .. k+ahead that have not started do (compiling, first of each
    pair, on their own); the GPU goes to the started runs in the order their compiles finish,
    one at a time (second of each pair); item k ends with its own run. ``ahead`` 0 is the
    earlier order: each run in its item's turn."""
    ready: dict[int, float] = {}  # started runs: when their compile ends
    ended: dict[int, float] = {}
    t = gpu_free = 0.0
    for k in range(len(runs)):
        for j in range(k, min(len(runs), k + ahead + 1)):
            ready.setdefault(j, t + runs[j][0])
        while k not in ended:  # the GPU serves the started runs until item k's is done
            r, j = min((r, j) for j, r in ready.items() if j not in ended)
            gpu_free = max(gpu_free, r) + runs[j][1]
            ended[j] = gpu_free
        t = max(t, ended[k])
    return t


def pytest_estimate(recs: list) -> str:
    """The `pytest -n 1` lines of ``--pytest`` (see the module docstring)."""
    compile_items = [(r.compile.wall_s, 0.0) for r in recs if r.compile]  # no GPU part
    compiles, compiles_next = (item_path(compile_items, a) for a in (0, 1))
    runs = [r.run for r in recs if r.run]
    pairs = [(c.compile_s, max(0.0, c.own_s - c.compile_s)) for c in runs]
    serial, next1, two = (item_path(pairs, a) for a in (0, 1, 2))
    return (
        f"ESTIMATE pytest -n 1 (from these records, not a measurement; pytest's start and "
        f"collection not included): compile items in turn {compiles:.1f} s (each compile-only "
        f"call's wall), the next one ahead {compiles_next:.1f} s; run items in turn "
        f"{serial:.1f} s, the next one ahead {next1:.1f} s (2 ahead, plain pytest: {two:.1f} s); "
        f"in all {compiles + serial:.1f} s in turn -> {compiles_next + next1:.1f} s"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("matrix")
    ap.add_argument("--jobs", type=int, default=8, help="run workers at once (the estimate)")
    ap.add_argument(
        "--pytest", action="store_true", help="also the estimate for `pytest -n 1` (prefetch)"
    )
    ap.add_argument("--families", help="only these scenario families (comma list)")
    a = ap.parse_args(argv)
    p = Path(a.matrix)
    p = p / "matrix.json" if p.is_dir() else p
    text = records.read_text(p)  # a kept report's may be gzipped
    m = TriageMatrix.from_json(json.loads(text))
    recs = sorted(m.scenarios, key=lambda r: r.id)
    if a.families:
        recs = [r for r in recs if r.id.split("/")[0] in a.families.split(",")]
    runs = [r.run for r in recs if r.run]
    wall = sum(c.wall_s for c in runs)
    waits = sum(c.gpu_wait_s or 0.0 for c in runs)
    compiles = sum(c.compile_s for c in runs)
    twice = sum(1 for r in recs if r.compile and r.run)
    total = m.facts.total_s if m.facts else None
    print(f"{len(recs)} scenarios, {len(runs)} runs; triage wall (facts.total_s): {total} s")
    print(
        f"measured: runs' wall {wall:.1f} s = own {wall - waits:.1f} s + waiting for the GPU "
        f"{waits:.1f} s; compile inside the runs {compiles:.1f} s; compiled twice: {twice}"
    )
    pairs = [(c.compile_s, max(0.0, c.own_s - c.compile_s)) for c in runs]
    path = critical_path(pairs, a.jobs)
    outside = (total - wall) if total is not None and not waits else None
    print(
        f"ESTIMATE (from these records, not a measurement): GPU-exclusive part "
        f"{sum(e for _, e in pairs):.1f} s; overlapped critical path with {a.jobs} workers "
        f"{path:.1f} s"
        + (
            f" + {outside:.1f} s outside the runs = {path + outside:.1f} s"
            if outside is not None
            else ""
        )
    )
    if a.pytest:
        print(pytest_estimate(recs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
