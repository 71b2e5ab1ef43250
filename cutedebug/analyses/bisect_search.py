"""printf-bisection's search (pure: tested on simulated kernels): per warp role, the hang point
among its checkpoint sites, one enabled site per run, no site run twice.

Definitions. Sites of a role are s_0 .. s_{n-1} in program (trace) order. A site is *reached*
when at least one warp executed it, and for a blocking op, got past it, at least once during
the hanging run; a site inside a loop counts as reached after its first iteration. The
search assumes reached(s_i) is a prefix property (true for i < h, false from h on) and finds
h, the *hang point*: ``first_unreached`` = s_h, the first site in program order that the role
never gets past, and ``last_reached`` = s_{h-1}. The role is stuck between the two; when
``last_reached`` is inside a loop that ``first_unreached`` is not, it may equally be stuck in a
later iteration of that loop (the report says so). h = 0: the role never reached its first
site (it never started, or is stuck before it); h = n: it reached every site (it is not
stuck, or stuck after its last site or in a later loop iteration). Both neighbours of the
answer were run (or remembered from another role), so the boundary is observed, not inferred,
unless runs were inconclusive.

Search. Exponential probe from the role's start (s_0: did it start at all? then lo + 1, 2, 4,
... past the last reached site) while its worst case still fits the budget, then binary
search. Budget per role: ceil(log2(n)) + 2 runs; a gallop probe is taken only if, whatever
it answers, the rest can still finish by binary search within the budget, so with conclusive
runs the answer is exact within the bound (for many sites the gallop stops after s_0 and s_1:
an early hang costs one or two runs). Results are memoized across roles: no site runs twice.

Non-monotone answers. A run whose verdict is not HANG (the checkpoint made the hang vanish:
PASS or MISMATCH) is a *timing bug* signal: the report flags it with the site whose probe did
it. Such runs, and runs that crashed or failed to compile, are *inconclusive*: the search
avoids them; the budget stays a hard bound, so when they cost runs near the boundary the
answer is an interval (its unresolved sites are listed) instead of one site.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from cutedebug import records
from cutedebug.engine import verdict as V

FINISHED = V.values(lambda v: v.ran_to_completion)  # the hang vanished


def run_budget(n_sites: int) -> int:
    """Most runs one role's search may spend: ceil(log2(n)) + 2."""
    return math.ceil(math.log2(max(n_sites, 1))) + 2


def _clog2(m: int) -> int:
    """Runs a binary search needs to pick one of m outcomes."""
    return math.ceil(math.log2(m)) if m > 1 else 0


