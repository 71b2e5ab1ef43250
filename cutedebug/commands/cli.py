"""`cutedebug` command line.

    cutedebug run SCENARIO.toml|DIR|FILE.py:ENTRY [...]   one verdict (and report) per scenario
    cutedebug list [DIR]                                  scenarios as a table
    cutedebug faults                                      the fault registry
    cutedebug triage DIR --out OUT [--resume] [--repeat N] [--bisect]  every scenario, one matrix
    cutedebug exec [--fault F] [--probes] -- CMD ARGS...  any program, watched and instrumented
    cutedebug mutate --out OUT [--resume] -- CMD ARGS...  how many injected faults CMD catches
    cutedebug pool start|status|stop                      the warm pool `run --warm` forks from

Exit codes (cutedebug.commands.exits): 0 every verdict as expected, 1 some verdict or
localization not as expected, 2 bad input (scenario, option, path), 3 harness error (a bug of
ours), 4 could not run here (no GPU, another arch), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cutedebug.commands import exits
from cutedebug.commands.args import adhoc_scenario, parse_fault, parse_kv
from cutedebug.engine import scenario as S
from cutedebug.engine.verdict import ALL as VERDICTS
from cutedebug.errors import UsageError

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = exits.EXIT_OK, exits.EXIT_UNEXPECTED, exits.EXIT_USAGE


# Kept under their old names: other commands and tests import them from here.
_kv = parse_kv
__all__ = ["UsageError", "parse_fault", "main"]


def load_targets(args: argparse.Namespace) -> list[S.Scenario]:
    scenarios: list[S.Scenario] = []
    for target in args.targets:
        p = Path(target)
        if target.endswith(".toml") or p.is_dir():
            files = S.discover(p)
            if not files:
                raise UsageError(f"{target}: no scenario files (*.toml) found")
            scenarios += [S.load(f) for f in files]
        else:
            scenarios.append(adhoc_scenario(target, args, args.expect or "PASS"))
    overrides: dict[str, Any] = {}
    if args.expect and all(t.endswith(".toml") or Path(t).is_dir() for t in args.targets):
        overrides["expect"] = S.Expect(verdict=args.expect)
    limit_over = {
        k: v
        for k, v in (
            ("deadline_s", args.deadline),
            ("stall_s", args.stall),
            ("compile_s", args.compile_deadline),
        )
        if v is not None
    }
    out = []
    for sc in scenarios:
        kw = dict(overrides)
        if limit_over:
            kw["limits"] = S.Limits(**{**vars(sc.limits), **limit_over})
        out.append(sc.with_overrides(**kw) if kw else sc)
    return out


def writable_dir(path: str | Path, what: str) -> Path:
    """``path`` created if needed and writable, else UsageError naming it and why (exit 2)."""
    import tempfile

    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        tempfile.NamedTemporaryFile(dir=p, prefix=".write-check-").close()
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot write there: {e.strerror or e}") from None
    return p


def result_status(res, mode: str) -> int:
    """One result's exit code: 3 harness error, 4 not run here, 1 not as expected, 0 ok."""
    v, exp = res.verdict.value, res.scenario.expect
    if v == "HARNESS_ERROR" and not exp.accepts(v):
        return exits.EXIT_HARNESS
    if v == "UNSUPPORTED" and mode == "run" and not exp.accepts(v):
        return exits.EXIT_NOT_RUN
    return EXIT_OK if res.expected else exits.EXIT_UNEXPECTED


