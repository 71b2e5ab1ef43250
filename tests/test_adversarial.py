"""The harness attacked as a hostile user would: misbehaving children, killed and interrupted
harnesses, nonsense limits, damaged records, hostile ids and paths.

Every case asserts what a user relies on: no process left behind (counted by the tags every
child carries, cutedebug/engine/lifeline.py), no traceback, the verdict kept, interrupts that
end everything within 2 s. Children are fake workers (tests/helpers/fake_worker.py) or the
real worker forked from one real fork server running the hostile kernel
tests/hostile/hostile_kernel.py: no GPU and no kernel compile needed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from cutedebug.analyses import lint
from cutedebug.commands import cli, exits
from cutedebug.commands import triage as T
from cutedebug.engine import lifeline, runner, watchdog, worker
from cutedebug.engine import scenario as S
from cutedebug.engine import verdict as V

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "helpers" / "fake_worker.py"
HOSTILE = ROOT / "tests" / "hostile" / "hostile_kernel.py"
HARNESS = ROOT / "tests" / "hostile" / "harness.py"
pytest_plugins = ["pytester"]
SHORT = S.Limits(compile_s=30.0, deadline_s=0.5, stall_s=0.3, import_s=30.0, check_s=30.0)


def carrying(tag: str) -> list[int]:
    return [p.pid for p in lifeline.processes(tag)]


def gone(pids, within: float = 3.0) -> bool:
    """Every pid dead (or a zombie) within ``within`` seconds."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        alive = [
            p
            for p in pids
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return True
        time.sleep(0.05)
    return False


def fake_watch(tmp_path, behaviour, limits=SHORT, **kw):
    events, log, pidfile = tmp_path / "events.jsonl", tmp_path / "log", tmp_path / "pids"
    events.write_text("")
    argv = [sys.executable, str(FAKE), str(events), behaviour, str(pidfile)]
    outcome, facts = watchdog.watch(argv, events, log, limits, **kw)
    pids = [int(p) for p in pidfile.read_text().split()] if pidfile.exists() else []
    return outcome, facts, pids


