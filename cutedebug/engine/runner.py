"""The parent side of one scenario: write the worker's request, run it under the watchdog
(:mod:`cutedebug.engine.watchdog`), classify what happened, check the GPU after a kill.

Never imports torch or cutlass. Launching, watching, killing and sweeping are the
watchdog's and the lifeline's (:mod:`cutedebug.engine.lifeline`); this module only decides
what to run and what the result means.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutedebug.engine import health, lifeline, perturb_runs, watchdog
from cutedebug.engine import timings as timings_mod
from cutedebug.engine import verdict as V
from cutedebug.engine.compile_checks import CompileCheck, references
from cutedebug.engine.probe_evidence import (  # noqa: F401  (callers reach them here)
    probe_evidence,
    probe_picture,
)
from cutedebug.engine.scenario import Limits, Scenario, ScenarioError
from cutedebug.event_kinds import Checked, Compiled, Device, Done, KernelError
from cutedebug.instrument.launch_gpu import release_gpu_token

REPO_ROOT = watchdog.REPO_ROOT


@dataclass
class RunResult:
    scenario: Scenario
    verdict: V.Verdict
    reason: str
    run_dir: Path
    outcome: V.Outcome
    evidence: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    health: dict[str, Any] | None = None
    repeats: list[dict[str, Any]] = field(default_factory=list)
    mode: str = "run"
    command: str = ""
    probes_used: bool | None = None  # False: probes were off, nothing could localize

    @property
    def verdict_ok(self) -> bool:
        """The verdict (every repeat's, when the runs disagreed) is one the scenario expects."""
        if self.repeats:
            return all(self.scenario.expect.accepts(r["verdict"]) for r in self.repeats)
        return self.scenario.expect.accepts(self.verdict.value)

    @property
    def localization(self) -> dict[str, Any]:
        expect, core = self.scenario.expect, self.evidence.get("coredump_grade")
        if expect.localized_by != "probes":
            if core is not None and self.verdict.value not in expect.also:
                # the core answers in bisection's terms (cutedebug.analyses.coredump)
                return {**core, "by": "coredump"}
            return {
                "ok": None,
                "expected": expect.localization(),
                "matched": None,
                "why": f"graded by `cutedebug {expect.localized_by}`, not by a run",
            }
        if self.verdict.value in expect.also:
            # The localization describes the expected verdict (where the hang sits), not the
            # timing-dependent alternative this run gave.
            return {
                "ok": None,
                "expected": expect.localization(),
                "matched": None,
                "why": f"{self.verdict.value} is one of expect.also; the localization "
                f"describes a {expect.verdict}",
            }
        if core is not None and self.probes_used is False:  # role, op, barrier: not the stage
            return {**core, "by": "coredump"}
        if (
            self.probes_used is False
            and expect.localization()
            and not self.evidence.get("stuck_sites")
        ):
            return {
                "ok": None,
                "expected": expect.localization(),
                "matched": None,
                "why": "not graded: the run had no probes (--no-probes, or the scenario's "
                "probes off and no hang to rerun), so no stuck site could be reported",
            }
        return grade_localization(expect.localization(), self.evidence.get("stuck_sites", []))

    @property
    def expected(self) -> bool:
        if self.mode == "compile":
            return self.outcome.last(Compiled) is not None
        loc = self.localization
        return self.verdict_ok and loc["ok"] is not False


def grade_localization(expected: dict[str, Any], sites: list[dict[str, Any]]) -> dict[str, Any]:
    """Does any stuck site agree with every expected field? ok=None when nothing is expected."""
    if not expected:
        return {"ok": None, "expected": {}, "matched": None}
    for site in sites:
        if all(site.get(k) == v or (k == "role" and v == "any") for k, v in expected.items()):
            return {"ok": True, "expected": expected, "matched": site}
    return {
        "ok": False,
        "expected": expected,
        "matched": None,
        "why": "no stuck site was reported"
        if not sites
        else "no stuck site agrees with every expected field",
    }


# ---- process handling: the watchdog and the lifeline (kept here under their old names) ------
TAG_VAR = lifeline.RUN_TAG_VAR
tagged_processes = lifeline.processes
sweep = lifeline.sweep
kill_tree = watchdog.kill_tree
watch = watchdog.watch
EventReader = watchdog.EventReader
_tail = watchdog.tail
_phase_deadline = watchdog.phase_deadline
MAX_EVENT_LINE = watchdog.MAX_EVENT_LINE
# Before-kill hooks ({"pid", "tag", "reason", "log_path", "events_path", "phase"} -> facts or
# None), e.g. a GPU coredump (cutedebug.analyses.coredump.before_kill): the watchdog's list.
BEFORE_KILL = watchdog.BEFORE_KILL
POLL_S = watchdog.POLL_S
# A run's seconds (work, phases) are computed in engine/timings.py.
_timings = timings_mod.timings
BREAKDOWN, breakdown, work_s = timings_mod.BREAKDOWN, timings_mod.breakdown, timings_mod.work_s
# The GPU health check (engine/health.py), named here where callers and tests reach it.
health_check = health.health_check
_health_result = health._health_result


def new_run_dir(scenario: Scenario, root: Path | str = "runs") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = scenario.id.replace("/", "__") + f"-{stamp}-{uuid.uuid4().hex[:6]}"
    d = Path(root) / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def start_forkserver(
    runs_root: Path | str = "runs", *, gpu: str | None = None, preload: Sequence[str] = ()
):
    """A fork server for many runs in a row (each run then skips the torch/cutlass imports).
    Returns None when it cannot start; callers then spawn fresh workers. ``gpu``: bind the
    server, and so every worker and health check forked from it, to that GPU (a
    CUDA_VISIBLE_DEVICES entry); the server's ``bind_env`` says so to fresh processes too.
    ``preload``: library modules the runs will need (preloads.modules_of_scenarios), imported
    in the server before it returns, so that no run's clock counts them; the server's answer
    is kept as ``preloaded`` (what it holds, the seconds, or why preloading is off)."""
    from cutedebug.engine.forkserver import ForkServer

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    bind = {} if gpu is None else {"CUDA_VISIBLE_DEVICES": gpu}
    env.update(bind)
    try:
        log = Path(runs_root) / "forkserver.log"
        server = ForkServer(env, str(REPO_ROOT), log, bind_env=bind).start()
    except (OSError, RuntimeError, ValueError):
        return None
    preload_forkserver(server, preload)
    return server


def preload_forkserver(server, preload: Sequence[str]) -> None:
    """Have a started fork server import ``preload`` now; its answer is kept as the server's
    ``preloaded`` (what it holds, the seconds, or why preloading is off). Nothing when
    ``preload`` is empty."""
    if preload:
        try:
            server.preloaded = server.preload_modules(list(preload))
        except (OSError, RuntimeError, ValueError) as e:
            server.preloaded = {"preloaded": [], "preload": f"off: {e}"}


def bound_env(forkserver) -> dict[str, str]:
    """The GPU binding of a fork server started for one GPU (engine/lanes.py), which a fresh
    process replacing a forked one must carry too; {} otherwise."""
    return dict(getattr(forkserver, "bind_env", None) or {})


def worker_argv(request_path: Path) -> list[str]:
    return [sys.executable, "-m", "cutedebug.engine.worker", str(request_path)]


def _evidence(o: V.Outcome, facts: dict[str, Any]) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "phase": o.phase,
        "returncode": o.returncode,
        "killed_by_watchdog": o.killed_by_watchdog,
    }
    for name in (
        "device",
        "compiled",
        "checked",
        "cuda_error",
        "compile_error",
        "unsupported",
        "probe_report",
        "harness_error",
    ):
        e = o.event(name)
        if e is not None:
            ev[name] = e.fields  # the payload (the worker's events carry no pid / wall)
    pe = probe_evidence(o)
    if pe:
        ev.update(pe)
    ev.update(perturb_runs.evidence(o))
    if facts.get("pool"):
        ev["pool"] = facts["pool"]
    if facts.get("swept") or facts.get("swept_after_exit"):
        ev["swept_pids"] = sorted(set(facts.get("swept", []) + facts.get("swept_after_exit", [])))
    if o.malformed_lines:
        ev["malformed_lines"] = o.malformed_lines[:5]
    return ev


