"""`cutedebug triage` overlapping compiles with launches, with real processes: the engine, the
lanes, the GPU token (instrument/launch_gpu.py) and the watchdog are the real ones; each worker
is tests/helpers/token_worker.py (the real event channel and the real worker's token step, a
sleep for the compile and the kernel) on a fake GPU. Its log says who compiled and who held
the GPU when, on one clock (time.time()).
"""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import overlap_triage

from cutedebug.commands import triage as T
from cutedebug.engine import lifeline

ROOT = Path(__file__).resolve().parents[1]
KERNEL = 'class K:\n    PARAMS = {"compile_s": 0.5, "kernel_s": 0.2, "behaviour": "pass"}\n'


def scenarios(root: Path, specs: dict[str, dict]) -> Path:
    """One scenario per name: its params, [limits] and expected verdict."""
    d = root / "scen"
    (d / "k").mkdir(parents=True)
    (root / "k.py").write_text(KERNEL)
    for name, spec in specs.items():
        params = "".join(
            f"{k} = {json.dumps(v)}\n" for k, v in spec.items() if k not in ("expect", "limits")
        )
        limits = "".join(f"{k} = {v}\n" for k, v in spec.get("limits", {}).items())
        (d / "k" / f"{name}.toml").write_text(
            f'id = "k/{name}"\n[kernel]\nfile = "../../k.py"\nentry = "K"\n'
            f"[params]\n{params}"
            + (f"[limits]\n{limits}" if limits else "")
            + ("[probes]\nenabled = true\n" if spec.get("behaviour") == "hang" else "")
            + f'[expect]\nverdict = "{spec.get("expect", "PASS")}"\n'
        )
    return d


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def holds(log: list[dict]) -> list[tuple[float, float, str]]:
    """(took the token, the worker's last step, id) per launch: when it held the GPU."""
    ends = {e["pid"]: e["t"] for e in log if e["what"] in ("exit", "killed")}
    return sorted(
        (e["t"], ends.get(e["pid"], float("inf")), e["id"])
        for e in log
        if e["what"] == "gpu_acquired"
    )


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """The engine on the stand-in worker; returns the log path and the health checks seen."""
    log = tmp_path / "steps.jsonl"
    monkeypatch.setenv("OVERLAP_LOG", str(log))
    checks: list[dict] = []

    def health_check(**kw):
        token = tmp_path / "out" / ".gpu-default.token"
        checks.append(
            {"start": time.time(), "token": token.read_text() if token.exists() else None}
        )
        time.sleep(0.6)  # a slow check: nobody may launch meanwhile
        checks[-1]["end"] = time.time()
        return {"healthy": True, "secs": 0.6}

    overlap_triage.install(monkeypatch.setattr, health_check)
    return log, checks


def triage(tmp_path, **kw):
    lines: list[str] = []
    opts = T.Options(dir=tmp_path / "scen", out=tmp_path / "out", command="cutedebug triage", **kw)
    return T.triage(opts, out=lines.append), lines, tmp_path / "out"


def test_workers_compile_at_once_while_one_at_a_time_holds_the_gpu(tmp_path, fake_gpu):
    """(a) at most one worker holds the GPU (from its token to its end) while the others
    compile; (d) each scenario is compiled once, by its run, and a compile error never
    launches; the records keep the wait apart from the run's own time."""
    log_path, _ = fake_gpu
    # p0 and p1 compile alike (one waits for the other's launch: its 0.6 s kernel outlasts the
    # two compiles' jitter on a loaded machine; with 0.3 s the wait was 0.164 s at load ~1.7);
    # p2 and p3 still compile then
    compile_s = (0.5, 0.5, 1.2, 1.6)
    kernel_s = (0.6, 0.6, 0.3, 0.3)
    specs = {
        f"p{i}": {"compile_s": c, "kernel_s": k}
        for i, (c, k) in enumerate(zip(compile_s, kernel_s))
    }
    specs["cerr"] = {"behaviour": "compile_error", "expect": "COMPILE_ERROR"}
    scenarios(tmp_path, specs)
    rc, lines, out = triage(tmp_path, jobs=4)
    log = read_log(log_path)
    assert rc == 0, lines
    compiles = [(e["id"], e["t"]) for e in log if e["what"] == "compile_start"]
    assert sorted(i for i, _ in compiles) == sorted(f"k/{n}" for n in specs)  # once each
    spans = holds(log)
    assert sorted(i for _, _, i in spans) == [f"k/p{i}" for i in range(4)]  # cerr: no launch
    for (_, end, _), (start, _, _) in zip(spans, spans[1:]):
        assert end <= start  # the next took the GPU after the last one ended
    # the compiles overlapped one another, and a launch ran while others compiled
    done = {e["id"]: e["t"] for e in log if e["what"] == "compile_end"}
    spans_c = [(t, done[i], i) for i, t in compiles]
    at_once = max(sum(a <= t < b for a, b, _ in spans_c) for t, _, _ in spans_c)
    assert at_once >= 2
    assert any(a < h1 and h0 < b and i != j for a, b, i in spans_c for h0, h1, j in spans)
    recs = T.load_records(out / "results")
    assert all(r.compile is None and r.run.mode == "run" for r in recs.values())
    assert recs["k/cerr"].verdict.value == "COMPILE_ERROR" and recs["k/cerr"].verdict_ok
    waits = [r.run.gpu_wait_s for r in recs.values() if r.id != "k/cerr"]
    assert all(w >= 0 for w in waits) and max(waits) > 0.2  # someone waited for the GPU
    for r in recs.values():
        assert r.time_to_verdict_s == pytest.approx(r.run.wall_s - r.run.gpu_wait_s, abs=0.002)
    assert not (out / ".gpu-default.token").exists()


