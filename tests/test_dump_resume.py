"""tools/dump_resume.py (#25: is a user-triggered coredump harmless to a running kernel?):
its answers from a stand-in GPU on the CPU; the measurement itself is gpu_pending's
dump_resume step."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import dump_resume as D  # noqa: E402
import gpu_pending  # noqa: E402


class FakeGpu:
    """A kernel that spins until its flags are stored, then writes y; ``dump_does`` says what
    a dump does to it: "nothing", "halt" (never ends) or "error" (the next query raises)."""

    def __init__(self, dump_does: str = "nothing", wrong: int = 0):
        self.dump_does, self.wrong = dump_does, wrong
        self.released = self.halted = self.broken = False
        self.tensors = None
        gpu = self

        class Event:
            def __init__(self):
                self.kind = None

            def record(self, stream=None):
                self.kind = "copy" if stream is not None else "kernel"

            def query(self):
                if gpu.broken:
                    raise RuntimeError("CUDA error: unspecified launch failure\nmore")
                if self.kind == "copy":
                    gpu.released = True
                    gpu.finish()
                    return True
                return gpu.released and not gpu.halted

        self.cuda = SimpleNamespace(
            Event=Event,
            Stream=lambda: object(),
            stream=lambda s: contextlib.nullcontext(),
            synchronize=lambda: None,
        )
        self.torch = SimpleNamespace(
            cuda=self.cuda, isclose=torch.isclose, ones_like=torch.ones_like
        )

    def finish(self):
        if not self.halted and self.tensors is not None:
            t = self.tensors
            t["y"].copy_(t["x"] * 2.0 + 1.0)
            t["y"][: self.wrong] += 1.0

    def trigger(self, pid, run_dir, limit_s):
        assert pid == os.getpid()
        self.halted = self.dump_does == "halt"
        self.broken = self.dump_does == "error"
        return {"dump_s": 0.4, "complete": "closed", "core_bytes": 1000}


class Kernel:
    def __init__(self, gpu: FakeGpu):
        self.gpu = gpu

    def make_inputs(self, device):
        x = torch.arange(8, dtype=torch.float32)
        t = {"x": x, "flags": torch.zeros(2, dtype=torch.int32), "y": torch.full_like(x, 0.5)}
        self.gpu.tensors = t
        return t

    def cute_args(self, t):
        return (t,)

    def output(self, t):
        return t["y"]

    def reference(self, t):
        return t["x"] * 2.0 + 1.0


def _side(monkeypatch, tmp_path, name, **kw):
    gpu = FakeGpu(**kw)
    monkeypatch.setattr(D, "ask_dump", gpu.trigger)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    return D.side(name, Kernel(gpu), lambda *a: None, gpu.torch, tmp_path, 0.0, 0.05)


def test_the_control_and_a_harmless_dump_read_resumed_with_the_right_values(monkeypatch, tmp_path):
    for name in ("control", "dump"):
        row = _side(monkeypatch, tmp_path, name)
        assert row["before_release"] == {"ended": False, "error": None}  # it spins
        assert row["kernel"]["ended"] is True and row["kernel"]["wrong_elements"] == 0
        assert row["answer"] == "resumed, right values"
        assert ("dump" in row) == (name == "dump")
    assert row["dump"]["complete"] == "closed" and row["after_dump"]["ended"] is False


def test_a_dump_that_halts_breaks_or_corrupts_the_kernel_says_so(monkeypatch, tmp_path):
    row = _side(monkeypatch, tmp_path, "dump", dump_does="halt")
    assert row["kernel"]["ended"] is False
    assert row["answer"] == "did not end within 0.05 s of the flags"
    row = _side(monkeypatch, tmp_path, "dump", dump_does="error")
    assert row["after_dump"]["ended"] is None
    assert row["answer"] == "CUDA error: RuntimeError: CUDA error: unspecified launch failure"
    row = _side(monkeypatch, tmp_path, "dump", wrong=3)
    assert row["answer"] == "resumed, 3 wrong values"


def test_without_a_gpu_it_says_so_and_sets_the_workers_coredump_settings(
    monkeypatch, tmp_path, capsys
):
    for k in D.coredump_capture.worker_env(tmp_path):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # main() sets them: keep ours clean
    assert D.main(["--out", str(tmp_path / "dr")]) == 0
    assert capsys.readouterr().out.strip() == "no GPU"
    assert os.environ["CUDA_ENABLE_USER_TRIGGERED_COREDUMP"] == "1"
    assert os.environ["CUDA_COREDUMP_PIPE"].startswith(str(tmp_path / "dr"))
    step = gpu_pending.BY_NAME["dump_resume"]
    assert "tools/dump_resume.py" in step.command and step.command.startswith("timeout ")
    assert "dump_resume" in gpu_pending.PRIORITY


def test_the_dump_is_asked_from_another_process(tmp_path):
    """ask_dump runs coredump_capture.trigger in a helper process, as the watchdog does: here
    no driver made the pipe, so the helper's answer is trigger's error, not an exception."""
    facts = D.ask_dump(os.getpid(), tmp_path, 0.5)
    assert "error" in facts and facts["pipe"].endswith(f".{os.getpid()}"), facts


def test_every_side_is_accepted_and_a_wrong_one_named(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(os, "environ", dict(os.environ))
    for sides in ("control,dump", "pause", "dump,pause"):
        assert D.main(["--out", str(tmp_path / "dr"), "--sides", sides, "--work-s", "1"]) == 0
    with pytest.raises(SystemExit):
        D.main(["--out", str(tmp_path / "dr"), "--sides", "control,nap"])
    assert "--sides: 'control,nap'; allowed: control, dump, pause" in capsys.readouterr().err
