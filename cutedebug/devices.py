"""Whether this machine can have an NVIDIA GPU at all, answered without importing torch.

CUDA reaches a GPU through a device node (Linux: /dev/nvidiactl and /dev/nvidiaN; WSL2:
/dev/dxg; Tegra: /dev/nvhost-ctrl-gpu). With none of them there is no GPU, and importing
torch to learn it costs a process ~1.7 s of CPU: the fork server, a run's worker and the
health check ask this first. Stdlib only.
"""

from __future__ import annotations

import os
import sys
import threading

GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/nvhost-ctrl-gpu")
NO_DEVICE_NODE = "no NVIDIA GPU device node on this machine"


def gpu_device_node() -> str | None:
    """The first GPU device node present, or None where this machine has no GPU."""
    return next((p for p in GPU_DEVICE_NODES if os.path.exists(p)), None)


EARLY_CONTEXT_VAR = "CUTEDEBUG_EARLY_CONTEXT"  # "1": make the context beside torch's import


class EarlyContext:
    """CUDA's driver init and the GPU's primary context, made through libcuda in a thread while
    a fresh run worker imports torch. ctypes lets go of the interpreter lock for the driver's
    calls, so they run beside the import instead of after it; torch's runtime then finds the
    primary context made (it retains the same one). Only in a fresh interpreter (torch not
    imported yet: a forked worker's context takes milliseconds), only where a GPU device node
    exists, after the run's driver settings (coredumps) are in the environment. A failure here
    is left for torch to meet and report; ``result`` says what happened ("made" or why not)."""

    def __init__(self) -> None:
        self.result: str | None = None
        self.seconds: float | None = None
        self._thread = threading.Thread(target=self._make, name="cutedebug-context", daemon=True)

    @classmethod
    def start(cls, mode: str) -> EarlyContext | None:
        if mode != "run" or os.environ.get(EARLY_CONTEXT_VAR) != "1" or "torch" in sys.modules:
            return None
        if gpu_device_node() is None:
            return None
        early = cls()
        early._thread.start()
        return early

    def _make(self) -> None:
        import ctypes
        import time

        t0 = time.monotonic()
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            for call, args in (
                ("cuInit", (0,)),
                ("cuDeviceGet", (ctypes.byref(dev), 0)),
                ("cuDevicePrimaryCtxRetain", (ctypes.byref(ctx), dev)),
            ):
                if (rc := getattr(cuda, call)(*args)) != 0:
                    self.result = f"{call} returned CUDA error {rc}"
                    return
            self.result = "made"
        except (OSError, AttributeError) as e:  # no libcuda here, or an unexpected one
            self.result = f"libcuda: {e}"
        finally:
            self.seconds = round(time.monotonic() - t0, 3)

    def join(self, timeout: float | None = None) -> dict[str, object]:
        """{"early_context": result, "early_context_s": seconds} once the thread ended (or
        "still running" after ``timeout``)."""
        self._thread.join(timeout)
        result = self.result if not self._thread.is_alive() else "still running"
        return {"early_context": result, "early_context_s": self.seconds}
