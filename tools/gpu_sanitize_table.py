"""compute-sanitizer over the fault scenarios: which tool finds what (the GPU evidence table).

    python tools/gpu_sanitize_table.py [SCENARIO.toml[=TOOLS] ...] [--tools TOOLS]
                                       [--budget-s 330] [--deadline-scale 4] [--out runs]

Default: the tma_stream fault scenarios named in issue 5 plus their clean case, and
scenarios/minimal/{clean,oob_store}.toml, each with the tools that can see its fault (PLAN
below; ``--tools`` replaces them all, ``FILE.toml=racecheck,synccheck`` one of them). Every
(scenario, tool) pair is one `cutedebug sanitize` run (the same worker, wrapped, under the
watchdog with deadlines x ``--deadline-scale``); each scenario also gets one plain run for the
slowdown. Runs that would not fit in ``--budget-s`` are listed as skipped, so the whole table
stays under 6 minutes on an H200 (a sanitized small problem takes ~7-12 s).

Prints one JSON line per run as it finishes, then a Markdown table: scenario, tool, verdict,
findings of the kernel under test (kind@file:line xcount), findings of the process's other
kernels (the torch reference's: counted apart, never the verdict), noise filtered, sanitizer seconds, plain seconds, slowdown,
and what the worker said under the sanitizer. Without a GPU it prints "no GPU" and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutedebug.analyses import sanitizer as san
from cutedebug.analyses.sanitizer.result import PlainRun, ToolResult
from cutedebug.commands import sanitize as cmd
from cutedebug.commands.triage import detect_gpu
from cutedebug.engine import scenario as S
from cutedebug.reporting import sanitize as sanitize_report

SCEN = ROOT / "scenarios"
# scenario -> tools that can see its fault (clean cases: every tool, for false alarms)
PLAN = [
    ("tma_stream/clean.toml", "memcheck,racecheck,synccheck,initcheck"),
    ("tma_stream/drop_sync.toml", "racecheck,synccheck"),
    ("tma_stream/oob_store.toml", "memcheck"),
    ("tma_stream/missing_init_fence.toml", "racecheck,synccheck"),
    ("tma_stream/wrong_expect_tx_minus.toml", "racecheck,synccheck"),
    ("tma_stream/extra_consumer_release.toml", "racecheck,synccheck"),
    ("minimal/clean.toml", "memcheck,initcheck"),
    ("minimal/oob_store.toml", "memcheck"),
]
FIRST_GUESS_S = 15.0  # per sanitized run, until one has been timed
# slowdown: whole processes (imports included); kernel_slowdown: launch -> synchronize only.
COLS = [
    "scenario",
    "tool",
    "verdict",
    "findings",
    "other_kernels",
    "noise_filtered",
    "sanitizer_s",
    "plain_s",
    "slowdown",
    "kernel_slowdown",
    "worker_said",
]


def plan(targets: list[str], tools: str | None) -> list[tuple[Path, tuple[str, ...]]]:
    items = []
    if targets:
        for t in targets:
            path, _, own = t.partition("=")
            items.append((Path(path), own or tools or "all"))
    else:
        items = [(SCEN / f, tools or default) for f, default in PLAN if (SCEN / f).exists()]
    return [(p, cmd.parse_tools(t)) for p, t in items]


def row(sc_id: str, tool: str, res: ToolResult | None, plain: PlainRun | None) -> dict:
    if res is None:
        return {
            "scenario": sc_id,
            "tool": tool,
            "verdict": "skipped (time budget)",
            "findings": "-",
            "other_kernels": "-",
            "noise_filtered": "-",
            "sanitizer_s": None,
            "plain_s": plain.seconds if plain else None,
            "slowdown": None,
            "kernel_slowdown": None,
            "worker_said": "-",
        }
    kernel = res.kernel_seconds.slowdown if res.kernel_seconds else None
    return {
        "scenario": sc_id,
        "tool": tool,
        "verdict": res.verdict,
        "findings": sanitize_report.findings_cell(res),
        "other_kernels": sanitize_report.others_cell(res),
        "noise_filtered": sanitize_report.noise_cell(res),
        "sanitizer_s": res.sanitizer_seconds,
        "plain_s": res.plain_seconds,
        "slowdown": round(res.slowdown, 1) if res.slowdown else None,
        "kernel_slowdown": round(kernel, 1) if kernel else None,
        "worker_said": res.kernel_verdict,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="*", help="SCENARIO.toml or SCENARIO.toml=TOOLS")
    ap.add_argument("--tools", help="tools for every scenario (comma list or all)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=330.0,
        help="start no run that would end after this many seconds",
    )
    ap.add_argument("--deadline-scale", type=float, default=4.0)
    ap.add_argument(
        "--no-tma-filter",
        dest="tma_filter",
        action="store_false",
        help="keep racecheck hazards that touch a TMA copy line (compare with/without)",
    )
    ap.add_argument("--out", default="runs")
    args = ap.parse_args()
    if not detect_gpu()["present"]:
        print("no GPU")
        return 0
    sanitizer = san.find_sanitizer()
    if sanitizer is None:
        print(
            "compute-sanitizer not found ($COMPUTE_SANITIZER, PATH, $CUDA_HOME/bin, "
            "/usr/local/cuda*/bin)",
            file=sys.stderr,
        )
        return 2
    todo = plan(args.targets, args.tools)
    out_dir = Path(args.out).resolve() / time.strftime("sanitize-table-%Y%m%d-%H%M%S")
    t_start = time.monotonic()
    run_s: list[float] = []
    plain_s: list[float] = []
    rows: list[dict] = []
    for path, tools in todo:
        sc = S.load(path)
        sc_dir = out_dir / sc.id.replace("/", "__")
        plain = None
        for tool in tools:
            elapsed = time.monotonic() - t_start
            need = max(run_s, default=FIRST_GUESS_S)
            if plain is None:  # the scenario's first tool also pays for its plain run
                need += max(plain_s, default=FIRST_GUESS_S)
            if elapsed + need > args.budget_s:
                rows.append(row(sc.id, tool, None, plain))
                print(json.dumps(rows[-1]), flush=True)
                continue
            if plain is None:
                t0 = time.monotonic()
                plain = cmd.plain_run(sc, sc_dir / "plain")
                plain_s.append(time.monotonic() - t0)
            t0 = time.monotonic()
            tr = cmd.run_tool(
                sc,
                tool,
                sc_dir / tool,
                sanitizer=sanitizer,
                deadline_scale=args.deadline_scale,
                plain=plain,
                tma_filter=args.tma_filter,
            )
            run_s.append(time.monotonic() - t0)
            (sc_dir / tool / "report.md").write_text(sanitize_report.render_markdown(tr.result))
            rows.append(row(sc.id, tool, tr.result, plain))
            print(json.dumps(rows[-1]), flush=True)
    lines = ["| " + " | ".join(COLS) + " |", "|" + "---|" * len(COLS)]
    lines += [
        "| " + " | ".join("-" if r[c] is None else str(r[c]) for c in COLS) + " |" for r in rows
    ]
    table = "\n".join(lines)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "table.md").write_text(table + "\n")
    (out_dir / "table.json").write_text(json.dumps(rows, indent=1))
    print()
    print(table)
    print(
        f"\n{len(rows)} run(s) in {time.monotonic() - t_start:.0f} s; per-run reports under "
        f"{out_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
