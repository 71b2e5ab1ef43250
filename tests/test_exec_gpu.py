"""`cutedebug exec` on the GPU (skipped without one): a plain repro script, no adapter, hung by a
fault, must come back as a HANG in its kernel, localized by the probes within 2 s of the stall,
with the GPU healthy afterwards and nothing left behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cutedebug.engine.run_report import ExecReport

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "tests" / "exec_targets" / "gpu_tma_stream.py"

pytestmark = pytest.mark.gpu


def line_of(code: str) -> int:
    lines = (ROOT / "kernels" / "tma_stream.py").read_text().splitlines()
    hits = [i for i, ln in enumerate(lines, 1) if code in ln]
    assert len(hits) == 1, (code, hits)
    return hits[0]


def cutedebug(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """``python -m cutedebug ARGS`` from the repository, this tree first on its path."""
    path = [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    return subprocess.run(
        [sys.executable, "-m", "cutedebug", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(path)),
        cwd=str(ROOT),
    )


def exec_run(runs_dir: Path, *args: str) -> tuple[subprocess.CompletedProcess, ExecReport]:
    """``cutedebug exec --runs-dir RUNS_DIR ARGS``: the process and the report it wrote."""
    out = cutedebug("exec", "--runs-dir", str(runs_dir), *args, timeout=180)
    report = re.search(r"report: (\S+)", out.stdout).group(1)
    print(out.stdout[-2000:])
    js = json.loads((Path(report).parent / "report.json").read_text())
    return out, ExecReport.from_json(js)


def test_exec_localizes_a_hang_in_a_plain_script(tmp_path):
    out, rep = exec_run(
        tmp_path,
        "--probes",
        "--fault",
        "wrong_expect_tx:delta_bytes=16",
        "--deadline",
        "60",
        "--",
        sys.executable,
        str(TARGET),
    )
    assert out.returncode == 1 and rep.verdict == "HANG", out.stdout + out.stderr
    ev = rep.evidence
    assert ev["kernel"] == "TmaStream.kernel"
    consumers = {
        (s["op"], s["barrier"], s["location"]) for s in ev["stuck_sites"] if s["role"] == "consumer"
    }
    assert consumers == {
        ("consumer_wait", "full", f"tma_stream.py:{line_of('ring.consumer_wait(state)')}")
    }
    assert ev["timeline"]["stall_to_verdict_s"] <= 2.0
    assert rep.health["healthy"] is True
    assert rep.left_pids == [] and rep.fault_count == 1


def test_mutate_two_mutants_at_once_share_the_gpu(tmp_path):
    """mutate --jobs 2 over the plain repro: the two mutants compile at once and take turns on
    the GPU (token); both faults hang the kernel (as exec-1 measured on the H200), nothing is
    left behind and the GPU is healthy after the kills."""
    out_dir = tmp_path / "m"
    out = cutedebug(
        "mutate",
        "--out",
        str(out_dir),
        "--jobs",
        "2",
        "--faults",
        "skip_consumer_release,wrong_expect_tx",
        "--",
        sys.executable,
        str(TARGET),
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    m = json.loads((out_dir / "matrix.json").read_text())
    assert {r["id"]: (r["status"], r["verdict"]) for r in m["mutants"]} == {
        "t0.p0.skip_consumer_release": ("CAUGHT", "HANG"),
        "t0.p0.wrong_expect_tx+16": ("CAUGHT", "HANG"),
    }
    assert m["facts"]["processes_left"] == [] and m["facts"]["gpu_health"]["healthy"] is True
    assert not (out_dir / "gpu.token").exists()  # released after each mutant


def test_exec_names_a_fault_that_surfaces_in_cublas(tmp_path):
    """A kernel's illegal address first heard of in torch's cuBLAS: exec reads the context at
    the process's exit (cuStreamQuery, no wait) and names the error and the kernel; the same
    program without the fault reads a healthy context and passes."""
    target = ROOT / "tests" / "exec_targets" / "gpu_fault_surfaces_in_cublas.py"

    def run(*extra):
        return exec_run(tmp_path, "--deadline", "60", "--", sys.executable, str(target), *extra)

    out, rep = run()
    assert out.returncode == 1 and rep.verdict == "CRASH", out.stdout + out.stderr
    assert rep.reason.startswith(
        "cudaErrorIllegalAddress: the kernel Minimal.kernel faulted (surfaced later"
    ), rep.reason
    (proc,) = rep.processes
    ctx = proc.cuda_context
    assert (ctx["state"], ctx["error"], ctx["when"]) == (
        "error",
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "exit",
    )
    assert ctx["via"] == "cuStreamQuery(legacy default stream)"
    out, rep = run("--clean")
    assert out.returncode == 0 and rep.verdict == "PASS", out.stdout + out.stderr
    (proc,) = rep.processes
    assert proc.cuda_context["state"] == "ok" and proc.cuda_context["kernel"] == "Minimal.kernel"
