"""The warm pool's server imports each run's declared library modules once (engine/preloads.py,
as the fork server does): its workers find the library imported, and a server whose import
initialized CUDA forks nothing more; its client gets a server without preloads."""

import time

import psutil
import pytest

from cutedebug.engine import pool, runner
from tests.helpers.preload_lib import make_probe_lib


@pytest.fixture
def probe_lib(tmp_path, monkeypatch):
    return make_probe_lib(tmp_path, monkeypatch)


def _runs(sc, tmp_path, c, n):
    try:
        return [
            runner.run_scenario(sc, runs_root=tmp_path / f"r{i}", mode="compile", forkserver=c)
            for i in range(n)
        ]
    finally:
        c.close()


@pytest.mark.slow
def test_pool_workers_find_the_library_imported_once_in_the_server(
    tmp_path,
    probe_lib,
    pool_dir,
):
    sc, out = probe_lib
    c = pool.client(start=True)
    assert c is not None
    server = c.info["pid"]
    runs = _runs(sc, tmp_path, c, 2)
    assert out.read_text().split() == [str(server)]  # once, in the server, for both runs
    assert all(r.expected and r.evidence["pool"]["pid"] == server for r in runs), [
        r.reason for r in runs
    ]
    assert runs[1].timings["imports_s"] < 1.0


@pytest.mark.slow
def test_a_pool_server_whose_import_initialized_cuda_is_replaced_by_one_without_preloads(
    tmp_path,
    probe_lib,
    pool_dir,
    monkeypatch,
):
    sc, out = probe_lib
    monkeypatch.setenv("PRELOAD_PROBE_CUDA", "1")
    c = pool.client(start=True)
    assert c is not None
    tainted = c.info["pid"]
    runs = _runs(sc, tmp_path, c, 2)
    servers = {r.evidence["pool"]["pid"] for r in runs}
    assert tainted not in servers and len(servers) == 1 and not c.preload
    # the tainted server imported it, then each worker of the new server imported it itself
    pids = out.read_text().split()
    assert pids[0] == str(tainted) and len(pids) == 3 and str(servers.pop()) not in pids
    assert all(r.expected and "forkserver_error" not in r.evidence for r in runs), [
        r.reason for r in runs
    ]
    assert (
        c.info["preload"] == "off: importing preload_probe_lib initialized CUDA in the fork server"
    )
    assert runs[0].evidence["pool"]["preload"] == c.info["preload"]
    end = time.monotonic() + 10  # it forked nothing more, and exits with no client left
    while psutil.pid_exists(tainted) and time.monotonic() < end:
        if psutil.Process(tainted).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.1)
    assert not psutil.pid_exists(tainted) or psutil.Process(tainted).status() == "zombie"
