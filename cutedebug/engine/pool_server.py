"""The warm pool's server: a resident fork server that ``cutedebug run`` reuses across
invocations (:mod:`cutedebug.engine.pool` is the client: it starts, finds, replaces and stops
servers).

    python -m cutedebug.engine.pool_server SOCKET META KEY IDLE_S [HOME_JSON]

Like the per-command fork server (:mod:`cutedebug.engine.forkserver`) it imports torch (where
a GPU device node exists), cutlass, the worker and the instrumentation once, never touches
CUDA, and forks one worker (or GPU health check) per request. Unlike it, it outlives the
command that started it: its own session, no parent tie. It is the one process of the
harness meant to stay, and it is bounded:

- it exits by itself after IDLE_S seconds in which no worker ran, once retired (a newer server
  of the same checkout and interpreter replaced it: its sources or installs changed, so no
  command can use it again) as soon as no worker runs and no client is connected, and at once
  on SIGTERM,
  SIGINT, SIGHUP, a client's ``stop``, or when its socket was taken over by another server;
  on the way out it kills whatever it forked and removes its socket and metadata;
- each worker belongs to the client connection that asked for it: when that connection
  closes (the command ended or died, SIGKILL included) a worker still running is killed with
  its process group, its descendants and everything carrying its run tag;
- each worker dies with the server (PDEATHSIG) and carries the client's run tag and session
  tags (the client's watchdog and keeper find it) besides the pool's tag (``pool stop``
  sweeps by it).

Protocol: JSON lines over a Unix socket. ``{"op": "ping"}`` -> ``{"ok", "pid", "key",
"workers", "runs", "retired"}``; ``{"op": "spawn", "request", "log", "status", "env", "job",
"session_tags"}`` -> ``{"pid"}`` (the exit status goes to the ``status`` file, as with the
fork server); ``{"op": "retire", "why"}`` -> ``{"ok": true}``, then the server exits when
nothing of its clients is left; ``{"op": "stop"}`` -> ``{"ok": true}``, then the server exits.
HOME_JSON (what :func:`cutedebug.engine.pool.home` says of the environment it serves) goes
into the metadata, for the client that retires superseded servers.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from cutedebug.engine import compile_cache, forkserver, lifeline, pool_spare, preloads
from cutedebug.instrument import probe_memory

POOL_TAG_VAR = "CUTEDEBUG_POOL_TAG"  # in the server's environment and every worker's
# "1": this server imports no run's library modules (its client asked after an import made
# a server unsafe to fork from: engine/preloads.py)
NO_PRELOAD_VAR = "CUTEDEBUG_POOL_NO_PRELOAD"
SELECT_S = 0.05


@dataclass
class _Client:
    sock: socket.socket
    buf: bytes = b""
    pids: set[int] = field(default_factory=set)


@dataclass
class _Worker:
    status: str
    run_tag: str
    client: _Client | None
    request: str = ""  # its request file (the events it wrote: ended_well)


class Server:
    def __init__(
        self,
        sock_path: str,
        meta_path: str,
        key: str,
        idle_s: float,
        home: dict[str, Any] | None = None,
    ):
        self.sock_path, self.meta_path, self.key, self.idle_s = sock_path, meta_path, key, idle_s
        self.home = home or {}
        self.retired = ""  # why, once a client said a newer server replaced this one
        self.tag = os.environ.get(POOL_TAG_VAR, "")
        self.pid = os.getpid()
        self.clients: dict[int, _Client] = {}
        self.workers: dict[int, _Worker] = {}
        self.runs = 0
        self.stopping = ""
        self.listener: socket.socket | None = None
        self.inode = 0
        self.wakeup: tuple[int, int] | None = None  # wake_on_child_exit's pipe (read, write)
        self.compiled: Path | None = None  # prepare_reuse: the compile cache's folder
        self.spare: pool_spare.Spare | None = None  # a worker forked ahead, context ready
        self.spare_wanted = False  # main: pool_spare.wanted()
        self.spare_ok = True  # the last worker ended well (or none ran yet)
        self.spare_failed = ""  # why a spare could not start: no more spares
        self.last_exit = 0.0  # when a worker was last reaped (monotonic)
        # each run's declared library modules, imported here once (engine/preloads.py)
        self.libs = None if os.environ.get(NO_PRELOAD_VAR) == "1" else preloads.Preloader()

    # ---- life ----
    def bind(self) -> None:
        tmp = f"{self.sock_path}.{self.pid}"
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(tmp)
        os.chmod(tmp, 0o600)
        s.listen(64)
        os.replace(tmp, self.sock_path)  # atomic: a client sees no socket or a listening one
        self.listener, self.inode = s, os.stat(self.sock_path).st_ino
        meta = {
            "pid": self.pid,
            "key": self.key,
            "tag": self.tag,
            "idle_s": self.idle_s,
            "started": time.time(),
            "python": sys.executable,
            "cwd": os.getcwd(),
            "home": self.home,
        }
        tmp_meta = f"{self.meta_path}.{self.pid}"
        with open(tmp_meta, "w") as f:
            json.dump(meta, f)
        os.replace(tmp_meta, self.meta_path)

    def prepare_reuse(self) -> None:
        """Before any fork: the probe buffer's address reserved (one address for every worker:
        instrument/probe_memory.py) and this server's compile cache folder
        (engine/compile_cache.py), beside its socket; folders of servers no longer running
        are removed first."""
        probe_memory.reserve()
        remove_compiled(Path(self.meta_path).parent)
        self.compiled = compiled_folder(self.meta_path, self.pid)
        shutil.rmtree(self.compiled, ignore_errors=True)
        self.compiled.mkdir(mode=0o700)

    def ours(self) -> bool:
        """Is the socket path still ours (not removed, not replaced by a newer server)?"""
        try:
            return os.stat(self.sock_path).st_ino == self.inode
        except OSError:
            return False

    def wake_on_child_exit(self) -> None:
        """A worker's exit wakes the loop at once (SIGCHLD through a wakeup pipe) instead of
        at the end of its select's SELECT_S: the exit status the command polls for, and so
        the run's verdict, comes that much sooner. Main thread only (signals)."""
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        self.wakeup = (r, w)

    def _drain_wakeup(self) -> None:
        assert self.wakeup is not None
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while os.read(self.wakeup[0], 512):
                pass

    def loop(self) -> str:
        assert self.listener is not None
        last_busy = time.monotonic()
        last_check = last_busy
        while not self.stopping:
            socks: list[Any] = [self.listener] + [c.sock for c in self.clients.values()]
            if self.wakeup is not None:
                socks.append(self.wakeup[0])
            spare_fd = self.spare.ready_fd if self.spare and not self.spare.ready else None
            if spare_fd is not None:
                socks.append(spare_fd)
            try:
                ready, _, _ = select.select(socks, [], [], SELECT_S)
            except InterruptedError:
                ready = []
            if self.wakeup is not None and self.wakeup[0] in ready:
                self._drain_wakeup()
            self.reap()
            if spare_fd is not None and spare_fd in ready and self.spare is not None:
                why = self.spare.read_ready()
                if why:
                    self.spare_failed = why
                    print(f"pool server {self.pid}: no spare worker: {why}", flush=True)
                    self.drop_spare()
            for s in ready:
                if s == spare_fd or (self.wakeup is not None and s == self.wakeup[0]):
                    continue
                if s is self.listener:
                    self.accept()
                else:
                    self.read(self.clients.get(s.fileno()))
            self.keep_spare()
            now = time.monotonic()
            if self.workers:
                last_busy = now
            elif self.retired and not self.clients:
                self.stopping = f"retired: {self.retired}"
            elif now - last_busy > self.idle_s:
                self.stopping = f"idle for {self.idle_s:g} s"
            if now - last_check > 1.0 and not (self.libs and self.libs.cuda_error):
                last_check = now  # (a server that gave up its socket path waits for its runs)
                if not self.ours():
                    self.stopping = "its socket was removed or taken over"
        return self.stopping

    def accept(self) -> None:
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        self.clients[conn.fileno()] = _Client(conn)

    def read(self, client: _Client | None) -> None:
        if client is None:
            return
        try:
            chunk = client.sock.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            self.drop(client)
            return
        client.buf += chunk
        while b"\n" in client.buf:
            line, client.buf = client.buf.split(b"\n", 1)
            try:
                req = json.loads(line)
                answer = self.handle(req, client)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                answer = {"error": f"{type(e).__name__}: {e}"}
            try:
                client.sock.sendall((json.dumps(answer) + "\n").encode())
            except OSError:
                self.drop(client)
                return

    def handle(self, req: dict[str, Any], client: _Client) -> dict[str, Any]:
        op = req["op"]
        if op == "ping":
            return {
                "ok": True,
                "pid": self.pid,
                "key": self.key,
                "workers": len(self.workers),
                "runs": self.runs,
                "retired": self.retired,
                "spare": self.spare_state(),
                "compiled": self.compiled_entries(),
            }
        if op == "stop":
            self.stopping = "stopped by a client"
            return {"ok": True, "pid": self.pid}
        if op == "retire":
            self.retired = str(req.get("why") or "replaced by a newer server")
            self.drop_spare()  # no run of this server's key is to come
            return {"ok": True, "pid": self.pid, "workers": len(self.workers)}
        if op == "preload":  # a client's libraries ahead of its runs (`pool start TARGET`)
            t0 = time.monotonic()  # the request's list as given: preloads.Preloader reads it
            if (refused := self.preload({**req, "job": "preload"})) is not None:
                return refused
            return {
                "ok": True,
                **forkserver.preloaded(self.libs, time.monotonic() - t0, "pool server"),
            }
        if op != "spawn":
            raise ValueError(f"unknown op {op!r}")
        tags = [t for t in req.get("session_tags", []) if isinstance(t, str)]
        mine = os.environ.get(lifeline.SESSION_VAR, "").split()
        socks = [self.listener] + [c.sock for c in self.clients.values()]

        def in_child() -> None:
            for s in socks:  # the worker holds no end of the pool's connections
                s.close()
            if self.wakeup is not None:  # nor the server's SIGCHLD wakeup
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in self.wakeup:
                    os.close(fd)
            lifeline.adopt_session_tags(mine + tags)
            if self.compiled is not None:  # the worker's compile reuses this server's
                os.environ[compile_cache.CACHE_VAR] = str(self.compiled)

        if (refused := self.preload(req)) is not None:
            return refused
        spare, self.spare = self.spare, None
        if spare is not None and pool_spare.takes(req):
            if spare.hand(req, mine + tags):  # its context is (being) made: the run goes there
                spare.close()
                return self.started(spare.pid, req, client, spare=True)
            spare = None  # gone: hand() closed its pipes, a worker's exit reaps it
        if spare is not None:  # not taken: kept for the next run
            self.spare = spare
        pid = forkserver.fork_worker(req, self.pid, in_child)
        return self.started(pid, req, client)

    def preload(self, req: dict[str, Any]) -> dict[str, Any] | None:
        """Import the run's declared library modules here once, before its worker is forked;
        the spare forked before them is dropped (a worker forked from it would import them
        again). When an import made this server unsafe to fork from (it initialized CUDA, or
        a child forked after it could not use the GPU), the server forks nothing more: it
        gives up its socket path, answers ``no_preload`` (the client starts a server without
        preloads) and exits once its running workers and its clients are gone."""
        if self.libs is None:
            return None
        done = len(self.libs.done)
        why = self.libs(req)
        if why:
            if not self.retired:
                self.retired = f"preloading stopped: {why}"
                self.drop_spare()
                if self.ours():
                    for path in (self.sock_path, self.meta_path):
                        with contextlib.suppress(OSError):
                            os.unlink(path)
                print(f"pool server {self.pid}: {self.retired}", flush=True)
            return {"error": why, "no_preload": True}
        if len(self.libs.done) != done:
            self.drop_spare()
        return None

    def started(
        self, pid: int, req: dict[str, Any], client: _Client, spare: bool = False
    ) -> dict[str, Any]:
        self.workers[pid] = _Worker(
            req["status"],
            (req.get("env") or {}).get(lifeline.RUN_TAG_VAR, ""),
            client,
            str(req.get("request") or ""),
        )
        client.pids.add(pid)
        self.runs += 1
        return {"pid": pid, "spare": spare}

    def compiled_entries(self) -> int | None:
        """Entries in this server's compile cache (engine/compile_cache.py)."""
        if self.compiled is None:
            return None
        try:
            return sum(1 for e in self.compiled.iterdir() if not e.name.startswith("."))
        except OSError:
            return None

    # ---- the spare worker (engine/pool_spare.py) ----
    def spare_state(self) -> str:
        if self.spare is not None:
            return "ready" if self.spare.ready else "starting"
        if not self.spare_wanted:
            return "off"
        if self.spare_failed:
            return f"none: {self.spare_failed}"
        return "none until a run ends well" if not self.spare_ok else "none"

    def keep_spare(self) -> None:
        """Fork a spare when one is wanted and none is there: no worker running, the last
        one ended well, no spare failed to start, the server not on its way out."""
        if self.spare is not None:
            try:
                done, _ = os.waitpid(self.spare.pid, os.WNOHANG)
            except ChildProcessError:  # reaped with the workers' exits: it is gone
                done = self.spare.pid
            if done:
                print(f"pool server {self.pid}: spare {self.spare.pid} ended", flush=True)
                self.spare.close()
                self.spare, self.spare_ok = None, False
            return
        if (
            not self.spare_wanted
            or self.workers
            or time.monotonic() - self.last_exit < pool_spare.AFTER_EXIT_S
            or not self.spare_ok
            or self.spare_failed
            or self.stopping
            or self.retired
        ):
            return
        socks = [self.listener] + [c.sock for c in self.clients.values()]
        request_r, request_w = os.pipe()
        ready_r, ready_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, stops)  # until the spare's own
        pid = os.fork()
        if pid != 0:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if pid == 0:

            def body() -> int:
                os.close(request_w)
                os.close(ready_r)
                for sock in socks:
                    sock.close()
                if self.wakeup is not None:
                    signal.set_wakeup_fd(-1)
                    for fd in self.wakeup:
                        os.close(fd)
                for sig in (signal.SIGCHLD, *stops):
                    signal.signal(sig, signal.SIG_DFL)  # not the server's stop handler
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
                if self.compiled is not None:
                    os.environ[compile_cache.CACHE_VAR] = str(self.compiled)
                return pool_spare.child_main(request_r, ready_w, self.pid)

            forkserver.child_exit(body)
        os.close(request_r)
        os.close(ready_w)
        self.spare = pool_spare.Spare(pid, request_w, ready_r)

    def drop_spare(self) -> None:
        spare, self.spare = self.spare, None
        if spare is None:
            return
        spare.close()
        with contextlib.suppress(OSError):
            os.kill(spare.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(spare.pid, 0)

    def reap(self) -> None:
        def ended(pid: int, w: _Worker, returncode: int) -> None:
            if w.client is not None:
                w.client.pids.discard(pid)
            self.spare_ok = pool_spare.ended_well(returncode, w.request)  # else no spare
            self.last_exit = time.monotonic()
            forkserver._write_status(w.status, returncode)

        forkserver.reap_exited(self.workers, ended)

    def drop(self, client: _Client) -> None:
        """The client went away: nobody watches its workers any more, so they end now."""
        self.clients.pop(client.sock.fileno(), None)
        for pid in list(client.pids):
            self.kill(pid)
        client.pids.clear()
        with contextlib.suppress(OSError):
            client.sock.close()

    def kill(self, pid: int) -> None:
        lifeline.kill_descendants(pid)
        lifeline.kill_group(pid)
        w = self.workers.get(pid)
        if w is not None and w.run_tag:
            lifeline.sweep(w.run_tag, timeout=1.0)

    def shutdown(self) -> None:
        self.drop_spare()
        for pid in list(self.workers):
            self.kill(pid)
        end = time.monotonic() + 5
        while self.workers and time.monotonic() < end:
            self.reap()
            time.sleep(0.01)
        if self.tag:
            lifeline.sweep(self.tag, timeout=1.0)  # anything of ours a worker left
        if self.ours():
            for path in (self.sock_path, self.meta_path):
                with contextlib.suppress(OSError):
                    os.unlink(path)
        for c in list(self.clients.values()):
            with contextlib.suppress(OSError):
                c.sock.close()
        if self.listener is not None:
            self.listener.close()
        if self.compiled is not None:
            shutil.rmtree(self.compiled, ignore_errors=True)


def compiled_folder(meta_path: str | Path, pid: int) -> Path:
    """The compile cache folder of the server of ``meta_path`` (pool-KEY.json) and ``pid``."""
    meta = Path(meta_path)
    return meta.parent / f"{meta.name.removesuffix('.json')}.{pid}.compiled"


def remove_compiled(folder: Path, only_dead: bool = True) -> list[str]:
    """Remove the compile cache folders in ``folder`` of servers no longer running (all of
    them: ``only_dead`` False); returns their names."""
    gone = []
    for path in sorted(folder.glob("pool-*.compiled")):
        pid = path.suffixes[-2].lstrip(".") if len(path.suffixes) >= 2 else ""
        if not only_dead or (pid.isdigit() and not psutil.pid_exists(int(pid))):
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path.name)
    return gone


def main(argv: list[str]) -> int:
    sock_path, meta_path, key, idle_s = argv[0], argv[1], argv[2], float(argv[3])
    home = json.loads(argv[4]) if len(argv) > 4 else None
    server = Server(sock_path, meta_path, key, idle_s, home if isinstance(home, dict) else None)

    def stop(signum, _frame) -> None:
        server.stopping = f"signal {signal.Signals(signum).name}"

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    t0 = time.monotonic()
    forkserver.preload()
    server.prepare_reuse()
    server.spare_wanted = pool_spare.wanted()
    server.bind()
    server.wake_on_child_exit()
    print(
        f"pool server {server.pid} ready in {time.monotonic() - t0:.2f} s (key {key}, "
        f"idle exit after {idle_s:g} s)",
        flush=True,
    )
    why = "?"
    try:
        why = server.loop()
    finally:
        server.shutdown()
        print(f"pool server {server.pid} exits: {why} ({server.runs} run(s))", flush=True)
    return 0


if __name__ == "__main__":
    code = 1
    try:
        code = main(sys.argv[1:])
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip the seconds of torch/cutlass teardown
