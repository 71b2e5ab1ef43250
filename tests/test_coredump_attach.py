"""coredump_attach (#25, CUTEDEBUG_COREDUMP_READ=attach): a hung worker read through cuda-gdb
attached to it before the kill, the driver's dump only when that fails.

The cuda-gdb here is tests/helpers/fake_cuda_gdb.py answering with what cuda-gdb 13.0 printed
on the H200 for the reader's rounds (tests/data/coredump/h200-runs/); that an attach to a live
hung worker prints the same tables is the H200's answer in
reports/2026-12-02-h200-s6/call5 (tools/attach_probe.py), not this file's.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
from pathlib import Path

import pytest

from cutedebug.analyses import coredump, coredump_attach, coredump_capture, cudagdb
from cutedebug.analyses import coredump_evidence as E
from cutedebug.engine import lifeline
from cutedebug.engine import verdict as V
from cutedebug.engine import watchdog as W
from cutedebug.errors import UsageError
from cutedebug.event import Event
from cutedebug.instrument import waitsites
from tests.helpers.replay_gdb import PassReplay
from tests.test_gdb_session import fake_gdb, gone, pids, read

RUNS = Path(__file__).parent / "data" / "coredump" / "h200-runs"
NAME = "tma_stream__wrong_expect_tx_plus"


def recorded(name: str = NAME) -> dict:
    return json.loads(gzip.open(RUNS / f"{name}.json.gz", "rt").read())


def core_reading(doc: dict, monkeypatch):
    """The reference: the same recorded rounds read as a core's (no process, PassReplay)."""
    monkeypatch.setattr(coredump, "gdb_session", PassReplay(doc["passes"]).session)
    return read(doc)


def run_folder(tmp_path: Path, doc: dict) -> tuple[Path, dict]:
    """A coredump run's folder as its worker leaves it at the kill: the cubin kept, the events
    (the compile's wait table, the checkpoint sites, the launch); the hook's context."""
    d = tmp_path / "run"
    d.mkdir()
    (d / "kernel.cubin").write_bytes(b"\x7fELF")
    events = [
        Event.of("compiled", 1.0, wait_sites=doc["wait_sites"]).to_json(),
        Event.of("checkpoint_sites", 1.1, sites=doc["checkpoint_sites"]).to_json(),
        Event.of("launched", 1.2).to_json(),
    ]
    path = d / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + '{"event": "prog')
    return d, {"phase": "launched", "events_path": str(path), "pid": 4242, "tag": "t"}


@pytest.fixture
def attach_env(tmp_path, monkeypatch):
    """The recorded run's rounds behind a fake cuda-gdb, and its SASS as nvdisasm's."""
    doc = recorded()
    exe, starts = fake_gdb(tmp_path, doc["passes"], argv=str(tmp_path / "argv.jsonl"))
    monkeypatch.setattr(cudagdb, "find_cuda_gdb", lambda: exe)
    monkeypatch.setattr(coredump, "_prefetched_sass", lambda d, info: lambda: doc["sass"])
    return doc, starts, tmp_path / "argv.jsonl"


def test_the_mode_is_attach_unless_dump_is_asked(monkeypatch):
    monkeypatch.delenv(coredump_attach.READ_VAR, raising=False)
    assert coredump_attach.read_mode() == "attach"
    monkeypatch.setenv(coredump_attach.READ_VAR, "")
    assert coredump_attach.read_mode() == "attach"
    monkeypatch.setenv(coredump_attach.READ_VAR, "dump")
    assert coredump_attach.read_mode() == "dump"
    monkeypatch.setenv(coredump_attach.READ_VAR, "gdb")
    with pytest.raises(UsageError, match=r"CUTEDEBUG_COREDUMP_READ='gdb': allowed values are"):
        coredump_attach.read_mode()
    with pytest.raises(UsageError, match="dump, attach"):
        coredump.Localizer()  # before any run


def test_the_session_attaches_without_the_host_libraries():
    gdb = cudagdb.GdbSession("process 4242", "cuda-gdb", pid=4242)
    argv = gdb.argv
    assert argv[argv.index("-iex") + 1] == "set auto-solib-add off"
    assert argv[-2:] == ["-ex", "attach 4242"] and not any("cudacore" in a for a in argv)
    core = cudagdb.GdbSession("core.nvcudmp", "cuda-gdb").argv
    assert "-iex" not in core and core[-1] == "target cudacore core.nvcudmp"


def test_the_tables_come_from_the_events_written_so_far(tmp_path):
    doc = recorded()
    d, ctx = run_folder(tmp_path, doc)
    wait, cps = coredump_attach.tables(ctx["events_path"])
    assert [w.to_json() for w in wait] == [
        w.to_json() for w in waitsites.sites_from_json(doc["wait_sites"])
    ]
    assert cps == doc["checkpoint_sites"]
    assert coredump_attach.tables(tmp_path / "none.jsonl") == ([], [])