@pytest.mark.slow  # a fake kernel that holds the GPU for 6 s
def test_a_long_wait_for_the_gpu_is_not_a_hang(tmp_path, fake_gpu):
    """(b) a worker waits for the GPU far longer than its own phase limit (import_s = 3 s
    covers the time between its compile and its launch; it also bounds the spawn, so 1 s
    failed on a loaded machine) and is not killed: the clocks stop while it waits; its record
    reports the wait apart."""
    log_path, _ = fake_gpu
    scenarios(
        tmp_path,
        {
            "a_long": {"compile_s": 0.1, "kernel_s": 6.0},
            "b_short": {"compile_s": 1.0, "kernel_s": 0.1, "limits": {"import_s": 3.0}},
        },
    )
    rc, lines, out = triage(tmp_path, jobs=2)
    recs = T.load_records(out / "results")
    assert rc == 0 and recs["k/b_short"].verdict.value == "PASS", recs["k/b_short"].run.reason
    assert recs["k/b_short"].run.gpu_wait_s > 3.5  # > import_s: the clock did not run
    report = json.loads(next((out / "runs").glob("k__b_short-*/report.json")).read_text())
    assert report["timings"]["gpu_wait_s"] == recs["k/b_short"].run.gpu_wait_s


def test_a_killed_hang_gives_the_gpu_back_only_after_its_health_check(tmp_path, fake_gpu):
    """(c) the watchdog kills a hung worker at its deadline; the GPU health check runs while
    the hung worker's token is still held, and the next worker launches only after it."""
    log_path, checks = fake_gpu
    scenarios(
        tmp_path,
        {
            "a_hang": {
                "behaviour": "hang",
                "compile_s": 0.1,
                "limits": {"deadline_s": 1.0},
                "expect": "HANG",
            },
            "b_next": {"compile_s": 1.0, "kernel_s": 0.1},
        },
    )
    rc, lines, out = triage(tmp_path, jobs=2)
    log = read_log(log_path)
    recs = T.load_records(out / "results")
    assert recs["k/a_hang"].verdict.value == "HANG" and recs["k/b_next"].verdict.value == "PASS"
    hang = next(e for e in log if e["id"] == "k/a_hang" and e["what"] == "gpu_acquired")
    nxt = next(e for e in log if e["id"] == "k/b_next" and e["what"] == "gpu_acquired")
    # one check after the kill (then the final one); during it the hang's tag held the token
    after_kill = checks[0]
    assert after_kill["token"] == hang["tag"]
    assert nxt["t"] >= after_kill["end"]
    assert rc == 0, lines