def start_harness(mode: str, work: Path, tag: str) -> tuple[subprocess.Popen, dict]:
    """A harness process whose every descendant carries ``tag``; waits for its ready line."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env[lifeline.SESSION_VAR] = tag
    proc = subprocess.Popen(
        [sys.executable, str(HARNESS), mode, str(work)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    line = proc.stdout.readline()
    assert line, proc.stderr.read().decode()
    return proc, json.loads(line)


# ---- orphans -----------------------------------------------------------------------------------
def test_hostile_tree_direct_child_hang_leaves_nothing(tmp_path):
    """setsid'd, SIGTERM-ignoring, exec'd and fork-only grandchildren: all swept at the kill."""
    outcome, facts, pids = fake_watch(tmp_path, "hostile_tree")
    assert V.classify(outcome).verdict is V.Verdict.HANG
    assert len(pids) == 3 and set(pids) <= set(facts["swept"])
    assert gone(pids, 0.5) and carrying(facts["tag"]) == []


def test_sigkill_of_the_harness_leaves_nothing(tmp_path):
    """The harness dies with SIGKILL mid-hang: PDEATHSIG kills its child, the keeper sweeps
    the grandchildren that started sessions of their own."""
    tag = uuid.uuid4().hex
    proc, ready = start_harness("watch", tmp_path, tag)
    assert len(ready["pids"]) == 3 and len(carrying(tag)) >= 5  # harness, child, 3 grandkids
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert gone(ready["pids"], 3.0)
    end = time.monotonic() + 3.0
    while carrying(tag) and time.monotonic() < end:
        time.sleep(0.05)
    assert carrying(tag) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_the_harness_ends_everything_within_2s(tmp_path, sig):
    tag = uuid.uuid4().hex
    proc, ready = start_harness("watch", tmp_path, tag)
    t0 = time.monotonic()
    os.kill(proc.pid, sig)
    proc.wait(timeout=10)
    latency = time.monotonic() - t0
    assert latency < 2.0, latency
    assert gone(ready["pids"], 1.0) and carrying(tag) == []
    assert b"Traceback" not in proc.stderr.read()


def hostile_dir(tmp_path: Path, pidfile: Path) -> Path:
    d = tmp_path / "scen"
    d.mkdir()
    (d / "sleepy.toml").write_text(
        f'id = "hostile/sleepy"\n[kernel]\nfile = "{HOSTILE}"\nentry = "Hostile"\n'
        f'[params]\nbehaviour = "sleep"\npidfile = "{pidfile}"\n[expect]\nverdict = "PASS"\n'
    )
    return d


def interrupt_when_running(argv: list[str], pidfile: Path, sig: int, cwd: Path) -> tuple:
    """Start a cutedebug front end, wait until the hostile worker sleeps, send ``sig``:
    (seconds until every child of the front end was gone, seconds until the front end
    exited, its output, processes left after it exited)."""
    tag = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env[lifeline.SESSION_VAR] = tag
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    end = time.monotonic() + 240
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < end:
        assert proc.poll() is None, proc.stdout.read().decode()
        time.sleep(0.05)
    t0 = time.monotonic()
    os.kill(proc.pid, sig)
    while set(carrying(tag)) - {proc.pid} and time.monotonic() - t0 < 30:
        time.sleep(0.02)
    children_s = time.monotonic() - t0
    proc.wait(timeout=60)
    return children_s, time.monotonic() - t0, proc.stdout.read().decode(), carrying(tag)


def test_sigint_of_a_triage_ends_it_within_2s(tmp_path):
    pidfile = tmp_path / "pid"
    children_s, exit_s, out, left = interrupt_when_running(
        [
            sys.executable,
            "-m",
            "cutedebug",
            "triage",
            str(hostile_dir(tmp_path, pidfile)),
            "--out",
            str(tmp_path / "o"),
            "--jobs",
            "1",
        ],
        pidfile,
        signal.SIGINT,
        tmp_path,
    )
    assert children_s < 2.0 and exit_s < 2.0, (children_s, exit_s, out)
    assert left == [] and "Traceback" not in out and "interrupted" in out


@pytest.mark.slow
def test_sigterm_of_pytest_on_a_hung_item_ends_it_within_2s(tmp_path):
    pidfile = tmp_path / "pid"
    d = hostile_dir(tmp_path, pidfile)
    (tmp_path / "pytest.ini").write_text("[pytest]\ncutedebug_scenario_dirs = scen\n")
    # pytest's own end (other plugins' summaries) is not ours to time: every child is.
    children_s, exit_s, out, left = interrupt_when_running(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--cutedebug-compile-jobs=1",
            str(d),
        ],
        pidfile,
        signal.SIGTERM,
        tmp_path,
    )
    assert children_s < 2.0, (children_s, out)
    assert left == [] and "KeyboardInterrupt: cutedebug: SIGTERM" in out


@pytest.mark.slow
def test_sigkill_of_pytest_xdist_with_hung_items_leaves_nothing(tmp_path):
    """``pytest -n 2`` with a hung scenario on each worker (each worker's item forks
    setsid'd, SIGTERM-ignoring grandchildren), then SIGKILL of pytest itself: the xdist workers,
    their fork servers, the workers and every grandchild are gone within 5 s."""
    pytest.importorskip("xdist")
    d = tmp_path / "scen"
    d.mkdir()
    pidfiles = [tmp_path / f"pids{i}" for i in range(2)]
    for i, pf in enumerate(pidfiles):
        (d / f"tree{i}.toml").write_text(
            f'id = "hostile/tree{i}"\n[kernel]\nfile = "{HOSTILE}"\nentry = "Hostile"\n'
            f'[params]\nbehaviour = "tree"\npidfile = "{pf}"\n[expect]\nverdict = "PASS"\n'
        )
    (tmp_path / "pytest.ini").write_text("[pytest]\ncutedebug_scenario_dirs = scen\n")
    tag = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env[lifeline.SESSION_VAR] = tag
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"]
    proc = subprocess.Popen(
        [*argv, "--cutedebug-compile-jobs=1", str(d)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    end = time.monotonic() + 240
    while not all(pf.exists() and pf.read_text() for pf in pidfiles):
        assert proc.poll() is None and time.monotonic() < end, proc.stdout.read().decode()
        time.sleep(0.05)
    grandkids = [int(p) for pf in pidfiles for p in pf.read_text().split()]
    before = carrying(tag)
    assert len(grandkids) == 6 and set(grandkids) <= set(before)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    end = time.monotonic() + 5.0
    while carrying(tag) and time.monotonic() < end:
        time.sleep(0.05)
    assert carrying(tag) == [], [" ".join(p.cmdline()[:4]) for p in lifeline.processes(tag)]
    assert gone(grandkids, 0.5)


def test_abort_all_stops_a_watch_in_another_thread_at_once(tmp_path):
    got: dict = {}

    def run():
        try:
            fake_watch(tmp_path, "sleep_forever", limits=S.Limits(deadline_s=600))
        except watchdog.Interrupted as e:
            got["exc"], got["t"] = e, time.monotonic()

    th = threading.Thread(target=run)
    th.start()
    while not watchdog._LIVE:
        time.sleep(0.01)
    t0 = time.monotonic()
    watchdog.abort_all()
    th.join(5)
    watchdog.reset_abort()
    assert isinstance(got.get("exc"), watchdog.Interrupted) and got["t"] - t0 < 2.0
    assert not watchdog._LIVE


def test_sigkill_of_lint_removes_its_child_and_temp_dir(tmp_path):
    tag = uuid.uuid4().hex
    proc, ready = start_harness("lint", tmp_path, tag)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    end = time.monotonic() + 3.0
    while (carrying(tag) or any(Path(t).exists() for t in ready["tmp"])) and time.monotonic() < end:
        time.sleep(0.05)
    assert carrying(tag) == [] and not any(Path(t).exists() for t in ready["tmp"])


def test_forked_workers_carry_their_run_tag_and_leave_nothing(tmp_path, forkserver):
    """The fork server path: the worker's /proc environ shows its own run tag (set before
    anything runs), so fork-only grandchildren in sessions of their own are swept too."""
    pidfile = tmp_path / "pids"
    sc = hostile("tree", tmp_path, pidfile=str(pidfile), import_s=1.0)
    cls, outcome, facts = runner.run_once(
        sc, tmp_path / "run", mode="compile", forkserver=forkserver
    )
    pids = [int(p) for p in pidfile.read_text().split()]
    assert facts["forked"] and outcome.killed_by_watchdog.startswith("deadline:imported")
    assert len(pids) == 3 and set(pids) <= set(facts["swept"])
    assert gone(pids, 0.5) and carrying(facts["tag"]) == []


@pytest.mark.parametrize("behaviour", ["scrubbed", "scrubbed_then_return"])
def test_an_untagged_daemon_of_the_kernel_does_not_outlive_the_worker(
    tmp_path, forkserver, behaviour
):
    """Double fork, own session, empty environment: no tag, no group finds it; the worker is
    a subreaper, so it is the worker's until the watchdog kills the tree or the worker ends."""
    pidfile = tmp_path / "daemon"
    sc = hostile(behaviour, tmp_path, pidfile=str(pidfile), import_s=1.0)
    cls, outcome, facts = runner.run_once(
        sc, tmp_path / "run", mode="compile", forkserver=forkserver
    )
    daemon = int(pidfile.read_text())
    assert (
        b"CUTEDEBUG" not in Path(f"/proc/{daemon}/environ").read_bytes()
        if psutil.pid_exists(daemon) and psutil.Process(daemon).status() != "zombie"
        else True
    )
    if behaviour == "scrubbed":
        assert outcome.killed_by_watchdog.startswith("deadline:imported")
    else:
        assert cls.verdict is V.Verdict.COMPILE_ERROR  # the worker ended on its own
    assert gone([daemon], 1.0)


