"""The GPU, from both sides: is there one (parent side), is it still usable (child side)?

- :func:`detect_gpu` (the parent, never imports torch): the GPU a child would run on, from
  nvidia-smi. The one GPU detection of the harness (triage, the pytest plugin, the tools).
- ``python -m cutedebug.engine.health`` (:func:`main`, a child forked or started after a kill
  or a crash): a kernel of ours through the CUDA driver API, then (when the driver does not say
  healthy, or with CUTEDEBUG_HEALTH_DRIVER=0) a tiny GPU job through torch; prints one JSON
  line: {"healthy": bool, ...}.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from cutedebug.engine import gpus, lifeline
from cutedebug.event_kinds import CudaError, Done, GpuCheck

ARCH_BY_CC = {(9, 0): "sm_90a", (10, 0): "sm_100a", (10, 3): "sm_100a"}


def detect_gpu(timeout_s: float = 20.0) -> dict[str, Any]:
    """The GPU a child would run on, from nvidia-smi; {"present": False, "reason": ...} else."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return {"present": False, "reason": f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"}
    rows, why = gpus.smi_rows("name,compute_cap,driver_version", timeout_s)
    if not rows:
        return {"present": False, "reason": why}
    index = 0
    first = (visible or "").split(",")[0].strip()
    if first.isdigit() and int(first) < len(rows):
        index = int(first)
    name, cc, driver = rows[index]
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

    Forked from the fork server when one is alive (torch already imported: ~1 s), otherwise a
    fresh interpreter, which first asks the CUDA driver through ctypes (:func:`driver_check`,
    no torch: 0.5-0.7 s on the H200 against 4.3-4.8 s importing torch) and asks torch only
    when the driver's answer is not "healthy" (``CUTEDEBUG_HEALTH_DRIVER=0``: torch alone).
    Either way a new process with its own CUDA context,
    watched like any run (killed with its group and swept if it does not finish in
    ``timeout_s``).
    """
    from cutedebug.engine import watchdog
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


WORKER_CHECKED = (
    "in the worker's own CUDA context after the probes' bounded waits ended the kernel; the "
    "worker then exited by itself: nothing was killed"
)


def worker_gpu_check(outcome: Any, facts: dict[str, Any]) -> dict[str, Any] | None:
    """The worker's own GPU check (event gpu_check, :func:`in_worker_check`) of a run's
    outcome (engine/verdict.py), when it stands for a check in a new
    process: the kernel ended without a CUDA error (the probes' bounded waits), the worker said
    healthy, then exited by itself with status 0, and nothing of it was left to sweep. The GPU
    is then as a PASS run leaves it, after which no check runs either. None otherwise: after a
    kill, a fault, an unhealthy answer or an unclean exit a new context must say it."""
    own = outcome.last(GpuCheck)
    if own is None or own.healthy is not True:
        return None
    if outcome.killed_by_watchdog or outcome.returncode != 0 or outcome.last(Done) is None:
        return None
    if outcome.last(CudaError) is not None or facts.get("swept") or facts.get("swept_after_exit"):
        return None
    return {**own.to_json(), "secs": own.secs or 0.0, "checked": WORKER_CHECKED}


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


# ---- child side (python -m cutedebug.engine.health) ---------------------------------------------
# A kernel of our own for the driver API: y[i] = 2 i + 1 for i < n (PTX, JIT-compiled by the
# driver for whatever GPU this is).
_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry fill(.param .u64 y, .param .u32 n)
{
  .reg .pred %p;
  .reg .b32 %r<7>;
  .reg .b64 %rd<5>;
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mad.lo.s32 %r4, %r1, %r2, %r3;
  ld.param.u32 %r5, [n];
  setp.ge.u32 %p, %r4, %r5;
  @%p bra DONE;
  ld.param.u64 %rd1, [y];
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.u32 %rd3, %r4, 4;
  add.s64 %rd4, %rd2, %rd3;
  mad.lo.s32 %r6, %r4, 2, 1;
  st.global.u32 [%rd4], %r6;
DONE:
  ret;
}
\0"""
_N = 1 << 16
DRIVER_VAR = "CUTEDEBUG_HEALTH_DRIVER"  # "0": torch alone (default: the driver first)


def driver_check(lib: str = "libcuda.so.1") -> dict[str, Any]:
    """The check through the CUDA driver API (ctypes, no torch: ~0.3 s in a fresh interpreter
    against ~4 s to import torch): a context, one kernel of ours launched, its output read back
    and compared, the free memory. Raises OSError without the driver; "healthy": False with the
    failing call's name and CUresult otherwise."""
    import ctypes as C

    cu = C.CDLL(lib)

    def call(name: str, *args: Any) -> None:
        rc = getattr(cu, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name} returned CUresult {rc}")

    dev, ctx, mod, fn = C.c_int(), C.c_void_p(), C.c_void_p(), C.c_void_p()
    ptr, n = C.c_uint64(), C.c_uint32(_N)
    try:
        call("cuInit", C.c_uint(0))
        call("cuDeviceGet", C.byref(dev), C.c_int(0))
        call("cuDevicePrimaryCtxRetain", C.byref(ctx), dev)
        call("cuCtxSetCurrent", ctx)
        call("cuModuleLoadData", C.byref(mod), C.c_char_p(_PTX))
        call("cuModuleGetFunction", C.byref(fn), mod, C.c_char_p(b"fill"))
        call("cuMemAlloc_v2", C.byref(ptr), C.c_size_t(4 * _N))
        params = (C.c_void_p * 2)(C.cast(C.byref(ptr), C.c_void_p), C.cast(C.byref(n), C.c_void_p))
        grid, block = C.c_uint((_N + 255) // 256), C.c_uint(256)
        one, zero = C.c_uint(1), C.c_uint(0)
        call(
            "cuLaunchKernel",
            fn,
            grid,
            one,
            one,
            block,
            one,
            one,
            zero,
            C.c_void_p(),
            params,
            C.c_void_p(),
        )
        call("cuCtxSynchronize")
        out = (C.c_uint32 * _N)()
        call("cuMemcpyDtoH_v2", out, ptr, C.c_size_t(4 * _N))
        free, total = C.c_size_t(), C.c_size_t()
        call("cuMemGetInfo_v2", C.byref(free), C.byref(total))
        name = C.create_string_buffer(256)
        call("cuDeviceGetName", name, C.c_int(256), dev)
        call("cuMemFree_v2", ptr)
    except RuntimeError as e:
        return {"healthy": False, "error": str(e), "via": "driver"}
    wrong = next((i for i in range(_N) if out[i] != 2 * i + 1), None)
    res = {
        "healthy": wrong is None,
        "device": name.value.decode(errors="replace"),
        "free_gib": round(free.value / 2**30, 1),
        "via": "driver",
    }
    if wrong is not None:
        res["error"] = f"the check kernel wrote {out[wrong]} at {wrong}, not {2 * wrong + 1}"
    return res


def torch_check() -> dict[str, Any] | None:
    """The same question through torch (None: torch sees no CUDA GPU)."""
    import torch

    if not torch.cuda.is_available():
        return None
    a = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    ok = (a * 2 + 1).max().item() == 2.0 * ((1 << 20) - 1) + 1
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {
        "healthy": ok,
        "device": torch.cuda.get_device_name(0),
        "free_gib": round(free / 2**30, 1),
        "via": "torch",
    }


def in_worker_check() -> dict[str, Any]:
    """The torch check, in the calling worker's own CUDA context (milliseconds: torch and the
    context are there already), after the probes' bounded waits ended a hang: the kernel
    finished without a CUDA error, so the context it ran in is the one to ask. Never raises."""
    t0 = time.monotonic()
    try:
        res = torch_check() or {"healthy": None, "reason": "no CUDA GPU"}
    except Exception as e:  # a context that went bad after the sync: the runner asks anew
        res = {"healthy": False, "error": f"{type(e).__name__}: {e}"}
    res["via"] = "worker"
    res["secs"] = round(time.monotonic() - t0, 3)
    return res


def in_child(fn: Any) -> dict[str, Any]:
    """``fn()``'s dict, computed in a forked child: a crash there (a fault inside the driver
    library) costs the child, not this check. Raises RuntimeError when the child raised or
    died without an answer."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover  (the child: its lines run, coverage does not see them)
        os.close(r)
        try:
            out = {"result": fn()}
        except BaseException as e:
            out = {"raised": f"{type(e).__name__}: {e}"}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise RuntimeError(f"the driver check's process died ({_status_text(status)})")
    out = json.loads(data)
    if "raised" in out:
        raise RuntimeError(out["raised"])
    return out["result"]


def _status_text(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def main() -> int:
    from cutedebug import devices

    if devices.gpu_device_node() is None:  # no GPU here: torch (~1.7 s) need not say so
        print(json.dumps({"healthy": None, "reason": f"no CUDA GPU: {devices.NO_DEVICE_NODE}"}))
        return 0
    first = None
    # The driver first unless CUTEDEBUG_HEALTH_DRIVER=0: on the H200 (reports/2026-12-02-h200,
    # call2 perturb_keys, alternated) a fresh interpreter's check took 0.67 / 0.53 s through the
    # driver against 4.28 / 4.81 s through torch, every answer healthy.
    if os.environ.get(DRIVER_VAR, "1") != "0":
        try:  # the driver answers "healthy" in a fraction of torch's import; any other answer
            first = in_child(driver_check)  # (or none) is asked of torch, whose word is final
            if first["healthy"] is True:
                print(json.dumps(first))
                return 0
        except Exception as e:  # no driver library, a symbol missing: torch decides
            first = {"healthy": None, "error": f"{type(e).__name__}: {e}", "via": "driver"}
    try:
        res = torch_check()
    except Exception as e:
        res = {"healthy": False, "error": f"{type(e).__name__}: {e}", "via": "torch"}
    if res is None:
        res = {"healthy": None, "reason": "no CUDA GPU"}
    if first is not None:
        res["driver_check"] = first
    print(json.dumps(res))
    return 0 if res.get("healthy") is not False else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Without the interpreter's teardown of torch (~1 s of CPU, more with CUDA's modules): the
    # answer is printed and flushed, the driver frees the context at exit either way.
    os._exit(code)
