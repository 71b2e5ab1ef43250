"""engine/lanes.py: one job queue over several (fake) GPUs, one fork server per GPU, a GPU
retired after a failed health check."""

import threading
import time
from types import SimpleNamespace

import pytest

from cutedebug.engine import lanes as L


class FakeServer:
    def __init__(self, root, gpu):
        self.root, self.gpu, self.closed = root, gpu, False

    def close(self, timeout=10.0):
        self.closed = True


def start(root, gpu=None):
    return FakeServer(root, gpu)


def test_every_gpu_gets_its_own_server_and_jobs_spread_over_the_free_gpus(tmp_path):
    seen, lock = [], threading.Lock()

    def job(i, *, lane):
        time.sleep(0.05)
        with lock:
            seen.append((i, lane.gpu, lane.forkserver.gpu, threading.get_ident()))
        return i

    with L.Lanes(["2", "5"], tmp_path, start=start) as lanes:
        assert [(x.gpu, x.forkserver.root.name) for x in lanes.lanes] == [
            ("2", "gpu-2"),
            ("5", "gpu-5"),
        ]
        futs = [lanes.submit(job, i) for i in range(8)]
        assert sorted(f.result() for f in futs) == list(range(8))
        servers = [x.forkserver for x in lanes.lanes]
        summary = lanes.summary()
    assert all(s.closed for s in servers)
    assert all(gpu == server_gpu for _, gpu, server_gpu, _ in seen)  # the lane's own server
    assert {gpu for _, gpu, _, _ in seen} == {"2", "5"}
    assert summary["2"]["jobs"] + summary["5"]["jobs"] == 8 and summary["2"]["jobs"] >= 2


def test_a_gpu_unhealthy_after_a_kill_takes_no_more_jobs(tmp_path):
    order = []

    def job(i, *, lane):
        order.append((i, lane.gpu))
        healthy = not (lane.gpu == "0" and i == 0)  # the first job hangs GPU 0
        return SimpleNamespace(health={"healthy": healthy, "error": "ECC"}), 1.0

    with L.Lanes(["0", "1"], tmp_path, start=start) as lanes:
        lanes.submit(job, 0).result()  # runs on GPU 0, which goes bad
        rest = [lanes.submit(job, i) for i in range(1, 6)]
        for f in rest:
            f.result()
        assert lanes.summary()["0"]["retired"].startswith("unhealthy after a kill: ECC")
    assert [gpu for i, gpu in order if i > 0] == ["1"] * 5


def test_when_every_gpu_is_retired_the_rest_is_not_run(tmp_path):
    def bad(*, lane):
        return SimpleNamespace(health={"healthy": False, "error": "hung"})

    with L.Lanes(["0", "1"], tmp_path, start=start) as lanes:
        lanes.submit(bad).result()
        lanes.submit(bad).result()
        with pytest.raises(L.NoHealthyGpu, match="GPU 0: unhealthy after a kill: hung; GPU 1"):
            lanes.submit(bad).result()
    # one GPU alone keeps going (the one-GPU behaviour) and reports it at the end
    with L.Lanes(["0"], tmp_path, start=start) as lanes:
        lanes.submit(bad).result()
        lanes.submit(bad).result()
        assert lanes.summary()["0"] == {"jobs": 2, "busy_s": lanes.summary()["0"]["busy_s"]}


def test_a_gpu_whose_server_did_not_start_still_binds_its_fresh_processes(tmp_path):
    from cutedebug.engine import runner

    with L.Lanes(["1", "2"], tmp_path, start=lambda root, gpu=None: None) as lanes:
        servers = [lane.forkserver for lane in lanes.lanes]
        assert [s.bind_env for s in servers] == [
            {"CUDA_VISIBLE_DEVICES": "1"},
            {"CUDA_VISIBLE_DEVICES": "2"},
        ]
        assert runner.bound_env(servers[1]) == {"CUDA_VISIBLE_DEVICES": "2"}
        assert runner.bound_env(None) == {}


def test_one_lane_without_binding_uses_the_runs_root_itself(tmp_path):
    with L.Lanes([None], tmp_path, start=start) as lanes:
        assert lanes.lanes[0].forkserver.root == tmp_path and lanes.lanes[0].env() == {}
    assert L.bound_env("3", {"A": "1"}) == {"A": "1", "CUDA_VISIBLE_DEVICES": "3"}


