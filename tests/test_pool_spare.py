"""The warm pool's spare worker (engine/pool_spare.py): forked ahead with its CUDA context
ready, it takes the next run; none after a run that did not end well until one does; never a
compile-only run; gone with its server. Forced on here (no GPU: the spare skips CUDA), what
is checked is the mechanism: who ran each run, and which processes are left."""

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from cutedebug.engine import lifeline, pool, pool_spare, runner
from cutedebug.engine import scenario as S
from cutedebug.engine.verdict import Verdict

ROOT = Path(__file__).resolve().parent.parent
CLEAN = ROOT / "scenarios" / "minimal" / "clean.toml"


@pytest.fixture
def spare_pool(monkeypatch):
    d = tempfile.mkdtemp(prefix="cdspare-", dir="/tmp")
    monkeypatch.setenv(pool.DIR_VAR, d)
    monkeypatch.setenv(pool.IDLE_VAR, "300")
    monkeypatch.setenv(pool_spare.SPARE_VAR, "1")
    c = pool.client(start=True)
    assert c is not None
    yield c
    c.close()
    assert stop_all(d) == []


def stop_all(d: str) -> list:
    """Stop every pool server (the test's folder): the processes of ours left; the folder
    removed."""
    left = []
    for r in pool.servers():
        left += pool.stop(r["key"])["left"]
    shutil.rmtree(d, ignore_errors=True)
    return left


def children(server: int) -> list[int]:
    """The server's live children; one that ends between the listing and its status is gone
    (the killed spare being reaped: CI on 2026-12-02 s7 read NoSuchProcess here)."""
    out = []
    for p in psutil.Process(server).children():
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_spare(server: int, present: bool, timeout: float = 10.0) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        kids = children(server)
        if bool(kids) == present:
            return kids
        time.sleep(0.05)
    raise AssertionError(f"spare present={present} not seen: children {children(server)}")


