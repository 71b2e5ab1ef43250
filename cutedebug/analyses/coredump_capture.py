"""GPU coredumps, the capture half (cutedebug.analyses.coredump reads them): the driver's
settings for a worker whose hangs and crashes should leave a core in its run folder, the
user-triggered dump through the driver's named pipe, and the wait until the core is complete.

- :func:`worker_env`: the settings, set in the worker before CUDA initializes (request
  ``env``): a dump through ``<run dir>/coredump.pipe.<pid>``, a dump on a GPU exception, the
  sections :func:`generation_flags` leaves out, no abort (the worker still reports its CUDA
  error), the driver's progress lines in the worker's log.
- :func:`before_kill`: the watchdog's hook on a hang: writes the pipe and waits, bounded
  (:data:`DUMP_LIMIT_S`), until the core is complete (:func:`trigger`); then the child is
  killed as usual, and falls back to the plain kill when no core comes.
- :func:`dump_all`: every live process of a run folder (``cutedebug exec --coredump``).
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any

from cutedebug.errors import UsageError

SKIP_MEMORY = "skip_global_memory,skip_shared_memory,skip_local_memory"
# What the dump may leave out (the driver's CUDA_COREDUMP_GENERATION_FLAGS names). The default
# is SKIP_MEMORY, the flags every H200 run used; CUTEDEBUG_COREDUMP_FLAGS=a,b,... picks others
# (the GPU step compares them on a big grid: which the reader still needs is measured there).
FLAGS_VAR = "CUTEDEBUG_COREDUMP_FLAGS"
SKIP_FLAGS = (
    "skip_nonrelocated_elf_images",
    "skip_global_memory",
    "skip_shared_memory",
    "skip_local_memory",
    "skip_constbank_memory",
)
PIPE_NAME = "coredump.pipe"  # the driver creates <run dir>/coredump.pipe.<pid>
CORE_NAME = "coredump"  # the driver writes <run dir>/coredump.<pid>.nvcudmp
DUMP_LIMIT_S = 10.0


# ---- capture --------------------------------------------------------------------------------
def generation_flags() -> str:
    """The dump's CUDA_COREDUMP_GENERATION_FLAGS: SKIP_MEMORY, or $CUTEDEBUG_COREDUMP_FLAGS
    (names of SKIP_FLAGS), and skip_abort always (the worker reports its CUDA error).
    Raises UsageError on a name the driver does not know."""
    raw = os.environ.get(FLAGS_VAR, "").strip()
    names = [x.strip() for x in (raw or SKIP_MEMORY).split(",") if x.strip()]
    bad = [x for x in names if x not in SKIP_FLAGS]
    if bad:
        raise UsageError(
            f"{FLAGS_VAR}={raw!r}: {', '.join(bad)} not allowed; names are "
            f"{', '.join(SKIP_FLAGS)} (comma-separated; skip_abort is always added)"
        )
    return ",".join([*dict.fromkeys(names), "skip_abort"])


def worker_env(run_dir: Path | str) -> dict[str, str]:
    """Driver settings for a worker whose hangs and crashes should leave a core in run_dir.
    Must be in the environment before CUDA initializes (the worker sets them first thing).
    The driver's progress lines (CUDA_COREDUMP_SHOW_PROGRESS: a timestamp per phase of the
    dump) go to the worker's log."""
    d = Path(run_dir)
    return {
        "CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1",
        "CUDA_ENABLE_COREDUMP_ON_EXCEPTION": "1",
        "CUDA_ENABLE_CPU_COREDUMP_ON_EXCEPTION": "0",
        "CUDA_COREDUMP_PIPE": str(d / f"{PIPE_NAME}.%p"),
        "CUDA_COREDUMP_FILE": str(d / f"{CORE_NAME}.%p.nvcudmp"),
        "CUDA_COREDUMP_GENERATION_FLAGS": generation_flags(),
        "CUDA_COREDUMP_SHOW_PROGRESS": "1",
    }


def cores(run_dir: Path | str, pid: int | None = None) -> list[Path]:
    pat = f"{CORE_NAME}.{pid if pid is not None else '*'}.nvcudmp*"
    return sorted(Path(run_dir).glob(pat))


STABLE_S = 0.3  # a core that has not grown for this long is complete (when /proc is mute)
CLOSED_S = 0.05  # a core the worker no longer holds open, unchanged this long, is complete