def test_a_dead_fork_server_is_a_harness_error_then_replaced(tmp_path, forkserver):
    sc = hostile("sleep", tmp_path, import_s=30.0)
    killer = threading.Timer(2.0, lambda: os.killpg(forkserver.proc.pid, signal.SIGKILL))
    killer.start()
    cls, outcome, facts = runner.run_once(sc, tmp_path / "a", mode="compile", forkserver=forkserver)
    assert cls.verdict is V.Verdict.HARNESS_ERROR and "fork server died" in cls.reason
    assert outcome.elapsed_s < 10 and carrying(facts["tag"]) == []
    restarts = forkserver.restarts
    cls, outcome, facts = runner.run_once(
        hostile("segfault", tmp_path), tmp_path / "b", mode="compile", forkserver=forkserver
    )
    assert facts["forked"] and forkserver.restarts == restarts + 1 and forkserver.alive
    assert cls.verdict is V.Verdict.HARNESS_ERROR and "SIGSEGV" in cls.reason


# ---- verdicts kept, messages capped --------------------------------------------------------------
def test_a_10mb_exception_message_keeps_its_verdict(tmp_path, forkserver):
    sc = hostile("raise_10mb", tmp_path)
    res = runner.run_scenario(sc, run_dir=tmp_path / "r", mode="compile", forkserver=forkserver)
    assert res.verdict is V.Verdict.COMPILE_ERROR, res.reason[:300]
    assert "cut by cutedebug" in res.evidence["compile_error"]["message"]
    assert len(json.dumps(res.evidence)) < 200_000


