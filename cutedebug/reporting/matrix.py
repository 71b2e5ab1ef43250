"""The triage matrix: a kernel × fault grid of the triage records, with rates and run facts,
as Markdown (matrix.md), one self-contained HTML page (matrix.html) and terminal lines.

The records and the matrix (reporting/triage_record.py: ``TriageRecord``, ``TriageMatrix``) are
built by ``cutedebug.commands.triage_records`` (``build_matrix``); this module only presents
them. Every scenario id, kernel, fault, reason and path is escaped
(``cutedebug.reporting.escape``); a record's report path becomes a link only when it is a
relative path (never ``javascript:`` or another scheme).

The HTML page stays readable when the grid is wide: the grid and the scenario table scroll
inside their own boxes with the header row and the fault column pinned (CSS ``position:
sticky``), cells do not wrap their verdict lines, and the page has no script.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cutedebug.engine import scenario as S
from cutedebug.engine.triage_record import (
    RATE_KEYS,
    CallRecord,
    Counts,
    Environment,
    Facts,
    Rate,
    TriageMatrix,
    TriageRecord,
)
from cutedebug.records import ABSENT
from cutedebug.reporting.escape import html_link, md_code, md_link, md_text, xml_attr, xml_text
from cutedebug.reporting.files import atomic_write

Record = TriageRecord


def actual_text(r: Record) -> str:
    if r.invalid:
        return "invalid scenario"
    if not r.done:
        return "pending"
    if not r.verdict:
        return (r.not_run or "not run").split(" — ")[0]
    freq = r.frequencies or {}
    if len(freq) > 1 or sum(freq.values()) > 1:
        n = sum(freq.values())
        parts = ", ".join(f"{v} {c}/{n}" for v, c in sorted(freq.items(), key=lambda x: -x[1]))
        return f"{r.verdict} ({parts})"
    return r.verdict.value


def state(r: Record) -> str:
    """ok / miss / notrun / harness / timing / invalid / pending: one color per state."""
    if r.invalid:
        return "invalid"
    if not r.done:
        return "pending"
    if not r.verdict:
        return "notrun"
    if r.harness_errors or r.verdict.is_ours:
        return "harness"
    if r.timing_dependent:
        return "timing"
    return "ok" if r.verdict_ok and r.localization_ok is not False else "miss"


NOT_RUN_NOTE = (
    'Scenarios marked "not run" could only be compiled here; they are left '
    "out of every rate, not counted as misses."
)
LEGEND = "✓ as expected · ✗ not as expected · ~ timing-dependent · ! harness error · – not run"
MARK = {
    "ok": "✓",
    "miss": "✗",
    "notrun": "–",
    "harness": "!",
    "timing": "~",
    "invalid": "✗",
    "pending": "…",
}


def loc_text(r: Record) -> str:
    ok = r.localization_ok
    text = "n.a." if ok is None or ok is ABSENT else ("right" if ok else "wrong")
    return text + (" (bisect)" if r.bisect else "")


def _static_text(r: Record) -> str:
    c = r.caught_statically
    return "n.a." if c is None or c is ABSENT else ("yes" if c else "no")


def _fault_text(r: Record) -> str:
    if not r.fault:
        return "none"
    args = ",".join(f"{k}={v}" for k, v in (r.fault_args or {}).items())
    return r.fault + (f"({args})" if args else "")


def _secs(x: float | None) -> str:
    return "" if x is None or x is ABSENT else f"{x:.1f}"


def expect_of(r: Record) -> S.Expect:
    """A record's expected verdicts as the scenario's Expect."""
    return r.expected.expect()


def expected_text(r: Record) -> str:
    """The expected verdict, with the ones a timing-dependent scenario also accepts."""
    return " or ".join(expect_of(r).verdicts)


def short_id(sid: str) -> str:
    return sid.rsplit("/", 1)[-1]


def detail_rows(records: list[Record]) -> list[list[str]]:
    rows = []
    for r in sorted(records, key=lambda r: (r.kernel, r.fault or "", r.id)):
        rows.append(
            [
                r.kernel,
                _fault_text(r),
                r.id,
                expected_text(r),
                actual_text(r),
                MARK[state(r)],
                loc_text(r),
                _static_text(r),
                _secs(r.time_to_verdict_s),
                _secs(r.overhead_s),
                _perturb_text(r.final.perturbation if r.final else None),
            ]
        )
    return rows


def _perturb_text(p: dict[str, Any] | None) -> str:
    """The "exposed by perturbation" cell: the seed and what it gave, or how many did not."""
    if not p:  # None, or ABSENT in a record older than --perturb
        return "-"
    if p.get("exposed_by") is None:
        return f"none of {p.get('runs')} seeds"
    first = p.get("history_from")
    after = f" (after {first}-{p['exposed_by'] - 1})" if first is not None else ""
    return f"seed {p['exposed_by']}{after}: {p.get('outcome')}"


DETAIL_HEAD = [
    "kernel",
    "fault",
    "scenario",
    "expected",
    "actual",
    "",
    "localization",
    "caught statically",
    "time to verdict (s)",
    "overhead (s)",
    "exposed by perturbation",
]


def pivot(records: list[Record]) -> tuple[list[str], list[str], dict]:
    """kernel × fault: rows are faults (clean first), columns kernels, cells the records.
    Invalid scenarios have no kernel or fault: they are listed, not placed."""
    records = [r for r in records if not r.invalid]
    kernels = sorted({r.kernel for r in records})
    faults = sorted({r.fault or "" for r in records}, key=lambda f: (f != "", f))
    cells: dict[tuple[str, str], list[Record]] = {}
    for r in sorted(records, key=lambda r: r.id):
        cells.setdefault((r.fault or "", r.kernel), []).append(r)
    return kernels, faults, cells


def rate_text(x: Rate) -> str:
    return x.text()


def _env_line(env: Environment) -> str:
    gpu = f" ({env.arch}, driver {env.driver})" if env.gpu else f" ({env.gpu_reason})"
    return (
        f"{env.date} · GPU {env.gpu or 'none'}{gpu} · cutlass-dsl "
        f"{env.cutlass} · torch {env.torch} · python {env.python}"
    )


def _summary(c: Counts) -> str:
    return (
        f"{c.scenarios} scenarios: {c.with_verdict} with a verdict, {c.not_run} "
        f"not run (left out of the rates), {c.invalid} invalid, {c.pending} pending; "
        f"{c.harness_errors} HARNESS_ERROR; {c.timing_dependent} timing-dependent"
        + (
            f"; {c.exposed_by_perturbation} exposed by perturbation (counted in detection)."
            if c.exposed_by_perturbation
            else "."
        )
    )


def not_as_expected(recs: list[Record]) -> list[Record]:
    return [
        r
        for r in recs
        if state(r) in ("miss", "harness", "invalid") or (state(r) == "timing" and not r.verdict_ok)
    ]


def _why(r: Record) -> str:
    """Why the record is what it is: the invalid scenario's error, else the final call's reason."""
    return r.invalid or (r.final.reason if r.final else "")


def render_markdown(m: TriageMatrix) -> str:
    env, rt, recs = m.environment, m.rates, m.scenarios
    c = rt.counts
    lines = [
        f"# cutedebug triage: {md_text(m.dir)}",
        "",
        md_text(_env_line(env)),
        "",
        f"Command: {md_code(m.command)}",
        "",
        "## Rates",
        "",
        "| rate | value | over |",
        "|---|---|---|",
    ]
    for key in RATE_KEYS:
        lines.append(
            f"| {key.replace('_', ' ')} | {rt.rate(key).text()} | {md_text(rt.rate(key).what)} |"
        )
    lines += ["", _summary(c), ""]
    if c.not_run:
        lines += (
            [md_text(NOT_RUN_NOTE), ""]
            + [f"- {n} × {md_text(why)}" for why, n in c.not_run_reasons.items()]
            + [""]
        )
    kernels, faults, cells = pivot(recs)
    lines += [
        "## Matrix (kernel × fault)",
        "",
        md_text(LEGEND),
        "",
        "| fault | " + " | ".join(md_text(k) for k in kernels) + " |",
        "|---" * (len(kernels) + 1) + "|",
    ]
    for f in faults:
        row = [md_text(f or "none (clean)")]
        for k in kernels:
            row.append(
                "<br>".join(
                    f"{MARK[state(r)]} {md_text(short_id(r.id))}: {md_text(actual_text(r))}"
                    for r in cells.get((f, k), [])
                )
            )
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "## Scenarios",
        "",
        "| " + " | ".join(DETAIL_HEAD) + " |",
        "|---" * len(DETAIL_HEAD) + "|",
    ]
    mark = DETAIL_HEAD.index("")
    for row in detail_rows(recs):
        lines.append(
            "| " + " | ".join(x if i == mark else md_text(x) for i, x in enumerate(row)) + " |"
        )
    bad = not_as_expected(recs)
    if bad:
        lines += ["", "## Not as expected", ""]
        for r in bad:
            report = _report(r.final)
            lines.append(
                f"- {md_code(r.id)}: expected {md_text(r.expected.verdict)}, "
                f"got {md_text(actual_text(r))}, localization {loc_text(r)} — "
                f"{md_text(_why(r)[:300])}" + (f" ({md_link(report, 'report')})" if report else "")
            )
    if m.facts:
        lines += ["", "## Run facts", ""] + [f"- {md_text(ln)}" for ln in facts_lines(m.facts)]
    return "\n".join(lines) + "\n"


CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:separate;border-spacing:0;margin:0}
td,th{border:1px solid #bbb;border-width:0 1px 1px 0;padding:3px 7px;vertical-align:top;
text-align:left}
tr:first-child>*{border-top-width:1px}tr>:first-child{border-left-width:1px}
th{background:#eee}
.scroll{overflow:auto;max-width:100%;max-height:80vh;margin:1em 0;border:1px solid #ddd}
.scroll thead th{position:sticky;top:0;z-index:2}
.scroll tbody th{position:sticky;left:0;z-index:1}
.scroll thead th:first-child{left:0;z-index:3}
.grid td{white-space:nowrap;min-width:9em}.grid td div{margin:1px 0}
.grid thead th{min-width:9em;overflow-wrap:anywhere}
.ok{background:#c8f0c8}.miss{background:#f6b8b8}.notrun{background:#e4e4e4;color:#555}
.harness{background:#f9d29b}.timing{background:#fbf1a0}.invalid{background:#e0b8f0}
.pending{background:#fff}code{background:#f4f4f4;padding:0 3px}small{color:#555}
.legend span{display:inline-block;margin-right:.4em;padding:0 .4em;border:1px solid #bbb}
"""
ORDER = ("invalid", "harness", "miss", "timing", "ok", "notrun", "pending")


