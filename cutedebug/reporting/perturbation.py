"""The perturbation part of a run's report: seeds, the exposing delays, the shrunk set, replay."""

from __future__ import annotations

from typing import Any

from cutedebug.reporting.escape import md_block, md_code, md_text


def _info(result: Any) -> dict[str, Any] | None:
    return (getattr(result, "evidence", None) or {}).get("perturbation")


def _seeds(first: int, last: int) -> str:
    return f"seed {first}" if first == last else f"seeds {first}-{last}"


def history(p: dict[str, Any]) -> str | None:
    """ "seeds 0-8" when seeds ran before the exposing one in its process, else None."""
    first, seed = p.get("history_from"), p.get("exposed_by")
    if first is None or seed is None or first >= seed:
        return None
    return _seeds(first, seed - 1)


def replay_flags(p: dict[str, Any]) -> str:
    """The replay's flags, when the evidence has no full command (commands/perturb_args)."""
    seed, first = p.get("exposed_by"), p.get("history_from")
    return f"--replay {seed}" + (f" --replay-from {first}" if history(p) else "")


def replay_text(p: dict[str, Any]) -> str | None:
    """What a replay run gave against the seed it asked for (None: not a replay)."""
    asked = p.get("replay_of")
    if asked is None:
        return None
    seeds = p.get("seeds") or []
    ran = f" after {_seeds(seeds[0], asked - 1)}" if seeds and seeds[0] < asked else ""
    seed = p.get("exposed_by")
    if seed is None:
        return f"replay of seed {asked}{ran}: NOT reproduced, no seed exposed a failure"
    how = p.get("exposing_outcome") or p.get("killed_during") or "?"
    if seed != asked:
        return (
            f"replay of seed {asked}{ran}: seed {seed}, BEFORE it, exposed {how} (the "
            f"replay stopped there; this is seed {seed}'s verdict, not seed {asked}'s)"
        )
    return f"replay of seed {asked}{ran}: reproduced ({how})"


def summary_line(result: Any) -> str | None:
    """One terminal line: which seed exposed it (and with what), or that none did."""
    p = _info(result)
    if not p:
        return None
    runs = p.get("runs")
    seed = p.get("exposed_by")
    replay = replay_text(p)
    if seed is None and not p.get("exposing_rules"):
        nd = " — outputs differ across seeds" if p.get("nondeterministic") else ""
        if replay:
            return f"  perturbation: {replay}{nd}"
        return f"  perturbation: {runs} seed(s), none exposed a failure{nd}"
    shrunk = p.get("shrunk") or {}
    words = shrunk.get("described") or p.get("described") or []
    what = "; ".join(words[:3]) + (f"; +{len(words) - 3} more" if len(words) > 3 else "")
    how = p.get("exposing_outcome") or p.get("killed_during") or "?"
    before = history(p)
    if replay:
        head = replay
    elif before:
        head = f"seed {seed} exposed it ({how}) after {before} in the same process"
    else:
        head = f"seed {seed} exposed it ({how}) after {runs} run(s)"
    return (
        f"  perturbation: {head}: {what}\n"
        f"  replay{' (with ' + before + ' before it)' if before else ''}: "
        f"{p.get('replay_command') or replay_flags(p)}"
    )


def reproduce_lines(result: Any) -> list[str]:
    """For report.md's Reproduce section: the exact command that replays the exposing seed (with
    the seeds that ran before it, when some did), then the seed alone. Empty: no exposure."""
    p = _info(result)
    if not p or p.get("exposed_by") is None:
        return []
    seed, before = p["exposed_by"], history(p)
    cmd = p.get("replay_command") or f"cutedebug run SCENARIO {replay_flags(p)} (same policy)"
    if before:
        said = (
            f"Replays seed {seed} after {before}, in one worker, in order, after one compile, "
            f"as the exposing run ran them (the failure can need what their launches left)."
        )
        alone = p.get("replay_alone_command")
        if alone:
            said += f" Seed {seed} alone, in a fresh worker: {md_code(alone)}."
    else:
        said = f"Replays seed {seed} (the first seed of its run) in a fresh worker."
    return [*md_block(cmd), "", said]


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
        how = md_text(p.get("exposing_outcome") or p.get("killed_during"))
        before = history(p)
        replay = replay_text(p)
        out.append(
            (md_text(replay[0].upper() + replay[1:]) + ". " if replay else "")
            + f"**Seed {seed}** exposed it: {how}"
            + (f", after {before} in the same process (one compile)" if before else "")
            + ". Replay: "
            + (
                md_code(p["replay_command"])
                if p.get("replay_command")
                else md_code(replay_flags(p)) + " (same scenario, same policy)"
            )
            + "."
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