def test_slots_run_several_jobs_per_gpu_each_gpu_with_its_own_token(tmp_path):
    """slots=2: two jobs at once per GPU (least busy GPU first), each lane's token a file of
    its own; a token left by a killed earlier run is removed at the start, and at the end."""
    (tmp_path / ".gpu-0.token").write_text("a killed triage's run tag")
    active: dict[str, int] = {"0": 0, "1": 0}
    peak: dict[str, int] = {"0": 0, "1": 0}
    lock, tokens = threading.Lock(), set()

    def job(i, *, lane):
        with lock:
            active[lane.gpu] += 1
            peak[lane.gpu] = max(peak[lane.gpu], active[lane.gpu])
            tokens.add((lane.gpu, lane.token))
        time.sleep(0.1)
        with lock:
            active[lane.gpu] -= 1
        return i

    with L.Lanes(["0", "1"], tmp_path, start=start, slots=2) as lanes:
        assert not (tmp_path / ".gpu-0.token").exists()
        assert [f.result() for f in [lanes.submit(job, i) for i in range(8)]] == list(range(8))
    assert peak == {"0": 2, "1": 2}
    assert tokens == {("0", str(tmp_path / ".gpu-0.token")), ("1", str(tmp_path / ".gpu-1.token"))}
    with L.Lanes(["0"], tmp_path, start=start) as lanes:  # one job per GPU: no token
        assert lanes.lanes[0].token is None


def test_a_job_that_fails_on_a_gpu_retired_meanwhile_runs_again_elsewhere(tmp_path):
    """slots=2: job B compiles on GPU 0 while job A's kill leaves GPU 0 unhealthy; B then
    fails there (a CUDA error while making its inputs reads as the kernel file's fault). B is
    run again on GPU 1 instead of its failure being reported."""
    started = {name: threading.Event() for name in ("A", "F", "B")}
    b_elsewhere = threading.Event()
    where: list[tuple[str, str]] = []

    def job(name, *, lane):
        where.append((name, lane.gpu))
        started[name].set()
        if name == "A":  # its kernel hung and was killed: GPU 0 unhealthy
            assert started["B"].wait(10)
            return SimpleNamespace(health={"healthy": False, "error": "Xid 79"}), 1.0
        if name == "F":  # keeps GPU 1 half busy, so B's first try goes to GPU 0
            assert b_elsewhere.wait(10)
            return "F", 1.0
        if lane.gpu == "0":
            deadline = time.monotonic() + 10
            while not lane.retired and time.monotonic() < deadline:
                time.sleep(0.01)
            raise RuntimeError("CUDA error: unspecified launch failure")
        b_elsewhere.set()
        return "B", 1.0

    with L.Lanes(["0", "1"], tmp_path, start=start, slots=2) as lanes:
        futs = {}
        for name in ("A", "F", "B"):  # one at a time: A on GPU 0, F on GPU 1, B on GPU 0
            futs[name] = lanes.submit(job, name)
            assert started[name].wait(10)
        assert futs["B"].result(timeout=20) == ("B", 1.0)
        assert futs["F"].result(timeout=20) == ("F", 1.0)
        futs["A"].result(timeout=20)
        summary = lanes.summary()
    assert where == [("A", "0"), ("F", "1"), ("B", "0"), ("B", "1")]
    assert summary["0"]["retired"].startswith("unhealthy after a kill: Xid 79")
    assert summary["0"]["rerun_elsewhere"] == 1


def test_the_lanes_servers_import_their_libraries_side_by_side(tmp_path):
    """Each lane's server imports the matrix's libraries (FA-4 and quack: ~9 s on the H200):
    asked one after another, N GPUs would wait N imports. The servers start in the calling
    thread (PR_SET_PDEATHSIG follows the thread that started a process), the asks go out
    from the lanes' threads at once."""
    inside, most, lock = [0], [0], threading.Lock()
    all_in = threading.Barrier(3, timeout=10)  # three asks: all three in at once, or none
    started_in = []

    class Preloading(FakeServer):
        def preload_modules(self, modules):
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            all_in.wait()
            with lock:
                inside[0] -= 1
            return {"preloaded": list(modules), "preload": "on", "gpu": self.gpu}

    def start_here(root, gpu=None):
        started_in.append(threading.current_thread().name)
        return Preloading(root, gpu)

    with L.Lanes(["0", "1", "2"], tmp_path, start=start_here, preload=["quack"]) as lanes:
        said = [x.forkserver.preloaded for x in lanes.lanes]
    assert most[0] == 3
    assert said == [{"preloaded": ["quack"], "preload": "on", "gpu": g} for g in "012"]
    assert started_in == [threading.current_thread().name] * 3
