"""compute-sanitizer reports: one tool's triage report (Markdown) and `cutedebug sanitize`'s
summary (report.md), plus the short table cells the GPU tables reuse. The results they read
are ``ToolResult`` records (``cutedebug.analyses.sanitizer.result``: ``make_result``, then
``cutedebug.commands.sanitize`` adds the worker run's keys); kernel names, source lines, messages and commands are
escaped."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from cutedebug.analyses.sanitizer.referee import (
    CONFIRMED,
    UNCONFIRMED,
    RefereeResult,
    schedule_words,
)
from cutedebug.analyses.sanitizer.result import SanitizeSummary, ToolResult
from cutedebug.analyses.sanitizer.triage import (
    CLEAN,
    NOISE_ANALYSIS_DUP,
    NOISE_PIPELINE_ORDERED,
    NOISE_PROC_ADDRESS,
    NOISE_TMA,
    GroupRecord,
    SourceLine,
)
from cutedebug.engine.verdict import values
from cutedebug.records import present
from cutedebug.reporting.escape import md_block, md_code, md_text

FINDING_VERDICTS = values(lambda v: v.is_sanitizer_finding)


def where_lines(lines: Sequence[SourceLine]) -> str:
    parts = [f"{os.path.basename(ln.file)}:{ln.line}" for ln in lines if ln.file]
    return " / ".join(parts) or "(no line info)"


def triples(ts: Sequence[Sequence[int]]) -> str:
    return ", ".join("(" + ",".join(str(v) for v in t) + ")" for t in ts)


def _first_source(g: GroupRecord) -> str | None:
    return next((ln.source for ln in g.lines if ln.source), None)


def render_markdown(result: ToolResult) -> str:
    """Triage report: TL;DR, grouped findings with source, noise and why, reproduce."""
    tool, verdict, groups = result.tool, result.verdict, result.groups
    out = [f"# compute-sanitizer {md_text(tool)}: {md_text(verdict)}", ""]
    from_findings = verdict == present(result.sanitizer_class, verdict) and verdict != CLEAN
    if groups and from_findings:
        g = groups[0]
        src = _first_source(g)
        tldr = (
            f"**TL;DR** {md_text(tool)} → **{md_text(verdict)}**: {md_text(g.kind)} at "
            f"{md_text(where_lines(g.lines))} ({g.count}× in kernel "
            f"{md_code(g.kernel or '?')})"
        )
        out.append(tldr + (f": {md_code(src)}" if src else "") + ".")
        if caveat := present(result.caveat):
            out += ["", f"**Caveat:** {md_text(caveat)}.", ""]
        if ref := present(result.referee):
            out += referee_markdown(ref)
        more = len(groups) - 1
        if more:
            out.append(f"{more} more distinct finding(s) below.")
    else:
        why = present(result.reason) or "no findings after noise filtering"
        out.append(f"**TL;DR** {md_text(tool)} → **{md_text(verdict)}**: {md_text(why)}.")
    if result.other_kernels:
        n = sum(k.count for k in result.other_kernels)
        out.append(
            f"Other kernels of the process: {n} finding(s) in "
            f"{len(result.other_kernels)} kernel(s), counted apart below."
        )
    if result.kernel_verdict:
        out.append("")
        out.append(
            f"The worker under the sanitizer said: {md_text(result.kernel_verdict)} "
            f"({md_text(present(result.kernel_reason) or '')})."
        )
    out.append("")
    if groups:
        out += ["## Findings", ""]
        for i, g in enumerate(groups, 1):
            out.append(
                f"{i}. **{md_text(g.kind)}** ({md_text(g.severity)}) ×{g.count} "
                f"({g.records} record(s)) in {md_code(g.kernel or '?')}"
            )
            for ln, acc in zip(g.lines, list(g.accesses or []) + [None] * 9):
                label = f"{acc} " if acc else ""
                loc = f"{ln.file}:{ln.line}" if ln.file else "(no line)"
                out.append(f"   - {md_text(label)}at {md_code(loc)}")
                if ln.source:
                    out.append(f"     {md_code(ln.source)}")
            extra = []
            if g.address_space:
                extra.append(f"space {g.address_space}")
            if g.size:
                extra.append(f"size {g.size} B")
            if g.threads:
                extra.append(f"threads {triples(g.threads)}")
            if g.blocks:
                extra.append(f"blocks {triples(g.blocks)}")
            if extra:
                out.append("   - " + "; ".join(extra))
            first_line = (g.text or "").splitlines()[:1]
            if first_line:
                out.append(f"   - message: {md_text(first_line[0])}")
        out.append("")
    if result.other_kernels:
        out += ["## Other kernels of the process (not the kernel under test; not the verdict)", ""]
        for k in result.other_kernels:
            name = k.kernel if len(k.kernel) <= 100 else k.kernel[:97] + "..."
            top = k.groups[0] if k.groups else None
            where = md_text(f": {top.kind} at {where_lines(top.lines)}") if top else ""
            out.append(
                f"- {md_code(name)}: {md_text(k.class_)}, {k.count} ({k.records} record(s)){where}"
            )
        out.append("")
    out += ["## Noise filtered", ""]
    if result.filtered:
        for item in result.filtered:
            out.append(f"- {item.count} × {md_text(item.reason)}")
    else:
        out.append("- none")
    out.append("")
    shrunk = result.shrink
    if shrunk:
        kind, lines = shrunk.signature
        sig_lines = [SourceLine(file=f, line=ln, source=None) for f, ln in lines]
        out += [
            "## Shrunk",
            "",
            f"- original {shrunk.original} ({secs(shrunk.original_seconds)})",
            (
                f"- shrunk {shrunk.shrunk} ({secs(shrunk.shrunk_seconds)}), same finding "
                f"{kind} at {where_lines(sig_lines)}"
            ),
            f"- {len(shrunk.runs)} candidate run(s), none repeated",
            "",
        ]
    out += ["## Reproduce", ""] + md_block(result.reproduce) + [""]
    timing = [f"sanitizer run {secs(result.sanitizer_seconds)}"]
    if result.plain_seconds:
        timing.append(f"plain run {secs(result.plain_seconds)}")
    if result.slowdown:
        timing.append(f"slowdown {result.slowdown:.1f}×")
    if result.exit_code is not None:
        timing.append(f"exit code {result.exit_code}")
    out.append("; ".join(timing) + ".")
    return "\n".join(out) + "\n"


def verdict_label(result: ToolResult) -> str:
    """The verdict with the referee's outcome: ``RACE (UNCONFIRMED by 32 perturbed runs)``."""
    ref = present(result.referee)
    if ref is None:
        return result.verdict
    if ref.outcome == CONFIRMED:
        return f"{result.verdict} (CONFIRMED by a perturbed run)"
    if ref.outcome == UNCONFIRMED:
        return f"{result.verdict} (UNCONFIRMED: {ref.runs} perturbed runs matched)"
    return f"{result.verdict} (not refereed)"


