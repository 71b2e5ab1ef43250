"""A hang localized from the hung worker's GPU state against printf-bisection, as a user runs them.

    python tools/core_vs_bisect.py SCENARIO.toml [...] [--deadline S] [--warm] [--json FILE]

Per scenario, two commands in fresh processes, their order alternated from one scenario to the
next: ``cutedebug run --coredump --no-warm`` (probes off; cuda-gdb reads the hung worker before
the kill) and ``cutedebug bisect`` (a checkpoint per rerun, through its own fork server). Each
row: the command's whole wall (interpreter, imports, the library's, compiles, runs), its
verdict or status, where it localized the hang and whether that is the scenario's expected
localization. ``--warm`` adds a third side after the pairs: ``cutedebug run --coredump --warm``
through one warm pool started for it (the library imported once in its fork server; the first
run of each library pays that import, and the row says so by its ``spawn_s``; with
``--pool-preload`` the pool is started as ``cutedebug pool start SCENARIO...``, which imports
the scenarios' libraries before the first run and prints how long that took). Processes left
behind are counted after every command. Exit status 1 when a command was not as expected.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from gpu_scale_run import ours_left  # noqa: E402  (cutedebug processes of this checkout)

sys.path.insert(0, str(ROOT))
from cutedebug.engine import scenario as S  # noqa: E402

CLI = [sys.executable, "-m", "cutedebug"]
LIMIT_S = 240.0  # one command; a bisection of a large kernel reruns it 4-8 times
# report.json's timings kept per coredump row (where the command's wall went)
PHASES = (
    "cli_start_s",
    "spawn_s",
    "imports_s",
    "compile_s",
    "launch_s",
    "attach_s",
    "core_s",
    "health_s",
)


def _cmd(args: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.monotonic()
    r = subprocess.run(CLI + args, cwd=ROOT, capture_output=True, text=True, timeout=LIMIT_S)
    return round(time.monotonic() - t0, 2), r


def core_row(scenario: str, deadline: float, warm: bool) -> dict:
    runs = tempfile.mkdtemp(prefix="core-vs-bisect-")
    mode = "--warm" if warm else "--no-warm"
    wall, r = _cmd(
        ["run", "--coredump", mode, "--deadline", str(deadline), "--runs-dir", runs, scenario]
    )
    reports = sorted(Path(runs).rglob("report.json"))
    if not reports:
        return {
            "side": "core_warm" if warm else "core",
            "wall_s": wall,
            "rc": r.returncode,
            "error": (r.stderr or r.stdout)[-400:],
        }
    rep = json.loads(reports[-1].read_text())
    loc = rep.get("localization") or {}
    t = rep.get("timings") or {}
    core = (rep.get("evidence") or {}).get("coredump") or {}
    return {
        "side": "core_warm" if warm else "core",
        "wall_s": wall,
        "rc": r.returncode,
        "verdict": rep.get("verdict"),
        "verdict_ok": rep.get("verdict_ok"),
        "localized_ok": loc.get("ok"),
        "found": (loc.get("matched") or {}).get("how")
        or (loc.get("matched") or {}).get("location"),
        "pool_preload": ((rep.get("evidence") or {}).get("pool") or {}).get("preload"),
        "read": "attach" if core.get("attach") and not (core.get("dump") or {}) else "dump",
        "phases": {k: t[k] for k in PHASES if t.get(k) is not None},
    }


def bisect_row(scenario: str) -> dict:
    runs = tempfile.mkdtemp(prefix="core-vs-bisect-")
    wall, r = _cmd(["bisect", "--json", "--runs-dir", runs, scenario])
    try:
        res = json.loads(r.stdout)
    except json.JSONDecodeError:
        return {
            "side": "bisect",
            "wall_s": wall,
            "rc": r.returncode,
            "error": (r.stderr or r.stdout)[-400:],
        }
    grade = res.get("grade") or {}
    m = grade.get("matched") or {}
    return {
        "side": "bisect",
        "wall_s": wall,
        "rc": r.returncode,
        "verdict": res.get("status"),  # "localized", or why not
        "localized_ok": grade.get("ok"),
        "runs": res.get("n_runs"),
        "found": f"{m.get('role')} {m.get('op')} at {m.get('where')}" if m else grade.get("why"),
        "seconds": res.get("seconds"),  # the bisection's own, without the command's start
    }


def left(keep_pool: bool) -> list[str]:
    """Processes of ours still running (ours_left leaves out this script and the shells that
    started it), but, with ``keep_pool``, the warm pool's server."""
    return [x for x in ours_left() if not (keep_pool and "pool_server" in x)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="+")
    ap.add_argument("--deadline", type=float, default=2.0)
    ap.add_argument("--warm", action="store_true", help="a third side through one warm pool")
    ap.add_argument(
        "--warm-rounds", type=int, default=1, help="the warm side's rounds over the scenarios"
    )
    ap.add_argument("--no-cold", action="store_true", help="the warm side only")
    ap.add_argument(
        "--pool-preload",
        action="store_true",
        help="start the warm pool with the scenarios as targets (their libraries imported then)",
    )
    ap.add_argument("--json")
    args = ap.parse_args()
    rows: list[dict] = []

    def add(sc: str, row: dict) -> None:
        row = {"scenario": S.load(sc).id, **row}
        row["left"] = len(left(keep_pool=True))  # the pool's server stays until it is stopped
        rows.append(row)
        print(json.dumps(row), flush=True)

    for i, sc in enumerate([] if args.no_cold else args.scenarios):
        sides = [
            functools.partial(core_row, sc, args.deadline, False),
            functools.partial(bisect_row, sc),
        ]
        for side in sides if i % 2 == 0 else sides[::-1]:
            add(sc, side())
    if args.warm:
        wall, r = _cmd(["pool", "start"] + (args.scenarios if args.pool_preload else []))
        print(f"pool start: {wall} s rc={r.returncode}\n{r.stdout.strip()}", flush=True)
        try:
            for _ in range(args.warm_rounds):
                for sc in args.scenarios:
                    add(sc, core_row(sc, args.deadline, True))
        finally:
            _cmd(["pool", "stop"])
        after = left(keep_pool=False)
        print(f"after the pool stopped: {len(after)} processes of ours left {after}", flush=True)
    print()
    print("| scenario | side | wall s | verdict | localized as expected | found | left |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['scenario']} | {r['side']} | {r['wall_s']} | {r.get('verdict')} | "
            f"{r.get('localized_ok')} | {r.get('found') or r.get('error', '')} | {r['left']} |"
        )
    by_side: dict[str, list[float]] = {}
    for r in rows:
        by_side.setdefault(r["side"], []).append(r["wall_s"])
    for side, walls in by_side.items():
        print(
            f"{side}: {len(walls)} runs, wall {min(walls):.2f}-{max(walls):.2f} s, "
            f"median {statistics.median(walls):.2f} s"
        )
    cold: dict[str, dict[str, float]] = {}  # scenario -> side -> wall (one cold pair each)
    for r in rows:
        cold.setdefault(r["scenario"], {})[r["side"]] = r["wall_s"]
    ratios = [w["bisect"] / w["core"] for w in cold.values() if "bisect" in w and "core" in w]
    if ratios:
        print(
            f"bisect/core wall per scenario: median {statistics.median(ratios):.2f} "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    bad = [
        r
        for r in rows
        if r.get("localized_ok") is False
        or r.get("verdict_ok") is False
        or "error" in r
        or r["left"]
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
