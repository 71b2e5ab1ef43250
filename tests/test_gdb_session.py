"""cudagdb.GdbSession: read_core loads a core into one cuda-gdb process and sends it its rounds
of commands in turn (the H200: loading is most of a cuda-gdb run, 2.5-3 s for the 128 MB core
of a grid of 8,448 warps, reports/2026-12-01-h200/coredump), bounded, nothing left behind.

The cuda-gdb here is tests/helpers/fake_cuda_gdb.py: it answers each round with what cuda-gdb
13.0 printed for the same commands on the H200 (tests/data/coredump/h200-runs/: the integrated
path's own runs) and counts its starts.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import sys
import time
from pathlib import Path

import psutil
import pytest

from cutedebug.analyses import coredump, cudagdb
from cutedebug.analyses import coredump_evidence as E
from cutedebug.instrument import waitsites
from tests.helpers.replay_gdb import PassReplay

HERE = Path(__file__).parent
FAKE = HERE / "helpers" / "fake_cuda_gdb.py"
RUNS = HERE / "data" / "coredump" / "h200-runs"
H200 = HERE / "data" / "coredump" / "h200"


def fake_gdb(tmp_path: Path, rounds: list[str], **cfg) -> tuple[str, Path]:
    """A cuda-gdb executable answering ``rounds``; returns it and its starts file."""
    starts = tmp_path / "starts"
    conf = tmp_path / "fake_gdb.json"
    conf.write_text(json.dumps({"rounds": rounds, "starts": str(starts), **cfg}))
    exe = tmp_path / "cuda-gdb"
    exe.write_text(f'#!/bin/sh\nFAKE_GDB={conf} exec {sys.executable} {FAKE} "$@"\n')
    exe.chmod(0o755)
    return str(exe), starts


def pids(starts: Path, mode: str = "session") -> list[int]:
    """The fake cuda-gdb's starts in ``mode`` (session: interactive; batch: -batch)."""
    rows = [x.split() for x in starts.read_text().splitlines()] if starts.exists() else []
    return [int(p) for p, m in rows if m == mode]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def recorded(name: str) -> dict:
    return json.loads(gzip.open(RUNS / f"{name}.json.gz", "rt").read())


def read(doc: dict, **kw):
    return coredump.read_core(
        "core",
        sass_text=doc["sass"],
        wait_sites=waitsites.sites_from_json(doc["wait_sites"]),
        checkpoint_sites=doc["checkpoint_sites"],
        **kw,
    )


@pytest.mark.parametrize(
    "name", ["tma_stream__wrong_expect_tx_plus", "sm90_attention__drop_sync_scheduler"]
)
def test_one_cuda_gdb_process_answers_every_round(name, tmp_path, monkeypatch):
    """Both rounds (every warp; then per-PC frames and the waiting warps' registers) go to one
    cuda-gdb: the core is loaded once. The answer is the one the same outputs give read by
    rounds replayed without any process (PassReplay)."""
    doc = recorded(name)
    exe, starts = fake_gdb(tmp_path, doc["passes"])
    rep = read(doc, cuda_gdb=exe)
    assert len(pids(starts)) == 1, "one cuda-gdb process for the whole core"
    assert rep.passes == 2 and len(rep.rounds_s) == 2
    assert all(gone(p) for p in pids(starts))

    fake = PassReplay(doc["passes"])
    monkeypatch.setattr(coredump, "gdb_session", fake.session)
    ref = read(doc)
    cps = doc["checkpoint_sites"]
    assert E.role_answers(rep, cps) == E.role_answers(ref, cps)
    assert E.stuck_sites(rep, cps) == E.stuck_sites(ref, cps)
    assert [w.to_json() for w in rep.warps] == [w.to_json() for w in ref.warps]


