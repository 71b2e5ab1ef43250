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
import time
from pathlib import Path
from typing import Any

from cutedebug.engine import lifeline

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
        out = lifeline.run_tool(
            [smi, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
            timeout_s,
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


# ---- parent side: the check after a kill or a crash --------------------------------------------
def health_check(
    timeout_s: float = 60.0, *, forkserver=None, run_dir: Path | None = None
) -> dict[str, Any]:
    """A tiny GPU job in a new process: is the GPU usable after a kill or a crash?

    Forked from the fork server when one is alive (torch already imported: ~1 s instead of
    ~4 s), otherwise a fresh interpreter. Either way a new process with its own CUDA context,
    watched like any run (killed with its group and swept if it does not finish in
    ``timeout_s``).
    """
    from cutedebug.engine import lifeline, watchdog
    from cutedebug.engine.scenario import Limits

    t0 = time.monotonic()
    tmp = None
    if run_dir is None:
        tmp = lifeline.make_tempdir("cutedebug-health-")
        dir_ = Path(tmp)
    else:
        dir_ = Path(run_dir) / "health"
    try:
        dir_.mkdir(parents=True, exist_ok=True)
        log = dir_ / "health.log"
        log.write_bytes(b"")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(watchdog.REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        env.update(getattr(forkserver, "bind_env", None) or {})  # runner.bound_env: a lane's GPU
        use_fork = (
            forkserver is not None
            and run_dir is not None
            and not getattr(forkserver, "closed", False)
        )
        outcome, facts = watchdog.watch(
            [sys.executable, "-m", "cutedebug.engine.health", str(dir_ / "health.json")],
            None,
            log,
            Limits(import_s=timeout_s),
            env=env,
            total_s=timeout_s,
            forkserver=forkserver if use_fork else None,
            fork_job="health",
        )
        if outcome.killed_by_watchdog:
            res = {"healthy": False, "error": f"health check did not finish in {timeout_s:g}s"}
        else:
            text = log.read_text(errors="replace")
            res = _health_result(text, text)
        if facts.get("forked"):
            res["forked"] = True
    finally:
        if tmp is not None:
            lifeline.remove_tempdir(tmp)
    res["secs"] = round(time.monotonic() - t0, 3)
    return res


def _health_result(stdout: str, stderr: str) -> dict[str, Any]:
    """The last line of cutedebug.engine.health's output, which is one JSON object."""
    lines = stdout.strip().splitlines()
    if not lines:
        return {"healthy": False, "error": stderr[-500:] or "the health check printed nothing"}
    try:
        res = json.loads(lines[-1])
        if not isinstance(res, dict):
            raise ValueError("not a JSON object")
        return res
    except ValueError as e:
        return {
            "healthy": False,
            "error": f"unreadable health check output: {e}: {lines[-1][:200]!r}",
        }


# ---- one scenario ---------------------------------------------------------------------
# ---- child side (python -m cutedebug.engine.health) ---------------------------------------------
def main() -> int:
    from cutedebug import devices

    if devices.gpu_device_node() is None:  # no GPU here: torch (~1.7 s) need not say so
        print(json.dumps({"healthy": None, "reason": f"no CUDA GPU: {devices.NO_DEVICE_NODE}"}))
        return 0
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
