"""The CUDA context of a watched process after its CuTe DSL kernels ran: does it hold the sticky
error a faulted kernel leaves, and which one.

A kernel that faults (an illegal address, a trap, ...) leaves its error in the context, and
the next CUDA call of the process returns it, whatever that call is: often a library's (torch's
reference matmul creating its cuBLAS handle reads it as ``CUBLAS_STATUS_INTERNAL_ERROR when
calling cublasCreate(handle)``), so the program's output may not name the error at all.
cutedebug asks the context itself, once, when a process that launched a CuTe DSL kernel ends:

- every launch of a compiled CuTe DSL function is noted (``note_launch``, from the launch
  wrappers of ``launch_gpu._guard_launches``: its kernels' Python names); the first one
  installs the check at the process's exit (``atexit``, registered then so that it runs before
  the handlers registered earlier, cutlass's among them) and on ``os._exit`` (which skips
  ``atexit``: multiprocessing's forked children, test runners' workers);
- the check (``read_context``) calls ``cuStreamQuery`` on the legacy default stream of the
  context current in the thread (else of a device's active primary context): it never waits
  (a hung kernel answers CUDA_ERROR_NOT_READY), and in a context with a sticky error it returns
  that error. It never synchronizes and never creates a context;
- it emits a ``cuda_context`` event (state ``ok`` / ``busy`` / ``error`` / ``unread`` with the
  reason, the kernels last launched; the first launch emitted one with state ``launched``,
  which a process killed before its exit leaves as its last) and, for ``error``, a ``cuda_error`` event naming it (the
  runtime's name, ``cudaErrorIllegalAddress``), the kernel, and where it was read.

A process killed by a signal (the watchdog's kill of a hang among them) runs neither; its
verdict comes from the watchdog as before.

``CUTEDEBUG_FAKE_CUDA_CONTEXT`` (tests only: CPU machines have no context to read) stands for
one launch and the query's answer: ``RESULT[@KERNEL]`` with RESULT a driver result name
(``CUDA_ERROR_ILLEGAL_ADDRESS``, ``CUDA_SUCCESS``, ``CUDA_ERROR_NOT_READY``) or
``unread:WHY``.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

from cutedebug.errors import driver_error_name

FAKE_ENV = "CUTEDEBUG_FAKE_CUDA_CONTEXT"
KERNELS_ATTR = "_cutedebug_kernels"  # on a compiled function: the Python names of its kernels
# cuStreamQuery's answers that say the context holds no error
HEALTHY = {"CUDA_SUCCESS": "ok", "CUDA_ERROR_NOT_READY": "busy"}
# ... and those that say it could not be asked (no error read from it)
UNREADABLE = (
    "CUDA_ERROR_DEINITIALIZED",
    "CUDA_ERROR_NOT_INITIALIZED",
    "CUDA_ERROR_INVALID_CONTEXT",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    "CUDA_ERROR_INVALID_HANDLE",
)
# The messages of the errors a fault leaves (cuGetErrorString's), for the fake answers
_MESSAGES = {
    "CUDA_ERROR_ILLEGAL_ADDRESS": "an illegal memory access was encountered",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION": "an illegal instruction was encountered",
    "CUDA_ERROR_MISALIGNED_ADDRESS": "misaligned address",
    "CUDA_ERROR_LAUNCH_FAILED": "unspecified launch failure",
    "CUDA_ERROR_ASSERT": "device-side assert triggered",
}


class Launches:
    """The CuTe DSL launches of one process: the kernels last launched, and whether the
    context check is installed / done."""

    def __init__(self, emit: Any, pid: int):
        self.emit, self.pid = emit, pid
        self.kernels: list[str] = []
        self.installed = self.checked = False


def kernel_names(compiled: Any, current: dict[str, Any] | None) -> list[str]:
    """The Python names of the kernels a launch runs: those its compiled function was tagged
    with after its trace, else those of the trace under way (a @cute.jit function called
    directly is traced, compiled and launched in one call)."""
    names = getattr(compiled, KERNELS_ATTR, None)
    if names:
        return list(names)
    if current is not None:
        return list(current.get("kernel_names") or current.get("kernels") or [])
    return []


def tag(compiled: Any, names: list[str]) -> None:
    """Remember on a compiled function which kernels it launches (when it takes attributes)."""
    if names and hasattr(compiled, "run_compiled_program"):
        try:
            setattr(compiled, KERNELS_ATTR, tuple(names))
        except (AttributeError, TypeError):
            pass  # its launches read the kernels of the trace under way, or none


def note_launch(launches: Launches | None, names: list[str]) -> None:
    """A compiled CuTe DSL function is about to run: its kernels are the ones to blame for a
    sticky error found later; the first launch installs the check."""
    if launches is None:
        return
    if names:
        launches.kernels = names
    if not launches.installed:
        launches.installed = True
        install(launches)
        # the parent knows from here on that this process's context is due a reading: one
        # that never comes (a kill, a crash of the interpreter) is not a healthy context
        launches.emit("cuda_context", state="launched", kernel=", ".join(names) or None)


def install(launches: Launches) -> None:
    """Check the context at the process's exit, and on os._exit (which skips atexit)."""
    atexit.register(check, launches, "exit")
    original = os._exit
    if getattr(original, "_cutedebug_context", False):
        return

    def _exit(code: int) -> None:
        try:
            check(launches, "os._exit")
        finally:
            original(code)

    _exit._cutedebug_context = True  # type: ignore[attr-defined]
    os._exit = _exit