@dataclass
class CheckpointRun:
    """One run with one checkpoint enabled. ``reached`` is None when inconclusive."""

    site: int
    reached: bool | None
    verdict: str
    seconds: float = 0.0
    role: str = ""  # the role whose search asked for it
    hits: int = 0
    warps: int = 0
    ctas: int = 0
    note: str = ""
    run_dir: str = ""

    @property
    def timing_bug(self) -> bool:
        return self.verdict in FINISHED

    def record(self) -> RunRecord:
        """The run as bisect.json lists it (with ``timing_bug``)."""
        return RunRecord(
            site=self.site,
            reached=self.reached,
            verdict=self.verdict,
            seconds=self.seconds,
            role=self.role,
            hits=self.hits,
            warps=self.warps,
            ctas=self.ctas,
            note=self.note,
            run_dir=self.run_dir,
            timing_bug=self.timing_bug,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord(records.Record):
    """A ``CheckpointRun`` in bisect.json's ``runs``."""

    site: int
    reached: bool | None
    verdict: str
    seconds: float
    role: str
    hits: int
    warps: int
    ctas: int
    note: str
    run_dir: str
    timing_bug: bool  # the hang vanished with this checkpoint enabled


class Oracle:
    """Memoizing front of ``run(site) -> CheckpointRun``: no site runs twice."""

    def __init__(self, run: Callable[[int, str], CheckpointRun]):
        self._run = run
        self.results: dict[int, CheckpointRun] = {}
        self.order: list[CheckpointRun] = []

    def known(self, site: int) -> bool:
        return site in self.results

    def __call__(self, site: int, role: str = "") -> bool | None:
        if site not in self.results:
            probe = self._run(site, role)
            probe.role = probe.role or role
            self.results[site] = probe
            self.order.append(probe)
        return self.results[site].reached


@dataclass
class RoleSearch:
    role: str
    sites: list[int]
    lo: int  # index of the last site known reached (-1: none)
    hi: int  # index of the first site known unreached (n: none)
    runs: int = 0
    budget: int = 0
    asked: list[int] = field(default_factory=list)  # site ids in the order this search used
    inconclusive: list[int] = field(default_factory=list)
    non_monotone: list[str] = field(default_factory=list)

    @property
    def last_reached(self) -> int | None:
        return self.sites[self.lo] if self.lo >= 0 else None

    @property
    def first_unreached(self) -> int | None:
        return self.sites[self.hi] if self.hi < len(self.sites) else None

    @property
    def exact(self) -> bool:
        return self.hi - self.lo == 1

    @property
    def between(self) -> list[int]:
        """Sites strictly between the answer's two ends: unresolved (inconclusive, or not run
        because inconclusive runs spent the budget)."""
        return self.sites[self.lo + 1 : self.hi]

    @property
    def started(self) -> bool:
        return self.lo >= 0

    @property
    def finished(self) -> bool:
        return self.exact and self.hi == len(self.sites)

    def record(self) -> SearchRecord:
        """The search as bisect.json lists it: its state and its answer."""
        return SearchRecord(
            role=self.role,
            sites=list(self.sites),
            lo=self.lo,
            hi=self.hi,
            runs=self.runs,
            budget=self.budget,
            asked=list(self.asked),
            inconclusive=list(self.inconclusive),
            non_monotone=list(self.non_monotone),
            last_reached=self.last_reached,
            first_unreached=self.first_unreached,
            exact=self.exact,
            between=self.between,
            started=self.started,
            finished=self.finished,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchRecord(records.Record):
    """A ``RoleSearch`` in bisect.json's ``searches``: its fields, then its answer (the
    properties of the same names)."""

    role: str
    sites: list[int]
    lo: int
    hi: int
    runs: int
    budget: int
    asked: list[int]
    inconclusive: list[int]
    non_monotone: list[str]
    last_reached: int | None
    first_unreached: int | None
    exact: bool
    between: list[int]
    started: bool
    finished: bool


def search_role(role: str, sites: list[int], oracle: Oracle) -> RoleSearch:
    """Find the hang point of one role (see the module docstring for the definitions)."""
    n = len(sites)
    st = RoleSearch(role=role, sites=list(sites), lo=-1, hi=n, budget=run_budget(n))
    inconclusive: set[int] = set()

    def absorb(i: int) -> None:
        reached = oracle.results[sites[i]].reached
        if reached is None:
            inconclusive.add(i)
        elif reached and i > st.lo:
            st.lo = i
        elif not reached and i < st.hi:
            st.hi = i

    for i, sid in enumerate(sites):  # what other roles' runs already answered
        if oracle.known(sid) and oracle.results[sid].reached is not False:
            absorb(i)
    for i, sid in enumerate(sites):
        if oracle.known(sid) and oracle.results[sid].reached is False and i > st.lo:
            absorb(i)
    galloping, step = True, 0
    while st.hi - st.lo > 1:
        free = [i for i in range(st.lo + 1, st.hi) if i not in inconclusive]
        if not free:
            break
        mid = st.lo + (st.hi - st.lo + 1) // 2
        target = mid
        from_lo = False
        if galloping:
            g = 0 if st.lo < 0 else st.lo + (1 << step)  # first: did the role start at all?
            if g < st.hi and st.runs + 1 + max(_clog2(st.hi - g), _clog2(g - st.lo)) <= st.budget:
                target, from_lo = g, st.lo >= 0
        i = min(free, key=lambda j: (abs(j - target), j))
        if not oracle.known(sites[i]):
            if st.runs >= st.budget:
                break
            st.runs += 1
        st.asked.append(sites[i])
        reached = oracle(sites[i], role)
        absorb(i)
        if reached is True and from_lo and i == target:
            step += 1
        elif reached is False:
            galloping = False
    st.inconclusive = [sites[i] for i in sorted(inconclusive)]
    for i, sid in enumerate(sites):
        p = oracle.results.get(sid)
        if p is None or p.reached is None:
            continue
        if p.reached and i > st.hi:
            st.non_monotone.append(
                f"site {sid} reached after the first unreached site "
                f"{sites[st.hi]} (a branch not taken, or a loop exit?)"
            )
        elif not p.reached and i < st.lo:
            st.non_monotone.append(
                f"site {sid} not reached before the last reached site "
                f"{sites[st.lo]} (a branch not taken?)"
            )
    return st


def search_all(roles: dict[str, list[int]], oracle: Oracle) -> dict[str, RoleSearch]:
    return {role: search_role(role, sites, oracle) for role, sites in roles.items()}
