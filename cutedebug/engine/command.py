"""Watching any command line, instrumented: what `cutedebug exec` and `mutate` run.

The command runs under the harness's one watchdog (engine/watchdog.py: its own session, the
lifeline tags and PR_SET_PDEATHSIG, so it dies with cutedebug; killed with its group, then
whatever carries its run tag is swept, grandchildren in sessions of their own included), with
``instrument/launch.py`` active in every Python interpreter of its tree. This module adds the
exec rules to the watchdog's (settled stuck records, a stall, the deadline with its clock
stopped while the GPU token is awaited), a faulthandler dump before a kill, and the verdict
(``classify``):

- HARNESS_ERROR: the instrumentation failed in some process, or something survived the sweep
  (never reported as the program's);
- HANG: a bounded wait timed out (probe stuck records: the kernel by name, the stuck sites and
  map), a kernel in flight stopped moving (stall), or the deadline ended the command (the
  Python stack of every process, dumped just before the kill, says where it waited);
- CRASH: a CUDA error: named by the process's own reading of its CUDA context at exit (the
  sticky error a faulted kernel left, blamed on the CuTe DSL kernel last launched), by the
  output, or by the probe monitor; never a guessed name (engine/cuda_verdict.py); or a
  process died of a signal the watchdog did not send;
- FAIL: the command's own check failed (non-zero exit), with the last lines of its output (a
  CUDA library's error with a healthy context among them);
- PASS: exit status 0.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutedebug.engine import cuda_verdict, lifeline, runner, watchdog
from cutedebug.engine import verdict as V
from cutedebug.engine.cuda_verdict import last_lines
from cutedebug.engine.run_report import stuck_site_phrase
from cutedebug.errors import UsageError
from cutedebug.event import Event
from cutedebug.event_kinds import (
    Compiled,
    CudaContext,
    CudaError,
    Exit,
    InstrumentError,
    ProbeReport,
    Process,
    Progress,
    Stall,
)
from cutedebug.instrument import launch

DEFAULT_DEADLINE_S = 600.0
# Set by a caller watching several commands from threads (mutate) when it is interrupted: every
# watch under way kills its command at its next poll ("cancelled").
CANCEL = threading.Event()
DEFAULT_BUDGET_MS = 500
DEFAULT_STALL_S = 1.0
STUCK_SETTLE_S = 0.3  # stuck records stop arriving for this long: every warp has reported
STUCK_MAX_WAIT_S = 1.5  # ... or this long after the first one
STACK_DUMP_WAIT_S = 0.3
ACTIVATION_FAILED = "cutedebug: instrumentation failed to activate"


@dataclass
class Settings:
    """One watched run of the command."""

    argv: list[str]
    fault: str | None = None
    fault_args: dict[str, Any] = field(default_factory=dict)
    probes: dict[str, Any] | None = None  # ProbeConfig fields; None: off
    deadline_s: float = DEFAULT_DEADLINE_S
    fault_trace: dict[str, Any] | None = None  # only this trace gets the fault (mutate)
    stall_s: float | None = None  # with probes: HANG when a kernel in flight stops moving
    gpu_token: str | None = None  # a file: kernels run only while this command holds it
    record: bool = False  # the protocol recorder (mutate's clean run)
    cwd: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    coredump: bool = False  # GPU cores before the kill (commands/exec.py, analyses.coredump)


@dataclass
class ExecResult:
    settings: Settings
    verdict: V.Verdict
    reason: str
    run_dir: Path
    returncode: int | None
    killed_by: str | None
    elapsed_s: float
    evidence: dict[str, Any] = field(default_factory=dict)
    processes: dict[int, dict[str, Any]] = field(default_factory=dict)
    log_tail: str = ""
    health: dict[str, Any] | None = None
    swept: list[int] = field(default_factory=list)
    first_run: dict[str, Any] | None = None  # a blind HANG rerun with probes: the first run
    left: list[int] = field(default_factory=list)  # processes of the command alive after all
    tag: str = ""  # the run tag its processes carry
    gpu_wait_s: float = 0.0  # time its processes waited for the GPU token (not on the clock)

    @property
    def fault_count(self) -> int | None:
        """Sites the fault changed, over every process (None: no fault asked)."""
        if not self.settings.fault:
            return None
        return sum(p.get("fault_count") or 0 for p in self.processes.values())

    @property
    def traced(self) -> int:
        return sum(len(p.get("traces", [])) for p in self.processes.values())

    def fault_not_applied_why(self) -> str:
        """Why the fault asked for changed no site: no kernel compiled at all (a command cut
        short while compiling, as an FA-4 compile by a 14 s deadline), or none called it."""
        if not self.traced:
            return "no kernel finished compiling before the command ended: nothing to apply it to"
        return f"no traced kernel called what it patches ({self.traced} traced, left unmodified)"


# ---- watching ---------------------------------------------------------------------------------
# ---- watching ---------------------------------------------------------------------------------
# A trace of a process (report.json's ExecTrace): these keys of its compiled event.
TRACE_KEYS = (
    "index",
    "function",
    "occurrence",
    "test",
    "test_occurrence",
    "kernels",
    "error",
    "fault_applied",
    "fault_not_applied",
    "gpu",
    "protocol",
)


def compiled_of(proc: dict[str, Any]) -> Compiled:
    """The last compiled event of a process of the tree (an empty one before any)."""
    ev = proc.get("compiled")
    return Compiled() if ev is None else ev.as_kind(Compiled)


class _Tree:
    """Events of every instrumented process of the command, by pid."""

    def __init__(self) -> None:
        self.procs: dict[int, dict[str, Any]] = {}

    def add(self, ev: Event | dict[str, Any]) -> None:
        if not isinstance(ev, Event):
            ev = Event.from_json(ev)
        pid = ev.pid
        if not isinstance(pid, int):
            return
        p = self.procs.setdefault(
            pid, {"pid": pid, "events": [], "traces": [], "fault_count": 0, "stuck": 0}
        )
        name, payload = ev.name, ev.payload
        p["events"].append(ev)
        if isinstance(payload, Process):
            p["argv"], p["ppid"] = payload.argv, payload.ppid
        elif name == "instrumented":
            p["instrumented"] = ev
        elif isinstance(payload, InstrumentError):
            p.setdefault("errors", []).append(ev)
        elif isinstance(payload, CudaError):  # a kernel faulted: probe monitor, exit query
            p.setdefault("cuda_errors", []).append(payload)
        elif isinstance(payload, CudaContext):  # the context read at exit (launch_context)
            p["cuda_context"] = payload
        elif isinstance(payload, Compiled):
            p["traces"].append({k: getattr(payload, k) for k in TRACE_KEYS})
            p["compiled"] = ev  # the probe sites so far
            p["fault_sites"] = p.get("fault_sites", []) + (payload.fault_sites or [])
            p["fault_count"] = payload.fault_count or p["fault_count"]
        elif isinstance(payload, (Progress, ProbeReport)):
            stuck = payload.stuck if name == "progress" else payload.n_stuck_reported
            if isinstance(stuck, list):
                stuck = len(stuck)
            p["stuck"] = max(p["stuck"], stuck or 0)
        elif name == "stall":
            p["stall"] = ev
        elif name == "gpu_wait":
            p["gpu_waiting"] = True
        elif name == "gpu_acquired":
            p["gpu_waiting"] = False
        elif isinstance(payload, Exit):
            p["exited"] = True
            if payload.fault_count is not None:
                p["fault_count"] = payload.fault_count

    @property
    def stuck(self) -> int:
        return sum(p["stuck"] for p in self.procs.values())


def watch_command(
    s: Settings,
    run_dir: Path,
    *,
    extra_env: dict[str, str] | None = None,
    before_kill: Callable[[dict[str, Any]], None] | None = None,
) -> ExecResult:
    """Run the command once under the harness's watchdog (its own session, the lifeline tags,
    killed with its group and swept by its tag); classify what happened."""
    from cutedebug.engine.scenario import Limits

    run_dir.mkdir(parents=True, exist_ok=True)
    events_path, log_path = run_dir / "events.jsonl", run_dir / "command.log"
    events_path.write_text("")
    stacks = run_dir / "stacks"
    config = {
        "events": str(events_path),
        "stacks_dir": str(stacks),
        "fault": s.fault,
        "fault_args": s.fault_args,
        "fault_trace": s.fault_trace,
        "gpu_token": s.gpu_token,
        "probes": s.probes,
        "record": s.record,
        "stall_s": s.stall_s if s.probes else None,
    }
    env = launch.child_env(config, dict(os.environ))
    env.update(s.extra_env)
    env.update(extra_env or {})
    live = _Tree()
    t0 = time.monotonic()
    clock = {
        "first_stuck": None,
        "stuck_change": None,
        "stuck": 0,
        "paused": 0.0,
        "pause_start": None,
        "kill": None,
    }

    def kill_when(_elapsed: float) -> str | None:
        """exec's rules, asked at every poll: stuck records settled, a stall, the deadline
        (its clock stopped while a process of the command waits for the GPU token)."""
        now = time.monotonic()
        waiting = any(p.get("gpu_waiting") for p in live.procs.values())
        if waiting and clock["pause_start"] is None:
            clock["pause_start"] = now
        elif not waiting and clock["pause_start"] is not None:
            clock["paused"] += now - clock["pause_start"]
            clock["pause_start"] = None
        if live.stuck != clock["stuck"]:
            clock["stuck"], clock["stuck_change"] = live.stuck, now
            clock["first_stuck"] = clock["first_stuck"] or now
        why = None
        if CANCEL.is_set():
            why = "cancelled"
        elif clock["first_stuck"] is not None and (
            now - clock["stuck_change"] >= STUCK_SETTLE_S
            or now - clock["first_stuck"] >= STUCK_MAX_WAIT_S
        ):
            why = "stuck records"
        elif any(p.get("stall") for p in live.procs.values()):
            why = "stall"
        else:
            pause = clock["paused"] + (now - clock["pause_start"] if clock["pause_start"] else 0)
            if now - t0 - pause > s.deadline_s:
                why = f"deadline:{s.deadline_s:g}s"
        if why:
            clock["kill"] = now
        return why

    def dump_before_kill(ctx: dict[str, Any]) -> dict[str, Any] | None:
        if before_kill is not None:  # e.g. GPU core dumps (commands/exec.py --coredump)
            before_kill(ctx)
        # Where every process waits, from faulthandler, then the watchdog kills.
        watchdog.signal_tree(ctx["pid"], ctx["tag"], signal.SIGUSR1)
        _wait_for_stacks(stacks, live.procs, STACK_DUMP_WAIT_S)
        return None

    never = 1e9  # the command writes no worker phases: exec's own rules decide (kill_when)
    limits = Limits(compile_s=never, deadline_s=never, import_s=never, check_s=never)
    try:
        outcome, facts = watchdog.watch(
            list(s.argv),
            events_path,
            log_path,
            limits,
            env=env,
            cwd=s.cwd or os.getcwd(),
            on_event=live.add,
            kill_when=kill_when,
            before_kill=dump_before_kill,
        )
    except OSError as e:
        raise UsageError(f"cannot start {s.argv[0]!r}: {e}") from e
    tree = _Tree()  # every event, those read after the kill included
    events, malformed = watchdog.EventReader(events_path).poll()
    for ev in events:
        tree.add(ev)
    malformed = malformed or outcome.malformed_lines
    tag = facts["tag"]
    killed_by = outcome.killed_by_watchdog
    kill_t, first_stuck_t = clock["kill"], clock["first_stuck"]
    pause = clock["paused"] + (
        time.monotonic() - clock["pause_start"] if clock["pause_start"] else 0
    )
    res = ExecResult(
        settings=s,
        verdict=V.Verdict.HARNESS_ERROR,
        reason="",
        run_dir=run_dir,
        returncode=outcome.returncode,
        killed_by=killed_by,
        elapsed_s=outcome.elapsed_s,
        processes=tree.procs,
        log_tail=watchdog.tail(log_path, 8000),
        swept=sorted(set(facts.get("swept", []) + facts.get("swept_after_exit", []))),
        left=[p.pid for p in lifeline.processes(tag)],  # after the sweep: should be none
        tag=tag,
        gpu_wait_s=round(pause, 3),
    )
    if facts.get("before_kill"):
        res.evidence["before_kill"] = facts["before_kill"]
    res.evidence["stacks"] = _read_stacks(stacks) if killed_by else {}
    if first_stuck_t is not None:
        # The waits that wrote the records had been stuck for the budget already.
        budget_s = (s.probes or {}).get("budget_ns", 0) / 1e9
        end = kill_t if kill_t is not None else time.monotonic()
        res.evidence["timeline"] = {
            "first_stuck_record_s": round(first_stuck_t - t0, 3),
            "killed_s": round(kill_t - t0, 3) if kill_t is not None else None,
            "wait_budget_s": budget_s,
            "stall_to_verdict_s": round(end - first_stuck_t + budget_s, 3),
        }
    if malformed:
        res.evidence["malformed_lines"] = malformed[:5]
    classify(res)
    return res


def _wait_for_stacks(stacks: Path, procs: dict[int, Any], limit_s: float) -> None:
    """Until every instrumented process has written its dump (faulthandler writes at once), at
    most limit_s."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        files = [stacks / f"{pid}.txt" for pid in procs]
        if all(f.exists() and f.stat().st_size for f in files):
            return
        time.sleep(0.01)


