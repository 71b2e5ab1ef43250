"""`cutedebug sanitize`: compute-sanitizer around the worker, under the watchdog.

One plain run for the slowdown figure, then one sanitized run per tool through
``runner.run_once(wrap=...)`` with the deadlines scaled; findings are parsed, filtered and
classified by :mod:`cutedebug.analyses.sanitizer` and written as ``sanitize.json`` / ``sanitize.md``
into the run directory. The per-tool verdict rules are in :func:`tool_verdict`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cutedebug.analyses.sanitizer.attribution import attribute
from cutedebug.analyses.sanitizer.findings import PARSE_FAILURE, Finding, source_line
from cutedebug.analyses.sanitizer.ordering import order_checker
from cutedebug.analyses.sanitizer.parse import analyze
from cutedebug.analyses.sanitizer.referee import DEFAULT_RUNS as DEFAULT_REFEREE_RUNS
from cutedebug.analyses.sanitizer.referee import referee
from cutedebug.analyses.sanitizer.result import (
    KernelSeconds,
    PlainRun,
    SanitizeSummary,
    ToolResult,
    make_result,
)
from cutedebug.analyses.sanitizer.shrink import ShrinkResult, shrink
from cutedebug.analyses.sanitizer.tool import (
    DEFAULT_PRINT_LIMIT,
    TOOLS,
    build_command,
    child_env,
    find_sanitizer,
)
from cutedebug.analyses.sanitizer.triage import (
    CLEAN,
    filter_noise,
    group,
    mbarrier_caveat,
    tool_verdict,
)
from cutedebug.commands import exits
from cutedebug.engine.limits import limit_arg
from cutedebug.engine.verdict import values
from cutedebug.event_kinds import Compiled, Launched, ProtocolSites, Synced
from cutedebug.records import ABSENT, present
from cutedebug.reporting.files import write_text
from cutedebug.reporting.sanitize import (
    referee_line,
    render_summary_markdown,
    secs,
    top_line,
)

FINDING_VERDICTS = values(lambda v: v.is_sanitizer_finding)
# Sanitized kernels run 10-100x slower; every phase deadline of the scenario is scaled by
# this, so a sanitized hang still ends (as HANG) instead of hanging the caller.
DEFAULT_DEADLINE_SCALE = 10.0
EXIT_OK, EXIT_NOT_AS_EXPECTED, EXIT_USAGE = 0, 1, 2


def parse_tools(text: str | Sequence[str]) -> tuple[str, ...]:
    """``"all"``, ``"memcheck"``, ``"racecheck,synccheck"`` (or a list of those) → tools."""
    items = [text] if isinstance(text, str) else list(text)
    names: list[str] = []
    for item in items:
        for name in (n.strip() for n in item.split(",")):
            if not name:
                continue
            for t in TOOLS if name == "all" else (name,):
                if t not in TOOLS:
                    raise ValueError(
                        f"unknown sanitizer tool {t!r}; choose from {', '.join(TOOLS)} or all"
                    )
                if t not in names:
                    names.append(t)
    if not names:
        raise ValueError("no sanitizer tool given")
    return tuple(names)


def shrinkable_params(kernel_file: str | os.PathLike, entry: str) -> tuple[str, ...]:
    """The entry class's ``SHRINKABLE`` names, read from the source (cutlass never imported)."""
    import ast

    from cutedebug.engine import scenario as S

    try:
        tree = ast.parse(Path(kernel_file).read_text(), filename=str(kernel_file))
    except (OSError, SyntaxError):
        return ()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == entry:
            for name, expr in S.class_constants(node):
                if name == "SHRINKABLE":
                    try:
                        value = ast.literal_eval(expr)
                    except ValueError:
                        return ()
                    if isinstance(value, (tuple, list)):
                        return tuple(v for v in value if isinstance(v, str))
    return ()


@dataclass
class ToolRun:
    tool: str
    result: ToolResult
    findings: list[Finding]  # the kernel under test's (other kernels' are in the result only)
    seconds: float


def launched_kernels(outcome: Any) -> list[str]:
    """The kernel symbols the worker compiled and launched (its "compiled" event)."""
    compiled = outcome.last(Compiled) or Compiled()
    return [k for k in compiled.kernel_names or [] if isinstance(k, str)]


def _kernel_seconds(outcome: Any) -> float | None:
    synced = outcome.last(Synced)
    return synced.kernel_s if synced else None


