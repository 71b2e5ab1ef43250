"""The printf-bisection's report: bisect.json and bisect.md in the run directory, and its
terminal summary (``tldr``). Scenario ids, reasons and source lines are escaped."""

from __future__ import annotations

import json
from pathlib import Path

from cutedebug.analyses.bisect import BisectResult
from cutedebug.analyses.bisect_answer import describe_site, role_answer, site_where
from cutedebug.reporting.escape import md_block, md_code, md_text
from cutedebug.reporting.files import atomic_write


def to_markdown(res: BisectResult) -> str:
    by_id = res.by_id
    sc = res.scenario
    out = [f"# cutedebug bisect — {md_text(sc.id)}", ""]
    out += ["## TL;DR", ""]
    if res.status != "localized":
        out += [f"**{md_text(res.status)}**: {md_text(res.reason)}", ""]
    else:
        for role, st in res.searches.items():
            out.append(f"- **{md_text(role)}**: {md_text(role_answer(st, by_id))}")
        if res.grade.passed is not None:
            m = res.grade.matched
            out.append(
                f"- expected localization {md_text(res.grade.expected)}: "
                + (
                    md_text(f"found ({m.role} at #{m.site} {m.op}, {m.where})")
                    if res.grade.passed and m
                    else "NOT found"
                )
            )
        if res.timing_bugs:
            out.append(
                "- **timing bug**: enabling "
                + "; ".join(
                    md_text(
                        f"{describe_site(by_id.get(p.site))} made the hang vanish ({p.verdict})"
                    )
                    for p in res.timing_bugs
                )
            )
        pa = res.probes_answer
        if pa and pa.roles:
            out.append(
                "- bounded-wait probes: "
                + "; ".join(md_text(f"{r}: {v.probe} → {v.agreement}") for r, v in pa.roles.items())
                + f" (overall {'agree' if pa.agree else 'DISAGREE'})"
            )
        elif res.baseline.probes:
            out.append(
                "- bounded-wait probes: no wait timed out (the hang is outside mbarrier waits)"
            )
        out.append(
            f"- {len(res.runs)} checkpoint runs + baseline, "
            f"{res.seconds:.1f} s, window {res.window_s:g} s"
        )
    out += [
        "",
        "## Baseline",
        "",
        f"verdict {md_text(res.baseline.verdict)} "
        f"({md_text(res.baseline.reason[:200])}), "
        f"probes {'on' if res.baseline.probes else 'off'}, "
        f"{res.baseline.seconds} s",
        "",
    ]
    if res.searches:
        out += [
            "## Per role",
            "",
            "| role | sites | runs (budget) | last reached | first unreached | started |",
            "|---|---|---|---|---|---|",
        ]
        for role, st in res.searches.items():
            out.append(
                f"| {md_text(role)} | {len(st.sites)} | {st.runs} ({st.budget}) | "
                f"{md_text(describe_site(by_id.get(st.last_reached)))} | "
                f"{md_text(describe_site(by_id.get(st.first_unreached)))} | "
                f"{st.started} |"
            )
            for note in st.non_monotone:
                out.append(f"|  | note: {md_text(note)} | | | | |")
        out.append("")
    if res.runs:
        out += [
            "## Runs",
            "",
            "One checkpoint enabled per run; hits = warp arrivals at it, "
            "warps / ctas = how many reached it.",
            "",
            "| # | site | op | where | role | reached | verdict | hits | warps | ctas | s | note |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for i, p in enumerate(res.runs, 1):
            s = by_id.get(p.site)
            reached = {True: "yes", False: "no", None: "?"}[p.reached]
            cells = [
                i,
                p.site,
                f"{s.op} {s.name}" if s else "None ",
                site_where(s) if s else "-",
                p.role,
                reached,
                p.verdict,
                p.hits,
                p.warps,
                p.ctas,
                f"{p.seconds:.2f}",
                p.note,
            ]
            out.append("| " + " | ".join(md_text(x) for x in cells) + " |")
        out.append("")
    if res.sites:
        out += [
            "## Checkpoint sites (program order)",
            "",
            "| id | role | op | where | detail | code |",
            "|---|---|---|---|---|---|",
        ]
        for s in res.sites:
            what = s.op + (f" {s.name!r}" if s.name else "")
            cells = [s.id, s.role, what, site_where(s), s.detail]
            out.append(
                "| " + " | ".join(md_text(x) for x in cells) + f" | {md_code(s.code[:80])} |"
            )
        out.append("")
    out += ["## Reproduce", ""] + md_block(res.command or f"cutedebug bisect {sc.source}") + [""]
    return "\n".join(out)


def write(res: BisectResult) -> tuple[Path, Path]:
    jp, mp = res.run_dir / "bisect.json", res.run_dir / "bisect.md"
    atomic_write(jp, json.dumps(res.to_json(), indent=1, default=str))
    atomic_write(mp, to_markdown(res))
    return jp, mp


def tldr(res: BisectResult) -> str:
    if res.status != "localized":
        return f"{res.scenario.id}: {res.status}: {res.reason}"
    parts = [f"{role}: {role_answer(st, res.by_id)}" for role, st in res.searches.items()]
    flag = ""
    if res.timing_bugs:
        flag = " — TIMING BUG: " + ", ".join(
            f"checkpoint #{p.site} makes the hang vanish ({p.verdict})" for p in res.timing_bugs
        )
    grade_s = {True: " [as expected]", False: " [EXPECTED LOCALIZATION NOT FOUND]", None: ""}[
        res.grade.passed
    ]
    return (
        f"{res.scenario.id}: {len(res.runs)} runs, {res.seconds:.1f} s{grade_s}{flag}"
        "\n  " + "\n  ".join(parts)
    )
