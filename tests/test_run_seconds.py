"""Where a `cutedebug run`'s seconds go, and the cuts (issue 22): a hang the probes ended is
checked in the worker's own CUDA context instead of in a new process after its exit.

The runner's side is driven with recorded-shape outcomes (the events a probed HANG's worker
writes, tests/data/runs/wrong_expect_tx_plus); the worker's side with the launch's CUDA calls
replaced (no GPU here).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import recorded_runs

from cutedebug.engine import health, launching, runner, worker
from cutedebug.engine import scenario as S
from cutedebug.engine import verdict as V

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = {"healthy": True, "device": "NVIDIA H200", "free_gib": 139.2, "via": "worker"}


def bounded_hang(gpu_check: dict | None = GPU_CHECK) -> V.Outcome:
    """The outcome of the recorded probed HANG (its worker ended by itself after the waits
    timed out), with the worker's own GPU check after its checked event."""
    o = V.Outcome()
    for line in recorded_runs.lines("wrong_expect_tx_plus"):
        ev = json.loads(line)
        if ev["event"] == "done" and gpu_check is not None:
            o.add({"event": "gpu_check", "t": ev["t"], **gpu_check, "secs": 0.004})
        o.add(ev)
    o.returncode = 0
    return o


def run_with(monkeypatch, tmp_path, outcome, facts=None):
    """run_scenario over ``outcome`` (classified as the runner would); the new-process health
    checks it asked for are listed in the second value."""
    sc = S.adhoc(f"{ROOT}/kernels/minimal.py:Minimal", {}, None, {}, "HANG")
    asked = []

    def fake_run_once(scenario, run_dir, **kw):
        return V.classify(outcome), outcome, {"t_call": 0.0, "t_return": 1.0, **(facts or {})}

    def fake_health_check(**kw):
        asked.append(kw["run_dir"])
        return {"healthy": True, "via": "torch", "secs": 4.2}

    monkeypatch.setattr(runner, "run_once", fake_run_once)
    monkeypatch.setattr(runner, "health_check", fake_health_check)
    return runner.run_scenario(sc, run_dir=tmp_path, probes=True), asked


def test_a_hang_the_probes_ended_is_checked_in_the_worker_not_in_a_new_process(
    tmp_path, monkeypatch
):
    res, asked = run_with(monkeypatch, tmp_path, bounded_hang())
    assert res.verdict is V.Verdict.HANG
    assert asked == []  # no interpreter started (~4 s cold on the H200) for what is known
    assert res.health["healthy"] is True and res.health["via"] == "worker"
    assert "nothing was killed" in res.health["checked"]
    assert res.timings["health_s"] == 0.004


@pytest.mark.parametrize(
    "why",
    [
        "killed",  # the watchdog killed it (a stall, a deadline): a new context must answer
        "exit_status",  # the worker did not exit cleanly after its check
        "cuda_error",  # the kernel faulted: the worker's context is gone
        "unhealthy",  # the worker's own check failed
        "no_check",  # a worker of an earlier version, or the check never came
        "swept",  # something of the worker's was left to sweep
        "no_done",  # the worker died after its check
    ],
)
def test_anything_short_of_a_clean_end_still_gets_a_new_process(tmp_path, monkeypatch, why):
    o = bounded_hang(
        None
        if why == "no_check"
        else {**GPU_CHECK, "healthy": False}
        if why == "unhealthy"
        else GPU_CHECK
    )
    facts = {}
    if why == "killed":
        o.killed_by_watchdog = "stall"
    elif why == "exit_status":
        o.returncode = -9
    elif why == "cuda_error":
        o.add({"event": "cuda_error", "name": "cudaErrorLaunchFailure", "message": "x"})
    elif why == "swept":
        facts["swept_after_exit"] = [12345]
    elif why == "no_done":
        o.events = [e for e in o.events if e.name != "done"]
    res, asked = run_with(monkeypatch, tmp_path, o, facts)
    assert asked == [tmp_path], why
    assert res.health == {"healthy": True, "via": "torch", "secs": 4.2}
    assert res.timings["health_s"] == 4.2


def test_a_pass_still_gets_no_check(tmp_path, monkeypatch):
    o = V.Outcome()
    for name in ("started", "device", "imported", "compiling", "compiled", "launched"):
        o.add({"event": name, **({"present": True} if name == "device" else {})})
    o.add({"event": "synced", "kernel_s": 0.001})
    o.add({"event": "checked", "ok": True, "digest": "abc"})
    o.add({"event": "done"})
    o.returncode = 0
    res, asked = run_with(monkeypatch, tmp_path, o)
    assert res.verdict is V.Verdict.PASS and res.health is None and asked == []


