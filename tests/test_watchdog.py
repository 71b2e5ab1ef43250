"""The watchdog against children that misbehave on purpose (tests/helpers/fake_worker.py).

Each case must end with the right verdict within its deadline and leave no process behind.
"""

import sys
import time
from pathlib import Path

import psutil
import pytest

from cutedebug.engine import runner
from cutedebug.engine.scenario import Limits
from cutedebug.engine.verdict import Verdict, classify

FAKE = Path(__file__).parent / "helpers" / "fake_worker.py"
TAGS: list[str] = []  # every run tag this module used
LIMITS = Limits(compile_s=30.0, deadline_s=1.0, stall_s=0.3, import_s=30.0, check_s=30.0)


def run_fake(tmp_path, behaviour, stall_s=None, pidfile=None):
    events, log = tmp_path / "events.jsonl", tmp_path / "worker.log"
    events.write_text("")
    argv = [sys.executable, str(FAKE), str(events), behaviour]
    if pidfile:
        argv.append(str(pidfile))
    t0 = time.monotonic()
    outcome, facts = runner.watch(argv, events, log, LIMITS, stall_s=stall_s)
    TAGS.append(facts["tag"])
    return outcome, facts, time.monotonic() - t0


def assert_no_leftovers(facts, extra_pids=(), born_before=None):
    """Nothing carries the run's tag, and none of ``extra_pids`` lives on. ``born_before``
    (a wall time): a process holding one of those pids but created after it is another one
    (pids wrap at pid_max; the full suite starts thousands of processes), not a leftover."""
    assert runner.tagged_processes(facts["tag"]) == []
    for pid in extra_pids:
        # A SIGKILLed process whose memory is already gone (its environ unreadable, so no
        # longer "tagged") can still be on its way out under load: dying is not living on.
        end = time.monotonic() + 2.0
        while True:
            try:
                p = psutil.Process(pid)
                if born_before is not None and p.create_time() > born_before:
                    break  # the pid was reused
                if p.status() == psutil.STATUS_ZOMBIE:
                    break
                assert time.monotonic() < end, (pid, p.status(), p.cmdline())
            except psutil.NoSuchProcess:
                break
            time.sleep(0.02)


@pytest.mark.parametrize("behaviour", ["sleep_forever", "busy_loop", "ignore_sigterm"])
def test_hanging_child_is_killed_as_hang(tmp_path, behaviour):
    outcome, facts, secs = run_fake(tmp_path, behaviour)
    c = classify(outcome)
    assert c.verdict is Verdict.HANG, c
    assert outcome.killed_by_watchdog.startswith("deadline:launched")
    assert outcome.returncode == -9
    assert secs < LIMITS.deadline_s + 4
    assert_no_leftovers(facts)


def test_grandchildren_in_own_sessions_are_swept(tmp_path):
    pidfile = tmp_path / "pids"
    outcome, facts, _ = run_fake(tmp_path, "grandchildren", pidfile=pidfile)
    pids = [int(p) for p in pidfile.read_text().split()]
    assert classify(outcome).verdict is Verdict.HANG
    assert set(pids) <= set(facts["swept"])
    assert_no_leftovers(facts, pids, born_before=pidfile.stat().st_mtime + 0.05)


def test_grandchildren_of_a_child_that_exited_are_swept(tmp_path):
    pidfile = tmp_path / "pids"
    outcome, facts, _ = run_fake(tmp_path, "grandchildren_then_exit", pidfile=pidfile)
    pids = [int(p) for p in pidfile.read_text().split()]
    assert classify(outcome).verdict is Verdict.PASS
    assert set(pids) <= set(facts["swept_after_exit"])
    assert_no_leftovers(facts, pids, born_before=pidfile.stat().st_mtime + 0.05)


def test_segfault_while_compiling_is_compiler_crash(tmp_path):
    outcome, facts, _ = run_fake(tmp_path, "segfault_compiling")
    c = classify(outcome)
    assert c.verdict is Verdict.COMPILER_CRASH
    assert "SIGSEGV" in c.reason
    assert_no_leftovers(facts)


def test_segfault_while_running_is_crash(tmp_path):
    outcome, facts, _ = run_fake(tmp_path, "segfault_running")
    c = classify(outcome)
    assert c.verdict is Verdict.CRASH
    assert "SIGSEGV" in c.reason


def test_early_exit_is_harness_error(tmp_path):
    outcome, facts, _ = run_fake(tmp_path, "exit3")
    c = classify(outcome)
    assert c.verdict is Verdict.HARNESS_ERROR
    assert "status 3" in c.reason


def test_50mb_of_output_does_not_block(tmp_path):
    outcome, facts, secs = run_fake(tmp_path, "print_50mb")
    assert classify(outcome).verdict is Verdict.PASS
    assert (tmp_path / "worker.log").stat().st_size >= 50 * 2**20
    assert len(outcome.log_tail) <= 4000
    assert_no_leftovers(facts)


