"""Lifelines: no process the harness starts may outlive it.

Three ties, each covering what the others cannot:

1. **Tags.** Every child's environment carries ``CUTEDEBUG_RUN_TAG`` (one 32-hex tag per
   run) and ``CUTEDEBUG_SESSION_TAGS`` (one tag per harness process, appended when harnesses
   nest, plus one per :func:`scope`). ``/proc/PID/environ`` shows them for the child and for
   every descendant, grandchildren in sessions of their own and forks without exec included,
   so :func:`sweep` finds what the process group misses. A fork-server worker is not exec'd:
   the server starts with a placeholder run tag and each forked worker overwrites it *in
   place* (:func:`adopt_run_tag`) before it runs anything, so ``/proc/PID/environ`` shows the
   worker's own tag.
2. **PR_SET_PDEATHSIG** (SIGKILL), set in each child between fork and exec
   (:func:`preexec`), with a check that the parent did not die before it was set. It fires
   when the *thread* that started the child ends, so it is a second tie, not the only one.
3. **The keeper**: a tiny process (its own session, no tags) started once per harness
   process. It holds the read end of a pipe whose write end only the harness holds. However
   the harness ends (SIGKILL included), the pipe then reads end-of-file and the keeper
   freezes and kills everything carrying the harness's session tag, removes the temporary
   folders registered with it (:func:`register_tempdir`) and gives back the GPU tokens its
   runs still held (:func:`guard_token`).

:func:`sweep` is the one sweep of the package: the watchdog calls it after every run (by the
run's tag), a triage after everything (by its :func:`scope` tag).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator

import psutil

RUN_TAG_VAR = "CUTEDEBUG_RUN_TAG"
SESSION_VAR = "CUTEDEBUG_SESSION_TAGS"
PLACEHOLDER_TAG = "0" * 32  # a fork server's own run tag, overwritten per worker
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PTRACER = 0x59616D61  # Yama
PR_SET_PTRACER_ANY = (1 << 64) - 1  # (unsigned long) -1

# The keeper runs with -I -S: stdlib only, no site, nothing of cutedebug (it must start in
# milliseconds and work where cutedebug is not importable by a bare interpreter).
KEEPER_SRC = r"""
import os, shutil, signal, sys, time
tag = sys.argv[1].encode()
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
dirs, tokens, buf = set(), set(), b""
while True:
    try:
        chunk = os.read(0, 65536)
    except InterruptedError:
        continue
    if not chunk:
        break
    buf += chunk
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        op, _, path = line.decode("utf-8", "surrogateescape").partition(" ")
        if op == "rm":
            dirs.add(path)
        elif op == "keep":
            dirs.discard(path)
        elif op in ("token", "untoken"):  # "token TAG PATH": a GPU token its run may hold
            owner, _, token = path.partition(" ")
            (tokens.add if op == "token" else tokens.discard)((owner, token))

def ours():
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/" + name + "/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        for item in env.split(b"\0"):
            if item.startswith(b"CUTEDEBUG_SESSION_TAGS=") and tag in item[23:].split():
                found.append(int(name))
                break
    return found

for _ in range(50):
    pids = ours()
    if not pids:
        break
    for sig in (signal.SIGSTOP, signal.SIGKILL):    # frozen first: no new forks meanwhile
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    time.sleep(0.02)
for d in dirs:
    shutil.rmtree(d, ignore_errors=True)
for owner, token in tokens:  # still held by a run of ours (all dead now): give it back
    try:
        with open(token) as f:
            held = f.read() == owner
        if held:
            os.unlink(token)
    except OSError:
        pass