def test_an_error_in_the_users_adapter_is_the_users(tmp_path, forkserver):
    with pytest.raises(S.ScenarioError, match=r"fake_args\(\) raised ZeroDivisionError"):
        runner.run_once(
            hostile("user_error", tmp_path), tmp_path / "u", mode="compile", forkserver=forkserver
        )


def test_event_lines_over_the_cap_are_reported_not_lost(tmp_path):
    outcome, facts, _ = fake_watch(tmp_path, "huge_event_line")
    assert V.classify(outcome).verdict is V.Verdict.PASS
    assert any("cut" in ln for ln in outcome.malformed_lines)
    assert all(len(ln) < 400 for ln in outcome.malformed_lines)


def test_worker_events_cap_every_field_with_a_visible_mark(tmp_path):
    ev = worker.Events(str(tmp_path / "e.jsonl"))
    ev.emit(
        "compile_error",
        type="ValueError",
        message="m" * (10 << 20),
        copy_sites=[{"tb": ["t" * (1 << 20)]}],  # a string deep inside the payload
    )
    ev.emit("big", rows=["r" * 1000] * 5000)
    lines = (tmp_path / "e.jsonl").read_text().splitlines()
    assert all(len(ln) < watchdog.MAX_EVENT_LINE for ln in lines)
    first, second = json.loads(lines[0]), json.loads(lines[1])
    assert first["message"].startswith("m" * 100) and "more characters]" in first["message"]
    assert "more characters]" in first["copy_sites"][0]["tb"][0]
    assert second["event"] == "big" and "cut_by_cutedebug" in second


# ---- blame -----------------------------------------------------------------------------------------
def test_our_own_frames_are_ours_the_users_are_theirs():
    def users_code():
        raise ValueError("user")

    try:
        watchdog.phase_deadline("imported", None)  # our bug: AttributeError in our frame
    except AttributeError as e:
        assert worker.our_frame(e).split(":")[0].endswith("cutedebug/engine/watchdog.py")
    try:
        users_code()
    except ValueError as e:
        assert worker.our_frame(e) is None
    with pytest.raises(Exception) as info:
        worker.user_call("k.py:K", "fake_args", users_code)
    assert type(info.value).__name__ == "KernelLoadError" and info.value.user_type == "ValueError"


def test_a_crashed_lint_checker_is_a_visible_harness_error(monkeypatch):
    def boom(proto):
        raise KeyError("checker bug")

    monkeypatch.setattr(lint, "check", boom)
    (f,) = lint.static_findings(lint.Protocol())
    assert f["severity"] == "error" and f["check"] == lint.HARNESS_CHECK
    assert "HARNESS_ERROR" in f["message"] and "KeyError" in f["message"]