def test_malformed_json_is_harness_error(tmp_path):
    outcome, facts, _ = run_fake(tmp_path, "malformed_json")
    c = classify(outcome)
    assert c.verdict is Verdict.HARNESS_ERROR
    assert "malformed" in c.reason and "oops" in c.reason


def test_stall_is_declared_before_the_deadline(tmp_path):
    limits_deadline = LIMITS.deadline_s
    outcome, facts, secs = run_fake(tmp_path, "stall", stall_s=0.3)
    assert outcome.killed_by_watchdog == "stall"
    assert classify(outcome).verdict is Verdict.HANG
    assert facts["stall_detected_after_s"] >= 0.3
    # The stall window is shorter than the deadline and the kill came from it.
    assert facts["stall_detected_after_s"] < limits_deadline


def test_moving_counters_are_not_a_stall(tmp_path):
    # 1.5 s of progress with a 0.3 s stall window and... a deadline of 1 s would kill it, so
    # give this one more time: only the stall rule is under test.
    global LIMITS
    saved = LIMITS
    LIMITS = Limits(compile_s=5.0, deadline_s=10.0, stall_s=0.3, import_s=5.0, check_s=5.0)
    try:
        outcome, facts, _ = run_fake(tmp_path, "progressing", stall_s=0.3)
    finally:
        LIMITS = saved
    assert outcome.killed_by_watchdog is None
    assert classify(outcome).verdict is Verdict.PASS


def test_no_process_of_ours_is_left():
    # After all of the above, nothing carrying any of this module's run tags is alive.
    assert TAGS
    left = {tag: runner.tagged_processes(tag) for tag in TAGS}
    assert {t: p for t, p in left.items() if p} == {}


def test_each_perturbed_launch_gets_its_own_kernel_deadline(tmp_path):
    # five 0.6 s launches after one compile take 3 s, three times the 1 s kernel deadline
    outcome, facts, secs = run_fake(tmp_path, "perturbed_seeds")
    assert classify(outcome).verdict is Verdict.PASS and outcome.killed_by_watchdog is None
    assert secs >= 3.0
    assert_no_leftovers(facts)


def test_a_perturbed_launch_that_hangs_is_a_hang_naming_its_seed(tmp_path):
    from cutedebug.engine import perturb_runs

    outcome, facts, secs = run_fake(tmp_path, "perturbed_hang")
    assert classify(outcome).verdict is Verdict.HANG
    assert outcome.killed_by_watchdog.startswith("deadline:launched")
    assert secs < 1.0 + 1.0 + LIMITS.deadline_s + 4
    ev = perturb_runs.evidence(outcome)["perturbation"]
    assert ev["exposed_by"] == 2 and ev["killed_during"] == "seed" and ev["runs"] == 3
    assert_no_leftovers(facts)


def test_cancellable_stops_only_the_runs_of_its_thread(tmp_path):
    """watchdog.cancellable: setting one thread's event kills that thread's child (with its
    tree) within a poll and raises Interrupted there; a run in another thread goes on; a run
    asked for after the event was set never starts."""
    import threading

    from cutedebug.engine import watchdog

    limits = Limits(compile_s=30.0, deadline_s=30.0, import_s=30.0, check_s=30.0)
    events = {name: threading.Event() for name in ("a", "b")}
    ended: dict[str, tuple[str, float]] = {}
    t0 = time.monotonic()

    def run(name):
        d = tmp_path / name
        d.mkdir()
        (d / "events.jsonl").write_text("")
        pidfile = d / "pids"
        argv = [sys.executable, str(FAKE), str(d / "events.jsonl"), "grandchildren", str(pidfile)]
        with watchdog.cancellable(events[name]):
            try:
                watchdog.watch(argv, d / "events.jsonl", d / "worker.log", limits, tag=name * 32)
                ended[name] = ("returned", time.monotonic() - t0)
            except watchdog.Interrupted:
                ended[name] = ("interrupted", time.monotonic() - t0)

    threads = {n: threading.Thread(target=run, args=(n,)) for n in events}
    for t in threads.values():
        t.start()
    end = time.monotonic() + 30
    while not all((tmp_path / n / "pids").exists() for n in events):  # both running, with kids
        assert time.monotonic() < end
        time.sleep(0.05)
    kids_a = [int(p) for p in (tmp_path / "a" / "pids").read_text().split()]
    events["a"].set()
    threads["a"].join(timeout=10)
    assert ended["a"][0] == "interrupted" and threads["b"].is_alive()  # b still watched
    assert_no_leftovers({"tag": "a" * 32}, kids_a)
    assert runner.tagged_processes("b" * 32)  # the other thread's child lives on
    events["b"].set()
    threads["b"].join(timeout=10)
    assert ended["b"][0] == "interrupted" and ended["b"][1] > ended["a"][1]
    assert_no_leftovers({"tag": "b" * 32})
    with watchdog.cancellable(events["a"]), pytest.raises(watchdog.Interrupted):
        watchdog.watch([sys.executable, "-c", "pass"], None, tmp_path / "x.log", limits)
    assert not watchdog.aborted()  # nothing process-wide was set