"""


class _Keeper:
    """This process's keeper and session tag (started on first use; a forked copy of the
    harness starts its own)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid: int | None = None
        self.tag = ""
        self.proc: subprocess.Popen | None = None

    def ensure(self) -> str:
        with self.lock:
            if self.pid == os.getpid() and self.proc is not None and self.proc.poll() is None:
                return self.tag
            self.pid, self.tag = os.getpid(), uuid.uuid4().hex
            env = {k: v for k, v in os.environ.items() if k not in (RUN_TAG_VAR, SESSION_VAR)}
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", KEEPER_SRC, self.tag],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                cwd="/",
            )
            return self.tag

    def send(self, line: str) -> None:
        self.ensure()
        with self.lock:
            try:
                assert self.proc is not None and self.proc.stdin is not None
                self.proc.stdin.write((line + "\n").encode("utf-8", "surrogateescape"))
                self.proc.stdin.flush()
            except (OSError, ValueError):
                pass


_KEEPER = _Keeper()


def session_tag() -> str:
    """The harness process's session tag (starts its keeper on first use)."""
    return _KEEPER.ensure()


_TIED: list[int] = []


def tie_to_parent(poll_s: float = 0.25) -> bool:
    """Make this harness process die when its own parent does.

    For a harness that is itself a child: a pytest-xdist worker runs cutedebug items for the
    pytest process that started it, and when that one is SIGKILLed the worker would go on
    waiting on its hung child. PR_SET_PDEATHSIG on ourselves (SIGKILL), a check that the
    parent is not already gone, and a daemon thread that watches ``getppid`` (PDEATHSIG follows
    the parent *thread*). When it fires, this process's keeper (started here if it was not)
    sweeps everything carrying our session tag. Returns False when there is no parent to tie
    to (already adopted by init or a subreaper). Idempotent.
    """
    if _TIED:
        return True
    parent = os.getppid()
    if parent <= 1:
        return False
    session_tag()  # the keeper must exist before the tie can fire
    set_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    _TIED.append(parent)

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch_parent, name="cutedebug-parent-tie", daemon=True).start()
    return True


def register_tempdir(path: str | os.PathLike) -> None:
    """Have the keeper remove ``path`` if the harness dies before :func:`release_tempdir`."""
    _KEEPER.send(f"rm {os.fspath(path)}")


def release_tempdir(path: str | os.PathLike) -> None:
    _KEEPER.send(f"keep {os.fspath(path)}")


def guard_token(path: str | os.PathLike, run_tag: str) -> None:
    """Have the keeper give the GPU token ``path`` back if the harness dies while ``run_tag``
    may hold it (after it killed everything of ours): other harnesses sharing the GPU (xdist
    workers on one GPU) would otherwise wait for it for ever. :func:`unguard_token` after the
    harness gave it back itself."""
    _KEEPER.send(f"token {run_tag} {os.fspath(path)}")


def unguard_token(path: str | os.PathLike, run_tag: str) -> None:
    _KEEPER.send(f"untoken {run_tag} {os.fspath(path)}")


def make_tempdir(prefix: str) -> str:
    """A new private temporary folder, registered with the keeper *before* it exists (so no
    moment where a SIGKILL of the harness would leave it behind)."""
    import tempfile

    session_tag()
    path = os.path.join(tempfile.gettempdir(), f"{prefix}{uuid.uuid4().hex[:12]}")
    register_tempdir(path)
    os.mkdir(path, 0o700)
    return path


def remove_tempdir(path: str | os.PathLike) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    release_tempdir(path)


def new_run_tag() -> str:
    return uuid.uuid4().hex


def child_env(env: dict[str, str] | None, run_tag: str) -> dict[str, str]:
    """``env`` (default: ours) with the run tag and every session tag a child must carry."""
    out = dict(os.environ if env is None else env)
    out[RUN_TAG_VAR] = run_tag
    tags = out.get(SESSION_VAR, "").split()
    for t in os.environ.get(SESSION_VAR, "").split() + [session_tag()]:
        if t not in tags:
            tags.append(t)
    out[SESSION_VAR] = " ".join(tags)
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out


@contextlib.contextmanager
def scope() -> Iterator[str]:
    """A tag every child started inside the block carries (through ``os.environ``), for a
    final :func:`sweep` over all of them; a triage uses one."""
    tag = uuid.uuid4().hex
    saved = os.environ.get(SESSION_VAR)
    os.environ[SESSION_VAR] = f"{saved} {tag}" if saved else tag
    try:
        yield tag
    finally:
        if saved is None:
            os.environ.pop(SESSION_VAR, None)
        else:
            os.environ[SESSION_VAR] = saved