def wait_ready(timeout: float = 10.0) -> None:
    """Until the pool's one server says its spare is ready (pool status)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if [r["spare"] for r in pool.servers()] == ["ready"]:
            return
        time.sleep(0.05)
    raise AssertionError(f"spare not ready: {[r['spare'] for r in pool.servers()]}")


@pytest.mark.slow
def test_the_spare_takes_runs_and_none_follows_a_run_that_did_not_end_well(spare_pool, tmp_path):
    c = spare_pool
    server = c.info["pid"]
    (spare,) = wait_spare(server, True)  # forked at the server's start
    sc = S.load(CLEAN)
    first = runner.run_scenario(sc, runs_root=tmp_path, forkserver=c)
    assert first.evidence["pool"]["spare"] is True
    assert first.outcome.event("started").pid == spare  # the process forked ahead ran it
    assert first.verdict is Verdict.UNSUPPORTED  # no GPU here: compiled, not run
    (spare2,) = wait_spare(server, True)  # the run ended well: another one
    assert spare2 != spare
    # a compile-only run never touches the GPU: a plain fork; the spare stays
    only = runner.run_scenario(sc, runs_root=tmp_path, mode="compile", forkserver=c)
    assert only.evidence["pool"]["spare"] is False
    assert wait_spare(server, True) == [spare2]
    second = runner.run_scenario(sc, runs_root=tmp_path, forkserver=c)
    assert second.evidence["pool"]["spare"] is True
    assert second.outcome.event("started").pid == spare2
    assert second.evidence["compiled"]["compile_cache"]["reused"] is True
    # a run killed at its deadline (taken by the spare): no spare after it
    hang = S.adhoc(
        str(ROOT / "tests" / "helpers" / "hang_with_child.py") + ":Hang", {}, None, {}, "PASS"
    ).with_overrides(limits=S.Limits(import_s=3.0))
    wait_spare(server, True)
    killed = runner.run_scenario(hang, runs_root=tmp_path, forkserver=c)
    assert killed.verdict is Verdict.HARNESS_ERROR and "deadline" in killed.reason
    assert killed.evidence["pool"]["spare"] is True
    time.sleep(0.5)  # several turns of the server's loop
    assert children(server) == []
    after = runner.run_scenario(sc, runs_root=tmp_path, forkserver=c)
    assert after.evidence["pool"]["spare"] is False  # a fresh fork, not a spare
    wait_spare(server, True)  # that one ended well: a spare again
    # stopping the server takes its spare along
    meta = pool.read_meta(pool.Paths.of(pool.pool_dir(), pool.key_of(pool.fingerprint())).meta)
    c.close()
    assert pool.stop(meta["key"])["left"] == []
    assert not psutil.pid_exists(server) or psutil.Process(server).status() == "zombie"
    assert [p.pid for p in lifeline.processes(meta["tag"])] == []


@pytest.mark.slow
def test_a_spare_that_ends_while_waiting_is_replaced_only_after_a_run(spare_pool, tmp_path):
    c = spare_pool
    server = c.info["pid"]
    (spare,) = wait_spare(server, True)
    # killed once it is ready and waiting: one killed before it said so is a spare that could
    # not start, after which its server forks none (spare_failed; under load the kill could
    # land first, and the spare after the run below never came)
    wait_ready()
    os.kill(spare, signal.SIGTERM)  # the default action: not the server's stop handler
    wait_spare(server, False)
    time.sleep(0.3)  # several turns of the server's loop: no spare forked meanwhile
    assert children(server) == []
    res = runner.run_scenario(S.load(CLEAN), runs_root=tmp_path, forkserver=c)
    assert res.evidence["pool"]["spare"] is False and res.verdict is Verdict.UNSUPPORTED
    wait_spare(server, True)


def test_only_a_run_without_its_own_environment_goes_to_a_spare(tmp_path):
    def spawn(job="worker", **request):
        path = tmp_path / f"r{len(list(tmp_path.iterdir()))}.json"
        path.write_text(json.dumps(request))
        return {"op": "spawn", "request": str(path), "job": job}

    assert pool_spare.takes(spawn(mode="run"))
    assert not pool_spare.takes(spawn(mode="compile"))
    assert not pool_spare.takes(spawn(mode="run", env={"CUDA_ENABLE_COREDUMP_ON_EXCEPTION": "1"}))
    assert not pool_spare.takes(spawn(job="health", mode="run"))
    assert not pool_spare.takes({"op": "spawn", "request": str(tmp_path / "missing.json")})


def test_the_spare_is_wanted_where_a_gpu_is_unless_told(monkeypatch):
    from cutedebug import devices

    monkeypatch.setenv(pool_spare.SPARE_VAR, "0")
    assert not pool_spare.wanted()
    monkeypatch.setenv(pool_spare.SPARE_VAR, "1")
    assert pool_spare.wanted()
    monkeypatch.delenv(pool_spare.SPARE_VAR)
    monkeypatch.setattr(devices, "gpu_device_node", lambda: "/dev/nvidia0")
    assert pool_spare.wanted()
    monkeypatch.setattr(devices, "gpu_device_node", lambda: None)
    assert not pool_spare.wanted()
    assert os.environ.get(pool_spare.SPARE_VAR) is None


def test_a_spare_follows_only_a_worker_that_ended_well(tmp_path):
    def request(*events):
        ev = tmp_path / f"e{len(list(tmp_path.iterdir()))}.jsonl"
        ev.write_text("".join(json.dumps(e) + "\n" for e in events))
        req = tmp_path / f"r{len(list(tmp_path.iterdir()))}.json"
        req.write_text(json.dumps({"events": str(ev)}))
        return str(req)

    ok = request({"event": "started"}, {"event": "done"})
    assert pool_spare.ended_well(0, ok)
    assert not pool_spare.ended_well(-9, ok)  # killed (a deadline)
    assert not pool_spare.ended_well(1, ok)
    crashed = request({"event": "cuda_error", "name": "cudaErrorIllegalAddress"})
    assert not pool_spare.ended_well(0, crashed)  # a faulted kernel: the worker exits 0
    sick = request({"event": "gpu_check", "healthy": False})
    assert not pool_spare.ended_well(0, sick)
    healthy = request({"event": "gpu_check", "healthy": True}, {"event": "done"})
    assert pool_spare.ended_well(0, healthy)
    assert pool_spare.ended_well(0, str(tmp_path / "health-job-without-events.json"))


HANG = ROOT / "scenarios" / "tma_stream" / "wrong_expect_tx_plus.toml"


@pytest.mark.gpu
@pytest.mark.slow
def test_on_the_gpu_a_spare_with_a_reused_compile_still_localizes_the_hang(tmp_path, monkeypatch):
    """The README's probed HANG twice through a pool on the GPU: both runs in a spare (context
    made ahead), the second with the compile reused (its probe buffer at the pool's fixed
    address, the same traced IR), both HANG where expected, the same PTX."""
    d = tempfile.mkdtemp(prefix="cdspare-gpu-", dir="/tmp")
    monkeypatch.setenv(pool.DIR_VAR, d)
    monkeypatch.setenv(pool.IDLE_VAR, "300")
    monkeypatch.delenv(pool_spare.SPARE_VAR, raising=False)  # on: a GPU device node is here
    c = pool.client(start=True)
    assert c is not None
    try:
        server = c.info["pid"]
        runs = []
        for _ in range(2):
            wait_spare(server, True, timeout=60)
            runs.append(runner.run_scenario(S.load(HANG), runs_root=tmp_path, forkserver=c))
    finally:
        c.close()
        left = stop_all(d)
    assert left == []
    for res in runs:
        assert res.verdict is Verdict.HANG, res.reason
        assert res.localization["ok"] is True, res.localization
        assert res.evidence["pool"]["spare"] is True
    cache = [r.evidence["compiled"]["compile_cache"] for r in runs]
    assert cache[0]["reused"] is False and cache[1]["reused"] is True, cache
    assert cache[1].get("probe_buffer") == "fixed", cache
    ptx = [(r.run_dir / "kernel.ptx").read_text() for r in runs]
    assert ptx[0] == ptx[1]
    print({"timings": [r.timings for r in runs], "compile_cache": cache})
