"""Warm `cutedebug run` of two checkouts (before / after a change), alternated in one loop on
the same machine, each from its own warm pool.

    python3 tools/pool_ab.py BEFORE_DIR AFTER_DIR [SCENARIO] [--rounds N] [--compile-only]
                             [--json OUT]

Each checkout runs as a user would run it (``python -m cutedebug`` with that checkout first on
PYTHONPATH, from its root): its pool is started first (``pool start``), one untimed
``run --warm`` each (a compile cache entry stored where the checkout has one), then per round
``run --warm`` of BEFORE, then of AFTER, so machine load drifts over both alike; both pools
are stopped at the end. Prints each run's wall and report.json phases, each side's median
and spread, and the median of after/before per round. SCENARIO: a path relative to each
checkout (default: the probed HANG of the README). Exit 1 when a run failed or a pool left a
process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pool_bench  # noqa: E402
from pool_bench import phase_medians  # noqa: E402

PHASES = ("cli_start_s", "spawn_s", "imports_s", "inputs_s", "compile_s", "launch_s", "exit_s")


def cutedebug(root: Path, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    """The checkout ``root``'s cutedebug, from its own folder and path."""
    return pool_bench.cutedebug(*args, env={"PYTHONPATH": str(root)}, root=root)


def row(wall: float, r: subprocess.CompletedProcess) -> dict:
    out: dict = {"wall_s": round(wall, 3), "rc": r.returncode}
    for line in r.stdout.splitlines():
        if line.strip().startswith("report:"):
            md = Path(line.split("report:", 1)[1].strip())
            rep = json.loads((md.parent / "report.json").read_text())
            t = rep.get("timings", {})
            out.update({k: t[k] for k in PHASES if k in t})
            out["verdict"] = rep.get("verdict")
            cache = (rep.get("evidence", {}).get("compiled") or {}).get("compile_cache")
            out["compile_reused"] = (cache or {}).get("reused")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("scenario", nargs="?", default="scenarios/tma_stream/wrong_expect_tx_plus.toml")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--json", help="write every run here")
    args = ap.parse_args()
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs_dir = tempfile.mkdtemp(prefix="pool-ab-")
    common = ["--runs-dir", runs_dir] + (["--compile-only"] if args.compile_only else [])
    ok = True
    for name, root in sides.items():
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        wall, r = cutedebug(root, "pool", "start")
        print(f"{name}: {root} at {head}; pool start {wall:.2f} s", flush=True)
        wall, r = cutedebug(root, "run", "--warm", *common, args.scenario)
        print(f"{name} prime: {row(wall, r)}", flush=True)
        ok = ok and r.returncode in (0, 4)
    rows: dict[str, list[dict]] = {name: [] for name in sides}
    for i in range(args.rounds):
        for name, root in sides.items():
            wall, r = cutedebug(root, "run", "--warm", *common, args.scenario)
            rows[name].append(row(wall, r))
            ok = ok and r.returncode in (0, 4)
            print(f"round {i + 1} {name}: {rows[name][-1]}", flush=True)
    for name, root in sides.items():
        _, r = cutedebug(root, "pool", "stop")
        print(f"{name}: {r.stdout.strip()}")
        ok = ok and r.returncode == 0 and "0 process(es) left" in r.stdout
    for name, rs in rows.items():
        walls = [x["wall_s"] for x in rs]
        med = phase_medians(rs, PHASES)
        print(
            f"{name}: wall median {statistics.median(walls):.3f} s (min {min(walls):.3f}, "
            f"max {max(walls):.3f}, n={len(walls)}); phases {med}; verdicts "
            f"{sorted({str(x.get('verdict')) for x in rs})}; compile reused "
            f"{[x.get('compile_reused') for x in rs]}"
        )
    ratio = [a["wall_s"] / b["wall_s"] for b, a in zip(rows["before"], rows["after"])]
    print(
        f"after/before wall per round: median {statistics.median(ratio):.3f} "
        f"(min {min(ratio):.3f}, max {max(ratio):.3f}); load {os.getloadavg()[0]:.1f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
