"""An exec result built by hand: one watched process tree whose events are given, as
engine.command's watch would leave it before classify reads it."""

from __future__ import annotations

from typing import Any

from cutedebug.engine import command as C
from cutedebug.engine import verdict as V


def exec_result(
    run_dir, events=(), rc: int = 1, log_tail: str = "", probes: dict[str, Any] | None = None
) -> C.ExecResult:
    """``python -m pytest`` watched, exited ``rc``: its processes from ``events`` (pid 7 unless
    an event names another), the verdict not yet classified (PASS, no reason)."""
    tree = C._Tree()
    for e in events:
        tree.add({"pid": 7, **e})
    return C.ExecResult(
        settings=C.Settings(argv=["python", "-m", "pytest"], probes=probes),
        verdict=V.Verdict.PASS,
        reason="",
        run_dir=run_dir,
        returncode=rc,
        killed_by=None,
        elapsed_s=3.0,
        processes=tree.procs,
        log_tail=log_tail,
    )
