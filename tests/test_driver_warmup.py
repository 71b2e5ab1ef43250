"""engine/driver_warmup.py: the CUDA driver's start in a thread beside a fresh run worker's
imports. The GPU side (the context made, torch retaining it, the cold run's seconds) is
tools/gpu_pending.py's cold_driver step; here: when it starts, what it reports, and that no
failure of it stops a run."""

import ctypes
import sys
import threading

from cutedebug.engine import driver_warmup, runner
from cutedebug.engine import verdict as V


class FakeCuda:
    """libcuda's three calls, each answering the code given (0: CUDA_SUCCESS), recording the
    thread they ran on."""

    def __init__(self, init=0, get=0, retain=0):
        self.codes = {"cuInit": init, "cuDeviceGet": get, "cuDevicePrimaryCtxRetain": retain}
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, threading.current_thread().name))
            return self.codes[name]

        return call


def warm_with(monkeypatch, lib):
    monkeypatch.setattr(ctypes, "CDLL", lambda name: lib)
    return driver_warmup.DriverWarmup.start().join(timeout=10)


def test_the_driver_starts_in_its_own_thread_and_says_nothing_failed(monkeypatch):
    lib = FakeCuda()
    got = warm_with(monkeypatch, lib)
    assert got["why"] is None and got["seconds"] is not None
    assert [c for c, _ in lib.calls] == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain"]
    assert {t for _, t in lib.calls} == {"cutedebug-driver"}  # not the importing thread


def test_a_driver_error_is_named_and_stops_the_warm_up_there(monkeypatch):
    lib = FakeCuda(init=100)  # CUDA_ERROR_NO_DEVICE
    assert warm_with(monkeypatch, lib)["why"] == "cuInit returned 100"
    assert [c for c, _ in lib.calls] == ["cuInit"]
    lib = FakeCuda(retain=2)
    assert warm_with(monkeypatch, lib)["why"] == "cuDevicePrimaryCtxRetain returned 2"


def test_no_driver_library_is_a_reason_not_an_error(monkeypatch):
    monkeypatch.setattr(driver_warmup, "LIBCUDA", "libcutedebug-no-such-driver.so.1")
    got = driver_warmup.DriverWarmup.start().join(timeout=10)
    assert got["why"].startswith("libcutedebug-no-such-driver.so.1: ")


def test_only_a_fresh_worker_about_to_run_on_a_gpu_node_starts_it(monkeypatch):
    started = []
    monkeypatch.setattr(
        driver_warmup.DriverWarmup, "start", classmethod(lambda c: started.append(1) or "w")
    )
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.delenv(driver_warmup.VAR, raising=False)
    monkeypatch.setattr(driver_warmup.devices, "gpu_device_node", lambda: "/dev/nvidia0")
    assert driver_warmup.start_for("run") == "w"
    assert driver_warmup.start_for("compile") is None  # a compile-only run never touches it
    monkeypatch.setenv(driver_warmup.VAR, "0")
    assert driver_warmup.start_for("run") is None  # turned off
    monkeypatch.delenv(driver_warmup.VAR)
    monkeypatch.setitem(sys.modules, "torch", object())  # forked from a server: torch is there
    assert driver_warmup.start_for("run") is None
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(driver_warmup.devices, "gpu_device_node", lambda: None)
    assert driver_warmup.start_for("run") is None  # no GPU here
    assert started == [1]


def test_the_imported_event_carries_it_and_report_timings_show_it(monkeypatch):
    assert driver_warmup.fields(None) == {}
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeCuda())
    w = driver_warmup.DriverWarmup.start()
    w.join(timeout=10)
    f = driver_warmup.fields(w)
    assert f["driver_warmup"] is None and isinstance(f["driver_warmup_s"], float)
    o = V.Outcome()
    for ev in (
        {"event": "started", "t": 0.0, "mono0": 10.0},
        {"event": "device", "t": 1.5, "present": True},
        {"event": "imported", "t": 2.0, "driver_warmup_s": 0.42, "driver_warmup": None},
        {"event": "compiling", "t": 2.1},
        {"event": "done", "t": 3.0},
    ):
        o.add(ev)
    t = runner._timings(o, {"t_call": 9.9, "t_return": 13.2})
    assert t["driver_warmup_s"] == 0.42 and t["imports_s"] == 2.0


def test_one_still_starting_is_reported_as_such():
    gate = threading.Event()
    w = driver_warmup.DriverWarmup()
    w._thread = threading.Thread(target=gate.wait, daemon=True)
    w._thread.start()
    assert driver_warmup.fields(w) == {"driver_warmup_s": None, "driver_warmup": "still starting"}
    gate.set()
