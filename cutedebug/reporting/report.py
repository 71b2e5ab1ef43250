"""The report of one run: report.json (machine, schema-versioned), report.md (human) and,
when probes ran, stuck_map.svg, all in the run directory.

Markdown follows the order a stranger needs: TL;DR (verdict, expected, where, why), evidence,
what was ruled out, then the exact command that reproduces it. Every piece of user or tool text
in it (ids, descriptions, errors, logs) is escaped (``cutedebug.reporting.escape``).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from cutedebug.engine.compile_cache import reused
from cutedebug.engine.run_report import (
    SCHEMA_VERSION,
    RunReport,
    StuckMapRow,
    StuckMapSummary,
    stuck_site_phrase,
)
from cutedebug.engine.runner import RunResult, probe_picture
from cutedebug.event_kinds import Compiled
from cutedebug.instrument.probes import snapshot_from_json
from cutedebug.reporting import perturbation
from cutedebug.reporting import stuck_map as SM
from cutedebug.reporting.escape import md_block, md_code, md_link, md_text
from cutedebug.reporting.files import atomic_write

STUCK_MAP_SVG = "stuck_map.svg"

__all__ = [
    "SCHEMA_VERSION",
    "RunReport",
    "atomic_write",
    "command_line",
    "group_sites",
    "reproduce_command",
    "run_report",
    "stuck_map",
    "tldr",
    "to_json",
    "to_markdown",
    "where",
    "write",
]


def stuck_map(result: RunResult) -> tuple[SM.StuckMap, str] | None:
    """The run's stuck map (from the probe picture its evidence came from) and its text form;
    None when no probes ran."""
    picture, _ = probe_picture(result.outcome)
    sites = (result.outcome.last(Compiled) or Compiled()).probe_sites or []
    if not picture and result.evidence.get("coredump_picture"):
        # no probes ran: the core's warps as stuck records (cutedebug.analyses.coredump)
        picture = result.evidence["coredump_picture"]
        sites = picture.get("sites") or []
    if not picture:
        return None
    snap = snapshot_from_json(picture)
    m = SM.build(snap, sites)
    lines = picture.get("lines")  # a core's own footnote: no wait time, no item number
    return m, SM.render_text(
        m, records=lines if lines is not None else SM.record_lines(snap, sites)
    )


def unlisted_note(ev: dict[str, Any]) -> str:
    """The line under a stuck-site table whose evidence left sites out (a core of a big grid:
    cutedebug.analyses.coredump keeps PICTURE_MAX_ITEMS, every kind of place among them)."""
    n, kept = ev.get("stuck_sites_unlisted") or 0, len(ev.get("stuck_sites") or [])
    return (
        f"\n{n} more stuck warp(s) not listed: the report keeps {kept}, every kind of place "
        f"among them; the diagnosis counts all {n + kept}."
    )


def where(result: RunResult) -> str:
    """One phrase for where the problem is, if known."""
    sites = result.evidence.get("stuck_sites") or []
    if sites:
        return stuck_site_phrase(sites[0])
    checked = result.evidence.get("checked") or {}
    if checked.get("first_bad_index") is not None:
        return f"first bad element at index {checked['first_bad_index']}"
    return ""


def time_breakdown(t: dict[str, Any]) -> str:
    """The run's seconds by phase, in the order they happen ("spawn 0.05 s · imports 3.1 s
    · ..."); empty when the worker did not report them."""
    from cutedebug.engine.timings import PLACED

    keys = [*PLACED, "unplaced_s", "cli_start_s", "cli_after_s"]
    parts = [
        f"{k.removesuffix('_s')} {t[k]:.2f} s" for k in keys if isinstance(t.get(k), (int, float))
    ]
    return " · ".join(parts) if "spawn_s" in t else ""


def tldr(result: RunResult) -> str:
    exp = result.scenario.expect
    mark = "as expected" if result.expected else f"EXPECTED {exp.verdict_text()}"
    w = where(result)
    diagnosis = result.evidence.get("diagnosis") or []
    why = diagnosis[0] if diagnosis else result.reason
    return (
        f"{result.verdict.value} ({mark}) — {result.scenario.id}"
        + (f" — {w}" if w else "")
        + f": {why}"
    )


