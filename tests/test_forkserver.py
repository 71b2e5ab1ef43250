"""The fork server: workers forked from a process that imported torch and cutlass once."""

import time
from pathlib import Path

import psutil
import pytest

from cutedebug.engine import runner
from cutedebug.engine import scenario as S
from cutedebug.engine.verdict import Verdict

pytestmark = pytest.mark.slow  # tens of seconds on the 2-core CI machine

ROOT = Path(__file__).resolve().parent.parent


def test_forked_compile_matches_a_fresh_worker(tmp_path, shared_forkserver):
    sc = S.load(ROOT / "scenarios" / "minimal" / "spin_hang.toml")
    fresh = runner.run_scenario(sc, runs_root=tmp_path / "fresh", mode="compile")
    forked = runner.run_scenario(
        sc, runs_root=tmp_path / "forked", mode="compile", forkserver=shared_forkserver
    )
    assert forked.verdict is fresh.verdict is Verdict.UNSUPPORTED
    assert forked.expected and fresh.expected
    ptx_fresh = (fresh.run_dir / "kernel.ptx").read_text()
    ptx_forked = (forked.run_dir / "kernel.ptx").read_text()
    assert ptx_forked == ptx_fresh
    # The forked worker skipped the imports a fresh one pays for (its own phase, from the
    # report, not the call's wall time: that includes the shared server's start when this
    # test is the first of its xdist worker to use it, and the machine's load)
    assert forked.timings["imports_s"] < 0.5 * fresh.timings["imports_s"], (
        forked.timings,
        fresh.timings,
    )


def test_forked_worker_stuck_in_import_is_killed_and_swept(tmp_path, shared_forkserver):
    sc = S.adhoc(
        str(ROOT / "tests" / "helpers" / "sleepy_kernel.py") + ":Sleepy", {}, None, {}, "PASS"
    )
    sc = sc.with_overrides(limits=S.Limits(import_s=2.0))
    fs = shared_forkserver
    res = runner.run_scenario(sc, runs_root=tmp_path, forkserver=fs)
    pids = [c.pid for c in psutil.Process(fs.proc.pid).children(recursive=True)]
    assert res.verdict is Verdict.HARNESS_ERROR
    assert "deadline" in res.reason
    assert pids == []  # the killed worker was reaped by the server


def test_closing_the_server_kills_its_workers(tmp_path):
    sc = S.adhoc(
        str(ROOT / "tests" / "helpers" / "sleepy_kernel.py") + ":Sleepy", {}, None, {}, "PASS"
    )
    fs = runner.start_forkserver(tmp_path)
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    req = run_dir / "request.json"
    import json

    req.write_text(
        json.dumps(
            {"scenario": sc.to_json(), "mode": "run", "events": str(run_dir / "events.jsonl")}
        )
    )
    child = fs.spawn(req, run_dir / "worker.log", {})
    time.sleep(0.5)
    assert psutil.pid_exists(child.pid)
    server_pid = fs.proc.pid
    fs.close()
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (
        not psutil.pid_exists(child.pid)
        or psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
    )
    assert (
        not psutil.pid_exists(server_pid)
        or psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE
    )


def test_forked_health_check_answers_like_a_fresh_one(tmp_path, shared_forkserver):
    fresh = runner.health_check()
    fs = shared_forkserver
    forked = runner.health_check(forkserver=fs, run_dir=tmp_path / "run")
    left = [c.pid for c in psutil.Process(fs.proc.pid).children(recursive=True)]
    assert forked.pop("forked") is True and "forked" not in fresh
    fresh_s, forked_s = fresh.pop("secs"), forked.pop("secs")
    assert forked == fresh  # on a machine without a GPU: {"healthy": None, ...}
    assert (tmp_path / "run" / "health" / "exit_status.json").exists()
    assert left == []
    # the forked check skips the torch import a fresh interpreter pays for
    assert forked_s < fresh_s


def test_health_check_output_that_is_not_json_is_unhealthy():
    assert runner._health_result("", "Traceback ...\nRuntimeError: boom")["error"].endswith("boom")
    bad = runner._health_result("warning\n[1, 2]", "")
    assert bad["healthy"] is False and "not a JSON object" in bad["error"]
    assert runner._health_result('{"healthy": true}\n', "") == {"healthy": True}