def test_a_crashed_checker_in_a_triage_is_a_harness_error_not_caught_statically():
    sc = S.adhoc(f"{ROOT}/kernels/minimal.py:Minimal", {}, None, {}, "PASS")
    rec = T.new_record(sc, "d", 1)
    crashed = {"severity": "error", "check": lint.HARNESS_CHECK, "message": "HARNESS_ERROR"}
    rec.compile = T.CallRecord.from_json(
        {
            "mode": "compile",
            "verdict": "PASS",
            "reason": "",
            "compiled": True,
            "fault_count": None,
            "static_findings": [crashed],
            "localization": {},
            "verdicts": ["PASS"],
            "harness_errors": 0,
            "wall_s": 1.0,
            "compile_s": 1.0,
            "kernel_s": 0.0,
            "overhead_s": 0.0,
            "device": None,
            "report": None,
        }
    )
    T.finalize(rec, None, "not run: no GPU")
    assert rec.caught_statically is None and rec.harness_errors == 1


# ---- limits ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flag,value",
    [
        ("--compile-deadline", "nan"),
        ("--deadline", "inf"),
        ("--stall", "0"),
        ("--compile-deadline", "-1"),
        ("--wait-budget-ms", "-5"),
        ("--repeat", "0"),
        ("--deadline", "1e9"),
    ],
)
def test_nonsense_limits_on_the_command_line_are_exit_2(capsys, flag, value):
    rc = cli.main(["run", str(ROOT / "scenarios" / "minimal" / "clean.toml"), flag, value])
    err = capsys.readouterr().err
    assert rc == exits.EXIT_USAGE and "expected a finite" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "args",
    [
        ["exec", "--deadline", "nan", "--", "true"],
        ["exec", "--stall", "inf", "--", "true"],
        ["exec", "--wait-budget-ms", "-5", "--", "true"],
        ["mutate", "--jobs", "0", "--", "true"],
        ["mutate", "--min-score", "2", "--", "true"],
        ["bisect", "x.toml", "--window", "inf"],
        ["sanitize", "x.toml", "--deadline-scale", "nan"],
        ["sanitize", "x.toml", "--racecheck-deadlock-timeout", "-1"],
        ["triage", ".", "--out", "o", "--repeat", "nan"],
    ],
)
def test_nonsense_limits_of_every_command_are_exit_2(capsys, args):
    assert cli.main(args) == exits.EXIT_USAGE
    err = capsys.readouterr().err
    assert "expected a finite" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "1e999"])
def test_nonsense_limits_in_toml_are_rejected(tmp_path, value):
    f = tmp_path / "s.toml"
    f.write_text(
        f'id = "a/b"\n[kernel]\nfile = "{ROOT}/kernels/minimal.py"\nentry = "Minimal"\n'
        f'[expect]\nverdict = "PASS"\n[limits]\ncompile_s = {value}\n'
    )
    with pytest.raises(S.ScenarioError, match=r"limits.compile_s = .*expected a finite"):
        S.load(f)


def test_nonsense_limits_in_pytest_options_env_and_ini_are_usage_errors(pytester, monkeypatch):
    monkeypatch.setenv("CUTEDEBUG_DEADLINE", "nan")
    res = pytester.runpytest_inprocess()
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert "CUTEDEBUG_DEADLINE deadline = 'nan'" in res.stderr.str()
    monkeypatch.delenv("CUTEDEBUG_DEADLINE")
    pytester.makeini("[pytest]\ncutedebug_timeout_margin = inf\n")
    res = pytester.runpytest_inprocess()
    assert res.ret == pytest.ExitCode.USAGE_ERROR and "timeout_margin" in res.stderr.str()
    res = pytester.runpytest_inprocess("--cutedebug-repeat=-3")
    assert res.ret == pytest.ExitCode.USAGE_ERROR


# ---- bad input, hostile ids and paths ---------------------------------------------------------------
@pytest.mark.parametrize("sid", ["a" * 300, "caf\u00e9/x", "a\u0000b", "../up", "a b", "/abs"])
def test_hostile_ids_are_rejected_by_name(tmp_path, sid):
    with pytest.raises(S.ScenarioError, match="field id"):
        S.build(
            {
                "id": sid,
                "kernel": {"file": str(ROOT / "kernels" / "minimal.py"), "entry": "Minimal"},
                "expect": {"verdict": "PASS"},
            },
            "x.toml",
            tmp_path,
            None,
        )


