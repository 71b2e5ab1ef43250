"""Fork server: one process that has imported cutlass (and torch, where the machine has a GPU),
forking a worker per run.

A fresh worker spends seconds importing torch and cutlass before any work. The server pays
that once; each run is then a fork. The server never touches CUDA (no context may exist
before a fork), each forked worker starts its own session (so the watchdog can kill its
process group) and writes its exit status to a file the runner polls.

Protocol (JSON lines): the runner writes {"request", "log", "status", "env"[, "job"]} to the
server's stdin (job "health": the GPU health check of cutedebug.engine.health instead of a worker);
the server imports the run's library modules if it has not yet (engine/preloads.py) and answers
{"pid": N} on stdout, or {"error", "no_preload": true} when an import initialized CUDA (the
client then restarts it with --no-preload). {"job": "preload", "modules": [...]} imports those
ahead of the runs that need them (a matrix's libraries at the server's start) and answers
{"preloaded": [...], "preload_s": S}, forking nothing. End of stdin stops the server, which kills
any worker still running. The parent-side handle is :class:`ForkServer`.

Lifelines (:mod:`cutedebug.engine.lifeline`): the server starts with the harness's session
tags and a placeholder run tag in its environment; each forked worker overwrites the
placeholder in place with its run's tag before anything else, so the sweep sees it in
``/proc/PID/environ``. The server dies with the harness (PDEATHSIG, end of stdin, the
keeper), each worker with the server (PDEATHSIG). A server that died is restarted by the next
:meth:`ForkServer.spawn`; a worker it took with it reads as ``server_died``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")
READY_TIMEOUT_S = 120.0
MAX_RESTARTS = 3


class ForkServerError(RuntimeError):
    """The fork server is dead and could not be restarted (callers exec a worker instead)."""


# ---- server side (python -m cutedebug.engine.forkserver) ----------------------------------------
def _write_status(path: str, returncode: int) -> None:
    """A worker's exit status for its runner; a run folder gone by then (removed under the
    run) loses that run's status only, it does not end the server that serves the others."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump({"returncode": returncode}, f)
        os.replace(tmp, path)
    except OSError as e:
        print(f"fork server: exit status {returncode} not written: {e}", file=sys.stderr)


def _child(req: dict[str, Any], server_pid: int) -> int:
    from cutedebug.engine import lifeline

    env = dict(req.get("env", {}))
    tag = env.pop(lifeline.RUN_TAG_VAR, None)
    if tag:
        lifeline.adopt_run_tag(tag)  # first: the sweep must see this worker as its run's
    os.setsid()
    lifeline.set_pdeathsig()
    if os.getppid() != server_pid:
        return 137
    fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    os.environ.update(env)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    if req.get("job") == "health":
        from cutedebug.engine import health

        return health.main()
    from cutedebug.engine import worker

    return worker.main([req["request"]])


def preload() -> None:
    """What every worker would import first (torch, cutlass, the worker and the
    instrumentation), imported once in the server. Imports only: nothing here may create a
    CUDA context (a context does not survive a fork). torch only where a GPU device node
    exists: elsewhere no worker imports it (compile-only workers never do; a run's device
    check and the health check answer from the device nodes), and it is ~1.7 s of CPU per
    server start."""
    import cutlass.cute  # noqa: F401

    from cutedebug import devices

    if devices.gpu_device_node() is not None:
        import torch  # noqa: F401

    from cutedebug import kernel_api  # noqa: F401
    from cutedebug.engine import (
        preloads,
        worker,  # noqa: F401
    )
    from cutedebug.instrument import (
        faults,  # noqa: F401
        probes,  # noqa: F401
    )

    preloads.freeze()


def serve(parent_pid: int | None = None, libraries: bool = True) -> int:
    """``libraries``: import each run's library modules in the server first
    (engine/preloads.py)."""
    from cutedebug.engine import lifeline, preloads

    lifeline.set_pdeathsig()  # dies with the harness thread that started it
    if parent_pid is not None and os.getppid() != parent_pid:
        return 1
    preload()
    libs = preloads.Preloader() if libraries else None
    children: dict[int, str] = {}
    server = os.getpid()
    print(json.dumps({"ready": True, "pid": server}), flush=True)
    stdin = sys.stdin.buffer
    buf = b""
    while True:
        ready, _, _ = select.select([stdin], [], [], 0.02)
        _reap(children)
        if not ready:
            continue
        chunk = os.read(stdin.fileno(), 65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line)
            t0 = time.monotonic()
            if libs is not None and (why := libs(req)):
                # never fork from a process with CUDA initialized: restart me without preloads
                print(json.dumps({"error": why, "no_preload": True}), flush=True)
                continue
            if req.get("job") == "preload":
                answer = preloaded(libs, time.monotonic() - t0)
                print(json.dumps(answer), flush=True)
                continue
            pid = fork_worker(req, server)
            children[pid] = req["status"]
            print(json.dumps({"pid": pid}), flush=True)
    for pid in list(children):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 5
    while children and time.monotonic() < deadline:
        _reap(children)
        time.sleep(0.01)
    return 0


