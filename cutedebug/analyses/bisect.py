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

The search (its definitions of *reached* and the *hang point*, the run budget, what an
inconclusive or non-monotone run does) is ``cutedebug.analyses.bisect_search``; comparing its
answer with the probes' and with the scenario's expectation, and saying it in words, is
``cutedebug.analyses.bisect_answer``; this module makes the runs.

Report: ``bisect.json`` and ``bisect.md`` in the run directory (TL;DR, per role answer,
probes' answer and whether it agrees, every run, the site table, the command to reproduce).
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutedebug.analyses.bisect_answer import compare_with_probes, grade, role_answer, site_where
from cutedebug.analyses.bisect_record import (
    SCHEMA_VERSION,
    Baseline,
    BisectReport,
    Grade,
    ProbesAnswer,
    TimingBug,
)
from cutedebug.analyses.bisect_search import (
    FINISHED,
    CheckpointRun,
    Oracle,
    RoleSearch,
    run_budget,
    search_all,
    search_role,
)
from cutedebug.engine import lifeline, runner
from cutedebug.engine import scenario as S
from cutedebug.engine import verdict as V
from cutedebug.event_kinds import Checkpoint, CheckpointSites, Compiled, KernelError
from cutedebug.instrument.checkpoint import CheckpointSite
from cutedebug.instrument.launch_gpu import release_gpu_token
from cutedebug.records import ABSENT

# The bisection's names in one place (``from cutedebug.analyses import bisect as B``).
__all__ = [
    "DEFAULT_WINDOW_S",
    "FINISHED",
    "Baseline",
    "BisectReport",
    "BisectResult",
    "CheckpointRun",
    "Grade",
    "ProbesAnswer",
    "Oracle",
    "RoleSearch",
    "bisect",
    "compare_with_probes",
    "grade",
    "role_answer",
    "run_budget",
    "search_all",
    "search_role",
    "site_where",
]

DEFAULT_WINDOW_S = 0.5


@dataclass
class BisectResult:
    scenario: S.Scenario
    run_dir: Path
    baseline: Baseline
    sites: list[CheckpointSite] = field(default_factory=list)  # program order
    roles: dict[str, list[int]] = field(default_factory=dict)
    searches: dict[str, RoleSearch] = field(default_factory=dict)
    runs: list[CheckpointRun] = field(default_factory=list)
    probes_answer: ProbesAnswer | None = None
    grade: Grade = field(default_factory=Grade)
    status: str = "localized"  # localized | nothing_to_bisect | no_sites | error
    reason: str = ""
    seconds: float = 0.0
    window_s: float = DEFAULT_WINDOW_S
    command: str = ""

    @property
    def by_id(self) -> dict[int, CheckpointSite]:
        return {s.id: s for s in self.sites}

    @property
    def timing_bugs(self) -> list[CheckpointRun]:
        return [p for p in self.runs if p.timing_bug]

    @property
    def ok(self) -> bool:
        return self.status == "localized" and self.grade.passed is not False

    def report(self) -> BisectReport:
        """bisect.json's record."""
        by_id = self.by_id
        return BisectReport(
            schema_version=SCHEMA_VERSION,
            scenario=self.scenario.to_json(),
            status=self.status,
            reason=self.reason,
            seconds=round(self.seconds, 3),
            window_s=self.window_s,
            baseline=self.baseline,
            sites=list(self.sites),
            roles=self.roles,
            searches={r: s.record() for r, s in self.searches.items()},
            runs=[p.record() for p in self.runs],
            n_runs=len(self.runs),
            timing_bug=[
                TimingBug(
                    site=p.site,
                    verdict=p.verdict,
                    where=site_where(by_id[p.site]) if p.site in by_id else None,
                )
                for p in self.timing_bugs
            ],
            probes_answer=self.probes_answer,
            grade=self.grade,
            ok=self.ok,
            command=self.command,
        )

    def to_json(self) -> dict[str, Any]:
        return self.report().to_json()


class _Runner:
    """Builds requests like runner.run_once and watches them (through the fork server)."""

    def __init__(
        self, scenario: S.Scenario, run_dir: Path, forkserver: Any, gpu_token: str | None = None
    ):
        self.scenario, self.run_dir, self.fs = scenario, run_dir, forkserver
        self.gpu_token = gpu_token  # each run takes it before its launch (engine/lanes.py)
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
        token = {"gpu_token": self.gpu_token} if self.gpu_token else {}
        req_path, events_path, log_path = runner.write_request(
            self.run_dir / name, self.scenario, probes=probes, bisect={"site": site}, **token
        )
        tag = lifeline.new_run_tag()  # known before the run: the token goes back however
        if self.gpu_token:  # it ends, and the keeper gives it back if this process dies
            lifeline.guard_token(self.gpu_token, tag)
        try:
            outcome, _ = runner.watch(
                runner.worker_argv(req_path),
                events_path,
                log_path,
                limits,
                env=self.env,
                stall_s=stall_s,
                forkserver=self.fs,
                tag=tag,
            )
        finally:
            if self.gpu_token:  # the worker and everything it started ended: the GPU is free
                release_gpu_token(self.gpu_token, tag)
                lifeline.unguard_token(self.gpu_token, tag)
        if (ke := outcome.last(KernelError)) is not None:
            raise S.ScenarioError(
                (ke.message or "kernel could not be loaded") + f"\n(worker log: {log_path})"
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
    gpu_token: str | None = None,
) -> BisectResult:
    """Baseline, then per-role search; returns the result (written with ``write``).

    ``server``: a running fork server to fork the workers from (the caller's, left open);
    otherwise one is started for this bisection when ``forkserver`` is true. ``gpu_token``:
    a GPU's token (engine/lanes.py): each run compiles without it and launches holding it."""
    t0 = time.monotonic()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = (
        Path(runs_root) / f"{scenario.id.replace('/', '__')}-bisect-{stamp}-{uuid.uuid4().hex[:6]}"
    ).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    if server is not None:
        return _bisect(scenario, run_dir, server, window_s, probes, command, t0, gpu_token)
    fs = runner.start_forkserver(run_dir) if forkserver else None
    try:
        return _bisect(scenario, run_dir, fs, window_s, probes, command, t0, gpu_token)
    finally:
        if fs is not None:
            fs.close()


def _bisect(
    sc: S.Scenario,
    run_dir: Path,
    fs: Any,
    window_s: float,
    probes: bool,
    command: str,
    t0: float,
    gpu_token: str | None = None,
) -> BisectResult:
    r = _Runner(sc, run_dir, fs, gpu_token)
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
    table = out.last(CheckpointSites) or CheckpointSites()
    pe = runner.probe_evidence(out) if probes else None
    baseline = Baseline(
        verdict=cls.verdict.value,
        reason=cls.reason,
        probes=probes,
        seconds=round(time.monotonic() - tb, 3),
        dir="baseline",
        compile_s=(out.last(Compiled) or Compiled()).secs,
        stuck_sites=pe.get("stuck_sites", []) if pe else ABSENT,
        diagnosis=pe.get("diagnosis", []) if pe else ABSENT,
    )
    res = BisectResult(
        scenario=sc,
        run_dir=run_dir,
        baseline=baseline,
        sites=[
            CheckpointSite.from_json(s, f"checkpoint_sites.sites[{i}]")
            for i, s in enumerate(table.sites or [])
        ],
        roles=table.roles or {},
        window_s=window_s,
        command=command,
    )
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
    base_keys = [_site_key(s) for s in table.sites or []]

    def run_site(site: int, role: str) -> CheckpointRun:
        name = f"run{len(oracle.order) + 1:02d}-site{site}"
        ts = time.monotonic()
        cls, out = r.run(name, site, probes=None, limits=run_limits, stall_s=None)
        seconds = round(time.monotonic() - ts, 3)
        mark = out.last(Checkpoint)
        tab = out.last(CheckpointSites) or CheckpointSites()
        verdict, note, reached = cls.verdict.value, "", None
        if [_site_key(s) for s in tab.sites or []] != base_keys:
            note = "the site table differs from the baseline's"
        elif tab.emitted != 1:
            note = f"checkpoint emitted {tab.emitted} times at trace time"
        elif cls.verdict is V.Verdict.HANG:
            if mark is None:
                note = "no checkpoint event (marks not read)"
            else:
                reached = bool(mark.reached)
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
            hits=int(mark.hits or 0) if mark else 0,
            warps=int(mark.n_warps or 0) if mark else 0,
            ctas=int(mark.ctas or 0) if mark else 0,
            note=note,
            run_dir=name,
        )

    oracle = Oracle(run_site)
    res.searches = search_all(res.roles, oracle)
    res.runs = oracle.order
    res.grade = grade(sc.expect.localization(), res.searches, res.by_id)
    if baseline.stuck_sites:
        res.probes_answer = compare_with_probes(res.searches, res.by_id, baseline.stuck_sites)
    res.seconds = time.monotonic() - t0
    return res
