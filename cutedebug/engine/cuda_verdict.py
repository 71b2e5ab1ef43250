"""exec's CRASH rules: which CUDA error a watched command hit, named by what cutedebug read,
never guessed.

A CuTe DSL kernel that faults leaves a sticky error in its context, and whatever CUDA call
comes next reports it, often a library's: the H200 mutate run over examples/test_field_libs.py
(2026-12-02) printed ``RuntimeError: CUDA error: CUBLAS_STATUS_INTERNAL_ERROR when calling
`cublasCreate(handle)``` for three faulted GEMM / attention kernels, torch's reference matmul
being the first CUDA call after them. The evidence, strongest first:

1. the process's own reading of its context at exit (instrument/launch_context.py:
   ``cuda_context`` with state ``error``): CRASH named by the context, blamed on the CuTe DSL
   kernel last launched, with where the program saw it (``surfaced later in cuBLAS's
   cublasCreate: CUBLAS_STATUS_INTERNAL_ERROR``);
2. the output names the error (``cudaErrorIllegalAddress``, ``CUDA_ERROR_...`` or the runtime's
   message): CRASH by that name;
3. the probe monitor's event query raised it (a ``cuda_error`` event): CRASH by its name;
4. the output has only a CUDA library's status (cuBLAS, cuDNN, ...): FAIL when every process
   that launched a CuTe DSL kernel read a healthy context at exit (a library error of the
   program, not a kernel fault); else CRASH saying plainly that the error's name was not read,
   and why;
5. other CUDA error text without a name: CRASH, the name said to be unread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cutedebug.engine import verdict as V
from cutedebug.errors import driver_error_name, known_cuda_error
from cutedebug.event_kinds import CudaContext
from cutedebug.instrument.launch_context import HEALTHY as _HEALTHY_RESULTS

# CUDA errors as programs print them: the runtime's message (torch, cuda-python), or the name.
CUDA_TEXT = re.compile(
    r"(CUDA error[^\n]*|cudaError\w+|CUDA_ERROR_\w+[^\n]*|"
    r"an illegal (?:memory access|instruction) was encountered|"
    r"misaligned address|unspecified launch failure|"
    r"device-side assert triggered)",
    re.IGNORECASE,
)
_RUNTIME_NAME = re.compile(r"\b(cudaError[A-Z]\w*)")
_DRIVER_NAME = re.compile(r"\b(CUDA_ERROR_[A-Z_]+)")
# A CUDA library's status, as torch and the libraries print it: ``CUBLAS_STATUS_INTERNAL_ERROR
# when calling `cublasCreate(handle)```, ``CUDNN_STATUS_EXECUTION_FAILED``, ``CUFFT_INTERNAL_ERROR``
_LIB_STATUS = re.compile(
    r"\b((CUBLAS|CUDNN|CUSOLVER|CUSPARSE|CURAND)_STATUS_[A-Z_]+|(CUFFT)_[A-Z_]+)"
    r"(?:[^\n`]*?when calling `([A-Za-z_]\w*))?"
)
LIBRARIES = {
    "CUBLAS": "cuBLAS",
    "CUDNN": "cuDNN",
    "CUSOLVER": "cuSOLVER",
    "CUSPARSE": "cuSPARSE",
    "CURAND": "cuRAND",
    "CUFFT": "cuFFT",
}
HEALTHY = set(_HEALTHY_RESULTS.values())  # the context states that hold no error


@dataclass(frozen=True)
class LibraryStatus:
    library: str  # cuBLAS
    status: str  # CUBLAS_STATUS_INTERNAL_ERROR
    call: str | None  # cublasCreate
    line: str  # the output's line
    at: int = 0  # where in the output

    def where(self) -> str:
        return f"{self.library}'s {self.call}" if self.call else self.library


def library_status(text: str) -> LibraryStatus | None:
    """The first CUDA library status in a program's output, or None."""
    m = _LIB_STATUS.search(text)
    if m is None:
        return None
    prefix = m.group(2) or m.group(3)
    return LibraryStatus(LIBRARIES[prefix], m.group(1), m.group(4), _line_at(text, m), m.start())


def cuda_line(text: str) -> str:
    """The output's first line with CUDA error text ('' when none)."""
    m = CUDA_TEXT.search(text)
    return _line_at(text, m) if m else ""


def _line_at(text: str, m: re.Match) -> str:
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    return text[start : end if end >= 0 else None].strip()[:300]


def named_in_output(text: str) -> str | None:
    """The CUDA error a program's output names (the runtime's or the driver's name, or the
    runtime's message for it); None when it names none (a library status alone, or a message
    this table does not know): nothing is guessed."""
    if not CUDA_TEXT.search(text):
        return None
    if (m := _RUNTIME_NAME.search(text)) is not None:
        return m.group(1)
    if (m := _DRIVER_NAME.search(text)) is not None:
        return driver_error_name(m.group(1))
    line = cuda_line(text)
    if "unknown error" in line.lower():  # the runtime's own message for cudaErrorUnknown
        return "cudaErrorUnknown"
    return known_cuda_error(line)