# ---- in the child ----------------------------------------------------------------------------
def _libc():
    return ctypes.CDLL(None, use_errno=True)


def set_pdeathsig(sig: int = signal.SIGKILL) -> bool:
    """PR_SET_PDEATHSIG: the kernel sends ``sig`` when our parent thread ends."""
    try:
        return _libc().prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def preexec(parent_pid: int | None = None):
    """A ``preexec_fn`` for Popen: PDEATHSIG, and exit at once if the parent already died."""
    parent = os.getpid() if parent_pid is None else parent_pid
    prctl = _libc().prctl  # resolved before the fork: the child only calls it

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(137)

    return arm


def adopt_run_tag(tag: str) -> bool:
    """Overwrite this process's run tag in place, in the environment block that
    ``/proc/self/environ`` shows (a forked worker of a server started with
    :data:`PLACEHOLDER_TAG`; same length only), and in ``os.environ``. Returns whether
    ``/proc/self/environ`` now shows ``tag``."""
    raw = tag.encode()
    if len(raw) == len(PLACEHOLDER_TAG):
        libc = _libc()
        libc.getenv.restype = ctypes.c_void_p
        ptr = libc.getenv(RUN_TAG_VAR.encode())  # still the string exec put on the stack
        if ptr and ctypes.string_at(ptr) == PLACEHOLDER_TAG.encode():
            ctypes.memmove(ptr, raw, len(raw))
    os.environ[RUN_TAG_VAR] = tag  # what children exec'd from here inherit
    try:
        with open("/proc/self/environ", "rb") as f:
            return f"{RUN_TAG_VAR}={tag}".encode() in f.read().split(b"\0")
    except OSError:
        return False


SESSION_SLOT = 33 * 12  # bytes a warm pool's server reserves for its workers' session tags


def padded_session_tags(tags: list[str]) -> str:
    """A session-tags value with room for more tags, written in place later by
    :func:`adopt_session_tags` (a resident server's environment; ``split()`` ignores the
    padding)."""
    return " ".join(tags).ljust(SESSION_SLOT)