def referee_line(ref: RefereeResult) -> str:
    """The referee in one terminal line (its replay command when it confirmed the race)."""
    line = f"referee: {ref.outcome} — {ref.reason}"
    if ref.outcome == CONFIRMED and ref.described:
        line += "; " + "; ".join(ref.described[:3])
    if ref.outcome == UNCONFIRMED:
        line += f" (schedules: {schedule_words(ref.schedules, ref.targets_total)})"
    if ref.replay:
        line += f"; replay: {ref.replay}"
    return line


def referee_markdown(ref: RefereeResult) -> list[str]:
    """The referee's paragraph of a tool's report."""
    out = [f"**Referee: {md_text(ref.outcome)}** — {md_text(ref.reason)}."]
    out.append(
        f"Perturbed runs without the sanitizer, after one compile: {ref.runs} of {ref.asked} "
        f"made, over {ref.positions if ref.positions is not None else '?'} delay position(s); "
        f"schedules: {md_text(schedule_words(ref.schedules, ref.targets_total))}; the run's "
        f"verdict {md_text(ref.run_verdict)}."
    )
    if ref.outcome == CONFIRMED:
        pol = ref.policy or {}
        out.append(f"Seed {ref.exposed_by}, policy {md_code(json.dumps(pol, sort_keys=True))}:")
        out += [f"- {md_text(d)}" for d in ref.described]
    if ref.targets:
        more = ref.targets_total - len(ref.targets)
        out.append(
            "Positions delayed one at a time: "
            + md_text("; ".join(ref.targets) + (f"; +{more} more" if more > 0 else ""))
            + "."
        )
    if ref.replay:
        before = (
            f" (the seed alone; the referee ran seeds 0-{ref.exposed_by - 1} before it in the "
            "same process, which the same cutedebug sanitize command runs again)"
            if ref.exposed_by
            else ""
        )
        out.append(f"Replay{md_text(before)}: {md_code(ref.replay)}")
    out.append(f"Run directory: {md_code(ref.run_dir)}")
    para: list[str] = []
    for ln in out:  # each sentence its own paragraph, the delays one list
        if not (ln.startswith("- ") and para and para[-1].startswith(("- ", "Seed "))):
            para.append("")
        para.append(ln)
    return [*para, ""]


