"""Reports of one `cutedebug exec` run: report.json (machine) and report.md (human), in the
order of `run`'s: TL;DR (verdict, expected, where, why), the command, evidence (processes,
fault sites, stuck sites and map, Python stacks at the kill), the output's tail, how to
reproduce it."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from cutedebug.engine.command import ExecResult, compiled_of, where
from cutedebug.engine.run_report import ExecProcess, ExecReport
from cutedebug.records import to_json_value


def tldr(res: ExecResult, expect: str = "PASS") -> str:
    mark = "as expected" if res.verdict.value == expect else f"EXPECTED {expect}"
    cmd = shlex.join(res.settings.argv)
    w = where(res)
    diagnosis = res.evidence.get("diagnosis") or []
    why = diagnosis[0] if diagnosis else res.reason.splitlines()[0] if res.reason else ""
    return f"{res.verdict.value} ({mark}) — {cmd}" + (f" — {w}" if w else "") + f": {why}"


def exec_report(res: ExecResult, expect: str = "PASS", command: str = "") -> ExecReport:
    """The exec run's report.json record."""
    s = res.settings
    procs = [
        ExecProcess.from_json(
            to_json_value(
                {k: v for k, v in p.items() if k not in ("events", "compiled")}
                | {"probe_sites": compiled_of(p).probe_sites}
            ),
            f"processes[{i}]",
        )
        for i, p in enumerate(res.processes.values())
    ]
    ev = {
        k: v
        for k, v in res.evidence.items()
        if k not in ("stuck_map_svg", "probe_picture", "probe_sites")  # drawn; sites per process
    }
    return ExecReport(
        argv=s.argv,
        cwd=s.cwd or os.getcwd(),
        fault=s.fault,
        fault_args=s.fault_args,
        fault_trace=s.fault_trace,
        gpu_token=s.gpu_token,
        probes=s.probes,
        deadline_s=s.deadline_s,
        verdict=res.verdict,
        expected_verdict=expect,
        as_expected=res.verdict.value == expect,
        reason=res.reason,
        tldr=tldr(res, expect),
        returncode=res.returncode,
        killed_by_watchdog=res.killed_by,
        elapsed_s=res.elapsed_s,
        fault_count=res.fault_count,
        kernels_traced=res.traced,
        evidence=ev,
        processes=procs,
        health=res.health,
        swept_pids=res.swept,
        left_pids=res.left,
        gpu_wait_s=res.gpu_wait_s,
        first_run=res.first_run,
        run_dir=str(res.run_dir),
        command=command,
        log_tail=res.log_tail[-3000:],
    )


def to_json(res: ExecResult, expect: str = "PASS", command: str = "") -> dict[str, Any]:
    """report.json's object (``exec_report(...).to_json()``)."""
    return exec_report(res, expect, command).to_json()