def _report(call: CallRecord | None) -> str | None:
    return call.report if call else None


def render_html(m: TriageMatrix) -> str:
    """matrix.html: one page, no script, no external resource."""
    e = xml_text
    env, rt, recs = m.environment, m.rates, m.scenarios
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>cutedebug triage: {e(m.dir)}</title><style>{CSS}</style></head><body>",
        f"<h1>cutedebug triage: {e(m.dir)}</h1>",
        f"<p>{e(_env_line(env))}</p>",
        f"<p>Command: <code>{e(m.command)}</code></p>",
        "<h2>Rates</h2><table><tr><th>rate</th><th>value</th><th>over</th></tr>",
    ]
    for key in RATE_KEYS:
        out.append(
            f"<tr><td>{key.replace('_', ' ')}</td><td>{e(rt.rate(key).text())}</td>"
            f"<td>{e(rt.rate(key).what)}</td></tr>"
        )
    c = rt.counts
    out.append(f"</table><p>{e(_summary(c))}</p>")
    if c.not_run:
        out.append(
            f"<p class='notrun'>{e(NOT_RUN_NOTE)}<br>"
            + "<br>".join(f"{n} × {e(why)}" for why, n in c.not_run_reasons.items())
            + "</p>"
        )
    legend = "".join(
        f"<span class='{s}'>{MARK[s]} {s}</span>"
        for s in ("ok", "miss", "timing", "harness", "notrun", "invalid")
    )
    kernels, faults, cells = pivot(recs)
    out += [
        f"<h2>Matrix (kernel × fault): {len(faults)} × {len(kernels)}</h2>",
        f"<p class='legend'>{legend}</p>",
        "<div class='scroll'><table class='grid'><thead><tr><th>fault \\ kernel</th>"
        + "".join(f"<th id='kernel-{i}'>{e(k)}</th>" for i, k in enumerate(kernels))
        + "</tr></thead><tbody>",
    ]
    for f in faults:
        out.append(f"<tr><th>{e(f or 'none (clean)')}</th>")
        for k in kernels:
            rs = cells.get((f, k), [])
            cls = min((state(r) for r in rs), key=ORDER.index) if rs else ""
            inner = "".join(
                f"<div title='{xml_attr((r.final.reason if r.final else '') or r.invalid or '')}'>"
                f"{MARK[state(r)]} {e(short_id(r.id))}: <b>{e(actual_text(r))}</b> "
                f"<small>exp {e(expected_text(r))}</small></div>"
                for r in rs
            )
            out.append(f"<td class='{cls}'>{inner}</td>")
        out.append("</tr>")
    out += [
        "</tbody></table></div><h2>Scenarios</h2><div class='scroll'><table>"
        "<thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in DETAIL_HEAD) + "</tr></thead><tbody>"
    ]
    by_id = {r.id: r for r in recs}
    for row in detail_rows(recs):
        r = by_id[row[2]]
        cells_html = [e(x) for x in row]
        cells_html[0] = f"<th>{cells_html[0]}</th>"
        if report := _report(r.final):
            cells_html[2] = html_link(report, row[2])
        why = _why(r)
        cells_html[4] = f"<span title='{xml_attr(why[:500])}'>{cells_html[4]}</span>"
        out.append(
            f"<tr class='{state(r)}'>"
            + "".join(x if x.startswith("<th>") else f"<td>{x}</td>" for x in cells_html)
            + "</tr>"
        )
    out.append("</tbody></table></div>")
    if m.facts:
        out += ["<h2>Run facts</h2><ul>"] + [f"<li>{e(x)}</li>" for x in facts_lines(m.facts)]
        out.append("</ul>")
    out.append("</body></html>\n")
    return "\n".join(out)


