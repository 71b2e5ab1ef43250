"""printf-bisection on the GPU: one `cutedebug bisect` per scenario, one table row each.

    .venv/bin/python tools/gpu_bisect_table.py [SCENARIO_OR_DIR ...] [--window 0.5] [--out DIR]

Defaults: every scenarios/bisect/*.toml and scenarios/tma_stream/wrong_expect_tx_plus.toml.
A row: scenario, checkpoint sites, checkpoint runs (and the per-role budget), wall seconds
(fork server start, baseline, compiles and runs included: target < 60 s), the site found
per role vs the expected localization, the timing-bug flag, whether the bounded-wait probes
agree. Prints "no GPU" and exits 0 on a machine without an NVIDIA GPU. Exit status 1 when a
bisection missed its expected localization or took 60 s or more.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutedebug.analyses import bisect as B  # noqa: E402
from cutedebug.commands.triage import detect_gpu  # noqa: E402
from cutedebug.engine import scenario as S  # noqa: E402
from cutedebug.records import present  # noqa: E402
from cutedebug.reporting import bisect as R  # noqa: E402

TARGET_S = 60.0
DEFAULT_TARGETS = [
    ROOT / "scenarios" / "bisect",
    ROOT / "scenarios" / "tma_stream" / "wrong_expect_tx_plus.toml",
]


def row(res: B.BisectResult, wall: float) -> dict:
    by_id = res.by_id
    found = {
        role: (
            f"{by_id[st.first_unreached].op}@{B.site_where(by_id[st.first_unreached])}"
            if st.first_unreached is not None
            else "end"
        )
        for role, st in res.searches.items()
    }
    pa = res.probes_answer
    return {
        "scenario": res.scenario.id,
        "status": res.status,
        "sites": len(res.sites),
        "runs": len(res.runs),
        "budget": sum(st.budget for st in res.searches.values()),
        "wall_s": round(wall, 1),
        "baseline_s": res.baseline.seconds,
        "found": "; ".join(f"{r}: {f}" for r, f in found.items()) or res.reason[:80],
        "expected": present(res.grade.expected),
        "ok": res.grade.passed,
        "timing_bug": ",".join(f"#{p.site}" for p in res.timing_bugs) or "-",
        "probes": "-" if pa is None else ("agree" if pa.agree else "DISAGREE"),
        "under_60s": wall < TARGET_S,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("targets", nargs="*", default=[str(t) for t in DEFAULT_TARGETS])
    ap.add_argument("--window", type=float, default=B.DEFAULT_WINDOW_S)
    ap.add_argument("--out", default="runs")
    args = ap.parse_args()
    if not detect_gpu()["present"]:
        print("no GPU")
        return 0
    files = [f for t in args.targets for f in S.discover(t)]
    rows = []
    for f in files:
        sc = S.load(f)
        t0 = time.monotonic()
        res = B.bisect(
            sc,
            runs_root=args.out,
            window_s=args.window,
            command=f"cutedebug bisect {f} --window {args.window}",
        )
        wall = time.monotonic() - t0
        _, md = R.write(res)
        rows.append(row(res, wall))
        print(json.dumps(rows[-1]), flush=True)
        print(R.tldr(res), flush=True)
        print(f"  report: {md}", flush=True)
    cols = [
        "scenario",
        "sites",
        "runs",
        "budget",
        "wall_s",
        "baseline_s",
        "found",
        "expected",
        "ok",
        "timing_bug",
        "probes",
        "under_60s",
    ]
    print()
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    good = [
        r for r in rows if r["ok"] is not False and r["status"] == "localized" and r["under_60s"]
    ]
    print(f"\n{len(good)} of {len(rows)} localized as expected in under {TARGET_S:g} s")
    return 0 if len(good) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
