"""A cold `cutedebug run` reuses its compile from the user's folder (engine/compile_cache.py:
user_folder): a fresh run worker reserves its probe buffer's address range at one fixed
address (instrument/probe_memory.py: reserve at FIXED_AT), so the same scenario traces to the
same IR in every fresh worker. CPU: the address, the folder, who gets one; GPU: two cold runs of the
README's probed HANG, the second reusing the first's compile, both localized."""

import os
from pathlib import Path

import pytest
from helpers.program_json import program_json

from cutedebug.engine import compile_cache, runner, worker
from cutedebug.engine import scenario as S
from cutedebug.engine.verdict import Verdict
from cutedebug.instrument import probe_memory

ROOT = Path(__file__).resolve().parent.parent
HANG = ROOT / "scenarios" / "tma_stream" / "wrong_expect_tx_plus.toml"

RESERVE = r"""
import json
from cutedebug.instrument import probe_memory as pm
out = {"first": pm.reserve(pm.FIXED_AT), "again": pm.reserve(pm.FIXED_AT)}
out["buffer_at"] = pm.map_pages(10_000)[0]  # the buffer's pages (fixed_buffer's first step)
print(json.dumps(out))
"""

TAKEN = r"""
import json
from cutedebug.instrument import probe_memory as pm
# something of the process's own sits there already: no reservation, nothing unmapped
pm._mmap(pm.FIXED_AT + 4096, 4096, 3, pm._MAP_PRIVATE | pm._MAP_ANON | pm._MAP_FIXED)
view = (__import__("ctypes").c_uint8 * 1).from_address(pm.FIXED_AT + 4096)
view[0] = 7
print(json.dumps({"got": pm.reserve(pm.FIXED_AT), "still": view[0], "reserved": pm.reserved(),
                  "why": pm.last_miss}))
"""


def test_every_fresh_process_reserves_the_same_address():
    a = program_json(RESERVE, ROOT, timeout=60)
    b = program_json(RESERVE, ROOT, timeout=60)
    assert (
        a
        == b
        == {
            "first": probe_memory.FIXED_AT,
            "again": probe_memory.FIXED_AT,
            "buffer_at": probe_memory.FIXED_AT,
        }
    )


def test_a_taken_range_gives_no_reservation_and_leaves_what_was_there():
    got = program_json(TAKEN, ROOT, timeout=60)
    assert got.pop("why").startswith(
        f"no fixed probe buffer: the range at {probe_memory.FIXED_AT:#x} is taken ("
    )
    assert got == {"got": None, "still": 7, "reserved": None}


def test_the_users_folder_and_how_to_turn_it_off(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.USER_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.user_folder() == (tmp_path / "xdg" / "cutedebug" / "compile", "")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache.user_folder() == (tmp_path / "home/.cache/cutedebug/compile", "")

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    with monkeypatch.context() as m:  # HOME unset and no passwd entry: a reason, no error
        m.setattr(Path, "home", staticmethod(no_home))
        assert compile_cache.user_folder() == (
            None,
            "no folder to keep it in: Could not determine home directory. "
            f"(set {compile_cache.USER_VAR})",
        )
    monkeypatch.setenv(compile_cache.USER_VAR, str(tmp_path / "mine"))
    assert compile_cache.user_folder() == (tmp_path / "mine", "")
    for off in ("off", "0", "OFF"):
        monkeypatch.setenv(compile_cache.USER_VAR, off)
        assert compile_cache.user_folder() == (
            None,
            f"turned off ({compile_cache.USER_VAR}={off})",
        )


def test_who_gets_which_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(compile_cache.USER_VAR, str(tmp_path / "user"))
    monkeypatch.delenv(compile_cache.CACHE_VAR, raising=False)
    assert worker.cache_folder({}, runnable=True) == (tmp_path / "user", "")
    assert worker.cache_folder({}, runnable=False) == (
        None,
        "no compile cache for a compile-only run or without a GPU",
    )
    assert worker.cache_folder({"compile_cache": False}, runnable=True)[0] is None
    assert worker.cache_folder({"perturb": {"seed": 1}}, runnable=True)[0] is None
    assert worker.cache_folder({"bisect": 3}, runnable=True)[0] is None
    monkeypatch.setenv(compile_cache.CACHE_VAR, str(tmp_path / "pool"))  # a pool worker
    assert worker.cache_folder({}, runnable=True) == (tmp_path / "pool", "")
    assert worker.cache_folder({}, runnable=False) == (tmp_path / "pool", "")


def test_half_written_entries_of_dead_processes_are_pruned(tmp_path):
    dead = 2**22 + 12345  # above pid_max's default: no such process
    (tmp_path / f".tmp-{dead}-abc").mkdir()
    (tmp_path / f".tmp-{os.getpid()}-def").mkdir()  # this process: a store under way
    (tmp_path / "entry").mkdir()
    assert compile_cache.prune(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".tmp-{os.getpid()}-def", "entry"]


@pytest.mark.gpu
@pytest.mark.slow
def test_on_the_gpu_a_second_cold_run_reuses_the_compile_and_still_localizes(tmp_path, monkeypatch):
    """The README's probed HANG twice, each in a fresh worker (no pool, no fork server): the
    first compiles and stores, the second reuses it (its probe buffer at the fixed address,
    the same traced IR); both HANG where expected, the same PTX."""
    monkeypatch.setenv(compile_cache.USER_VAR, str(tmp_path / "cache"))
    monkeypatch.delenv(compile_cache.CACHE_VAR, raising=False)
    runs = [runner.run_scenario(S.load(HANG), runs_root=tmp_path / f"r{i}") for i in range(2)]
    for res in runs:
        assert res.verdict is Verdict.HANG, res.reason
        assert res.localization["ok"] is True, res.localization
    cache = [r.evidence["compiled"]["compile_cache"] for r in runs]
    assert cache[0]["reused"] is False and cache[1]["reused"] is True, cache
    assert [c.get("probe_buffer") for c in cache] == ["fixed", "fixed"], cache
    ptx = [(r.run_dir / "kernel.ptx").read_text() for r in runs]
    assert ptx[0] == ptx[1]
    print({"timings": [r.timings for r in runs], "compile_cache": cache})