def test_a_big_round_both_ways_does_not_block_on_the_pipes(tmp_path):
    """A round answered with 0.8 MB (what cuda-gdb printed on the H200 for the first pass over
    minimal's 8,448-warp core) from its first command on, while 300 KB of commands are still
    being written to it."""
    pass1 = gzip.open(H200 / "minimal__oob_store" / "pass1.txt.gz", "rt").read()
    assert len(pass1) > 700_000
    exe, starts = fake_gdb(tmp_path, [pass1, "@@b\nsecond\n"])
    with cudagdb.GdbSession("core", exe) as gdb:
        text, secs = gdb.run([f"p/x $R{i % 200}" for i in range(30_000)], timeout_s=30)
        assert text == pass1
        assert gdb.run(["bt"], timeout_s=30)[0] == "@@b\nsecond\n"
    assert len(pids(starts)) == 1 and all(gone(p) for p in pids(starts))


def test_a_round_past_its_limit_is_a_runtime_error_and_leaves_nothing(tmp_path):
    exe, starts = fake_gdb(tmp_path, ["@@a\nfirst\n", "never"], hang_round=2)
    gdb = cudagdb.GdbSession("core", exe)
    assert gdb.run(["info cuda kernels"], timeout_s=30)[0] == "@@a\nfirst\n"
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="did not finish in 1 s"):
        gdb.run(["bt"], timeout_s=1)
    assert time.monotonic() - t0 < 4
    gdb.close()
    assert all(gone(p) for p in pids(starts))


def test_a_cuda_gdb_that_exits_gives_what_it_printed(tmp_path):
    exe, starts = fake_gdb(tmp_path, ["@@a\n" + "x" * 1000 + "\n"], exit_round=1)
    with cudagdb.GdbSession("core", exe) as gdb:
        text, _ = gdb.run(["info cuda kernels"], timeout_s=30)
        assert text.startswith("@@a\nxxx") and text.rstrip().endswith("[cuda-gdb exited: 1]")
        assert gdb.run(["bt"], timeout_s=30)[0] == ""  # nothing more, and no wait
    assert all(gone(p) for p in pids(starts))


def test_no_cuda_gdb_is_a_runtime_error(tmp_path, monkeypatch):
    monkeypatch.setattr(cudagdb, "find_cuda_gdb", lambda: None)
    with pytest.raises(RuntimeError, match="cuda-gdb not found"):
        coredump.read_core(tmp_path / "core")


def test_nvdisasm_runs_while_cuda_gdb_loads_the_core(monkeypatch):
    """analyse hands read_core the SASS as a callable: it runs after the first round is sent
    and before its answer is awaited (the H200: nvdisasm 0.4-0.5 s, loading 0.3-3 s)."""
    doc = recorded("tma_stream__wrong_expect_tx_plus")
    fake = PassReplay(doc["passes"])
    monkeypatch.setattr(coredump, "gdb_session", fake.session)

    def sass():
        fake.events.append("nvdisasm")
        return doc["sass"]

    rep = coredump.read_core(
        "core",
        sass_text=sass,
        wait_sites=waitsites.sites_from_json(doc["wait_sites"]),
        checkpoint_sites=doc["checkpoint_sites"],
    )
    assert fake.events == ["send", "nvdisasm", "receive", "send", "receive"]
    assert (fake.opened, fake.closed) == (1, 1)
    assert rep.sass_source == "nvdisasm of the worker's cubin" and rep.site_map_notes == []


def test_the_session_is_closed_when_reading_fails(monkeypatch):
    """A core neither way can read: the error, both tried, the session closed, and the next
    core still tried in one process (the session is not what failed)."""
    monkeypatch.setattr(coredump, "SESSION_FAILED", "")
    fake, batch = PassReplay(["nothing a parser knows\n"]), PassReplay(["nor here\n"])
    monkeypatch.setattr(coredump, "gdb_session", fake.session)
    monkeypatch.setattr(coredump, "gdb_batch", batch.session)
    with pytest.raises(RuntimeError, match="listed no warp"):
        coredump.read_core("core", sass_text=None)
    assert (fake.opened, fake.closed, batch.opened) == (1, 1, 1)
    assert coredump.SESSION_FAILED == ""


