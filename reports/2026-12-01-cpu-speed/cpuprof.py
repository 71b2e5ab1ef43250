"""Per-test wall and CPU (this process + reaped children + live descendants)."""

import json
import os
import resource
import time

import psutil

OUT = os.environ.get("CPUPROF_OUT", "/tmp/speedprof/prof")
_me = psutil.Process()
_seen = {}


def _tree_cpu():
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    tot = s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
    live = 0.0
    try:
        for k in _me.children(recursive=True):
            try:
                t = k.cpu_times()
                cpu = t.user + t.system + t.children_user + t.children_system
                _seen[k.pid] = cpu
                live += cpu
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return tot, live


_f = None
_start = {}


def pytest_runtest_logstart(nodeid, location):
    tot, live = _tree_cpu()
    _start[nodeid] = (time.monotonic(), tot, live, time.time())


def pytest_runtest_logfinish(nodeid, location):
    global _f
    if _f is None:
        wid = os.environ.get("PYTEST_XDIST_WORKER", "main")
        _f = open(f"{OUT}-{wid}.jsonl", "a")
    t0, tot0, live0, wall0 = _start.pop(nodeid, (None, 0, 0, 0))
    tot, live = _tree_cpu()
    _f.write(
        json.dumps(
            {
                "id": nodeid,
                "wall": time.monotonic() - t0,
                "self_children": tot - tot0,
                "live": live - live0,
                "t0": wall0,
                "t1": time.time(),
                "w": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            }
        )
        + "\n"
    )
    _f.flush()
