"""The mutation matrix of `cutedebug mutate` as records (OUT/matrix.json: ``MutationMatrix``;
OUT/results.jsonl: one ``MutantRecord`` a line; OUT/clean.json: ``CleanReport``), serialised
through ``cutedebug.records``.

Mutant records of earlier versions (the one that ran on the H200, ff954a1) lack ``trace``,
``gpu_wait_s``, ``killed_by``, ``used_gpu`` and ``left_pids``: they read as the defaults and
write back without them, so ``--resume`` keeps them and the matrix lists them as they were.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from cutedebug import records
from cutedebug.engine.run_report import ExecReport
from cutedebug.engine.verdict import Verdict
from cutedebug.instrument.launch_record import PipelineEntry
from cutedebug.records import ABSENT, Absent, later

MATRIX_SCHEMA = 1
Status = Literal["CAUGHT", "SURVIVED", "NOT_APPLIED", "HARNESS_ERROR"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultSite(records.Record):
    """A traced call the mutant's fault changed (the first 20 of a mutant)."""

    kernel: str | None
    file: str | None
    line: int | None
    function: str | None
    op: str | None
    detail: str | None
    pid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MutantRecord(records.Record):
    """One finished mutant: what was injected where, what the command said, the status."""

    id: str
    fault: str
    args: dict[str, Any]
    trace: dict[str, Any] = later(default_factory=dict)  # {"function", "occurrence"}
    target: str
    variant: str
    why: str
    status: Status
    verdict: str  # a Verdict name (checked on reading)
    reason: str
    where: str
    fault_count: int
    sites: list[FaultSite]
    changes: str
    registry_expects: str
    registry_note: str
    elapsed_s: float
    gpu_wait_s: float = later(0.0)  # waiting for the GPU token: off the deadline clock
    killed_by: str | None = later(None)
    used_gpu: bool = later(False)
    left_pids: list[int] = later(default_factory=list)
    swept_pids: list[int]
    report: str  # its report.md, relative to OUT
    only_test: str | Absent = ABSENT  # under pytest: the one test item it ran (else the command)
    lacked: frozenset[str] = records.absent_keys()

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> MutantRecord:
        rec = records.from_json(cls, data, where)
        try:
            Verdict.from_json(rec.verdict, f"field {records.join(where, 'verdict')!r}")
        except ValueError as e:
            raise records.RecordError(str(e)) from None
        return rec


@dataclass(frozen=True, slots=True, kw_only=True)
class Score(records.Record):
    """caught / (caught + survived); NOT_APPLIED and HARNESS_ERROR are not scored."""

    counts: dict[str, int]
    caught_by: dict[str, int]  # HANG / CRASH / FAIL
    score: float | None  # None: nothing scored
    scored: int
    mutants: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CleanReport(ExecReport):
    """OUT/clean.json: the clean run's report.json (``cutedebug exec``'s) and whether the
    command used a GPU (mutants then take turns on it)."""

    used_gpu: bool

    @classmethod
    def of(cls, report: ExecReport, used_gpu: bool) -> CleanReport:
        return cls(**{f: getattr(report, f) for f in _INIT_FIELDS}, used_gpu=used_gpu)


_INIT_FIELDS = [f.name for f in dataclasses.fields(ExecReport) if f.init]


@dataclass(frozen=True, slots=True, kw_only=True)
class CleanRun(records.Record):
    """The clean run, as the matrix sums it up (clean.json holds all of it)."""

    verdict: str | None
    reason: str | None
    elapsed_s: float | None
    run_dir: str | None
    kernels_traced: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace(records.Record):
    """A trace of the clean run with what the recorder saw (``pipelines``: the recorder's
    pipeline entries, as it wrote them)."""

    t: int
    function: str | None
    occurrence: int
    # under pytest: the item that traced it (a mutant runs only it) and the n-th trace of the
    # function there; absent otherwise (and in files written before they existed)
    test: str | Absent = ABSENT
    test_occurrence: int | Absent = ABSENT
    kernels: list[str]
    kernel: str | None
    pipelines: list[PipelineEntry]
    arch_ops: dict[str, int]
    pid: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFacts(records.Record):
    """Leftover processes, GPU health after the kills, mutant times against the clean run."""

    clean_s: float
    wall_s: float
    max_mutant_s: float | None
    over_clean_plus_2s: list[str]
    processes_left: list[int]
    gpu_health: dict[str, Any] | None
    killed_on_gpu: int
    # under pytest: each traced test item run alone without a fault (its own seconds, the GPU
    # token's wait left out as for the mutants; None: it did not pass alone, and its mutants ran
    # the whole command): the baseline of its mutants' times
    alone_s: dict[str, float | None] | Absent = ABSENT
    alone_wait_s: dict[str, float] | Absent = ABSENT  # those runs' seconds waiting for the GPU
    # each mutant's own seconds (wall less the GPU token's wait): median and largest; and the
    # mutate run's wall per mutant (the mutants overlap: compiles in parallel, GPU runs in turn)
    mutant_own_s: dict[str, float] | Absent = ABSENT


@dataclass(frozen=True, slots=True, kw_only=True)
class MutationMatrix(records.Record):
    """OUT/matrix.json (``schema`` 1), key for key; ``facts`` only once every mutant ran."""

    schema: Literal[1]
    command: str
    argv: list[str]
    date: str
    clean: CleanRun
    targets: dict[str, str]  # target id -> label, in row order
    traces: list[Trace]
    score: Score
    planned: int
    mutants: list[MutantRecord]
    facts: RunFacts | Absent = ABSENT