def test_a_cuda_gdb_that_cannot_be_driven_on_pipes_falls_back_to_batch(tmp_path, monkeypatch):
    """Should cuda-gdb quit when its stdin is a pipe, the rounds go to one `cuda-gdb -batch`
    each (as before), the report says why, and the next core goes there at once."""
    monkeypatch.setattr(coredump, "SESSION_FAILED", "")
    doc = recorded("tma_stream__wrong_expect_tx_plus")
    exe, starts = fake_gdb(tmp_path, doc["passes"], no_session=True)
    rep = read(doc, cuda_gdb=exe)
    assert len(pids(starts, "session")) == 1 and len(pids(starts, "batch")) == 2
    assert rep.processes == 2 and rep.fallback.startswith(
        "one cuda-gdb process for every round failed: cuda-gdb listed no warp"
    )
    cps = doc["checkpoint_sites"]
    assert {r: (a["op"], a["barrier"]) for r, a in E.role_answers(rep, cps).items()} == {
        "consumer": ("consumer_wait", "full"),
        "producer": ("producer_acquire", "empty"),
    }
    starts.unlink()
    rep2 = read(doc, cuda_gdb=exe)
    assert pids(starts, "session") == [] and rep2.fallback == rep.fallback


def test_pipes_of_a_closed_session_are_closed(tmp_path):
    exe, _ = fake_gdb(tmp_path, ["@@a\n"])
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with cudagdb.GdbSession("core", exe) as gdb:
            gdb.run(["bt"], timeout_s=30)
    assert len(os.listdir("/proc/self/fd")) <= before


@pytest.mark.skipif(not os.path.exists("/usr/bin/gdb"), reason="no GNU gdb here")
def test_the_rounds_protocol_with_a_real_gdb(tmp_path):
    """GNU gdb (what cuda-gdb is built on) driven as GdbSession drives cuda-gdb: no prompt in
    the output (each @@section marker starts its line), every answer in its round, values the
    parsers read, an error (no cudacore target in GNU gdb) printed in order, not fatal."""
    with cudagdb.GdbSession(tmp_path / "core", "/usr/bin/gdb") as gdb:
        t1, _ = gdb.run(["echo @@a\\n", "p/x 255", "echo @@b\\n", "p 1+1"], timeout_s=30)
        t2, _ = gdb.run(["echo @@c\\n", "p/x 4096", "info cuda warps"], timeout_s=30)
        assert gdb.started == 1 and gdb.rounds == 2
    assert "cudacore" in t1.split("@@a")[0]  # target cudacore's own error, first
    sec = cudagdb.sections(t1)
    assert cudagdb.parse_values(sec["a"]) == [255] and cudagdb.parse_values(sec["b"]) == [2]
    sec2 = cudagdb.sections(t2)
    assert list(sec2) == ["c"] and cudagdb.parse_values(sec2["c"]) == [4096]
    assert "(gdb)" not in t1 + t2


@pytest.fixture(autouse=True)
def no_prefetch_left():
    yield
    coredump.close_prefetched()


def started(starts: Path, n: int) -> list[int]:
    """The session starts, once ``n`` are recorded (a started process writes its own)."""
    for _ in range(500):
        if len(pids(starts)) >= n:
            break
        time.sleep(0.01)
    return pids(starts)


def prefetch_folder(tmp_path: Path) -> tuple[Path, dict]:
    """A run folder right after the dump: its worker's pipe and complete core (held by no
    process), and the watchdog's hook context."""
    run = tmp_path / "run"
    run.mkdir()
    pid = os.getpid()  # a live process that does not hold the core open
    (run / f"coredump.pipe.{pid}").write_text("")
    (run / f"coredump.{pid}.nvcudmp").write_bytes(b"\x7fELF" + bytes(60))
    return run, {"phase": "launched", "events_path": str(run / "events.jsonl"), "pid": pid}