def preloaded(libs: Any, seconds: float, who: str = "fork server") -> dict[str, Any]:
    """The answer to a "preload" request: the modules a server holds, or why none (``who``
    names the server in its log)."""
    if libs is None:
        return {"preloaded": [], "preload": "off: started without preloads"}
    names = sorted(libs.done - set(libs.failed))
    print(f"{who}: {len(names)} module(s) preloaded, {seconds:.2f} s", file=sys.stderr)
    answer = {"preloaded": names, "preload_s": round(seconds, 3), "preload": "on"}
    return answer | ({"failed": dict(libs.failed)} if libs.failed else {})


def fork_worker(req: dict[str, Any], server_pid: int, in_child=None) -> int:
    """Fork the worker (or health check) of ``req``; returns its pid. ``in_child``: called
    first in the forked child (the warm pool closes its sockets there)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:

        def body() -> int:
            if in_child is not None:
                in_child()
            return _child(req, server_pid)

        child_exit(body)
    return pid


def child_exit(body: Callable[[], int]) -> NoReturn:
    """In a forked child: run ``body`` and leave the process with its return code (70 when it
    raised, the traceback on stderr), the output flushed first; never returns to the caller's
    frames (the fork server's and the pool's loops live there)."""
    rc = 70
    try:
        rc = body()
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)


def reap_exited(children: dict[int, T], ended: Callable[[int, T, int], None]) -> None:
    """Reap, without blocking, the children that have exited while any of ``children`` is left;
    each one of them is popped and told to ``ended(pid, child, returncode)`` (other reaped
    pids are passed over). The fork server's and the pool server's one reaping loop."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        child = children.pop(pid, None)
        if child is not None:
            ended(pid, child, os.waitstatus_to_exitcode(status))


def _reap(children: dict[int, str]) -> None:
    """The fork server's workers that exited: each one's status file written."""
    reap_exited(children, lambda _pid, path, returncode: _write_status(path, returncode))


# ---- parent side -----------------------------------------------------------------------
class ForkedChild:
    """Popen-like handle on a worker forked by the server (poll / wait / pid).

    The server reaps the worker and writes its exit status to a file. When the server dies
    first, the worker (PDEATHSIG) dies with it and nobody writes that file: once the pid is
    gone, the child reads as ended with ``server_died`` set and an unknown status (-9)."""

    def __init__(self, pid: int, status_path: Path, server: ForkServer | None = None):
        self.pid, self.status_path, self.returncode = pid, status_path, None
        self.server, self.server_died = server, False

    def poll(self) -> int | None:
        if self.returncode is None and self.status_path.exists():
            try:
                self.returncode = json.loads(self.status_path.read_text())["returncode"]
            except (ValueError, KeyError, OSError):
                return None
        if (
            self.returncode is None
            and self.server is not None
            and not self.server.serves(self)
            and not _running(self.pid)
        ):
            if self.status_path.exists():  # written just before the server ended
                return self.poll()
            self.server_died, self.returncode = True, -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.01)
        return self.returncode


def _running(pid: int) -> bool:
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001  (NoSuchProcess, AccessDenied: not ours any more)
        return False