def write_request(
    sub: Path,
    scenario: Scenario,
    *,
    mode: str = "run",
    probes: dict[str, Any] | None = None,
    lineinfo: bool = False,
    compile_checks: Sequence[CompileCheck] = (),
    **extra: Any,
) -> tuple[Path, Path, Path]:
    """The worker's request.json in ``sub`` (created), with an empty event file beside it.
    ``compile_checks``: engine/compile_checks.py. ``extra``: further request fields
    (``bisect``). Returns (request, events, log) paths."""
    sub = Path(sub).resolve()
    sub.mkdir(parents=True, exist_ok=True)
    events_path, log_path = sub / "events.jsonl", sub / "worker.log"
    events_path.write_text("")
    request = {
        "scenario": scenario.to_json(),
        "mode": mode,
        "events": str(events_path),
        "probes": probes,
        "lineinfo": lineinfo,
        "ptx_path": str(sub / "kernel.ptx"),
        "dump_dir": str(sub),
        "compile_checks": references(compile_checks),
        **extra,
    }
    req_path = sub / "request.json"
    req_path.write_text(json.dumps(request, indent=1))
    return req_path, events_path, log_path


def run_once(
    scenario: Scenario,
    run_dir: Path,
    *,
    mode: str = "run",
    probes: dict[str, Any] | None = None,
    lineinfo: bool = False,
    index: int = 0,
    wrap=None,
    extra_env: dict[str, str] | None = None,
    deadline_scale: float = 1.0,
    forkserver=None,
    request_extra: dict[str, Any] | None = None,
    gpu_token: str | None = None,
    tag: str | None = None,
) -> tuple[V.Classified, V.Outcome, dict[str, Any]]:
    """``request_extra``: further request fields (e.g. ``compile_checks``, the coredump
    run's ``env``, ``cubin_path``, ``wait_sites``; see the worker). ``gpu_token``: the worker
    takes it before its launch and keeps it; the caller gives it back (run_scenario)."""
    # Absolute: the worker runs in the repository root, not in the caller's directory.
    run_dir = Path(run_dir).resolve()
    sub = run_dir if index == 0 else run_dir / f"repeat{index}"
    extra = dict(request_extra or {})
    if gpu_token and mode == "run":
        extra["gpu_token"] = str(gpu_token)
    req_path, events_path, log_path = write_request(
        sub, scenario, mode=mode, probes=probes, lineinfo=lineinfo, **extra
    )
    argv = worker_argv(req_path)
    if wrap is not None:
        argv = wrap(argv, sub)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.update(extra_env or {})
    env.update(bound_env(forkserver))
    if wrap is None:
        # skip the worker's interpreter teardown; a wrapper (compute-sanitizer) reports at exit
        env.setdefault("CUTEDEBUG_FAST_EXIT", "1")
    limits = scenario.limits
    if deadline_scale != 1.0:
        limits = Limits(
            **{k: (v * deadline_scale if k.endswith("_s") else v) for k, v in vars(limits).items()}
        )
    stall = limits.stall_s if probes else None
    # The fork server imported cutlass already: runs that change its environment, or that
    # something else must wrap (compute-sanitizer), get a fresh process.
    use_fork = (
        forkserver is not None
        and wrap is None
        and not extra_env
        and not lineinfo
        and not forkserver.closed
    )
    t_call = time.monotonic()
    outcome, facts = watch(
        argv,
        events_path,
        log_path,
        limits,
        env=env,
        stall_s=stall,
        forkserver=forkserver if use_fork else None,
        tag=tag,
    )
    facts["t_call"], facts["t_return"] = t_call, time.monotonic()
    if facts.get("forked") and hasattr(forkserver, "pool_info"):
        facts["pool"] = forkserver.pool_info()  # forked by the warm pool (engine/pool.py)
        facts["pool"]["spare"] = bool(facts.get("spare"))  # its context ready (pool_spare.py)
    if (ke := outcome.last(KernelError)) is not None:
        raise ScenarioError(
            (ke.message or "kernel could not be loaded") + f"\n(worker log: {log_path})"
        )
    classified = V.classify(outcome)
    facts["classify_s"] = time.monotonic() - facts["t_return"]
    return classified, outcome, facts


