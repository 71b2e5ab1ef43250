"""The CUDA driver's start (``cuInit`` and device 0's primary context) in a thread of a fresh
run worker, beside the worker's Python imports (torch, cutlass).

A cold run's worker spends most of its seconds importing torch and cutlass (Python, the GIL)
and starting the driver (C, no Python). Started through torch, the driver's part comes after
torch's import, in turn. Called here through libcuda with ctypes, which releases the GIL for
the length of each call, it runs on another core while the imports go on; torch's runtime then
finds the primary context made and retains it (the same context: the runtime API uses the
device's primary context).

Only the driver's own calls run in the thread, no Python import. The primary context is kept
retained until the process exits, so that it is not destroyed between this thread's release and
torch's retain. Nothing here is required: any failure (no libcuda, no device, an error code) is
recorded in ``why`` and the worker goes on as without it, torch meeting the same driver and
reporting what it finds.

Settings the driver reads once at ``cuInit`` (coredump variables, ``CUDA_VISIBLE_DEVICES``) must
be in the environment before ``start``: the worker starts it after applying the request's.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

from cutedebug import devices

LIBCUDA = "libcuda.so.1"
VAR = "CUTEDEBUG_DRIVER_WARMUP"  # "0": a fresh run worker starts the driver through torch only


class DriverWarmup:
    """``start()`` begins; ``join()`` waits and returns what it did (seconds, error)."""

    def __init__(self) -> None:
        self.seconds: float | None = None
        self.why: str | None = None  # None: the primary context is made
        self._thread = threading.Thread(target=self._warm, name="cutedebug-driver", daemon=True)

    @classmethod
    def start(cls) -> DriverWarmup:
        w = cls()
        w._thread.start()
        return w

    def _warm(self) -> None:
        t0 = time.monotonic()
        try:
            lib = ctypes.CDLL(LIBCUDA)
            rc = lib.cuInit(0)
            if rc:
                self.why = f"cuInit returned {rc}"
                return
            dev = ctypes.c_int()
            rc = lib.cuDeviceGet(ctypes.byref(dev), 0)
            if rc:
                self.why = f"cuDeviceGet returned {rc}"
                return
            ctx = ctypes.c_void_p()
            rc = lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
            if rc:
                self.why = f"cuDevicePrimaryCtxRetain returned {rc}"
        except OSError as e:  # no driver library here: torch will say what it finds
            self.why = f"{LIBCUDA}: {e}"
        finally:
            self.seconds = round(time.monotonic() - t0, 4)

    def join(self, timeout: float | None = None) -> dict[str, object]:
        self._thread.join(timeout)
        if self._thread.is_alive():
            return {"seconds": None, "why": "still starting"}
        return {"seconds": self.seconds, "why": self.why}


def fresh_run_worker(mode: str) -> bool:
    """A fresh worker about to run a kernel on a GPU: a run (a compile-only run never touches
    the GPU), torch not imported yet (a worker forked from a server has it, and its driver
    starts in the fork), a GPU device node here."""
    return mode == "run" and "torch" not in sys.modules and devices.gpu_device_node() is not None


def start_for(mode: str) -> DriverWarmup | None:
    """The warm-up for a fresh run worker (``fresh_run_worker``), or None (also with
    ``VAR=0``)."""
    if os.environ.get(VAR) == "0" or not fresh_run_worker(mode):
        return None
    return DriverWarmup.start()


def fields(warmup: DriverWarmup | None) -> dict[str, object]:
    """The imported event's keys for a warm-up (none where there was none). Does not wait:
    by the time the worker has imported torch, cutlass and the kernel the driver's start has
    ended, and one that has not is reported as such (``driver_warmup: still starting``)."""
    if warmup is None:
        return {}
    got = warmup.join(timeout=0)
    return {"driver_warmup_s": got["seconds"], "driver_warmup": got["why"]}
