"""Two hung runs read by attached cuda-gdb at once, beside a process doing honest work (#25).

    python3 tools/attach_neighbours.py --out /tmp/an --json rows.json     # on a GPU machine

`cutedebug run --coredump` reads a hung worker through cuda-gdb attached to it before the kill
(CUTEDEBUG_COREDUMP_READ=attach, the default). Under pytest-xdist, `triage --gpus all` or a
user's own jobs, other processes use the same GPU meanwhile, and several hung workers may be
read at once. This measures both on one GPU:

- ``alone``: a neighbour process runs cuBLAS matmuls in a loop (``--neighbour S``: batches of
  matmuls, each batch synchronized and its checksum compared with the first batch's), S seconds:
  its batch seconds without anything else on the GPU.
- ``beside``: the same neighbour, and after ``--lead-s`` two `cutedebug run --coredump` of
  small HANG scenarios started together (each its own watchdog, worker and cuda-gdb), so their
  attached readings overlap each other and the neighbour's batches.

One JSON row per neighbour side and per hung run: the neighbour's batches, wrong checksums,
CUDA error, median and longest batch (a debugger that stopped the whole GPU shows as one long
batch); each run's verdict, how it was read (attach / dump: attaching failed), the attach's
seconds or its error, the localization graded against the scenario, the GPU health after it.
rc 0 when every side ran to an answer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HANGS = ("tma_stream/wrong_expect_tx_plus", "sm90_gemm/wrong_expect_tx_minus")


def neighbour(seconds: float, n: int = 2048, per_batch: int = 40) -> dict:
    """Matmul batches for ``seconds``: what a process beside the hung runs sees."""
    import torch

    torch.manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    c = torch.empty_like(a)
    first, batches, wrong, error = None, [], 0, None
    t_end = time.monotonic() + seconds
    try:
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            for _ in range(per_batch):
                torch.matmul(a, b, out=c)
            s = float(c.float().sum().item())  # synchronizes
            batches.append(time.monotonic() - t0)
            first = s if first is None else first
            wrong += s != first
    except RuntimeError as e:  # a CUDA error seen by the neighbour
        error = str(e).splitlines()[0][:200]
    return summarize(batches, wrong, error)


def summarize(batches: list[float], wrong: int, error: str | None) -> dict:
    return {
        "batches": len(batches),
        "wrong": wrong,
        "error": error,
        "median_s": round(statistics.median(batches), 4) if batches else None,
        "max_s": round(max(batches), 4) if batches else None,
        # the longest batch's start, seconds into the side (against the runs' attach window)
        "max_at_s": round(sum(batches[: batches.index(max(batches))]), 3) if batches else None,
    }


def hang_row(scenario: str, rc: int, runs_dir: Path, wall: float) -> dict:
    """One `cutedebug run --coredump`'s report, as this table reads it."""
    reports = sorted(runs_dir.glob("*/report.json"))
    row: dict = {"scenario": scenario, "rc": rc, "wall_s": round(wall, 2)}
    if not reports:
        return {**row, "error": "no report.json"}
    rep = json.loads(reports[-1].read_text())
    core = (rep.get("evidence") or {}).get("coredump") or {}
    att = core.get("attach") or {}
    read = "attach" if att.get("attach_s") is not None and not att.get("error") else "dump"
    return {
        **row,
        "verdict": rep["verdict"],
        "read": read if (att or core.get("dump")) else "-",
        "attach_s": att.get("attach_s"),
        "attach_error": att.get("error"),
        "warps": core.get("warps"),
        "localization_ok": (rep.get("localization") or {}).get("ok"),
        "healthy": (rep.get("health") or {}).get("healthy"),
        "attach_window_s": rep.get("timings", {}).get("attach_s"),
    }


def _neighbour_proc(seconds: float, out: Path) -> subprocess.Popen:
    with open(out, "w") as log:  # the child keeps its own copy of the file
        return subprocess.Popen(
            [sys.executable, __file__, "--neighbour", str(seconds)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )


def _neighbour_result(p: subprocess.Popen, out: Path, limit: float) -> dict:
    try:
        p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return {"error": f"the neighbour did not end within {limit:.0f} s"}
    for line in reversed(out.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"error": f"rc {p.returncode}, no result: {out.read_text()[-300:]}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--neighbour", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="an-")))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--alone-s", type=float, default=6.0)
    ap.add_argument("--beside-s", type=float, default=30.0)
    ap.add_argument("--lead-s", type=float, default=3.0)
    ap.add_argument("--deadline", type=float, default=2.0)
    ap.add_argument("hangs", nargs="*", default=list(HANGS))
    a = ap.parse_args(argv)
    if a.neighbour is not None:
        print(json.dumps(neighbour(a.neighbour)), flush=True)
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    p = _neighbour_proc(a.alone_s, a.out / "alone.txt")
    emit({"side": "alone", **_neighbour_result(p, a.out / "alone.txt", a.alone_s + 60)})
    p = _neighbour_proc(a.beside_s, a.out / "beside.txt")
    time.sleep(a.lead_s)
    t0 = time.monotonic()
    runs = []
    for i, name in enumerate(a.hangs):
        d = a.out / f"run{i}"
        cmd = [sys.executable, "-m", "cutedebug", "run", "--coredump", "--deadline"]
        cmd += [str(a.deadline), "--runs-dir", str(d), str(ROOT / "scenarios" / f"{name}.toml")]
        with open(a.out / f"run{i}.log", "w") as log:
            runs.append((name, d, subprocess.Popen(cmd, stdout=log, stderr=log, cwd=ROOT)))
    for name, d, r in runs:
        try:
            rc = r.wait(timeout=180)
        except subprocess.TimeoutExpired:
            r.kill()
            rc = r.wait()
        emit({"side": "hang", **hang_row(name, rc, d, time.monotonic() - t0)})
    emit({"side": "beside", **_neighbour_result(p, a.out / "beside.txt", a.beside_s + 60)})
    alone, beside = rows[0], rows[-1]
    hangs = [r for r in rows if r["side"] == "hang"]
    print(
        f"\nneighbour alone: {alone.get('batches')} batches, median {alone.get('median_s')} s, "
        f"longest {alone.get('max_s')} s; beside {len(hangs)} hung runs read at once: "
        f"{beside.get('batches')} batches, wrong {beside.get('wrong')}, error "
        f"{beside.get('error')}, median {beside.get('median_s')} s, longest {beside.get('max_s')} "
        f"s at {beside.get('max_at_s')} s"
    )
    for h in hangs:
        why = f", {h['attach_error']}" if h.get("attach_error") else ""
        print(
            f"{h['scenario']}: {h.get('verdict')}, read {h.get('read')} "
            f"({h.get('attach_s')} s{why}), localized {h.get('localization_ok')}, "
            f"healthy {h.get('healthy')}, {h['wall_s']} s"
        )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    ran = all(r.get("batches") for r in (alone, beside)) and all(h.get("verdict") for h in hangs)
    return 0 if ran else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