def run_report(result: RunResult) -> RunReport:
    """The run's report.json record."""
    return RunReport(
        scenario=result.scenario.to_json(),
        mode=result.mode,
        verdict=result.verdict,
        expected_verdict=result.scenario.expect.verdict,
        verdict_ok=result.verdict_ok,
        localization=result.localization,
        as_expected=result.expected,
        reason=result.reason,
        tldr=tldr(result),
        evidence=result.evidence,
        timings=result.timings,
        health=result.health,
        repeats=result.repeats,
        run_dir=str(result.run_dir),
        command=result.command,
        log_tail=result.outcome.log_tail[-2000:],
        stuck_map=_stuck_map_summary(result),
    )


def to_json(result: RunResult) -> dict[str, Any]:
    """report.json's object (``run_report(result).to_json()``)."""
    return run_report(result).to_json()


def _stuck_map_summary(result: RunResult) -> StuckMapSummary | None:
    sm = stuck_map(result)
    if sm is None:
        return None
    m = sm[0]
    return StuckMapSummary(
        svg=STUCK_MAP_SVG,
        warps=m.warps,
        dropped_records=m.dropped_records,
        n_stuck_reported=m.n_stuck_reported,
        hidden_rows=len(m.hidden_rows),
        rows=[
            StuckMapRow(
                ctas=SM.cta_ranges(r.ctas, limit=10**6),
                n_ctas=len(r.ctas),
                cells=[c.label for c in r.cells],
            )
            for r in m.rows
        ],
    )


def _md_coredump(ev: dict[str, Any]) -> list[str]:
    """The GPU core's lines (cutedebug.analyses.coredump), if the run took one."""
    core = ev.get("coredump")
    if not core:
        return []
    dump = core.get("dump") or {}
    if core.get("error"):
        return [f"- GPU coredump: {md_text(core['error'])}"]
    procs = core.get("gdb_processes") or core.get("gdb_passes")
    out = [
        f"- GPU coredump: {md_text(core.get('core'))} ({core.get('core_bytes')} bytes, "
        f"dumped in {dump.get('dump_s', 'n/a')} s), {core.get('warps')} warps read by "
        f"cuda-gdb in {core.get('gdb_s')} s ({core.get('gdb_passes')} round(s) of commands in "
        f"{procs} process(es); output in coredump_gdb_pass*.txt); SASS: "
        f"{md_text(core.get('sass'))}"
    ]
    if core.get("gdb_fallback"):
        out.append(f"  - cuda-gdb -batch per round: {md_text(core['gdb_fallback'])}")
    out += [f"  - site map: {md_text(n)}" for n in core.get("site_map") or []]
    if (crash := ev.get("crash")) is not None:
        out.append(
            f"- faulting warp (from the core): {md_text(crash.get('exception'))} at "
            f"{md_text(crash.get('where'))}, CTA {crash.get('block')} warp "
            f"{crash.get('warp')} lane {crash.get('lane')}, faulting instruction at "
            f"offset {md_text(crash.get('fault_offset'))}: "
            f"{md_code(crash.get('instruction') or '?')}"
        )
    for role, a in (ev.get("role_answers") or {}).items():
        out.append(f"- {md_text(role)} (from the core): {md_text(a.get('how'))}")
    if (g := ev.get("coredump_grade")) is not None:
        out.append(f"- the core's localization against the expected one: {md_text(g)}")
    return out


