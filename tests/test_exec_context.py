"""A CUDA error that surfaces in a library after a CuTe DSL kernel faulted: exec names it from
the process's own reading of its CUDA context (instrument/launch_context.py), never guesses it,
and never blames a kernel for a library error with a healthy context
(engine/cuda_verdict.py).

The sample is the H200's: `cutedebug mutate` over examples/test_field_libs.py (2026-12-02)
reported three faulted mutants (quack's GEMM twice, FA-4's forward once) as
``cudaErrorUnknown: E RuntimeError: CUDA error: CUBLAS_STATUS_INTERNAL_ERROR when calling
`cublasCreate(handle)``` (tests/data/mutate/h200_crash_mutants.jsonl, from its results.jsonl):
the name was guessed from the word "CUDA error", and the line pointed at cuBLAS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from helpers.exec_results import exec_result

from cutedebug.engine import command as C
from cutedebug.engine import cuda_verdict as CV
from cutedebug.engine import verdict as V
from cutedebug.engine.run_report import ExecReport
from cutedebug.instrument import launch_context as LC

ROOT = Path(__file__).resolve().parents[1]
H200 = [
    json.loads(x)
    for x in (ROOT / "tests" / "data" / "mutate" / "h200_crash_mutants.jsonl")
    .read_text()
    .splitlines()
]
GUESSED = "cudaErrorUnknown: "  # what the H200 run's reasons start with: the old guess


def h200_line(rec):
    """The program's line the H200 run captured (its reason without the guessed name)."""
    assert rec["reason"].startswith(GUESSED)
    return rec["reason"][len(GUESSED) :]


def result(tmp_path, tail, rc=1, events=()):
    """An exec result of one watched process (pid 7) with these events and this output."""
    return exec_result(tmp_path, events, rc, log_tail=tail)


def reading(state, kernel, error=None, **kw):
    return {"event": "cuda_context", "state": state, "error": error, "kernel": kernel, **kw}


def classified(tmp_path, tail, rc=1, events=()):
    res = result(tmp_path, tail, rc, events)
    C.classify(res)
    return res


def test_the_h200_samples_are_three_guessed_names_of_a_cublas_status():
    assert [r["id"] for r in H200] == [
        "t3.p0.missing_phase_flip.producer",
        "t3.p1.skip_producer_tail",
        "t5.p1.missing_phase_flip.producer",
    ]
    for rec in H200:
        lib = CV.library_status(h200_line(rec))
        assert (lib.library, lib.call, lib.status) == (
            "cuBLAS",
            "cublasCreate",
            "CUBLAS_STATUS_INTERNAL_ERROR",
        )
        # the output names no CUDA error: nothing to name it by but the context
        assert CV.named_in_output(h200_line(rec)) is None


@pytest.mark.parametrize("rec", H200, ids=lambda r: r["id"])
def test_a_sticky_error_read_from_the_context_names_the_crash_and_the_kernel(tmp_path, rec):
    kernel = rec["sites"][0]["kernel"]  # GemmSm90.kernel / FlashAttentionForwardSm90.kernel
    tail = f"examples/test_field_libs.py F\n{h200_line(rec)}\n1 failed, 3 deselected in 20.26s\n"
    ctx = reading(
        "error",
        kernel,
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        message="an illegal memory access was encountered",
        via="cuStreamQuery(legacy default stream)",
        when="exit",
    )
    res = classified(tmp_path, tail, events=[reading("launched", kernel), ctx])
    assert res.verdict is V.Verdict.CRASH
    assert res.reason == (
        f"cudaErrorIllegalAddress: the kernel {kernel} faulted (surfaced later in cuBLAS's "
        "cublasCreate: CUBLAS_STATUS_INTERNAL_ERROR)"
    )
    ce = res.evidence["cuda_error"]
    assert ce["name"] == "cudaErrorIllegalAddress" and ce["kernel"] == kernel
    assert ce["line"] == h200_line(rec).strip() and "cuStreamQuery" in ce["read_by"]
    assert "cudaErrorUnknown" not in json.dumps(res.evidence)
    # a CUDA error line before the library's status: the first word the program said
    torch_first = (
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n" + tail
    )
    res = classified(tmp_path, torch_first, events=[ctx])
    assert res.reason == (
        f"cudaErrorIllegalAddress: the kernel {kernel} faulted (surfaced later: "
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered)"
    )
    # the same with the other errors a fault leaves: the driver's name read, the runtime's told
    for driver, runtime in (
        ("CUDA_ERROR_LAUNCH_FAILED", "cudaErrorLaunchFailure"),
        ("CUDA_ERROR_ILLEGAL_INSTRUCTION", "cudaErrorIllegalInstruction"),
    ):
        res = classified(tmp_path, tail, events=[{**ctx, "error": driver}])
        assert res.reason.startswith(f"{runtime}: the kernel {kernel} faulted (surfaced later")


