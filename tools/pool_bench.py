"""Wall time of `cutedebug run` cold (a fresh worker interpreter) against warm (a worker forked
from the warm pool's resident server), alternated in one loop.

    python3 tools/pool_bench.py [SCENARIO] [--rounds N] [--compile-only] [--overlap]
                                [--cold-fresh] [--reuse] [--spare] [--no-cold]
                                [--keep-cache DIR] [--json OUT]

Each round runs the same command twice, as a user would type it (a new `cutedebug` process
each time), `--no-warm` then `--warm`, so machine load drifts over both sides alike
(``--overlap``: a third side between them, cold with CUTEDEBUG_OVERLAP_IMPORTS=1, the worker's
GPU lookup in a thread beside cutlass's import; ``--cold-fresh``: a side cold_fresh, cold with
``--no-compile-cache``, so the cold side's reuse of its compile from the user's folder is
measured against a fresh compile, after one untimed cold run that stores the entry;
``--reuse``: a side warm_fresh, warm with ``--no-compile-cache``, so the warm side's compile
reuse (engine/compile_cache.py) is measured against a fresh compile in the same pool, after one
untimed warm run that stores the entry;
``--spare``: a side warm_nospare, warm from a second pool started without a spare worker
(CUTEDEBUG_POOL_SPARE=0: each run forks and makes its own CUDA context, engine/pool_spare.py),
after one untimed run there; ``--no-cold``: no cold side). The pool's server is started before the
first round (`cutedebug pool start`, its start reported apart) and stopped after the last
(`cutedebug pool stop`, with the processes it left). Prints each round, then per side the
median, min and max wall and the report's phases (report.json timings: the command's own
seconds before the run (cli_start_s: its interpreter, imports, the pool's connection), spawn,
imports and the part of them that looked for the GPU (device), inputs, compile, prelaunch,
launch, after_kernel, exit, verdict, health, unplaced, then cli_after_s until the report is
written) plus ``rest_s``, what report.json cannot hold (writing it, printing, the interpreter's
exit), ``cli_s`` (all the command's seconds outside the run), and how the GPU health was
checked (``health_via``: worker, torch, driver). Then each side's median against issue 22's
targets (5 s cold, 2 s warm) and the median of warm/cold per round. First it prints what decides an
interpreter's imports: whether bytecode may be written and whether the DSL has it cached.
Default scenario: the probed HANG of the README
(scenarios/tma_stream/wrong_expect_tx_plus.toml). Exit 1 when a run's verdict was not the
expected one or the pool left a process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from cutedebug.engine import compile_cache  # noqa: E402  (stdlib only at import)

DEFAULT = ROOT / "scenarios" / "tma_stream" / "wrong_expect_tx_plus.toml"
OVERLAP = "CUTEDEBUG_OVERLAP_IMPORTS"  # engine/worker.py: DeviceLookup
PHASES = (
    "pool_s",
    "cli_start_s",
    "spawn_s",
    "imports_s",
    "device_s",
    "inputs_s",
    "compile_s",
    "prelaunch_s",
    "launch_s",
    "after_kernel_s",
    "exit_s",
    "verdict_s",
    "health_s",
    "unplaced_s",
    "cli_after_s",
    "rest_s",
    "cli_s",
)
# Issue 22's targets for a probed HANG on the H200 (wall of one `cutedebug run`)
TARGETS = {
    "cold": 5.0,
    "cold_overlap": 5.0,
    "cold_fresh": 5.0,
    "warm": 2.0,
    "warm_fresh": 2.0,
    "warm_nospare": 2.0,
}
NOSPARE = {"CUTEDEBUG_POOL_SPARE": "0"}  # engine/pool_spare.py: SPARE_VAR


def bytecode_state() -> dict:
    """Whether a fresh interpreter here writes bytecode, and whether the DSL's and torch's
    sources have it cached (without it every fresh interpreter compiles cutlass's ~290 modules,
    or torch's, again). Nothing is imported: the packages are found, not loaded."""
    import importlib.util

    def origin(name: str) -> str | None:
        spec = importlib.util.find_spec(name)
        return spec.origin if spec and spec.origin else None

    def cached(path: str | None) -> bool:
        return bool(path) and Path(importlib.util.cache_from_source(path)).is_file()

    init, torch_init = origin("cutlass"), origin("torch")
    ours = str(ROOT / "cutedebug" / "commands" / "cli.py")
    return {
        "dont_write_bytecode": sys.flags.dont_write_bytecode,
        "cutedebug_bytecode_cached": cached(ours),
        "pycache_prefix": sys.pycache_prefix,
        "cutlass": init,
        "cutlass_bytecode_cached": cached(init),
        "torch": torch_init,
        "torch_bytecode_cached": cached(torch_init),
    }


def cutedebug(*args: str, env: dict[str, str] | None = None, root: Path = ROOT):
    """``python -m cutedebug ARGS`` in ``root`` (this checkout unless told), ``env`` over this
    process's environment: (wall seconds, the completed process)."""
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "cutedebug", *args],
        capture_output=True,
        text=True,
        cwd=root,
        env=None if env is None else {**os.environ, **env},
    )
    return time.monotonic() - t0, r