def progress_line(
    rec: Record, finished: int, total: int, pre: str = "", t: float | None = None
) -> str:
    """One terminal line for a finished scenario."""
    loc = f" loc {loc_text(rec)}" if rec.expected.localization and rec.verdict else ""
    return (
        f"[{finished:>3}/{total}] {MARK[state(rec)]} {rec.id:<44} {pre}"
        f"{actual_text(rec)} (expected {expected_text(rec)}){loc}" + (f" {t:.1f}s" if t else "")
    )


def facts_lines(f: Facts) -> list[str]:
    ov = f.overhead_s or {}
    health = f.gpu_health
    return [
        f"HARNESS_ERROR: {f.harness_errors}",
        f"processes of ours left: {len(f.processes_left)}"
        + (f" (pids {f.processes_left}, killed)" if f.processes_left else ""),
        "GPU health: "
        + (
            "n.a. (no GPU)"
            if health is None
            else ("healthy" if health.get("healthy") else f"UNHEALTHY {health}")
        ),
        "overhead beyond compile + run + check per scenario: "
        + (
            f"mean {ov['mean']:.2f} s, max {ov['max']:.2f} s ({ov['max_id']}) over {ov['n']}"
            if ov.get("n")
            else "n.a."
        ),
        f"total time: {f.total_s:.1f} s" + (" (interrupted)" if f.interrupted else ""),
    ]


def write_matrix(out: Path, m: TriageMatrix) -> None:
    """OUT/matrix.json, matrix.md and matrix.html, each replaced atomically."""
    atomic_write(out / "matrix.json", json.dumps(m.to_json(), indent=1, default=str))
    atomic_write(out / "matrix.md", render_markdown(m))
    atomic_write(out / "matrix.html", render_html(m))
