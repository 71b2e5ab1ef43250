"""The GPU, from both sides: is there one (parent side), is it still usable (child side)?

- :func:`detect_gpu` (the parent, never imports torch): the GPU a child would run on, from
  nvidia-smi. The one GPU detection of the harness (triage, the pytest plugin, the tools).
- ``python -m cutedebug.engine.health`` (:func:`main`, a child forked or started after a kill
  or a crash): a tiny GPU job; prints one JSON line: {"healthy": bool, ...}.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

ARCH_BY_CC = {(9, 0): "sm_90a", (10, 0): "sm_100a", (10, 3): "sm_100a"}


def detect_gpu(timeout_s: float = 20.0) -> dict[str, Any]:
    """The GPU a child would run on, from nvidia-smi; {"present": False, "reason": ...} else."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return {"present": False, "reason": f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"}
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"present": False, "reason": "no NVIDIA GPU on this machine (nvidia-smi not found)"}
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"present": False, "reason": f"nvidia-smi failed: {e}"}
    rows = [ln for ln in out.stdout.splitlines() if ln.count(",") >= 2]
    if out.returncode != 0 or not rows:
        msg = (out.stderr or out.stdout).strip()[:300]
        return {"present": False, "reason": f"nvidia-smi lists no usable GPU: {msg}"}
    index = 0
    first = (visible or "").split(",")[0].strip()
    if first.isdigit() and int(first) < len(rows):
        index = int(first)
    name, cc, driver = (c.strip() for c in rows[index].split(",")[:3])
    try:
        major, minor = (int(x) for x in cc.split("."))
    except ValueError:
        return {"present": False, "reason": f"nvidia-smi compute capability {cc!r} unreadable"}
    return {
        "present": True,
        "reason": None,
        "name": name,
        "cc": cc,
        "driver": driver,
        "arch": ARCH_BY_CC.get((major, minor), f"sm_{major}{minor}"),
    }


def main() -> int:
    try:
        import torch

        if not torch.cuda.is_available():
            print(json.dumps({"healthy": None, "reason": "no CUDA GPU"}))
            return 0
        a = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        ok = (a * 2 + 1).max().item() == 2.0 * ((1 << 20) - 1) + 1
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        print(
            json.dumps(
                {
                    "healthy": ok,
                    "device": torch.cuda.get_device_name(0),
                    "free_gib": round(free / 2**30, 1),
                }
            )
        )
        return 0 if ok else 1
    except Exception as e:
        print(json.dumps({"healthy": False, "error": f"{type(e).__name__}: {e}"}))
        return 1


if __name__ == "__main__":
    sys.exit(main())
