"""printf-bisection of hangs: the last checkpoint each warp role reaches, one checkpoint per run.

    cutedebug bisect SCENARIO.toml [--window 0.5] [--no-probes] [--runs-dir runs]

For hangs the bounded-wait probes cannot bound (named barriers with a wrong count, warps that
exit before they arrive, spins on a flag in global memory, hand-written waits) and to check
what the probes say. The parent never imports cutlass; every run is a watched worker child
(forked from one fork server that imported torch and cutlass once, when it can start).

1. Baseline run: the scenario as it is (bounded-wait probes on unless ``--no-probes``), with
   checkpoint sites numbered but none enabled. It must HANG, else there is nothing to bisect.
   It yields the site table (``cutedebug.checkpoint``: program order, warp roles) and, with
   probes, the probes' own answer (stuck sites).
2. Per role, a search over that role's sites (shared prologue sites included) in program
   order. A run enables ONE site (request field ``bisect = {"site": k}``), runs without
   probes under the watchdog with a short window (``--window`` seconds from launch to kill)
   and records whether any warp reached the site (host-mapped hit counters, read live).

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

Report: ``bisect.json`` and ``bisect.md`` in the run directory (TL;DR, per role answer,
probes' answer and whether it agrees, every run, the site table, the command to reproduce).
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cutedebug.engine import runner
from cutedebug.engine import scenario as S
from cutedebug.engine import verdict as V
from cutedebug.instrument import checkpoint as C

DEFAULT_WINDOW_S = 0.5
FINISHED = V.values(lambda v: v.ran_to_completion)  # the hang vanished


# ---------------------------------------------------------------------------------------------
# Search (pure: tested on simulated kernels)
# ---------------------------------------------------------------------------------------------


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

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            last_reached=self.last_reached,
            first_unreached=self.first_unreached,
            exact=self.exact,
            between=self.between,
            started=self.started,
            finished=self.finished,
        )
        return d


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


# ---------------------------------------------------------------------------------------------
# Comparing with the probes' answer
# ---------------------------------------------------------------------------------------------


def compare_with_probes(
    searches: dict[str, RoleSearch],
    sites: dict[int, dict[str, Any]],
    stuck_sites: list[dict[str, Any]],
) -> dict[str, Any]:
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
            and st.sites.index(hit["id"]) <= st.lo
            and last is not None
            and (
                {tuple(x) for x in hit.get("loops", [])} & {tuple(x) for x in last.get("loops", [])}
            )
        ):
            verdict = "consistent"
        else:
            verdict = "disagree"
        rows[role] = {
            "probe": f"{s0.get('op')} {s0.get('barrier') or ''} at {loc}".replace("  ", " "),
            "location": loc,
            "op": s0.get("op"),
            "agreement": verdict,
            "n_stuck_warps": len(mine),
        }
    return {
        "roles": rows,
        "agree": all(r["agreement"] != "disagree" for r in rows.values()) if rows else None,
    }


def site_where(site: dict[str, Any]) -> str:
    return f"{os.path.basename(site.get('file', ''))}:{site.get('line')}"


def _site_at(st: RoleSearch, sites: dict[int, dict[str, Any]], loc: str | None):
    for sid in st.sites:
        if loc and site_where(sites[sid]) == loc:
            return sites[sid]
    return None


def grade(
    expected: dict[str, Any], searches: dict[str, RoleSearch], sites: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    """Does some role's first unreached site agree with the scenario's expected localization?
    (``stage`` is not graded: a checkpoint does not know the stage.)"""
    want = {k: v for k, v in expected.items() if k != "stage"}
    if not want:
        return {"ok": None, "expected": {}}
    for role, st in searches.items():
        if st.first_unreached is None:
            continue
        s = sites[st.first_unreached]
        got = {"role": role, "op": s.get("op"), "barrier": s.get("barrier") or None}
        # a role named after its function still plays its pipeline op's role
        op_role = (
            C.PIPELINE_OPS.get(s.get("op"), (None,))[0] if s.get("kind") == "pipeline" else None
        )
        if all(got.get(k) == v or (k == "role" and v in ("any", op_role)) for k, v in want.items()):
            return {
                "ok": True,
                "expected": want,
                "matched": {**got, "site": s["id"], "where": site_where(s)},
            }
    return {
        "ok": False,
        "expected": want,
        "why": "no role's first unreached site agrees with every expected field",
    }


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


@dataclass
class BisectResult:
    scenario: S.Scenario
    run_dir: Path
    baseline: dict[str, Any]
    sites: list[dict[str, Any]] = field(default_factory=list)
    roles: dict[str, list[int]] = field(default_factory=dict)
    searches: dict[str, RoleSearch] = field(default_factory=dict)
    runs: list[CheckpointRun] = field(default_factory=list)
    probes_answer: dict[str, Any] | None = None
    grade: dict[str, Any] = field(default_factory=dict)
    status: str = "localized"  # localized | nothing_to_bisect | no_sites | error
    reason: str = ""
    seconds: float = 0.0
    window_s: float = DEFAULT_WINDOW_S
    command: str = ""

    @property
    def by_id(self) -> dict[int, dict[str, Any]]:
        return {s["id"]: s for s in self.sites}

    @property
    def timing_bugs(self) -> list[CheckpointRun]:
        return [p for p in self.runs if p.timing_bug]

    @property
    def ok(self) -> bool:
        return self.status == "localized" and self.grade.get("ok") is not False

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "scenario": self.scenario.to_json(),
            "status": self.status,
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
            "window_s": self.window_s,
            "baseline": self.baseline,
            "sites": self.sites,
            "roles": self.roles,
            "searches": {r: s.to_json() for r, s in self.searches.items()},
            "runs": [asdict(p) | {"timing_bug": p.timing_bug} for p in self.runs],
            "n_runs": len(self.runs),
            "timing_bug": [
                {
                    "site": p.site,
                    "verdict": p.verdict,
                    "where": site_where(self.by_id[p.site]) if p.site in self.by_id else None,
                }
                for p in self.timing_bugs
            ],
            "probes_answer": self.probes_answer,
            "grade": self.grade,
            "ok": self.ok,
            "command": self.command,
        }


def describe_site(site: dict[str, Any] | None) -> str:
    if site is None:
        return "-"
    what = f"checkpoint {site['name']!r}" if site.get("kind") == "checkpoint" else site["op"]
    bar = f" {site['barrier']}" if site.get("kind") == "pipeline" and site.get("barrier") else ""
    if site.get("kind") == "named_barrier" and site.get("detail"):
        bar = f" [{site['detail']}]"
    return f"#{site['id']} {what}{bar} ({site_where(site)})"


def role_answer(st: RoleSearch, by_id: dict[int, dict[str, Any]]) -> str:
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
        all(by_id.get(s, {}).get("role") == "all" for s in st.sites[: st.hi])
        and (first or {}).get("role") != "all"
    ):
        text = (
            f"never gets past its first own site {describe_site(first)}; it passed the shared "
            f"sites up to {describe_site(last)}"
        )
    else:
        text = f"never gets past {describe_site(first)}; last reached {describe_site(last)}"
    loops_last = {tuple(x) for x in (last or {}).get("loops", [])}
    loops_first = {tuple(x) for x in (first or {}).get("loops", [])}
    outer = loops_last - loops_first
    if outer:
        f, line = sorted(outer)[0]
        text += f" (or stuck in a later iteration of the loop at {os.path.basename(f)}:{line})"
    return text


class _Runner:
    """Builds requests like runner.run_once and watches them (through the fork server)."""

    def __init__(self, scenario: S.Scenario, run_dir: Path, forkserver: Any):
        self.scenario, self.run_dir, self.fs = scenario, run_dir, forkserver
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(runner.REPO_ROOT)]
            + ([self.env["PYTHONPATH"]] if self.env.get("PYTHONPATH") else [])
        )
        self.env.update(runner.bound_env(forkserver))  # a GPU lane's binding (engine/lanes)

    def run(
        self,
        name: str,
        site: int | None,
        *,
        probes: dict[str, Any] | None,
        limits: S.Limits,
        stall_s: float | None,
    ) -> tuple[V.Classified, V.Outcome]:
        req_path, events_path, log_path = runner.write_request(
            self.run_dir / name, self.scenario, probes=probes, bisect={"site": site}
        )
        outcome, _ = runner.watch(
            runner.worker_argv(req_path),
            events_path,
            log_path,
            limits,
            env=self.env,
            stall_s=stall_s,
            forkserver=self.fs,
        )
        if (ke := outcome.event("kernel_error")) is not None:
            raise S.ScenarioError(
                ke.get("message", "kernel could not be loaded") + f"\n(worker log: {log_path})"
            )
        return V.classify(outcome), outcome


def _site_key(s: dict[str, Any]) -> tuple:
    return (s.get("op"), s.get("file"), s.get("line"), s.get("name"))


def bisect(
    scenario: S.Scenario,
    *,
    runs_root: Path | str = "runs",
    window_s: float = DEFAULT_WINDOW_S,
    probes: bool = True,
    forkserver: bool = True,
    command: str = "",
    server: Any = None,
) -> BisectResult:
    """Baseline, then per-role search; returns the result (written with ``write``).

    ``server``: a running fork server to fork the workers from (the caller's, left open);
    otherwise one is started for this bisection when ``forkserver`` is true."""
    t0 = time.monotonic()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = (
        Path(runs_root) / f"{scenario.id.replace('/', '__')}-bisect-{stamp}-{uuid.uuid4().hex[:6]}"
    ).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    if server is not None:
        return _bisect(scenario, run_dir, server, window_s, probes, command, t0)
    fs = runner.start_forkserver(run_dir) if forkserver else None
    try:
        return _bisect(scenario, run_dir, fs, window_s, probes, command, t0)
    finally:
        if fs is not None:
            fs.close()


def _bisect(
    sc: S.Scenario, run_dir: Path, fs: Any, window_s: float, probes: bool, command: str, t0: float
) -> BisectResult:
    r = _Runner(sc, run_dir, fs)
    lim = sc.limits
    probe_cfg = {"budget_ns": int(lim.wait_budget_ms) * 1_000_000} if probes else None
    base_limits = (
        lim
        if probes
        else S.Limits(**{**vars(lim), "deadline_s": min(lim.deadline_s, max(2.0, 4 * window_s))})
    )
    tb = time.monotonic()
    cls, out = r.run(
        "baseline",
        None,
        probes=probe_cfg,
        limits=base_limits,
        stall_s=lim.stall_s if probes else None,
    )
    table = out.event("checkpoint_sites") or {}
    baseline = {
        "verdict": cls.verdict.value,
        "reason": cls.reason,
        "probes": probes,
        "seconds": round(time.monotonic() - tb, 3),
        "dir": "baseline",
        "compile_s": (out.event("compiled") or {}).get("secs"),
    }
    res = BisectResult(
        scenario=sc,
        run_dir=run_dir,
        baseline=baseline,
        sites=table.get("sites") or [],
        roles=table.get("roles") or {},
        window_s=window_s,
        command=command,
    )
    if probes and (pe := runner.probe_evidence(out)):
        baseline["stuck_sites"] = pe.get("stuck_sites", [])
        baseline["diagnosis"] = pe.get("diagnosis", [])
    if cls.verdict is not V.Verdict.HANG:
        res.status, res.reason = (
            "nothing_to_bisect",
            (f"the baseline run is {cls.verdict.value}, not HANG: {cls.reason[:300]}"),
        )
    elif not res.sites:
        res.status, res.reason = "no_sites", "the kernel has no checkpoint sites"
    if res.status != "localized":
        res.seconds = time.monotonic() - t0
        return res

    run_limits = S.Limits(**{**vars(lim), "deadline_s": window_s})
    base_keys = [_site_key(s) for s in res.sites]

    def run_site(site: int, role: str) -> CheckpointRun:
        name = f"run{len(oracle.order) + 1:02d}-site{site}"
        ts = time.monotonic()
        cls, out = r.run(name, site, probes=None, limits=run_limits, stall_s=None)
        seconds = round(time.monotonic() - ts, 3)
        mark = out.event("checkpoint") or {}
        tab = out.event("checkpoint_sites") or {}
        verdict, note, reached = cls.verdict.value, "", None
        if [_site_key(s) for s in tab.get("sites") or []] != base_keys:
            note = "the site table differs from the baseline's"
        elif tab.get("emitted") != 1:
            note = f"checkpoint emitted {tab.get('emitted')} times at trace time"
        elif cls.verdict is V.Verdict.HANG:
            if not mark:
                note = "no checkpoint event (marks not read)"
            else:
                reached = bool(mark.get("reached"))
        elif verdict in FINISHED:
            note = "the hang vanished with this checkpoint enabled: timing bug"
        else:
            note = cls.reason[:160]
        return CheckpointRun(
            site=site,
            reached=reached,
            verdict=verdict,
            seconds=seconds,
            role=role,
            hits=int(mark.get("hits", 0)),
            warps=int(mark.get("n_warps", 0)),
            ctas=int(mark.get("ctas", 0)),
            note=note,
            run_dir=name,
        )

    oracle = Oracle(run_site)
    res.searches = search_all(res.roles, oracle)
    res.runs = oracle.order
    res.grade = grade(sc.expect.localization(), res.searches, res.by_id)
    if baseline.get("stuck_sites"):
        res.probes_answer = compare_with_probes(res.searches, res.by_id, baseline["stuck_sites"])
    res.seconds = time.monotonic() - t0
    return res
