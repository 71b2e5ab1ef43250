"""Schedule perturbation over many scenarios, one table (the H200 evidence for issue 20).

    python3 tools/perturb_table.py --seeds 32 --replays 5 scenarios/tma_stream/drop_sync.toml ...
    python3 tools/perturb_table.py --seeds 64 --clean scenarios/tma_stream/clean.toml ...
    python3 tools/perturb_table.py --combine own/latent.json field_quack/latent.json ...

For each scenario: ``--seeds`` seeded schedules (random policy, or ``--policy`` with its
``--target`` / ``--role`` / ``--scope`` / ``--delay-us``, as ``cutedebug run --perturb``) after
one compile; for one that exposes a failure, two replay rates, each over fresh runs: the
exposing seed ALONE (``--replays`` runs of ``--replay SEED``) and, when seeds ran before it in
its process, WITH that HISTORY (``--history-replays`` runs of ``--replay SEED --replay-from
FIRST``: seeds FIRST..SEED in one worker, in order). A replay counts when it gives the run's
verdict at SEED; one where an earlier seed exposed a failure is counted apart ("earlier"),
never as SEED's. With ``--shrink``, the minimal delay set. ``--clean``: the scenarios are
fault-free and any non-PASS is a false alarm. Every run goes through the same fork server as a
triage.

A scenario whose ``[expect] note`` says ``predicted benign by construction`` (the written reason
why no delay can expose its fault) is marked so, and the summary gives the exposure rate over
all scenarios and over the others. ``--combine`` prints that summary over the ``--json`` files of
several runs (the population run in parts: the project's latent faults and the field's).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutedebug.engine import runner  # noqa: E402
from cutedebug.engine import scenario as S  # noqa: E402

BENIGN = "predicted benign by construction"  # the phrase of a scenario note's written reason
KERNEL_VERDICTS = ("HANG", "CRASH", "MISMATCH", "NONDETERMINISTIC")  # what exposes a fault


def not_a_result(res) -> dict:
    """For a HARNESS_ERROR row, what its run folder alone would say (the folders stay on the
    GPU machine): the exception's type, our frame and its traceback's end, the malformed event
    lines, the worker log's end. Empty for any other verdict."""
    if res.verdict.value != "HARNESS_ERROR":
        return {}
    from cutedebug.event_kinds import HarnessError

    out: dict = {}
    o = res.outcome
    err = o.last(HarnessError) if o is not None else None
    if err is not None:
        out["harness_error"] = {
            "type": err.type,
            "frame": err.frame,
            "traceback": (err.traceback or "")[-1500:],
        }
    if o is not None and o.malformed_lines:
        out["malformed_lines"] = [x[:300] for x in o.malformed_lines[:3]]
    log = Path(res.run_dir) / "worker.log"
    if log.is_file():
        out["worker_log_tail"] = log.read_text(errors="replace")[-1500:]
    return out


def replay_rate(run_one, times: int, verdict: str, seed: int) -> dict:
    """``times`` replays (``run_one()`` -> a RunResult each): how many gave ``verdict`` at
    ``seed`` itself, how many had an earlier seed expose something first."""
    same = earlier = 0
    for _ in range(times):
        rep = run_one()
        by = (rep.evidence.get("perturbation") or {}).get("exposed_by")
        if by is not None and by != seed:
            earlier += 1
        elif rep.verdict.value == verdict and by == seed:
            same += 1
    return {"same": same, "of": times, "earlier": earlier}


def rate_text(rate: dict | None) -> str:
    if not rate:
        return "-"
    more = f" ({rate['earlier']} stopped at an earlier seed)" if rate.get("earlier") else ""
    return f"{rate['same']}/{rate['of']}{more}"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="+", help="scenario TOML files (--combine: JSON files)")
    ap.add_argument("--seeds", type=int, default=32)
    ap.add_argument("--replays", type=int, default=5, help="replays of the seed alone")
    ap.add_argument(
        "--history-replays",
        type=int,
        help="replays with the seeds that ran before it (default: --replays)",
    )
    ap.add_argument("--shrink", action="store_true")
    ap.add_argument(
        "--clean", action="store_true", help="fault-free: any non-PASS is a false alarm"
    )
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new scenarios after")
    ap.add_argument("--runs-dir", default="/tmp/perturb-runs")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--policy", default="random", choices=("random", "targeted", "role"))
    ap.add_argument("--target", type=int, help="targeted: the position")
    ap.add_argument("--role", choices=("producer", "consumer", "any"), help="role: the role")
    ap.add_argument("--scope", help="the keys every delay takes, e.g. 'rank=1 warp=0'")
    ap.add_argument("--delay-us", type=float, help="a fixed delay (microseconds)")
    ap.add_argument(
        "--combine",
        action="store_true",
        help="read the --json files of earlier runs and print one population summary",
    )
    return ap


