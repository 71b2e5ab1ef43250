"""The pytest plugin under pytest-xdist, with fake GPUs and a fake engine: worker gwN bound to
the N-th GPU, one fork server per worker (a real process, so an orphan would show), every
scenario compiled and run exactly once in the session, shards that partition the scenarios
the same way every time, and nothing of ours left running afterwards."""

import json
import os
import stat
import textwrap
import uuid
from collections import Counter

import psutil
import pytest

pytest.importorskip("xdist")
pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # pytest runs in subprocesses: tens of seconds

KERNEL = "class K:\n    PARAMS = {'n': 4}\n"

# run_scenario is replaced in every worker: it logs who called it, from which process, bound
# to which GPU and with which fork server; the fork server is a real process of its own
# session carrying the test's tag, closed by the plugin at the worker's session end.
FAKE_CONFTEST = """
import json
import os
import subprocess
import sys
from pathlib import Path

from cutedebug.engine import runner
from cutedebug.engine import verdict as V

HERE = Path(__file__).parent
_real, _real_fs = runner.run_scenario, runner.start_forkserver


def log(name, **rec):
    with open(HERE / name, "a") as f:
        f.write(json.dumps(rec) + "\\n")


class FakeForkServer:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                     stdin=subprocess.PIPE, start_new_session=True,
                                     env=dict(os.environ, XDIST_TEST_TAG=os.environ["TAG"]))
        log("servers.jsonl", pid=self.proc.pid, worker=os.environ.get("PYTEST_XDIST_WORKER"),
            gpu=os.environ.get("CUDA_VISIBLE_DEVICES"))

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def fake_run_scenario(sc, *, runs_root="runs", mode="run", forkserver=None, **kw):
    log("calls.jsonl", id=sc.id, mode=mode, worker=os.environ.get("PYTEST_XDIST_WORKER"),
        gpu=os.environ.get("CUDA_VISIBLE_DEVICES"), pid=os.getpid(),
        server=forkserver.proc.pid if forkserver else None)
    d = Path(runs_root) / sc.id.replace("/", "__") / mode
    d.mkdir(parents=True, exist_ok=True)
    o = V.Outcome(phase="done")
    compiled = {"secs": 0.1, "arch": sc.archs[0]}
    o.add({"event": "compiled", **compiled})
    return runner.RunResult(scenario=sc, verdict=V.Verdict("UNSUPPORTED" if mode == "compile"
                                                           else "PASS"),
                            reason="recorded outcome", run_dir=d, outcome=o,
                            evidence={"compiled": compiled}, mode=mode)


def pytest_configure(config):
    runner.run_scenario = fake_run_scenario
    runner.start_forkserver = lambda runs_root="runs", **kw: FakeForkServer()


def pytest_unconfigure(config):
    runner.run_scenario, runner.start_forkserver = _real, _real_fs
"""

# nvidia-smi answering the two queries cutedebug makes, for two H200s
FAKE_SMI = """#!/bin/sh
case "$*" in
  *query-gpu=index*) printf '0\\n1\\n' ;;
  *) printf 'NVIDIA H200, 9.0, 580.65.06\\nNVIDIA H200, 9.0, 580.65.06\\n' ;;
esac
"""

N_SCENARIOS = 8