def test_attached_reading_gives_the_cores_evidence(tmp_path, monkeypatch, attach_env):
    """The hook reads the live worker (one cuda-gdb, attached, detached by its quit), takes no
    dump, and analyse then gives the evidence reading the same rounds from a core gives."""
    doc, starts, argv_file = attach_env
    dumps = []
    monkeypatch.setattr(coredump_capture, "before_kill", lambda ctx: dumps.append(ctx) or {})
    d, ctx = run_folder(tmp_path, doc)
    got = coredump.attach_or_dump(ctx)
    assert dumps == [], "no dump when the attached reading worked"
    assert got["attach"]["warps"] > 0 and len(got["attach"]["rounds_s"]) == 2
    assert len(pids(starts)) == 1 and all(gone(p) for p in pids(starts))
    argv = json.loads(argv_file.read_text().splitlines()[0])
    assert "attach 4242" in argv and "set auto-solib-add off" in argv

    outcome = V.Outcome()
    for line in Path(ctx["events_path"]).read_text().splitlines()[:-1]:
        outcome.add(json.loads(line))
    ev = coredump.analyse(d, outcome, {"before_kill": [got]}, {"role": "consumer"})
    info = ev["coredump"]
    assert info["attach"] == got["attach"] and "core" not in info and "error" not in info
    assert ev["probe_source"].startswith("coredump (cuda-gdb attached to the hung worker")
    assert coredump.take_attached(d) is None, "analyse took it"
    assert (d / "coredump_gdb_pass1.txt").exists()

    ref = core_reading(doc, monkeypatch)
    cps = doc["checkpoint_sites"]
    assert ev["role_answers"] == E.role_answers(ref, cps)
    assert ev["stuck_sites"] == E.bounded(E.stuck_sites(ref, cps))[0]


@pytest.mark.parametrize("how", ["no warp", "no cuda-gdb", "too slow", "a reader bug"])
def test_a_failed_attach_takes_the_dump_and_says_why(tmp_path, monkeypatch, how):
    doc = recorded()
    if how == "no cuda-gdb":
        monkeypatch.setattr(cudagdb, "find_cuda_gdb", lambda: None)
    elif how == "a reader bug":  # an exception no reader should raise: still the dump
        exe, starts = fake_gdb(tmp_path, doc["passes"])
        monkeypatch.setattr(cudagdb, "find_cuda_gdb", lambda: exe)
        monkeypatch.setattr(coredump, "parse_warps", lambda text: {}["no such key"])
    else:
        text = "ptrace: Operation not permitted.\n" if how == "no warp" else ""
        exe, starts = fake_gdb(tmp_path, [text], hang_round=1 if how == "too slow" else None)
        monkeypatch.setattr(cudagdb, "find_cuda_gdb", lambda: exe)
    monkeypatch.setattr(coredump, "_prefetched_sass", lambda d, info: lambda: doc["sass"])
    monkeypatch.setattr(coredump_capture, "before_kill", lambda ctx: {"coredump": {"dump_s": 0.4}})
    d, ctx = run_folder(tmp_path, doc)
    if how == "too slow":
        monkeypatch.setattr(coredump_attach, "ATTACH_LIMIT_S", 1.0)
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    got = coredump.attach_or_dump(ctx)
    assert sent[-1] == (4242, signal.SIGCONT), "the worker runs again before its dump"
    assert got["coredump"] == {"dump_s": 0.4}
    why = got["attach"]["error"]
    assert {
        "no warp": "listed no warp",
        "no cuda-gdb": "cuda-gdb not found",
        "too slow": "did not finish in",
        "a reader bug": "KeyError: 'no such key'",
    }[how] in why
    assert coredump.take_attached(d) is None
    if how != "no cuda-gdb":
        assert all(gone(p) for p in pids(starts))


def test_other_children_are_left_to_the_dump_hook(tmp_path, monkeypatch):
    monkeypatch.setattr(coredump_capture, "before_kill", lambda ctx: {"coredump": "asked"})
    assert coredump.attach_or_dump({"phase": "compiled", "pid": 1}) == {"coredump": "asked"}
    d = tmp_path / "plain"
    d.mkdir()  # a run without the cubin kept: not a coredump run's worker
    ctx = {"phase": "launched", "events_path": str(d / "events.jsonl"), "pid": 1}
    assert coredump_attach.attach_read(ctx, None, None, None) is None


def test_the_hooks_take_the_state_one_way_at_a_time(monkeypatch):
    monkeypatch.setattr(W, "BEFORE_KILL", [])
    coredump.register_hook("attach")
    assert W.BEFORE_KILL == [
        coredump.prefetch_sass,
        coredump.attach_or_dump,
        coredump.prefetch_core,
    ]
    coredump.register_hook()
    assert W.BEFORE_KILL == [coredump.prefetch_sass, coredump.before_kill, coredump.prefetch_core]
    loc = coredump.Localizer(read="attach")
    assert loc.request_fields("r")["allow_ptrace"] is True
    assert W.BEFORE_KILL[1] is coredump.attach_or_dump
    assert "allow_ptrace" not in coredump.Localizer(read="dump").request_fields("r")