# ---- the worker's side -------------------------------------------------------------------------
class _Kernel:
    def output(self, tensors):
        return tensors["y"]

    def reference(self, tensors):
        return tensors["y"]


def _launch(monkeypatch, stuck: bool, tmp_path: Path) -> tuple[launching.Launch, list]:
    """One Launch.once of a kernel whose probe buffer says ``stuck`` (CUDA calls replaced); the
    worker's check after it goes through the real event channel (each key its kind's)."""
    import torch

    from cutedebug.instrument import probes

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    snap = SimpleNamespace(stuck=[object()] if stuck else [], beacons=[])
    monkeypatch.setattr(probes, "decode", lambda *a, **k: snap)
    monkeypatch.setattr(probes, "snapshot_to_json", lambda *a, **k: {"warps": []})
    tensors = {"y": torch.ones(4)}
    run = launching.Launch(
        _Kernel(), lambda *a: None, (), tensors, "k.py:K", {}, torch.zeros(8), object(), None
    )
    emitted: list = []
    run.once(lambda name, **kw: emitted.append((name, kw)))
    channel = worker.Events(str(tmp_path / "events.jsonl"))
    worker.check_gpu_after(run, channel.emit)
    for line in (tmp_path / "events.jsonl").read_text().splitlines():
        ev = json.loads(line)
        emitted.append((ev.pop("event"), {k: v for k, v in ev.items() if k not in ("t", "pid")}))
    return run, emitted


def test_the_worker_checks_its_gpu_after_the_waits_timed_out(monkeypatch, tmp_path):
    monkeypatch.setattr(health, "torch_check", lambda: dict(GPU_CHECK, via="torch"))
    run, emitted = _launch(monkeypatch, stuck=True, tmp_path=tmp_path)
    names = [n for n, _ in emitted]
    assert run.waits_timed_out
    assert names == ["launched", "synced", "probe_report", "checked", "gpu_check"]
    check = emitted[-1][1]
    assert check["healthy"] is True and check["via"] == "worker" and check["secs"] >= 0


def test_a_kernel_that_finished_its_work_asks_no_check(monkeypatch, tmp_path):
    monkeypatch.setattr(health, "torch_check", lambda: pytest.fail("no check after a PASS"))
    run, emitted = _launch(monkeypatch, stuck=False, tmp_path=tmp_path)
    assert not run.waits_timed_out
    assert [n for n, _ in emitted] == ["launched", "synced", "probe_report", "checked"]
    assert emitted[-1][1]["ok"] is True


def test_the_in_worker_check_never_raises(monkeypatch):
    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(health, "torch_check", broken)
    res = health.in_worker_check()
    assert res["healthy"] is False and "illegal memory access" in res["error"]
    assert res["via"] == "worker"
    monkeypatch.setattr(health, "torch_check", lambda: None)
    assert health.in_worker_check()["healthy"] is None


def test_torchs_own_answer_fits_the_event(tmp_path):
    """The real torch check's record (here: no CUDA GPU) goes through the event channel."""
    channel = worker.Events(str(tmp_path / "events.jsonl"))
    channel.emit("gpu_check", **health.in_worker_check())
    ev = json.loads((tmp_path / "events.jsonl").read_text())
    assert ev["event"] == "gpu_check" and ev["via"] == "worker" and "healthy" in ev


# ---- the command line: a `cutedebug run` imports only what a run needs -------------------------
def _actions(parser) -> list[tuple]:
    return [
        (tuple(a.option_strings), a.dest, repr(a.default), repr(a.choices), a.nargs)
        for a in parser._actions
    ]


def _subparsers(parser) -> dict:
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return dict(sub.choices)


def test_each_command_alone_is_the_same_parser_as_in_the_full_one():
    from cutedebug.commands import cli

    full = _subparsers(cli.build_parser())
    assert list(full) == list(cli.COMMANDS)  # every command is in the table, in --help's order
    for name in cli.COMMANDS:
        alone = _subparsers(cli.build_parser(cli.chosen_command([name, "--x"])))
        assert list(alone) == [name]
        assert _actions(alone[name]) == _actions(full[name]), name


def test_a_command_line_naming_no_command_gets_every_one():
    from cutedebug.commands import cli

    for argv in ([], ["--help"], ["bogus", "run"], ["-h", "run"]):
        only = cli.chosen_command(argv)
        assert only in (None, "run")
        if argv[:1] != ["-h"]:
            assert only is None and len(_subparsers(cli.build_parser(only))) == len(cli.COMMANDS)


