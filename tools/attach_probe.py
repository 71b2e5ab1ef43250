"""Can cuda-gdb attach to a live worker whose kernel hangs, and how soon does it give each
warp's place? (#25: the driver's coredump of a kernel that holds every SM takes 6-9 s, and a
dump ends the kernel it dumps, so no dump can be taken sooner; an attached debugger might read
only what it is asked for.)

    python3 tools/attach_probe.py --json rows.json          # on a GPU machine with cuda-gdb

A child process compiles and launches a hanging kernel (``spin``: minimal's spin_hang, every
thread of 8,448 warps on one mbarrier, the GPU full; ``flag``: flag_spin's never_set, 8 CTAs),
allows any process to trace it (``prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)``, as Yama's
ptrace_scope 1 would otherwise refuse a debugger that is not its ancestor), says "launched"
and waits on the kernel. One second later ``cuda-gdb -batch -p PID`` runs ``info cuda
kernels``, ``info cuda sms`` and ``info cuda warps`` (the focus SM's warps: PC and state) and
detaches; each row has its wall seconds, return code, the lines it printed and whether the
child's kernel was still running after the detach. The child is then killed with its group.
A measurement tool: nothing in the harness uses attach yet.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutedebug.analyses import cudagdb  # noqa: E402

CHILD = r"""
import ctypes, importlib.util, os, sys, time
libc = ctypes.CDLL(None)
libc.prctl(0x59616d61, ctypes.c_ulong(-1 & 0xFFFFFFFFFFFFFFFF), 0, 0, 0)  # PR_SET_PTRACER, ANY
os.environ["CUTE_DSL_LINEINFO"] = "1"
import torch
import cutlass.cute as cute
root, kind = sys.argv[1], sys.argv[2]
def load(name, cls):
    spec = importlib.util.spec_from_file_location(name, os.path.join(root, "kernels", name + ".py"))
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return getattr(mod, cls)
k = load("minimal", "Minimal")(spin_hang=True) if kind == "spin" else load("flag_spin", "FlagSpin")(never_set=True, ctas=8)
t = k.make_inputs("cuda")
args = k.cute_args(t)
compiled = cute.compile(k, *args)
torch.cuda.synchronize()
compiled(*args)
print("launched", flush=True)
torch.cuda.synchronize()
print("ended", flush=True)
"""


def _wait_line(proc: subprocess.Popen, want: str, limit_s: float) -> bool:
    t_end = time.monotonic() + limit_s
    assert proc.stdout is not None
    while time.monotonic() < t_end:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if not line:
                return False
            if line.strip() == want:
                return True
        if proc.poll() is not None:
            return False
    return False


# What each attach asks: "focus", the focused SM's warps; "round1", the core reader's first
# round (cutedebug.analyses.cudagdb.ROUND1: every SM's warps, the focused frame and instruction)
ASKS = {
    "focus": ["info cuda kernels", "info cuda sms", "info cuda warps"],
    "round1": list(cudagdb.ROUND1),
}


def attach(pid: int, solib: bool, limit_s: float, ask: str = "focus") -> dict[str, Any]:
    gdb = cudagdb.find_cuda_gdb() or "cuda-gdb"
    cmd = [gdb, "-batch", "-nx", "-ex", "set pagination off", "-ex", "set width 0"]
    if not solib:  # the host's shared libraries' symbols are not needed for the GPU's state
        cmd += ["-iex", "set auto-solib-add off"]
    cmd += ["-p", str(pid)]
    for c in [*ASKS[ask], "detach"]:
        cmd += ["-ex", c]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s)
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out = (
            (e.stdout or b"").decode(errors="replace")
            if isinstance(e.stdout, bytes)
            else (e.stdout or "")
        )
        rc = "timeout"
    lines = out.splitlines()
    warps = cudagdb.parse_warps(out)
    return {
        "ask": ask,
        "solib": solib,
        "warps": len(warps),
        "sms": len({w.sm for w in warps}),
        "pcs": len({w.pc for w in warps}),
        "wall_s": round(time.monotonic() - t0, 3),
        "rc": rc,
        "lines": len(lines),
        "head": "\n".join(lines[:60])[:6000],
        "tail": "\n".join(lines[-30:])[:4000],
    }


def probe(kind: str, variants: list[tuple[str, bool]], limit_s: float) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(ROOT), kind],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    row: dict[str, Any] = {"kernel": kind, "pid": proc.pid}
    try:
        if not _wait_line(proc, "launched", 90):
            row["error"] = "the child did not launch"
            return row
        row["launched_after_s"] = round(time.monotonic() - t0, 2)
        time.sleep(1.0)
        row["attaches"] = []
        for ask, solib in variants:
            a = attach(proc.pid, solib, limit_s, ask)
            a["child_running_after"] = proc.poll() is None
            row["attaches"].append(a)
            keys = ("ask", "solib", "wall_s", "rc", "warps", "sms", "pcs", "child_running_after")
            print(json.dumps({k: a[k] for k in keys}), flush=True)
            if proc.poll() is not None:
                break
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait(timeout=30)
        row["child_rc"] = proc.returncode
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--kernels", default="flag,spin", help="flag, spin (comma-separated)")
    ap.add_argument("--limit-s", type=float, default=40.0, help="one attach at most (40)")
    args = ap.parse_args(argv)
    kinds = [x.strip() for x in args.kernels.split(",") if x.strip()]
    if not kinds or any(k not in ("flag", "spin") for k in kinds):
        ap.error(f"--kernels: {args.kernels!r}; allowed: flag, spin (comma-separated)")
    try:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        scope = None
    print(f"ptrace_scope: {scope}", flush=True)
    rows = []
    for kind in kinds:
        asks = [("focus", False), ("round1", False), ("focus", False)]
        rows.append(probe(kind, asks, args.limit_s))
        if args.json:
            Path(args.json).write_text(json.dumps({"ptrace_scope": scope, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
