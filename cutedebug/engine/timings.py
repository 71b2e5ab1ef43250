"""Where a run's seconds go: the work (compile, kernel, reference check) and the harness's
overhead, and one attempt's wall time placed phase by phase on the runner's clock
(``report.json`` timings, ``report.md``'s breakdown, a triage's overhead column).
"""

from __future__ import annotations

from typing import Any

from cutedebug.engine import verdict as V
from cutedebug.event_kinds import Compiled, GpuAcquired, Started, Synced


def timings(o: V.Outcome, facts: dict[str, Any]) -> dict[str, float]:
    t: dict[str, float] = {"total_s": o.elapsed_s}
    if (c := o.last(Compiled)) is not None:
        t["compile_s"] = c.secs or 0.0
    if (synced := o.last(Synced)) is not None:
        t["kernel_s"] = synced.kernel_s or 0.0
        s, ck = o.event("synced"), o.event("checked")
        if ck is not None and ck.t is not None and s.t is not None:
            t["check_s"] = round(max(0.0, ck.t - s.t), 3)  # the reference + comparison
    if "stall_detected_after_s" in facts:
        t["stall_to_verdict_s"] = facts["stall_detected_after_s"]
    for key, secs in breakdown(o, facts).items():
        t.setdefault(key, secs)  # compile_s and check_s as the worker measured them
    for key, secs in gaps(o, facts, t).items():
        t.setdefault(key, secs)
    st, dev = o.event("started"), o.event("device")
    if "imports_s" in t and st and dev and st.t is not None and dev.t is not None:
        # of imports_s: the GPU looked for (a run's worker imports torch and initializes CUDA
        # to learn it), before cutlass, the kernel file and its class
        t["device_s"] = round(max(0.0, dev.t - st.t), 3)
    if (launched := o.event("launched")) is not None and "kill_t" in facts:
        # kill_t counts from spawn, event times from the worker's start: close enough to
        # report how long the kernel ran before the watchdog ended it.
        t["launch_to_kill_s"] = round(facts["kill_t"] - launched.t, 3)
    return t


# Where one attempt's wall time went, in order (seconds; report.json "timings"):
BREAKDOWN = (
    ("spawn_s", "the runner's spawn (fork or fresh interpreter) until the worker started"),
    ("imports_s", "torch import and CUDA init, cutlass import, the kernel file and its class"),
    ("inputs_s", "make_inputs (or fake args) and the probe buffer"),
    ("compile_s", "cute.compile with the instrumentation (trace, MLIR, PTX, cubin)"),
    ("gpu_wait_s", "waiting for the GPU token while other runs' kernels ran (triage)"),
    ("launch_s", "launch until the kernel ended: synchronized, faulted or killed"),
    ("check_s", "the reference and the comparison"),
    ("exit_s", "the worker's exit (CUDA context teardown) and the sweep for leftovers"),
)
# Between those (gaps(); each also in report.json, so that the phases add up to the wall):
GAPS = (
    (
        "prelaunch_s",
        "after the compile until the launch: the PTX file, the static protocol "
        "checks, the protocol sites, the launch's set-up (the GPU token's wait apart)",
    ),
    (
        "after_kernel_s",
        "after the kernel ended until the worker's last event: the reference "
        "check (check_s), the in-worker GPU check",
    ),
)
# What the run's wall time (wall_s) is the sum of; unplaced_s is the rest (the run folder and
# the request, a repeat's or a rerun's attempts beyond what rerun_s says).
PLACED = (
    "spawn_s",
    "imports_s",
    "inputs_s",
    "compile_s",
    "prelaunch_s",
    "gpu_wait_s",
    "launch_s",
    "after_kernel_s",
    "exit_s",
    "rerun_s",
    "health_s",
    "core_s",
    "verdict_s",
)


def _clock(o: V.Outcome, facts: dict[str, Any]):
    """(a function from an event's name to its time on the runner's clock, the time of the
    worker's last event), or None for older workers (the worker's "started" event carries its
    own t = 0 as mono0)."""
    st = o.last(Started)
    if st is None or st.mono0 is None or "t_call" not in facts:
        return None
    mono0 = float(st.mono0)

    def at(name: str) -> float | None:
        e = o.event(name)
        return None if e is None or e.t is None else mono0 + float(e.t)

    last = max((mono0 + float(e.t) for e in o.events if e.t is not None), default=None)
    return at, last


def gaps(o: V.Outcome, facts: dict[str, Any], t: dict[str, float]) -> dict[str, float]:
    """The GAPS of one attempt (``t``: its timings so far, compile_s among them)."""
    clock = _clock(o, facts)
    if clock is None:
        return {}
    at, last = clock
    out: dict[str, float] = {}
    compiling = at("compiling")
    end = at("launched") or at("unsupported")
    if compiling is not None and end is not None and "compile_s" in t:
        got = o.last(GpuAcquired)
        waited = float(got.waited_s or 0.0) if got is not None else 0.0
        out["prelaunch_s"] = end - compiling - t["compile_s"] - waited
    ended = at("synced") or at("cuda_error")
    if ended is not None and last is not None and "kill_t" not in facts:
        out["after_kernel_s"] = last - ended
    return {k: round(max(0.0, v), 3) for k, v in out.items()}