def test_a_library_status_with_a_healthy_context_is_the_programs_fail_not_a_kernel_fault(
    tmp_path,
):
    tail = f"{h200_line(H200[0])}\n1 failed in 20.26s\n"
    for state in ("ok", "busy"):
        res = classified(
            tmp_path, tail, events=[reading(state, "GemmSm90.kernel", via="x", when="exit")]
        )
        assert res.verdict is V.Verdict.FAIL, res.reason
        assert "cuBLAS's cublasCreate returned CUBLAS_STATUS_INTERNAL_ERROR" in res.reason
        assert "not a kernel fault" in res.reason and "cuda_error" not in res.evidence
        assert res.evidence["library_error"]["status"] == "CUBLAS_STATUS_INTERNAL_ERROR"
        assert res.evidence["last_lines"].endswith("1 failed in 20.26s")


def test_an_unread_context_is_said_plainly_never_a_guessed_name(tmp_path):
    tail = f"{h200_line(H200[0])}\n"
    cases = [
        ([], "no process of the command launched a CuTe DSL kernel: no context was read"),
        (
            [reading("launched", "GemmSm90.kernel")],  # killed, or died before its exit
            "pid 7 launched a CuTe DSL kernel and ended before its context was read",
        ),
        (
            [reading("unread", "GemmSm90.kernel", why="cuCtxGetCurrent: CUDA_ERROR_DEINITIALIZED")],
            "cutedebug could not read the CUDA context of pid 7: cuCtxGetCurrent: "
            "CUDA_ERROR_DEINITIALIZED",
        ),
    ]
    for events, why in cases:
        res = classified(tmp_path, tail, events=events)
        assert res.verdict is V.Verdict.CRASH
        assert res.reason == (
            "CUDA error, name not read: cuBLAS's cublasCreate returned "
            f"CUBLAS_STATUS_INTERNAL_ERROR ({why})"
        )
        assert res.evidence["cuda_error"]["name"] is None
    # a healthy reading beside one that was never made (pid 8 killed) is no proof of health
    healthy = reading("ok", "a", via="x", when="exit")
    assert classified(tmp_path, tail, events=[healthy]).verdict is V.Verdict.FAIL
    res = classified(tmp_path, tail, events=[healthy, {**reading("launched", "b"), "pid": 8}])
    assert res.verdict is V.Verdict.CRASH and "pid 8 launched a CuTe DSL kernel" in res.reason


def test_names_the_output_gives_are_kept_and_nothing_else_is_guessed(tmp_path):
    torch_msg = "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
    assert classified(tmp_path, torch_msg).reason == f"cudaErrorIllegalAddress: {torch_msg}"
    drv = "cuda.bindings error CUDA_ERROR_MISALIGNED_ADDRESS in cuStreamSynchronize"
    assert classified(tmp_path, drv).reason.startswith("cudaErrorMisalignedAddress: ")
    unknown = "RuntimeError: CUDA error: unknown error"  # cudaErrorUnknown's own message
    assert classified(tmp_path, unknown).reason.startswith("cudaErrorUnknown: ")
    odd = "RuntimeError: CUDA error: something this table has never seen"
    res = classified(tmp_path, odd)
    assert res.verdict is V.Verdict.CRASH and res.reason.startswith("CUDA error, name not read: ")
    # the probe monitor's name (from torch's message of the sticky error) before a guess
    mon = {
        "event": "cuda_error",
        "name": "cudaErrorIllegalAddress",
        "message": "CUDA error: an illegal memory access was encountered",
        "surfaced": "probe monitor",
    }
    res = classified(tmp_path, h200_line(H200[0]), events=[mon])
    assert res.reason.startswith("cudaErrorIllegalAddress: raised in pid 7")
    # a program that swallowed the error and exited 0: the context still tells
    ctx = reading("error", "K.kernel", "CUDA_ERROR_ASSERT", when="exit", via="x")
    res = classified(tmp_path, "all good\n", rc=0, events=[ctx])
    assert res.verdict is V.Verdict.CRASH
    assert res.reason == (
        "cudaErrorAssert: the kernel K.kernel faulted (read from pid 7's CUDA context at exit; "
        "exit status 0)"
    )
    assert classified(tmp_path, "all good\n", rc=0).verdict is V.Verdict.PASS