def held_open(pid: int, paths: list[Path]) -> bool | None:
    """Whether process ``pid`` or one of its descendants (should the driver write the core
    from a helper process) has one of ``paths`` open (their /proc/PID/fd links); None when
    the worker's cannot be read (gone, another user's, no /proc)."""
    want = {str(p.resolve()) for p in paths}
    held = _holds(pid, want)
    if held is None or held:
        return held
    try:
        import psutil

        kids = [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:  # noqa: BLE001  (psutil missing or the process gone: the worker's answer)
        kids = []
    return any(_holds(k, want) for k in kids)


def _holds(pid: int, want: set[str]) -> bool | None:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in want:
                return True
        except OSError:
            continue
    return False


def elf_complete(path: Path) -> bool | None:
    """Whether an ELF file (a GPU core is one) is as long as its header says: its program and
    section header tables inside the file. None when it is no ELF64 file this can read (the
    rules above decide alone)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            size = os.fstat(f.fileno()).st_size
            if head[:4] != b"\x7fELF":
                return None
            if len(head) < 64:
                return False  # not even its header yet
            if head[4] != 2 or head[5] not in (1, 2):
                return None  # not ELF64
            e = "<" if head[5] == 1 else ">"
            phoff, shoff = struct.unpack_from(e + "QQ", head, 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(e + "HHHH", head, 54)
            if shnum == 0 and shoff:  # more sections than the header counts: entry 0 says
                if size < shoff + shentsize:
                    return False
                f.seek(shoff + 32)
                shnum = struct.unpack(e + "Q", f.read(8))[0]
    except (OSError, struct.error):
        return None
    return size >= max(phoff + phnum * phentsize, shoff + shnum * shentsize)


def trigger(
    pid: int, run_dir: Path | str, limit_s: float = DUMP_LIMIT_S, alive: Any = None
) -> dict[str, Any]:
    """Write the coredump pipe of worker ``pid`` and wait (at most ``limit_s``) until its core
    is complete: the worker (whose driver writes it) no longer holds it open and it did not
    grow for :data:`CLOSED_S`; where /proc cannot tell, it did not grow for :data:`STABLE_S`;
    either way as long as its ELF header says (:func:`elf_complete`); or the process exited.
    ``complete`` in the facts says which. When the driver is already writing a core (a GPU
    exception's: a big grid's takes seconds, 4.2 s for minimal's 8,448 warps on the H200),
    only wait for that one. Never raises."""
    d = Path(run_dir)
    pipe = d / f"{PIPE_NAME}.{pid}"
    t0 = time.monotonic()
    facts: dict[str, Any] = {"pipe": str(pipe)}
    if cores(d, pid):
        facts["exception_core_in_progress"] = True
    else:
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.write(fd, b"1")
            finally:
                os.close(fd)
        except OSError as e:
            facts["error"] = f"could not write the coredump pipe: {type(e).__name__}: {e}"
            return facts
    last, since, how = -1, None, "limit"  # "limit": the core was still being written
    while time.monotonic() - t0 < limit_s:
        found = cores(d, pid)
        size = sum(_size(p) for p in found) if found else -1
        now = time.monotonic()
        if size != last:
            last, since = size, now
        if size > 0:
            held = held_open(pid, found)
            quiet = now - since
            if (held is False and quiet >= CLOSED_S) or (held is None and quiet >= STABLE_S):
                if all(elf_complete(p) is not False for p in found):
                    how = "closed" if held is False else "stable"
                    break
        if alive is not None and not alive() and found:
            how = "exited"
            break
        time.sleep(0.01)
    found = cores(d, pid)
    facts["dump_s"] = round(time.monotonic() - t0, 3)
    if not found or last <= 0:
        facts["error"] = f"no core written within {limit_s:g} s of the pipe write"
        return facts
    facts.update(core=str(found[0]), core_bytes=found[0].stat().st_size, complete=how)
    facts["pipe_after_dump"] = pipe.exists()  # the driver's pipe, still there after its dump?
    return facts


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def remove_pipes(run_dir: Path | str) -> None:
    """The FIFOs of processes that are gone (a FIFO blocks file-by-file copies of a folder)."""
    for pipe in Path(run_dir).glob(f"{PIPE_NAME}.*"):
        pipe.unlink(missing_ok=True)


def dump_all(run_dir: Path | str, limit_s: float = DUMP_LIMIT_S) -> list[dict[str, Any]]:
    """Dump every live process whose coredump pipe is in run_dir (``cutedebug exec``: the
    command may have started several CUDA processes), each bounded, all within ``limit_s``."""
    t_end = time.monotonic() + limit_s
    out = []
    for pipe in sorted(Path(run_dir).glob(f"{PIPE_NAME}.*")):
        try:
            pid = int(pipe.name.rsplit(".", 1)[1])
            os.kill(pid, 0)
        except (ValueError, OSError):
            continue  # not a pid, or the process is gone
        left = t_end - time.monotonic()
        if left <= 0:
            out.append({"pipe": str(pipe), "error": "no time left for this process"})
            continue
        out.append(trigger(pid, run_dir, left))
    return out


def before_kill(ctx: dict[str, Any]) -> dict[str, Any] | None:
    """Watchdog hook (before the SIGKILL of a hung child): dump the GPU state of a worker that
    runs with :func:`worker_env`, i.e. whose run folder holds its coredump pipe."""
    if ctx.get("phase") != "launched" or not ctx.get("events_path") or not ctx.get("pid"):
        return None
    run_dir = Path(ctx["events_path"]).parent
    if not (run_dir / f"{PIPE_NAME}.{ctx['pid']}").exists():
        return None

    def alive() -> bool:
        try:
            os.kill(ctx["pid"], 0)
            return True
        except OSError:
            return False

    return {"coredump": trigger(int(ctx["pid"]), run_dir, DUMP_LIMIT_S, alive=alive)}
