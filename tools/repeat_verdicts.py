"""Verdict frequencies of scenarios, each run N times through the engine.

    python tools/repeat_verdicts.py                       # scenarios/cluster_reduce, 20x
    python tools/repeat_verdicts.py -n 50 scenarios/cluster_reduce/skip_cluster_tail.toml
    python tools/repeat_verdicts.py -n 20 scenarios/sm90_gemm/extra_consumer_release.toml
    python tools/repeat_verdicts.py --json runs/repeat.json

Several faults (cluster-protocol ones, a slot released early) are timing-dependent (a lost race
shows as HANG or MISMATCH, a won one as PASS), so one run says little: every scenario runs ``-n`` times (``runner.run_scenario``
with ``repeat=N``; RunResult.repeats holds each run's verdict) and the table shows how often each
verdict came up, next to the scenario's expected verdict. Runs share one fork server (torch and
cutlass imported once). Exits 0 with "no GPU" when the engine sees none.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutedebug.commands.triage import detect_gpu  # noqa: E402
from cutedebug.engine import runner  # noqa: E402
from cutedebug.engine import scenario as S  # noqa: E402


def frequencies(res: runner.RunResult) -> Counter:
    if res.repeats:
        return Counter(r["verdict"] for r in res.repeats)
    return Counter([res.verdict.value])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="*", default=[str(ROOT / "scenarios" / "cluster_reduce")])
    ap.add_argument("-n", "--repeat", type=int, default=20, help="runs per scenario (20)")
    ap.add_argument("--out", default="runs", help="run directories go here")
    ap.add_argument("--json", help="also write the table as JSON to this file")
    args = ap.parse_args(argv)
    gpu = detect_gpu()
    if not gpu["present"]:
        print(f"repeat_verdicts: no GPU ({gpu['reason']}); nothing to do.")
        return 0
    files = [f for t in args.targets for f in S.discover(t)]
    fs = runner.start_forkserver(args.out)
    rows = []
    try:
        for f in files:
            sc = S.load(f)
            t0 = time.monotonic()
            res = runner.run_scenario(sc, runs_root=args.out, repeat=args.repeat, forkserver=fs)
            freq = frequencies(res)
            n = sum(freq.values())
            rows.append(
                {
                    "scenario": sc.id,
                    "expected": "/".join(sc.expect.verdicts),
                    "runs": n,
                    "frequencies": dict(freq.most_common()),
                    # a timing-dependent scenario expects each verdict of its expect.also too
                    "expected_share": round(
                        sum(c for v, c in freq.items() if sc.expect.accepts(v)) / n, 3
                    ),
                    "verdict": res.verdict.value,
                    "wall_s": round(time.monotonic() - t0, 1),
                    "reason": res.reason[:100],
                    "run_dir": str(res.run_dir),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    finally:
        if fs is not None:
            fs.close()
    print()
    print("| scenario | expected | frequencies | expected share | wall s |")
    print("|---|---|---|---|---|")
    for r in rows:
        freq = ", ".join(f"{v} {c}/{r['runs']}" for v, c in r["frequencies"].items())
        print(
            f"| {r['scenario']} | {r['expected']} | {freq} | {r['expected_share']:.2f} | "
            f"{r['wall_s']} |"
        )
    stable = sum(r["expected_share"] == 1.0 for r in rows)
    print(f"\n{stable} of {len(rows)} scenarios gave their expected verdict on every run")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