def test_library_statuses_as_the_libraries_and_torch_print_them():
    cases = {
        "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling "
        "`cublasLtMatmul( ltHandle, computeDesc.descriptor(), ...)`": (
            "cuBLAS",
            "cublasLtMatmul",
            "CUBLAS_STATUS_EXECUTION_FAILED",
        ),
        "RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR": (
            "cuDNN",
            None,
            "CUDNN_STATUS_INTERNAL_ERROR",
        ),
        "RuntimeError: cusolver error: CUSOLVER_STATUS_INTERNAL_ERROR, when calling "
        "`cusolverDnCreate(handle)`": (
            "cuSOLVER",
            "cusolverDnCreate",
            "CUSOLVER_STATUS_INTERNAL_ERROR",
        ),
        "RuntimeError: cuFFT error: CUFFT_INTERNAL_ERROR": ("cuFFT", None, "CUFFT_INTERNAL_ERROR"),
    }
    for text, want in cases.items():
        lib = CV.library_status(text)
        assert (lib.library, lib.call, lib.status) == want, text
    assert CV.library_status("CUDA error: an illegal memory access was encountered") is None


class FakeDriver:
    """cuda.bindings.driver as far as read_context uses it, recording every call: a context
    current or not, a primary context active or not, and cuStreamQuery's answer."""

    def __init__(self, answer, current=0x1234, active=True):
        from enum import Enum

        names = ["CUDA_SUCCESS", "CUDA_ERROR_NOT_READY", "CUDA_ERROR_ILLEGAL_ADDRESS"]
        names += ["CUDA_ERROR_DEINITIALIZED"]
        self.CUresult = Enum("CUresult", {n: i for i, n in enumerate(names)})
        self.answer, self.current, self.active = answer, current, active
        self.calls = []

    def _call(self, name, *out):
        self.calls.append(name)
        return (self.CUresult.CUDA_SUCCESS, *out)

    def CUstream(self, handle):
        return handle

    def cuCtxGetCurrent(self):
        return self._call("cuCtxGetCurrent", self.current)

    def cuDeviceGetCount(self):
        return self._call("cuDeviceGetCount", 1)

    def cuDeviceGet(self, i):
        return self._call("cuDeviceGet", i)

    def cuDevicePrimaryCtxGetState(self, dev):
        return self._call("cuDevicePrimaryCtxGetState", 0, self.active)

    def cuDevicePrimaryCtxRetain(self, dev):
        return self._call("cuDevicePrimaryCtxRetain", 0x5678)

    def cuCtxPushCurrent(self, ctx):
        return self._call("cuCtxPushCurrent")

    def cuCtxPopCurrent(self):
        return self._call("cuCtxPopCurrent", 0x5678)

    def cuDevicePrimaryCtxRelease(self, dev):
        return self._call("cuDevicePrimaryCtxRelease")

    def cuStreamQuery(self, stream):
        self.calls.append("cuStreamQuery")
        return (self.CUresult[self.answer],)

    def cuGetErrorString(self, res):
        return self._call("cuGetErrorString", b"an illegal memory access was encountered")


def with_driver(monkeypatch, drv):
    """The fake as the module: only its calls exist (a synchronize would be AttributeError)."""
    mod = types.ModuleType("cuda.bindings.driver")
    for name in dir(type(drv)):
        if name.startswith("cu") or name in ("CUstream",):
            setattr(mod, name, getattr(drv, name))
    mod.CUresult = drv.CUresult
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", mod)
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = mod
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    if "cuda" in sys.modules:
        # `import cuda.bindings.driver as drv` reaches the module through the attributes of an
        # imported cuda package (a test before this one in the worker imported cutlass)
        monkeypatch.setattr(sys.modules["cuda"], "bindings", bindings, raising=False)
    monkeypatch.delenv(LC.FAKE_ENV, raising=False)


def test_the_query_reads_the_sticky_error_without_waiting(monkeypatch):
    drv = FakeDriver("CUDA_ERROR_ILLEGAL_ADDRESS")
    with_driver(monkeypatch, drv)
    out = LC.read_context()
    assert out["state"] == "error" and out["error"] == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert out["message"] == "an illegal memory access was encountered"
    assert drv.calls == ["cuCtxGetCurrent", "cuStreamQuery", "cuGetErrorString"]
    drv = FakeDriver("CUDA_ERROR_NOT_READY")  # a kernel still running: asked, not awaited
    with_driver(monkeypatch, drv)
    assert LC.read_context()["state"] == "busy" and drv.calls[-1] == "cuStreamQuery"
    # no context current in this thread: the active primary context, retained and given back
    drv = FakeDriver("CUDA_SUCCESS", current=0)
    with_driver(monkeypatch, drv)
    assert LC.read_context()["state"] == "ok"
    assert drv.calls[-3:] == ["cuStreamQuery", "cuCtxPopCurrent", "cuDevicePrimaryCtxRelease"]
    drv = FakeDriver("CUDA_SUCCESS", current=0, active=False)  # none: none is created
    with_driver(monkeypatch, drv)
    assert LC.read_context()["state"] == "none" and "cuStreamQuery" not in drv.calls
    drv = FakeDriver("CUDA_ERROR_DEINITIALIZED")  # the driver already shut down: unread
    with_driver(monkeypatch, drv)
    out = LC.read_context()
    assert out["state"] == "unread" and "CUDA_ERROR_DEINITIALIZED" in out["why"]


