"""The referee of a racecheck RACE in a kernel that orders shared memory by mbarriers.

racecheck does not credit mbarrier arrive/wait ordering (on the H200 a correct hand-off gave
102 WAR hazards: triage.MBARRIER_CAVEAT), so its RACE there may be the hand-off itself. The
referee runs the same scenario, unsanitized, under N perturbed schedules after one compile
(engine/perturb_runs.referee_plans: each role slower throughout, one protocol position at a
time, random subsets; delays from 1 us to 1 ms) and compares each output with the reference:

- CONFIRMED: a perturbed run gave MISMATCH / HANG / CRASH (or, for a kernel that declares
  ``DETERMINISTIC``, outputs that differ across schedules): a race, with the seed, its policy,
  the delays in words and the command that replays it;
- UNCONFIRMED: every perturbed run matched. The RACE stays (racecheck saw the hazard and its
  blind spot cannot tell a hand-off from a race), never CLEAN: N schedules are not all
  schedules;
- NOT_RUN: no perturbed run could be made (no GPU, the kernel does not compile, no delay
  position in the kernel), with the reason.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutedebug import records

CONFIRMED, UNCONFIRMED, NOT_RUN = "CONFIRMED", "UNCONFIRMED", "NOT_RUN"
OUTCOMES = (CONFIRMED, UNCONFIRMED, NOT_RUN)
DEFAULT_RUNS = 32
EXPOSED = ("MISMATCH", "HANG", "CRASH", "NONDETERMINISTIC")


@dataclass(frozen=True, slots=True, kw_only=True)
class RefereeResult(records.Record):
    """The referee's answer (``ToolResult.referee`` in sanitize.json)."""

    outcome: str  # CONFIRMED | UNCONFIRMED | NOT_RUN
    reason: str  # one line, what a reader acts on
    asked: int  # perturbed runs asked for
    runs: int  # perturbed launches made
    positions: int | None  # delay positions the trace produced
    schedules: dict[str, int]  # runs per schedule family ("role consumer": 8, ...)
    targets: list[str]  # the positions targeted one at a time, in words (the first 16)
    targets_total: int  # how many positions were targeted
    run_verdict: str  # the perturbed run's verdict (cutedebug run --perturb)
    exposed_by: int | None  # the seed that exposed it (CONFIRMED)
    policy: dict[str, Any] | None  # its policy
    described: list[str]  # its delays in words
    replay: str | None  # the command that replays the exposing seed
    run_dir: str


def schedule_words(schedules: dict[str, int], targets_total: int) -> str:
    """``"8 role producer, 8 role consumer, 8 targeted (at 8 of 14 positions), 8 random"``."""
    parts = []
    for name, n in schedules.items():
        extra = f" (at {min(n, targets_total)} position(s))" if name == "targeted" else ""
        parts.append(f"{n} {name}{extra}")
    return ", ".join(parts) or "none"


def replay_args(seed: int, policy: dict[str, Any]) -> list[str]:
    """The `cutedebug run` options that replay one seed of the referee (the same rules)."""
    out = ["--perturb", "1", "--replay", str(seed), "--policy", str(policy.get("name"))]
    if policy.get("role"):
        out += ["--perturb-role", str(policy["role"])]
    if policy.get("target") is not None:
        out += ["--perturb-target", str(policy["target"])]
    if policy.get("delay_us") is not None:
        out += ["--perturb-delay-us", f"{policy['delay_us']:g}"]
    if policy.get("name") == "random" and policy.get("density") not in (None, 0.5):
        out += ["--perturb-density", f"{policy['density']:g}"]
    return out


def judge(
    verdict: str, reason: str, perturbation: dict[str, Any] | None, asked: int
) -> tuple[str, str]:
    """(outcome, reason) from the perturbed run's verdict and its perturbation evidence."""
    p = perturbation or {}
    positions = p.get("positions")
    if positions == 0:
        return NOT_RUN, (
            "the kernel has no delay position (no pipeline op or raw mbarrier op was traced): "
            f"nothing to perturb; its one run gave {verdict}"
        )
    if not p or p.get("runs") is None:
        return NOT_RUN, f"no perturbed run was made: {verdict}: {reason}"
    runs = p["runs"]
    seed = p.get("exposed_by")
    if verdict in EXPOSED and (seed is not None or verdict == "NONDETERMINISTIC"):
        how = p.get("exposing_outcome") or verdict
        how = "" if how == verdict else f" ({how})"
        if p.get("killed_during"):
            how = " (killed at the deadline during that seed's launch)"
        if verdict == "NONDETERMINISTIC":
            return CONFIRMED, (
                f"the outputs differed bit for bit across {runs} perturbed schedules of a "
                "kernel that declares DETERMINISTIC = True"
            )
        return CONFIRMED, (
            f"perturbed run {runs} of {asked} (seed {seed}) gave {verdict}{how}: the "
            "hazard's order is not enforced"
        )
    if verdict == "PASS" and seed is None:
        return UNCONFIRMED, (
            f"all {runs} perturbed run(s) matched the reference; racecheck does not credit "
            "mbarrier ordering, so its hazards may be the kernel's mbarrier hand-off, and "
            f"{runs} schedule(s) are not all schedules: a race is neither shown nor ruled out"
        )
    return NOT_RUN, f"the perturbed run ended {verdict} before a verdict on the race: {reason}"


def result_of(res: Any, asked: int, target: Sequence[str], run_dir: Path | str) -> RefereeResult:
    """The referee's record from ``runner.run_scenario``'s result (``target``: the `cutedebug
    run` arguments that name the same kernel and parameters)."""
    p = dict((res.evidence or {}).get("perturbation") or {})
    verdict = res.verdict.value
    outcome, reason = judge(verdict, res.reason, p, asked)
    ref = p.get("referee") or {}
    seed, policy = p.get("exposed_by"), p.get("exposing_policy")
    confirmed = outcome == CONFIRMED and seed is not None and policy
    base = ["cutedebug", "run", *target]
    return RefereeResult(
        outcome=outcome,
        reason=reason,
        asked=asked,
        runs=int(p.get("runs") or 0),
        positions=p.get("positions"),
        schedules=dict(ref.get("runs") or {}),
        targets=list(ref.get("targets") or []),
        targets_total=int(ref.get("targets_total") or 0),
        run_verdict=verdict,
        exposed_by=seed if outcome == CONFIRMED else None,
        policy=policy if outcome == CONFIRMED else None,
        described=list(p.get("described") or []) if outcome == CONFIRMED else [],
        replay=shlex.join(base + replay_args(seed, policy)) if confirmed else None,
        run_dir=str(run_dir),
    )


def referee(
    scenario: Any, runs: int, run_dir: Path, target: Sequence[str] | None = None
) -> RefereeResult:
    """Run the referee: ``runs`` perturbed launches of ``scenario`` after one compile."""
    from cutedebug.engine import runner

    run_dir = Path(run_dir).resolve()
    spec = {"n": runs, "seed": 0, "referee": True, "shrink": False, "policy": {"name": "random"}}
    res = runner.run_scenario(scenario, run_dir=run_dir, perturb=spec)
    return result_of(res, runs, list(target or [scenario.source or scenario.id]), run_dir)