def test_a_non_utf8_kernel_file_is_exit_2_for_run_and_a_row_for_list(tmp_path, capsys):
    (tmp_path / "k.py").write_bytes(b"class K:\n    PARAMS = {}\n    NAME = '\xff\xfe'\n")
    (tmp_path / "s.toml").write_text(
        'id = "a/b"\n[kernel]\nfile = "k.py"\nentry = "K"\n[expect]\nverdict = "PASS"\n'
    )
    assert cli.main(["run", str(tmp_path / "s.toml")]) == exits.EXIT_USAGE
    err = capsys.readouterr().err
    assert "does not parse" in err and "Traceback" not in err
    assert cli.main(["list", str(tmp_path)]) == 0
    assert "INVALID" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["--runs-dir", "--out"])
def test_unwritable_output_paths_are_exit_2_with_path_and_reason(tmp_path, capsys, flag):
    blocker = tmp_path / "file"
    blocker.write_text("")
    target = str(blocker / "sub")
    args = (
        ["run", str(ROOT / "scenarios" / "minimal" / "clean.toml"), "--runs-dir", target]
        if flag == "--runs-dir"
        else ["triage", str(ROOT / "scenarios" / "minimal"), "--out", target]
    )
    assert cli.main(args) == exits.EXIT_USAGE
    err = capsys.readouterr().err
    assert target in err and "Not a directory" in err and "Traceback" not in err


def test_an_unwritable_path_anywhere_is_exit_2_not_a_traceback(tmp_path, capsys, monkeypatch):
    """Whatever command hits it: an OSError about a path is the user's to fix (exit 2)."""

    def unwritable(args):
        raise PermissionError(13, "Permission denied", str(tmp_path / "ro" / "x.json"))

    monkeypatch.setattr(cli, "cmd_list", unwritable)
    assert cli.main(["list"]) == exits.EXIT_USAGE
    err = capsys.readouterr().err
    assert "ro/x.json: Permission denied" in err and "Traceback" not in err


# ---- record identity ----------------------------------------------------------------------------------
def test_record_names_are_injective_and_short():
    ids = ["c/a", "c__a", "c_/_a", "a" * 120, "a" * 119 + "b"]
    names = [T.record_name(i) for i in ids]
    assert len(set(names)) == len(ids) and all(len(n) < 130 for n in names)


def scen(dir_: Path, rel: str, sid: str) -> None:
    p = dir_ / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(
        f'id = "{sid}"\n[kernel]\nfile = "{ROOT}/kernels/minimal.py"\n'
        'entry = "Minimal"\n[expect]\nverdict = "PASS"\n'
    )


