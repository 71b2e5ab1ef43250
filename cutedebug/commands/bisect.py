"""`cutedebug bisect SCENARIO`: printf-bisection of a hang (``cutedebug.analyses.bisect``),
its report written by ``cutedebug.reporting.bisect``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cutedebug.analyses import bisect as B
from cutedebug.commands import exits
from cutedebug.engine import scenario as S
from cutedebug.engine.limits import limit_arg
from cutedebug.reporting import bisect as R
from cutedebug.reporting import report


def cmd_bisect(args: argparse.Namespace) -> int:
    sc = S.load(args.scenario)
    res = B.bisect(
        sc,
        runs_root=args.runs_dir,
        window_s=args.window,
        probes=args.probes,
        forkserver=args.forkserver,
        command=report.command_line(),
    )
    _, md = R.write(res)
    if args.json:
        print(json.dumps(res.to_json(), indent=1, default=str))
    else:
        print(R.tldr(res))
        print(f"  report: {md}")
    if res.status == "error":
        return exits.EXIT_HARNESS  # the bisection itself failed: ours, not the kernel's
    if res.status == "nothing_to_bisect" and res.baseline.verdict == "UNSUPPORTED":
        return exits.EXIT_NOT_RUN  # it compiled, but could not run here (no GPU, another arch)
    return exits.EXIT_OK if res.ok else exits.EXIT_UNEXPECTED


def add_parser(sub: Any) -> None:
    b = sub.add_parser(
        "bisect",
        help="printf-bisection of a hang: the last checkpoint each "
        "warp role reaches (one checkpoint per run)",
    )
    b.add_argument("scenario", help="scenario .toml whose kernel hangs")
    b.add_argument(
        "--window",
        type=limit_arg("window_s"),
        default=B.DEFAULT_WINDOW_S,
        help="seconds from launch before a checkpoint run counts as hung "
        f"(default {B.DEFAULT_WINDOW_S})",
    )
    b.add_argument(
        "--probes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="baseline with bounded-wait probes, whose answer is compared",
    )
    b.add_argument(
        "--forkserver",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fork workers from one process that imported torch and cutlass",
    )
    b.add_argument("--runs-dir", default="runs", help="where the run directory goes")
    b.add_argument("--json", action="store_true", help="print the JSON result")
    b.set_defaults(func=cmd_bisect)