def check(launches: Launches, when: str) -> dict[str, Any] | None:
    """Read the context once (in the process that launched, not a forked child) and emit
    what it holds; never raises."""
    if launches.checked or os.getpid() != launches.pid:
        return None
    launches.checked = True
    try:
        reading = read_context()
    except Exception as e:  # the bindings are missing or refused: say so, never guess
        reading = {"state": "unread", "why": f"{type(e).__name__}: {str(e)[:300]}"}
    kernel = ", ".join(launches.kernels) or None
    try:
        launches.emit(
            "cuda_context",
            state=reading["state"],
            error=reading.get("error"),
            message=reading.get("message"),
            why=reading.get("why"),
            via=reading.get("via"),
            kernel=kernel,
            when=when,
        )
        if reading["state"] == "error":
            launches.emit(
                "cuda_error",
                name=driver_error_name(reading["error"]),
                message=f"{reading['error']}: {reading.get('message') or ''}".strip(": "),
                surfaced=f"cutedebug's query of the CUDA context at {when}",
                kernel=kernel,
            )
    except Exception:  # the event file is gone at exit: nothing left to tell
        pass
    return reading


def read_context() -> dict[str, Any]:
    """{"state": ok | busy | error | unread | none, "error": the driver's result name,
    "message": its text, "why": why unread, "via": the call}. Never waits, never creates a
    context (none: the process has no context any more)."""
    fake = os.environ.get(FAKE_ENV)
    if fake:
        return _fake_reading(fake.split("@", 1)[0])
    import cuda.bindings.driver as drv

    ok = drv.CUresult.CUDA_SUCCESS
    err, ctx = drv.cuCtxGetCurrent()
    if err != ok:
        return {"state": "unread", "why": f"cuCtxGetCurrent: {err.name}"}
    pushed, retained = False, None
    if not int(ctx):  # no context current in this thread: a device's active primary one
        err, n = drv.cuDeviceGetCount()
        for i in range(n if err == ok else 0):
            _, dev = drv.cuDeviceGet(i)
            err, _flags, active = drv.cuDevicePrimaryCtxGetState(dev)
            if err == ok and active:
                err, ctx = drv.cuDevicePrimaryCtxRetain(dev)
                if err != ok:
                    return {"state": "unread", "why": f"cuDevicePrimaryCtxRetain: {err.name}"}
                retained = dev
                (err,) = drv.cuCtxPushCurrent(ctx)
                pushed = err == ok
                break
        else:
            return {"state": "none", "why": "no CUDA context left in the process"}
    try:
        (res,) = drv.cuStreamQuery(drv.CUstream(0))
    finally:
        if pushed:
            drv.cuCtxPopCurrent()
        if retained is not None:
            drv.cuDevicePrimaryCtxRelease(retained)
    out = _classify(res.name)
    if out["state"] == "error":
        err, text = drv.cuGetErrorString(res)
        out["message"] = text.decode(errors="replace") if err == ok and text else None
    out["via"] = "cuStreamQuery(legacy default stream)"
    return out


def _classify(result: str) -> dict[str, Any]:
    if result in HEALTHY:
        return {"state": HEALTHY[result], "error": None}
    if result in UNREADABLE:
        return {"state": "unread", "error": None, "why": f"cuStreamQuery: {result}"}
    return {"state": "error", "error": result}


def _fake_reading(answer: str) -> dict[str, Any]:
    if answer.startswith("unread:"):
        return {"state": "unread", "why": answer[len("unread:") :], "via": "fake"}
    out = _classify(answer)
    if out["state"] == "error":
        out["message"] = _MESSAGES.get(answer)
    out["via"] = "fake"
    return out


def fake_launch(launches: Launches) -> None:
    """Tests: the launch the fake answer stands for (its kernel after '@')."""
    fake = os.environ.get(FAKE_ENV) or ""
    if fake:
        kernel = fake.split("@", 1)[1] if "@" in fake else ""
        note_launch(launches, [kernel] if kernel else [])
