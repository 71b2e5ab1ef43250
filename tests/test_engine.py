"""`cutedebug run` end to end on the minimal kernel: CPU (compile, report, exit codes) and GPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cutedebug.engine.run_report import RunReport

ROOT = Path(__file__).resolve().parent.parent
SCEN = ROOT / "scenarios" / "minimal"


def cutedebug(*args, cwd=ROOT, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "cutedebug", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )


def report_of(stdout: str) -> RunReport:
    """The run's report.json, read as its record (every field checked)."""
    line = next(ln for ln in stdout.splitlines() if ln.strip().startswith("report:"))
    md = Path(line.split("report:", 1)[1].strip())
    if not md.is_absolute():
        md = ROOT / md
    return RunReport.from_json(json.loads((md.parent / "report.json").read_text()))


def test_compile_only_minimal_for_sm90(tmp_path):
    r = cutedebug("run", str(SCEN / "clean.toml"), "--compile-only", "--runs-dir", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    rep = report_of(r.stdout)
    assert rep.schema_version == 1
    assert rep.verdict == "UNSUPPORTED"
    assert rep.evidence["compiled"]["arch"] == "sm_90a"
    ptx = (Path(rep.run_dir) / "kernel.ptx").read_text()
    assert ".target sm_90a" in ptx
    assert "mbarrier.try_wait" in ptx and "mbarrier.arrive" in ptx
    # where the seconds went: the phases of a fresh worker cover its whole wall time
    t = rep.timings
    phases = [t[k] for k in ("spawn_s", "imports_s", "inputs_s", "compile_s", "exit_s")]
    assert min(phases) >= 0 and t["verdict_s"] >= 0
    assert t["imports_s"] > 0.3  # torch and cutlass, in a fresh interpreter
    assert 0.9 * t["total_s"] <= sum(phases) <= t["total_s"] + 0.05
    assert t["wall_s"] >= t["total_s"]


def test_switch_fault_changes_the_ptx(tmp_path):
    r = cutedebug(
        "run", str(SCEN / "spin_hang.toml"), "--compile-only", "--runs-dir", str(tmp_path)
    )
    assert r.returncode == 0, r.stdout + r.stderr
    ptx = (Path(report_of(r.stdout).run_dir) / "kernel.ptx").read_text()
    assert "mbarrier.try_wait" in ptx and "mbarrier.arrive" not in ptx


@pytest.mark.skipif(
    __import__("shutil").which("nvidia-smi") is not None, reason="behaviour without a GPU"
)
def test_without_gpu_run_says_what_it_could_not_do(tmp_path):
    r = cutedebug("run", str(SCEN / "clean.toml"), "--runs-dir", str(tmp_path))
    assert r.returncode == 4  # could not run here (exits.EXIT_NOT_RUN): it compiled
    assert "UNSUPPORTED (EXPECTED PASS)" in r.stdout
    assert "compiled for sm_90a" in r.stdout and "not run" in r.stdout
    md = (Path(report_of(r.stdout).run_dir) / "report.md").read_text()
    assert "**TL;DR** UNSUPPORTED" in md and "cutedebug run" in md


def test_bad_kernel_param_is_a_usage_error(tmp_path):
    r = cutedebug(
        "run", "kernels/minimal.py:Minimal", "--param", "n=abc", "--runs-dir", str(tmp_path)
    )
    assert r.returncode == 2
    assert "params.n" in r.stderr and "expected int" in r.stderr


def test_missing_entry_is_a_usage_error(tmp_path):
    r = cutedebug("run", "kernels/minimal.py:Nope", "--runs-dir", str(tmp_path))
    assert r.returncode == 2
    assert "'Nope'" in r.stderr and "Minimal" in r.stderr


def test_missing_scenario_file_is_a_usage_error(tmp_path):
    r = cutedebug("run", str(tmp_path / "none.toml"))
    assert r.returncode == 2 and "not found" in r.stderr


def test_list_shows_kernel_fault_and_expectation():
    r = cutedebug("list", "scenarios/minimal")
    assert r.returncode == 0
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("minimal/spin_hang"))
    assert "minimal.py:Minimal" in row and "spin_hang" in row and "HANG" in row


def test_faults_lists_the_registry():
    r = cutedebug("faults")
    assert r.returncode == 0
    for name in ("wrong_expect_tx", "missing_phase_flip", "skip_producer_tail", "drop_sync"):
        assert name in r.stdout


# ---- GPU ------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize(
    "name,verdict", [("clean", "PASS"), ("spin_hang", "HANG"), ("oob_store", "CRASH")]
)
def test_minimal_verdicts_on_gpu(tmp_path, name, verdict):
    r = cutedebug("run", str(SCEN / f"{name}.toml"), "--runs-dir", str(tmp_path))
    rep = report_of(r.stdout)
    assert rep.verdict == verdict, rep.tldr
    if verdict == "HANG":
        assert rep.health["healthy"] is True


def test_cpu_run_reports_what_the_static_checks_caught(tmp_path):
    r = cutedebug(
        "run",
        "scenarios/tma_stream/wrong_expect_tx_plus.toml",
        "scenarios/tma_stream/clean.toml",
        "--compile-only",
        "--runs-dir",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    faulted = lines.index(next(ln for ln in lines if "wrong_expect_tx_plus" in ln))
    assert lines[faulted + 1].startswith(
        "  static protocol checks: 1 finding(s) — error expect_tx: full barrier of pipeline"
    )
    assert "expect_tx 33040 B per stage, TMA copies deliver 33024 B" in lines[faulted + 1]
    clean = lines.index(next(ln for ln in lines if "tma_stream/clean" in ln))
    assert lines[clean + 1] == "  static protocol checks: no finding(s)"
    # where the fault changed the kernel (its call line), even though nothing ran
    source = (ROOT / "kernels" / "tma_stream.py").read_text().splitlines()
    line = next(i for i, t in enumerate(source, 1) if "ring.producer_acquire(" in t)
    assert f"  fault wrong_expect_tx applied at 1 site(s): tma_stream.py:{line}" in lines


def test_compile_only_run_says_a_fault_was_not_applied(tmp_path):
    """A fault that found nothing to change says so on a compile-only run too, not only on a
    PASS: the minimal kernel has no pipeline state for missing_phase_flip."""
    r = cutedebug(
        "run",
        "kernels/minimal.py:Minimal",
        "--fault",
        "missing_phase_flip",
        "--compile-only",
        "--runs-dir",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (note,) = [ln for ln in r.stdout.splitlines() if "NOT APPLIED" in ln]
    assert note.startswith(
        "  fault missing_phase_flip(role='consumer') NOT APPLIED: 0 sites while tracing "
        "(looked for: PipelineState.advance"
    )
    assert note.endswith("the kernel was compiled unmodified")