def run_tool(
    scenario: Any,
    tool: str,
    run_dir: Path,
    *,
    sanitizer: str,
    deadline_scale: float = DEFAULT_DEADLINE_SCALE,
    print_limit: int = DEFAULT_PRINT_LIMIT,
    deadlock_timeout_s: int | None = None,
    plain: PlainRun | None = None,
    reproduce: str = "",
    tma_filter: bool = True,
) -> ToolRun:
    """One sanitized run of ``scenario``'s worker in ``run_dir``: findings and verdict."""
    from cutedebug.engine import runner

    run_dir = Path(run_dir).resolve()
    command: dict[str, Any] = {}

    def wrap(argv: list[str], sub: Path) -> list[str]:
        xml = Path(sub).resolve() / f"{tool}.xml"
        xml.unlink(missing_ok=True)
        command["argv"] = build_command(
            tool,
            argv,
            str(xml),
            sanitizer=sanitizer,
            print_limit=print_limit,
            deadlock_timeout_s=deadlock_timeout_s,
        )
        command["xml"] = xml
        return command["argv"]

    env = child_env(tool)
    classified, outcome, _facts = runner.run_once(
        scenario,
        run_dir,
        mode="run",
        probes=None,
        lineinfo=True,
        wrap=wrap,
        extra_env=env,
        deadline_scale=deadline_scale,
    )
    log_text = (run_dir / "worker.log").read_text(errors="replace")
    findings = analyze(tool, command["xml"], log_text, print_limit)
    roots = (Path(scenario.kernel_file).parent, runner.REPO_ROOT)

    def read(file: str | None, line: int | None) -> str | None:
        return source_line(file, line, roots=roots)

    def read_raw(file: str | None, line: int | None) -> str | None:
        return source_line(file, line, roots=roots, strip=False)

    names = launched_kernels(outcome)
    # hazards both of whose sides one pipeline's spans order (analyses/sanitizer/ordering.py)
    recorded = outcome.last(ProtocolSites)
    ordered = order_checker(recorded.sites if recorded else None, read_raw)
    result = make_result(
        tool,
        command["argv"],
        findings,
        env=env,
        exit_code=outcome.returncode,
        sanitizer_seconds=outcome.elapsed_s,
        plain_seconds=plain.seconds if plain else None,
        xml_path=str(command["xml"]),
        read_source=read,
        read_raw=read_raw,
        ordered=ordered,
        tma_filter=tma_filter,
        kernel_names=names,
    )
    _, filtered = filter_noise(
        findings, tma=tma_filter, read_source=read, read_raw=read_raw, ordered=ordered
    )
    findings, others = attribute(findings, names)
    records = len([f for f in findings if f.kind != PARSE_FAILURE])
    verdict, reason = tool_verdict(
        result.verdict,
        classified.verdict.value,
        classified.reason,
        launched=outcome.last(Launched) is not None,
        synced=outcome.last(Synced) is not None,
        killed=outcome.killed_by_watchdog,
        exit_code=outcome.returncode,
        records=records,
        other_records=len(others),
    )
    compiled, sites = outcome.last(Compiled) or Compiled(), outcome.last(ProtocolSites)
    # its own field: a RACE's reason ("findings below") is not what its report shows
    waits = [*(sites.sites or []), *(sites.raw_waits or [])] if sites else None
    caveat = mbarrier_caveat(verdict, compiled.pipelines, waits)
    k_san, k_plain = _kernel_seconds(outcome), plain.kernel_seconds if plain else None
    result = replace(
        result,
        sanitizer_class=result.verdict,
        verdict=verdict,
        reason=reason,
        kernel_verdict=classified.verdict.value,
        kernel_reason=classified.reason,
        killed_by_watchdog=outcome.killed_by_watchdog,
        deadline_scale=deadline_scale,
        run_dir=str(run_dir),
        worker_log=str(run_dir / "worker.log"),
        records=records,
        filtered_count=len(filtered),
        other_kernel_records=len(others),
        kernel_seconds=KernelSeconds(
            sanitized=k_san,
            plain=k_plain,
            slowdown=k_san / k_plain if k_san and k_plain else None,
        ),
        reproduce_cutedebug=reproduce or ABSENT,
        caveat=caveat,
        referee=None,  # set by sanitize_scenario when the caveat applies
    )
    return ToolRun(tool, result, list(findings), outcome.elapsed_s)


def plain_run(scenario: Any, run_dir: Path) -> PlainRun:
    """The same worker without the sanitizer (line info on, probes off): the slowdown base."""
    from cutedebug.engine import runner

    classified, outcome, _ = runner.run_once(scenario, Path(run_dir).resolve(), lineinfo=True)
    return PlainRun(
        verdict=classified.verdict.value,
        reason=classified.reason,
        seconds=outcome.elapsed_s,
        kernel_seconds=_kernel_seconds(outcome),
        run_dir=str(run_dir),
    )


