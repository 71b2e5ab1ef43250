"""The warm pool: a resident fork server (:mod:`cutedebug.engine.pool_server`) that
``cutedebug run`` reuses across invocations, so a run forks a worker that has torch and
cutlass imported already instead of paying the imports in a fresh interpreter.

- **Started on demand**: ``cutedebug run --warm`` (or ``CUTEDEBUG_WARM=1``) starts one when
  none is running; ``cutedebug pool start`` starts one ahead. A plain ``cutedebug run`` uses a
  running one and starts none; ``--no-warm`` (``CUTEDEBUG_WARM=0``) never uses one.
- **Keyed**: a server serves only commands whose :func:`fingerprint` it was started with: the
  interpreter (path, version, prefix), the cutedebug checkout and the size and mtime of each
  of its modules, the installed DSL and torch (version and install time), and the environment
  (every variable but a few volatile ones, :data:`VOLATILE_ENV`). Anything else gets another
  server: a stale one is never reused.
- **Safe after hangs**: each run is a new fork (the server never touches CUDA; a worker's
  state dies with it); a hung worker is killed by the command's watchdog as any worker is,
  and a worker whose command died is killed by the server. A server that does not answer a
  ping within :data:`PING_TIMEOUT_S` (wedged) or is gone (dead) is killed, swept by its tag
  and replaced; when no server can be had the run takes a fresh interpreter, never a
  traceback.
- **Bounded**: the server exits after ``idle_s`` seconds without a worker (default
  :data:`DEFAULT_IDLE_S`, ``--idle``, ``CUTEDEBUG_POOL_IDLE_S``), and ``cutedebug pool stop``
  stops it; ``cutedebug pool status`` lists what runs. A server that a source edit or an
  upgraded DSL / torch made unusable (same checkout and interpreter, other sources or
  installs: no command can match its key again) is retired by the command that starts its
  successor: it exits as soon as no worker of it runs and no command is connected to it,
  not after its idle time.

Servers live in :func:`pool_dir` (``CUTEDEBUG_POOL_DIR``, else ``$XDG_RUNTIME_DIR/cutedebug``
or ``/tmp/cutedebug-pool-UID``; private to the user): per key a socket, a metadata file, a
start lock and the server's log.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutedebug.engine import lifeline
from cutedebug.engine.forkserver import ForkedChild, ForkServerError
from cutedebug.engine.pool_key import (  # noqa: F401  (pool.X for the commands and tests)
    DIR_VAR,
    IDLE_VAR,
    REPO_ROOT,
    WARM_VAR,
    fingerprint,
    home,
    key_of,
    superseded,
)
from cutedebug.engine.pool_server import (
    NO_PRELOAD_VAR,
    POOL_TAG_VAR,
    compiled_folder,
    remove_compiled,
)

DEFAULT_IDLE_S = 900.0
MAX_IDLE_S = 24 * 3600.0
PING_TIMEOUT_S = 5.0
READY_TIMEOUT_S = 120.0
SPAWN_TIMEOUT_S = 30.0
MAX_REPLACEMENTS = 3


class PoolError(RuntimeError):
    """The pool cannot be used here (its folder is not ours or not usable)."""


# ---- where and what -------------------------------------------------------------------------
def pool_dir_path() -> Path:
    """Where the pool's files are (whether or not the folder exists)."""
    if os.environ.get(DIR_VAR):
        return Path(os.environ[DIR_VAR])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "cutedebug"
    return Path("/tmp") / f"cutedebug-pool-{os.getuid()}"


def pool_dir(create: bool = True) -> Path:
    """The user's private folder of pool servers (created 0700 when ``create``; PoolError
    when it is missing, not ours, or another user can write it)."""
    d = pool_dir_path()
    try:
        if create:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = d.stat()
    except OSError as e:
        raise PoolError(f"pool folder {d}: {e.strerror or e}") from None
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise PoolError(f"pool folder {d} is not private to this user (owner or mode)")
    return d


@dataclass(frozen=True)
class Paths:
    sock: Path
    meta: Path
    lock: Path
    log: Path

    @classmethod
    def of(cls, d: Path, key: str) -> Paths:
        p = cls(*(d / f"pool-{key}.{ext}" for ext in ("sock", "json", "lock", "log")))
        if len(os.fsencode(p.sock)) + 12 > 107:  # + the server's ".PID" while binding
            raise PoolError(f"pool folder {d}: path too long for a Unix socket ({DIR_VAR})")
        return p


