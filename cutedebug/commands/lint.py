"""`cutedebug lint`: the command front end of the static protocol checks (analyses/lint.py).

The parent never imports cutlass: each scenario is compiled under the recorder in a child
process (``python -m cutedebug.analyses.lint REQUEST.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from cutedebug.analyses.lint import HARNESS_CHECK, Finding, Protocol, render
from cutedebug.commands.args import adhoc_scenario
from cutedebug.commands.exits import EXIT_HARNESS
from cutedebug.engine import lifeline, watchdog
from cutedebug.engine import scenario as S
from cutedebug.errors import UsageError


def lint_scenario(
    sc: Any, timeout_s: float | None = None, arch_from_kernel: bool = False
) -> dict[str, Any]:
    """Run compile_and_check in a child watched by the watchdog (the parent never imports
    cutlass); its temporary folder is removed even if we are killed."""
    tmp = lifeline.make_tempdir("cutedebug-lint-")  # the keeper removes it if we are killed
    try:
        req, out, log = Path(tmp) / "request.json", Path(tmp) / "result.json", Path(tmp) / "log"
        data = sc.to_json()
        data["arch_from_kernel"] = arch_from_kernel
        req.write_text(json.dumps({"scenario": data, "out": str(out), "dump_dir": tmp}))
        env = dict(os.environ, CUTE_DSL_DUMP_DIR=tmp)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        timeout = timeout_s or sc.limits.compile_s + sc.limits.import_s
        outcome, _ = watchdog.watch(
            [sys.executable, "-m", "cutedebug.analyses.lint", str(req)],
            None,
            log,
            S.Limits(import_s=timeout),
            env=env,
            total_s=timeout,
        )
        if outcome.killed_by_watchdog:
            return {"error": f"compile did not finish within {timeout} s"}
        if not out.exists():
            return {
                "error": f"lint child exited with {outcome.returncode} and no result",
                "stderr": outcome.log_tail,
            }
        return json.loads(out.read_text())
    finally:
        lifeline.remove_tempdir(tmp)


def cmd_lint(args: argparse.Namespace) -> int:
    scenarios = []
    adhoc_ids = set()
    for target in args.targets:
        p = Path(target)
        if target.endswith(".toml") or p.is_dir():
            scenarios += [S.load(f) for f in S.discover(p)]
        else:
            scenarios.append(adhoc_scenario(target, args))
            if not args.arch:
                adhoc_ids.add(id(scenarios[-1]))
    if not scenarios:
        raise UsageError("no scenarios found")
    status = 0
    results = []
    for sc in scenarios:
        res = lint_scenario(sc, arch_from_kernel=id(sc) in adhoc_ids)
        fault = f" fault {sc.fault}{sc.fault_args or ''}" if sc.fault else ""
        if "error" in res:
            print(f"{sc.id}{fault}: lint could not compile: {res['error']}")
            status = max(status, 2)
            results.append({"scenario": sc.id, **res})
            continue
        findings = [Finding.from_json(f) for f in res["findings"]]
        pipelines = Protocol.from_json(res["protocol"]).pipeline_table()
        if not args.all:
            findings = [f for f in findings if f.severity != "info"] or findings
        if not args.json:
            print(render(findings, f"{sc.id}{fault}"))
            if pipelines:
                print(
                    "  pipelines (fault arg pipeline=N): "
                    + "; ".join(f"{p['index']} {p['class']} {p['where']}" for p in pipelines)
                )
        if any(f.check == HARNESS_CHECK for f in findings):
            status = max(status, EXIT_HARNESS)  # the checker crashed: nothing was checked
        elif any(f.severity == "error" for f in findings):
            status = max(status, 1)
        results.append(
            {
                "scenario": sc.id,
                "findings": [f.to_json() for f in findings],
                "pipelines": pipelines,
                "protocol": res["protocol"] if args.protocol else None,
            }
        )
    if args.json:
        print(json.dumps(results, indent=1))
    return status


def add_parser(sub: Any) -> None:
    """`cutedebug lint SCENARIO|DIR|KERNEL_FILE[:ENTRY]`: static protocol checks, no GPU."""
    p = sub.add_parser("lint", help="static barrier-protocol checks at trace time (no GPU)")
    p.add_argument(
        "targets", nargs="+", help="scenario .toml, a directory of them, or FILE.py:ENTRY"
    )
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--fault", metavar="NAME[:ARG=V,...]", help="fault to inject (FILE.py targets)")
    p.add_argument("--arch", action="append", help="target arch (FILE.py targets)")
    p.add_argument("--all", action="store_true", help="show info findings too")
    p.add_argument("--json", action="store_true", help="findings as JSON")
    p.add_argument("--protocol", action="store_true", help="with --json: the recorded protocol")
    p.set_defaults(func=cmd_lint)