def adopt_session_tags(tags: list[str]) -> bool:
    """Overwrite this process's session tags in place, as :func:`adopt_run_tag` does the run
    tag: a worker forked by the warm pool takes the tags of the command that asked for it (its
    keeper then kills it if that command dies) after the pool's own. Tags that do not fit the
    padded value the server started with are left out, the first ones kept. Returns whether
    ``/proc/self/environ`` shows every tag."""
    libc = _libc()
    libc.getenv.restype = ctypes.c_void_p
    ptr = libc.getenv(SESSION_VAR.encode())
    room = len(ctypes.string_at(ptr)) if ptr else 0
    kept: list[str] = []
    for t in tags:
        if t not in kept and len(" ".join(kept + [t])) <= room:
            kept.append(t)
    value = " ".join(kept)
    if ptr and room:
        ctypes.memmove(ptr, value.ljust(room).encode(), room)
    os.environ[SESSION_VAR] = value  # what children exec'd from here inherit
    try:
        with open("/proc/self/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(f"{SESSION_VAR}=".encode()):
                    shown = item.decode(errors="replace").partition("=")[2].split()
                    return all(t in shown for t in tags)
    except OSError:
        pass
    return False


def allow_ptrace() -> bool:
    """PR_SET_PTRACER_ANY: any process of ours may attach a debugger to this one (Yama's
    ptrace_scope 1 allows only ancestors: the harness's cuda-gdb is a sibling of its worker).
    False where it could not be set; without Yama there is nothing to set (also False)."""
    try:
        prctl = _libc().prctl
        prctl.restype = ctypes.c_int
        return prctl(PR_SET_PTRACER, ctypes.c_ulong(PR_SET_PTRACER_ANY), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """PR_SET_CHILD_SUBREAPER: orphans of our subtree (a daemon that double-forked, setsid'd
    and scrubbed its environment, so no tag finds it) are re-parented to us, not to init, and
    stay in our tree where :func:`kill_descendants` finds them. The worker sets it."""
    try:
        return _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def kill_descendants(pid: int | None = None) -> list[int]:
    """Freeze, then SIGKILL every descendant of ``pid`` (default: us), adopted orphans
    included; reaps them when they are ours. Returns their pids."""
    try:
        kids = psutil.Process(pid or os.getpid()).children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for k in kids:
            try:
                k.send_signal(sig)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    if pid is None or pid == os.getpid():
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            try:
                done, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if done == 0:
                time.sleep(0.005)
    return [k.pid for k in kids]


# ---- the sweep -------------------------------------------------------------------------------
def _pids_carrying(tag: str) -> list[int]:
    """Pids (not ours) whose /proc environ holds ``tag`` as run tag or session tag: read
    directly, a few hundred processes in milliseconds (psutil objects cost 10x more)."""
    me, raw = os.getpid(), tag.encode()
    run_item = f"{RUN_TAG_VAR}={tag}".encode()
    session_key = f"{SESSION_VAR}=".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if raw not in env:
            continue
        for item in env.split(b"\0"):
            if item == run_item or (
                item.startswith(session_key) and raw in item[len(session_key) :].split()
            ):
                found.append(int(name))
                break
    return found


def processes(tag: str) -> list[psutil.Process]:
    """Live processes (not us, not zombies) whose environment carries ``tag`` as their run tag
    or one of their session tags."""
    found = []
    for pid in _pids_carrying(tag):
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def sweep(tag: str, timeout: float = 3.0) -> list[int]:
    """Kill what carries ``tag``: frozen first (no new forks meanwhile), then killed, then
    waited for; a few rounds for what appeared meanwhile. Returns the pids killed."""
    swept: list[int] = []
    for _ in range(5):
        procs = processes(tag)
        if not procs:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for p in procs:
                try:
                    p.send_signal(sig)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
        swept += [p.pid for p in procs]
        _wait_dead(procs, timeout)
    return sorted(set(swept))


def _wait_dead(procs: list[psutil.Process], timeout: float) -> None:
    """Until each is gone or a zombie (psutil.wait_procs counts a zombie whose parent does not
    reap it as running, and backs off: seconds for what died in milliseconds)."""
    end = time.monotonic() + timeout
    pending = list(procs)
    while pending and time.monotonic() < end:
        alive = []
        for p in pending:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        pending = alive
        if pending:
            time.sleep(0.01)


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` and ``pid`` itself (a child that has not
    reached setsid yet is not a group leader)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def run_tool(
    argv: list[str],
    timeout_s: float,
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> subprocess.CompletedProcess:
    """Run a short-lived tool (cuda-gdb, nvdisasm, nvidia-smi) as a tied child and return its
    completed process (text stdout and stderr).

    The same ties as a worker: a run tag, PR_SET_PDEATHSIG, its own process group. On the
    time limit (or any exception here, an interrupt included) the group is killed and the tag
    swept before ``subprocess.TimeoutExpired`` is raised; after a normal exit the tag is swept
    too, so nothing the tool left running in the background outlives the call. Output goes to
    temporary files, not pipes: a background process that inherited them cannot hold the call
    open after the tool itself has exited.
    """
    tag = new_run_tag()
    with tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=fout,
            stderr=ferr,
            env=child_env(env, tag),
            cwd=cwd,
            start_new_session=True,
            preexec_fn=preexec(),
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BaseException:
            kill_group(proc.pid)
            sweep(tag)
            proc.wait()
            raise
        if timed_out:
            kill_group(proc.pid)
        sweep(tag, timeout=3.0 if timed_out else 1.0)
        proc.wait()
        out, err = (_read_text(f) for f in (fout, ferr))
    if timed_out:
        raise subprocess.TimeoutExpired(argv, timeout_s, out, err)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _read_text(f) -> str:
    f.seek(0)
    return f.read().decode("utf-8", "replace")
