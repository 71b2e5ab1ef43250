"""The warm pool's spare worker: one process forked ahead of the next run, whose CUDA context
is ready when the run's request comes (a forked worker otherwise spends its first ~0.3 s on
the H200 looking for the GPU and creating its context: device_s, and inside inputs_s).

The server (engine/pool_server.py) forks a spare only

- where a GPU device node exists (``SPARE_VAR``: "0" never, "1" also without one, the spare
  then skipping CUDA: what the CPU tests exercise),
- while no worker of its runs, ``AFTER_EXIT_S`` after the last one ended, and only when that
  one ended with exit status 0 (a worker killed at
  its deadline, or one that failed, leaves none until a run ends well again: a context is
  never made ready just after a run that may have left the GPU in a bad state), and
- when the previous spare did not fail to start (its reason stays in the server's log).

A run goes to the spare even before its context is ready (it then waits for the rest of the
spare's start, which began earlier than a fresh fork's would).

The spare makes its context (torch's, on device 0, as a worker's first tensor would), checks
that the device runs in the default compute mode (a context held by an idle process would lock
an exclusive-mode GPU against everything else: no spare there), says ``ready`` on its pipe and
waits. A run's request is handed to it only when it is a ``run`` (a compile-only run never
touches the GPU) and its request sets no environment of its own (variables the driver reads
once, at initialisation: a fresh fork for those). From there on it is the worker the fork
server would have forked: the run's tags, its own session, its log, ``worker.main``.

It holds a context while it waits; the server kills it when it stops, retires, or is idle for
its idle time, as it does its workers (PDEATHSIG besides).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPARE_VAR = "CUTEDEBUG_POOL_SPARE"
NO_CONTEXT_WAIT_S = 2.0
# A spare is forked this long after a worker's exit, not at once: its CUDA start (mmaps under
# the process's memory lock) overlapped the finished run's sweep, which reads every process's
# /proc/PID/environ (lifeline.sweep), on the H200: exit_s 0.13 s with the spare against 0.08 s
# without (reports/2026-12-02-h200-s4/call3/warm_reuse, 6 runs a side).
AFTER_EXIT_S = 0.15


def wanted() -> bool:
    """Whether this machine's pool keeps a spare (``SPARE_VAR``, else: a GPU device node)."""
    raw = os.environ.get(SPARE_VAR, "").strip()
    if raw in ("0", "1"):
        return raw == "1"
    from cutedebug import devices

    return devices.gpu_device_node() is not None


@dataclass
class Spare:
    """The server's handle: the spare's pid, the pipe its request goes down, the pipe its
    ``ready`` (or why it could not start) comes up."""

    pid: int
    request_fd: int
    ready_fd: int
    ready: bool = False

    def close(self) -> None:
        for fd in (self.request_fd, self.ready_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def read_ready(self) -> str | None:
        """After ``ready_fd`` polled readable: "" when it is ready, else why it is not (it
        ended or could not start)."""
        try:
            line = os.read(self.ready_fd, 4096).decode(errors="replace").strip()
        except OSError as e:
            line = f"its pipe failed: {e}"
        if line == "ready":
            self.ready = True
            return ""
        return line or "it ended before it was ready"

    def hand(self, req: dict[str, Any], session_tags: list[str]) -> bool:
        """Send the run's request; False when the spare is gone (a fresh fork then)."""
        data = (json.dumps({"req": req, "session_tags": session_tags}) + "\n").encode()
        try:
            os.write(self.request_fd, data)
        except OSError:
            self.close()
            return False
        return True


def ended_well(returncode: int, request_path: str) -> bool:
    """Whether a worker's end allows a spare next: exit status 0, and its events name no CUDA
    error and no failed GPU check (a worker reports a faulted kernel and exits 0)."""
    if returncode != 0:
        return False
    try:
        events = Path(json.loads(Path(request_path).read_text())["events"]).read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return True  # a job without events (a GPU check): its status says it
    return b'"event": "cuda_error"' not in events and b'"healthy": false' not in events


def takes(req: dict[str, Any]) -> bool:
    """Whether a spawn request may go to a spare: a worker job for a ``run`` whose request
    file sets no environment (engine/worker.py applies it before CUDA starts)."""
    if req.get("job", "worker") != "worker":
        return False
    try:
        request = json.loads(Path(req["request"]).read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return request.get("mode", "run") == "run" and not request.get("env")


def child_main(request_fd: int, ready_fd: int, server_pid: int) -> int:
    """The spare's life after the fork: the context, ``ready``, then the run it is given. A
    run handed over before the context was ready waits in the pipe; one handed over to a
    spare whose context could not be made runs all the same (its worker then looks for the
    GPU itself, as a fresh fork's would); a spare without a context that gets no run within
    ``NO_CONTEXT_WAIT_S`` ends (its server drops it on reading why)."""
    import select

    from cutedebug.engine import forkserver, lifeline

    lifeline.set_pdeathsig()
    why = _context()
    try:
        os.write(ready_fd, (why or "ready").encode() + b"\n")
    except OSError:  # the server closed its end: it handed the run over already
        pass
    os.close(ready_fd)
    if why and not select.select([request_fd], [], [], NO_CONTEXT_WAIT_S)[0]:
        return 0
    buf = b""
    while not buf.endswith(b"\n"):
        try:
            chunk = os.read(request_fd, 65536)
        except OSError:
            return 0
        if not chunk:  # the server let go of its spare
            return 0
        buf += chunk
    os.close(request_fd)
    msg = json.loads(buf)
    lifeline.adopt_session_tags(msg["session_tags"])
    return forkserver._child(msg["req"], server_pid)


def _context() -> str:
    """Make this process's CUDA context ready, as a worker's first tensor would; '' when it is,
    else why there will be no spare."""
    from cutedebug import devices

    if devices.gpu_device_node() is None:
        return "" if os.environ.get(SPARE_VAR) == "1" else "no GPU device node"
    try:
        import torch

        from cutedebug.engine import worker

        device = worker.detect_device()
        if not device.get("present"):
            return f"no GPU: {device.get('reason')}"
        torch.ones(1).to("cuda")  # the context, the allocator, a host-to-device copy
        torch.cuda.synchronize()
        mode = _compute_mode()
        if mode:
            return mode
    except Exception as e:  # noqa: BLE001  (no spare; the runs fork as before)
        return f"CUDA could not start: {type(e).__name__}: {e}"
    return ""


def _compute_mode() -> str:
    """'' in the default compute mode, else why a spare must not hold a context here."""
    import cuda.bindings.driver as drv

    attr = drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_MODE
    err, dev = drv.cuCtxGetDevice()
    if err != drv.CUresult.CUDA_SUCCESS:
        return f"cuCtxGetDevice: {err.name}"
    err, mode = drv.cuDeviceGetAttribute(attr, dev)
    if err != drv.CUresult.CUDA_SUCCESS:
        return f"cuDeviceGetAttribute(COMPUTE_MODE): {err.name}"
    if int(mode) != int(drv.CUcomputemode.CU_COMPUTEMODE_DEFAULT):
        return f"the GPU is in compute mode {int(mode)}, not the default: no spare context"
    return ""