def report(stdout: str) -> dict:
    for line in stdout.splitlines():
        if line.strip().startswith("report:"):
            md = Path(line.split("report:", 1)[1].strip())
            return json.loads((md.parent / "report.json").read_text())
    return {}


def keep_cache(dest: Path) -> None:
    """Copy this environment's pool server's compile cache folder(s) to ``dest``."""
    from cutedebug.engine import pool

    d = pool.pool_dir_path()
    key = pool.key_of(pool.fingerprint())
    for folder in sorted(d.glob(f"pool-{key}.*.compiled")):
        shutil.copytree(folder, dest / folder.name, dirs_exist_ok=True)
        print(f"compile cache kept: {dest / folder.name} ({len(list(folder.iterdir()))} entries)")


def phase_medians(rows: list[dict], phases=PHASES) -> dict[str, float]:
    """Each phase's median over the rows that have it (seconds, 3 decimals)."""
    return {
        k: round(statistics.median(x[k] for x in rows if k in x), 3)
        for k in phases
        if any(k in x for x in rows)
    }


def row_of(wall: float, r: subprocess.CompletedProcess) -> dict:
    """One run's wall, report.json phases, verdict, and whether its compile was reused."""
    rep = report(r.stdout)
    t = dict(rep.get("timings", {}))
    if "wall_s" in t:
        t["cli_s"] = round(wall - t["wall_s"], 3)
        # what report.json cannot hold: writing it, printing, the interpreter's exit
        if "cli_start_s" in t:
            t["rest_s"] = round(
                wall - t["wall_s"] - t["cli_start_s"] - t.get("cli_after_s", 0.0), 3
            )
    row = {"wall_s": round(wall, 3), **{k: t[k] for k in PHASES if k in t}}
    row["verdict"] = rep.get("verdict")
    row["health_via"] = (rep.get("health") or {}).get("via")
    ev = rep.get("evidence", {})
    row["pool_pid"] = (ev.get("pool") or {}).get("pid")
    row["spare"] = (ev.get("pool") or {}).get("spare")  # its CUDA context made ahead
    cache = (ev.get("compiled") or {}).get("compile_cache") or {}
    row["compile_reused"] = cache.get("reused")
    if cache.get("why") or cache.get("probe_buffer", "fixed") != "fixed":
        row["compile_cache"] = cache  # why it was not reused (or the probe buffer's miss)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", nargs="?", default=str(DEFAULT))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--json", help="write every run's wall and phases here")
    ap.add_argument(
        "--overlap",
        action="store_true",
        help="a third side, cold_overlap: cold with CUTEDEBUG_OVERLAP_IMPORTS=1 (the worker "
        "looks for the GPU in a thread beside cutlass's import)",
    )
    ap.add_argument(
        "--cold-fresh",
        action="store_true",
        help="a side cold_fresh: cold with --no-compile-cache (the cold side reuses its "
        "compile from the user's folder after its first run; one untimed cold run stores it "
        "first)",
    )
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="a side warm_fresh: warm with --no-compile-cache (the warm side reuses the "
        "compile of an identical traced IR; one untimed warm run stores it first)",
    )
    ap.add_argument(
        "--spare",
        action="store_true",
        help="a side warm_nospare: warm from a second pool without a spare worker",
    )
    ap.add_argument("--no-cold", action="store_true", help="no cold side")
    ap.add_argument(
        "--keep-cache",
        metavar="DIR",
        help="copy the pool's compile cache here before stopping it, each entry with its "
        "traced IR as text (CUTEDEBUG_COMPILE_CACHE_IR=1 for the pool: what differed when a "
        "warm run did not reuse the compile)",
    )
    args = ap.parse_args()
    runs_dir = tempfile.mkdtemp(prefix="pool-bench-")
    # the cold runs' compile cache (engine/compile_cache.py: user_folder) starts empty here:
    # the first cold run compiles, later ones reuse it, as for a user running a scenario again
    os.environ.setdefault(compile_cache.USER_VAR, str(Path(runs_dir) / "compile-cache"))
    common = ["--runs-dir", runs_dir] + (["--compile-only"] if args.compile_only else [])
    state = bytecode_state()
    print(f"bytecode: {state}")
    if args.keep_cache:  # before the server starts: its workers inherit it
        os.environ[compile_cache.IR_VAR] = "1"
    wall, r = cutedebug("pool", "start")
    print(f"pool start: {wall:.2f} s wall: {r.stdout.strip().splitlines()[0] if r.stdout else ''}")
    kinds: list[tuple[str, list[str], dict[str, str] | None]] = []
    if not args.no_cold:
        kinds.append(("cold", ["--no-warm"], {OVERLAP: "0"}))
        if args.overlap:
            kinds.append(("cold_overlap", ["--no-warm"], {OVERLAP: "1"}))
        if args.cold_fresh:
            kinds.append(("cold_fresh", ["--no-warm", "--no-compile-cache"], {OVERLAP: "0"}))
    if args.reuse:
        kinds.append(("warm_fresh", ["--warm", "--no-compile-cache"], None))
    kinds.append(("warm", ["--warm"], None))
    if args.spare:
        kinds.append(("warm_nospare", ["--warm"], NOSPARE))
    sides: dict[str, list[dict]] = {side: [] for side, _, _ in kinds}
    ok = r.returncode == 0
    if args.cold_fresh and not args.no_cold:  # stores the entry the cold side's runs reuse
        wall, r = cutedebug("run", "--no-warm", *common, args.scenario)
        print(f"prime cold: {row_of(wall, r)}", flush=True)
    if args.reuse:  # stores the entry the warm side's runs reuse
        wall, r = cutedebug("run", "--warm", *common, args.scenario)
        print(f"prime warm: {row_of(wall, r)}", flush=True)
    if args.spare:  # starts the second pool (and stores its entry)
        wall, r = cutedebug("run", "--warm", *common, args.scenario, env=NOSPARE)
        print(f"prime warm_nospare: {row_of(wall, r)}", flush=True)
    for i in range(args.rounds):
        for side, flags, env in kinds:
            wall, r = cutedebug("run", *flags, *common, args.scenario, env=env)
            row = row_of(wall, r)
            ok = ok and r.returncode in (0, 4)
            sides[side].append(row)
            print(f"round {i + 1} {side}: {row}", flush=True)
    if args.keep_cache:
        keep_cache(Path(args.keep_cache))
    _, r = cutedebug("pool", "stop")
    print(r.stdout.strip())
    ok = ok and r.returncode == 0
    if args.spare:
        _, r = cutedebug("pool", "stop", env=NOSPARE)
        print(r.stdout.strip())
        ok = ok and r.returncode == 0
    for side, rows in sides.items():
        walls = [x["wall_s"] for x in rows]
        phases = phase_medians(rows)
        print(
            f"{side}: wall median {statistics.median(walls):.2f} s "
            f"(min {min(walls):.2f}, max {max(walls):.2f}, n={len(walls)}); phases {phases}"
        )
    for side, rows in sides.items():
        med = statistics.median(x["wall_s"] for x in rows)
        verdicts = sorted({str(x["verdict"]) for x in rows})
        goal = TARGETS[side]
        if verdicts != ["HANG"]:  # a compile-only run, or no GPU here: not what the target is
            verdict = f"not comparable: verdicts {', '.join(verdicts)}, the target is a HANG's"
        elif med <= goal:
            verdict = "met"
        else:
            verdict = f"NOT met by {med - goal:.2f} s"
        print(f"target {side}: median {med:.2f} s vs <= {goal:.0f} s: {verdict}")
    ratios: dict[str, list[float]] = {}
    for base in ("cold", "warm_fresh", "warm_nospare"):
        if base not in sides:
            continue
        ratios[base] = r = [w["wall_s"] / c["wall_s"] for c, w in zip(sides[base], sides["warm"])]
        print(
            f"warm/{base} wall per round: median {statistics.median(r):.2f} "
            f"(min {min(r):.2f}, max {max(r):.2f}); load {os.getloadavg()[0]:.1f}"
        )
    for side in ("warm", "warm_fresh", "warm_nospare"):
        if side in sides:
            n = sum(x.get("spare") is True for x in sides[side])
            print(f"{side}: {n} of {len(sides[side])} runs in a spare worker (context made ahead)")
    if "warm_fresh" in sides:
        reused = [x.get("compile_reused") for x in sides["warm"]]
        saved = [
            f["compile_s"] - w["compile_s"]
            for f, w in zip(sides["warm_fresh"], sides["warm"])
            if "compile_s" in f and "compile_s" in w
        ]
        print(
            f"warm compile reused in {sum(x is True for x in reused)} of {len(reused)} runs; "
            + (
                f"compile_s fresh - reused per round: median {statistics.median(saved):.3f} s "
                f"(min {min(saved):.3f}, max {max(saved):.3f})"
                if saved
                else "no compile_s to compare"
            )
        )
    if "cold_overlap" in sides and "cold" in sides:
        over = [o["wall_s"] / c["wall_s"] for c, o in zip(sides["cold"], sides["cold_overlap"])]
        print(
            f"cold_overlap/cold wall per round: median {statistics.median(over):.2f} "
            f"(min {min(over):.2f}, max {max(over):.2f})"
        )
    if "cold_fresh" in sides and "cold" in sides:
        reused = [x.get("compile_reused") for x in sides["cold"]]
        saved = [
            f["compile_s"] - c["compile_s"] for f, c in zip(sides["cold_fresh"], sides["cold"])
        ]
        fr = [c["wall_s"] / f["wall_s"] for c, f in zip(sides["cold"], sides["cold_fresh"])]
        print(
            f"cold compile reused in {sum(x is True for x in reused)} of {len(reused)} runs; "
            f"compile_s fresh - reused per round: median {statistics.median(saved):.3f} s; "
            f"cold/cold_fresh wall per round: median {statistics.median(fr):.2f} "
            f"(min {min(fr):.2f}, max {max(fr):.2f})"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"sides": sides, "ratios": ratios, "bytecode": state}, indent=1)
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
