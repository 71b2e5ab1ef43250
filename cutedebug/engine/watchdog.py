"""The watchdog: the one way the harness launches a child and watches it.

Every child goes through :func:`watch`: the worker of ``run``, ``triage``, the pytest items
and ``bisect`` (forked from the fork server or a fresh interpreter), the worker wrapped in
compute-sanitizer (``sanitize``), the lint child, and any command line (``cutedebug exec``).

    outcome, facts = watch(argv, events_path, log_path, limits, *, env=None, cwd=None,
                           stall_s=None, total_s=None, on_event=None, forkserver=None)

- ``argv`` is any command line. The child runs in its own session (its own process group)
  with stdin from /dev/null and stdout+stderr appended to ``log_path``; its environment is
  ``env`` (default: ours) plus the lifeline tags (:mod:`cutedebug.engine.lifeline`), and it
  dies with us (PR_SET_PDEATHSIG, the keeper).
- ``events_path``: a JSON-lines file the child appends events to (the worker's protocol:
  ``{"event": "started"|"imported"|"compiling"|"compiled"|"launched"|...}``), or None for a
  command that writes none. Each phase has its limit from ``limits`` (a child that writes no
  events stays in phase "spawned", whose limit is ``limits.import_s``); ``total_s`` caps the
  whole run whatever the phase; ``stall_s`` kills a launched child whose "progress" counter
  stops moving.
- ``forkserver``: fork the worker for the request ``argv[-1]`` from that server instead of
  exec'ing ``argv`` (``fork_job="health"``: the GPU health check); a dead server is
  restarted, or the child is exec'd after all.
- A child waiting for a GPU token (its ``gpu_wait`` event until ``gpu_acquired``, see
  instrument/launch_gpu.py) is waiting for other runs' kernels, not stuck: no deadline runs
  meanwhile (phase, total), and its phase clock restarts when it gets the GPU. The seconds
  waited are ``facts["gpu_wait_s"]``.
- ``kill_when(elapsed_s)``: the caller's own kill rule, asked at every poll after the events
  were read (``on_event`` sees each one first); a reason string kills the child.
- Before any kill decided by the watchdog (deadline, stall, ``kill_when``) the hooks in
  :data:`BEFORE_KILL` and the call's ``before_kill`` run with {"pid", "tag", "reason", ...}
  (a core dump, a faulthandler dump through :func:`signal_tree`); then the child's group is
  killed and everything carrying its run tag is swept.
- A command that cannot be started raises OSError (nothing was started). After every
  run, killed or not, the run tag is swept again (grandchildren outlive children).
- Interrupts: a KeyboardInterrupt in the watching thread, or :func:`abort_all` from another
  thread (a triage's main thread on Ctrl-C), kills the child at once (never waiting for its
  deadline) and raises :class:`Interrupted`. :func:`cancellable` does the same for the runs of
  one thread only (the pytest plugin's prefetched run of an item that will not run).

Returns the :class:`~cutedebug.engine.verdict.Outcome` (phases, events, exit status, why it
was killed) and process facts (``tag``, ``forked``, ``swept``, ``kill_t``, ...).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cutedebug.engine import lifeline
from cutedebug.engine import verdict as V
from cutedebug.engine.scenario import Limits
from cutedebug.event import Event
from cutedebug.event_kinds import Progress

POLL_S = 0.02
MAX_EVENT_LINE = 1 << 20  # longer lines are cut, reported, never silently lost
MAX_MALFORMED = 20  # malformed lines kept per run (200 characters each)
REPO_ROOT = Path(__file__).resolve().parents[2]

# Called with {"pid", "tag", "reason", "log_path", "events_path", "phase"} after the watchdog
# decided to kill (deadline or stall) and before the SIGKILL; may return a dict of facts
# (kept under facts["before_kill"]). Not called on interrupts (those must end in < 2 s).
BEFORE_KILL: list[Callable[[dict[str, Any]], dict[str, Any] | None]] = []


class Interrupted(KeyboardInterrupt):
    """The run was stopped by an interrupt (its child is already dead)."""


_ABORT = threading.Event()
_LIVE: dict[int, tuple[Any, str]] = {}  # id(handle) -> (handle, run tag)
_LIVE_LOCK = threading.Lock()


def abort_all() -> None:
    """Kill every child being watched in this process now; their watchers raise Interrupted.
    Stays in force (new runs are refused) until :func:`reset_abort`."""
    _ABORT.set()
    with _LIVE_LOCK:
        live = list(_LIVE.values())
    for proc, tag in live:
        lifeline.kill_group(proc.pid)
        lifeline.sweep(tag, timeout=0.5)


_CANCEL = threading.local()  # this thread's cancel event (cancellable)


@contextlib.contextmanager
def cancellable(event: threading.Event) -> Iterator[None]:
    """Runs watched by this thread inside the block stop once ``event`` is set: the child is
    killed with its tree within a poll and :class:`Interrupted` is raised (as by
    :func:`abort_all`, for this thread only); none starts after it was set."""
    previous = getattr(_CANCEL, "event", None)
    _CANCEL.event = event
    try:
        yield
    finally:
        _CANCEL.event = previous


def _stopped() -> bool:
    event = getattr(_CANCEL, "event", None)
    return _ABORT.is_set() or (event is not None and event.is_set())


def reset_abort() -> None:
    _ABORT.clear()


def aborted() -> bool:
    return _ABORT.is_set()


def phase_deadline(phase: str, limits: Limits) -> float:
    if phase == "compiling":
        return limits.compile_s
    if phase == "launched":
        return limits.deadline_s
    if phase in ("synced", "checked"):
        return limits.check_s
    return limits.import_s


class EventReader:
    """Reads complete JSON lines from a file that another process appends to."""

    def __init__(self, path: Path | None):
        self.path, self.offset, self.partial = path, 0, b""
        self.skipping = False  # inside a line over MAX_EVENT_LINE

    def poll(self) -> tuple[list[Event], list[str]]:
        if self.path is None:
            return [], []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read(64 << 20)
        except (FileNotFoundError, IsADirectoryError):
            return [], []
        self.offset += len(chunk)
        data = self.partial + chunk
        lines = data.split(b"\n")
        self.partial = lines.pop()
        bad: list[str] = []
        if self.skipping and lines:
            lines.pop(0)  # the rest of the over-long line
            self.skipping = False
        if len(self.partial) > MAX_EVENT_LINE:
            bad.append(
                f"[event line over {MAX_EVENT_LINE} bytes cut] "
                + self.partial[:200].decode("utf-8", "replace")
            )
            self.partial, self.skipping = b"", True
        events = []
        for raw in lines:
            if not raw.strip():
                continue
            if len(raw) > MAX_EVENT_LINE:
                bad.append(
                    f"[event line of {len(raw)} bytes cut: over the {MAX_EVENT_LINE} cap] "
                    + raw[:200].decode("utf-8", "replace")
                )
                continue
            try:  # a line that is not an event (RecordError is a ValueError) is malformed
                events.append(Event.from_json(json.loads(raw)))
            except (ValueError, RecursionError):
                bad.append(raw[:200].decode("utf-8", "replace"))
        return events, bad


def _spawn(
    argv: list[str],
    log_path: Path,
    env: dict[str, str],
    cwd: str | None,
    forkserver: Any,
    tag: str,
    facts: dict[str, Any],
    job: str = "worker",
):
    if forkserver is not None:
        try:
            child = forkserver.spawn(Path(argv[-1]), log_path, {lifeline.RUN_TAG_VAR: tag}, job=job)
            facts["forked"] = True
            if getattr(child, "spare", False):  # the warm pool's spare: its context was ready
                facts["spare"] = True
            return child
        except RuntimeError as e:  # ForkServerError: not restartable; a fresh interpreter then
            facts["forkserver_error"] = str(e)[:500]
    facts["forked"] = False
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            cwd=cwd or str(REPO_ROOT),
            preexec_fn=lifeline.preexec(),
        )


def kill_tree(proc: Any, tag: str, reap_s: float = 2.0) -> list[int]:
    """Kill the child's process group, then everything still carrying its tag. Returns the
    pids that had to be swept beyond the group."""
    # Its descendants first, while they are still its (a subreaper worker holds the orphans
    # it adopted, untagged ones included; killed first, they cannot be re-parented to init).
    descendants = lifeline.kill_descendants(proc.pid)
    lifeline.kill_group(proc.pid)
    # Reap our own child before sweeping: psutil would reap it otherwise and Popen would then
    # report exit status 0 for a killed process.
    try:
        proc.wait(timeout=reap_s)
    except subprocess.TimeoutExpired:
        pass
    return sorted(set(descendants) | set(lifeline.sweep(tag)))


def signal_tree(pid: int, tag: str, sig: int) -> None:
    """Send ``sig`` to the child and to everything carrying its run tag (e.g. SIGUSR1 for a
    faulthandler dump before the kill)."""
    for p in {pid} | {p.pid for p in lifeline.processes(tag)}:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _before_kill(ctx: dict[str, Any], facts: dict[str, Any], extra: list) -> None:
    for hook in list(BEFORE_KILL) + extra:
        try:
            got = hook(ctx)
        except Exception as e:  # noqa: BLE001  (a hook must never stop the kill)
            got = {"error": f"{getattr(hook, '__name__', hook)}: {type(e).__name__}: {e}"}
        if got:
            facts.setdefault("before_kill", []).append(got)


def watch(
    argv: list[str],
    events_path: Path | None,
    log_path: Path,
    limits: Limits,
    *,
    env: dict[str, str] | None = None,
    stall_s: float | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    forkserver: Any = None,
    cwd: str | None = None,
    total_s: float | None = None,
    fork_job: str = "worker",
    kill_when: Callable[[float], str | None] | None = None,
    before_kill: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    tag: str | None = None,
) -> tuple[V.Outcome, dict[str, Any]]:
    """Launch ``argv`` (or fork the worker for ``argv[-1]``) and watch it to its end; see the
    module docstring. ``tag``: the child's run tag, when the caller must know it beforehand
    (a new one by default)."""
    if _stopped():
        raise Interrupted("interrupted: no new runs")
    tag = tag or lifeline.new_run_tag()
    child_env = lifeline.child_env(env, tag)
    outcome = V.Outcome()
    facts: dict[str, Any] = {"tag": tag}
    reader = EventReader(events_path)
    t_start = time.monotonic()
    proc = _spawn(argv, log_path, child_env, cwd, forkserver, tag, facts, fork_job)
    with _LIVE_LOCK:
        _LIVE[id(proc)] = (proc, tag)
    phase_t = t_start
    last_counter, counter_t = None, None
    waiting: set[Any] = set()  # processes of the child waiting for the GPU token (by pid)
    waiting_since: float | None = None  # since when one of them waits: no clock runs
    waited = 0.0
    interrupted = False
    try:
        while True:
            exited = proc.poll() is not None
            evs, bad = reader.poll()
            now = time.monotonic()
            for ev in evs:
                name = ev.name
                if outcome.add(ev):
                    phase_t = now
                    if name == "launched":
                        counter_t = now
                if isinstance(ev.payload, Progress):
                    if ev.payload.counter != last_counter:
                        last_counter, counter_t = ev.payload.counter, now
                if name == "perturb_seed":  # a new perturbed launch: its own deadline
                    phase_t = counter_t = now
                    last_counter = None
                if name == "gpu_wait":
                    waiting.add(ev.pid)
                    waiting_since = waiting_since or now
                elif name == "gpu_acquired":
                    waiting.discard(ev.pid)
                    if not waiting and waiting_since is not None:
                        waited += now - waiting_since
                        waiting_since, phase_t = None, now
                if on_event is not None:
                    on_event(ev)
            _keep_malformed(outcome, bad)
            if _stopped():  # abort_all() may have killed it already
                interrupted = True
                outcome.killed_by_watchdog = "interrupted"
                break
            if exited:
                break
            limit = phase_deadline(outcome.phase, limits)
            if waiting_since is not None:  # waiting for the GPU: our clocks are stopped
                phase_t = counter_t = now
            paused = waited + (now - waiting_since if waiting_since is not None else 0.0)
            if (
                outcome.phase == "launched"
                and stall_s is not None
                and counter_t is not None
                and last_counter is not None
                and now - counter_t > stall_s
            ):
                outcome.killed_by_watchdog = "stall"
                facts["stall_detected_after_s"] = round(now - counter_t, 3)
            elif now - phase_t > limit:
                outcome.killed_by_watchdog = f"deadline:{outcome.phase}:{limit:g}s"
            elif total_s is not None and now - t_start - paused > total_s:
                outcome.killed_by_watchdog = f"deadline:total:{total_s:g}s"
            elif kill_when is not None and (why := kill_when(now - t_start)):
                outcome.killed_by_watchdog = why
            if outcome.killed_by_watchdog:
                facts["kill_t"] = round(now - t_start, 3)
                _before_kill(
                    {
                        "pid": proc.pid,
                        "tag": tag,
                        "phase": outcome.phase,
                        "reason": outcome.killed_by_watchdog,
                        "log_path": log_path,
                        "events_path": events_path,
                    },
                    facts,
                    [before_kill] if before_kill else [],
                )
                facts["swept"] = kill_tree(proc, tag)  # also reaps the child
                evs, bad = reader.poll()
                outcome.events.extend(evs)  # after the kill: evidence, not a phase
                _keep_malformed(outcome, bad)
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        interrupted = True
        outcome.killed_by_watchdog = "interrupted"
        raise
    finally:
        if proc.poll() is None:
            facts["swept"] = kill_tree(proc, tag, reap_s=0.5 if interrupted else 2.0)
        if "swept" not in facts:
            # Grandchildren may outlive a child that exited on its own.
            facts["swept_after_exit"] = lifeline.sweep(tag, timeout=0.5 if interrupted else 3.0)
        with _LIVE_LOCK:
            _LIVE.pop(id(proc), None)
    if waiting_since is not None:  # ended (or was interrupted) while still waiting
        waited += time.monotonic() - waiting_since
    facts["gpu_wait_s"] = round(waited, 3)
    if interrupted:
        raise Interrupted("interrupted: the child was killed")
    outcome.returncode = proc.returncode
    outcome.elapsed_s = round(time.monotonic() - t_start, 3)
    outcome.log_tail = tail(log_path)
    if getattr(proc, "server_died", False):
        outcome.add(
            {
                "event": "harness_error",
                "type": "ForkServerDied",
                "message": "the fork server died while this worker ran (its exit status "
                "is unknown); the server is restarted for the next run",
            }
        )
    return outcome, facts


def _keep_malformed(outcome: V.Outcome, bad: list[str]) -> None:
    room = MAX_MALFORMED - len(outcome.malformed_lines)
    if bad and room > 0:
        outcome.malformed_lines.extend(bad[:room])


def tail(path: Path, nbytes: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - nbytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
