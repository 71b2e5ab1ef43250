"""Hangs (and crashes) localized from a GPU coredump, no probes: one row per scenario.

    python tools/gpu_coredump_table.py [SCENARIO_OR_DIR ...] [--deadline S] [--out DIR]
                                       [--json FILE] [--keep-fixtures DIR]

Each scenario runs as `cutedebug run --coredump` does (probes off; the watchdog dumps the GPU
state through the driver's pipe before the kill; cuda-gdb reads the core), all from one fork
server. Default targets: every HANG scenario under scenarios/ that runs on this GPU. A row:
verdict, the localization graded from the core (against the probes' expectation, or bisection's
for the bisection-only scenarios), what the core says per role, the dump's seconds (pipe written
-> core complete, and which rule said so), cuda-gdb's seconds (each round's, one process), the seconds added between the kill decision and the
verdict (dump + reading the core + the GPU health check) against a plain kill (health check
only), the core's size, the GPU health after it, processes left behind. ``--deadline`` shortens
each scenario's kernel deadline (a hang is a hang after 2 s as after 10). ``--keep-fixtures``
copies each run's cuda-gdb output, events and SASS there (small files, for CPU tests).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutedebug.analyses import coredump, cudagdb  # noqa: E402
from cutedebug.commands.triage import detect_gpu  # noqa: E402
from cutedebug.engine import lifeline, preloads, runner  # noqa: E402
from cutedebug.engine import scenario as S  # noqa: E402

sys.path.insert(0, str(ROOT / "tools"))
from coredump_coverage import read_by  # noqa: E402  (how a row was read: attach / dump)


def targets(paths: list[str], arch: str) -> list[S.Scenario]:
    out = []
    for p in paths or [str(ROOT / "scenarios")]:
        files = S.discover(p) if Path(p).is_dir() else [Path(p)]
        for f in files:  # a folder: its HANG scenarios; a file: itself
            sc = S.load(f)
            if arch in sc.archs and (Path(p).is_file() or "HANG" in sc.expect.verdicts):
                out.append(sc)
    return out


PHASES = ("spawn_s", "imports_s", "inputs_s", "compile_s", "launch_s", "launch_to_kill_s")


def row(res: runner.RunResult, wall: float, leftovers: int) -> dict:
    ev, t = res.evidence, res.timings
    core = ev.get("coredump") or {}
    dump = core.get("dump") or {}
    loc = res.localization
    answers = ev.get("role_answers") or {}
    crash = ev.get("crash") or {}
    # between the kill decision and the verdict: the dump or the attached reading (or both,
    # when the attach failed), then the core's reading
    added = (t.get("dump_s") or 0.0) + (t.get("attach_s") or 0.0) + (t.get("core_s") or 0.0)
    return {
        "scenario": res.scenario.id,
        "verdict": res.verdict.value,
        "expected_verdict": res.scenario.expect.verdict,
        "verdict_ok": res.verdict_ok,
        "localized_by": res.scenario.expect.localized_by,
        "localization_ok": loc.get("ok"),
        "expected": loc.get("expected"),
        "matched": loc.get("matched"),
        "core": "; ".join(
            f"{r}: {a['op']}{'/' + a['barrier'] if a.get('barrier') else ''}"
            for r, a in answers.items()
        )
        or (
            f"{crash.get('exception')} at {crash.get('where')}" if crash else core.get("error", "")
        ),
        "site_map": core.get("site_map"),
        "warps": core.get("warps"),
        # CUTEDEBUG_COREDUMP_READ=attach: the attached reading's seconds and warps, or why it
        # failed (then the dump was taken)
        "attach": core.get("attach"),
        "dump_s": dump.get("dump_s"),
        "dump_complete": dump.get("complete"),  # closed / stable / exited / limit
        "driver_progress": driver_progress(res.run_dir),
        "flags": coredump.generation_flags(),
        "core_mb": round((core.get("core_bytes") or 0) / 2**20, 2),
        "gdb_s": core.get("gdb_s"),
        "gdb_passes": core.get("gdb_passes"),
        "gdb_rounds_s": core.get("gdb_rounds_s"),  # one cuda-gdb: [load + warps, per PC + regs]
        "nvdisasm_s": core.get("nvdisasm_s"),  # while cuda-gdb loads the core
        "gdb_processes": core.get("gdb_processes"),  # 1; per round after a fallback
        "gdb_prefetched_s": core.get("gdb_prefetched_s"),  # round 1 sent at the kill, this early
        "gdb_round1_wait_s": core.get("gdb_round1_wait_s"),  # what the reading still waited
        "gdb_fallback": core.get("gdb_fallback"),  # why the session was not used
        "gdb_prefetch": core.get("prefetch"),  # "started" at the kill, or why not
        "pipe_after_dump": dump.get("pipe_after_dump"),  # the driver's pipe left after a dump?
        "hook_errors": core.get("hook_errors"),  # a before-kill hook that raised
        "core_s": t.get("core_s"),
        "added_s": round(added, 3),
        "health_s": t.get("health_s"),
        "healthy": (res.health or {}).get("healthy"),
        "wall_s": round(wall, 2),
        # where the wall went (report.json timings): the library's import and compile against
        # the launch until the kill, so "from the launch to the verdict" can be told apart
        "phases": {k: t[k] for k in PHASES if t.get(k) is not None},
        "leftovers": leftovers,
        "rerun_with_probes": bool(ev.get("rerun_with_probes")),
    }


def driver_progress(run_dir: Path) -> list[str]:
    """The driver's "coredump: ..." lines (CUDA_COREDUMP_SHOW_PROGRESS: a timestamp per phase
    of the dump) from the worker's log."""
    out = []
    for log in sorted(Path(run_dir).rglob("*.log")):
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        out += [x.strip()[:160] for x in text.splitlines() if "coredump:" in x][:40]
    return out