def test_a_run_does_not_import_the_other_commands():
    import subprocess
    import sys

    code = (
        "import json, sys; from cutedebug.commands import cli; "
        "cli.build_parser(cli.chosen_command(['run', 'scenarios/minimal/clean.toml'])); "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('cutedebug.commands.'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    loaded = set(json.loads(out))
    others = {"sanitize", "triage", "shard", "lint", "bisect", "exec", "mutate", "pool"}
    assert not loaded & {f"cutedebug.commands.{m}" for m in others}, loaded


# ---- a cold worker's GPU lookup beside cutlass's import (opt-in) --------------------------------
FAKE_GPU_WORKER = """
import sys, threading
from cutedebug import devices
from cutedebug.engine import worker
devices.gpu_device_node = lambda: "/dev/nvidiactl"  # a GPU machine, as far as the worker asks
def detect_device():
    name = threading.current_thread().name
    return {"present": False, "reason": "looked up in " + name + " with cutlass imported: "
            + str("cutlass.cute" in sys.modules)}
worker.detect_device = detect_device
sys.exit(worker.main([sys.argv[1]]))
"""


@pytest.mark.parametrize("overlap", [False, True])
def test_a_fresh_run_worker_looks_for_the_gpu_beside_cutlasss_import_when_asked(tmp_path, overlap):
    import os
    import subprocess
    import sys

    sc = S.adhoc(f"{ROOT}/kernels/minimal.py:Minimal", {}, None, {}, "PASS")
    req, events, _ = runner.write_request(tmp_path, sc, mode="run")
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUTEDEBUG_OVERLAP_IMPORTS="1" if overlap else "0")
    subprocess.run([sys.executable, "-c", FAKE_GPU_WORKER, str(req)], cwd=ROOT, env=env, check=True)
    evs = [json.loads(line) for line in events.read_text().splitlines()]
    names = [e["event"] for e in evs]
    (device,) = [e for e in evs if e["event"] == "device"]
    if overlap:  # asked in the lookup thread while the main thread imported cutlass
        assert device["reason"].startswith("looked up in cutedebug-device")
    else:  # asked first, in the main thread, before cutlass
        assert device["reason"] == "looked up in MainThread with cutlass imported: False"
    # either way the run goes on as before: compiled, then not run (no GPU after all)
    assert names[:2] == ["started", "device"] and names[-1] == "done"
    assert "compiled" in names and evs[-2]["event"] == "unsupported"


def test_the_health_check_process_skips_the_interpreters_teardown():
    """`python -m cutedebug.engine.health` (the check after a kill, in a fresh interpreter)
    prints its answer and ends without tearing torch down: an atexit hook never runs."""
    import subprocess
    import sys

    code = (
        "import atexit, runpy, sys; atexit.register(lambda: print('TEARDOWN', flush=True)); "
        "sys.argv = ['health']; runpy.run_module('cutedebug.engine.health', run_name='__main__')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and "TEARDOWN" not in r.stdout, r.stdout
    assert "healthy" in json.loads(lines[-1])  # the answer, printed and flushed


@pytest.mark.gpu
@pytest.mark.parametrize("overlap", ["0", "1"])
def test_on_the_gpu_a_probed_hang_is_checked_in_its_worker(tmp_path, overlap):
    """The README's probed HANG, cold, as a user runs it: HANG as expected and localized, the GPU
    checked in the worker (no health-check process, no folder of one), with the worker's GPU
    lookup in its main thread and beside cutlass's import (CUTEDEBUG_OVERLAP_IMPORTS)."""
    import os
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "cutedebug", "run", "--no-warm", "--runs-dir", str(tmp_path)]
        + ["scenarios/tma_stream/wrong_expect_tx_plus.toml"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env=dict(os.environ, CUTEDEBUG_OVERLAP_IMPORTS=overlap),
    )
    assert r.returncode == 0, r.stdout + r.stderr  # verdict and localization as expected
    line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("report:"))
    run_dir = Path(line.split("report:", 1)[1].strip()).parent
    rep = json.loads((run_dir / "report.json").read_text())
    assert rep["verdict"] == "HANG"
    assert rep["health"]["via"] == "worker" and rep["health"]["healthy"] is True
    assert rep["timings"]["health_s"] < 0.5 and not (run_dir / "health").exists()