def after_run_health(
    classified: V.Classified,
    outcome: V.Outcome,
    mode: str,
    forkserver,
    run_dir: Path,
    facts: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The GPU health after a run that was killed, crashed or hung; None after any other.

    Never None after a kill or a crash: where no check can run (no GPU, a compile-only run
    that never touched it) the record says why. A hang the probes ended, in a worker that then
    exited by itself, is answered by the worker's own check (health.worker_gpu_check); every
    other one by a check in a new process (engine/health.py)."""
    if not (outcome.killed_by_watchdog or classified.verdict in (V.Verdict.CRASH, V.Verdict.HANG)):
        return None
    device = outcome.last(Device) or Device()
    if mode != "run":
        return {"healthy": None, "skipped": "compile-only run: the GPU was not used"}
    if not device.present:
        why = device.reason or "the worker did not report a device before it ended"
        return {"healthy": None, "skipped": f"no GPU check: {why}"}
    own = health.worker_gpu_check(outcome, facts or {})
    if own is not None:
        return own
    return health_check(forkserver=forkserver, run_dir=run_dir)


def _attempt(scenario: Scenario, run_dir: Path, *, mode: str, forkserver, gpu_token, **kw):
    """run_once, then the GPU health check a kill or crash calls for (engine/health.py), while
    the worker's GPU token is still held: nobody launches on a GPU being checked."""
    tag = lifeline.new_run_tag()  # known before the run: the token goes back however it ends
    if gpu_token:  # and if this process dies, its keeper gives it back
        lifeline.guard_token(gpu_token, tag)
    try:
        classified, outcome, facts = run_once(
            scenario, run_dir, mode=mode, forkserver=forkserver, gpu_token=gpu_token, tag=tag, **kw
        )
        health = after_run_health(classified, outcome, mode, forkserver, run_dir, facts)
    finally:
        if gpu_token:
            release_gpu_token(gpu_token, tag)
            lifeline.unguard_token(gpu_token, tag)
    return classified, outcome, facts, health


def run_scenario(
    scenario: Scenario,
    *,
    runs_root: Path | str = "runs",
    run_dir: Path | None = None,
    mode: str = "run",
    probes: bool | None = None,
    wait_budget_ms: int | None = None,
    repeat: int = 1,
    command: str = "",
    forkserver=None,
    core: Any = None,
    perturb: dict[str, Any] | None = None,
    compile_checks: Sequence[CompileCheck] = (),
    gpu_token: str | None = None,
    compile_cache: bool = True,
) -> RunResult:
    """Run a scenario (``repeat`` times) and return its classified result.

    ``compile_cache`` False: the worker compiles afresh even where the warm pool offers the
    back end's output of an identical traced IR (engine/compile_cache.py).

    ``gpu_token``: a GPU token file (one per GPU; instrument/launch_gpu.py). Each worker
    compiles without it and takes it before its launch; it is given back after the worker
    ended and after the GPU health check its kill called for, so runs that compile at once
    still launch one at a time. The seconds waited for it are ``timings["gpu_wait_s"]``, off
    every clock of the run (stall, deadline) and out of its work and overhead.

    ``perturb``: the request's perturbation field (engine/perturb_runs.py: seeds, policy,
    replay, shrink); the worker then runs the seeds after one compile. ``compile_checks``: what
    checks the recorded protocol for the evidence's ``static_findings`` (engine/compile_checks).

    ``core``: a hang (or crash) without probes is localized from its GPU coredump instead of a
    rerun with probes: an object with ``request_fields(run_dir) -> dict`` (the worker's extra
    request fields) and ``evidence(run_dir, outcome, facts, scenario) -> dict`` (merged into
    the evidence; cutedebug.analyses.coredump.Localizer). A rerun with probes still happens
    when the core gave no stuck site."""
    t_start = time.monotonic()
    run_dir = Path(run_dir) if run_dir else new_run_dir(scenario, runs_root)
    use_probes = scenario.probes if probes is None else probes
    probe_cfg = None
    if use_probes:
        budget = wait_budget_ms or scenario.limits.wait_budget_ms
        probe_cfg = {"budget_ns": int(budget) * 1_000_000}
    attempts = []
    core_evidence: dict[str, Any] = {}
    no_reuse = {} if compile_cache else {"compile_cache": False}
    for i in range(max(1, repeat)):
        use_core = core is not None and probe_cfg is None and i == 0 and mode == "run"
        classified, outcome, facts, health = _attempt(
            scenario,
            run_dir,
            mode=mode,
            probes=probe_cfg,
            index=i,
            forkserver=forkserver,
            request_extra={
                "compile_checks": compile_checks,
                **(core.request_fields(run_dir) if use_core else {}),
                **({"perturb": perturb} if perturb else {}),
                **no_reuse,
            },
            gpu_token=gpu_token,
        )
        if use_core and classified.verdict in (V.Verdict.HANG, V.Verdict.CRASH):
            t_core = time.monotonic()
            core_evidence = core.evidence(run_dir, outcome, facts, scenario)
            facts["core_s"] = round(time.monotonic() - t_core, 3)
            crash = core_evidence.get("crash")
            if crash and classified.verdict is V.Verdict.HANG:
                # the GPU faulted; the kill came while the driver was writing the fault's core
                classified = V.Classified(
                    V.Verdict.CRASH,
                    f"GPU exception in the core: {crash.get('exception')} at "
                    f"{crash.get('where', '?')} (killed at the deadline while the driver wrote "
                    f"the exception's core)",
                    classified.evidence,
                )
        if (
            classified.verdict is V.Verdict.HANG
            and probe_cfg is None
            and probes is None
            and i == 0
            and not core_evidence.get("stuck_sites")
        ):
            # A hang without probes says nothing about where: rerun once with them on.
            budget = wait_budget_ms or scenario.limits.wait_budget_ms
            probe_cfg = {"budget_ns": int(budget) * 1_000_000}
            first = (classified, outcome, facts)
            *rerun, rerun_health = _attempt(
                scenario,
                run_dir / "with_probes",
                mode=mode,
                probes=probe_cfg,
                forkserver=forkserver,
                request_extra={"compile_checks": compile_checks, **no_reuse}
                | perturb_runs.rerun_fields(perturb, outcome),
                gpu_token=gpu_token,
            )
            classified, outcome, facts = perturb_runs.keep_first_hang(perturb, first, rerun)
            facts["rerun_with_probes"] = {
                "first_verdict": first[0].verdict.value,
                "first_reason": first[0].reason,
                "first_work_s": round(work_s(_timings(first[1], first[2])), 3),
                "first_wall_s": round(first[2]["t_return"] - first[2]["t_call"], 3),
            }
            if first[2].get("gpu_wait_s"):
                facts["rerun_with_probes"]["first_gpu_wait_s"] = first[2]["gpu_wait_s"]
            if rerun_health is not None:
                facts["rerun_with_probes"]["health"] = rerun_health
        attempts.append((classified, outcome, facts, health))

    classified, outcome, facts, health = attempts[0]
    verdict, reason = classified.verdict, classified.reason
    repeats = []
    if len(attempts) > 1:
        repeats = [
            {"verdict": a[0].verdict.value, "digest": (a[1].last(Checked) or Checked()).digest}
            for a in attempts
        ]
        verdicts = Counter(r["verdict"] for r in repeats)
        digests = {r["digest"] for r in repeats if r["digest"]}
        if len(verdicts) > 1 or len(digests) > 1:
            verdict = V.Verdict.NONDETERMINISTIC
            reason = (
                f"{len(attempts)} runs disagree: verdicts {dict(verdicts)}, "
                f"{len(digests)} distinct outputs"
            )
    t_verdict = time.monotonic()
    evidence = _evidence(outcome, facts)
    evidence["rule"] = classified.evidence.get("rule")
    if "rerun_with_probes" in facts:
        evidence["rerun_with_probes"] = facts["rerun_with_probes"]
    elif core_evidence:
        evidence.update(core_evidence)
    for a in attempts[1:]:
        if health is None and a[3] is not None:
            health = a[3]
    timings = timings_mod.run_timings(attempts, core_evidence, t_verdict, gpu_token is not None)
    timings["wall_s"] = round(time.monotonic() - t_start, 3)
    timings["unplaced_s"] = timings_mod.unplaced(timings)
    return RunResult(
        scenario=scenario,
        verdict=verdict,
        reason=reason,
        run_dir=run_dir,
        outcome=outcome,
        evidence=evidence,
        timings=timings,
        health=health,
        repeats=repeats,
        mode=mode,
        command=command,
        probes_used=probe_cfg is not None,
    )


def replay(run_dir: Path | str) -> RunResult:
    """Re-classify a recorded run (request.json + events.jsonl, or events.jsonl.gz for a run
    kept compressed) without running anything.

    The watchdog's own observations (kills, exit status) are not in the events: a replay
    sees a child that ended after its last event, which is what a finished run looks like.
    """
    run_dir = Path(run_dir)
    request = json.loads((run_dir / "request.json").read_text())
    scenario = Scenario.from_json(request["scenario"])
    path = run_dir / "events.jsonl"
    if not path.exists() and (gz := path.with_name("events.jsonl.gz")).exists():
        import gzip
        import tempfile

        with tempfile.TemporaryDirectory(prefix="cutedebug-replay-") as tmp:
            plain = Path(tmp) / "events.jsonl"
            plain.write_bytes(gzip.decompress(gz.read_bytes()))
            events, bad = EventReader(plain).poll()
    else:
        events, bad = EventReader(path).poll()
    outcome = V.Outcome(malformed_lines=bad, returncode=0)
    for ev in events:
        outcome.add(ev)
    if outcome.last(Done) is None and outcome.phase == "launched":
        outcome.killed_by_watchdog = "deadline:launched (replayed)"
    classified = V.classify(outcome)
    evidence = _evidence(outcome, {})
    evidence["rule"] = classified.evidence.get("rule")
    return RunResult(
        scenario=scenario,
        verdict=classified.verdict,
        reason=classified.reason,
        run_dir=run_dir,
        outcome=outcome,
        evidence=evidence,
        timings=_timings(outcome, {}),
        mode=request.get("mode", "run"),
    )
