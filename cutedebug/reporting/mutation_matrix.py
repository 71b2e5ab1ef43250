"""The mutation matrix of `cutedebug mutate` as Markdown, HTML (the triage matrix's style) and
JSON: target (trace x pipeline, and each trace's kernel-wide row) x fault, the score, each
survivor with its site and what the fault changes there, the mutants that did not apply and
why, the run facts."""

from __future__ import annotations

import html
import json
import os
import shlex
from pathlib import Path

from cutedebug.analyses.mutate import CAUGHT, HARNESS, NOT_APPLIED, SURVIVED
from cutedebug.analyses.mutate_record import MutantRecord, MutationMatrix, RunFacts, Score
from cutedebug.reporting.escape import html_link, md_code, md_link, md_text


def _cell(r: MutantRecord) -> str:
    return r.verdict if r.status == CAUGHT else r.status


def _pivot(
    m: MutationMatrix,
) -> tuple[list[str], list[str], dict[tuple[str, str], MutantRecord]]:
    targets = [t for t in m.targets if any(r.target == t for r in m.mutants)]
    variants: list[str] = []
    for r in m.mutants:
        if r.variant not in variants:
            variants.append(r.variant)
    return targets, variants, {(r.target, r.variant): r for r in m.mutants}


def _score_text(sc: Score) -> str:
    c = sc.counts
    pct = f"{100 * sc.score:.0f}%" if sc.score is not None else "n/a"
    return (
        f"mutation score {pct} ({c[CAUGHT]} caught of {sc.scored} applied: "
        + ", ".join(f"{v} {n}" for v, n in sc.caught_by.items())
        + f"; {c[SURVIVED]} "
        f"survived); {c[NOT_APPLIED]} not applied, {c[HARNESS]} harness error(s)"
    )


def survivors(m: MutationMatrix) -> list[str]:
    out = []
    for r in m.mutants:
        if r.status != SURVIVED:
            continue
        sites = "; ".join(
            f"{os.path.basename(s.file or '?')}:{s.line} {s.op}: {s.detail}" for s in r.sites[:4]
        )
        out.append(
            f"`{r.id}` ({r.fault} {json.dumps(r.args)}) changes {sites} — "
            f"{r.changes}; the command still passed"
        )
    return out


