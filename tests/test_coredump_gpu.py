"""`cutedebug run --coredump` on a GPU: a named-barrier hang that only bisection could grade,
localized before the kill from the hung worker, read through cuda-gdb attached to it (the
default) or from the driver's core (CUTEDEBUG_COREDUMP_READ=dump); needs cuda-gdb, skipped
without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cutedebug.analyses import cudagdb
from cutedebug.engine.run_report import RunReport

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("read", ["attach", "dump"])
def test_named_barrier_hang_localized_from_the_core(tmp_path, read):
    if cudagdb.find_cuda_gdb() is None:
        pytest.skip("no cuda-gdb")
    # sm90_attention's consumers are held by a deferred BAR.SYNC several instructions back
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cutedebug",
            "run",
            "--coredump",
            "--deadline",
            "1",
            "--runs-dir",
            str(tmp_path),
            str(ROOT / "scenarios/sm90_attention/wrong_barrier_threads_plus.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "CUTEDEBUG_COREDUMP_READ": read},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rep = RunReport.from_json(json.loads(next(tmp_path.glob("*/report.json")).read_text()))
    ev = rep.evidence
    assert rep.verdict == "HANG" and ev["coredump_grade"]["ok"] is True, ev["coredump_grade"]
    assert ev["role_answers"]["consumer"]["op"] == "named_barrier"
    assert rep.health["healthy"] is True
    cores = list(tmp_path.glob("*/coredump*.nvcudmp"))
    if read == "attach":  # read before the kill, the worker left running: no dump, no core
        att = ev["coredump"]["attach"]
        assert "error" not in att and att["attach_s"] < 5 and att["warps"] > 0, att
        assert ev["coredump"]["dump"] is None and not cores
    else:
        assert ev["coredump"]["dump"]["dump_s"] < 5 and "attach" not in ev["coredump"]
        assert cores or ev["coredump"].get("core_removed")  # a core over 64 MB is removed
    assert not ev.get("rerun_with_probes")
