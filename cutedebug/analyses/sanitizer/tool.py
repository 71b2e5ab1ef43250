"""compute-sanitizer itself: where it is, the command around the worker, the child's environment.

The runner wraps the same worker command (``python -m cutedebug.engine.worker request.json``) in
the argv ``build_command`` returns and runs it under its watchdog. Every flag it emits was
accepted by compute-sanitizer 2025.3.1 (REFERENCE.md); ``--error-exitcode`` also fires on API
errors when they are reported (the API-noise capture exited 86 with no kernel error).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
from collections.abc import Sequence

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")

# Distinct from the worker's own exit codes so the runner can tell "sanitizer found errors".
ERROR_EXITCODE = 86
DEFAULT_PRINT_LIMIT = 1000


# ---- locating and running the tool -------------------------------------------------------
def find_sanitizer() -> str | None:
    """Path of compute-sanitizer: $COMPUTE_SANITIZER, PATH, $CUDA_HOME/bin, /usr/local/cuda*."""
    candidates: list[str] = []
    if os.environ.get("COMPUTE_SANITIZER"):
        candidates.append(os.environ["COMPUTE_SANITIZER"])
    on_path = shutil.which("compute-sanitizer")
    if on_path:
        candidates.append(on_path)
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "compute-sanitizer"))
    candidates.append("/usr/local/cuda/bin/compute-sanitizer")
    versioned = glob.glob("/usr/local/cuda-*/bin/compute-sanitizer")
    candidates.extend(sorted(versioned, key=_version_key, reverse=True))
    candidates.append("/opt/nvidia/compute-sanitizer/compute-sanitizer")
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _version_key(path: str) -> tuple[int, ...]:
    m = re.search(r"cuda-(\d+(?:\.\d+)*)", path)
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def build_command(
    tool: str,
    worker_argv: list[str],
    xml_path: str,
    *,
    sanitizer: str,
    print_limit: int = DEFAULT_PRINT_LIMIT,
    report_api_errors: bool = False,
    racecheck_report: str = "all",
    deadlock_timeout_s: int | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """compute-sanitizer argv around ``worker_argv``; XML goes to ``xml_path``.

    Line info is not a flag here: the worker's kernels get it from CUTE_DSL_LINEINFO=1
    (``child_env``).
    """
    if tool not in TOOLS:
        raise ValueError(f"unknown sanitizer tool {tool!r}; choose from {TOOLS}")
    cmd = [
        sanitizer,
        "--tool",
        tool,
        "--xml",
        "--save",
        xml_path,  # spelling seen working on 2025.3.1 (REFERENCE.md)
        "--print-limit",
        str(print_limit),
        "--error-exitcode",
        str(ERROR_EXITCODE),
        # cuda-bindings probes the driver with cuGetProcAddress; each miss is an API error.
        "--report-api-errors",
        "all" if report_api_errors else "no",
        "--show-backtrace",
        "device",  # Python host frames say nothing about the kernel
        "--target-processes",
        "all",
    ]
    if tool == "racecheck":
        # "all" = per-hazard records (RAW/WAR/WAW, both threads) + the analysis summary.
        cmd += ["--racecheck-report", racecheck_report]
        if deadlock_timeout_s is not None:
            cmd += ["--racecheck-deadlock-timeout", str(deadlock_timeout_s)]
    cmd += list(extra)
    return cmd + list(worker_argv)


def child_env(tool: str) -> dict[str, str]:
    """Environment additions for the sanitized worker."""
    env = {"CUTE_DSL_LINEINFO": "1"}  # kernel .py file:line in the cubin, nothing else
    if tool in ("memcheck", "initcheck"):
        # The caching allocator hands out slices of big segments: an out-of-bounds store
        # inside a segment is invisible to memcheck (REFERENCE.md: 0 errors with caching on),
        # and reused blocks look initialised to initcheck.
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return env
