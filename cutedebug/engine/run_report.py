"""What a run's report.json holds: ``RunReport`` (``cutedebug run`` / triage / pytest: one
scenario) and ``ExecReport`` (``cutedebug exec``: any command), each schema-versioned.

Built from the live results (``runner.RunResult``, ``command.ExecResult``) by
cutedebug/reporting/report.py and reporting/exec_report.py, serialised only through
``to_json`` / ``from_json`` (cutedebug/records.py: an unknown, missing or mistyped field is
refused, naming it). The evidence stays an open object: each analysis adds its own keys there.
Lives in the engine so that anything that reads a run's report.json (tools, a later triage)
can, whatever its layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from cutedebug import records
from cutedebug.engine.verdict import Verdict

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class StuckMapRow(records.Record):
    """One row of the stuck map: CTAs whose warps are all in the same state."""

    ctas: str  # "0-15,17"
    n_ctas: int
    cells: list[str]  # one label per warp


@dataclass(frozen=True, slots=True, kw_only=True)
class StuckMapSummary(records.Record):
    """The stuck map in report.json (the picture itself is stuck_map.svg beside it)."""

    svg: str
    warps: list[int]
    dropped_records: int
    n_stuck_reported: int
    hidden_rows: int
    rows: list[StuckMapRow]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunReport(records.Record):
    """report.json of one scenario run (``cutedebug run``, a triage call, a pytest item)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    scenario: dict[str, Any]  # Scenario.to_json()
    mode: Literal["run", "compile"]
    verdict: Verdict
    expected_verdict: str
    verdict_ok: bool
    localization: dict[str, Any]  # ok / expected / matched / why
    as_expected: bool
    reason: str
    tldr: str
    evidence: dict[str, Any]
    timings: dict[str, Any]
    health: dict[str, Any] | None
    repeats: list[dict[str, Any]]
    run_dir: str
    command: str  # reproduces the run
    log_tail: str
    stuck_map: StuckMapSummary | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecReport(records.Record):
    """report.json of one ``cutedebug exec`` run (any command, watched and instrumented)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    mode: Literal["exec"] = "exec"
    argv: list[str]
    cwd: str
    fault: str | None
    fault_args: dict[str, Any]
    fault_trace: dict[str, Any] | None  # only this trace got the fault (mutate)
    gpu_token: str | None
    probes: dict[str, Any] | None  # ProbeConfig fields; None: off
    deadline_s: float
    verdict: Verdict
    expected_verdict: str
    as_expected: bool
    reason: str
    tldr: str
    returncode: int | None
    killed_by_watchdog: str | None
    elapsed_s: float
    fault_count: int | None
    kernels_traced: int
    evidence: dict[str, Any]
    processes: list[dict[str, Any]]
    health: dict[str, Any] | None
    swept_pids: list[int]
    left_pids: list[int]
    gpu_wait_s: float
    first_run: dict[str, Any] | None
    run_dir: str
    command: str
    log_tail: str


def stuck_site_phrase(site: dict[str, Any], kernel: bool = False) -> str:
    """One phrase for a stuck site of the evidence (role, op, barrier[stage], phase,
    location; ``kernel``: the kernel's name first, for exec, where several kernels run)."""
    parts = [
        f"in {site.get('kernel')}" if kernel and site.get("kernel") else None,
        site.get("role"),
        site.get("op"),
        f"{site.get('barrier')}[{site.get('stage')}]" if site.get("barrier") else None,
        f"phase {site.get('phase')}" if site.get("phase") is not None else None,
        site.get("location"),
    ]
    return " ".join(str(p) for p in parts if p)