def _resolved_params(scenario: Any, names: Sequence[str]) -> dict[str, Any]:
    from cutedebug.engine.scenario import ScenarioError, kernel_params_from_source

    try:
        declared = (
            kernel_params_from_source(
                Path(scenario.kernel_file), scenario.kernel_entry, scenario.id
            )
            or {}
        )
    except ScenarioError:
        declared = {}
    params = dict(scenario.params)
    for name in names:
        if name not in params and isinstance(declared.get(name), int):
            params[name] = declared[name]
    return params


def shrink_tool(
    scenario: Any, first: ToolRun, run_dir: Path, *, max_runs: int = 24, **run_kw: Any
) -> ShrinkResult | None:
    """Shrink the scenario's SHRINKABLE params while ``first``'s top finding persists."""
    names = shrinkable_params(scenario.kernel_file, scenario.kernel_entry)
    kept, _ = filter_noise(first.findings)
    groups = group(kept)
    if not names or not groups:
        return None
    params = _resolved_params(scenario, names)
    counter = iter(range(1, 10_000))

    def run(p: dict[str, Any]) -> list[Finding]:
        i = next(counter)
        sc = scenario.with_overrides(params=dict(p))
        tr = run_tool(sc, first.tool, Path(run_dir) / f"candidate{i:02d}", **run_kw)
        if tr.result.verdict not in FINDING_VERDICTS:
            return []  # hung, never ran, unreadable: not "the same finding"
        return tr.findings

    return shrink(
        params,
        names,
        run,
        target=(groups[0].kind, groups[0].lines),
        max_runs=max_runs,
        original=(first.findings, first.seconds),
    )


def sanitize_scenario(
    scenario: Any,
    tools: Sequence[str],
    run_dir: Path,
    *,
    sanitizer: str,
    plain: bool = True,
    do_shrink: bool = False,
    shrink_max_runs: int = 24,
    deadline_scale: float = DEFAULT_DEADLINE_SCALE,
    print_limit: int = DEFAULT_PRINT_LIMIT,
    deadlock_timeout_s: int | None = None,
    reproduce: str = "",
    tma_filter: bool = True,
    on_tool: Callable[[ToolResult], None] | None = None,
    referee_runs: int = DEFAULT_REFEREE_RUNS,
    referee_target: Sequence[str] | None = None,
) -> SanitizeSummary:
    """Plain run (for the slowdown), then one sanitized run per tool (a caveated RACE then
    refereed by ``referee_runs`` perturbed runs), then optional shrink."""
    run_dir = Path(run_dir).resolve()
    plain_info = plain_run(scenario, run_dir / "plain") if plain else None
    run_kw = {
        "sanitizer": sanitizer,
        "deadline_scale": deadline_scale,
        "print_limit": print_limit,
        "deadlock_timeout_s": deadlock_timeout_s,
        "plain": plain_info,
        "tma_filter": tma_filter,
    }
    runs: list[ToolRun] = []
    for tool in tools:
        tr = run_tool(scenario, tool, run_dir / tool, reproduce=reproduce, **run_kw)
        if tr.result.caveat and referee_runs:
            ref = referee(scenario, referee_runs, run_dir / "referee", referee_target)
            tr.result = replace(tr.result, referee=ref)
        runs.append(tr)
        if on_tool is not None:
            on_tool(tr.result)
    shrunk = None
    if do_shrink:
        first = next((r for r in runs if r.result.verdict in FINDING_VERDICTS), None)
        if first is not None:
            shrunk = shrink_tool(
                scenario, first, run_dir / "shrink" / first.tool, max_runs=shrink_max_runs, **run_kw
            )
            if shrunk is not None:
                first.result = replace(first.result, shrink=shrunk)
    return SanitizeSummary(
        scenario=scenario.to_json(),
        expected_verdict=scenario.expect.verdict,
        tools={r.tool: r.result for r in runs},
        plain=plain_info,
        run_dir=str(run_dir),
        reproduce=reproduce,
    )


def dump_summary(summary: SanitizeSummary) -> str:
    """sanitize.json's text."""
    return json.dumps(summary.to_json(), indent=1, default=str)


def as_expected(expected: str, verdicts: Mapping[str, str]) -> bool:
    """A sanitizer verdict is expected: some tool gave it. PASS: every tool CLEAN."""
    if expected in FINDING_VERDICTS:
        return expected in verdicts.values()
    if expected == "PASS":
        return bool(verdicts) and all(v == CLEAN for v in verdicts.values())
    return False