def render_markdown(m: MutationMatrix) -> str:
    targets, variants, cells = _pivot(m)
    lines = [
        f"# cutedebug mutate: `{shlex.join(m.argv)}`",
        "",
        f"**{_score_text(m.score)}**",
        "",
        f"Clean run: {m.clean.verdict} in {m.clean.elapsed_s} s, "
        f"{m.clean.kernels_traced} trace(s). Command: `{m.command}`. {m.date}.",
        "",
        "## Matrix (target x fault)",
        "",
        "| target | " + " | ".join(variants) + " |",
        "|---|" + "---|" * len(variants),
    ]
    for t in targets:
        lines.append(
            f"| {m.targets[t]} | "
            + " | ".join(_cell(cells[(t, v)]) if (t, v) in cells else "" for v in variants)
            + " |"
        )
    surv = survivors(m)
    lines += ["", "## Survivors", ""] + ([f"- {s}" for s in surv] or ["none"])
    unapplied = [r for r in m.mutants if r.status in (NOT_APPLIED, HARNESS)]
    if unapplied:
        lines += ["", "## Not applied / harness errors", ""]
        lines += [f"- {md_code(r.id)} {r.status}: {md_text(r.reason[:300])}" for r in unapplied]
    lines += [
        "",
        "## Mutants",
        "",
        "| mutant | status | verdict | fault applied at | where / why | secs | report |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in m.mutants:
        sites = ", ".join(f"{os.path.basename(s.file or '?')}:{s.line}" for s in r.sites[:3])
        lines.append(
            f"| {md_code(r.id)} | {r.status} | {r.verdict} | "
            f"{r.fault_count} site(s) {md_text(sites)} | "
            f"{md_text((r.where or r.reason)[:160])}"
            f" | {r.elapsed_s} | {md_link(r.report, 'report')} |"
        )
    lines += ["", f"{m.planned} mutant(s) planned, {len(m.mutants)} done."]
    if m.facts:
        lines += ["", "## Run facts", ""] + [f"- {x}" for x in facts_lines(m.facts)]
    return "\n".join(lines) + "\n"


def render_html(m: MutationMatrix) -> str:
    from cutedebug.reporting.matrix import CSS

    e = html.escape
    targets, variants, cells = _pivot(m)
    klass = {CAUGHT: "ok", SURVIVED: "miss", NOT_APPLIED: "notrun", HARNESS: "harness"}
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>cutedebug mutate</title><style>{CSS}</style></head><body>",
        f"<h1>cutedebug mutate: <code>{e(shlex.join(m.argv))}</code></h1>",
        f"<p><b>{e(_score_text(m.score))}</b></p>",
        f"<p>Clean run {e(str(m.clean.verdict))} in {m.clean.elapsed_s} s · "
        f"{e(m.date)} · command <code>{e(m.command)}</code></p>",
        "<p>"
        + " ".join(f"<span class='{c}'>&nbsp;{s}&nbsp;</span>" for s, c in klass.items())
        + "</p>",
        "<h2>Matrix (target × fault)</h2><table><tr><th>target</th>"
        + "".join(f"<th>{e(v)}</th>" for v in variants)
        + "</tr>",
    ]
    for t in targets:
        out.append(f"<tr><th>{e(m.targets[t])}</th>")
        for v in variants:
            r = cells.get((t, v))
            if r is None:
                out.append("<td></td>")
                continue
            tip = e((r.where or r.reason)[:400])
            out.append(
                f"<td class='{klass[r.status]}' title='{tip}'>{html_link(r.report, _cell(r))}</td>"
            )
        out.append("</tr>")
    out.append("</table><h2>Survivors</h2><ul>")
    out += [f"<li>{e(s)}</li>" for s in survivors(m)] or ["<li>none</li>"]
    out.append("</ul>")
    if m.facts:
        out += ["<h2>Run facts</h2><ul>"] + [f"<li>{e(x)}</li>" for x in facts_lines(m.facts)]
        out.append("</ul>")
    out.append("</body></html>\n")
    return "\n".join(out)


def facts_lines(f: RunFacts) -> list[str]:
    if not f:
        return []
    health = f.gpu_health
    alone = f.alone_s if isinstance(f.alone_s, dict) else {}
    waits = f.alone_wait_s if isinstance(f.alone_wait_s, dict) else {}
    own = f.mutant_own_s if isinstance(f.mutant_own_s, dict) else {}
    base = "clean + 2 s" if not alone else "the clean run of what it ran (its test alone) + 2 s"
    return [
        f"clean run {f.clean_s} s; slowest mutant {f.max_mutant_s} s; "
        f"{len(f.over_clean_plus_2s)} mutant(s) over {base}"
        + (f" ({', '.join(f.over_clean_plus_2s[:5])})" if f.over_clean_plus_2s else "")
        + " (a mutant's own time: its wall less its wait for the GPU token)",
        *(
            [
                f"mutant own time: median {own['median']} s, largest {own['max']} s; "
                f"mutate's wall per mutant {own['wall_per_mutant']} s"
            ]
            if own
            else []
        ),
        *(
            f"alone: {t}: "
            + (
                f"{s} s" + (f" (+ {waits[t]} s waiting for the GPU)" if waits.get(t) else "")
                if s is not None
                else "did not pass alone (whole command)"
            )
            for t, s in alone.items()
        ),
        f"processes of ours left: {len(f.processes_left)}"
        + (f" {f.processes_left}" if f.processes_left else ""),
        "GPU health after the kills: "
        + (
            "not checked (no mutant killed on a GPU)"
            if health is None
            else "healthy"
            if health.get("healthy")
            else f"UNHEALTHY {health}"
        ),
        f"mutate wall time {f.wall_s} s",
    ]


def write_matrix(out: Path, m: MutationMatrix) -> None:
    from cutedebug.reporting.files import atomic_write

    atomic_write(out / "matrix.json", json.dumps(m.to_json(), indent=1, default=str))
    atomic_write(out / "matrix.md", render_markdown(m))
    atomic_write(out / "matrix.html", render_html(m))