class ForkServer:
    """The runner's handle on a fork server process. Use as a context manager."""

    def __init__(
        self, env: dict[str, str], cwd: str, log_path: Path, bind_env: dict[str, str] | None = None
    ):
        self.env, self.cwd, self.log_path = env, cwd, log_path
        # the GPU binding (CUDA_VISIBLE_DEVICES) a fresh process replacing a forked one carries
        self.bind_env: dict[str, str] = dict(bind_env or {})
        # the server's answer to a preload request (runner.preload_forkserver), None before one
        self.preloaded: dict[str, Any] | None = None
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()  # one request/answer at a time (pool threads share it)
        self.generation = 0  # +1 per (re)start: a child belongs to one server
        self.restarts = 0
        self.closed = False
        self.preload_libraries = True  # off once a library import initialized CUDA

    def start(self) -> ForkServer:
        from cutedebug.engine import lifeline

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = lifeline.child_env(self.env, lifeline.PLACEHOLDER_TAG)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cutedebug.engine.forkserver", str(os.getpid())]
                + ([] if self.preload_libraries else ["--no-preload"]),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=lifeline.preexec(),
            )
        self.generation += 1
        try:
            line = self._readline(READY_TIMEOUT_S)
            ok = bool(line) and json.loads(line).get("ready")
        except ValueError:
            ok = False
        if not ok:
            self.close()
            raise ForkServerError(f"fork server did not start (log: {self.log_path})")
        self.closed = False
        return self

    def serves(self, child: ForkedChild) -> bool:
        """Is the server that forked ``child`` still running?"""
        return self.alive and getattr(child, "generation", None) == self.generation

    def _readline(self, timeout: float) -> bytes:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline() if ready else b""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(
        self, request_path: Path, log_path: Path, env: dict[str, str], job: str = "worker"
    ) -> ForkedChild:
        """Fork a worker for request_path (job "health": the GPU health check; request_path
        then only names the folder of its exit status)."""
        status = request_path.parent / "exit_status.json"
        status.unlink(missing_ok=True)
        msg = {
            "request": str(request_path),
            "log": str(log_path),
            "status": str(status),
            "env": env,
            "job": job,
        }
        with self._lock:
            answer, stopped = self._ask_served(msg)
            if stopped:  # asked again, of the server without preloads
                answer = self._ask(msg)
            pid = answer.get("pid")
            if not isinstance(pid, int):
                self._kill()
                raise ForkServerError(f"fork server did not answer (log: {self.log_path})")
            child = ForkedChild(pid, status, self)
            child.generation = self.generation
        return child

    def preload_modules(self, modules: list[str]) -> dict[str, Any]:
        """Import ``modules`` in the server now, ahead of the runs that need them; the
        server's answer ({"preloaded", "preload_s", "preload": "on"}), or {"preload": "off:
        why"} when they made it unsafe to fork from (it is then replaced by one without
        preloads, as :meth:`spawn` does)."""
        msg = {"job": "preload", "modules": list(modules)}
        with self._lock:
            answer, stopped = self._ask_served(msg)
            if stopped:
                return {"preloaded": [], "preload": f"off: {stopped}"}
            if "preloaded" not in answer:  # a late answer would be read as a spawn's: a new one
                self._kill()
                return {"preloaded": [], "preload": f"off: no answer (log: {self.log_path})"}
        return answer

    def _ask_served(self, msg: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """``msg``'s answer (the lock held; a dead server restarted first) and, when a library
        import made the server unsafe to fork from, why: it is then replaced by one without
        preloads, which has not been asked."""
        if not self.alive:
            self._restart()
        answer = self._ask(msg)
        if answer.get("no_preload") and self.preload_libraries:
            # a library import initialized CUDA in the server: a new one without preloads
            self._start_without_preloads()
            return answer, str(answer.get("error"))
        return answer, None

    def _start_without_preloads(self) -> None:
        self.preload_libraries = False
        self._kill()
        try:
            self.start()
        except (OSError, ForkServerError) as e:
            raise ForkServerError(f"fork server could not be restarted: {e}") from e

    def _ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Send a request, read the answer ({} when there is none); the server may import the
        run's libraries first (engine/preloads.py), seconds on a busy machine."""
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
            line = self._readline(READY_TIMEOUT_S)
            answer = json.loads(line) if line else {}
        except (OSError, ValueError):
            return {}
        return answer if isinstance(answer, dict) else {}

    def _restart(self) -> None:
        """Start a new server in place of a dead one (at most MAX_RESTARTS times)."""
        if self.closed or self.restarts >= MAX_RESTARTS:
            raise ForkServerError(
                "fork server is "
                + (
                    "closed"
                    if self.closed
                    else f"dead and was restarted {self.restarts} times already"
                )
            )
        self.restarts += 1
        self._kill()
        try:
            self.start()
        except (OSError, ForkServerError) as e:
            raise ForkServerError(f"fork server died and could not be restarted: {e}") from e

    def _kill(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f:
                    f.close()
            except OSError:
                pass
        self.proc = None

    def close(self, timeout: float = 10.0) -> None:
        """End of stdin: the server kills its workers and exits (killed after ``timeout``)."""
        self.closed = True
        if self.proc is None:
            return
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self._kill()

    def __enter__(self) -> ForkServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--no-preload"]
    code = serve(int(args[0]) if args else None, libraries="--no-preload" not in sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip the seconds of torch/cutlass teardown: nothing is left to clean