SANITIZER_EXPECTATIONS = (*FINDING_VERDICTS, "PASS")


def judge(
    expected: str, verdicts: Mapping[str, str], plain_verdict: str | None
) -> tuple[bool | None, str]:
    """(as expected?, one line). A sanitizer verdict (or PASS) is checked against the tools;
    a plain-run verdict (HANG, MISMATCH, CRASH, ...) against the plain run, when there was
    one. None: nothing the sanitize command ran can check it."""
    if expected in SANITIZER_EXPECTATIONS:
        ok = as_expected(expected, verdicts)
        return ok, f"expected {expected}: {'as expected' if ok else 'NOT as expected'}"
    if plain_verdict is None:
        return None, (
            f"expected {expected} is a plain-run verdict, and there was no plain run: "
            f"not checked (--expect {'|'.join(SANITIZER_EXPECTATIONS)} checks the "
            "tools)"
        )
    ok = plain_verdict == expected
    return ok, (
        f"expected {expected} (plain run): got {plain_verdict}, "
        f"{'as expected' if ok else 'NOT as expected'}"
    )


def _command_line(args: Any) -> str:
    parts = ["cutedebug", "sanitize", args.scenario, "--tool", ",".join(args.tools)]
    for p in args.param:
        parts += ["--param", p]
    if args.expect:
        parts += ["--expect", args.expect]
    if args.shrink:
        parts.append("--shrink")
    if not args.tma_filter:
        parts.append("--no-tma-filter")
    if args.referee != DEFAULT_REFEREE_RUNS:
        parts += ["--referee", str(args.referee)]
    return shlex.join(parts)


def _run_target(args: Any, sc: Any) -> list[str]:
    """The `cutedebug run` arguments of the same kernel and parameters (a referee's replay)."""
    if not args.param:
        return [args.scenario]
    out = [f"{sc.kernel_file}:{sc.kernel_entry}"]
    for k, v in sc.params.items():
        out += ["--param", f"{k}={v}"]
    fault = ",".join(f"{k}={v}" for k, v in sc.fault_args.items())
    return out + (["--fault", f"{sc.fault}:{fault}" if fault else sc.fault] if sc.fault else [])


def cmd_sanitize(args: Any) -> int:
    from cutedebug.engine import runner
    from cutedebug.engine import scenario as S

    try:
        args.tools = parse_tools(args.tool or "all")
    except ValueError as e:
        print(f"cutedebug sanitize: {e}", file=sys.stderr)
        return EXIT_USAGE
    sanitizer = args.sanitizer or find_sanitizer()
    if not sanitizer or not (os.path.isfile(sanitizer) and os.access(sanitizer, os.X_OK)):
        looked = (
            f"{args.sanitizer} (--sanitizer)"
            if args.sanitizer
            else "$COMPUTE_SANITIZER, compute-sanitizer on PATH, $CUDA_HOME/bin, "
            "$CUDA_PATH/bin, $CUDA_ROOT/bin, /usr/local/cuda/bin, /usr/local/cuda-*/bin, "
            "/opt/nvidia/compute-sanitizer"
        )
        print(
            f"cutedebug sanitize: compute-sanitizer not found; looked for: {looked}. "
            "Install the CUDA toolkit or set COMPUTE_SANITIZER=/path/to/compute-sanitizer.",
            file=sys.stderr,
        )
        return EXIT_USAGE
    sc = S.load(args.scenario)
    if args.param:
        params = dict(sc.params)
        for item in args.param:
            if "=" not in item:
                print(f"cutedebug sanitize: --param {item!r}: expected NAME=VALUE", file=sys.stderr)
                return EXIT_USAGE
            k, v = item.split("=", 1)
            params[k.strip()] = S.parse_value(v.strip())
        sc = sc.with_overrides(params=params)
    if args.expect:
        sc = sc.with_overrides(expect=S.Expect(verdict=args.expect))
    run_dir = runner.new_run_dir(sc, args.runs_dir).resolve() / "sanitize"
    run_dir.mkdir(parents=True, exist_ok=True)

    def progress(r: ToolResult) -> None:
        print(f"{r.tool}: {r.verdict} — {top_line(r)} ({secs(r.sanitizer_seconds)})")
        if present(r.caveat):
            print(f"  caveat: {r.caveat}")
        if ref := present(r.referee):
            print(f"  {referee_line(ref)}")
        sys.stdout.flush()

    summary = sanitize_scenario(
        sc,
        args.tools,
        run_dir,
        sanitizer=sanitizer,
        plain=args.plain,
        do_shrink=args.shrink,
        shrink_max_runs=args.shrink_max_runs,
        deadline_scale=args.deadline_scale,
        print_limit=args.print_limit,
        deadlock_timeout_s=args.racecheck_deadlock_timeout,
        reproduce=_command_line(args),
        tma_filter=args.tma_filter,
        on_tool=progress,
        referee_runs=args.referee,
        referee_target=_run_target(args, sc),
    )
    plain = summary.plain
    ok, verdict_line = judge(
        summary.expected_verdict, summary.verdicts(), plain.verdict if plain else None
    )
    summary = replace(summary, as_expected=ok)
    json_path, md_path = run_dir / "sanitize.json", run_dir / "sanitize.md"
    write_text(json_path, dump_summary(summary))
    write_text(md_path, render_summary_markdown(summary, verdict_line))
    for r in summary.tools.values():
        if r.shrink:
            s = r.shrink
            print(f"  shrunk {s.original} → {s.shrunk} in {len(s.runs)} run(s)")
    if plain:
        print(f"plain run: {plain.verdict} ({secs(plain.seconds)})")
    print(verdict_line)
    print(f"report: {md_path}")
    ours = [t for t, v in summary.verdicts().items() if v == "HARNESS_ERROR"]
    if ours or (plain and plain.verdict == "HARNESS_ERROR"):
        return exits.EXIT_HARNESS  # a bug of ours, not the kernel's
    return EXIT_NOT_AS_EXPECTED if ok is False else EXIT_OK


