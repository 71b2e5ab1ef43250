"""From findings to a verdict: known noise set apart (with its reason), duplicates grouped,
the run classified into the closed set of ``SanitizerClass``."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from cutedebug import records
from cutedebug.analyses.sanitizer.findings import (  # noqa: F401  (enclosing_def re-exported)
    API_ERROR,
    BARRIER_MISUSE,
    HARDWARE_EXCEPTION,
    HAZARD_KINDS,
    LEAK,
    MISALIGNED,
    PARSE_FAILURE,
    RACE,
    RAW_HAZARD,
    TOOL_ERROR,
    UNINIT_READ,
    WAR_HAZARD,
    WAW_HAZARD,
    Finding,
    Triple,
    enclosing_def,
    source_line,
)
from cutedebug.analyses.sanitizer.tool import ERROR_EXITCODE
from cutedebug.engine.verdict import SanitizerClass, values
from cutedebug.records import ABSENT, Absent

# ---- run classes (closed set) ------------------------------------------------------------
CLEAN = SanitizerClass.CLEAN.value
CLASSES = tuple(c.value for c in SanitizerClass)  # the closed set is engine.verdict's
TOOL_CLASS = {
    "memcheck": "MEMORY_ERROR",
    "racecheck": "RACE",
    "synccheck": "SYNC_ERROR",
    "initcheck": "UNINIT",
}


def kind_class(kind: str, tool: str) -> str:
    """The run class a finding kind stands for."""
    if kind in HAZARD_KINDS:
        return "RACE"
    if kind.startswith("INVALID_") or kind in (MISALIGNED, HARDWARE_EXCEPTION, LEAK):
        return "MEMORY_ERROR"
    if kind == BARRIER_MISUSE:
        return "SYNC_ERROR"
    if kind == UNINIT_READ:
        return "UNINIT"
    if kind == API_ERROR:
        return "API_ERROR"
    if kind in (PARSE_FAILURE, TOOL_ERROR):
        return "UNREADABLE"
    return TOOL_CLASS.get(tool, "UNREADABLE")


# Which class wins when one run has several: the tool's own class first, then this order.
_CLASS_PRIORITY = ("MEMORY_ERROR", "RACE", "SYNC_ERROR", "UNINIT", "API_ERROR", "UNREADABLE")


# ---- noise -------------------------------------------------------------------------------
NOISE_PROC_ADDRESS = (
    "cuda-bindings probes driver entry points with cuGetProcAddress; "
    "a miss is reported as an API error but is not a kernel error"
)
NOISE_TMA = (
    "one side of the hazard is a bulk async copy (TMA); racecheck does not follow "
    "the mbarrier transaction count that orders it"
)
# Measured on the H200 (2026-12-02, reports/2026-12-02-h200/, step racecheck_idiom): a correct
# hand-off of thread-written shared memory through mbarriers alone
# (tools/sanitizer_samples/mbarrier_handoff.py --mode mbarrier) gave 102 WAR hazards, its
# sync_threads control 0, its real race (--mode none) 34 of the same kind at the same lines.
MBARRIER_CAVEAT = (
    "racecheck does not credit mbarrier arrive/wait ordering between threads' shared-memory "
    "accesses (on the H200 a correct mbarrier hand-off of thread-written shared memory gave "
    "102 WAR hazards, its sync_threads control none: tools/sanitizer_samples/"
    "mbarrier_handoff.py), and this kernel hands shared memory between threads through "
    "mbarriers ({how}): these hazards may be that hand-off, not a race; racecheck cannot tell "
    "them apart. The referee (`cutedebug sanitize --referee N`, on by default) runs the "
    "kernel under N perturbed schedules and says whether one of them changes the output"
)
NOISE_PIPELINE_ORDERED = (
    "both sides of the hazard lie inside one cutlass.pipeline's spans (the read between "
    "consumer_wait and consumer_release, the write between producer_acquire and a commit that "
    "arrives), whose mbarriers order them; racecheck does not credit mbarrier ordering "
    "(analyses/sanitizer/ordering.py)"
)
NOISE_ANALYSIS_DUP = "racecheck analysis record summarising hazards already reported one by one"

_TMA_SOURCE = re.compile(
    r"tma|cp_async_bulk|bulk_copy|copy_bulk|TmaCopy|CopyBulk|store_async_dsmem", re.IGNORECASE
)
_TMA_TEXT = re.compile(r"bulk|async copy|cp\.async\.bulk|UTMA|UBLKCP|\btma\b", re.IGNORECASE)


Reader = Callable[[str | None, int | None], str | None]


def filter_noise(
    findings: Iterable[Finding],
    *,
    tma: bool = True,
    read_source: Reader | None = None,
    read_raw: Reader | None = None,
    ordered: Callable[[Finding], str | None] | None = None,
) -> tuple[list[Finding], list[Finding]]:
    """(kept, filtered); every filtered finding carries its ``noise_reason``. ``read_source``
    gives a source line stripped, ``read_raw`` as written (default: from the path as recorded)."""
    read = read_source or source_line
    raw = read_raw or partial(source_line, strip=False)
    findings = list(findings)
    kept: list[Finding] = []
    filtered: list[Finding] = []
    typed_hazard_lines = {
        ln for f in findings if f.kind in (RAW_HAZARD, WAR_HAZARD, WAW_HAZARD) for ln in f.lines
    }
    for f in findings:
        reason = None
        if f.kind == API_ERROR and "cuGetProcAddress" in ((f.api or "") + f.text):
            reason = NOISE_PROC_ADDRESS
        elif f.kind == RACE and f.lines and set(f.lines) <= typed_hazard_lines:
            reason = NOISE_ANALYSIS_DUP
        elif tma and f.kind in HAZARD_KINDS and _touches_bulk_copy(f, read, raw):
            reason = NOISE_TMA
        elif ordered is not None and (why := ordered(f)):
            reason = f"{NOISE_PIPELINE_ORDERED}: {why}"
        if reason:
            filtered.append(replace(f, noise_reason=reason))
        else:
            kept.append(f)
    return kept, filtered


def _touches_bulk_copy(f: Finding, read: Reader, read_raw: Reader) -> bool:
    if _TMA_TEXT.search(f.text):
        return True
    for s in f.sites:
        if s.func and _TMA_SOURCE.search(s.func):
            return True
        src = read(s.file, s.line)
        if src and _TMA_SOURCE.search(src):
            return True
        # a library's bulk-copy helper: the line is a plain `cute.copy(` inside its
        # `def copy_bulk(...)` (quack's copy_utils, which FA-4's backward loads its LSE with)
        name = enclosing_def(s.file, s.line, read_raw)
        if name and _TMA_SOURCE.search(name):
            return True
    return False


# ---- grouping and classification ---------------------------------------------------------
@dataclass
class Group:
    kind: str
    tool: str
    severity: str
    lines: tuple[tuple[str | None, int | None], ...]
    kernel: str | None
    count: int = 0  # hazards/errors, summed over records
    records: int = 0
    threads: list[Triple] = field(default_factory=list)  # first few, distinct
    blocks: list[Triple] = field(default_factory=list)
    address_space: str | None = None
    size: int | None = None
    text: str = ""  # the first record's message
    accesses: tuple[str | None, ...] = ()

    def record(
        self,
        read_source: Callable[[str | None, int | None], str | None] | None = None,
        **extra: Any,
    ) -> GroupRecord:
        """The group as it is reported, each line with its source text."""
        read = read_source or source_line
        return GroupRecord(
            kind=self.kind,
            tool=self.tool,
            severity=self.severity,
            lines=[SourceLine(file=f, line=ln, source=read(f, ln)) for f, ln in self.lines],
            kernel=self.kernel,
            count=self.count,
            records=self.records,
            threads=list(self.threads),
            blocks=list(self.blocks),
            address_space=self.address_space,
            size=self.size,
            text=self.text,
            accesses=self.accesses,
            **extra,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceLine(records.Record):
    file: str | None
    line: int | None
    source: str | None  # the stripped source text; None when it could not be read


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupRecord(records.Record):
    """A ``Group`` in a sanitize result (its ``groups``, ``filtered_groups``, and the first
    groups of each other kernel): its source lines read, ``reason`` only for a filtered one."""

    kind: str
    tool: str
    severity: str
    lines: list[SourceLine]
    kernel: str | None
    count: int
    records: int
    threads: list[Triple]
    blocks: list[Triple]
    address_space: str | None
    size: int | None
    text: str
    accesses: tuple[str | None, ...]
    reason: str | None | Absent = ABSENT  # why it was filtered as noise


_MAX_EXAMPLES = 4
_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def group(findings: Iterable[Finding]) -> list[Group]:
    """Findings with the same tool, kind and source lines, counted; errors first."""
    groups: dict[tuple, Group] = {}
    for f in findings:
        key = (f.tool, f.kind, f.lines)
        g = groups.get(key)
        if g is None:
            g = groups[key] = Group(
                kind=f.kind,
                tool=f.tool,
                severity=f.severity,
                lines=f.lines,
                kernel=f.kernel,
                address_space=f.address_space,
                size=f.size,
                text=f.text,
                accesses=tuple(s.access for s in f.sites),
            )
        g.count += f.count
        g.records += 1
        if _SEVERITY_ORDER.get(f.severity, 3) < _SEVERITY_ORDER.get(g.severity, 3):
            g.severity = f.severity
        for t in f.threads:
            if t not in g.threads and len(g.threads) < _MAX_EXAMPLES:
                g.threads.append(t)
        for b in f.blocks:
            if b not in g.blocks and len(g.blocks) < _MAX_EXAMPLES:
                g.blocks.append(b)
    order = list(groups.values())
    order.sort(
        key=lambda g: (_SEVERITY_ORDER.get(g.severity, 3), g.kind == PARSE_FAILURE, -g.count)
    )
    return order


def classify(kept: Iterable[Finding], tool: str) -> str:
    """One of CLASSES for the kept (not filtered) findings of one tool's run."""
    classes = {kind_class(f.kind, f.tool or tool) for f in kept if f.severity != "info"}
    if not classes:
        return CLEAN
    own = TOOL_CLASS.get(tool)
    if own in classes:
        return own
    return next(c for c in _CLASS_PRIORITY if c in classes)