def test_the_check_runs_once_in_the_launching_process_and_names_the_runtime_error(
    monkeypatch, tmp_path
):
    events = []
    launches = LC.Launches(lambda kind, **kw: events.append({"event": kind, **kw}), os.getpid())
    monkeypatch.setenv(LC.FAKE_ENV, "CUDA_ERROR_ILLEGAL_ADDRESS")
    monkeypatch.setattr(LC, "install", lambda launches: None)  # no atexit in the test process
    LC.note_launch(launches, ["GemmSm90.kernel"])
    assert events == [{"event": "cuda_context", "state": "launched", "kernel": "GemmSm90.kernel"}]
    LC.check(launches, "exit")
    assert LC.check(launches, "exit") is None  # once
    _, ctx, err = events
    assert ctx["state"] == "error" and ctx["kernel"] == "GemmSm90.kernel"
    assert err == {
        "event": "cuda_error",
        "name": "cudaErrorIllegalAddress",
        "message": "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered",
        "surfaced": "cutedebug's query of the CUDA context at exit",
        "kernel": "GemmSm90.kernel",
    }
    other = LC.Launches(events.append, os.getpid() + 1)  # a forked child: not its context
    assert LC.check(other, "os._exit") is None and not other.checked


def cutedebug_exec(tmp_path, *args, fake=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(LC.FAKE_ENV, None)
    if fake is not None:
        env[LC.FAKE_ENV] = fake
    out = subprocess.run(
        [sys.executable, "-m", "cutedebug", "exec", "--runs-dir", str(tmp_path), "--", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=str(ROOT),
    )
    report = next(Path(tmp_path).glob("exec-*/report.json"))
    rep = ExecReport.from_json(json.loads(report.read_text()))
    report.rename(report.with_suffix(".seen"))
    return out.returncode, out.stdout + out.stderr, rep


def test_exec_end_to_end_names_the_fault_behind_a_cublas_status(tmp_path):
    """`cutedebug exec` on a program that fails the way the H200's mutants did, its context's
    answer faked (the child's own query code runs, at exit and at os._exit)."""
    prog = [sys.executable, str(ROOT / "tests" / "exec_targets" / "cublas_error.py")]
    want = (
        "cudaErrorIllegalAddress: the kernel GemmSm90.kernel faulted (surfaced later in "
        "cuBLAS's cublasCreate: CUBLAS_STATUS_INTERNAL_ERROR)"
    )
    for extra in ([], ["--os-exit"], ["--fork"]):
        rc, text, rep = cutedebug_exec(
            tmp_path, *prog, *extra, fake="CUDA_ERROR_ILLEGAL_ADDRESS@GemmSm90.kernel"
        )
        assert rc == 1 and rep.verdict == "CRASH" and rep.reason == want, text
        assert f"CRASH (EXPECTED PASS) — {' '.join(prog + extra)}: {want}" in text
        (proc,) = rep.processes  # the forked child ended by os._exit without a reading
        assert proc.cuda_context["when"] == ("os._exit" if extra == ["--os-exit"] else "exit")
        assert [e["name"] for e in proc.cuda_errors] == ["cudaErrorIllegalAddress"]
    rc, text, rep = cutedebug_exec(tmp_path, *prog, fake="CUDA_SUCCESS@GemmSm90.kernel")
    assert rc == 1 and rep.verdict == "FAIL" and "not a kernel fault" in rep.reason, text
    rc, text, rep = cutedebug_exec(tmp_path, *prog)  # nothing launched, nothing read
    assert rep.verdict == "CRASH" and rep.reason.startswith("CUDA error, name not read: ")
    assert "cudaErrorUnknown" not in text


def test_traced_kernels_are_tagged_with_their_python_names(tmp_path):
    """A compiled function carries the Python names of its kernels (what a fault found later
    is blamed on): kernels/tma_stream.py compiled for sm_90a in an exec'd process."""
    prog = ROOT / "tests" / "exec_targets" / "compile_tagged.py"
    rc, text, rep = cutedebug_exec(tmp_path, sys.executable, str(prog))
    assert rc == 0 and rep.verdict == "PASS", text
    assert "launch wrapped before any trace True" in rep.log_tail
    assert "kernels ('TmaStream.kernel',) launch wrapped True" in rep.log_tail
