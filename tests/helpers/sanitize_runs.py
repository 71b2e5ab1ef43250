"""`cutedebug sanitize` end to end through the fake compute-sanitizer
(tests/helpers/fake_compute_sanitizer.py, which replays the H200 captures; conftest's
``fake_sanitizer`` fixture puts it on a path): the run and the report it writes. Shared by
test_sanitizer.py and test_sanitizer_attribution.py."""

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


def sanitize(fake, case, mode, *args, env=None, timeout=300):
    """`cutedebug sanitize ARGS` with the fake replaying capture ``case`` in ``mode``."""
    full_env = dict(
        os.environ,
        COMPUTE_SANITIZER=str(fake),
        FAKE_SANITIZER_CASE=case,
        FAKE_SANITIZER_MODE=mode,
        **(env or {}),
    )
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
) -> subprocess.CompletedProcess:
    """``cutedebug sanitize SCENARIO --tool TOOL [--expect E] MORE... [--no-plain] --runs-dir
    DIR`` through the fake (``plain``: with the plain run); its exit status must be ``rc``."""
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
    )
    assert r.returncode == rc, r.stdout + r.stderr
    return r


def report(proc) -> tuple[dict, str]:
    """sanitize.json (which reads back as its record and writes back byte for byte) and
    report.md of the run whose output is ``proc``."""
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("report: "))
    md = Path(line.split("report: ", 1)[1])
    text = (md.parent / "sanitize.json").read_text()
    summary = json.loads(text)
    assert cmd.dump_summary(SanitizeSummary.from_json(summary)) == text
    return summary, md.read_text()


def tool_report(proc, tool: str) -> tuple[dict, str, dict[str, Any]]:
    """``report(proc)`` and the tool's result in it."""
    summary, md = report(proc)
    return summary, md, summary["tools"][tool]