def test_cuda_gdb_loads_the_core_while_the_worker_is_killed(tmp_path, monkeypatch):
    """prefetch_core (the hook after the dump) starts cuda-gdb on the complete core and sends
    round 1; read_core, after the kill and the health check, takes that session: one process,
    round 1 already answered, the same records."""
    monkeypatch.setattr(coredump, "SESSION_FAILED", "")
    doc = recorded("tma_stream__wrong_expect_tx_plus")
    exe, starts = fake_gdb(tmp_path, doc["passes"])
    monkeypatch.setattr(cudagdb, "find_cuda_gdb", lambda: exe)
    run, ctx = prefetch_folder(tmp_path)
    assert coredump.prefetch_core(ctx) == {"cuda_gdb_prefetch": "started"}
    assert len(started(starts, 1)) == 1
    time.sleep(0.4)  # the kill, the health check
    rep = coredump.read_core(
        run / f"coredump.{ctx['pid']}.nvcudmp",
        sass_text=doc["sass"],
        wait_sites=waitsites.sites_from_json(doc["wait_sites"]),
        checkpoint_sites=doc["checkpoint_sites"],
    )
    assert len(pids(starts)) == 1 and all(gone(p) for p in pids(starts))
    assert rep.prefetched >= 0.4 and rep.round1_wait_s < 0.2 and rep.passes == 2
    cps = doc["checkpoint_sites"]
    assert {r: (a["op"], a["barrier"]) for r, a in E.role_answers(rep, cps).items()} == {
        "consumer": ("consumer_wait", "full"),
        "producer": ("producer_acquire", "empty"),
    }
    assert coredump._SESSIONS == {}


def test_no_prefetch_of_a_core_still_written_or_of_a_run_without_coredumps(tmp_path, monkeypatch):
    monkeypatch.setattr(coredump, "SESSION_FAILED", "")
    exe, starts = fake_gdb(tmp_path, ["@@a\n"])
    monkeypatch.setattr(cudagdb, "find_cuda_gdb", lambda: exe)
    run, ctx = prefetch_folder(tmp_path)
    core = run / f"coredump.{ctx['pid']}.nvcudmp"
    with open(core, "ab"):  # this process holds it open: the driver still writing
        assert coredump.prefetch_core(ctx) == {
            "cuda_gdb_prefetch": "not started: the worker may still write the core"
        }
    h = bytearray(64)  # an ELF64 header whose section table (at 4096) is not written yet
    h[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<QQ", h, 32, 0, 4096)
    struct.pack_into("<HHHH", h, 54, 56, 0, 64, 1)
    core.write_bytes(bytes(h))
    assert coredump.prefetch_core(ctx) == {
        "cuda_gdb_prefetch": "not started: the core is shorter than its ELF header says"
    }
    core.unlink()  # no coredump settings in this run (or no core came): nothing to say
    (run / f"coredump.pipe.{ctx['pid']}").unlink()
    assert coredump.prefetch_core(ctx) is None
    assert coredump.prefetch_core({**ctx, "phase": "compiled"}) is None
    time.sleep(0.3)  # (a start would have written its pid by now)
    assert pids(starts) == [] and coredump._SESSIONS == {}


def test_prefetch_when_the_driver_removed_its_pipe_after_the_dump(tmp_path, monkeypatch):
    """The worker's core in the run folder is what says the run had the coredump settings: a
    driver that unlinks its pipe once the dump is written does not stop the prefetch."""
    monkeypatch.setattr(coredump, "SESSION_FAILED", "")
    exe, starts = fake_gdb(tmp_path, ["@@a\n"])
    monkeypatch.setattr(cudagdb, "find_cuda_gdb", lambda: exe)
    run, ctx = prefetch_folder(tmp_path)
    (run / f"coredump.pipe.{ctx['pid']}").unlink()
    try:
        assert coredump.prefetch_core(ctx) == {"cuda_gdb_prefetch": "started"}
        assert len(started(starts, 1)) == 1 and len(coredump._SESSIONS) == 1
    finally:
        coredump.close_prefetched()
    assert all(gone(p) for p in pids(starts))


def test_a_prefetch_nobody_takes_is_closed(tmp_path, monkeypatch):
    monkeypatch.setattr(coredump, "SESSION_FAILED", "")
    exe, starts = fake_gdb(tmp_path, ["@@a\n"])
    monkeypatch.setattr(cudagdb, "find_cuda_gdb", lambda: exe)
    _, ctx = prefetch_folder(tmp_path)
    coredump.prefetch_core(ctx)
    assert len(coredump._SESSIONS) == 1 and len(started(starts, 1)) == 1
    coredump.close_prefetched()  # at exit (or SASS_KEEP_S after it was started)
    assert coredump._SESSIONS == {} and all(gone(p) for p in pids(starts))