@pytest.mark.parametrize(
    "behaviour,new_process", [("bounded_hang", False), ("bounded_hang_leaves_a_child", True)]
)
def test_through_the_watchdog_a_clean_end_is_what_spares_the_new_process(
    tmp_path, monkeypatch, behaviour, new_process
):
    """run_scenario over a real child process (tests/helpers/fake_worker.py replaying the
    recorded probed HANG and its worker's check): its own exit status and the sweep after it
    decide, as they would for the worker."""
    import sys

    fake = ROOT / "tests" / "helpers" / "fake_worker.py"
    monkeypatch.setattr(
        runner,
        "worker_argv",
        lambda req: [sys.executable, str(fake), str(Path(req).parent / "events.jsonl"), behaviour],
    )
    asked = []
    monkeypatch.setattr(
        runner, "health_check", lambda **kw: asked.append(kw) or {"healthy": True, "via": "torch"}
    )
    sc = S.load(ROOT / "scenarios" / "tma_stream" / "wrong_expect_tx_plus.toml")
    res = runner.run_scenario(sc, run_dir=tmp_path, probes=True)
    assert res.verdict is V.Verdict.HANG and res.expected  # localized as the scenario expects
    assert bool(asked) is new_process
    assert res.health["via"] == ("torch" if new_process else "worker")
    if new_process:
        assert res.evidence["swept_pids"]  # the child it left, swept after its exit


# ---- the pool server hears a worker's exit at once -----------------------------------------------
def test_the_pool_server_writes_a_workers_exit_status_when_it_exits(tmp_path, monkeypatch):
    """A worker's exit wakes the server's loop (SIGCHLD through its wakeup pipe): its status
    file, which the command polls before the verdict, is written then, not at the end of the
    loop's select. With the select's timeout set to 30 s the status comes well within 2 s."""
    import os
    import signal
    import socket
    import threading
    import time

    from cutedebug.engine import pool_server

    monkeypatch.setattr(pool_server, "SELECT_S", 30.0)
    server = pool_server.Server(str(tmp_path / "s.sock"), str(tmp_path / "m.json"), "k", 600.0)
    server.bind()
    old_handler = signal.getsignal(signal.SIGCHLD)
    server.wake_on_child_exit()
    status = tmp_path / "exit_status.json"
    seen: dict[str, float] = {}

    def watch() -> None:
        end = time.monotonic() + 10
        while not status.exists() and time.monotonic() < end:
            time.sleep(0.005)
        seen["after_s"] = time.monotonic() - t_exit
        server.stopping = "test over"
        with socket.socket(socket.AF_UNIX) as c:  # wakes the select to see it
            c.connect(server.sock_path)

    try:
        pid = os.fork()
        if pid == 0:
            time.sleep(0.3)  # exits while the loop waits in its select
            os._exit(3)
        t_exit = time.monotonic() + 0.3
        server.workers[pid] = pool_server._Worker(str(status), "", None)
        threading.Thread(target=watch, daemon=True).start()
        server.loop()
    finally:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, old_handler)
        for fd in server.wakeup or ():
            os.close(fd)
        server.listener.close()
    assert json.loads(status.read_text()) == {"returncode": 3}
    assert seen["after_s"] < 2.0, seen


# ---- the command's end -------------------------------------------------------------------------
ENTRY = """
import atexit, sys, threading, time
atexit.register(lambda: print("atexit hook ran", flush=True))
if sys.argv[1] == "thread":  # a thread still running: Python's own exit waits for it
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread done", flush=True))).start()
sys.argv = ["cutedebug", *sys.argv[2:]]
from cutedebug.commands.cli import entry
entry()
print("not reached")
"""


@pytest.mark.parametrize("thread", ["none", "thread"])
def test_the_command_ends_without_the_teardown_yet_flushed_and_hooked(thread):
    """`cutedebug` (cli.entry): what main printed, unflushed, is all there; the atexit hooks
    ran; the exit status is main's (0, then 2 for a bad option); a thread still running is
    waited for (Python's own exit then)."""
    import subprocess
    import sys

    def go(*argv):
        return subprocess.run(
            [sys.executable, "-c", ENTRY, thread, *argv], capture_output=True, text=True, cwd=ROOT
        )

    r = go("list", "scenarios/minimal")
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()
    assert "minimal/spin_hang" in r.stdout and rows[-1] == "atexit hook ran", rows[-3:]
    assert ("thread done" in r.stdout) == (thread == "thread")
    bad = go("run", "--no-such-option", "x.toml")
    assert bad.returncode == 2 and "atexit hook ran" in bad.stdout
