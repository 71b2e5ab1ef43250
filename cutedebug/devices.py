"""Whether this machine can have an NVIDIA GPU at all, answered without importing torch.

CUDA reaches a GPU through a device node (Linux: /dev/nvidiactl and /dev/nvidiaN; WSL2:
/dev/dxg; Tegra: /dev/nvhost-ctrl-gpu). With none of them there is no GPU, and importing
torch to learn it costs a process ~1.7 s of CPU: the fork server, a run's worker and the
health check ask this first. Stdlib only.
"""

from __future__ import annotations

import os

GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/nvhost-ctrl-gpu")
NO_DEVICE_NODE = "no NVIDIA GPU device node on this machine"


def gpu_device_node() -> str | None:
    """The first GPU device node present, or None where this machine has no GPU."""
    return next((p for p in GPU_DEVICE_NODES if os.path.exists(p)), None)