def _md_evidence(result: RunResult) -> list[str]:
    ev = result.evidence
    out = []
    dev = ev.get("device") or {}
    if dev:
        out.append(
            f"- device: {md_text(dev.get('name', ''))} {md_text(dev.get('arch', ''))}"
            if dev.get("present")
            else f"- device: none ({md_text(dev.get('reason'))})"
        )
    c = ev.get("compiled")
    if c is not None:
        count = c.get("fault_count") if c.get("fault_count") is not None else "n/a"
        out.append(
            f"- compiled for {md_text(c.get('arch'))} in {c.get('secs')} s, PTX "
            f"{c.get('ptx_bytes')} bytes; fault applied at {count} site(s)"
            + ("; compiled kernel reused (traced IR seen before)" if reused(c) else "")
        )
    static = (c or {}).get("static_findings")
    if static is not None:
        serious = [f for f in static if f.get("severity") in ("error", "warning")]
        out.append(
            f"- static protocol checks: {len(serious)} finding(s)" + ("" if serious else " (clean)")
        )
        for f in serious[:8]:
            at = f"{os.path.basename(f['file'])}:{f['line']}" if f.get("file") else ""
            out.append(
                f"  - {md_text(f['severity'])} {md_text(f.get('check'))}: "
                f"{md_text(f.get('message'))}"
                + (f" — {md_text(f['arithmetic'])}" if f.get("arithmetic") else "")
                + (f" ({md_text(at)})" if at else "")
            )
    if (ce := ev.get("compile_error")) is not None:
        out += [f"- compile error ({md_text(ce.get('type'))}):", ""]
        out += md_block(str(ce.get("message", ""))[:3000]) + [""]
    if (cu := ev.get("cuda_error")) is not None:
        out.append(
            f"- CUDA error {md_text(cu.get('name'))}: {md_code(str(cu.get('message', ''))[:300])}"
        )
    if (ck := ev.get("checked")) is not None and ck.get("skipped"):
        out.append(
            f"- comparison skipped: {md_text(ck['skipped'])} (the output is garbage by "
            "construction)"
        )
    elif ck is not None:
        out.append(
            f"- comparison: {ck.get('n_bad')} / {ck.get('numel')} bad "
            f"(atol {ck.get('atol')}, rtol {ck.get('rtol')}), max abs err "
            f"{ck.get('max_abs_err')}, max rel err {ck.get('max_rel_err')}, first bad "
            f"index {ck.get('first_bad_index')}, NaNs {ck.get('n_nan')}"
        )
    if ev.get("killed_by_watchdog"):
        out.append(
            f"- watchdog: killed the child ({md_text(ev['killed_by_watchdog'])}) in "
            f"phase {md_text(ev.get('phase'))}"
        )
    if result.health is not None:
        out.append(f"- GPU health check afterwards: {md_text(result.health)}")
    out += _md_coredump(ev)
    for d in ev.get("diagnosis", []) or []:
        out.append(f"- diagnosis: {md_text(d)}")
    if ev.get("swept_pids"):
        out.append(f"- swept leftover processes: {ev['swept_pids']}")
    t = result.timings
    out.append("- timings: " + ", ".join(f"{md_text(k)} {v}" for k, v in t.items()))
    line = time_breakdown(t)
    if line:
        out.append(f"- where the {t.get('wall_s', t.get('total_s'))} s went: {md_text(line)}")
    return out


