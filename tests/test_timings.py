"""runner.breakdown: one attempt's wall time placed phase by phase on the runner's clock."""

from cutedebug.engine import runner
from cutedebug.engine import verdict as V


def outcome(*events):
    o = V.Outcome()
    for ev in events:
        o.add(ev)
    return o


def test_phases_of_a_run_that_synchronized():
    # the runner called watch at 100.0 s and got control back at 108.0 s; the worker's t = 0
    # was 100.4 s on the same clock
    o = outcome(
        {"event": "started", "t": 0.0, "mono0": 100.4},
        {"event": "device", "t": 2.0, "present": True},
        {"event": "imported", "t": 3.0},
        {"event": "compiling", "t": 3.5},
        {"event": "compiled", "t": 5.5, "secs": 1.9},
        {"event": "launched", "t": 5.6},
        {"event": "synced", "t": 6.1, "kernel_s": 0.5},
        {"event": "checked", "t": 6.3, "ok": True},
        {"event": "done", "t": 6.4},
    )
    b = runner.breakdown(o, {"t_call": 100.0, "t_return": 108.0})
    assert b == {
        "spawn_s": 0.4,
        "imports_s": 3.0,
        "inputs_s": 0.5,
        "launch_s": 0.5,
        "exit_s": 1.2,
    }  # 108.0 - (100.4 + 6.4): teardown of the worker


def test_a_killed_hang_ends_its_launch_at_the_kill():
    o = outcome(
        {"event": "started", "t": 0.0, "mono0": 50.1},
        {"event": "imported", "t": 1.0},
        {"event": "compiling", "t": 1.1},
        {"event": "compiled", "t": 2.1, "secs": 1.0},
        {"event": "launched", "t": 2.2},
        {"event": "progress", "t": 3.0, "counter": 1},
    )
    # killed 7.3 s after the call, i.e. at 57.3 on the runner's clock
    b = runner.breakdown(o, {"t_call": 50.0, "t_return": 57.5, "kill_t": 7.3})
    assert b["launch_s"] == 5.0  # 57.3 - (50.1 + 2.2)
    assert b["exit_s"] == 0.2  # the kill and the sweep, not the worker's last event


def test_workers_without_mono0_give_no_breakdown():
    o = outcome({"event": "started", "t": 0.0}, {"event": "done", "t": 1.0})
    assert runner.breakdown(o, {"t_call": 1.0, "t_return": 2.0}) == {}


def test_imports_say_how_much_of_them_was_looking_for_the_gpu():
    """device_s: started -> device (torch imported, CUDA initialized), a part of imports_s."""
    o = outcome(
        {"event": "started", "t": 0.0, "mono0": 10.0},
        {"event": "device", "t": 2.25, "present": True},
        {"event": "imported", "t": 3.0},
        {"event": "compiling", "t": 3.1},
        {"event": "done", "t": 4.0},
    )
    t = runner._timings(o, {"t_call": 9.9, "t_return": 14.2})
    assert t["device_s"] == 2.25 and t["imports_s"] == 3.0
    assert "device_s" not in runner._timings(o, {})  # no breakdown, no part of it


def test_the_gaps_between_phases_are_placed_too():
    """prelaunch_s: the compile's end (compiling + compile_s) to the launch, the GPU token's
    wait apart; after_kernel_s: the kernel's end to the worker's last event."""
    o = outcome(
        {"event": "started", "t": 0.0, "mono0": 100.4},
        {"event": "imported", "t": 3.0},
        {"event": "compiling", "t": 3.5},
        {"event": "compiled", "t": 5.5, "secs": 1.9},
        {"event": "gpu_acquired", "t": 5.8, "waited_s": 0.25},
        {"event": "launched", "t": 5.9},
        {"event": "synced", "t": 6.1, "kernel_s": 0.2},
        {"event": "checked", "t": 6.3, "ok": True},
        {"event": "done", "t": 6.45},
    )
    t = runner._timings(o, {"t_call": 100.0, "t_return": 108.0})
    assert t["prelaunch_s"] == 0.25  # 5.9 - 3.5 - 1.9 - 0.25
    assert t["after_kernel_s"] == 0.35  # 6.45 - 6.1, the check (0.2) in it
    # a killed run has no end of its own after the kernel; a compile-only one ends at unsupported
    assert "after_kernel_s" not in runner._timings(o, {"t_call": 100.0, "kill_t": 7.0})
    o2 = outcome(
        {"event": "started", "t": 0.0, "mono0": 10.0},
        {"event": "compiling", "t": 1.0},
        {"event": "compiled", "t": 2.0, "secs": 0.9},
        {"event": "unsupported", "t": 2.3, "reason": "compile-only run"},
    )
    assert runner._timings(o2, {"t_call": 9.9})["prelaunch_s"] == 0.4


def test_the_unplaced_seconds_are_what_no_phase_holds():
    from cutedebug.engine import timings

    t = {"wall_s": 3.0, "spawn_s": 0.5, "compile_s": 1.0, "check_s": 0.2, "after_kernel_s": 0.3}
    assert timings.unplaced(t) == 1.2  # check_s is a part of after_kernel_s, not counted twice
    assert timings.unplaced({"wall_s": 1.0, "compile_s": 1.5}) == 0.0


def test_a_process_knows_its_age_from_its_start():
    """process_age_s in a child that slept 0.3 s before asking: at least that, and no more
    than the parent saw the child live."""
    import subprocess
    import sys
    import time

    code = (
        "import time; time.sleep(0.3); "
        "from cutedebug.engine.timings import process_age_s; print(process_age_s())"
    )
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    wall = time.monotonic() - t0
    age = float(out.stdout)
    assert 0.3 <= age <= wall + 0.02  # /proc's start time counts in clock ticks (10 ms)