def to_markdown(res: ExecResult, expect: str = "PASS", command: str = "") -> str:
    from cutedebug.reporting.report import group_sites

    s, ev = res.settings, res.evidence
    lines = [
        f"# exec: {res.verdict.value}",
        "",
        f"**TL;DR** {tldr(res, expect)}",
        "",
        "## Command",
        "",
        f"- `{shlex.join(s.argv)}` in `{s.cwd or os.getcwd()}`",
        f"- fault: `{s.fault or 'none'}` {json.dumps(s.fault_args) if s.fault else ''}",
        f"- probes: {'on, wait budget ' + str(s.probes['budget_ns'] // 1_000_000) + ' ms' if s.probes else 'off'}",
        f"- deadline: {s.deadline_s:g} s; expected verdict: {expect}",
        "",
        "## Evidence",
        "",
    ]
    lines.append(
        f"- exit: {'killed by the watchdog (' + res.killed_by + ')' if res.killed_by else f'status {res.returncode}'} after {res.elapsed_s} s"
    )
    for p in res.processes.values():
        kern = sorted({k for t in p["traces"] for k in (t.get("kernels") or [])})
        lines.append(
            f"- pid {p['pid']} `{shlex.join(p.get('argv') or [])[:160]}`: "
            + ("instrumented" if p.get("instrumented") else "did not import cutlass")
            + f", {len(p['traces'])} trace(s), {len(kern)} kernel(s)"
            + (f", fault applied at {p['fault_count']} site(s)" if s.fault else "")
            + (f", {p['stuck']} stuck record(s)" if p["stuck"] else "")
        )
    if s.fault:
        n = res.fault_count or 0
        lines.append(
            f"- fault `{s.fault}`: "
            + (f"applied at {n} site(s)" if n else f"NOT applied: {res.fault_not_applied_why()}")
        )
        for p in res.processes.values():
            for fs in (p.get("fault_sites") or [])[:10]:
                lines.append(
                    f"  - {fs.get('kernel') or '?'} {os.path.basename(fs.get('file') or '?')}:"
                    f"{fs.get('line')} {fs.get('op')}: {fs.get('detail')}"
                )
    if (ce := ev.get("cuda_error")) is not None:
        lines.append(
            f"- CUDA error {ce['name'] or '(name not read: ' + str(ce.get('not_read')) + ')'}"
            + (f" after the kernel {ce['kernel']}" if ce.get("kernel") else "")
            + (f", read by {ce['read_by']}" if ce.get("read_by") else "")
            + f": `{ce['line']}`"
        )
    if (le := ev.get("library_error")) is not None:
        lines.append(
            f"- {le['library']} error {le['status']} with a healthy CUDA context: `{le['line']}`"
        )
    if ev.get("last_lines"):
        lines += ["- the command's last lines:", "", "```", ev["last_lines"], "```"]
    if (tl := ev.get("timeline")) is not None:
        lines.append(
            f"- first stuck record seen {tl['first_stuck_record_s']} s after the start, command "
            f"killed at {tl['killed_s']} s: {tl['stall_to_verdict_s']} s from the stall to the "
            f"verdict (the wait budget, {tl['wait_budget_s']:g} s, included)"
        )
    if res.health is not None:
        lines.append(f"- GPU health check afterwards: {res.health}")
    if ev.get("coredump"):
        from cutedebug.reporting.report import _md_coredump

        lines += _md_coredump(ev)
    for d in ev.get("diagnosis") or []:
        lines.append(f"- diagnosis: {d}")
    if res.swept:
        lines.append(f"- swept leftover processes: {res.swept}")
    lines.append("")
    if ev.get("stuck_sites"):
        lines += [
            "## Stuck sites",
            "",
            f"Kernel: `{ev.get('kernel')}` (pid {ev.get('pid')}). "
            "Identical stuck states grouped over CTAs and warps.",
            "",
            "| CTAs | warps | role | op | barrier[stage] | phase | waited ms | where |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for g in group_sites(ev["stuck_sites"]):
            bar = f"{g['barrier']}[{g['stage']}]" if g["barrier"] else f"stage {g['stage']}"
            lines.append(
                f"| {g['ctas']} | {g['warps']} | {g['role']} | {g['op']} | {bar} | "
                f"{g['phase']} | {g['waited_ms']} | {g['location']} |"
            )
        if ev.get("stuck_sites_unlisted"):
            from cutedebug.reporting.report import unlisted_note

            lines.append(unlisted_note(ev))
        lines.append("")
    if ev.get("stuck_map_text"):
        lines += ["## Stuck map", "", f"Source: {ev.get('probe_source')}.", ""]
        if ev.get("stuck_map_svg_file"):
            lines += [f"![stuck map]({ev['stuck_map_svg_file']})", ""]
        lines += ["```", ev["stuck_map_text"], "```", ""]
    if ev.get("stacks"):
        lines += ["## Python stacks at the kill", ""]
        for pid, text in ev["stacks"].items():
            lines += [f"pid {pid}:", "", "```", text[:2500], "```", ""]
    if res.first_run:
        lines += [
            f"_First run without probes: {res.first_run['verdict']} "
            f"({res.first_run['reason'].splitlines()[0]}); rerun with probes on to "
            "localize it._",
            "",
        ]
    if res.log_tail.strip():
        lines += ["## Output (tail)", "", "```", res.log_tail[-2000:], "```", ""]
    lines += [
        "## Reproduce",
        "",
        "```",
        command or "cutedebug exec -- " + shlex.join(s.argv),
        "```",
        "",
        f"Run directory: `{res.run_dir}` (events.jsonl, command.log, stacks/)",
        "",
    ]
    return "\n".join(lines)


def draw_stuck_map(res: ExecResult) -> None:
    """The stuck map (text and SVG) from the probe picture the evidence came from."""
    picture = res.evidence.get("probe_picture")
    if not picture or res.evidence.get("stuck_map_text"):
        return
    from cutedebug.instrument.probes import snapshot_from_json
    from cutedebug.reporting import stuck_map as SM

    snap = snapshot_from_json(picture)
    table = res.evidence.get("probe_sites") or []
    res.evidence["stuck_map_text"] = SM.stuck_map_text(snap, table)
    res.evidence["stuck_map_svg"] = SM.stuck_map_svg(snap, table)


def write_report(res: ExecResult, expect: str = "PASS", command: str = "") -> Path:
    from cutedebug.reporting.files import atomic_write

    draw_stuck_map(res)
    svg = res.evidence.pop("stuck_map_svg", None)
    if svg:
        (res.run_dir / "stuck_map.svg").write_text(svg)
        res.evidence["stuck_map_svg_file"] = "stuck_map.svg"
    atomic_write(
        res.run_dir / "report.json",
        json.dumps(to_json(res, expect, command), indent=1, default=str),
    )
    md = res.run_dir / "report.md"
    atomic_write(md, to_markdown(res, expect, command))
    return md
