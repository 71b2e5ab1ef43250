"""bisect.json as records: ``BisectReport`` and its parts (the baseline run, the grade against
the scenario's expected localization, the probes' answer), serialised through
``cutedebug.records``. ``cutedebug.analyses.bisect`` builds the report
(``BisectResult.report()``); ``bisect_answer`` makes the grade and the probes' answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from cutedebug import records
from cutedebug.analyses.bisect_search import RunRecord, SearchRecord
from cutedebug.instrument.checkpoint import CheckpointSite
from cutedebug.records import ABSENT, Absent

SCHEMA_VERSION = 1
Status = Literal["localized", "nothing_to_bisect", "no_sites", "error"]
Agreement = Literal["agree", "consistent", "disagree"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Baseline(records.Record):
    """The baseline run (the scenario as it is, no checkpoint enabled)."""

    verdict: str
    reason: str
    probes: bool
    seconds: float
    dir: str
    compile_s: float | None
    # with probes on, when the probes saw stuck warps
    stuck_sites: list[dict[str, Any]] | Absent = ABSENT
    diagnosis: list[Any] | Absent = ABSENT


@dataclass(frozen=True, slots=True, kw_only=True)
class GradeMatch(records.Record):
    """The role and first unreached site that agreed with the expected localization."""

    role: str
    op: str | None
    barrier: str | None
    site: int
    where: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Grade(records.Record):
    """The bisection against the scenario's expected localization. Every key ABSENT: not
    graded (the bisection did not run its search); ``ok`` None: nothing was expected."""

    ok: bool | None | Absent = ABSENT
    expected: dict[str, Any] | Absent = ABSENT
    matched: GradeMatch | Absent = ABSENT  # ok True
    why: str | Absent = ABSENT  # ok False

    @property
    def passed(self) -> bool | None:
        """True / False when graded against an expectation, else None."""
        return records.present(self.ok)


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleAgreement(records.Record):
    """One role: the probes' stuck wait and whether it agrees with the bisection."""

    probe: str
    location: str | None
    op: str | None
    agreement: Agreement
    n_stuck_warps: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbesAnswer(records.Record):
    """The bounded-wait probes' answer per role; ``agree`` None when they named no role."""

    roles: dict[str, RoleAgreement] = field(default_factory=dict)
    agree: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TimingBug(records.Record):
    """A checkpoint whose run made the hang vanish."""

    site: int
    verdict: str
    where: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class BisectReport(records.Record):
    """bisect.json (``schema_version`` 1), key for key."""

    schema_version: Literal[1]
    scenario: dict[str, Any]
    status: Status
    reason: str
    seconds: float
    window_s: float
    baseline: Baseline
    sites: list[CheckpointSite]
    roles: dict[str, list[int]]
    searches: dict[str, SearchRecord]
    runs: list[RunRecord]
    n_runs: int
    timing_bug: list[TimingBug]
    probes_answer: ProbesAnswer | None
    grade: Grade
    ok: bool
    command: str
