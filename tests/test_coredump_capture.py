"""The watchdog's before-kill coredump (cutedebug.analyses.coredump.before_kill) against a fake
hung worker that answers the coredump pipe like the driver (tests/helpers/fake_core_worker.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutedebug.analyses import coredump, coredump_capture, cudagdb
from cutedebug.engine import runner, watchdog
from cutedebug.engine.scenario import Limits

FAKE = Path(__file__).parent / "helpers" / "fake_core_worker.py"
LIMITS = Limits(compile_s=30.0, deadline_s=1.0, stall_s=0.3, import_s=30.0, check_s=30.0)


@pytest.fixture
def hooked(monkeypatch):
    hooks: list = []  # the watchdog's list (runner.BEFORE_KILL is the same object)
    monkeypatch.setattr(watchdog, "BEFORE_KILL", hooks)
    monkeypatch.setattr(runner, "BEFORE_KILL", hooks)
    coredump.register_hook()
    monkeypatch.setattr(coredump_capture, "DUMP_LIMIT_S", 1.5)
    # the hook after the dump starts cuda-gdb on the core: none here (tests/test_gdb_session.py)
    monkeypatch.setattr(cudagdb, "find_cuda_gdb", lambda: None)
    return runner.BEFORE_KILL


def run_fake(tmp_path, behaviour):
    events, log = tmp_path / "events.jsonl", tmp_path / "worker.log"
    events.write_text("")
    t0 = time.monotonic()
    outcome, facts = runner.watch(
        [sys.executable, str(FAKE), str(events), behaviour], events, log, LIMITS
    )
    return outcome, facts, time.monotonic() - t0


def test_core_dumped_before_the_kill(tmp_path, hooked):
    assert hooked == [coredump.prefetch_sass, coredump.before_kill, coredump.prefetch_core]
    outcome, facts, wall = run_fake(tmp_path, "dump")
    assert outcome.killed_by_watchdog.startswith("deadline:launched")
    dump = facts["before_kill"][0]["coredump"]
    core = Path(dump["core"])
    assert core.parent == tmp_path and core.name.startswith("coredump.")
    assert dump["core_bytes"] == 64 * 1024  # waited for the second piece
    assert 0.2 <= dump["dump_s"] < 1.5
    assert coredump.cores(tmp_path) == [core]
    assert runner.tagged_processes(facts["tag"]) == []
    assert wall < LIMITS.deadline_s + 1.5 + 3


def test_no_core_is_bounded_and_still_killed(tmp_path, hooked):
    outcome, facts, wall = run_fake(tmp_path, "no_dump")
    dump = facts["before_kill"][0]["coredump"]
    assert dump["error"] == "no core written within 1.5 s of the pipe write"
    assert outcome.killed_by_watchdog.startswith("deadline:launched")
    assert runner.tagged_processes(facts["tag"]) == []
    assert wall < LIMITS.deadline_s + 1.5 + 3


def test_runs_without_a_pipe_are_left_alone(tmp_path, hooked):
    """A hung child that was not started for coredumps: the hook does nothing."""
    assert (
        coredump.before_kill(
            {"phase": "launched", "pid": 1, "events_path": str(tmp_path / "events.jsonl")}
        )
        is None
    )
    assert (
        coredump.before_kill(
            {"phase": "compiling", "pid": 1, "events_path": str(tmp_path / "events.jsonl")}
        )
        is None
    )


def test_worker_env_names_the_run_folder(tmp_path):
    env = coredump.worker_env(tmp_path)
    assert env["CUDA_COREDUMP_PIPE"] == str(tmp_path / "coredump.pipe.%p")
    assert env["CUDA_COREDUMP_FILE"] == str(tmp_path / "coredump.%p.nvcudmp")
    assert env["CUDA_ENABLE_USER_TRIGGERED_COREDUMP"] == "1"
    flags = env["CUDA_COREDUMP_GENERATION_FLAGS"].split(",")
    assert {"skip_global_memory", "skip_shared_memory", "skip_local_memory", "skip_abort"} <= set(
        flags
    )
    assert env["CUDA_COREDUMP_SHOW_PROGRESS"] == "1"  # the driver's phases, in the worker log


def test_the_dump_flags_by_environment(tmp_path, monkeypatch):
    """The flags every H200 run used unless CUTEDEBUG_COREDUMP_FLAGS names others (the GPU
    step compares the lightweight set on a big grid); skip_abort always; a name the driver
    does not know is a usage error naming the variable and the allowed names."""
    from cutedebug.errors import UsageError

    monkeypatch.delenv(coredump.FLAGS_VAR, raising=False)
    assert coredump.generation_flags() == (
        "skip_global_memory,skip_shared_memory,skip_local_memory,skip_abort"
    )
    monkeypatch.setenv(
        coredump.FLAGS_VAR,
        "skip_nonrelocated_elf_images, skip_global_memory,skip_shared_memory,"
        "skip_local_memory,skip_constbank_memory",
    )
    env = coredump.worker_env(tmp_path)
    assert env["CUDA_COREDUMP_GENERATION_FLAGS"] == (
        "skip_nonrelocated_elf_images,skip_global_memory,skip_shared_memory,skip_local_memory,"
        "skip_constbank_memory,skip_abort"
    )
    monkeypatch.setenv(coredump.FLAGS_VAR, "skip_global_memory,skip_registers")
    with pytest.raises(UsageError, match="CUTEDEBUG_COREDUMP_FLAGS=.*skip_registers not allowed"):
        coredump.worker_env(tmp_path)
    with pytest.raises(UsageError, match="skip_constbank_memory"):
        coredump.Localizer()


def test_exec_dumps_every_cuda_process_before_the_kill(tmp_path, monkeypatch):
    """`cutedebug exec --coredump`: the command's process answers its pipe (as the driver does
    with the environment exec gives it); the dump happens before the kill, the core is read
    after it (no cuda-gdb here: said so, never a localization)."""
    from cutedebug.analyses import cudagdb
    from cutedebug.commands import exec as X

    # a deadline of 3 s and a dump limit of 5 s: at load 7 a 1 s deadline could kill the fake
    # before it had opened its pipe, and the dump came back None
    monkeypatch.setattr(coredump_capture, "DUMP_LIMIT_S", 5.0)
    monkeypatch.setattr(cudagdb, "find_cuda_gdb", lambda: None)
    run_dir = tmp_path / "run"
    s = X.Settings(
        argv=[sys.executable, str(FAKE), str(run_dir / "fake_events.jsonl"), "dump"],
        deadline_s=3.0,
        coredump=True,
    )
    res = X.watch_command(s, run_dir)
    assert res.verdict.value == "HANG" and res.killed_by.startswith("deadline")
    dump = res.evidence["coredump"]["dump"]
    assert dump["core_bytes"] == 64 * 1024 and dump["dump_s"] < 5.0
    assert res.evidence["coredump"]["error"].startswith("reading the core failed: cuda-gdb not")
    assert "stuck_sites" not in res.evidence
    assert res.left == []


def test_worker_removes_its_own_coredump_pipe(tmp_path, monkeypatch):
    """A run that did not hang leaves no FIFO in its folder (a FIFO blocks file-by-file
    copies of the folder)."""
    import json
    import os

    from cutedebug.engine import worker

    for k in coredump.worker_env(tmp_path):
        monkeypatch.delenv(k, raising=False)  # worker.run sets them; undone after the test
    pipe = tmp_path / f"coredump.pipe.{os.getpid()}"
    os.mkfifo(pipe)
    req = tmp_path / "request.json"
    req.write_text(
        json.dumps(
            {
                "events": str(tmp_path / "events.jsonl"),
                "scenario": {},
                "env": coredump.worker_env(tmp_path),
            }
        )
    )
    assert worker.main([str(req)]) == 1  # a broken request: the pipe goes all the same
    assert not pipe.exists()


def start_fake(tmp_path, behaviour):
    events = tmp_path / "events.jsonl"
    events.write_text("")
    proc = subprocess.Popen([sys.executable, str(FAKE), str(events), behaviour])
    for _ in range(500):  # its pipe, and its reader (the thread started before "launched")
        if (tmp_path / f"coredump.pipe.{proc.pid}").exists() and "launched" in events.read_text():
            time.sleep(0.05)
            return proc
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("the fake worker made no coredump pipe")


def closed_at(tmp_path, pid) -> float:
    """When the fake worker closed its core (its note, written right after the close)."""
    f = tmp_path / f"closed.{pid}"
    for _ in range(300):
        if f.exists() and f.read_text():
            return float(f.read_text())
        time.sleep(0.01)
    raise AssertionError("the fake worker never closed its core")


@pytest.mark.parametrize("behaviour", ["dump", "dump_pause", "dump_child", "dump_reopen"])
def test_the_dump_is_complete_once_the_worker_closed_the_core(tmp_path, behaviour):
    """The core is complete when the worker (the driver in it, or a process of its own) closed
    it and it is as long as its ELF header says, not after a quiet 0.3 s: a pause in the
    writing while the file is open, or while it is closed half-written, is waited out (the
    whole 64 KiB), and the wait ends within ~0.1 s of the close, where a quiet 0.3 s ends
    0.3 s after it."""
    proc = start_fake(tmp_path, behaviour)
    try:
        dump = coredump.trigger(proc.pid, tmp_path, limit_s=5.0, alive=lambda: True)
        t_done = time.monotonic()
        assert dump["core_bytes"] == 64 * 1024 and dump["complete"] == "closed"
        assert 0 <= t_done - closed_at(tmp_path, proc.pid) < 0.28
    finally:
        proc.kill()
        proc.wait()


def test_without_proc_the_dump_is_complete_when_it_stops_growing(tmp_path, monkeypatch):
    monkeypatch.setattr(coredump_capture, "held_open", lambda pid, paths: None)
    monkeypatch.setattr(coredump_capture, "STABLE_S", 0.8)  # > the fake's 0.2 s between its pieces
    proc = start_fake(tmp_path, "dump")
    try:
        dump = coredump.trigger(proc.pid, tmp_path, limit_s=5.0, alive=lambda: True)
        t_done = time.monotonic()
        assert dump["core_bytes"] == 64 * 1024 and dump["complete"] == "stable"
        assert t_done - closed_at(tmp_path, proc.pid) >= 0.8 - 0.05
    finally:
        proc.kill()
        proc.wait()


def test_an_elf_file_is_complete_when_its_header_tables_fit_in_it(tmp_path):
    """coredump_capture.elf_complete against real ELF files (this Python and its truncated
    copies) and headers written here."""
    import struct

    from cutedebug.analyses.coredump_capture import elf_complete

    real = Path(sys.executable).resolve().read_bytes()
    assert real[:4] == b"\x7fELF"
    for n, want in [(len(real), True), (len(real) - 1, False), (40, False), (3, None)]:
        f = tmp_path / f"elf{n}"
        f.write_bytes(real[:n])
        assert elf_complete(f) is want, n
    (tmp_path / "text").write_text("not an ELF file at all" * 10)
    assert elf_complete(tmp_path / "text") is None

    def header(shoff, shnum, size):
        h = bytearray(size)
        h[:6] = b"\x7fELF\x02\x01"
        struct.pack_into("<QQ", h, 32, 0, shoff)
        struct.pack_into("<HHHH", h, 54, 56, 0, 64, shnum)
        return h

    f = tmp_path / "ext"  # more sections than e_shnum holds: entry 0's sh_size counts them
    h = header(128, 0, 128 + 64)
    struct.pack_into("<Q", h, 128 + 32, 3)
    f.write_bytes(bytes(h))
    assert elf_complete(f) is False
    f.write_bytes(bytes(h) + bytes(128))
    assert elf_complete(f) is True
    f.write_bytes(bytes(header(0, 0, 64)))  # no tables at all (the fake cores above)
    assert elf_complete(f) is True


def test_through_the_watchdog_cuda_gdb_is_loading_the_core_before_the_kill(
    tmp_path, hooked, monkeypatch
):
    """The hooks in the real watchdog: the dump, then prefetch_core starts cuda-gdb (here the
    fake one answering with the H200's outputs for tma_stream's core) before the kill; the
    reading after it takes that session: one cuda-gdb, nothing left behind by the kill."""
    import gzip
    import json

    from cutedebug.instrument import waitsites
    from tests.test_gdb_session import fake_gdb, pids, started

    monkeypatch.setattr(coredump, "SESSION_FAILED", "")
    doc = json.loads(
        gzip.open(
            Path(__file__).parent
            / "data/coredump/h200-runs/tma_stream__wrong_expect_tx_plus.json.gz",
            "rt",
        ).read()
    )
    gdb_dir = tmp_path / "gdb"
    gdb_dir.mkdir()
    exe, starts = fake_gdb(gdb_dir, doc["passes"])
    monkeypatch.setattr(cudagdb, "find_cuda_gdb", lambda: exe)
    try:
        outcome, facts, _ = run_fake(tmp_path, "dump")
        core = Path(facts["before_kill"][0]["coredump"]["core"])
        assert outcome.killed_by_watchdog.startswith("deadline:launched")
        assert len(started(starts, 1)) == 1  # started before the kill, by the hook
        assert list(coredump._SESSIONS) == [str(core.resolve())]
        assert runner.tagged_processes(facts["tag"]) == []  # the worker's tree is gone
        rep = coredump.read_core(
            core,
            sass_text=doc["sass"],
            wait_sites=waitsites.sites_from_json(doc["wait_sites"]),
            checkpoint_sites=doc["checkpoint_sites"],
        )
        assert rep.prefetched is not None and rep.processes == 1 and rep.passes == 2
        assert len(pids(starts)) == 1 and coredump._SESSIONS == {}
    finally:
        coredump.close_prefetched()
