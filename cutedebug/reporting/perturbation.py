"""The perturbation part of a run's report: seeds, the exposing delays, the shrunk set, replay."""

from __future__ import annotations

from typing import Any

from cutedebug.reporting.escape import md_code, md_text


def _info(result: Any) -> dict[str, Any] | None:
    return (getattr(result, "evidence", None) or {}).get("perturbation")


def summary_line(result: Any) -> str | None:
    """One terminal line: which seed exposed it (and with what), or that none did."""
    p = _info(result)
    if not p:
        return None
    runs = p.get("runs")
    seed = p.get("exposed_by")
    if seed is None and not p.get("exposing_rules"):
        nd = " — outputs differ across seeds" if p.get("nondeterministic") else ""
        return f"  perturbation: {runs} seed(s), none exposed a failure{nd}"
    shrunk = p.get("shrunk") or {}
    words = shrunk.get("described") or p.get("described") or []
    what = "; ".join(words[:3]) + (f"; +{len(words) - 3} more" if len(words) > 3 else "")
    how = p.get("exposing_outcome") or p.get("killed_during") or "?"
    return (
        f"  perturbation: seed {seed} exposed it ({how}) after {runs} run(s): {what}"
        f"  [replay: --replay {seed}]"
    )


def report_sections(result: Any) -> list[str]:
    """Markdown for report.md (escaped here)."""
    p = _info(result)
    if not p:
        return []
    out = ["## Schedule perturbation", ""]
    pol = p.get("policy") or {}
    out.append(
        f"Policy {md_code(pol.get('name', '?'))}, {p.get('positions', '?')} delay "
        f"position(s) in the kernel ({p.get('dropped_positions', 0)} not instrumented), "
        f"{p.get('runs', '?')} run(s) after one compile."
    )
    shape = {k: v for k, v in (p.get("shape") or {}).items() if v}
    if shape:
        out[-1] += (
            " Keys drawn for the traced launch: "
            + ", ".join(f"{k} {md_text(v)}" for k, v in shape.items())
            + "."
        )
    scope = pol.get("scope")
    if scope:
        out[-1] += f" Every delay scoped to {md_code(scope)}."
    out.append("")
    seed = p.get("exposed_by")
    if seed is None and not p.get("exposing_rules"):
        out.append(f"No seed exposed a failure (seeds {md_text(p.get('seeds'))}).")
    else:
        out.append(
            f"**Seed {seed}** exposed it: {md_text(p.get('exposing_outcome') or p.get('killed_during'))}. "
            f"Replay: `cutedebug run SCENARIO --perturb 1 --replay {seed}` (same policy)."
        )
        out.append("")
        for line in p.get("described") or []:
            out.append(f"- {md_text(line)}")
    shrunk = p.get("shrunk")
    if shrunk:
        out += ["", "### Shrunk (delta debugging)", ""]
        if shrunk.get("rules") is None:
            out.append(md_text(shrunk.get("error", "shrinking stopped")))
        else:
            out.append(
                f"{len(shrunk['rules'])} of {shrunk.get('from_rules')} delay rule(s) "
                f"keep the failure ({shrunk.get('runs')} run(s); minimal set "
                f"{'reproduced' if shrunk.get('reproduced') else 'NOT reproduced'} on "
                "its own):"
            )
            for line in shrunk.get("described") or []:
                out.append(f"- {md_text(line)}")
    if p.get("nondeterministic"):
        out += [
            "",
            f"Outputs differ bit for bit across seeds "
            f"({p.get('distinct_outputs')} distinct) although the kernel declares "
            "`DETERMINISTIC = True`.",
        ]
    return out
