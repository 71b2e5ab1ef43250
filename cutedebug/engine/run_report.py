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
from cutedebug.instrument.launch_record import RecordedProtocol
from cutedebug.records import ABSENT, Absent, later

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
class ExecTrace(records.Record):
    """One trace (``cute.compile`` / first ``@cute.jit`` call) of a process of the command,
    from its ``compiled`` event. Files of ff954a1 lack ``fault_not_applied``."""

    index: int | None
    function: str | None
    occurrence: int | None
    test: str | None = later(None)  # the pytest item that traced it (mutate narrows to it)
    test_occurrence: int | None = later(None)
    kernels: list[str] | None
    error: str | None
    fault_applied: int | None
    fault_not_applied: str | None = later(None)
    gpu: bool | None
    protocol: RecordedProtocol | None  # with the recorder on (mutate's clean run)
    lacked: frozenset[str] = records.absent_keys()


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecProcess(records.Record):
    """One Python process of the command that wrote events (engine/command.py's process tree);
    a key its events did not give is left out."""

    pid: int
    traces: list[ExecTrace]
    fault_count: int
    stuck: int
    argv: list[str] | None | Absent = ABSENT  # the ``process`` event
    ppid: int | None | Absent = ABSENT
    instrumented: dict[str, Any] | Absent = ABSENT  # the ``instrumented`` event, as written
    errors: list[dict[str, Any]] | Absent = ABSENT  # ``instrument_error`` events
    # ``cuda_error`` events: a kernel of the process faulted (the probe monitor, the exit query)
    cuda_errors: list[dict[str, Any]] | Absent = ABSENT
    # the last ``cuda_context`` event: its CUDA context read when it ended (a CuTe DSL launch)
    cuda_context: dict[str, Any] | Absent = ABSENT
    fault_sites: list[dict[str, Any]] | Absent = ABSENT
    stall: dict[str, Any] | Absent = ABSENT  # the ``stall`` event
    gpu_waiting: bool | Absent = ABSENT
    exited: bool | Absent = ABSENT
    probe_sites: list[dict[str, Any]] | None  # the last ``compiled`` event's


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecReport(records.Record):
    """report.json of one ``cutedebug exec`` run (any command, watched and instrumented).
    Files of ff954a1 (mutate's clean.json there) lack ``fault_trace``, ``gpu_token``,
    ``left_pids`` and ``gpu_wait_s``: they read as the defaults and write back without them."""

    schema_version: Literal[1] = SCHEMA_VERSION
    mode: Literal["exec"] = "exec"
    argv: list[str]
    cwd: str
    fault: str | None
    fault_args: dict[str, Any]
    fault_trace: dict[str, Any] | None = later(None)  # only this trace got the fault (mutate)
    gpu_token: str | None = later(None)
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
    processes: list[ExecProcess]
    health: dict[str, Any] | None
    swept_pids: list[int]
    left_pids: list[int] = later(default_factory=list)
    gpu_wait_s: float = later(0.0)
    first_run: dict[str, Any] | None
    run_dir: str
    command: str
    log_tail: str
    lacked: frozenset[str] = records.absent_keys()


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