def keep(res: runner.RunResult, dest: Path) -> None:
    d = dest / res.scenario.id.replace("/", "__")
    d.mkdir(parents=True, exist_ok=True)
    for f in list(res.run_dir.glob("coredump_gdb_*.txt")) + [res.run_dir / "events.jsonl"]:
        if f.exists():
            shutil.copy(f, d / f.name)
    sass = coredump.sass_of_cubin(res.run_dir / "kernel.cubin")
    if sass:
        (d / "sass.txt").write_text(sass)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="*")
    ap.add_argument("--deadline", type=float, default=2.0)
    ap.add_argument("--out", default="runs")
    ap.add_argument("--json")
    ap.add_argument("--keep-fixtures")
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no scenario after this")
    args = ap.parse_args()
    gpu = detect_gpu()
    if not gpu["present"]:
        print("no GPU")
        return 0
    import psutil

    scs = targets(args.targets, "sm_90a")
    print(
        f"{len(scs)} scenario(s); coredump tools: cuda-gdb {cudagdb.find_cuda_gdb()}, "
        f"nvdisasm {coredump.find_nvdisasm()}",
        flush=True,
    )
    core = coredump.Localizer()
    # the scenarios' libraries imported once, before the first run (as triage does): no
    # row's wall counts them; the server's answer says how long they took
    fs = runner.start_forkserver(args.out, preload=preloads.modules_of_scenarios(scs))
    if fs is not None and fs.preloaded is not None:
        print(f"fork server: {preloads.summary(fs.preloaded)}", flush=True)
    rows, t_begin = [], time.monotonic()
    try:
        for sc in scs:
            if time.monotonic() - t_begin > args.budget_s:
                rows.append({"scenario": sc.id, "skipped": "budget"})
                continue
            sc = sc.with_overrides(
                limits=S.Limits(**{**vars(sc.limits), "deadline_s": args.deadline})
            )
            t0 = time.monotonic()
            res = runner.run_scenario(
                sc, runs_root=args.out, probes=False, forkserver=fs, core=core
            )
            wall = time.monotonic() - t0
            # our descendants still alive after the run but the fork server and the keeper (a
            # forked worker, cuda-gdb or a health check left behind would show here)
            helpers = {fs.proc.pid if fs is not None and fs.proc is not None else None}
            keeper = getattr(getattr(lifeline, "_KEEPER", None), "proc", None)
            helpers.add(keeper.pid if keeper is not None else None)  # the harness's keeper
            left = [p for p in psutil.Process().children(recursive=True) if p.pid not in helpers]
            if left:
                print("left:", [(p.pid, p.name(), p.status(), p.cmdline()[:3]) for p in left])
            r = row(res, wall, len(left))
            rows.append(r)
            if args.keep_fixtures:
                keep(res, Path(args.keep_fixtures))
            print(json.dumps(r, default=str), flush=True)
    finally:
        if fs is not None:
            fs.close()
    print(f"\ndump flags: {coredump.generation_flags()}")
    print(
        f"{'scenario':48} {'verdict':8} {'loc':5} {'read':6} {'dump':>5} {'gdb':>5} "
        f"{'added':>6} {'MB':>5} {'ok?':4} core says"
    )
    for r in rows:
        if "skipped" in r:
            print(f"{r['scenario']:48} skipped ({r['skipped']})")
            continue
        print(
            f"{r['scenario'][:48]:48} {r['verdict'][:8]:8} {str(r['localization_ok'])[:5]:5} "
            f"{read_by(r):6} {r['dump_s'] or 0:5.2f} {r['gdb_s'] or 0:5.2f} {r['added_s']:6.2f} "
            f"{r['core_mb']:5.1f} {str(r['healthy'])[:4]:4} {r['core'][:90]}"
        )
    for r in rows:  # where the added seconds went, per scenario of over 1,000 warps
        if "skipped" not in r and (r.get("warps") or 0) > 1000 and read_by(r) == "attach":
            print(
                f"{r['scenario']}: {r['warps']} warps: added {r['added_s']} s = attached "
                f"reading {r['attach']['attach_s']} s (cuda-gdb rounds "
                f"{r['attach'].get('rounds_s')} s, nvdisasm {r['attach'].get('nvdisasm_s')} s "
                f"beside it) + the report {r['core_s']} s"
            )
        elif "skipped" not in r and (r.get("warps") or 0) > 1000:
            print(
                f"{r['scenario']}: {r['warps']} warps, {r['core_mb']} MB: added {r['added_s']} s = "
                f"dump {r['dump_s']} s (complete: {r['dump_complete']}) + reading "
                f"{r['core_s']} s (cuda-gdb rounds {r['gdb_rounds_s']} s in "
                f"{r['gdb_processes']} process(es), round 1 sent {r['gdb_prefetched_s']} s "
                f"before the reading and waited {r['gdb_round1_wait_s']} s; nvdisasm "
                f"{r['nvdisasm_s']} s beside it)"
            )
            for line in r["driver_progress"]:
                print(f"  {line}")
    seen: dict[str, int] = {}  # did cuda-gdb load each core while the worker was killed?
    for r in rows:
        if "skipped" not in r and r.get("dump_s") is not None:
            k = f"prefetch {r.get('gdb_prefetch')}, pipe after the dump {r.get('pipe_after_dump')}"
            seen[k] = seen.get(k, 0) + 1
    for k, n in seen.items():
        print(f"{n} core(s): {k}")
    for r in rows:
        if r.get("hook_errors"):
            print(f"{r['scenario']}: before-kill hook error(s): {r['hook_errors']}")
    for r in rows:
        if read_by(r) == "dump" and (r.get("attach") or {}).get("error"):
            print(f"{r['scenario']}: attaching failed, dumped: {r['attach']['error']}")
    fell = [r["scenario"] for r in rows if r.get("gdb_fallback")]
    if fell:
        print(f"cuda-gdb -batch fallback in {len(fell)} row(s): {fell[0]}: ", end="")
        print(next(r["gdb_fallback"] for r in rows if r.get("gdb_fallback")))
    done = [r for r in rows if "skipped" not in r]
    loc = [r for r in done if r["localization_ok"] is not None]
    print(
        f"\n{len(done)} run, verdict as expected {sum(r['verdict_ok'] for r in done)}, "
        f"localized as expected {sum(bool(r['localization_ok']) for r in loc)}/{len(loc)}, "
        f"read attached {sum(read_by(r) == 'attach' for r in done)}, "
        f"dumped {sum(read_by(r) == 'dump' for r in done)}, "
        f"healthy after every dump: {all(r['healthy'] is not False for r in done)}, "
        f"leftovers {sum(r['leftovers'] for r in done)}, "
        f"wall {time.monotonic() - t_begin:.1f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
