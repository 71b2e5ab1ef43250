"""devices.EarlyContext (#22): the worker's CUDA context made through libcuda in a thread
beside torch's import, with a stand-in libcuda on the CPU; its seconds are measured on the
H200 by gpu_pending's cold_ctx step (pool_bench --early-context)."""

from __future__ import annotations

import ctypes
import sys

import pytest

from cutedebug import devices
from cutedebug.event_kinds import Device


class FakeCuda:
    """libcuda's three calls: each returns ``codes[name]`` (0: success) and is recorded."""

    def __init__(self, **codes: int):
        self.codes, self.calls = codes, []
        for name in ("cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain"):
            setattr(self, name, self._call(name))

    def _call(self, name):
        def call(*args):
            self.calls.append(name)
            return self.codes.get(name, 0)

        return call


def _fresh(monkeypatch, lib=None, error: Exception | None = None):
    """A fresh run worker's view: torch not imported, a device node, the variable set."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(devices, "gpu_device_node", lambda: "/dev/nvidiactl")
    monkeypatch.setenv(devices.EARLY_CONTEXT_VAR, "1")

    def cdll(name):
        assert name == "libcuda.so.1"
        if error is not None:
            raise error
        return lib

    monkeypatch.setattr(ctypes, "CDLL", cdll)


def test_made_in_the_order_the_driver_needs(monkeypatch):
    lib = FakeCuda()
    _fresh(monkeypatch, lib)
    early = devices.EarlyContext.start("run")
    assert early is not None
    got = early.join(timeout=5)
    assert got["early_context"] == "made" and got["early_context_s"] >= 0
    assert lib.calls == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain"]
    Device(present=True, **got)  # the device event carries it


def test_a_driver_error_stops_there_and_says_which_call(monkeypatch):
    lib = FakeCuda(cuDeviceGet=101)  # CUDA_ERROR_INVALID_DEVICE
    _fresh(monkeypatch, lib)
    got = devices.EarlyContext.start("run").join(timeout=5)
    assert got["early_context"] == "cuDeviceGet returned CUDA error 101"
    assert lib.calls == ["cuInit", "cuDeviceGet"]


def test_no_libcuda_is_a_fact_not_a_crash(monkeypatch):
    _fresh(monkeypatch, error=OSError("libcuda.so.1: cannot open shared object file"))
    got = devices.EarlyContext.start("run").join(timeout=5)
    assert got["early_context"].startswith("libcuda: libcuda.so.1: cannot open")


@pytest.mark.parametrize(
    "why",
    ["compile-only", "variable unset", "variable 0", "torch imported", "no device node"],
)
def test_not_started(monkeypatch, why):
    lib = FakeCuda()
    _fresh(monkeypatch, lib)
    mode = "compile" if why == "compile-only" else "run"
    if why == "variable unset":
        monkeypatch.delenv(devices.EARLY_CONTEXT_VAR)
    if why == "variable 0":
        monkeypatch.setenv(devices.EARLY_CONTEXT_VAR, "0")
    if why == "torch imported":  # a worker forked from a server: its context takes ms
        monkeypatch.setitem(sys.modules, "torch", object())
    if why == "no device node":
        monkeypatch.setattr(devices, "gpu_device_node", lambda: None)
    assert devices.EarlyContext.start(mode) is None
    assert lib.calls == []


def test_still_running_is_said(monkeypatch):
    import threading

    gate = threading.Event()
    lib = FakeCuda()
    lib.cuInit = lambda *a: gate.wait(5) and 0
    _fresh(monkeypatch, lib)
    early = devices.EarlyContext.start("run")
    assert early.join(timeout=0.0)["early_context"] == "still running"
    gate.set()
    assert early.join(timeout=5)["early_context"] == "made"
