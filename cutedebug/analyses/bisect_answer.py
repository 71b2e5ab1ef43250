"""Reading a bisection's answer: against the bounded-wait probes' stuck sites, against the
scenario's expected localization, and in words (one sentence per role)."""

from __future__ import annotations

import os
from typing import Any

from cutedebug.analyses.bisect_record import Grade, GradeMatch, ProbesAnswer, RoleAgreement
from cutedebug.analyses.bisect_search import RoleSearch
from cutedebug.instrument import checkpoint as C
from cutedebug.instrument.checkpoint import CheckpointSite


def compare_with_probes(
    searches: dict[str, RoleSearch],
    sites: dict[int, CheckpointSite],
    stuck_sites: list[dict[str, Any]],
) -> ProbesAnswer:
    """Per role: does the bounded-wait probes' stuck site agree with the bisection?

    agree: the probes' stuck wait is the role's first unreached site (same file:line).
    consistent: the probes' stuck wait is a site the role reached at least once, in a loop
    that also holds its last reached site: it is stuck in a later iteration of that loop.
    disagree: anything else. Roles the probes say nothing about are left out.
    """
    rows = {}
    for role, st in searches.items():
        mine = [
            s
            for s in stuck_sites
            if s.get("role") in (role, "waiter") and _site_at(st, sites, s.get("location"))
        ]
        mine = mine or [s for s in stuck_sites if s.get("role") == role]
        if not mine:
            continue
        s0 = mine[0]
        loc = s0.get("location")
        first = sites.get(st.first_unreached) if st.first_unreached is not None else None
        last = sites.get(st.last_reached) if st.last_reached is not None else None
        hit = _site_at(st, sites, loc)
        if first is not None and site_where(first) == loc:
            verdict = "agree"
        elif (
            hit is not None
            and st.sites.index(hit.id) <= st.lo
            and last is not None
            and ({tuple(x) for x in hit.loops} & {tuple(x) for x in last.loops})
        ):
            verdict = "consistent"
        else:
            verdict = "disagree"
        rows[role] = RoleAgreement(
            probe=f"{s0.get('op')} {s0.get('barrier') or ''} at {loc}".replace("  ", " "),
            location=loc,
            op=s0.get("op"),
            agreement=verdict,
            n_stuck_warps=len(mine),
        )
    return ProbesAnswer(
        roles=rows,
        agree=all(r.agreement != "disagree" for r in rows.values()) if rows else None,
    )


def site_where(site: CheckpointSite) -> str:
    return site.where


def _site_at(
    st: RoleSearch, sites: dict[int, CheckpointSite], loc: str | None
) -> CheckpointSite | None:
    for sid in st.sites:
        if loc and site_where(sites[sid]) == loc:
            return sites[sid]
    return None


def grade(
    expected: dict[str, Any], searches: dict[str, RoleSearch], sites: dict[int, CheckpointSite]
) -> Grade:
    """Does some role's first unreached site agree with the scenario's expected localization?
    (``stage`` is not graded: a checkpoint does not know the stage.)"""
    want = {k: v for k, v in expected.items() if k != "stage"}
    if not want:
        return Grade(ok=None, expected={})
    for role, st in searches.items():
        if st.first_unreached is None:
            continue
        s = sites[st.first_unreached]
        got = {"role": role, "op": s.op, "barrier": s.barrier or None}
        # a role named after its function still plays its pipeline op's role
        op_role = C.PIPELINE_OPS.get(s.op, (None,))[0] if s.kind == "pipeline" else None
        if all(got.get(k) == v or (k == "role" and v in ("any", op_role)) for k, v in want.items()):
            return Grade(
                ok=True,
                expected=want,
                matched=GradeMatch(**got, site=s.id, where=site_where(s)),
            )
    return Grade(
        ok=False,
        expected=want,
        why="no role's first unreached site agrees with every expected field",
    )


def describe_site(site: CheckpointSite | None) -> str:
    if site is None:
        return "-"
    what = f"checkpoint {site.name!r}" if site.kind == "checkpoint" else site.op
    bar = f" {site.barrier}" if site.kind == "pipeline" and site.barrier else ""
    if site.kind == "named_barrier" and site.detail:
        bar = f" [{site.detail}]"
    return f"#{site.id} {what}{bar} ({site_where(site)})"


def role_answer(st: RoleSearch, by_id: dict[int, CheckpointSite]) -> str:
    """One sentence: where this role is stuck."""
    last, first = by_id.get(st.last_reached), by_id.get(st.first_unreached)
    if st.finished:
        return f"reached every site (last: {describe_site(last)}): not stuck at a site of its own"
    if not st.exact:
        gap = ", ".join(
            describe_site(by_id.get(s))
            + (" (inconclusive)" if s in st.inconclusive else " (not run: budget spent)")
            for s in st.between
        )
        return f"between {describe_site(last)} and {describe_site(first)}; unresolved: {gap}"
    if st.lo < 0:
        return f"never reached its first site {describe_site(first)}: never started or stuck before"
    if (
        all(getattr(by_id.get(s), "role", None) == "all" for s in st.sites[: st.hi])
        and (first.role if first else None) != "all"
    ):
        text = (
            f"never gets past its first own site {describe_site(first)}; it passed the shared "
            f"sites up to {describe_site(last)}"
        )
    else:
        text = f"never gets past {describe_site(first)}; last reached {describe_site(last)}"
    loops_last = {tuple(x) for x in (last.loops if last else [])}
    loops_first = {tuple(x) for x in (first.loops if first else [])}
    outer = loops_last - loops_first
    if outer:
        f, line = sorted(outer)[0]
        text += f" (or stuck in a later iteration of the loop at {os.path.basename(f)}:{line})"
    return text