def mbarrier_caveat(
    sanitizer_class: str, pipelines: Sequence[Any] | None, sites: Sequence[Any] | None
) -> str | None:
    """What a racecheck RACE cannot tell in a kernel that orders shared memory by mbarriers
    (its pipelines, or raw mbarrier waits among its protocol sites); None otherwise. The class
    stays RACE: a hazard the tool reported is never called clean on a guess."""
    if sanitizer_class != "RACE":
        return None
    raw = [s for s in sites or [] if "wait" in str(s.get("op", "")) and s.get("pipeline") is None]
    if pipelines:
        how = f"{len(pipelines)} pipeline(s)"
    elif raw:
        how = f"{len(raw)} raw mbarrier wait line(s)"
    else:
        return None
    return MBARRIER_CAVEAT.format(how=how)


# ---- the verdict of one sanitized run -----------------------------------------------------
FINDING_VERDICTS = values(lambda v: v.is_sanitizer_finding)


def tool_verdict(
    sanitizer_class: str,
    kernel_verdict: str,
    kernel_reason: str,
    *,
    launched: bool,
    synced: bool,
    killed: str | None,
    exit_code: int | None,
    records: int,
    other_records: int = 0,
) -> tuple[str, str]:
    """(verdict, reason) of one sanitized run, from what the sanitizer and the worker said.

    CLEAN needs positive evidence: the kernel was launched, finished, and the sanitizer's
    output was read. A run whose kernel never ran says what the worker said (UNSUPPORTED,
    COMPILE_ERROR, ...), never CLEAN. ``records``: the kernel under test's; ``other_records``:
    other kernels' of the process (they explain the tool's error exit code, never the verdict).
    """
    if killed:
        return kernel_verdict, (
            f"the sanitized run was killed by the watchdog ({killed}): {kernel_reason}"
        )
    if not launched:
        why = f"the kernel never ran under the sanitizer: {kernel_reason}"
        if records:
            why += (
                f"; the sanitizer output holds {records} record(s) that cannot come from "
                "this kernel's launch (kept in the report, not used for the verdict)"
            )
        return kernel_verdict, why
    if sanitizer_class in FINDING_VERDICTS:
        return sanitizer_class, "findings below"
    if sanitizer_class == "UNREADABLE":
        return "UNREADABLE", "the sanitizer's output could not be read (see PARSE_FAILURE)"
    if exit_code == ERROR_EXITCODE and not records and not other_records:
        return "UNREADABLE", (
            f"the sanitizer exited with its error code {ERROR_EXITCODE} but no record was read"
        )
    if not synced:
        return kernel_verdict, (
            f"the kernel failed and the sanitizer named no cause: {kernel_reason}"
        )
    if sanitizer_class != CLEAN:
        return sanitizer_class, "unfiltered findings below"
    return CLEAN, (
        f"no findings after noise filtering; the kernel ran to completion ({kernel_verdict})"
    )