def to_markdown(
    result: RunResult,
    extra_sections: list[str] | None = None,
    *,
    stuck_map_svg: str | None = STUCK_MAP_SVG,
) -> str:
    """report.md. ``extra_sections`` are Markdown the caller built (and escaped);
    ``stuck_map_svg``: the picture's file name beside the report (None: no link)."""
    sc = result.scenario
    lines = [
        f"# {md_text(sc.id)}: {result.verdict.value}",
        "",
        f"**TL;DR** {md_text(tldr(result))}",
        "",
    ]
    if sc.description:
        lines += [f"_{md_text(sc.description)}_", ""]
    expect = sc.expect
    lines += [
        "## Scenario",
        "",
        f"- kernel: {md_code(f'{sc.kernel_file}:{sc.kernel_entry}')}",
        f"- params: {md_code(json.dumps(sc.params))}",
        f"- fault: {md_code(sc.fault or 'none')}"
        + (f" {md_code(json.dumps(sc.fault_args))}" if sc.fault else ""),
        f"- expected: {md_text(expect.verdict_text())}"
        + (f" at {md_text(expect.localization())}" if expect.localization() else "")
        + (f" — {md_text(expect.note)}" if expect.note else ""),
        "",
    ]
    loc = result.localization
    if result.mode == "compile":
        lines += ["- localization: not graded (compile-only: the kernel was not run)", ""]
    elif loc["ok"] is not None:
        lines += [
            f"- localization: {'right' if loc['ok'] else 'WRONG'} "
            f"(expected {md_text(loc['expected'])}, matched {md_text(loc.get('matched'))})",
            "",
        ]
    lines += ["## Evidence", ""] + _md_evidence(result) + [""]
    sites = result.evidence.get("stuck_sites") or []
    if sites:
        lines += [
            "## Stuck sites",
            "",
            "Identical stuck states grouped over CTAs and warps.",
            "",
            "| CTAs | warps | role | op | barrier[stage] | phase | waited ms | where |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for g in group_sites(sites):
            bar = (
                (f"{g['barrier']}[{g['stage']}]" if g["stage"] is not None else g["barrier"])
                if g["barrier"]
                else f"stage {g['stage']}"
            )
            cells = [
                g["ctas"],
                g["warps"],
                g["role"],
                g["op"],
                bar,
                g["phase"],
                g["waited_ms"],
                g["location"],
            ]
            lines.append("| " + " | ".join(md_text(x) for x in cells) + " |")
        lines += (
            [unlisted_note(result.evidence)] if result.evidence.get("stuck_sites_unlisted") else []
        )
        lines.append("")
    sm = stuck_map(result)
    if sm is not None:
        lines += [
            "## Stuck map",
            "",
            f"Source: {md_text(result.evidence.get('probe_source'))}.",
            "",
        ]
        if stuck_map_svg:
            lines += [
                f"Picture: {md_link(stuck_map_svg, stuck_map_svg)} (hover a cell for its details).",
                "",
            ]
        lines += md_block(sm[1]) + [""]
    if result.evidence.get("rerun_with_probes"):
        r = result.evidence["rerun_with_probes"]
        lines += [
            f"_First run without probes: {md_text(r['first_verdict'])} "
            f"({md_text(r['first_reason'])}); rerun with probes on to localize it._",
            "",
        ]
    if result.repeats:
        lines += (
            ["## Repeats", ""]
            + [
                f"- run {i}: {md_text(r['verdict'])} (output {md_text(r['digest'])})"
                for i, r in enumerate(result.repeats)
            ]
            + [""]
        )
    for sec in extra_sections or []:
        lines += [sec, ""]
    if result.outcome.log_tail.strip():
        lines += ["## Worker log (tail)", ""] + md_block(result.outcome.log_tail[-1500:]) + [""]
    lines += ["## Reproduce", ""]
    replay = perturbation.reproduce_lines(result)
    if replay:  # a perturbed exposure: the seed's replay first, then the whole run
        lines += replay + ["", "The whole perturbed run:", ""]
    lines += md_block(result.command or reproduce_command(result))
    lines += [
        "",
        f"Run directory: {md_code(result.run_dir)} (events.jsonl, worker.log, kernel.ptx)",
        "",
    ]
    return "\n".join(lines)


def _ranges(xs: list[int]) -> str:
    xs = sorted(set(xs))
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ",".join(out)


def group_sites(sites: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stuck sites grouped by (role, op, barrier, stage, phase, location), largest first."""
    groups: dict[tuple, dict[str, Any]] = {}
    for s in sites:
        key = (
            s.get("role"),
            s.get("op"),
            s.get("barrier"),
            s.get("stage"),
            s.get("phase"),
            s.get("location"),
        )
        g = groups.setdefault(
            key,
            {
                "role": key[0],
                "op": key[1],
                "barrier": key[2],
                "stage": key[3],
                "phase": key[4],
                "location": key[5],
                "cta_list": [],
                "warp_list": [],
                "waited": [],
            },
        )
        g["cta_list"].append(s.get("cta", 0))
        g["warp_list"].append(s.get("warp", 0))
        g["waited"].append(s.get("waited_ms") or 0)
    out = []
    for g in sorted(groups.values(), key=lambda g: -len(g["cta_list"])):
        out.append(
            {
                **{k: v for k, v in g.items() if not k.endswith("_list") and k != "waited"},
                "ctas": _ranges(g["cta_list"]),
                "warps": _ranges(g["warp_list"]),
                "count": len(g["cta_list"]),
                "waited_ms": max(g["waited"]),
            }
        )
    return out


def reproduce_command(result: RunResult) -> str:
    sc = result.scenario
    if sc.source:
        return f"cutedebug run {shlex.quote(os.path.relpath(sc.source))}"
    parts = ["cutedebug", "run", f"{os.path.relpath(sc.kernel_file)}:{sc.kernel_entry}"]
    for k, v in sc.params.items():
        parts += ["--param", f"{k}={json.dumps(v)}"]
    if sc.fault:
        args = ",".join(f"{k}={json.dumps(v)}" for k, v in sc.fault_args.items())
        parts += ["--fault", sc.fault + (f":{args}" if args else "")]
    parts += ["--expect", sc.expect.verdict]
    return shlex.join(parts)


def write(result: RunResult, extra_sections: list[str] | None = None) -> tuple[Path, Path]:
    """report.json, report.md (and stuck_map.svg when probes ran) in the run directory."""
    if not result.command:
        result.command = reproduce_command(result)
    jpath, mpath = result.run_dir / "report.json", result.run_dir / "report.md"
    sm = stuck_map(result)
    if sm is not None:
        atomic_write(
            result.run_dir / STUCK_MAP_SVG,
            SM.render_svg(sm[0], title=f"cutedebug stuck map: {result.scenario.id}"),
        )
    atomic_write(jpath, json.dumps(to_json(result), indent=1, default=str))
    atomic_write(
        mpath,
        to_markdown(
            result, extra_sections, stuck_map_svg=STUCK_MAP_SVG if sm is not None else None
        ),
    )
    return jpath, mpath


def command_line() -> str:
    return shlex.join(["cutedebug"] + sys.argv[1:])
