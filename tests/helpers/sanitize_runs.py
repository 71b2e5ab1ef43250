"""`cutedebug sanitize` end to end through the fake compute-sanitizer
(tests/helpers/fake_compute_sanitizer.py, which replays the H200 captures; conftest's
``fake_sanitizer`` fixture puts it on a path): the run and the report it writes. Shared by
test_sanitizer.py, test_sanitizer_attribution.py and test_sanitizer_referee.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cutedebug.analyses.sanitizer.result import SanitizeSummary
from cutedebug.commands import sanitize as cmd

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "helpers" / "fake_compute_sanitizer.py"
SCEN = REPO / "scenarios" / "minimal"


def fake_sanitizer_at(folder: Path) -> Path:
    """An executable ``compute-sanitizer`` in ``folder`` that runs the fake."""
    path = folder / "compute-sanitizer"
    path.parent.mkdir()
    path.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    path.chmod(0o755)
    return path


def cutedebug_sanitize(*args, env=None, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "cutedebug", "sanitize", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout,
    )


def fake_env(
    fake: Path,
    case: str,
    mode: str,
    *,
    events: dict | None = None,
    kernels: list[str] | None = None,
) -> dict[str, str]:
    """The variables that make ``cutedebug sanitize`` run the fake replaying capture ``case`` in
    ``mode``; ``events``: fields of the simulated worker events (FAKE_SANITIZER_EVENTS),
    ``kernels``: the kernels the simulated worker launched (FAKE_SANITIZER_KERNELS)."""
    env = {
        "COMPUTE_SANITIZER": str(fake),
        "FAKE_SANITIZER_CASE": case,
        "FAKE_SANITIZER_MODE": mode,
    }
    if events is not None:
        env["FAKE_SANITIZER_EVENTS"] = json.dumps(events)
    if kernels is not None:
        env["FAKE_SANITIZER_KERNELS"] = ",".join(kernels)
    return env


def sanitize(fake, case, mode, *args, env=None, timeout=300, events=None, kernels=None):
    """`cutedebug sanitize ARGS` with the fake replaying capture ``case`` in ``mode``
    (``events``, ``kernels``: as for ``fake_env``)."""
    replay = fake_env(fake, case, mode, events=events, kernels=kernels)
    full_env = dict(os.environ, **replay, **(env or {}))
    return cutedebug_sanitize(*args, env=full_env, timeout=timeout)


def sanitize_tool(
    fake: Path,
    case: str,
    mode: str,
    scenario: Path,
    tool: str,
    runs_dir: Path,
    *more: str,
    expect: str | None = None,
    plain: bool = False,
    rc: int = 0,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    events: dict | None = None,
    kernels: list[str] | None = None,
) -> subprocess.CompletedProcess:
    """``cutedebug sanitize SCENARIO --tool TOOL [--expect E] MORE... [--no-plain] --runs-dir
    DIR`` through the fake (``plain``: with the plain run; ``events``, ``kernels``: as for
    ``fake_env``); its exit status must be ``rc``."""
    r = sanitize(
        fake,
        case,
        mode,
        str(scenario),
        "--tool",
        tool,
        *(("--expect", expect) if expect else ()),
        *more,
        *(() if plain else ("--no-plain",)),
        "--runs-dir",
        str(runs_dir),
        env=env,
        timeout=timeout,
        events=events,
        kernels=kernels,
    )
    assert r.returncode == rc, r.stdout + r.stderr
    return r


def replayed_race(fake: Path, runs_dir: Path, *more: str, **kw: Any) -> subprocess.CompletedProcess:
    """``sanitize_tool`` of scenarios/minimal/clean.toml under racecheck, the fake replaying the
    H200's race capture (racecheck_raw: race_smem's RAW hazard, 513 records) for a simulated
    worker; ``more`` and ``kw`` as for ``sanitize_tool``."""
    return sanitize_tool(
        fake, "racecheck_raw", "simulate", SCEN / "clean.toml", "racecheck", runs_dir, *more, **kw
    )


def replayed_oob_store(
    fake: Path, runs_dir: Path, *more: str, **kw: Any
) -> subprocess.CompletedProcess:
    """``sanitize_tool`` of scenarios/minimal/oob_store.toml under memcheck, the fake replaying
    the H200's out-of-bounds capture (memcheck_oob: 64 stores past the output's end) for a
    simulated worker whose launch fails, as a kernel that memcheck stops does; ``more`` and
    ``kw`` as for ``sanitize_tool``."""
    return sanitize_tool(
        fake,
        "memcheck_oob",
        "simulate-crash",
        SCEN / "oob_store.toml",
        "memcheck",
        runs_dir,
        *more,
        **kw,
    )


def report_md(stdout: str) -> Path:
    """The report.md that ``cutedebug sanitize`` names on its ``report: PATH`` line."""
    line = next(ln for ln in stdout.splitlines() if ln.startswith("report: "))
    return Path(line.split("report: ", 1)[1])


def report(proc) -> tuple[dict, str]:
    """sanitize.json (which reads back as its record and writes back byte for byte) and
    report.md of the run whose output is ``proc``."""
    md = report_md(proc.stdout)
    text = (md.parent / "sanitize.json").read_text()
    summary = json.loads(text)
    assert cmd.dump_summary(SanitizeSummary.from_json(summary)) == text
    return summary, md.read_text()


def tool_report(proc, tool: str) -> tuple[dict, str, dict[str, Any]]:
    """``report(proc)`` and the tool's result in it."""
    summary, md = report(proc)
    return summary, md, summary["tools"][tool]
