"""The records of a triage: one ``TriageRecord`` per scenario (OUT/results/<id>.json, the
source of truth), its ``CallRecord`` per compile / run call, its ``BisectCall`` when it was
bisected, and the ``TriageMatrix`` (OUT/matrix.json) that holds them all.

Serialised only through ``to_json`` / ``from_json`` (cutedebug/records.py): reading refuses an
unknown or missing field, naming it. Keys that later versions added (``expected.also``, a
call's ``work_s`` / ``perturbation`` / ``value_diagnosis`` / ``gpu`` / ``gpu_wait_s``, a record's
``bisect``)
are ABSENT when an older file lacks them, so an old record or matrix writes back unchanged
(tests/test_records.py round-trips the recorded H200 matrices under reports/). A pending
record has none of the grading fields (``verdict``, ``frequencies``, ...): they are ABSENT
until ``finalize`` (commands/triage_records.py) sets them.

Built and graded by cutedebug/commands/triage_records.py; rendered by reporting/matrix.py;
read for --durations by engine/shards.py (hence its place in the engine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from cutedebug import records
from cutedebug.engine import scenario as S
from cutedebug.engine.verdict import Verdict
from cutedebug.records import ABSENT, Absent

RECORD_SCHEMA = "cutedebug.triage.record/1"
MATRIX_SCHEMA = "cutedebug.triage.matrix/1"

Status = Literal["pending", "compiled", "bisecting", "done"]
Mode = Literal["compile", "run"]


@dataclass(slots=True, kw_only=True)
class Expected(records.Record):
    """What the scenario expects: the verdict (a Verdict name; "?" for an invalid scenario
    file), those it also accepts (timing-dependent scenarios), the localization graded."""

    verdict: str
    also: list[str] | Absent = ABSENT
    localization: dict[str, Any]

    def expect(self) -> S.Expect:
        """The scenario's Expect for these verdicts (what ``accepts`` a verdict)."""
        return S.Expect(verdict=self.verdict, also=tuple(self.also or ()))


@dataclass(slots=True, kw_only=True)
class CallRecord(records.Record):
    """One compile or run call of a scenario (``runner.run_scenario``)."""

    mode: Mode
    verdict: Verdict
    reason: str
    compiled: bool
    fault_count: int | None
    static_findings: list[dict[str, Any]] | None  # errors and warnings; None: not checked
    localization: dict[str, Any]
    verdicts: list[Verdict]  # one per repeat
    harness_errors: int
    wall_s: float
    compile_s: float
    kernel_s: float
    work_s: float | Absent = ABSENT
    overhead_s: float
    device: dict[str, Any] | None
    report: str | None  # the run's report.md, relative to the triage's output folder
    perturbation: dict[str, Any] | None | Absent = ABSENT
    value_diagnosis: dict[str, Any] | None | Absent = ABSENT
    gpu: str | Absent = ABSENT  # the GPU lane that ran it (--gpus)
    # waiting for the GPU token while other runs' kernels ran: inside wall_s, outside the
    # call's own time (overhead_s, the record's time_to_verdict_s)
    gpu_wait_s: float | Absent = ABSENT

    @property
    def own_s(self) -> float:
        """The call's own seconds: its wall time without the wait for the GPU."""
        return round(self.wall_s - (self.gpu_wait_s or 0.0), 3)


@dataclass(slots=True, kw_only=True)
class BisectCall(records.Record):
    """What a printf-bisection of the scenario answered (status "error": it raised)."""

    status: str
    ok: bool | None
    grade: dict[str, Any] | Absent = ABSENT
    reason: str | Absent = ABSENT
    answer: dict[str, Any] | Absent = ABSENT
    runs: int | Absent = ABSENT
    timing_bug: list[Any] | Absent = ABSENT
    wall_s: float | Absent = ABSENT
    report: str | None | Absent = ABSENT