def read_meta(path: Path) -> dict[str, Any] | None:
    """A server's metadata; None when unreadable or not a server's (not an object, a pid
    that is not a number)."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or type(meta.get("pid", 0)) is not int:
        return None
    return meta


def idle_seconds(value: str | float | None) -> float:
    """The idle exit in seconds: ``value``, else CUTEDEBUG_POOL_IDLE_S, else the default;
    ValueError naming the bounds when it is not a number in (0, MAX_IDLE_S]."""
    raw = value if value is not None else os.environ.get(IDLE_VAR) or DEFAULT_IDLE_S
    try:
        secs = float(raw)
    except (TypeError, ValueError):
        secs = -1.0
    if not 0 < secs <= MAX_IDLE_S:
        where = f" ({IDLE_VAR})" if value is None else ""
        raise ValueError(f"idle time {raw!r}{where}: a number of seconds in (0, {MAX_IDLE_S:g}]")
    return secs


# ---- the client ---------------------------------------------------------------------------------
class PoolClient:
    """A command's connection to a pool server, used where a ForkServer is (``spawn``,
    ``closed``, ``close``). Closing it ends only the connection (the server kills any worker
    of this connection still running), never the server."""

    bind_env: dict[str, str] = {}

    def __init__(self, paths: Paths, key: str, fp: dict[str, Any], idle_s: float):
        self.paths, self.key, self.fp, self.idle_s = paths, key, fp, idle_s
        self.sock: socket.socket | None = None
        self.server_pid: int | None = None
        self.generation = 0
        self.replacements = 0
        self.closed = False
        self.started_now = False  # this command started the server it first got
        self.preload = True  # off once a server's library import made it unsafe to fork from
        self.preload_off = ""  # why
        self.connect_s = 0.0
        self._reported_s = 0.0
        self._lock = threading.Lock()

    @property
    def info(self) -> dict[str, Any]:
        return {
            "pid": self.server_pid,
            "key": self.key,
            "started_now": self.started_now,
            "connect_s": round(self.connect_s, 3),
            # the run's library modules imported in the server (engine/preloads.py), or why not
            "preload": "on" if self.preload else f"off: {self.preload_off}",
        }

    def pool_info(self) -> dict[str, Any]:
        """What runner.run_once records of the run's server (evidence "pool"): its pid and
        key, whether this command started it, and the seconds spent getting it (connecting,
        starting, replacing) that no earlier run of this command reported."""
        info = {**self.info, "connect_s": round(self.connect_s - self._reported_s, 3)}
        self._reported_s = self.connect_s
        return info

    @property
    def alive(self) -> bool:
        return self.sock is not None and self.server_pid is not None and _running(self.server_pid)

    def serves(self, child: ForkedChild) -> bool:
        return self.alive and getattr(child, "generation", None) == self.generation

    def _ask(self, msg: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        assert self.sock is not None
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall((json.dumps(msg) + "\n").encode())
            buf = b""
            end = time.monotonic() + timeout
            while b"\n" not in buf:
                self.sock.settimeout(max(0.01, end - time.monotonic()))
                chunk = self.sock.recv(65536)
                if not chunk:
                    return None
                buf += chunk
            return json.loads(buf.split(b"\n", 1)[0])
        except (OSError, ValueError):
            return None

    def _connect(self) -> str:
        """Connect and ping: "ok", "none" (no server) or "bad" (dead or wedged)."""
        self._drop_socket()
        if not self.paths.sock.exists():
            return "none"
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(PING_TIMEOUT_S)
        try:
            s.connect(str(self.paths.sock))
        except OSError:
            s.close()
            return "bad"
        self.sock = s
        answer = self._ask({"op": "ping"}, PING_TIMEOUT_S)
        if not answer or answer.get("key") != self.key or not answer.get("pid"):
            self._drop_socket()
            return "bad"
        self.server_pid = int(answer["pid"])
        self.generation += 1
        return "ok"

    def _drop_socket(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.sock, self.server_pid = None, None

    def acquire(self, start: bool) -> bool:
        """Connect to this key's server, replacing a dead or wedged one, starting one when
        ``start``. False when there is none to use (none running and ``start`` false, or
        none could be started)."""
        t0 = time.monotonic()
        if not start and not self.paths.sock.exists():
            return False  # nothing to use or replace: no lock file either
        try:
            with _start_lock(self.paths.lock):
                state = self._connect()
                if state == "ok":
                    return True
                if state == "bad":
                    kill_server(self.paths)
                    start = True  # someone wanted a pool here: replace it
                if not start:
                    return False
                _start_server(self.paths, self.key, self.idle_s, home(self.fp), self.preload)
                self.started_now = self.started_now or self.generation == 0
                ok = self._connect() == "ok"
            if ok:
                retire_superseded(self.paths.sock.parent, self.key, home(self.fp))
            return ok
        except (OSError, TimeoutError, ForkServerError):
            return False
        finally:
            self.connect_s += time.monotonic() - t0

    def spawn(
        self, request_path: Path, log_path: Path, env: dict[str, str], job: str = "worker"
    ) -> ForkedChild:
        status = request_path.parent / "exit_status.json"
        status.unlink(missing_ok=True)
        tags = lifeline.child_env(None, env.get(lifeline.RUN_TAG_VAR, ""))[lifeline.SESSION_VAR]
        msg = {
            "op": "spawn",
            "request": str(request_path),
            "log": str(log_path),
            "status": str(status),
            "env": env,
            "job": job,
            "session_tags": tags.split(),
        }
        with self._lock:
            answer = self._ask_served(msg, SPAWN_TIMEOUT_S)
            if not answer or "pid" not in answer:
                self._drop_socket()
                raise ForkServerError(f"pool server did not fork: {answer or 'no answer'}")
            child = ForkedChild(int(answer["pid"]), status, self)
            child.generation = self.generation
            child.spare = bool(answer.get("spare"))  # engine/pool_spare.py
        return child

    def preload_modules(self, modules: list[str]) -> dict[str, Any]:
        """Have the server import ``modules`` now, ahead of the runs that need them (a
        library's import then counts in no run); its answer ({"preloaded", "preload_s",
        "preload": "on"}), or {"preload": "off: why"}: a server whose import made it unsafe
        to fork from is replaced by one without preloads, as :meth:`spawn` does."""
        msg = {"op": "preload", "modules": list(modules)}
        with self._lock:
            answer = self._ask_served(msg, READY_TIMEOUT_S)
        if not answer or "preloaded" not in answer:
            return {"preloaded": [], "preload": f"off: no answer (log: {self.paths.log})"}
        return answer

    def _ask_served(self, msg: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """``msg`` answered by this key's server (under the lock): a server that died or
        stopped answering since we connected is replaced, once per call and counted; one that
        a library import made unsafe to fork from (it gave up its socket path) by one without
        preloads, whose workers import the library themselves."""
        if self.closed:
            raise ForkServerError("the pool connection is closed")
        answer = self._ask(msg, timeout) if self.alive else None
        if answer is None:
            answer = self._replace(msg, timeout)
        if answer and answer.get("no_preload") and self.preload:
            self.preload, self.preload_off = False, str(answer.get("error"))
            answer = self._ask_another(msg, timeout)
        return answer

    def _replace(
        self, msg: dict[str, Any], timeout: float = SPAWN_TIMEOUT_S
    ) -> dict[str, Any] | None:
        """``msg`` to a replacement of a server that died or stopped answering since we
        connected; ForkServerError after MAX_REPLACEMENTS of them on this connection."""
        if self.replacements >= MAX_REPLACEMENTS:
            raise ForkServerError(f"pool server replaced {self.replacements} times")
        self.replacements += 1
        return self._ask_another(msg, timeout)

    def _ask_another(
        self, msg: dict[str, Any], timeout: float = SPAWN_TIMEOUT_S
    ) -> dict[str, Any] | None:
        """``msg`` sent again to this key's server after leaving the one we had (starting one
        when none runs); ForkServerError when none could be had."""
        self._drop_socket()
        if not self.acquire(start=True):
            raise ForkServerError(f"no pool server could be had (log: {self.paths.log})")
        return self._ask(msg, timeout)

    def close(self, timeout: float = 0.0) -> None:
        self.closed = True
        with self._lock:
            self._drop_socket()


def _running(pid: int) -> bool:
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001  (gone, or not ours)
        return False


@contextlib.contextmanager
def _start_lock(path: Path, timeout: float = READY_TIMEOUT_S + 10) -> Iterator[None]:
    """One command at a time starts or replaces a key's server (the others then find it)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        end = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > end:
                    raise TimeoutError(f"{path}: held for {timeout:g} s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


def _start_server(
    paths: Paths,
    key: str,
    idle_s: float,
    home_: dict[str, Any] | None = None,
    preload: bool = True,
) -> None:
    """Start a server for ``key`` detached from this command (its own session, no parent tie,
    none of this command's session tags: the command's keeper must not take it along) and
    wait until it answers; ForkServerError when it does not within READY_TIMEOUT_S."""
    for p in (paths.sock, paths.meta):
        p.unlink(missing_ok=True)
    tag = uuid.uuid4().hex
    env = dict(os.environ)
    env.pop(lifeline.RUN_TAG_VAR, None)
    outer = env.get(lifeline.SESSION_VAR, "").split()  # a harness this command runs under
    env[lifeline.SESSION_VAR] = lifeline.padded_session_tags(outer + [tag])
    env[lifeline.RUN_TAG_VAR] = lifeline.PLACEHOLDER_TAG
    env[POOL_TAG_VAR] = tag
    if preload:
        env.pop(NO_PRELOAD_VAR, None)
    else:  # its workers import their libraries themselves
        env[NO_PRELOAD_VAR] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    with open(paths.log, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cutedebug.engine.pool_server",
                str(paths.sock),
                str(paths.meta),
                key,
                f"{idle_s:g}",
                json.dumps(home_ or {}),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(REPO_ROOT),
            start_new_session=True,
        )
    _STARTED.append(proc)  # kept (no "still running" warning when it is collected), never waited
    end = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < end:
        meta = read_meta(paths.meta)
        if meta and meta.get("pid") == proc.pid and paths.sock.exists():
            return
        if proc.poll() is not None:
            raise ForkServerError(f"pool server exited at start (log: {paths.log})")
        time.sleep(0.02)
    _kill_pid(proc.pid, tag)
    raise ForkServerError(f"pool server not ready in {READY_TIMEOUT_S:g} s (log: {paths.log})")


_STARTED: list[subprocess.Popen] = []  # servers this process started (they outlive it)


def _kill_pid(pid: int, tag: str) -> bool:
    """SIGKILL server ``pid`` and everything carrying its pool tag, if ``pid`` still is that
    server (its environment carries the tag: a reused pid is left alone)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            is_it = f"{POOL_TAG_VAR}={tag}".encode() in f.read().split(b"\0")
    except OSError:
        is_it = False
    if is_it:
        lifeline.kill_group(pid)
    lifeline.sweep(tag, timeout=2.0)
    return is_it


def kill_server(paths: Paths) -> int | None:
    """Kill the server of ``paths`` (dead, wedged or asked to go) and remove its files.
    Returns the pid killed, if one was alive."""
    meta = read_meta(paths.meta) or {}
    killed = None
    if meta.get("pid") and meta.get("tag"):
        if _kill_pid(int(meta["pid"]), meta["tag"]):
            killed = int(meta["pid"])
    for p in (paths.sock, paths.meta):
        p.unlink(missing_ok=True)
    return killed


def retire_superseded(d: Path, key: str, current: dict[str, Any]) -> list[int]:
    """Ask every server in ``d`` that :func:`superseded` says no command can use again to
    exit once it is free (its workers done, its commands gone); returns their pids. Never
    raises: a server that does not answer keeps its idle exit."""
    retired = []
    for meta_path in sorted(d.glob("pool-*.json")):
        other = meta_path.stem.removeprefix("pool-")
        meta = read_meta(meta_path)
        if other == key or not meta or not superseded(meta, current):
            continue
        try:
            c = PoolClient(Paths.of(d, other), other, {}, DEFAULT_IDLE_S)
        except PoolError:
            continue
        if c._connect() == "ok":
            why = f"superseded by server {key} (the sources or installs changed)"
            if c._ask({"op": "retire", "why": why}, PING_TIMEOUT_S):
                retired.append(int(meta["pid"]))
        c.close()
    return retired


# ---- what the commands call ------------------------------------------------------------------
def warm_choice(flag: bool | None) -> bool | None:
    """--warm / --no-warm, else CUTEDEBUG_WARM ("1" start on demand, "0" never); None: use a
    running server, start none. ValueError naming the variable for any other value of it."""
    if flag is not None:
        return flag
    raw = os.environ.get(WARM_VAR, "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    if raw:
        raise ValueError(
            f"{WARM_VAR}={os.environ[WARM_VAR]!r}: allowed 1/true/yes/on, 0/false/no/off, "
            "or unset (use a running pool server, start none)"
        )
    return None


def client(start: bool, idle_s: float | None = None) -> PoolClient | None:
    """This environment's pool server (started when ``start``), or None when there is none
    to use; never raises for a pool that cannot be had (the run takes a fresh interpreter)."""
    try:
        fp = fingerprint()
        key = key_of(fp)
        d = pool_dir(create=start)  # a plain run only looks: it leaves no folder behind
        c = PoolClient(Paths.of(d, key), key, fp, idle_seconds(idle_s))
    except (PoolError, ValueError, OSError):
        return None
    return c if c.acquire(start) else None


def servers() -> list[dict[str, Any]]:
    """Every server in the pool folder: its metadata, whether it answers, whether it serves
    this environment."""
    d = pool_dir()
    mine = key_of(fingerprint())
    out = []
    for meta_path in sorted(d.glob("pool-*.json")):
        meta = read_meta(meta_path)
        if not meta:
            continue
        key = meta_path.stem.removeprefix("pool-")
        c = PoolClient(Paths.of(d, key), key, {}, meta.get("idle_s", DEFAULT_IDLE_S))
        answer = None
        if c._connect() == "ok":
            answer = c._ask({"op": "ping"}, PING_TIMEOUT_S)
        c.close()
        out.append(
            {
                **meta,
                "key": key,
                "this_env": key == mine,
                "answers": answer is not None,
                "alive": _running(int(meta.get("pid", 0) or 0)),
                "runs": (answer or {}).get("runs"),
                "workers": (answer or {}).get("workers"),
                "retired": (answer or {}).get("retired") or "",
                "spare": (answer or {}).get("spare"),  # engine/pool_spare.py
                "compiled": (answer or {}).get("compiled"),  # entries: engine/compile_cache.py
                "log": str(Paths.of(d, key).log),
            }
        )
    return out


def stop(key: str, timeout: float = 10.0) -> dict[str, Any]:
    """Stop server ``key``: asked first, killed when it does not go within ``timeout``;
    then everything carrying its tag is swept. Returns what happened, with the pids found
    carrying its tag afterwards (``left``: none, unless something resisted SIGKILL)."""
    d = pool_dir()
    paths = Paths.of(d, key)
    meta = read_meta(paths.meta) or {}
    pid, tag = meta.get("pid"), meta.get("tag")
    how = "not running"
    with _start_lock(paths.lock):
        c = PoolClient(paths, key, {}, DEFAULT_IDLE_S)
        if c._connect() == "ok":
            c._ask({"op": "stop"}, PING_TIMEOUT_S)
            c.close()
            how = "stopped"
            end = time.monotonic() + timeout
            while pid and _running(int(pid)) and time.monotonic() < end:
                time.sleep(0.02)
        if pid and _running(int(pid)):
            how = "killed" if kill_server(paths) else how
        for p in (paths.sock, paths.meta):
            p.unlink(missing_ok=True)
        for p in (paths.lock, paths.log):  # nothing of this server stays behind
            p.unlink(missing_ok=True)
        if pid and not _running(int(pid)):
            shutil.rmtree(compiled_folder(paths.meta, int(pid)), ignore_errors=True)
    left = [p.pid for p in lifeline.processes(tag)] if tag else []
    return {"key": key, "pid": pid, "how": how, "left": left}


def tidy() -> list[str]:
    """Remove the lock and log files of keys with no server (left by servers that exited
    when idle); returns their names."""
    d = pool_dir(create=False)
    gone = []
    for path in sorted([*d.glob("pool-*.lock"), *d.glob("pool-*.log")]):
        if not path.with_suffix(".sock").exists():  # (no Paths.of: a long folder is fine here)
            path.unlink(missing_ok=True)
            gone.append(path.name)
    return gone + remove_compiled(d)  # compile caches of servers that did not end cleanly
