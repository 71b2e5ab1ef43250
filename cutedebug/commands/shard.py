"""Shards across machines: which scenarios a shard runs, and one matrix from many shards.

    cutedebug triage scenarios --out out/shard1 --shard 1/4 [--durations old/matrix.json]
    pytest scenarios --cutedebug-shard 1/4 [--cutedebug-durations old/matrix.json]
    cutedebug merge out/all out/shard1 out/shard2 out/shard3 out/shard4

Assignment (``--shard i/n``, i from 1 to n; cutedebug/engine/shards.py): by scenario id alone
(a scenario never moves when others are added), or, with ``--durations`` (an earlier
matrix.json or a triage output folder), balanced longest first by the seconds it recorded.

``merge`` reads each shard's output folder (its results/*.json records, the source of truth),
refuses a scenario that two shards both ran (the message names both), and writes one
matrix.json|md|html plus results/ into OUT, with each report linked relative to OUT and the
shards' run facts combined (harness errors summed, leftover processes and GPU health per
shard, the wall time of the slowest shard).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from cutedebug.engine.shards import (  # noqa: F401  (the shard logic, re-exported here)
    ShardError,
    assign,
    durations_from,
    parse_shard,
    record_seconds,
    select,
    stable_shard,
)
from cutedebug.engine.triage_record import Facts, TriageMatrix, TriageRecord
from cutedebug.records import RecordError


# ---- merge -----------------------------------------------------------------------------------
def _shard_records(d: Path) -> tuple[TriageMatrix, list[TriageRecord]]:
    from cutedebug.commands import triage

    mpath = d / "matrix.json"
    try:
        data = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ShardError(f"merge: {mpath}: not a readable triage matrix ({e})") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != triage.MATRIX_SCHEMA:
        raise ShardError(f"merge: {mpath}: schema {schema!r}, expected {triage.MATRIX_SCHEMA!r}")
    try:
        m = TriageMatrix.from_json(data)
    except RecordError as e:
        raise ShardError(f"merge: {mpath}: not a triage matrix: {e}") from None
    recs = list(triage.load_records(d / "results").values()) if (d / "results").is_dir() else []
    return m, recs or list(m.scenarios)


def _rebase_report(rec: TriageRecord, src: Path, out: Path) -> TriageRecord:
    """A copy of the record with its reports' paths relative to ``out``."""
    rec = TriageRecord.from_json(rec.to_json())
    for call in (rec.compile, rec.run, rec.bisect):
        report = getattr(call, "report", None) if call else None
        if report and not os.path.isabs(report):
            call.report = os.path.relpath((src / report).resolve(), out.resolve())
    return rec


def merge(inputs: list[Path], out: Path, *, command: str = "") -> TriageMatrix:
    """One matrix from the shards' output folders (written into ``out``); returns it."""
    from cutedebug.commands import triage

    if not inputs:
        raise ShardError("merge: no shard folder given")
    owner: dict[str, Path] = {}
    records: list[TriageRecord] = []
    shards, envs = [], []
    for d in inputs:
        m, recs = _shard_records(Path(d))
        envs.append(m.environment)
        for r in recs:
            sid = r.id
            if sid in owner:
                raise ShardError(
                    f"merge: scenario {sid} is in {owner[sid]} and in {d}: the "
                    "shards overlap (same --shard twice, or different scenario "
                    "sets?)"
                )
            owner[sid] = Path(d)
            records.append(_rebase_report(r, Path(d), out))
        f = m.facts  # None: the shard's triage did not finish
        shards.append(
            {
                "dir": str(d),
                "scenarios": len(recs),
                "host": m.environment.host,
                "gpu": m.environment.gpu,
                "command": m.command,
                "total_s": f.total_s if f else None,
                "harness_errors": f.harness_errors if f else 0,
                "processes_left": f.processes_left if f else [],
                "gpu_health": f.gpu_health if f else None,
                "interrupted": f.interrupted if f else False,
                "dir_": m.dir,
            }
        )
    healths = [s["gpu_health"] for s in shards if s["gpu_health"] is not None]
    facts = Facts(
        harness_errors=sum(r.harness_errors or 0 for r in records),
        processes_left=[p for s in shards for p in s["processes_left"]],
        gpu_health=None
        if not healths
        else {
            "healthy": all(h.get("healthy") for h in healths),
            "per_shard": {s["dir"]: s["gpu_health"] for s in shards},
        },
        overhead_s=triage.overhead_summary(records),
        total_s=max((s["total_s"] or 0.0) for s in shards),
        interrupted=any(s["interrupted"] for s in shards),
        shards=[{k: v for k, v in s.items() if k != "dir_"} for s in shards],
    )
    results = out / "results"
    results.mkdir(parents=True, exist_ok=True)
    for old in results.glob("*.json"):
        old.unlink()
    for r in records:
        triage.atomic_write(
            results / triage.record_name(r.id), json.dumps(r.to_json(), indent=1, default=str)
        )
    dirs = sorted({str(s["dir_"]) for s in shards if s["dir_"]})
    m = triage.build_matrix(
        records, dir_=", ".join(dirs), command=command, env=envs[0], facts=facts
    )
    triage.write_matrix(out, m)
    return m


def add_parser(sub) -> None:
    p = sub.add_parser("merge", help="merge shard outputs (triage --shard) into one matrix")
    p.add_argument("out", help="output folder of the merged matrix")
    p.add_argument("shards", nargs="+", help="the shards' triage output folders")
    p.set_defaults(func=cmd_merge)


def cmd_merge(args: argparse.Namespace) -> int:
    from cutedebug.commands import triage
    from cutedebug.reporting.matrix import RATE_KEYS, facts_lines, rate_text
    from cutedebug.reporting.report import command_line

    try:
        m = merge([Path(s) for s in args.shards], Path(args.out), command=command_line())
    except ShardError as e:
        print(f"cutedebug: error: {e}", file=sys.stderr)
        return 2
    recs, rt, facts = m.scenarios, m.rates, m.facts
    print(f"merged {len(facts.shards)} shard(s), {len(recs)} scenario(s)")
    for key in RATE_KEYS:
        print(f"{key.replace('_', ' '):>15}: {rate_text(rt.rate(key))}")
    for line in facts_lines(facts):
        print(line)
    out = Path(args.out)
    print(f"matrix: {out / 'matrix.md'} | {out / 'matrix.html'} | {out / 'matrix.json'}")
    return triage.exit_status(recs, facts.processes_left, facts.gpu_health)
