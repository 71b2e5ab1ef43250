"""Does a user-triggered GPU coredump leave a running kernel running? (issue #25)

    python3 tools/dump_resume.py --out /tmp/dr --json rows.json     # on a GPU machine

The seconds a coredump adds to a hang's verdict are the driver's: it collects the GPU's state
SM by SM (45-67 ms for each SM holding warps on the H200), 7-10 s for a kernel that fills the
GPU. Those seconds could be spent *before* the kill decision, while the watchdog still waits
(a dump at, say, half the stall window or the deadline, kept only if the run is then called a
hang), but only if the dump is harmless to a kernel that was about to finish: with
``skip_abort`` the process is not aborted, and what happens to the kernel is not documented.

This measures it with ``kernels/flag_spin.py`` under ``never_set``: its consumers spin on
flags in global memory that the producer never stores, a kernel that waits until someone else
lets it go. Two sides in one process, with the coredump settings a run's worker gets
(:func:`cutedebug.analyses.coredump_capture.worker_env`):

- ``control``: launch, wait ``--hold-s``, store the flags from the host (a pinned
  host-to-device copy on a second, non-blocking stream: no SM needed), then the kernel must end
  within ``--limit-s`` with y = 2 x + 1 everywhere: the experiment itself works.
- ``dump``: launch, wait, dump through the pipe (:func:`coredump_capture.trigger`, in this
  process), then whether the kernel is still running and the context sane, then the flags as
  in ``control``: did the kernel resume and end with the right values (the dump harmless), end
  with a CUDA error, or never end (halted by the dump)?

One JSON row per side (--json), printed as it comes; rc 0 when both sides ran to an answer,
1 when the control did not end (the experiment, not the dump, failed).
A side that never ends is reported and the process exits at once (``os._exit``: a spinning
kernel's context is torn down by the driver; the caller's ``timeout`` is the backstop).
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutedebug.analyses import coredump_capture  # noqa: E402


def _flag_spin():
    spec = importlib.util.spec_from_file_location("flag_spin", ROOT / "kernels" / "flag_spin.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.FlagSpin


T0 = time.monotonic()


def step(what: str) -> None:
    """One line on stderr per step, with the seconds since the start: where a side that never
    answers stopped (with faulthandler's stacks, --stacks-after-s)."""
    print(f"[{time.monotonic() - T0:7.3f} s] {what}", file=sys.stderr, flush=True)


def _poll(event, limit_s: float) -> tuple[bool | None, str | None]:
    """(ended, CUDA error) of ``event`` within ``limit_s``: True / False (still running), or
    None with the error's text when asking raised."""
    t_end = time.monotonic() + limit_s
    while True:
        try:
            if event.query():
                return True, None
        except Exception as e:  # noqa: BLE001  (a CUDA error: the answer)
            return None, f"{type(e).__name__}: {str(e).splitlines()[0]}"
        if time.monotonic() >= t_end:
            return False, None
        time.sleep(0.005)


def ask_dump(pid: int, run_dir: Path, limit_s: float) -> dict[str, Any]:
    """The dump of process ``pid`` asked from another process, as the watchdog asks it of a
    worker (:func:`coredump_capture.trigger` there): its facts, or {"error": ...}."""
    code = (
        "import json, sys; from pathlib import Path; "
        "from cutedebug.analyses import coredump_capture as c; "
        "print(json.dumps(c.trigger(int(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]))))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    try:
        r = subprocess.run(
            [sys.executable, "-c", code, str(pid), str(run_dir), str(limit_s)],
            capture_output=True,
            text=True,
            timeout=limit_s + 30,
            env=env,
        )
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
        return {"error": f"the helper that asks the dump: {type(e).__name__}: {e}"}


def pause(torch, run_dir: Path, work_s: float, dump_at_s: float) -> dict[str, Any]:
    """Does a dump pause the GPU's work? The same queue of matmuls (about ``work_s`` of them)
    alone, then with a dump asked ``dump_at_s`` after it started: the wall seconds of each, the
    difference against the dump's seconds, and the last product checked against a fresh one
    (the work's values after the dump)."""
    step("pause: matmuls")
    a = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    torch.matmul(a, a, out=c)
    torch.cuda.synchronize()
    t = time.monotonic()
    for _ in range(5):
        torch.matmul(a, a, out=c)
    torch.cuda.synchronize()
    each = (time.monotonic() - t) / 5
    n = max(10, int(work_s / each))
    row: dict[str, Any] = {"side": "pause", "matmul_s": round(each, 4), "matmuls": n}
    for name in ("alone", "dump"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.monotonic()
        start.record()
        for _ in range(n):
            torch.matmul(a, a, out=c)
        end.record()
        got: dict[str, Any] = {"queued_s": round(time.monotonic() - t0, 3)}
        if name == "dump":
            time.sleep(max(0.0, dump_at_s - (time.monotonic() - t0)))
            got["dump_asked_at_s"] = round(time.monotonic() - t0, 3)
            step("pause: dump")
            facts = ask_dump(os.getpid(), run_dir, coredump_capture.DUMP_LIMIT_S)
            got["dump"] = {k: facts.get(k) for k in ("dump_s", "complete", "core_bytes", "error")}
        ended, err = _poll(end, 60.0)
        got.update(ended=ended, error=err, wall_s=round(time.monotonic() - t0, 3))
        if ended:
            got["gpu_s"] = round(start.elapsed_time(end) / 1000, 3)
        row[name] = got
        step(f"pause: {name} {got}")
        if not ended:
            return row
    want = torch.matmul(a, a)
    row["last_product_right"] = bool(torch.equal(c, want))
    dump_s = (row["dump"].get("dump") or {}).get("dump_s")
    extra = row["dump"]["wall_s"] - row["alone"]["wall_s"]
    row["extra_s"] = round(extra, 3)
    row["answer"] = f"the work took {extra:.2f} s longer with a dump of {dump_s} s" + (
        "" if row["last_product_right"] else "; the last product is WRONG"
    )
    return row


def side(name: str, k, compiled, torch, run_dir: Path, hold_s: float, limit_s: float):
    row: dict[str, Any] = {"side": name}
    step(f"{name}: inputs")
    t = k.make_inputs("cuda")
    ones = torch.ones_like(t["flags"], device="cpu").pin_memory()
    # made before the launch: creating a stream waited for the spinning kernel on the H200
    # (2026-12-02-h200-s6 call3: torch/cuda/streams.py __new__ until the timeout)
    side_stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    done = torch.cuda.Event()
    step(f"{name}: launch")
    t0 = time.monotonic()
    compiled(*k.cute_args(t))
    row["launch_returned_s"] = round(time.monotonic() - t0, 3)
    step(f"{name}: launch returned")
    done.record()
    time.sleep(hold_s)
    ended, err = _poll(done, 0.0)
    row["before_release"] = {"ended": ended, "error": err}  # must be False: it spins
    step(f"{name}: before the release, ended={ended} error={err}")
    if name == "dump":
        step(f"{name}: dump")
        facts = ask_dump(os.getpid(), run_dir, coredump_capture.DUMP_LIMIT_S)
        row["dump"] = {k_: facts.get(k_) for k_ in ("dump_s", "complete", "core_bytes", "error")}
        ended, err = _poll(done, 0.0)
        row["after_dump"] = {"ended": ended, "error": err}
        step(f"{name}: after the dump {row['dump']}, ended={ended} error={err}")
    step(f"{name}: store the flags")
    try:  # after a dump the context has the dumped kernel's error (s6 call4): it raises here
        with torch.cuda.stream(side_stream):
            t["flags"].copy_(ones, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(side_stream)
        c_ended, c_err = _poll(copied, limit_s)
    except Exception as e:  # noqa: BLE001  (a CUDA error: the answer)
        c_ended, c_err = None, f"{type(e).__name__}: {str(e).splitlines()[0]}"
    row["flags_stored"] = {"ended": c_ended, "error": c_err}
    step(f"{name}: flags stored={c_ended} error={c_err}")
    t_release = time.monotonic()
    ended, err = _poll(done, limit_s) if c_ended is not None else (None, c_err)
    row["kernel"] = {
        "ended": ended,
        "error": err,
        "after_release_s": round(time.monotonic() - t_release, 3),
        "wall_s": round(time.monotonic() - t0, 3),
    }
    step(f"{name}: kernel ended={ended} error={err}")
    if ended:
        y, want = k.output(t), k.reference(t)
        bad = int((~torch.isclose(y, want, rtol=1e-6, atol=1e-6)).sum().item())
        row["kernel"]["wrong_elements"] = bad
        row["answer"] = "resumed, right values" if bad == 0 else f"resumed, {bad} wrong values"
    elif ended is None:
        row["answer"] = f"CUDA error: {err}"
    else:
        row["answer"] = f"did not end within {limit_s:g} s of the flags"
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/dump_resume", help="the run folder (pipe, core)")
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--hold-s", type=float, default=0.5, help="spin this long before (0.5)")
    ap.add_argument("--limit-s", type=float, default=15.0, help="wait at most this (15)")
    ap.add_argument(
        "--sides",
        default="control,dump",
        help="which sides, in order (control,dump; pause: does a dump pause running work)",
    )
    ap.add_argument("--work-s", type=float, default=3.0, help="pause: seconds of matmuls (3)")
    ap.add_argument(
        "--plain",
        action="store_true",
        help="without the coredump settings (the control alone: does the experiment need them)",
    )
    ap.add_argument(
        "--stacks-after-s",
        type=float,
        default=0.0,
        help="print every thread's Python stack to stderr after this many seconds (0: never)",
    )
    args = ap.parse_args(argv)
    sides = [x.strip() for x in args.sides.split(",") if x.strip()]
    if not sides or any(x not in ("control", "dump", "pause") for x in sides):
        ap.error(f"--sides: {args.sides!r}; allowed: control, dump, pause (comma-separated)")
    if args.plain and ("dump" in sides or "pause" in sides):
        ap.error("--plain: without the coredump settings there is no dump; use --sides control")
    if args.stacks_after_s > 0:
        faulthandler.dump_traceback_later(args.stacks_after_s, exit=False)
    run_dir = Path(args.out).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    if not args.plain:
        os.environ.update(coredump_capture.worker_env(run_dir))  # before CUDA initializes
    step("import torch")
    import torch

    if not torch.cuda.is_available():
        print("no GPU")
        return 0
    k = compiled = None
    if set(sides) & {"control", "dump"}:
        step("import cutlass")
        import cutlass.cute as cute

        k = _flag_spin()(never_set=True, ctas=8)
        step("compile")
        compiled = cute.compile(k, *k.cute_args(k.make_inputs("cuda")))
    rows = []

    def out(row: dict[str, Any]) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))

    for name in sides:
        if name == "pause":
            out(pause(torch, run_dir, args.work_s, dump_at_s=0.5))
            continue
        row = side(name, k, compiled, torch, run_dir, args.hold_s, args.limit_s)
        out(row)
        if row["kernel"]["ended"] is not True:
            print(f"{name}: {row['answer']}; exiting without tearing the context down", flush=True)
            coredump_capture.remove_pipes(run_dir)
            os._exit(0 if name == "dump" else 1)
    coredump_capture.remove_pipes(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
