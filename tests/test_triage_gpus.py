"""`cutedebug triage --gpus / --shard` and `cutedebug merge` with a fake engine and fake GPUs:
one lane per GPU with its own (fake) fork server, work stealing, a GPU retired after a
failed health check, health per GPU, shards that merge into the one-triage matrix."""

import json
import threading
import time
from pathlib import Path

import pytest
from test_triage import H200, scenarios_dir

from cutedebug.commands import cli, shard
from cutedebug.commands import triage as T
from cutedebug.engine import runner
from cutedebug.engine import verdict as V

SPECS = {f"s{i}": ("PASS", None) for i in range(8)} | {"hang": ("HANG", "bad")}


class Server:
    def __init__(self, gpu):
        self.gpu, self.closed = gpu, False
        self.bind_env = {"CUDA_VISIBLE_DEVICES": gpu} if gpu else {}

    def close(self, timeout=10.0):
        self.closed = True


class GpuEngine:
    """run_scenario stand-in that records the fork server (hence the GPU) of every call;
    ``sick``: the scenario id whose run leaves its GPU unhealthy after a kill."""

    def __init__(self, sick=None, delay=0.05):
        self.calls, self.lock, self.sick, self.delay = [], threading.Lock(), sick, delay
        self.seq: list[tuple[str, str, str | None]] = []  # ("start" | "end", id, gpu)
        self.sick_on: dict[str | None, threading.Event] = {}  # the hang's GPU: set once it ended
        self.servers: list[Server] = []
        self.health_calls: list[dict] = []

    def start(self, root, gpu=None):
        s = Server(gpu)
        self.servers.append(s)
        return s

    def health_check(self, **kw):
        self.health_calls.append(kw)
        return {"healthy": True, "gpu": kw["forkserver"].gpu}

    def __call__(self, sc, *, runs_root="runs", mode="run", forkserver=None, **kw):
        gpu = forkserver.gpu if forkserver else None
        with self.lock:
            self.calls.append((sc.id, mode, gpu))
            self.seq.append(("start", sc.id, gpu))
            if mode == "run" and sc.id == self.sick:
                self.sick_on[gpu] = threading.Event()
        if mode == "run":
            time.sleep(self.delay * (3 if sc.id == self.sick else 1))
            hang = self.sick_on.get(gpu)
            if sc.id != self.sick and hang is not None:
                hang.wait()  # in flight beside the hang on its GPU until after the kill
                time.sleep(self.delay / 2)
        with self.lock:
            self.seq.append(("end", sc.id, gpu))
            if sc.id == self.sick and mode == "run":
                self.sick_on[gpu].set()
        d = Path(runs_root) / sc.id.replace("/", "__") / mode
        d.mkdir(parents=True, exist_ok=True)
        o = V.Outcome(phase="done")
        o.add({"event": "compiled", "secs": 0.1})
        verdict = "UNSUPPORTED" if mode == "compile" else sc.expect.verdict
        health = None
        if mode == "run" and self.sick == sc.id:
            health = {"healthy": False, "error": "GPU stuck after the kill"}
        return runner.RunResult(
            scenario=sc,
            verdict=V.Verdict(verdict),
            reason="fake",
            run_dir=d,
            outcome=o,
            evidence={"compiled": {"secs": 0.1}},
            timings={"compile_s": 0.1},
            health=health,
            mode=mode,
        )


@pytest.fixture
def gpu_engine(monkeypatch):
    def install(**kw):
        fake = GpuEngine(**kw)
        monkeypatch.setattr(runner, "run_scenario", fake)
        monkeypatch.setattr(runner, "start_forkserver", fake.start)
        monkeypatch.setattr(runner, "health_check", fake.health_check)
        monkeypatch.setattr(T, "detect_gpu", lambda: H200)
        return fake

    return install


def triage(tmp_path, out="out", **kw):
    lines = []
    opts = T.Options(
        dir=tmp_path / "scen", out=tmp_path / out, command="cutedebug triage", jobs=2, **kw
    )
    return T.triage(opts, out=lines.append), lines, tmp_path / out


def test_runs_spread_over_the_gpus_each_with_its_own_server_and_health_check(tmp_path, gpu_engine):
    scenarios_dir(tmp_path, SPECS)
    fake = gpu_engine()
    rc, lines, out = triage(tmp_path, gpus=["0", "1"])
    runs = [(i, g) for i, m, g in fake.calls if m == "run"]
    assert sorted(i for i, _ in runs) == sorted(f"k/{n}" for n in SPECS)  # each run once
    assert {g for _, g in runs} == {"0", "1"}  # both GPUs worked
    assert sorted(s.gpu for s in fake.servers) == ["0", "1"] and all(s.closed for s in fake.servers)
    recs = T.load_records(out / "results")
    assert {r.run.gpu for r in recs.values()} == {"0", "1"}
    m = json.loads((out / "matrix.json").read_text())
    facts = m["facts"]
    assert facts["gpus"]["0"]["jobs"] + facts["gpus"]["1"]["jobs"] == len(SPECS)
    assert facts["gpu_health"]["healthy"] is True
    assert sorted(facts["gpu_health"]["per_gpu"]) == ["0", "1"]
    assert sorted(c["run_dir"].name for c in fake.health_calls) == ["gpu-0", "gpu-1"]
    assert rc == 0 and "GPU health: healthy" in lines