def secs(s: float | None) -> str:
    return f"{s:.1f} s" if isinstance(s, (int, float)) else "? s"


def top_line(result: ToolResult, *, md: bool = False) -> str:
    """The tool's verdict in one line: its first finding with the source line, or why none.
    ``md``: escaped for Markdown (the source line as code)."""
    text = md_text if md else str
    groups = result.groups
    if not groups or result.verdict not in FINDING_VERDICTS:
        return text(present(result.reason) or "")
    g = groups[0]
    src = _first_source(g)
    code = (md_code(src) if md else f"`{src}`") if src else ""
    return text(f"{g.kind} at {where_lines(g.lines)} ×{g.count}") + (f": {code}" if src else "")


NOISE_LABELS = {
    NOISE_PROC_ADDRESS: "api-probing",
    NOISE_TMA: "tma",
    NOISE_ANALYSIS_DUP: "analysis-dup",
}


def noise_label(reason: str) -> str:
    """A filtered record's reason, short: the label of the reason it begins with."""
    if reason.startswith(NOISE_PIPELINE_ORDERED):
        return "pipeline-ordered"
    return NOISE_LABELS.get(reason, reason)


def noise_cell(result: ToolResult) -> str:
    """Filtered records by reason, short (a table cell): ``34 api-probing; 1 analysis-dup``."""
    cells = [f"{i.count} {noise_label(i.reason)}" for i in result.filtered]
    return "; ".join(cells) or "0"


def others_cell(result: ToolResult) -> str:
    """Other kernels' findings, short (a table cell): ``RACE ×1000 in 1 kernel(s)``."""
    kernels = result.other_kernels
    if not kernels:
        return "0"
    classes = sorted({k.class_ for k in kernels})
    return f"{'/'.join(classes)} ×{sum(k.count for k in kernels)} in {len(kernels)} kernel(s)"


def findings_cell(result: ToolResult) -> str:
    """``KIND@file:line ×N`` per kept group (a table cell)."""
    cells = [f"{g.kind}@{where_lines(g.lines)} ×{g.count}" for g in result.groups]
    return "; ".join(cells) or "-"


def render_summary_markdown(summary: SanitizeSummary, verdict_line: str) -> str:
    """report.md of `cutedebug sanitize`: each tool's verdict, ``verdict_line`` (the
    expectation's check, from the command), the table, then each tool's report."""
    sc = summary.scenario
    tools = summary.tools
    plain = summary.plain
    out = [f"# cutedebug sanitize: {md_text(sc['id'])}", ""]
    for tool, r in tools.items():
        caveat = " (caveat: the kernel orders shared memory by mbarriers; see below)"
        out.append(
            f"- **{md_text(tool)} → {md_text(verdict_label(r))}**: {top_line(r, md=True)}"
            + (md_text(caveat) if present(r.caveat) else "")
        )
    out += ["", md_text(verdict_line[0].upper() + verdict_line[1:]) + "."]
    if plain:
        out.append(
            f"Plain run (no sanitizer): {md_text(plain.verdict)} in "
            f"{secs(plain.seconds)} ({md_text(plain.reason)})."
        )
    out += [
        "",
        "| tool | verdict | findings | other kernels (not the verdict) | noise filtered "
        "| sanitized | plain | slowdown (process) | slowdown (kernel) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for tool, r in tools.items():
        slow = f"{r.slowdown:.1f}×" if r.slowdown else "-"
        k = r.kernel_seconds.slowdown if r.kernel_seconds else None
        out.append(
            f"| {md_text(tool)} | {md_text(r.verdict)} | {md_text(findings_cell(r))} | "
            f"{md_text(others_cell(r))} | {md_text(noise_cell(r))} | "
            f"{secs(r.sanitizer_seconds)} | "
            f"{secs(r.plain_seconds)} | {slow} | "
            f"{f'{k:.1f}×' if k else '-'} |"
        )
    if summary.reproduce:
        out += ["", "Reproduce all of it: " + md_code(summary.reproduce)]
    out.append("")
    for r in tools.values():
        body = render_markdown(r).replace("\n## ", "\n### ").replace("# compute", "## compute", 1)
        out += [body]
    return "\n".join(out)