def _read_stacks(stacks: Path) -> dict[str, str]:
    out = {}
    for f in sorted(stacks.glob("*.txt")) if stacks.is_dir() else []:
        text = f.read_text(errors="replace").strip()
        if text:
            out[f.stem] = text[:4000]
    return out


# ---- verdict ---------------------------------------------------------------------------------


def _harness_problem(res: ExecResult) -> str | None:
    for p in res.processes.values():
        for e in p.get("errors", []):
            err = e.as_kind(InstrumentError)
            return f"instrumentation failed in pid {p['pid']}: {err.type}: {err.message}"
    if ACTIVATION_FAILED in res.log_tail:
        line = next(ln for ln in res.log_tail.splitlines() if ACTIVATION_FAILED in ln)
        return line.strip()
    if res.left:
        return f"processes of the command survived the sweep: {res.left}"
    if res.evidence.get("malformed_lines"):
        return f"unreadable event lines: {res.evidence['malformed_lines'][0][:120]!r}"
    return None


def classify(res: ExecResult) -> None:
    """Set res.verdict / res.reason / res.evidence from what was observed (first rule wins);
    a fault that changed nothing, or instrumentation asked for and never active, is said first
    in the reason (such a PASS says nothing about the fault)."""
    _classify(res)
    notes = []
    s = res.settings
    if (s.fault or s.probes) and not any(p.get("instrumented") for p in res.processes.values()):
        notes.append(
            "nothing was instrumented: no Python process of the command imported cutlass"
            + (
                ""
                if res.processes
                else " (none ran cutedebug's sitecustomize: not Python, or python -I / -S)"
            )
        )
    elif s.fault and not res.fault_count and res.verdict is not V.Verdict.HARNESS_ERROR:
        looked = [
            t.get("fault_not_applied")
            for p in res.processes.values()
            for t in p["traces"]
            if t.get("fault_not_applied")
        ]
        notes.append(
            looked[0] if looked else f"fault {s.fault} NOT APPLIED: {res.fault_not_applied_why()}"
        )
    if notes:
        res.evidence["not_applied"] = notes
        res.reason = "; ".join(notes) + "; " + res.reason


