"""`cutedebug triage` on a fake GPU with tests/helpers/token_worker.py for every worker: the
engine, the lanes, the GPU token and the watchdog are the real ones (fresh worker processes,
no fork server). Used in-process by tests/test_triage_overlap.py (``install``) and, as a
script, as a triage to SIGKILL.

usage: python overlap_triage.py SCENARIO_DIR OUT JOBS
"""

import sys
from pathlib import Path

from cutedebug.commands import triage as T
from cutedebug.engine import runner

WORKER = Path(__file__).resolve().parent / "token_worker.py"
FAKE_H200 = {
    "present": True,
    "reason": None,
    "name": "NVIDIA H200",
    "cc": "9.0",
    "driver": "580.65.06",
    "arch": "sm_90a",
}


def install(setattr, health_check=None) -> None:
    """Point the engine at the stand-in worker and a fake GPU (``setattr``: monkeypatch's, or
    the builtin for a script)."""
    setattr(runner, "worker_argv", lambda request: [sys.executable, str(WORKER), str(request)])
    setattr(runner, "start_forkserver", lambda *a, **k: None)
    setattr(runner, "health_check", health_check or (lambda **kw: {"healthy": True, "secs": 0.0}))
    setattr(T, "detect_gpu", lambda: FAKE_H200)


if __name__ == "__main__":
    install(setattr)
    scen, out, jobs = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    opts = T.Options(dir=scen, out=out, jobs=jobs, command="cutedebug triage (overlap test)")
    sys.exit(T.triage(opts, out=lambda line: print(line, flush=True)))