def policy_of(args: argparse.Namespace) -> dict:
    """The ``perturb`` spec's policy (``perturb_plan.Policy`` fields) the flags give."""
    policy = {"name": args.policy}
    for key, value in (
        ("target", args.target),
        ("role", args.role),
        ("scope", args.scope),
        ("delay_us", args.delay_us),
    ):
        if value is not None:
            policy[key] = value
    return policy


def population(rows: list[dict]) -> dict:
    """#20's counts over perturbed rows: the kernel verdicts that expose a fault, those
    predicted benign by construction, and the rows that are not a result."""
    ran = [r for r in rows if r.get("runs")]
    exposed = [r for r in ran if r["verdict"] in KERNEL_VERDICTS]
    open_ = [r for r in ran if not r.get("predicted")]
    return {
        "ran": len(ran),
        "exposed": len(exposed),
        "open": len(open_),
        "open_exposed": len([r for r in exposed if not r.get("predicted")]),
        "benign_exposed": [r["scenario"] for r in exposed if r.get("predicted")],
        "not_a_result": [
            r["scenario"] for r in rows if r["verdict"] in ("HARNESS_ERROR", "UNSUPPORTED")
        ],
        "not_perturbed": [
            r["scenario"]
            for r in rows
            if not r.get("runs") and r["verdict"] not in ("HARNESS_ERROR", "UNSUPPORTED")
        ],
    }