def test_a_gpu_left_unhealthy_by_a_hang_takes_no_more_runs(tmp_path, gpu_engine):
    scenarios_dir(tmp_path, SPECS)
    fake = gpu_engine(sick="k/hang", delay=0.1)
    rc, lines, out = triage(tmp_path, gpus=["0", "1"], overlap=False)
    runs = [(i, g) for i, m, g in fake.calls if m == "run"]
    assert sorted(i for i, _ in runs) == sorted(f"k/{n}" for n in SPECS)  # all still ran
    k = [i for i, _ in runs].index("k/hang")
    sick, healthy = runs[k][1], ({"0", "1"} - {runs[k][1]}).pop()
    assert all(g == healthy for _, g in runs[k + 1 :])  # nothing ran on the sick GPU after
    facts = json.loads((out / "matrix.json").read_text())["facts"]
    assert facts["gpus"][sick]["retired"] == "unhealthy after a kill: GPU stuck after the kill"
    assert rc == 3  # an unhealthy GPU is the harness's problem to report


def test_overlapping_runs_in_flight_on_a_gpu_that_went_bad_run_again_on_another(
    tmp_path, gpu_engine
):
    """Two runs per GPU at once: those in flight on the GPU a hang left unhealthy may have
    launched on it after the kill, so they run again on the other GPU; nothing starts on the
    bad GPU after its hang ended; every record's run is one from a healthy GPU."""
    scenarios_dir(tmp_path, SPECS)
    fake = gpu_engine(sick="k/hang", delay=0.1)
    rc, lines, out = triage(tmp_path, gpus=["0", "1"])
    sick = next(g for ev, i, g in fake.seq if ev == "start" and i == "k/hang")
    healthy = ({"0", "1"} - {sick}).pop()
    hang_end = fake.seq.index(("end", "k/hang", sick))
    assert not [x for x in fake.seq[hang_end:] if x[0] == "start" and x[2] == sick]
    runs = [i for i, m, _ in fake.calls if m == "run"]
    again = sorted({i for i in runs if runs.count(i) > 1})
    assert sorted(set(runs)) == sorted(f"k/{n}" for n in SPECS) and again  # one was in flight
    recs = T.load_records(out / "results")
    assert all(recs[i].run.gpu == healthy for i in again)
    facts = json.loads((out / "matrix.json").read_text())["facts"]
    assert facts["gpus"][sick]["rerun_elsewhere"] == len(runs) - len(set(runs))
    assert facts["gpus"][sick]["retired"].startswith("unhealthy after a kill")
    assert rc == 3


def test_shards_of_a_triage_merge_into_the_matrix_of_one_triage(tmp_path, gpu_engine, capsys):
    scenarios_dir(tmp_path, SPECS)
    gpu_engine()
    triage(tmp_path, out="whole")
    for i in (1, 2, 3):
        triage(tmp_path, out=f"part{i}", shard=(i, 3))
    parts = [set(T.load_records(tmp_path / f"part{i}" / "results")) for i in (1, 2, 3)]
    assert sum(map(len, parts)) == len(SPECS) and set().union(*parts) == {f"k/{n}" for n in SPECS}
    rc = cli.main(
        ["merge", str(tmp_path / "merged")] + [str(tmp_path / f"part{i}") for i in (1, 2, 3)]
    )
    assert rc == 0 and "merged 3 shard(s), 9 scenario(s)" in capsys.readouterr().out
    whole = json.loads((tmp_path / "whole" / "matrix.json").read_text())
    merged = json.loads((tmp_path / "merged" / "matrix.json").read_text())
    assert merged["rates"] == whole["rates"]
    assert [r["verdict"] for r in merged["scenarios"]] == [r["verdict"] for r in whole["scenarios"]]


def test_bad_gpus_and_shard_values_are_usage_errors(tmp_path, gpu_engine, capsys, monkeypatch):
    scenarios_dir(tmp_path, SPECS)
    gpu_engine()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    base = ["triage", str(tmp_path / "scen"), "--out", str(tmp_path / "o")]
    assert cli.main(base + ["--gpus", "2"]) == 2
    assert "2 not visible here; allowed: 'all' or a comma list of 0, 1" in capsys.readouterr().err
    assert cli.main(base + ["--shard", "4/3"]) == 2
    assert "expected I/N with 1 <= I <= N" in capsys.readouterr().err
    assert cli.main(base + ["--durations", str(tmp_path)]) == 2
    assert "--durations needs --shard" in capsys.readouterr().err
    assert shard.parse_shard("3/3") == (3, 3)