def cmd_run(args: argparse.Namespace) -> int:
    from cutedebug.engine import pool, runner
    from cutedebug.engine.timings import process_age_s

    # report.json's cli_start_s counts from here: the process's start (its interpreter and
    # imports included), then each report's end for the next scenario
    age = process_age_s()
    args.clock_mark = None if age is None else time.monotonic() - age
    scenarios = load_targets(args)
    writable_dir(args.runs_dir, "--runs-dir")
    mode = "compile" if args.compile_only else "run"
    status = EXIT_OK
    results = []
    # The warm pool's server when there is one for this environment (engine/pool.py); else
    # many runs in a row share a fork server that has imported torch and cutlass once.
    try:
        warm = pool.warm_choice(args.warm)
        if warm:
            pool.idle_seconds(None)  # CUTEDEBUG_POOL_IDLE_S, for the server this may start
    except ValueError as e:
        raise UsageError(str(e)) from None
    fs = pool.client(start=True) if warm else None if warm is False else pool.client(start=False)
    if fs is None and warm:
        try:  # the pool's folder is the reason, or else the server's log says it
            pool.Paths.of(pool.pool_dir(), pool.key_of(pool.fingerprint()))
            why = "`cutedebug pool status` shows its log"
        except pool.PoolError as e:
            why = str(e)
        print(
            f"cutedebug: --warm: no pool server could be had here ({why}); fresh interpreters "
            "instead",
            file=sys.stderr,
        )
    if fs is None and (len(scenarios) > 1 or args.repeat > 1):
        fs = runner.start_forkserver(args.runs_dir)
    done = False
    try:
        for sc in scenarios:
            res = _run_one(args, sc, mode, fs, single=len(scenarios) == 1)
            results.append(res)
            status = exits.worst(status, result_status(res, mode))
        done = True
    finally:
        if fs is not None:
            fs.close(timeout=10.0 if done else 1.0)
    if len(results) > 1:
        ok = sum(r.expected for r in results)
        print(f"{ok} of {len(results)} scenarios as expected")
    not_run = [r for r in results if r.verdict.value == "UNSUPPORTED" and mode == "run"]
    if not_run:
        print(
            f"{len(not_run)} scenario(s) compiled but not run: "
            f"{not_run[0].reason.removeprefix('execution skipped: ')}"
        )
    return status


# What writing a run's report imports, imported in a thread while the first run's worker
# compiles and runs (the command meanwhile only waits in the watchdog's loop): off the run's
# critical path. The names are imported again where they are used (an error there, not here).
REPORT_MODULES = (
    "cutedebug.reporting.report",
    "cutedebug.analyses.mismatch",
    "cutedebug.reporting.mismatch_map",
    "cutedebug.reporting.perturbation",
)