def add_parser(subparsers: Any) -> Any:
    """Register ``cutedebug sanitize`` on the CLI's subparsers."""
    from cutedebug.engine.verdict import ALL as VERDICTS

    p = subparsers.add_parser(
        "sanitize",
        help="run compute-sanitizer around a scenario's worker",
        description="compute-sanitizer (memcheck/racecheck/synccheck/initcheck) around the "
        "scenario's worker, under the watchdog with scaled deadlines. Exit 0 when "
        "the scenario's expected sanitizer verdict is found (or, for PASS, every "
        "tool is CLEAN), 1 otherwise, 2 on usage errors or a missing sanitizer.",
    )
    p.add_argument("scenario", help="scenario .toml")
    p.add_argument(
        "--tool",
        action="append",
        default=None,
        help="memcheck|racecheck|synccheck|initcheck|all, or a comma list "
        "(repeatable; default all)",
    )
    p.add_argument(
        "--shrink",
        action="store_true",
        help="shrink the kernel's SHRINKABLE params while the first finding persists",
    )
    p.add_argument("--shrink-max-runs", type=limit_arg("shrink_max_runs"), default=24)
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a kernel parameter",
    )
    p.add_argument("--expect", choices=VERDICTS, help="expected verdict (overrides the scenario's)")
    p.add_argument(
        "--deadline-scale",
        type=limit_arg("deadline_scale"),
        default=DEFAULT_DEADLINE_SCALE,
        help="multiply the scenario's deadlines by this under the sanitizer",
    )
    p.add_argument("--print-limit", type=limit_arg("print_limit"), default=DEFAULT_PRINT_LIMIT)
    p.add_argument(
        "--racecheck-deadlock-timeout",
        type=limit_arg("racecheck_deadlock_timeout"),
        default=None,
        metavar="S",
        help="passed to racecheck (cuda::barrier deadlock detection)",
    )
    p.add_argument(
        "--no-tma-filter",
        dest="tma_filter",
        action="store_false",
        help="keep racecheck hazards that touch a bulk async (TMA) copy line",
    )
    p.add_argument(
        "--referee",
        type=limit_arg("referee"),
        default=DEFAULT_REFEREE_RUNS,
        metavar="N",
        help="a racecheck RACE in a kernel that orders shared memory by mbarriers (which "
        "racecheck does not credit) is refereed by N perturbed runs without the sanitizer: "
        f"CONFIRMED when one fails, else UNCONFIRMED (default {DEFAULT_REFEREE_RUNS}; 0: off)",
    )
    p.add_argument("--sanitizer", help="path of compute-sanitizer (default: search)")
    p.add_argument(
        "--no-plain",
        dest="plain",
        action="store_false",
        help="skip the plain run (no slowdown figure)",
    )
    p.add_argument("--runs-dir", default="runs", help="where run directories go")
    p.set_defaults(func=cmd_sanitize, tool=None)
    return p