def test_allow_ptrace_answers_without_raising():
    assert lifeline.allow_ptrace() in (True, False)
    yama = Path("/proc/sys/kernel/yama/ptrace_scope")
    if yama.exists():
        assert lifeline.allow_ptrace() is True, "Yama is here: the call must take"


def test_the_worker_allows_ptrace_when_asked(tmp_path, monkeypatch):
    from cutedebug.engine import worker

    called = []
    monkeypatch.setattr(lifeline, "allow_ptrace", lambda: called.append(1) or True)
    monkeypatch.setattr(os, "environ", dict(os.environ))

    class Stop(Exception):
        pass

    class Ev:
        t0 = 0.0

        def emit(self, name, **kw):
            raise Stop  # the first event: after the request's settings

    for ask in (True, False):
        with pytest.raises(Stop):
            worker.run({"scenario": {}, "allow_ptrace": ask}, Ev())
    assert called == [1]


def test_the_attached_readings_seconds_are_in_the_timings():
    from cutedebug.engine import timings

    def run(core_info):
        facts = {"core_s": 0.7}
        return timings.run_timings([(None, V.Outcome(), facts, None)], core_info, 0.0)

    t = run({"coredump": {"attach": {"attach_s": 1.2, "warps": 64}}})
    assert t["attach_s"] == 1.2 and "dump_s" not in t and t["core_s"] == 0.7
    t = run({"coredump": {"attach": {"error": "x", "attach_s": 0.3}, "dump": {"dump_s": 5.0}}})
    assert (t["attach_s"], t["dump_s"]) == (0.3, 5.0)  # a failed attach, then the dump


def test_through_the_watchdog_the_worker_is_read_attached_then_killed(tmp_path, monkeypatch):
    """The real watchdog on a hung worker that answers the coredump pipe like the driver
    (tests/helpers/fake_core_worker.py): in attach mode the hook reads it through cuda-gdb
    (the fake one, the H200's rounds) before the kill, the pipe is never written (no core),
    nothing is left, and analyse gives the attached evidence."""
    import sys

    from cutedebug.engine import runner
    from cutedebug.engine.scenario import Limits

    doc = recorded()
    hooks: list = []
    monkeypatch.setattr(W, "BEFORE_KILL", hooks)
    monkeypatch.setattr(runner, "BEFORE_KILL", hooks)
    coredump.register_hook("attach")
    gdb_dir = tmp_path / "gdb"
    gdb_dir.mkdir()
    exe, starts = fake_gdb(gdb_dir, doc["passes"], argv=str(gdb_dir / "argv.jsonl"))
    monkeypatch.setattr(cudagdb, "find_cuda_gdb", lambda: exe)
    monkeypatch.setattr(coredump, "sass_of_cubin", lambda cubin, nvdisasm=None: doc["sass"])
    run = tmp_path / "run"
    run.mkdir()
    (run / "kernel.cubin").write_bytes(b"\x7fELF")
    events, log = run / "events.jsonl", run / "worker.log"
    events.write_text(
        json.dumps(Event.of("compiled", 0.5, wait_sites=doc["wait_sites"]).to_json())
        + "\n"
        + json.dumps(Event.of("checkpoint_sites", 0.6, sites=doc["checkpoint_sites"]).to_json())
        + "\n"
    )
    fake = Path(__file__).parent / "helpers" / "fake_core_worker.py"
    limits = Limits(compile_s=30.0, deadline_s=1.0, stall_s=0.3, import_s=30.0, check_s=30.0)
    outcome, facts = runner.watch(
        [sys.executable, str(fake), str(events), "dump"], events, log, limits
    )
    try:
        assert outcome.killed_by_watchdog.startswith("deadline:launched")
        got = [f for f in facts["before_kill"] if "attach" in f]
        assert len(got) == 1 and "error" not in got[0]["attach"], facts["before_kill"]
        assert not any("coredump" in f for f in facts["before_kill"]), "no dump was asked"
        assert coredump.cores(run) == [] and not list(run.glob("closed.*"))
        worker = int(next(run.glob("coredump.pipe.*")).name.rsplit(".", 1)[1])
        argv = json.loads((gdb_dir / "argv.jsonl").read_text().splitlines()[0])
        assert f"attach {worker}" in argv  # the hung worker itself, by its pid
        assert runner.tagged_processes(facts["tag"]) == []
        assert all(gone(p) for p in pids(starts))
        ev = coredump.analyse(run, outcome, facts, {"role": "consumer"})
        assert ev["probe_source"].startswith("coredump (cuda-gdb attached")
        ref = core_reading(doc, monkeypatch)
        assert ev["role_answers"] == E.role_answers(ref, doc["checkpoint_sites"])
    finally:
        coredump.close_prefetched()


def test_a_compile_without_a_wait_table_does_not_hide_the_one_before(tmp_path):
    doc = recorded()
    d, ctx = run_folder(tmp_path, doc)
    with open(ctx["events_path"], "a") as f:  # after the partial line: a new, complete one
        f.write('"}\n' + json.dumps(Event.of("compiled", 2.0).to_json()) + "\n")
    wait, _ = coredump_attach.tables(ctx["events_path"])
    assert len(wait) == len(doc["wait_sites"]) > 0