def last_lines(text: str, n: int = 15) -> str:
    """The output's last ``n`` lines."""
    return "\n".join(text.rstrip().splitlines()[-n:])


def readings(procs: dict[int, dict[str, Any]]) -> list[tuple[int, CudaContext]]:
    """The last context reading of each process that launched a CuTe DSL kernel."""
    return [(pid, p["cuda_context"]) for pid, p in procs.items() if p.get("cuda_context")]


def _kernel_phrase(kernel: str | None, pid: int) -> str:
    if not kernel:
        return f"a kernel of pid {pid} faulted"
    if "," in kernel:
        return f"one of the kernels {kernel} faulted"
    return f"the kernel {kernel} faulted"


def _not_read(reads: list[tuple[int, CudaContext]]) -> str:
    """Why no process's reading names the error."""
    for pid, c in reads:
        if c.state == "unread":
            return f"cutedebug could not read the CUDA context of pid {pid}: {c.why}"
        if c.state == "launched":
            return f"pid {pid} launched a CuTe DSL kernel and ended before its context was read"
        if c.state == "none":
            return f"pid {pid} had no CUDA context left to read"
    return "no process of the command launched a CuTe DSL kernel: no context was read"


def classify_cuda(res: Any) -> bool:
    """Set a CUDA verdict on an exec result (engine/command.py's ExecResult) when its evidence
    has one; False when it has none (the next rules decide)."""
    rc, tail, procs = res.returncode, res.log_tail, res.processes
    failed = rc not in (0, None)
    lib = library_status(tail) if failed else None
    line = cuda_line(tail) if failed else ""
    reads = readings(procs)
    sticky = next(((pid, c) for pid, c in reads if c.state == "error"), None)
    if sticky is not None:
        pid, c = sticky
        name = driver_error_name(c.error or "")
        first = CUDA_TEXT.search(tail) if failed else None
        if lib is not None and first is not None and first.end() <= lib.at and line != lib.line:
            lib = None  # the output told of the error before the library did: its line first
        if lib is not None:
            later = f"surfaced later in {lib.where()}: {lib.status}"
        elif line:
            later = f"surfaced later: {line}"
        else:
            later = f"read from pid {pid}'s CUDA context at {c.when}; exit status {rc}"
        res.verdict = V.Verdict.CRASH
        res.reason = f"{name}: {_kernel_phrase(c.kernel, pid)} ({later})"
        res.evidence["cuda_error"] = {
            "name": name,
            "line": (lib.line if lib else line) or f"{c.error}: {c.message or ''}",
            "kernel": c.kernel,
            "pid": pid,
            "read_by": f"cutedebug's query of the CUDA context at {c.when} ({c.via})",
            "surfaced": lib.where() + ": " + lib.status if lib else line or None,
        }
        return True
    if failed and line and (name := named_in_output(tail)) is not None:
        res.verdict, res.reason = V.Verdict.CRASH, f"{name}: {line}"
        res.evidence["cuda_error"] = {"name": name, "line": line}
        return True
    seen = next(((pid, e) for pid, p in procs.items() for e in p.get("cuda_errors", [])), None)
    if seen is not None:  # the program swallowed it or died otherwise; the context is gone
        pid, err = seen
        res.verdict = V.Verdict.CRASH
        res.reason = (
            f"{err.name}: raised in pid {pid} while its kernel was in flight "
            f"(seen by cutedebug's {err.surfaced or 'monitor'}); the command exited with "
            f"status {rc}"
        )
        res.evidence["cuda_error"] = {"name": err.name, "line": (err.message or "")[:300]}
        return True
    if lib is not None and reads and all(c.state in HEALTHY for _, c in reads):
        pid = reads[0][0]
        res.verdict = V.Verdict.FAIL
        res.reason = (
            f"the command exited with status {rc}: {lib.where()} returned {lib.status} while "
            f"the CUDA context held no error (read at exit in pid {pid}): a library error, "
            "not a kernel fault"
        )
        res.evidence["library_error"] = {
            "library": lib.library,
            "status": lib.status,
            "call": lib.call,
            "line": lib.line,
        }
        res.evidence["last_lines"] = last_lines(tail)
        return True
    if lib is not None or line:
        why = _not_read(reads)
        shown = f"{lib.where()} returned {lib.status}" if lib is not None else line
        res.verdict = V.Verdict.CRASH
        res.reason = f"CUDA error, name not read: {shown} ({why})"
        res.evidence["cuda_error"] = {
            "name": None,
            "line": lib.line if lib else line,
            "not_read": why,
        }
        return True
    return False