def unplaced(t: dict[str, float]) -> float:
    """Seconds of wall_s outside every PLACED phase."""
    return round(max(0.0, t.get("wall_s", 0.0) - sum(t.get(k, 0.0) for k in PLACED)), 3)


def breakdown(o: V.Outcome, facts: dict[str, Any]) -> dict[str, float]:
    """The BREAKDOWN fields of one attempt that its events let us place on the runner's clock;
    {} for older workers."""
    clock = _clock(o, facts)
    if clock is None:
        return {}
    at, last_event = clock
    out: dict[str, float] = {"spawn_s": at("started") - facts["t_call"]}
    pairs = (("imports_s", "started", "imported"), ("inputs_s", "imported", "compiling"))
    for key, a, b in pairs:
        if at(a) is not None and at(b) is not None:
            out[key] = at(b) - at(a)
    if (got := o.last(GpuAcquired)) is not None:
        out["gpu_wait_s"] = float(got.waited_s or 0.0)
    kill = facts["t_call"] + facts["kill_t"] if "kill_t" in facts else None
    if (launched := at("launched")) is not None:
        end = at("synced") or at("cuda_error") or kill
        if end is not None:
            out["launch_s"] = end - launched
    last = kill if kill is not None else last_event
    if last is not None and "t_return" in facts:
        out["exit_s"] = facts["t_return"] - last
    return {k: round(max(0.0, v), 3) for k, v in out.items()}


def work_s(t: dict[str, float]) -> float:
    """Seconds one attempt spent on the work itself: compile, the kernel (until the kill, for
    a hang) and the reference check. The rest of its wall time is the harness's."""
    kernel = t.get("kernel_s") or t.get("launch_to_kill_s") or 0.0
    return t.get("compile_s", 0.0) + kernel + t.get("check_s", 0.0)


def run_timings(
    attempts: list[tuple[Any, V.Outcome, dict[str, Any], dict[str, Any] | None]],
    core_evidence: dict[str, Any],
    t_verdict: float,
    token: bool = False,
) -> dict[str, float]:
    """report.json's timings of a run_scenario call from its attempts ((classified, outcome,
    facts, health) each), the first attempt's: its phases, work and the rest of its breakdown.
    ``token``: the workers took a GPU token; ``gpu_wait_s`` is then every attempt's wait for
    it (a blind hang's first run included), inside the wall time and outside the work."""
    import time

    _, outcome, facts, health = attempts[0]
    t = timings(outcome, facts)
    rerun = facts.get("rerun_with_probes", {})
    # Work of the first attempt: its own run, a blind hang's first run before the rerun with
    # probes, and the GPU health check after a kill.
    t["work_s"] = round(
        work_s(t) + rerun.get("first_work_s", 0.0) + (health or {}).get("secs", 0.0), 3
    )
    # The rest of the breakdown (BREAKDOWN has the first attempt's own phases): classification,
    # evidence and stuck map; a blind hang's first run; the health check.
    t["verdict_s"] = round(facts.get("classify_s", 0.0) + time.monotonic() - t_verdict, 3)
    if rerun:
        t["rerun_s"] = rerun["first_wall_s"]
    if health is not None:
        t["health_s"] = health.get("secs", 0.0)
    if "core_s" in facts:  # reading the core (the dump itself is before the kill)
        t["core_s"] = facts["core_s"]
        dump = (core_evidence.get("coredump") or {}).get("dump") or {}
        if dump.get("dump_s") is not None:
            t["dump_s"] = dump["dump_s"]
        # CUTEDEBUG_COREDUMP_READ=attach: the attached reading before the kill (like dump_s,
        # within launch_s), a failed one's too (the dump then followed it)
        attach = (core_evidence.get("coredump") or {}).get("attach") or {}
        if attach.get("attach_s") is not None:
            t["attach_s"] = attach["attach_s"]
    if "pool" in facts:  # getting the warm pool's server: before this run's clock started
        t["pool_s"] = facts["pool"]["connect_s"]
    waited = sum(
        a[2].get("gpu_wait_s", 0.0) + a[2].get("rerun_with_probes", {}).get("first_gpu_wait_s", 0.0)
        for a in attempts
    )
    if token or waited:
        t["gpu_wait_s"] = round(waited, 3)
    return t


def process_age_s() -> float | None:
    """Seconds since this process started (the kernel's start time of it, in clock ticks since
    boot, against CLOCK_BOOTTIME): the interpreter's start and imports before any code of ours
    could read a clock. None where /proc does not say (not Linux) or says nonsense."""
    import os
    import time

    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - start
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return age if 0.0 <= age < 86400.0 else None
