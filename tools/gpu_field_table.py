"""One table of a triage over the field scenarios (the H200 evidence for scenarios/field).

    python3 -m cutedebug triage scenarios/field --out /tmp/field/tri
    python3 tools/gpu_field_table.py /tmp/field/tri [--json records.json]

Per scenario: the verdict (with its frequencies when repeated), the expected verdict (and
the timing-dependent alternatives), whether it matched, the localization (expected fields
-> the stuck site that matched, or the first stuck sites the run reported, with file:line),
the sites the fault applied at while tracing, the static errors of the compile, and the
seconds to the verdict. Then the issue's targets: faults applied at 0 sites, HANGs
localized, static errors and verdicts of the clean kernels. Reads only the triage's files
(OUT/results/*.json and each run's report.json); imports neither torch nor cutlass.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cutedebug.engine.run_report import RunReport  # noqa: E402
from cutedebug.engine.triage_record import TriageRecord  # noqa: E402
from cutedebug.records import present  # noqa: E402


def load_records(out: Path) -> list[TriageRecord]:
    """The triage's records (a file that is not one is an error naming its field)."""
    recs = [
        TriageRecord.from_json(json.loads(p.read_text()), p.name)
        for p in sorted((out / "results").glob("*.json"))
    ]
    return sorted(recs, key=lambda r: r.id)


def run_report(out: Path, rec: TriageRecord) -> RunReport | None:
    """The report.json of the record's final call, if it is there and readable."""
    md = rec.final.report if rec.final else None
    if not md:
        return None
    path = (out / md).with_name("report.json")
    try:
        return RunReport.from_json(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def _site(s: dict[str, Any]) -> str:
    loc = s.get("location") or ""
    where = f"{loc.rsplit('/', 1)[-1]}" if loc else "?"
    stage = f"[{s['stage']}]" if s.get("stage") is not None else ""
    return f"{s.get('role')}/{s.get('op')}/{s.get('barrier')}{stage}@{where}"


def localization_cell(rec: TriageRecord, report: RunReport | None) -> str:
    exp = rec.expected.localization
    loc = rec.run.localization if rec.run else {}
    if not exp:
        return "-"
    want = "/".join(str(exp.get(k, "*")) for k in ("role", "op", "barrier"))
    if loc.get("ok") is True:
        return f"{want}: OK {_site(loc.get('matched') or {})}"
    if loc.get("ok") is None:
        return f"{want}: not graded ({loc.get('why', 'no run')})"
    sites = (report.evidence.get("stuck_sites") if report else None) or []
    seen = list(dict.fromkeys(_site(s) for s in sites))[:3]
    return f"{want}: MISSED, got {'; '.join(seen) or 'no stuck site'}"


def row(out: Path, rec: TriageRecord) -> dict[str, Any]:
    report = run_report(out, rec)
    exp = rec.expected
    freq = rec.frequencies or {}
    why = (
        rec.not_run
        or rec.invalid
        or (f"{rec.status}: the triage ended before its run" if not rec.done else "no verdict")
    )
    verdict = rec.verdict.value if rec.verdict else f"not run ({why})"
    if len(freq) > 1:
        verdict += " (" + ", ".join(f"{v} {n}" for v, n in freq.items()) + ")"
    comp, call = rec.compile, rec.final
    sites = call.fault_count if call else None
    static = comp.static_findings if comp else None
    errors = [f for f in static or [] if f.get("severity") == "error"]
    return {
        "scenario": rec.id.removeprefix("field/"),
        "verdict": verdict,
        "expected": exp.verdict + ("/" + "/".join(exp.also) if exp.also else ""),
        "ok": {True: "yes", False: "NO"}.get(rec.verdict_ok, "-"),
        "localization": localization_cell(rec, report),
        "sites": "-" if rec.fault is None else str(sites),
        "static_errors": len(errors),
        "seconds": present(rec.time_to_verdict_s),
        "reason": call.reason[:300] if call else "",
        "static": [f"{f.get('check')}: {f.get('message', '')[:160]}" for f in errors],
    }


COLS = [
    "scenario",
    "verdict",
    "expected",
    "ok",
    "localization",
    "sites",
    "static_errors",
    "seconds",
]


def targets(recs: list[TriageRecord], rows: list[dict[str, Any]]) -> list[str]:
    faulted = [(r, w) for r, w in zip(recs, rows) if r.fault]
    zero = [w["scenario"] for r, w in faulted if w["sites"] == "0"]
    hangs = [(r, w) for r, w in zip(recs, rows) if r.verdict == "HANG" and r.expected.localization]
    graded = [(r, w) for r, w in hangs if present(r.localization_ok) is not None]
    located = [w for r, w in graded if r.localization_ok]
    clean = [(r, w) for r, w in zip(recs, rows) if not r.fault]
    lines = [
        f"- faults applied at 0 sites: {len(zero)} of {len(faulted)}"
        + (f" ({', '.join(zero)})" if zero else ""),
        f"- HANGs localized (role/op/barrier) by the run: {len(located)} of {len(graded)} graded"
        f" ({len(hangs) - len(graded)} graded only by bisection)",
        "- clean kernels: "
        + "; ".join(
            f"{w['scenario']} {w['verdict']}, {w['static_errors']} static error(s)"
            for _, w in clean
        ),
        f"- verdicts as expected: {sum(r.verdict_ok is True for r in recs)} of "
        f"{sum(present(r.verdict_ok) is not None for r in recs)}; harness errors: "
        f"{sum(r.harness_errors or 0 for r in recs)}",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("triage_out", help="the --out folder of `cutedebug triage`")
    ap.add_argument("--json", help="also write the rows (with reasons) here")
    a = ap.parse_args(argv)
    out = Path(a.triage_out)
    recs = load_records(out)
    if not recs:
        print(f"{out}: no triage records", file=sys.stderr)
        return 2
    rows = [row(out, r) for r in recs]
    print("| " + " | ".join(COLS) + " |")
    print("|" + "---|" * len(COLS))
    for w in rows:
        print("| " + " | ".join("-" if w[c] is None else str(w[c]) for c in COLS) + " |")
    print()
    print("\n".join(targets(recs, rows)))
    print()
    for w in rows:
        if w["ok"] == "NO" or "MISSED" in w["localization"] or w["static"]:
            print(f"{w['scenario']}: {w['reason']}")
            for s in w["static"]:
                print(f"    static error {s}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
