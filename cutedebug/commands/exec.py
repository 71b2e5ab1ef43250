"""`cutedebug exec -- CMD ARGS...`: any program watched and instrumented, no adapter.

    cutedebug exec [--fault KIND:ARGS] [--probes] [--deadline S] -- python repro.py
    cutedebug exec --probes -- python -m pytest tests/test_x.py -k y

CMD runs as a watched child in its own session, tagged like the workers of `run`, with the
instrumentation active in every Python interpreter of its process tree from the moment the
program imports cutlass (cutedebug/instrument/launch.py). The verdict comes from, in order:

- HARNESS_ERROR: the instrumentation failed in some process (never reported as the program's);
- HANG: a bounded wait timed out (probe stuck records: the kernel by name, the stuck sites and
  the stuck map), or the watchdog ended the command (deadline; the Python stack of every
  process of the tree, dumped by faulthandler just before the kill, says where it waited);
- CRASH: the command failed with a CUDA error in its output (named like `run` names it), or a
  process died of a signal the watchdog did not send;
- FAIL: the command's own check failed (non-zero exit), with the last lines of its output;
- PASS: exit status 0.

A HANG without probes is rerun once with probes on to localize it (when the first run traced
a CuTe DSL kernel), as `run` does. The command is launched and watched by the harness's one
watchdog (engine/watchdog.py: its own session, the lifeline tags and PR_SET_PDEATHSIG, so it
dies with cutedebug; killed with its group, then whatever carries its tag is swept, grandchildren
in sessions of their own included); exec adds its kill rules (settled stuck records, a stall, the
deadline) and a faulthandler dump before the kill. A GPU health check follows a kill.
Exit codes as `run`: 0 the verdict is the expected one (--expect, default PASS), 1 it is not,
2 usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from cutedebug.engine import runner
from cutedebug.engine import verdict as V
from cutedebug.engine.command import (  # noqa: F401  (this module's interface)
    DEFAULT_BUDGET_MS,
    DEFAULT_DEADLINE_S,
    DEFAULT_STALL_S,
    ExecResult,
    Settings,
    _Tree,
    classify,
    hang_evidence,
    last_lines,
    probe_config,
    stack_summary,
    used_gpu,
)
from cutedebug.engine.command import watch_command as _watch
from cutedebug.engine.limits import limit_arg
from cutedebug.errors import UsageError
from cutedebug.reporting.exec_report import (  # noqa: F401  (this module's interface)
    exec_report,
    tldr,
    to_json,
    to_markdown,
    where,
    write_report,
)

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2


def watch_command(s: Settings, run_dir: Path) -> ExecResult:
    """The command once (engine/command.py), with GPU core dumps when ``s.coredump``: the
    command's CUDA processes get the driver's coredump settings, each is dumped before a kill,
    and the cores are read after a HANG or CRASH (SASS and lines from cuda-gdb)."""
    if not s.coredump:
        return _watch(s, run_dir)
    from cutedebug.analyses import coredump

    dumps: list[dict[str, Any]] = []

    def dump_all(_ctx: dict[str, Any]) -> None:
        dumps.extend(coredump.dump_all(run_dir))  # every CUDA process's GPU state (bounded)

    try:
        res = _watch(s, run_dir, extra_env=coredump.worker_env(run_dir), before_kill=dump_all)
        if res.verdict in (V.Verdict.HANG, V.Verdict.CRASH):
            # no trace-time tables here: the SASS (cuda-gdb's disassembly) and lines alone
            t_core = time.monotonic()
            res.evidence.update(
                coredump.analyse(run_dir, None, {"before_kill": [{"coredump": d} for d in dumps]})
            )
            res.evidence["coredump_s"] = round(time.monotonic() - t_core, 3)
    finally:
        coredump.remove_pipes(run_dir)
    return res


def new_run_dir(root: Path | str, name: str = "exec") -> Path:
    d = Path(root) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    d.mkdir(parents=True, exist_ok=True)
    return d.resolve()


def run_exec(
    s: Settings, run_dir: Path, *, probes_asked: bool | None, budget_ms: int = DEFAULT_BUDGET_MS
) -> ExecResult:
    """The command once; a HANG without probes is rerun with them, as `run` does."""
    res = watch_command(s, run_dir)
    if (
        res.verdict is V.Verdict.HANG
        and s.probes is None
        and probes_asked is None
        and res.traced
        and not res.evidence.get("stuck_sites")
    ):  # a core already said where
        first = res
        s2 = Settings(**{**vars(s), "probes": probe_config(budget_ms)})
        res = watch_command(s2, run_dir / "with_probes")
        res.first_run = {
            "verdict": first.verdict.value,
            "reason": first.reason,
            "elapsed_s": first.elapsed_s,
            "stacks": first.evidence.get("stacks"),
        }
        res.swept = sorted(set(res.swept) | set(first.swept))
    if res.killed_by and used_gpu(res):
        res.health = _health_check(run_dir)
    return res


def _health_check(run_dir: Path) -> dict:
    """The GPU check after a kill, forked from the warm pool's server when one runs for this
    environment (torch imported already), else in a fresh interpreter."""
    from cutedebug.engine import pool

    fs = pool.client(start=False) if pool.warm_choice(None) is not False else None
    if fs is None:
        return runner.health_check()
    try:
        return runner.health_check(forkserver=fs, run_dir=run_dir)
    finally:
        fs.close()


# ---- command line ----------------------------------------------------------------------------
def settings_from_args(args: argparse.Namespace) -> Settings:
    from cutedebug.commands.args import parse_fault
    from cutedebug.instrument import faults

    argv = list(args.cmd)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("no command given: cutedebug exec [options] -- CMD ARGS...")
    fault, fault_args = parse_fault(args.fault)
    if fault is not None:
        try:
            fault_args = faults.validate(fault, fault_args)
        except faults.FaultSpecError as e:
            raise UsageError(f"--fault {args.fault!r}: {e}") from e
        if faults.FAULTS[fault].kind == "switch":
            raise UsageError(
                f"--fault {fault}: a kernel-level switch (declared by an adapter "
                "kernel), not a patch: exec can only inject patch faults; allowed: "
                f"{sorted(n for n, f in faults.FAULTS.items() if f.kind == 'patch')}"
            )
    from cutedebug.engine import pool

    try:
        pool.warm_choice(None)  # CUTEDEBUG_WARM, read again by the health check after a kill
    except ValueError as e:
        raise UsageError(str(e)) from None
    for name in ("deadline", "wait_budget_ms", "stall"):
        v = getattr(args, name, None)
        if v is not None and v <= 0:
            raise UsageError(f"--{name.replace('_', '-')} {v}: must be > 0")
    return Settings(
        argv=argv,
        fault=fault,
        fault_args=fault_args,
        probes=probe_config(args.wait_budget_ms) if args.probes else None,
        deadline_s=args.deadline or DEFAULT_DEADLINE_S,
        stall_s=args.stall,
        cwd=os.getcwd(),
        coredump=bool(getattr(args, "coredump", False)),
    )


def add_common(p: argparse.ArgumentParser, *, mutate: bool = False) -> None:
    """The options exec and mutate share (mutate runs with probes unless --no-probes)."""
    p.add_argument(
        "--probes",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bounded waits + beacons in every traced kernel (default: "
        + ("on" if mutate else "off, and on for one rerun when the command hangs")
        + ")",
    )
    p.add_argument(
        "--wait-budget-ms",
        type=limit_arg("wait_budget_ms"),
        default=DEFAULT_BUDGET_MS,
        help="bounded-wait budget with probes on (default %(default)s)",
    )
    p.add_argument(
        "--deadline",
        type=limit_arg("command_deadline_s"),
        help="seconds the whole command may take (default "
        + (
            "2 x the clean run + 10, at least 30, per mutant"
            if mutate
            else f"{DEFAULT_DEADLINE_S:g}"
        )
        + ")",
    )
    p.add_argument(
        "--stall",
        type=limit_arg("stall_s"),
        default=DEFAULT_STALL_S,
        help="with probes: HANG when an instrumented kernel is in flight and no beacon moves "
        "for this long (default %(default)s s)",
    )
    if not mutate:
        p.add_argument("--runs-dir", default="runs", help="where run directories go")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "exec",
        help="run any command watched and instrumented (no adapter)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "--fault",
        metavar="NAME[:ARG=V,...]",
        help="patch fault injected into "
        "every kernel the command traces (`cutedebug faults` lists them)",
    )
    p.add_argument(
        "--expect",
        default="PASS",
        choices=V.ALL,
        help="expected verdict (default PASS): exit status 0 when it is the verdict",
    )
    p.add_argument(
        "--coredump",
        action="store_true",
        help="on a hang, every CUDA process's GPU state is dumped before the kill (and on a "
        "GPU fault) and read with cuda-gdb: each warp's place, without probes",
    )
    add_common(p)
    p.set_defaults(func=cmd_exec)


def cmd_exec(args: argparse.Namespace) -> int:
    from cutedebug.reporting.report import command_line

    try:
        s = settings_from_args(args)
    except UsageError as e:
        print(f"cutedebug: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    run_dir = new_run_dir(args.runs_dir)
    try:
        res = run_exec(s, run_dir, probes_asked=args.probes, budget_ms=args.wait_budget_ms)
    except UsageError as e:
        print(f"cutedebug: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    md = write_report(res, args.expect, command_line())
    print(tldr(res, args.expect))
    if res.verdict is V.Verdict.FAIL:
        print(
            "  last lines of its output:\n    "
            + "\n    ".join(last_lines(res.log_tail, 8).splitlines())
        )
    if s.fault:
        n = res.fault_count or 0
        print(
            f"  fault {s.fault}: "
            + (f"applied at {n} site(s)" if n else f"NOT applied ({res.fault_not_applied_why()})")
        )
    if (tl := res.evidence.get("timeline")) is not None:
        print(f"  stall -> verdict {tl['stall_to_verdict_s']} s (wait budget included)")
    if res.health is not None:
        print(f"  GPU health check afterwards: {res.health}")
    if res.swept:
        print(f"  swept leftover processes: {res.swept}")
    print(f"  report: {md}", flush=True)
    return EXIT_OK if res.verdict.value == args.expect else EXIT_MISMATCH
