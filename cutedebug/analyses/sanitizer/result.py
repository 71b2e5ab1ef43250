"""One tool's result in ``sanitize.json`` (``ToolResult``), built by ``make_result`` from the
findings of one run; ``cutedebug.reporting.sanitize`` renders it."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cutedebug import records
from cutedebug.analyses.sanitizer.attribution import OtherKernel, attribute, other_kernels
from cutedebug.analyses.sanitizer.findings import Finding, source_line
from cutedebug.analyses.sanitizer.referee import RefereeResult
from cutedebug.analyses.sanitizer.shrink import ShrinkResult
from cutedebug.analyses.sanitizer.triage import Group, GroupRecord, classify, filter_noise, group
from cutedebug.engine.verdict import sanitize_verdict
from cutedebug.records import ABSENT, Absent


@dataclass(frozen=True, slots=True, kw_only=True)
class NoiseCount(records.Record):
    """How many findings one noise rule filtered (``ToolResult.filtered``)."""

    reason: str
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelSeconds(records.Record):
    """The kernel's own time (its "synced" event) under the sanitizer and without it."""

    sanitized: float | None
    plain: float | None
    slowdown: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult(records.Record):
    """One tool's run in ``sanitize.json`` (``tools.<tool>``), key for key.

    ``make_result`` fills the first part from the findings alone (``verdict`` is then the
    sanitizer's class). ``cutedebug sanitize`` adds the rest from the worker's run
    (``with_run``): those keys are ABSENT in a result made from a capture alone, and then
    ``verdict`` is the run's verdict and ``sanitizer_class`` what the findings said.
    """

    tool: str
    verdict: str  # a Verdict or a SanitizerClass name (checked on reading)
    exit_code: int | None
    command: list[str]
    reproduce: str
    xml: str | None
    groups: list[GroupRecord]
    filtered: list[NoiseCount]
    filtered_groups: list[GroupRecord]
    sanitizer_seconds: float | None
    plain_seconds: float | None
    slowdown: float | None
    shrink: ShrinkResult | None
    tma_filter: bool
    kernel_names: list[str]
    other_kernels: list[OtherKernel]
    # ---- from the worker's run under the tool (ABSENT in a result made from findings alone)
    sanitizer_class: str | Absent = ABSENT
    reason: str | Absent = ABSENT
    kernel_verdict: str | Absent = ABSENT
    kernel_reason: str | None | Absent = ABSENT
    killed_by_watchdog: str | None | Absent = ABSENT
    deadline_scale: float | Absent = ABSENT
    run_dir: str | Absent = ABSENT
    worker_log: str | Absent = ABSENT
    records: int | Absent = ABSENT  # the kernel under test's records (parse failures not)
    filtered_count: int | Absent = ABSENT
    other_kernel_records: int | Absent = ABSENT
    kernel_seconds: KernelSeconds | Absent = ABSENT
    reproduce_cutedebug: str | Absent = ABSENT  # the cutedebug command line, when given
    # what the tool cannot tell about its verdict in this kernel (triage.mbarrier_caveat)
    caveat: str | None | Absent = ABSENT
    # perturbed runs that confirm the caveated RACE or leave it unconfirmed (referee.py)
    referee: RefereeResult | None | Absent = ABSENT

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> ToolResult:
        result = records.from_json(cls, data, where)
        for key in ("verdict", "sanitizer_class", "kernel_verdict"):
            value = getattr(result, key)
            if value is not ABSENT:
                try:
                    sanitize_verdict(value, f"field {records.join(where, key)!r}")
                except ValueError as e:
                    raise records.RecordError(str(e)) from None
        return result


@dataclass(frozen=True, slots=True, kw_only=True)
class PlainRun(records.Record):
    """The worker without the sanitizer (line info on, probes off): the slowdown's base."""

    verdict: str
    reason: str
    seconds: float
    kernel_seconds: float | None
    run_dir: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SanitizeSummary(records.Record):
    """``sanitize.json``: the scenario, each tool's result, the plain run, and whether the
    scenario's expectation held (``as_expected``: set once judged; None: nothing the command
    ran could check it)."""

    scenario: dict[str, Any]  # the scenario as loaded (Scenario.to_json)
    expected_verdict: str
    tools: dict[str, ToolResult]
    plain: PlainRun | None
    run_dir: str
    reproduce: str
    as_expected: bool | None | Absent = ABSENT

    def verdicts(self) -> dict[str, str]:
        """Each tool's verdict."""
        return {t: r.verdict for t, r in self.tools.items()}


def make_result(
    tool: str,
    command: Sequence[str],
    findings: Sequence[Finding],
    *,
    env: Mapping[str, str] | None = None,
    exit_code: int | None = None,
    sanitizer_seconds: float | None = None,
    plain_seconds: float | None = None,
    xml_path: str | None = None,
    shrink_result: ShrinkResult | None = None,
    read_source: Callable[[str | None, int | None], str | None] | None = None,
    read_raw: Callable[[str | None, int | None], str | None] | None = None,
    ordered: Callable[[Finding], str | None] | None = None,
    tma_filter: bool = True,
    kernel_names: Sequence[str] = (),
) -> ToolResult:
    """The result of one tool's run from its findings (``render_markdown`` reads it).

    ``kernel_names``: the kernels the worker launched; findings of other kernels are listed
    under ``other_kernels`` and never decide the verdict (see ``attribute``).
    """
    read = read_source or source_line
    kept, filtered = filter_noise(
        findings, tma=tma_filter, read_source=read, read_raw=read_raw, ordered=ordered
    )
    kept, others = attribute(kept, kernel_names)
    reasons: dict[str, int] = {}
    for f in filtered:
        reasons[f.noise_reason or ""] = reasons.get(f.noise_reason or "", 0) + 1  # records
    env_part = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted((env or {}).items()))
    slowdown = sanitizer_seconds / plain_seconds if sanitizer_seconds and plain_seconds else None
    return ToolResult(
        tool=tool,
        verdict=classify(kept, tool),
        exit_code=exit_code,
        command=list(command),
        reproduce=(env_part + " " if env_part else "") + shlex.join(command),
        xml=xml_path,
        groups=[g.record(read) for g in group(kept)],
        filtered=[NoiseCount(reason=r, count=n) for r, n in reasons.items()],
        filtered_groups=[g.record(read, reason=_reason_of(g, filtered)) for g in group(filtered)],
        sanitizer_seconds=sanitizer_seconds,
        plain_seconds=plain_seconds,
        slowdown=slowdown,
        shrink=shrink_result,
        tma_filter=tma_filter,
        kernel_names=list(kernel_names),
        other_kernels=other_kernels(others, tool, read),
    )


def _reason_of(g: Group, filtered: Sequence[Finding]) -> str | None:
    for f in filtered:
        if (f.tool, f.kind, f.lines) == (g.tool, g.kind, g.lines):
            return f.noise_reason
    return None