def test_duplicate_ids_are_exit_2_naming_both_files(tmp_path, capsys):
    scen(tmp_path / "d", "one.toml", "k/same")
    scen(tmp_path / "d", "sub/two.toml", "k/same")
    rc = cli.main(["triage", str(tmp_path / "d"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == exits.EXIT_USAGE and "one.toml" in err and "two.toml" in err


def test_a_second_triage_on_the_same_out_is_refused(tmp_path):
    held = T.lock_out(tmp_path / "o")
    try:
        with pytest.raises(T.TriageInputError, match=f"another triage.*pid {os.getpid()}"):
            T.lock_out(tmp_path / "o")
    finally:
        held.close()
    T.lock_out(tmp_path / "o").close()  # free again once released


def test_resume_reruns_damaged_records(tmp_path):
    scen(tmp_path / "d", "a.toml", "k/a")
    scen(tmp_path / "d", "b.toml", "k/b")
    results = tmp_path / "o" / "results"
    results.mkdir(parents=True)
    sc = S.load(tmp_path / "d" / "a.toml")
    good = T.new_record(sc, T.scenario_digest(sc), 1)
    T.finalize(good, None, "not run: no GPU — test")
    (results / T.record_name("k/a")).write_text(json.dumps(good.to_json()))
    bad = dict(good.to_json(), id="k/b")
    del bad["expected"]
    (results / T.record_name("k/b")).write_text(json.dumps(bad))
    (results / "junk.json").write_bytes(b"\xff{")
    damaged: list[str] = []
    opts = T.Options(dir=tmp_path / "d", out=tmp_path / "o", resume=True)
    plans, kept = T.plan(opts, {"present": False, "reason": "test"}, damaged)
    assert [p.sc.id for p in plans] == ["k/b"] and [r.id for r in kept] == ["k/a"]
    assert any("'expected' missing" in d for d in damaged)
    assert any(d.startswith("junk.json: unreadable") for d in damaged)


# ---- health, exit codes, --no-probes ---------------------------------------------------------------
def test_health_is_checked_on_the_killed_run_not_replaced_by_the_probe_rerun(tmp_path, monkeypatch):
    sc = S.adhoc(f"{ROOT}/kernels/minimal.py:Minimal", {}, None, {}, "HANG")
    calls = []

    def fake_run_once(scenario, run_dir, *, probes=None, **kw):
        o = V.Outcome(phase="launched")
        o.add({"event": "device", "present": True, "name": "H200"})
        facts = {"t_call": 0.0, "t_return": 1.0}
        if probes is None:
            o.killed_by_watchdog = "deadline:launched:1s"
            return V.Classified(V.Verdict.HANG, "killed"), o, facts
        o.add(
            {
                "event": "probe_report",
                "stuck": [],
                "beacons": [],
                "warps": [],
                "n_stuck_reported": 0,
            }
        )
        return V.Classified(V.Verdict.PASS, "timing bug"), o, facts

    def fake_health(**kw):
        calls.append(kw["run_dir"])
        return {"healthy": True, "which": len(calls)}

    monkeypatch.setattr(runner, "run_once", fake_run_once)
    monkeypatch.setattr(runner, "health_check", fake_health)
    res = runner.run_scenario(sc, run_dir=tmp_path)
    assert res.health == {"healthy": True, "which": 1} and calls == [tmp_path]


def test_health_is_never_null_after_a_kill_or_a_crash_without_a_gpu(tmp_path):
    o = V.Outcome(phase="launched", killed_by_watchdog="deadline:launched:1s")
    o.add({"event": "device", "present": False, "reason": "no CUDA GPU"})
    for verdict in (V.Verdict.HANG, V.Verdict.CRASH):
        h = runner.after_run_health(V.Classified(verdict, ""), o, "run", None, tmp_path)
        assert h["healthy"] is None and "no CUDA GPU" in h["skipped"]
    ok = V.Outcome(phase="done")
    assert (
        runner.after_run_health(V.Classified(V.Verdict.PASS, ""), ok, "run", None, tmp_path) is None
    )


def result(verdict: str, expect: str, probes_used=True, mode="run", sites=()):
    sc = S.adhoc(f"{ROOT}/kernels/minimal.py:Minimal", {}, None, {}, expect)
    sc = sc.with_overrides(expect=S.Expect(verdict=expect, op="raw_wait"))
    return runner.RunResult(
        scenario=sc,
        verdict=V.Verdict(verdict),
        reason="r",
        run_dir=Path("."),
        outcome=V.Outcome(),
        mode=mode,
        evidence={"stuck_sites": list(sites)},
        probes_used=probes_used,
    )


def test_exit_codes_are_distinct_and_documented(capsys):
    assert cli.result_status(result("HANG", "HANG", probes_used=False), "run") == 0
    assert cli.result_status(result("PASS", "HANG"), "run") == exits.EXIT_UNEXPECTED
    assert cli.result_status(result("HARNESS_ERROR", "HANG"), "run") == exits.EXIT_HARNESS
    assert cli.result_status(result("UNSUPPORTED", "HANG"), "run") == exits.EXIT_NOT_RUN
    codes = {
        exits.EXIT_OK,
        exits.EXIT_UNEXPECTED,
        exits.EXIT_USAGE,
        exits.EXIT_HARNESS,
        exits.EXIT_NOT_RUN,
    }
    assert len(codes) == 5
    assert exits.worst(0, 4, 1) == 1 and exits.worst(4, 3, 1) == 3 and exits.worst(0, 4) == 4
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for code in ("0  every verdict", "2  bad input", "3  harness error", "4  could not run"):
        assert code in out
    readme = (ROOT / "README.md").read_text()
    assert "could not run here" in readme and "harness error" in readme


@pytest.mark.parametrize("argv", [["faults"], ["list", "scenarios/minimal"]])
def test_a_reader_that_goes_away_is_no_traceback(argv):
    """`cutedebug ... | head`: the pipe's reader closes early. The command ends with
    128 + SIGPIPE and no traceback (it printed BrokenPipeError's, or Python's 'Exception
    ignored ... BrokenPipeError' at exit)."""
    p = subprocess.Popen(
        [sys.executable, "-m", "cutedebug", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    p.stdout.close()  # the reader is gone before anything was written
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == exits.EXIT_BROKEN_PIPE, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_no_probes_says_localization_was_not_graded():
    r = result("HANG", "HANG", probes_used=False)
    assert r.localization["ok"] is None and r.localization["why"].startswith("not graded")
    assert r.expected
    assert result("HANG", "HANG", probes_used=True).localization["ok"] is False


# ---- the pytest plugin -----------------------------------------------------------------------------
def test_plugin_does_nothing_in_a_project_without_cutedebug(pytester):
    (pytester.path / "scenarios").mkdir()
    (pytester.path / "scenarios" / "data.toml").write_text("x = 1\n")
    pytester.makepyfile(
        test_sig="""
import signal


def test_handler():
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
"""
    )
    res = pytester.runpytest_inprocess()
    res.assert_outcomes(passed=1)
    assert "cutedebug: runs dir" not in res.stdout.str()


@pytest.mark.slow
def test_pytest_scenarios_works_from_a_source_checkout():
    """-p no:cutedebug hides the installed entry point: the root conftest registers it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cutedebug",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "-q",
            "scenarios/minimal",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "scenarios/minimal/clean.toml::compile" in r.stdout, r.stdout + r.stderr


# ---- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture
def forkserver(shared_forkserver):
    return shared_forkserver


def hostile(behaviour: str, tmp_path: Path, pidfile: str = "", import_s: float = 30.0):
    return S.adhoc(
        f"{HOSTILE}:Hostile", {"behaviour": behaviour, "pidfile": pidfile}, None, {}, "PASS"
    ).with_overrides(limits=S.Limits(import_s=import_s, compile_s=60.0))


class AcceleratorError(RuntimeError):
    """Stands for torch's (2.11) class of the same name: how a CUDA error is raised."""


@pytest.mark.parametrize(
    "exc, name",
    [
        (AcceleratorError("CUDA error: unspecified launch failure"), "cudaErrorLaunchFailure"),
        (
            RuntimeError("CUDA error: an illegal memory access was encountered"),
            "cudaErrorIllegalAddress",
        ),
        (RuntimeError("CUDA_ERROR_LAUNCH_FAILED"), "cudaErrorUnknown"),
        (ValueError("shape mismatch"), None),
        (KeyError("site 7"), None),
    ],
)
def test_a_cuda_error_is_the_gpus_wherever_it_surfaces(exc, name):
    from cutedebug.errors import gpu_error_name

    assert gpu_error_name(exc) == name


def test_a_cuda_error_escaping_the_worker_is_a_crash_not_a_harness_error(tmp_path, monkeypatch):
    """The H200 perturbation run (2026-12-02): a seed's fault surfaced as a sticky CUDA error
    outside the launch's own check (e.g. the next seed's inputs) and the run read HARNESS_ERROR.
    A CUDA error is what ran on the GPU faulting: CRASH with its name; any other exception
    escaping the worker stays a HARNESS_ERROR."""
    from cutedebug.engine import verdict as V

    def outcome(exc):
        def run(request, events):
            events.emit("launched")
            raise exc

        monkeypatch.setattr(worker, "run", run)
        monkeypatch.setattr(worker.lifeline, "become_subreaper", lambda: None)
        monkeypatch.setattr(worker.lifeline, "kill_descendants", lambda: None)
        ev_path = tmp_path / f"{type(exc).__name__}.jsonl"
        req = tmp_path / "req.json"
        req.write_text(json.dumps({"events": str(ev_path)}))
        rc = worker.main([str(req)])
        o = V.Outcome(returncode=rc)
        for line in ev_path.read_text().splitlines():
            o.add(json.loads(line))
        return V.classify(o)

    crash = outcome(AcceleratorError("CUDA error: unspecified launch failure"))
    assert crash.verdict is V.Verdict.CRASH and crash.reason.startswith("cudaErrorLaunchFailure")
    assert outcome(KeyError("ours")).verdict is V.Verdict.HARNESS_ERROR