@dataclass(slots=True, kw_only=True)
class TriageRecord(records.Record):
    """One scenario of a triage. Mutable: it goes pending -> compiled -> (bisecting) -> done
    as its calls finish, and is written after each step."""

    schema: Literal["cutedebug.triage.record/1"] = RECORD_SCHEMA
    id: str
    source: str | None
    kernel: str  # FILE.py:ENTRY ("?" for an invalid scenario file)
    fault: str | None
    fault_args: dict[str, Any]
    params: dict[str, Any]
    digest: str | None  # scenario file + kernel source; --resume reuses a record only if equal
    repeat: int
    expected: Expected
    compile: CallRecord | None
    run: CallRecord | None
    not_run: str | None  # why it could only be compiled here
    invalid: str | None  # why the scenario file is invalid
    status: Status
    # grading, set by finalize (ABSENT while pending)
    finished_at: str | Absent = ABSENT
    caught_statically: bool | None | Absent = ABSENT
    harness_errors: int | Absent = ABSENT
    verdict: Verdict | None | Absent = ABSENT
    verdict_ok: bool | None | Absent = ABSENT
    localization_ok: bool | None | Absent = ABSENT
    frequencies: dict[str, int] | Absent = ABSENT  # verdict -> count over the repeats
    timing_dependent: bool | Absent = ABSENT
    time_to_verdict_s: float | None | Absent = ABSENT
    overhead_s: float | None | Absent = ABSENT
    bisect: BisectCall | Absent = ABSENT
    core_vs_bisect: dict[str, Any] | Absent = ABSENT

    @property
    def done(self) -> bool:
        return self.status == "done"

    @property
    def final(self) -> CallRecord | None:
        """The call that decided the verdict: the run, else the compile-only one."""
        return self.run or self.compile


@dataclass(frozen=True, slots=True, kw_only=True)
class Rate(records.Record):
    """One rate of the matrix: ``hits`` of ``of`` (``rate`` None when ``of`` is 0)."""

    hits: int
    of: int
    rate: float | None
    what: str  # what is counted, in words

    def text(self) -> str:
        """ "67% (4/6)", or "n.a." when nothing was counted."""
        return "n.a." if self.rate is None else f"{100 * self.rate:.0f}% ({self.hits}/{self.of})"


@dataclass(frozen=True, slots=True, kw_only=True)
class Counts(records.Record):
    scenarios: int
    with_verdict: int
    not_run: int  # left out of every rate
    invalid: int
    pending: int
    not_run_reasons: dict[str, int]
    harness_errors: int
    timing_dependent: int
    # faulted scenarios whose failure only a perturbed schedule showed (--perturb)
    exposed_by_perturbation: int = records.later(0)
    absent: frozenset[str] = records.absent_keys()


@dataclass(frozen=True, slots=True, kw_only=True)
class Rates(records.Record):
    """The matrix's rates, each over the scenarios that have a verdict (commands/triage.py)."""

    detection: Rate
    classification: Rate
    localization: Rate
    false_alarms: Rate
    counts: Counts

    def rate(self, key: str) -> Rate:
        """One of RATE_KEYS by name."""
        return getattr(self, key)


RATE_KEYS = ("detection", "classification", "localization", "false_alarms")


@dataclass(frozen=True, slots=True, kw_only=True)
class Environment(records.Record):
    """Where the triage ran (commands/triage_records.py: ``environment``)."""

    date: str
    host: str | None
    python: str | None
    cutlass: str | None  # the nvidia-cutlass-dsl version
    torch: str | None
    gpu: str | None  # its name; None: no GPU (gpu_reason says why)
    arch: str | None
    driver: str | None
    gpu_reason: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts(records.Record):
    """What the triage run itself did: harness errors, processes of ours left, the GPU's
    health after it, the harness's overhead, the wall time (merge: per shard too)."""

    harness_errors: int
    processes_left: list[int]
    gpu_health: dict[str, Any] | None
    overhead_s: dict[str, Any]  # n, mean, max, max_id (n 0: nothing measured)
    total_s: float
    interrupted: bool
    gpus: dict[str, Any] | None = records.optional(None)  # --gpus: per lane
    processes_left_by_gpu: dict[str, Any] | None = records.optional(None)
    shards: list[dict[str, Any]] | None = records.optional(None)  # `cutedebug merge`


@dataclass(slots=True, kw_only=True)
class TriageMatrix(records.Record):
    """OUT/matrix.json: the records, their rates and the run's facts."""

    schema: Literal["cutedebug.triage.matrix/1"] = MATRIX_SCHEMA
    dir: str
    command: str
    environment: Environment
    rates: Rates
    facts: Facts | None  # None until the triage ends
    scenarios: list[TriageRecord]
