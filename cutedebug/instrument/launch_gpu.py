"""Kernel launches of a watched command: which instrumented kernel is in flight (CUDA events
around each launch, for the stall rule), and the GPU token that lets one command at a time run
kernels while several compile (``mutate --jobs``; a triage's run workers, one token per GPU:
engine/lanes.py, taken by the worker before its launch, engine/worker.py).

The token is one file per GPU holding its owner's run tag (the lifeline's ``CUTEDEBUG_RUN_TAG``):
a process takes it atomically, its tag already in it (:func:`acquire_gpu_token`, emitting ``gpu_wait`` /
``gpu_acquired`` so its watchdog stops the clocks meanwhile); only its parent gives it back
(:func:`release_gpu_token`), after the owner and everything it started ended, and after the GPU
health check a kill calls for: nobody else launches on a GPU that is still being checked. (A
printf-bisection's runs, killed by design once their window passed, are not checked: their
token goes back when the worker ended; analyses/bisect.py.)
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any

from cutedebug.instrument.launch_context import kernel_names, note_launch

_WAITS_ATTR = "_cutedebug_wait_sites"
_GUARDED = "_cutedebug_gpu_guarded"
TOKEN_POLL_S = 0.02


def acquire_gpu_token(path: str, tag: str, emit: Any = None) -> float:
    """Block until this command (its run tag) holds the GPU token file; returns the seconds
    waited. The token is a file holding the owner's tag, linked in whole; every process of
    the owning command may go on, the others wait. The parent removes it when the owner ended."""
    t0, announced = time.monotonic(), False
    # The token appears with its owner's tag in it (a hard link of a file written first): a
    # process killed while taking it never leaves an empty token that nobody owns.
    mine = f"{path}.{tag}.{os.getpid()}"
    with open(mine, "w") as f:
        f.write(tag)
    try:
        while True:
            try:
                os.link(mine, path)
                break
            except FileExistsError:
                pass
            try:
                with open(path) as f:
                    owner = f.read()
            except FileNotFoundError:
                continue
            if owner == tag:
                break
            if not announced and emit is not None:
                emit("gpu_wait", owner=owner[:12])
                announced = True
            time.sleep(TOKEN_POLL_S)
    finally:
        os.unlink(mine)
    waited = time.monotonic() - t0
    if emit is not None and announced:
        emit("gpu_acquired", waited_s=round(waited, 3))
    return waited


def release_gpu_token(path: str | os.PathLike, tag: str) -> bool:
    """Give the token back if ``tag`` holds it (the owner's parent, after the owner ended);
    True when it was removed."""
    try:
        with open(path) as f:
            if f.read() != tag:
                return False
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def remove_gpu_token(path: str | os.PathLike) -> None:
    """Remove a token and the claims its takers left when they were killed while waiting (for
    the command that made the token, when no process of it can hold it any more)."""
    import glob

    for p in [os.fspath(path), *glob.glob(glob.escape(os.fspath(path)) + ".*")]:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def _ensure_gpu(state: Any) -> None:
    if not state.cfg.get("gpu_token") or state.gpu_granted:
        return
    tag = os.environ.get("CUTEDEBUG_RUN_TAG", str(os.getpid()))
    acquire_gpu_token(state.cfg["gpu_token"], tag, state.events.emit)
    state.gpu_granted = True


def _guard_launches(state: Any) -> None:
    """Before each launch of a compiled CuTe DSL function: take the GPU token at the first (with
    a token: mutants that compile at once still run their kernels one at a time), and note the
    kernels it runs (launch_context: the context is read for a sticky error when the process
    ends)."""
    from cutlass.base_dsl import jit_executor

    todo, seen = [jit_executor.JitCompiledFunction], set()
    executor = getattr(jit_executor, "JitExecutor", None)
    if executor is not None:
        todo.append(executor)
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        for name in ("__call__", "run_compiled_program"):
            fn = vars(cls).get(name)
            if fn is None or getattr(fn, _GUARDED, False):
                continue

            def guarded(self, *a, _orig=fn, **kw):
                _ensure_gpu(state)
                note_launch(state.launches, kernel_names(self, state.current))
                return _orig(self, *a, **kw)

            setattr(guarded, _GUARDED, True)
            guarded.__name__ = name
            setattr(cls, name, guarded)


def _tag_compiled(state: Any, compiled: Any, n_sites: int) -> None:
    """Mark a compiled function whose kernels have bounded waits, and make its launches
    tracked (CUDA events around them), so the monitor can tell a kernel in flight."""
    if not n_sites or state.monitor is None or state.cfg.get("stall_s") is None:
        return
    try:
        setattr(compiled, _WAITS_ATTR, n_sites)
    except (AttributeError, TypeError):
        return  # not ours to mark: its launches are not tracked (the deadline still applies)
    cls = type(compiled)
    if "_cutedebug_tracked" in vars(cls):
        return
    for klass in cls.__mro__:
        if "__call__" in vars(klass) and klass is not object:
            original = vars(klass)["__call__"]
            break
    else:
        return

    def __call__(self, *a, _orig=original, **kw):
        if getattr(self, _WAITS_ATTR, 0):
            _ensure_gpu(state)  # before the first event: waiting for the GPU is no stall
            return state.monitor.launches.around(lambda: _orig(self, *a, **kw))
        return _orig(self, *a, **kw)

    cls.__call__ = __call__
    cls._cutedebug_tracked = True


class InFlight:
    """Launches of instrumented kernels, each between two CUDA events on the current stream.
    ``running_since(now)``: when the oldest unfinished launch started (its first event
    completed: it may have waited behind other work), None when none is in flight."""

    def __init__(self, new_event: Any = None, maxlen: int = 256):
        self.new_event = new_event
        self.queue: collections.deque = collections.deque(maxlen=maxlen)
        self.started: float | None = None
        self.lock = threading.Lock()

    def around(self, launch: Any) -> Any:
        before = self.new_event()
        before.record()
        out = launch()
        after = self.new_event()
        after.record()
        with self.lock:
            self.queue.append((before, after))
        return out

    def running_since(self, now: float) -> float | None:
        with self.lock:
            while self.queue and self.queue[0][1].query():
                self.queue.popleft()
                self.started = None
            if not self.queue:
                return None
            if self.started is None and self.queue[0][0].query():
                self.started = now
            return self.started


def stalled(
    now: float, running_since: float | None, last_change: float, stall_s: float | None
) -> bool:
    """An instrumented kernel has been running, with no beacon moving, for stall_s."""
    if stall_s is None or running_since is None:
        return False
    return now - max(running_since, last_change) >= stall_s
