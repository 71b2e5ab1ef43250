"""lifeline.run_tool: the short-lived tools (cuda-gdb, nvdisasm, nvidia-smi) are tied children too.

A tool that hangs is killed at its limit with everything it started, a setsid'd grandchild
that ignores SIGTERM included; one that exits but leaves a background process behind has that
process swept; the cuda-gdb runner turns a hang into the RuntimeError its callers report.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cutedebug.analyses import cudagdb
from cutedebug.engine import lifeline

# A grandchild in a session of its own, ignoring SIGTERM, sleeping: what a process group kill
# misses. It writes its pid where the test can find it.
GRANDCHILD = (
    "import os, signal, sys, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid(); signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "    open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120); os._exit(0)\n"
    "time.sleep(float(sys.argv[2]))\n"
    "print('tool done')\n"
)


def _pid(path: Path) -> int:
    for _ in range(200):
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.02)
    raise AssertionError("the grandchild never started")


def _gone(pid: int, within_s: float = 3.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def test_a_hanging_tool_is_killed_with_its_grandchildren(tmp_path):
    pidfile = tmp_path / "gc.pid"
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        lifeline.run_tool([sys.executable, "-c", GRANDCHILD, str(pidfile), "60"], 1.0)
    assert time.monotonic() - t0 < 6
    assert _gone(_pid(pidfile))


def test_a_tool_that_exits_leaves_nothing_running(tmp_path):
    pidfile = tmp_path / "gc.pid"
    p = lifeline.run_tool([sys.executable, "-c", GRANDCHILD, str(pidfile), "0.3"], 30)
    assert p.returncode == 0 and p.stdout.strip() == "tool done"
    assert _gone(_pid(pidfile))


def test_output_and_status_come_back():
    p = lifeline.run_tool(
        [
            sys.executable,
            "-c",
            "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)",
        ],
        30,
    )
    assert (p.returncode, p.stdout, p.stderr) == (3, "out\n", "err\n")


def test_the_tool_carries_the_tags_the_keeper_sweeps():
    p = lifeline.run_tool(
        [sys.executable, "-c", f"import os; print(os.environ['{lifeline.RUN_TAG_VAR}'])"], 30
    )
    assert len(p.stdout.strip()) == 32


def test_a_hanging_cuda_gdb_is_a_runtime_error_and_leaves_nothing(tmp_path):
    pidfile = tmp_path / "gc.pid"
    fake = tmp_path / "cuda-gdb"
    fake.write_text(
        f"#!{sys.executable}\n"
        + GRANDCHILD.replace("sys.argv[1]", repr(str(pidfile))).replace("sys.argv[2]", "'60'")
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(RuntimeError, match="did not finish in 1 s"):
        cudagdb.run_gdb(tmp_path / "core", ["info cuda kernels"], timeout_s=1, cuda_gdb=str(fake))
    assert _gone(_pid(pidfile))
    assert os.path.exists(fake)