@pytest.fixture
def farm(pytester, tmp_path_factory, monkeypatch):
    """A project of N_SCENARIOS scenarios, two fake GPUs, the fake engine and a fresh tag."""
    for var in (
        "CUDA_VISIBLE_DEVICES",
        "CUTEDEBUG_GPUS",
        "CUTEDEBUG_SHARD",
        "CUTEDEBUG_DURATIONS",
        "CUTEDEBUG_COMPILE_JOBS",
        "PYTEST_XDIST_WORKER",
    ):
        monkeypatch.delenv(var, raising=False)
    bindir = tmp_path_factory.mktemp("fakebin")
    smi = bindir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    tag = uuid.uuid4().hex
    monkeypatch.setenv("TAG", tag)
    pytester.makeconftest(FAKE_CONFTEST)
    pytester.makeini("[pytest]\ncutedebug_scenario_dirs = scenarios\n")
    (pytester.path / "kernels").mkdir()
    (pytester.path / "kernels" / "k.py").write_text(KERNEL)
    fam = pytester.path / "scenarios" / "fam"
    fam.mkdir(parents=True)
    for i in range(N_SCENARIOS):
        (fam / f"s{i}.toml").write_text(
            textwrap.dedent(f"""
            id = "fam/s{i}"
            [kernel]
            file = "../../kernels/k.py"
            entry = "K"
            [expect]
            verdict = "PASS"
            """)
        )
    return tag


def read(pytester, name):
    p = pytester.path / name
    return [json.loads(ln) for ln in p.read_text().splitlines()] if p.exists() else []


def ours_alive(tag):
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("XDIST_TEST_TAG") == tag:
                out.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return out


def test_each_worker_runs_on_its_own_gpu_compiles_once_and_leaves_nothing(pytester, farm):
    res = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "worksteal", "-p", "no:cacheprovider", "--cutedebug-compile-jobs=4"
    )
    res.assert_outcomes(passed=2 * N_SCENARIOS)
    calls = read(pytester, "calls.jsonl")
    # every scenario compiled once and run once in the whole session, not once per worker
    assert Counter((c["id"], c["mode"]) for c in calls) == Counter(
        {(f"fam/s{i}", m): 1 for i in range(N_SCENARIOS) for m in ("compile", "run")}
    )
    # worker gwN is bound to the N-th visible GPU; its fork server was started there too
    assert {c["worker"] for c in calls} == {"gw0", "gw1"}
    assert all(c["gpu"] == c["worker"][2:] for c in calls)
    servers = read(pytester, "servers.jsonl")
    assert sorted((s["worker"], s["gpu"]) for s in servers) == [("gw0", "0"), ("gw1", "1")]
    by_worker = {s["worker"]: s["pid"] for s in servers}
    assert all(c["server"] == by_worker[c["worker"]] for c in calls)  # one server per worker
    assert ours_alive(farm) == []  # 0 orphans


def test_gpus_option_picks_the_gpus_and_names_the_allowed_ones(pytester, farm):
    res = pytester.runpytest_subprocess(
        "-n", "2", "-p", "no:cacheprovider", "--cutedebug-gpus", "1"
    )
    res.assert_outcomes(passed=2 * N_SCENARIOS)
    assert {c["gpu"] for c in read(pytester, "calls.jsonl")} == {"1"}
    res = pytester.runpytest("--cutedebug-gpus", "0,7")
    assert res.ret == 4
    assert (
        "--gpus '0,7': 7 not visible here; allowed: 'all' or a comma list of 0, 1"
        in res.stderr.str() + res.stdout.str()
    )
    assert ours_alive(farm) == []


def test_shards_partition_the_scenarios_the_same_way_with_and_without_xdist(pytester, farm):
    ran = {}
    for shard, extra in (("1/2", ()), ("1/2", ("-n", "2")), ("2/2", ("-n", "2"))):
        (pytester.path / "calls.jsonl").unlink(missing_ok=True)
        res = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "--cutedebug-shard", shard, *extra
        )
        assert res.ret == 0, res.stdout.str()
        ids = sorted({c["id"] for c in read(pytester, "calls.jsonl")})
        assert ids == ran.setdefault(shard, ids)  # the same shard, with or without xdist
    assert set(ran["1/2"]).isdisjoint(ran["2/2"])
    assert sorted(ran["1/2"] + ran["2/2"]) == sorted(f"fam/s{i}" for i in range(N_SCENARIOS))
    res = pytester.runpytest("--cutedebug-shard", "3/2")
    assert res.ret == 4 and "expected I/N with 1 <= I <= N" in res.stderr.str()
    assert ours_alive(farm) == []