def _classify(res: ExecResult) -> None:
    rc, tail = res.returncode, res.log_tail
    if (why := _harness_problem(res)) is not None:
        res.verdict, res.reason = V.Verdict.HARNESS_ERROR, why
        return
    stuck_pid = next((pid for pid, p in res.processes.items() if p["stuck"]), None)
    if stuck_pid is not None:
        ev = hang_evidence(res.processes[stuck_pid], stalled=False)
        res.evidence.update(ev)
        res.verdict = V.Verdict.HANG
        res.reason = (
            f"bounded waits timed out in {ev.get('kernel') or 'a CuTe DSL kernel'} "
            f"(pid {stuck_pid}): {ev.get('n_stuck_reported')} stuck record(s)"
        )
        return
    stall_pid = next((pid for pid, p in res.processes.items() if p.get("stall")), None)
    if res.killed_by == "stall" and stall_pid is not None:
        proc = res.processes[stall_pid]
        ev = hang_evidence(proc, stalled=True)
        res.evidence.update(ev)
        res.verdict = V.Verdict.HANG
        res.reason = (
            f"no beacon of {ev.get('kernel') or 'the instrumented kernel'} (pid {stall_pid}) "
            f"moved for {proc['stall'].as_kind(Stall).still_s} s while it was in flight (a wait the "
            "probes cannot bound: named barrier, flag spin, ...); killed"
        )
        return
    if res.killed_by:
        res.verdict = V.Verdict.HANG
        where = stack_summary(res.evidence.get("stacks") or {})
        res.reason = f"the command did not finish before the deadline ({res.killed_by}); killed" + (
            f"; it was waiting in {where}" if where else ""
        )
        return
    if cuda_verdict.classify_cuda(res):  # named by the context, the output or the monitor
        return
    if rc is not None and rc < 0:
        sig = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else -rc
        res.verdict, res.reason = V.Verdict.CRASH, f"the command was killed by {sig}"
        return
    if rc:
        res.verdict = V.Verdict.FAIL
        tail_lines = last_lines(tail)
        res.reason = f"the command exited with status {rc}" + (
            f": {tail_lines.splitlines()[-1].strip()[:200]}" if tail_lines else ""
        )
        res.evidence["last_lines"] = tail_lines
        return
    res.verdict, res.reason = V.Verdict.PASS, "the command exited with status 0"