def _import_quietly(names: tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  (the command's own import says what is wrong)
            return


def _run_one(args, sc, mode, fs, single: bool):
    """Run one scenario, write its report and print its lines; returns the RunResult."""
    from cutedebug.analyses import lint
    from cutedebug.commands import perturb_args
    from cutedebug.engine import runner

    if not getattr(args, "report_imports", None):
        args.report_imports = threading.Thread(
            target=_import_quietly, args=(REPORT_MODULES,), name="cutedebug-imports", daemon=True
        )
        args.report_imports.start()
    core, probes = None, args.probes
    if getattr(args, "coredump", False):
        from cutedebug.analyses import coredump

        core = coredump.Localizer()
        probes = False if probes is None else probes  # a core localizes what probes would
    res = runner.run_scenario(
        sc,
        runs_root=args.runs_dir,
        mode=mode,
        probes=probes,
        wait_budget_ms=args.wait_budget_ms,
        repeat=args.repeat,
        command=command_line() if single else "",
        forkserver=fs,
        compile_checks=[lint.static_findings],
        compile_cache=getattr(args, "compile_cache", True),
        **({"core": core} if core else {}),
        **({"perturb": pert} if (pert := perturb_args.request_field(args)) else {}),
    )
    t_ran = time.monotonic()
    from cutedebug.analyses import mismatch
    from cutedebug.reporting import mismatch_map, perturbation, report

    mismatch.attach(res)  # failure-table diagnosis of wrong values (no-op for other verdicts)
    perturb_args.attach_replay(res, pert)  # the exact command that replays a perturbed exposure
    sections = mismatch_map.report_sections(res) + perturbation.report_sections(res)
    # The command's own seconds around the run (the rest of its wall: writing this report,
    # printing, the interpreter's exit): before it, from the process's start (or the previous
    # scenario's report) to the run's start; after it, until the report is written.
    mark = getattr(args, "clock_mark", None)
    if mark is not None and "wall_s" in res.timings:
        res.timings["cli_start_s"] = round(max(0.0, t_ran - res.timings["wall_s"] - mark), 3)
    res.timings["cli_after_s"] = round(time.monotonic() - t_ran, 3)
    _, md = report.write(res, sections)
    args.clock_mark = time.monotonic()
    print(report.tldr(res)[:2000])
    if (line := perturbation.summary_line(res)) is not None:
        print(line)
    loc = res.localization
    if (
        loc.get("ok") is None
        and loc.get("expected")
        and str(loc.get("why", "")).startswith("not graded")
    ):
        print(f"  localization {loc['why']}")
    comp = res.evidence.get("compiled")
    static = [
        f
        for f in (comp or {}).get("static_findings") or []
        if f.get("severity") in ("error", "warning")
    ]
    if comp and comp.get("static_findings") is not None:
        first = (
            f" — {static[0]['severity']} {static[0]['check']}: {static[0]['message'][:140]}"
            if static
            else ""
        )
        print(f"  static protocol checks: {len(static) or 'no'} finding(s){first}")
    if comp and comp.get("pipelines"):
        print("  " + pipelines_line(comp["pipelines"]))
    if comp and (line := fault_line(comp, res.verdict.value)) is not None:
        print("  " + line)
    if res.verdict.value == "UNSUPPORTED":
        state = f"compiled for {comp['arch']} in {comp['secs']} s" if comp else "did not compile"
        from cutedebug.engine.compile_cache import reused

        if reused(comp):
            state += " (compiled kernel reused: the warm pool had this traced IR)"
        print(f"  {state}; the kernel was not run")
    print(f"  report: {md}", flush=True)
    return res


def command_line() -> str:
    """The command as typed (a report's "command"; reporting.report.command_line's form)."""
    import shlex

    return shlex.join(["cutedebug"] + sys.argv[1:])


def fault_line(compiled: dict[str, Any], verdict: str) -> str | None:
    """Where a patch fault changed the kernel (its sites at the kernel's lines), or that it
    changed nothing: a compile-only or not-run result says so too, not only a PASS (whose
    reason already starts with it)."""
    note = compiled.get("fault_not_applied")
    if note:
        return None if verdict == "PASS" else note
    sites = compiled.get("fault_sites") or []
    if not sites:
        return None
    where = list(
        dict.fromkeys(
            f"{os.path.basename(s.get('file') or '?')}:{s.get('line')}"
            + (f" via {s['via']}" if s.get("via") else "")
            for s in sites
        )
    )
    shown = ", ".join(where[:6]) + (f", ... ({len(where) - 6} more)" if len(where) > 6 else "")
    return f"fault {sites[0].get('fault')} applied at {len(sites)} site(s): {shown}"


def pipelines_line(pipelines: list[dict[str, Any]]) -> str:
    """The kernel's pipelines as `pipeline=N` selects them (instrument/recorder)."""
    return "pipelines (fault arg pipeline=N): " + "; ".join(
        f"{p['index']} {p['class']} {p['where']}" for p in pipelines
    )


def cmd_list(args: argparse.Namespace) -> int:
    files = S.discover(args.dir)
    rows = []
    for f in files:
        try:
            sc = S.load(f)
            rows.append(
                (
                    sc.id,
                    f"{Path(sc.kernel_file).name}:{sc.kernel_entry}",
                    sc.fault or "-",
                    "/".join(sc.expect.verdicts),
                )
            )
        except S.ScenarioError as e:
            rows.append((str(f), "INVALID", str(e).split(": ", 1)[-1][:60], "-"))
    if args.json:
        print(
            json.dumps([dict(zip(("id", "kernel", "fault", "expect"), r)) for r in rows], indent=1)
        )
        return EXIT_OK
    head = ("scenario", "kernel", "fault", "expected")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(4)]
    for r in [head] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    return EXIT_OK


def cmd_faults(args: argparse.Namespace) -> int:
    from cutedebug.instrument import faults

    entries = faults.describe_all()
    if args.json:
        print(json.dumps(entries, indent=1))
        return EXIT_OK
    for e in entries:
        params = ", ".join(
            f"{k}={v['default']!r}" if isinstance(v, dict) else f"{k}={v}"
            for k, v in (e.get("params") or {}).items()
        )
        print(f"{e['name']}({params})  [{e.get('kind', 'patch')}] -> {e.get('expected')}")
        print(f"    {e['description']}")
        for name, p in (e.get("optional_params") or {}).items():
            print(f"    optional {name}={p['default']!r}: {p['description']}")
    if any("pipeline" in (e.get("optional_params") or {}) for e in entries):
        print(
            "\npipeline=N picks one pipeline of the kernel, numbered in the order the kernel "
            "creates them;\n`cutedebug lint FILE.py:ENTRY` and `cutedebug run` list them "
            "(index, class, file:line)."
        )
    return EXIT_OK


# Every subcommand, in --help's order, and how its module is imported when it is chosen (None:
# defined here); literal names, so that the architecture test sees each edge.
COMMANDS = {
    "run": None,
    "list": None,
    "faults": None,
    "sanitize": lambda: importlib.import_module("cutedebug.commands.sanitize"),
    "triage": lambda: importlib.import_module("cutedebug.commands.triage"),
    "merge": lambda: importlib.import_module("cutedebug.commands.shard"),
    "lint": lambda: importlib.import_module("cutedebug.commands.lint"),
    "bisect": lambda: importlib.import_module("cutedebug.commands.bisect"),
    "exec": lambda: importlib.import_module("cutedebug.commands.exec"),
    "mutate": lambda: importlib.import_module("cutedebug.commands.mutate"),
    "pool": lambda: importlib.import_module("cutedebug.commands.pool"),
}


def chosen_command(argv: list[str]) -> str | None:
    """The subcommand a command line names (its first word; the top-level parser has no option
    that takes a value), or None when it names none of them (--help, a typo)."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; ``only``: that subcommand alone, so that a `cutedebug run`
    does not import the other commands' modules (a tenth of a second of every run; --help and
    an unknown command get every one)."""
    p = argparse.ArgumentParser(
        prog="cutedebug",
        description=__doc__.split("\n\n")[0],
        epilog=exits.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    if only in (None, "run"):
        r = sub.add_parser(
            "run",
            help="run scenarios and give verdicts",
            epilog=exits.HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        r.add_argument(
            "targets",
            nargs="+",
            help="scenario .toml, a directory of them, or FILE.py:ENTRY for an ad-hoc run",
        )
        r.add_argument(
            "--param",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="kernel parameter (ad-hoc runs)",
        )
        r.add_argument("--fault", metavar="NAME[:ARG=V,...]", help="fault to inject (ad-hoc runs)")
        r.add_argument(
            "--expect",
            choices=VERDICTS,
            help="expected verdict (default PASS for ad-hoc runs; overrides the scenario's)",
        )
        r.add_argument("--arch", action="append", choices=S.ARCHS, help="ad-hoc: archs it runs on")
        r.add_argument("--compile-only", action="store_true", help="compile and stop")
        r.add_argument(
            "--probes",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="bounded waits + beacons (default: the scenario's setting)",
        )
        r.add_argument(
            "--coredump",
            action="store_true",
            help="localize a hang (or crash) from the GPU state before the kill: cuda-gdb "
            "attached to the hung worker, or the driver's core with "
            "CUTEDEBUG_COREDUMP_READ=dump (and for a crash); probes off unless --probes",
        )
        r.add_argument(
            "--wait-budget-ms",
            type=S.limit_arg("wait_budget_ms"),
            help="bounded-wait budget with probes on",
        )
        r.add_argument(
            "--repeat",
            type=S.limit_arg("repeat"),
            default=1,
            help="run N times; disagreeing runs are NONDETERMINISTIC",
        )
        r.add_argument(
            "--deadline", type=S.limit_arg("deadline_s"), help="kernel deadline in seconds"
        )
        r.add_argument(
            "--stall", type=S.limit_arg("stall_s"), help="stall window in seconds (probes on)"
        )
        r.add_argument(
            "--compile-deadline", type=S.limit_arg("compile_s"), help="compile deadline in seconds"
        )
        r.add_argument("--runs-dir", default="runs", help="where run directories go")
        r.add_argument(
            "--warm",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="fork workers from the warm pool's resident server, starting it if none runs "
            "(--no-warm: never; default: CUTEDEBUG_WARM, else a running server only; "
            "`cutedebug pool` starts, lists and stops servers)",
        )
        r.add_argument(
            "--compile-cache",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="reuse the compiled kernel when the traced IR is one compiled before: in a "
            "warm pool worker from the pool's folder, in a fresh worker running on a GPU from "
            "the user's (CUTEDEBUG_USER_COMPILE_CACHE, else ~/.cache/cutedebug/compile) "
            "(--no-compile-cache: always compile afresh)",
        )
        from cutedebug.commands import perturb_args  # --perturb N [--policy ...] [--replay S]

        perturb_args.add_arguments(r)
        r.set_defaults(func=cmd_run)
    if only in (None, "list"):
        ls = sub.add_parser("list", help="list scenarios")
        ls.add_argument("dir", nargs="?", default="scenarios")
        ls.add_argument("--json", action="store_true")
        ls.set_defaults(func=cmd_list)
    if only in (None, "faults"):
        f = sub.add_parser("faults", help="list injectable faults")
        f.add_argument("--json", action="store_true")
        f.set_defaults(func=cmd_faults)
    for name, module in COMMANDS.items():
        if module is not None and only in (None, name):
            module().add_parser(sub)
    return p


class Terminated(KeyboardInterrupt):
    """SIGTERM / SIGHUP, raised like Ctrl-C so that every watchdog's cleanup runs."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _terminate(signum, _frame):
    raise Terminated(signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(chosen_command(argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a bad option (2, message printed)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    # `timeout`, a CI runner or a closed terminal sends SIGTERM / SIGHUP: Python's default is
    # to die on the spot, leaving the watched children (a hung kernel, a sanitizer) running.
    # As an exception it unwinds through the watchdogs' finally blocks, which kill them.
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        status = args.func(args)
        sys.stdout.flush()  # a reader that went away shows here, inside this handler
        return status
    except BrokenPipeError:
        # `cutedebug ... | head`: what the reader did not take is dropped, without a traceback
        # (the command's own cleanup ran on the way here, as for an interrupt)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
        return exits.EXIT_BROKEN_PIPE
    except (S.ScenarioError, UsageError) as e:
        print(f"cutedebug: error: {str(e)[:4000]}", file=sys.stderr)
        return EXIT_USAGE
    except Terminated as e:
        print(f"cutedebug: terminated by {signal.Signals(e.signum).name}", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print("cutedebug: interrupted", file=sys.stderr)
        return exits.EXIT_INTERRUPTED
    except OSError as e:
        if e.filename is None:
            raise
        # a path given or implied by the command line that cannot be read or written
        where = e.filename + (f" -> {e.filename2}" if e.filename2 else "")
        print(f"cutedebug: error: {where}: {e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception:  # noqa: BLE001  (a bug of ours: say so, never as the user's error)
        import traceback

        print(
            "cutedebug: internal error (HARNESS_ERROR: a bug of cutedebug's, not of your "
            "kernel or input):\n" + traceback.format_exc()[-6000:],
            file=sys.stderr,
        )
        return exits.EXIT_HARNESS
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def entry() -> None:
    """The `cutedebug` command (and `python -m cutedebug`): main, then the process's end
    without the interpreter's teardown of every module it imported (tens of ms of each run's
    wall): what main wrote is flushed and the atexit hooks run (cuda-gdb sessions, logging)
    first. Where a thread other than the main one is still running, or under a profiler or a
    tracer (`python -m cProfile -m cutedebug` writes its stats after the module returns),
    Python's own exit instead."""
    import atexit

    code = main()
    main_thread = threading.main_thread()
    if (
        not isinstance(code, int)
        or sys.getprofile() is not None
        or sys.gettrace() is not None
        or any(
            t is not main_thread and t.is_alive() and not t.daemon for t in threading.enumerate()
        )
    ):
        sys.exit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # a reader gone away (main already said so) or a closed stream
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":
    entry()
