"""Fork server: one process that has imported torch and cutlass, forking a worker per run.

A fresh worker spends seconds importing torch and cutlass before any work. The server pays
that once; each run is then a fork. The server never touches CUDA (no context may exist
before a fork), each forked worker starts its own session (so the watchdog can kill its
process group) and writes its exit status to a file the runner polls.

Protocol (JSON lines): the runner writes {"request", "log", "status", "env"[, "job"]} to the
server's stdin (job "health": the GPU health check of cutedebug.engine.health instead of a worker);
the server answers {"pid": N} on stdout. End of stdin stops the server, which kills
any worker still running. The parent-side handle is :class:`ForkServer`.
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
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 120.0


# ---- server side (python -m cutedebug.engine.forkserver) ----------------------------------------
def _write_status(path: str, returncode: int) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"returncode": returncode}, f)
    os.replace(tmp, path)


def _child(req: dict[str, Any]) -> int:
    os.setsid()
    fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    os.environ.update(req.get("env", {}))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    if req.get("job") == "health":
        from cutedebug.engine import health

        return health.main()
    from cutedebug.engine import worker

    return worker.main([req["request"]])


def serve() -> int:
    # Imports only: nothing here may create a CUDA context.
    import cutlass.cute  # noqa: F401
    import torch  # noqa: F401

    from cutedebug import kernel_api  # noqa: F401
    from cutedebug.instrument import faults  # noqa: F401
    from cutedebug.instrument import probes  # noqa: F401
    from cutedebug.engine import worker  # noqa: F401

    children: dict[int, str] = {}
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
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
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                rc = 70
                try:
                    rc = _child(req)
                except BaseException:
                    traceback.print_exc()
                finally:
                    try:
                        sys.stdout.flush()
                        sys.stderr.flush()
                    finally:
                        os._exit(rc)
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


def _reap(children: dict[int, str]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        path = children.pop(pid, None)
        if path:
            _write_status(path, os.waitstatus_to_exitcode(status))


# ---- parent side -----------------------------------------------------------------------
class ForkedChild:
    """Popen-like handle on a worker forked by the server (poll / wait / pid)."""

    def __init__(self, pid: int, status_path: Path):
        self.pid, self.status_path, self.returncode = pid, status_path, None

    def poll(self) -> int | None:
        if self.returncode is None and self.status_path.exists():
            try:
                self.returncode = json.loads(self.status_path.read_text())["returncode"]
            except (ValueError, KeyError, OSError):
                return None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.01)
        return self.returncode


class ForkServer:
    """The runner's handle on a fork server process. Use as a context manager."""

    def __init__(self, env: dict[str, str], cwd: str, log_path: Path):
        self.env, self.cwd, self.log_path = env, cwd, log_path
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()    # one request/answer at a time (pool threads share it)

    def start(self) -> ForkServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "cutedebug.engine.forkserver"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log, env=self.env, cwd=self.cwd,
                                     start_new_session=True)
        log.close()
        line = self._readline(READY_TIMEOUT_S)
        if not line or not json.loads(line).get("ready"):
            self.close()
            raise RuntimeError(f"fork server did not start (log: {self.log_path})")
        return self

    def _readline(self, timeout: float) -> bytes:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline() if ready else b""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self, request_path: Path, log_path: Path, env: dict[str, str],
              job: str = "worker") -> ForkedChild:
        """Fork a worker for request_path (job "health": the GPU health check; request_path
        then only names the folder of its exit status)."""
        assert self.proc is not None and self.proc.stdin is not None
        status = request_path.parent / "exit_status.json"
        msg = {"request": str(request_path), "log": str(log_path), "status": str(status),
               "env": env, "job": job}
        with self._lock:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
            line = self._readline(30.0)
        if not line:
            raise RuntimeError("fork server did not answer")
        return ForkedChild(json.loads(line)["pid"], status)

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait(timeout=10)
        finally:
            if self.proc.stdout:
                self.proc.stdout.close()
            self.proc = None

    def __enter__(self) -> ForkServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(serve())