def hang_evidence(proc: dict[str, Any], stalled: bool) -> dict[str, Any]:
    """Stuck sites and diagnosis of one process (the run's own probe evidence), the kernel by
    name, and the picture the stuck map is drawn from."""
    o = V.Outcome()
    for ev in proc["events"]:
        if ev.name in ("compiled", "progress", "probe_report"):
            o.add(ev)
        elif ev.name == "stall":  # the picture at the stall, as the last live one
            o.add(Event.of("progress", ev.t, pid=ev.pid, picture=ev.as_kind(Stall).picture))
    if stalled:
        o.killed_by_watchdog = "stall"
    ev = runner.probe_evidence(o) or {}
    picture, _ = runner.probe_picture(o)
    if picture:  # the report draws the stuck map from it (reporting/exec_report.py)
        ev["probe_picture"] = picture
        ev["probe_sites"] = compiled_of(proc).probe_sites or []
    sites = {s["id"]: s for s in compiled_of(proc).probe_sites or []}
    kernels = []
    for st in ev.get("stuck_sites", []):
        site = sites.get(st.get("site"), {})
        st["kernel"] = site.get("kernel")
        if site.get("kernel") and site["kernel"] not in kernels:
            kernels.append(site["kernel"])
        if site.get("file"):
            st["file"] = site["file"]
    ev["kernel"] = ", ".join(kernels) if kernels else None
    ev["pid"] = proc["pid"]
    return ev


_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


def stack_summary(stacks: dict[str, str]) -> str:
    """'file.py:LINE in func (pid N)' of the innermost frame of each process's current thread
    that is not in the standard library or an installed package."""
    parts = []
    for pid, text in stacks.items():
        frames = _FRAME.findall(text.split("(most recent call first):", 1)[-1].split("\n\n")[0])
        user = [f for f in frames if "site-packages" not in f[0] and "/lib/python" not in f[0]]
        pick = (user or frames)[:1]
        for file, line, func in pick:
            parts.append(f"{os.path.basename(file)}:{line} in {func} (pid {pid})")
    return "; ".join(parts)


# ---- one exec, as the command line asks ---------------------------------------------------------
def probe_config(budget_ms: int) -> dict[str, Any]:
    return {"budget_ns": int(budget_ms) * 1_000_000}


def used_gpu(res: ExecResult) -> bool:
    """Some process of the command had a GPU (said when it traced: a compiled event's gpu)."""
    return any(t.get("gpu") for p in res.processes.values() for t in p["traces"])


# ---- reports -----------------------------------------------------------------------------------
def where(res: ExecResult) -> str:
    sites = res.evidence.get("stuck_sites") or []
    return stuck_site_phrase(sites[0], kernel=True) if sites else ""
