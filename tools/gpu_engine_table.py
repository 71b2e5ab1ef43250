"""Run scenarios through the engine and print a verdict table (the GPU evidence script).

    python tools/gpu_engine_table.py [SCENARIO_OR_DIR ...] [--out DIR]

Defaults to scenarios/minimal. Each scenario runs in its own watched child; the table shows
expected vs actual verdict, the time to verdict and, after a kill, the GPU health check.
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutedebug.analyses import lint  # noqa: E402
from cutedebug.engine import runner  # noqa: E402
from cutedebug.engine import scenario as S  # noqa: E402
from cutedebug.reporting import report  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("targets", nargs="*", default=[str(ROOT / "scenarios" / "minimal")])
    ap.add_argument("--out", default="runs")
    ap.add_argument("--probes", action=argparse.BooleanOptionalAction, default=None)
    args = ap.parse_args()
    files = [f for t in args.targets for f in S.discover(t)]
    rows = []
    for f in files:
        sc = S.load(f)
        t0 = time.monotonic()
        res = runner.run_scenario(
            sc, runs_root=args.out, probes=args.probes, compile_checks=[lint.static_findings]
        )
        report.write(res)
        wall = time.monotonic() - t0
        t = res.timings
        rows.append(
            {
                "scenario": sc.id,
                "expected": sc.expect.verdict,
                "verdict": res.verdict.value,
                "ok": res.expected,
                "wall_s": round(wall, 2),
                "compile_s": t.get("compile_s"),
                "kernel_s": t.get("kernel_s"),
                "launch_to_kill_s": t.get("launch_to_kill_s"),
                "stall_to_verdict_s": t.get("stall_to_verdict_s"),
                "healthy_after": None if res.health is None else res.health.get("healthy"),
                "reason": res.reason[:90],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    cols = [
        "scenario",
        "expected",
        "verdict",
        "ok",
        "wall_s",
        "compile_s",
        "kernel_s",
        "launch_to_kill_s",
        "healthy_after",
        "reason",
    ]
    print()
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    print(f"\n{sum(r['ok'] for r in rows)} of {len(rows)} as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