def test_sigkill_of_an_overlapping_triage_leaves_nothing(tmp_path):
    """(e) SIGKILL of the triage while one worker holds the GPU (hung) and others compile or
    wait for it: every process it started is gone within a few seconds."""
    specs = {
        "a_hang": {
            "behaviour": "hang",
            "compile_s": 0.1,
            "limits": {"deadline_s": 600},
            "expect": "HANG",
        }
    }
    specs |= {f"w{i}": {"compile_s": 30.0 if i % 2 else 0.5, "kernel_s": 0.1} for i in range(5)}
    scen = scenarios(tmp_path, specs)
    log_path, tag = tmp_path / "steps.jsonl", uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
    env[lifeline.SESSION_VAR], env["OVERLAP_LOG"] = tag, str(log_path)
    proc = subprocess.Popen(
        [sys.executable, str(Path(overlap_triage.__file__)), str(scen), str(tmp_path / "out"), "6"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    end = time.monotonic() + 60
    while True:  # the hang holds the GPU; two wait for it, two still compile
        log = read_log(log_path)
        ended = {e["pid"] for e in log if e["what"] == "exit"}
        waiting = {e["pid"] for e in log if e["what"] == "compile_end"} - ended
        compiling = {e["pid"] for e in log if e["what"] == "compile_start"} - waiting - ended
        held = any(e["what"] == "gpu_acquired" and e["id"] == "k/a_hang" for e in log)
        if held and len(waiting) >= 3 and len(compiling) >= 2:  # the hang + 2 waiting
            break
        assert proc.poll() is None and time.monotonic() < end, proc.stdout.read().decode()
        time.sleep(0.05)
    assert waiting | compiling <= {p.pid for p in lifeline.processes(tag)}
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    end = time.monotonic() + 5.0
    while lifeline.processes(tag) and time.monotonic() < end:
        time.sleep(0.05)
    assert [p.pid for p in lifeline.processes(tag)] == []


def test_no_overlap_keeps_the_serial_order(tmp_path, fake_gpu):
    """--no-overlap: a compile-only child per scenario first (it never takes the GPU), then
    the runs one at a time without a token."""
    log_path, _ = fake_gpu
    scenarios(tmp_path, {f"p{i}": {"compile_s": 0.2, "kernel_s": 0.1} for i in range(3)})
    rc, lines, out = triage(tmp_path, jobs=3, overlap=False)
    log = read_log(log_path)
    assert rc == 0, lines
    assert sum(e["what"] == "compile_start" for e in log) == 6  # compile-only + run, each
    recs = T.load_records(out / "results")
    assert all(r.compile is not None and "gpu_wait_s" not in r.run.to_json() for r in recs.values())


@pytest.mark.parametrize("where", ["run", "health"])
def test_the_token_goes_back_however_the_attempt_ends(tmp_path, monkeypatch, where):
    """A run that raises after its worker took the GPU token (interrupted, the fork server
    gone, a health check that fails) must not leave the token held by a dead owner: every
    other worker of that GPU would wait for it with its clocks stopped, for ever."""
    from cutedebug.engine import runner
    from cutedebug.engine import scenario as S
    from cutedebug.engine.watchdog import Interrupted
    from cutedebug.instrument.launch_gpu import acquire_gpu_token

    token = tmp_path / ".gpu-0.token"

    def run_once(*a, tag=None, gpu_token=None, **kw):
        acquire_gpu_token(str(gpu_token), tag)  # what the worker does before its launch
        if where == "run":
            raise Interrupted("interrupted: the child was killed")
        return runner.V.Classified(runner.V.Verdict.HANG, ""), runner.V.Outcome(), {"tag": tag}

    def health(*a, **kw):
        assert token.exists()  # still held while the GPU is checked
        raise RuntimeError("health check broke")

    monkeypatch.setattr(runner, "run_once", run_once)
    monkeypatch.setattr(runner, "after_run_health", health)
    sc = S.adhoc(
        str(ROOT / "tests" / "helpers" / "hang_with_child.py") + ":Hang", {}, None, {}, "PASS"
    )
    with pytest.raises((Interrupted, RuntimeError)):
        runner.run_scenario(sc, runs_root=tmp_path, gpu_token=str(token))
    assert not token.exists()


def test_a_bisection_run_gives_the_token_back_however_it_ends(tmp_path, monkeypatch):
    """`triage --bisect` bisects on a GPU lane with its token: a bisection run that raises
    after its worker took the token (interrupted, the fork server gone) must give it back,
    as runner._attempt does, or every other worker of that GPU waits for ever."""
    from cutedebug.analyses import bisect as B
    from cutedebug.engine import runner
    from cutedebug.engine import scenario as S
    from cutedebug.engine.watchdog import Interrupted
    from cutedebug.instrument.launch_gpu import acquire_gpu_token

    token = tmp_path / ".gpu-0.token"
    tags: list[str] = []

    def watch(argv, events, log, limits, *, tag=None, **kw):
        assert tag is not None  # the run's tag is known before the run
        acquire_gpu_token(str(token), tag)  # what the worker does before its launch
        tags.append(tag)
        raise Interrupted("interrupted: the child was killed")

    monkeypatch.setattr(runner, "watch", watch)
    sc = S.adhoc(
        str(ROOT / "tests" / "helpers" / "hang_with_child.py") + ":Hang", {}, None, {}, "PASS"
    )
    with pytest.raises(Interrupted):
        B.bisect(sc, runs_root=tmp_path, forkserver=False, gpu_token=str(token))
    assert len(tags) == 1
    assert not token.exists()