def combine(paths: list[str]) -> int:
    """One population summary over the --json files of several runs (e.g. the project's latent
    faults and the field's, run in separate steps; .json or .json.gz). A scenario in more than
    one file counts once, with its row from the last file that perturbed it (a later run
    supersedes an earlier one; a row the budget skipped supersedes nothing)."""
    by_id: dict[str, dict] = {}
    for path in paths:
        raw = Path(path).read_bytes()
        for r in json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw):
            # a skipped row names its TOML path: scenarios/<id>.toml
            sid = r["scenario"].removeprefix("scenarios/").removesuffix(".toml")
            if sid in by_id and by_id[sid].get("runs") and not r.get("runs"):
                continue
            by_id.pop(sid, None)  # the later row, in the later file's order
            by_id[sid] = {**r, "scenario": sid, "file": path}
    rows = list(by_id.values())
    for r in rows:
        print(
            f"{r['scenario']}: {r['verdict']}"
            + (f" (exposed by seed {r['exposed_by']})" if r.get("exposed_by") is not None else "")
            + (" [predicted benign by construction]" if r.get("predicted") else "")
            + f"  ({r['file']})"
        )
    n = population(rows)
    share = f" ({100 * n['exposed'] / n['ran']:.0f}%)" if n["ran"] else ""
    print(f"\nexposed: {n['exposed']}/{n['ran']} scenarios{share}")
    print(
        f"exposed among those not {BENIGN}: {n['open_exposed']}/{n['open']}; "
        f"{BENIGN} and exposed anyway (a reason proven wrong): {n['benign_exposed']}"
    )
    for what, key in (("NOT A RESULT", "not_a_result"), ("NOT PERTURBED", "not_perturbed")):
        for sid in n[key]:
            print(f"{what}: {sid}")
    return 1 if n["not_a_result"] or n["not_perturbed"] else 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.combine:
        return combine(args.scenarios)
    history_n = args.replays if args.history_replays is None else args.history_replays
    policy = policy_of(args)
    t_start = time.monotonic()
    fs = runner.start_forkserver(args.runs_dir)
    rows = []
    try:
        for path in args.scenarios:
            if time.monotonic() - t_start > args.budget_s:
                rows.append({"scenario": path, "verdict": "skipped (budget)"})
                continue
            sc = S.load(path)
            spec = {"n": args.seeds, "seed": 0, "shrink": args.shrink, "policy": policy}
            t0 = time.monotonic()
            res = runner.run_scenario(sc, runs_root=args.runs_dir, forkserver=fs, perturb=spec)
            p = res.evidence.get("perturbation") or {}
            row = {
                "scenario": sc.id,
                "verdict": res.verdict.value,
                "runs": p.get("runs"),
                "positions": p.get("positions"),
                "exposed_by": p.get("exposed_by"),
                "outcome": p.get("exposing_outcome") or p.get("killed_during"),
                "delays": (p.get("shrunk") or {}).get("described") or p.get("described"),
                "secs": round(time.monotonic() - t0, 2),
                "health": res.health,
                "predicted": BENIGN if BENIGN in (sc.expect.note or "") else None,
                "reason": res.reason[:400],
                "run_dir": str(res.run_dir),
                **not_a_result(res),
            }
            seed, first = p.get("exposed_by"), p.get("history_from")
            row["history_from"] = first

            def replay_once(replay_from=None, sc=sc, spec=spec, seed=seed):
                return runner.run_scenario(
                    sc,
                    runs_root=args.runs_dir,
                    forkserver=fs,
                    perturb={**spec, "replay": seed, "replay_from": replay_from, "shrink": False},
                )

            if seed is not None and args.replays:
                rate = replay_rate(replay_once, args.replays, res.verdict.value, seed)
                row["replay_alone"] = rate
                row["replay"] = rate_text(rate)
            if seed is not None and first is not None and history_n:
                rate = replay_rate(
                    lambda first=first: replay_once(first), history_n, res.verdict.value, seed
                )
                row["replay_with_history"] = rate
            row["replay_history"] = (
                rate_text(row.get("replay_with_history"))
                if first is not None
                else ("= alone (first seed)" if seed is not None else "-")
            )
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
    finally:
        fs.close(timeout=5.0)
    print()
    print(
        "| scenario | verdict | seeds run | positions | exposed by seed | outcome | "
        "replay alone | replay with history | delays (shrunk when asked) | s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        delays = "; ".join(r.get("delays") or [])[:160]
        exposed = r.get("exposed_by", "-")
        if r.get("history_from") is not None:
            exposed = f"{exposed} (after {r['history_from']}-{r['exposed_by'] - 1})"
        print(
            f"| {r['scenario']} | {r['verdict']} | {r.get('runs', '-')} | "
            f"{r.get('positions', '-')} | {exposed} | {r.get('outcome') or '-'} | "
            f"{r.get('replay', '-')} | {r.get('replay_history', '-')} | {delays or '-'} | "
            f"{r.get('secs', '-')} |"
        )
    # a verdict about the kernel; HARNESS_ERROR is a bug of ours and UNSUPPORTED ran nothing:
    # neither exposes anything (each is listed below instead)
    n = population(rows)
    ours = [r for r in rows if r["scenario"] in n["not_a_result"]]
    unperturbed = [r for r in rows if r["scenario"] in n["not_perturbed"]]
    what = "false alarms" if args.clean else "exposed"
    print(
        f"\n{what}: {n['exposed']}/{n['ran']} scenarios ({args.seeds} seeds each); "
        f"{time.monotonic() - t_start:.1f} s"
    )
    printed = [  # the replay the report prints: with history when there was one
        r.get("replay_with_history") if r.get("history_from") is not None else r.get("replay_alone")
        for r in rows
    ]
    for key, what_ in (
        ("replay_alone", "alone"),
        ("replay_with_history", "with history"),
        (None, "as the report prints it (with history when there was one)"),
    ):
        rates = [x for x in printed if x] if key is None else [r[key] for r in rows if r.get(key)]
        if rates:
            same, of = sum(x["same"] for x in rates), sum(x["of"] for x in rates)
            earlier = sum(x["earlier"] for x in rates)
            print(
                f"replay {what_}: {same}/{of} replays gave the exposing verdict at the exposing "
                f"seed ({100 * same / of:.0f}%) over {len(rates)} scenario(s)"
                + (f"; {earlier} stopped at an earlier seed" if earlier else "")
            )
    for r in ours:
        print(f"NOT A RESULT ({r['verdict']}): {r['scenario']}: {r.get('reason', '')[:300]}")
        tb = (r.get("harness_error") or {}).get("traceback") or r.get("worker_log_tail") or ""
        for line in tb.strip().splitlines()[-8:]:
            print(f"    {line}")
    for r in unperturbed:
        print(f"NOT PERTURBED ({r['verdict']}): {r['scenario']}: {r.get('reason', '')[:300]}")
    if not args.clean:
        print(
            f"exposed among those not {BENIGN}: {n['open_exposed']}/{n['open']}; "
            f"{BENIGN} and exposed anyway (a reason proven wrong): {n['benign_exposed']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 1 if ours or unperturbed else 0


if __name__ == "__main__":
    sys.exit(main())
