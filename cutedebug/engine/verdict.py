"""The closed set of verdicts and the table that turns a child's outcome into one.

``Verdict`` is the closed set, with its predicates beside it (``is_failure``,
``is_sanitizer_finding``, ``ends_at_compile``, ``ran_to_completion``, ...): other modules ask
a verdict what it is instead of keeping their own lists of names. ``SanitizerClass`` is the
closed set of what one compute-sanitizer run says (the four finding classes are the verdicts
of the same name; CLEAN, UNREADABLE and API_ERROR are its own). A verdict is serialised as its
name and read back through ``Verdict.from_json`` / ``sanitize_verdict``.

``classify`` turns an ``Outcome`` (what the runner observed) into a verdict by a table of rules,
first match wins. The parent imports this module; it must never import torch or cutlass.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass, field
from typing import Any

from cutedebug.event import Event
from cutedebug.event_kinds import (
    NAME_OF,
    Checked,
    Compiled,
    CompileError,
    CudaError,
    Done,
    HarnessError,
    P,
    PerturbSummary,
    ProbeReport,
    Progress,
    Unsupported,
)


class Verdict(str, enum.Enum):
    """The closed set of verdicts of one run. Serialised as its name (``to_json``), read back
    only through ``Verdict.from_json`` (an unknown name is an error naming the allowed ones)."""

    PASS = "PASS"
    MISMATCH = "MISMATCH"
    FAIL = "FAIL"  # `cutedebug exec`: the program's own check failed (non-zero exit)
    NONDETERMINISTIC = "NONDETERMINISTIC"
    HANG = "HANG"
    CRASH = "CRASH"
    COMPILE_ERROR = "COMPILE_ERROR"
    COMPILER_CRASH = "COMPILER_CRASH"
    RACE = "RACE"
    MEMORY_ERROR = "MEMORY_ERROR"
    SYNC_ERROR = "SYNC_ERROR"
    UNINIT = "UNINIT"
    UNSUPPORTED = "UNSUPPORTED"
    HARNESS_ERROR = "HARNESS_ERROR"

    def __str__(self) -> str:
        return self.value

    def to_json(self) -> str:
        return self.value

    @classmethod
    def from_json(cls, value: Any, where: str = "verdict") -> Verdict:
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{where}: {value!r} is not a verdict; one of {list(ALL)}") from None

    # ---- predicates (the subsets other modules used to spell out as strings) ----
    @property
    def is_failure(self) -> bool:
        """The kernel misbehaved (what a faulted scenario should produce)."""
        return self not in (Verdict.PASS, Verdict.UNSUPPORTED, Verdict.HARNESS_ERROR)

    @property
    def is_sanitizer_finding(self) -> bool:
        """A compute-sanitizer finding class (RACE, MEMORY_ERROR, SYNC_ERROR, UNINIT)."""
        return self in SANITIZER_FINDINGS

    @property
    def is_compile_stage(self) -> bool:
        """Decided while compiling: the kernel never ran (COMPILE_ERROR, COMPILER_CRASH)."""
        return self in (Verdict.COMPILE_ERROR, Verdict.COMPILER_CRASH)

    @property
    def ends_at_compile(self) -> bool:
        """A compile-only run with this verdict decides the scenario: there is nothing to run
        (the compile stage's verdicts, and a harness error, which a run would repeat)."""
        return self.is_compile_stage or self is Verdict.HARNESS_ERROR

    @property
    def ran_to_completion(self) -> bool:
        """The kernel finished and its output was compared (PASS, MISMATCH)."""
        return self in (Verdict.PASS, Verdict.MISMATCH)

    @property
    def is_ours(self) -> bool:
        """A bug of cutedebug's, never a verdict about the kernel."""
        return self is Verdict.HARNESS_ERROR


ALL = tuple(v.value for v in Verdict)
SANITIZER_FINDINGS = frozenset(
    {Verdict.RACE, Verdict.MEMORY_ERROR, Verdict.SYNC_ERROR, Verdict.UNINIT}
)


def is_failure(v: Verdict | str) -> bool:
    """The kernel misbehaved (what a faulted scenario should produce)."""
    return Verdict.from_json(v).is_failure


def values(pred) -> tuple[str, ...]:
    """The names of the verdicts a predicate holds for, in declaration order, e.g.
    ``values(lambda v: v.ends_at_compile)`` for a JSON record's string comparison."""
    return tuple(v.value for v in Verdict if pred(v))


class SanitizerClass(str, enum.Enum):
    """What one compute-sanitizer run says (closed set). The four finding classes are the
    verdicts of the same name; CLEAN needs positive evidence (the kernel ran, the output was
    read, nothing left after noise filtering); UNREADABLE is output that could not be read,
    never clean; API_ERROR is CUDA API errors only."""

    RACE = "RACE"
    MEMORY_ERROR = "MEMORY_ERROR"
    SYNC_ERROR = "SYNC_ERROR"
    UNINIT = "UNINIT"
    API_ERROR = "API_ERROR"
    UNREADABLE = "UNREADABLE"
    CLEAN = "CLEAN"

    def __str__(self) -> str:
        return self.value

    @property
    def verdict(self) -> Verdict | None:
        """The run verdict this class is, for the four finding classes; else None."""
        return Verdict(self.value) if self.value in Verdict._value2member_map_ else None

    @property
    def is_finding(self) -> bool:
        return self.verdict is not None


def sanitize_verdict(value: Any, where: str = "verdict") -> Verdict | SanitizerClass:
    """A serialised sanitize result: a run verdict (the kernel's own when it never ran under
    the tool, or a finding class) or CLEAN / UNREADABLE / API_ERROR."""
    if value in Verdict._value2member_map_:
        return Verdict(value)
    if value in SanitizerClass._value2member_map_:
        return SanitizerClass(value)
    allowed = list(ALL) + [c.value for c in SanitizerClass if c.verdict is None]
    raise ValueError(f"{where}: {value!r} is not a sanitize verdict; one of {allowed}")


# Phases the worker reports, in order. The phase a child was in when it died or was killed
# decides what its death means.
PHASES = (
    "spawned",
    "started",
    "imported",
    "compiling",
    "compiled",
    "launched",
    "synced",
    "checked",
    "done",
)


@dataclass
class Outcome:
    """What the runner observed about one child run (raw facts, no interpretation)."""

    phase: str = "spawned"  # last phase reached
    events: list[Event] = field(default_factory=list)
    returncode: int | None = None  # negative: killed by that signal
    killed_by_watchdog: str | None = None  # why: "deadline:<phase>" or "stall"
    malformed_lines: list[str] = field(default_factory=list)
    log_tail: str = ""
    elapsed_s: float = 0.0

    def __post_init__(self) -> None:
        self.events = [e if isinstance(e, Event) else Event.from_json(e) for e in self.events]

    def add(self, ev: Event | dict[str, Any]) -> bool:
        """Record an event (a JSON object is read as one); True when it moves the run to a
        later phase."""
        if not isinstance(ev, Event):
            ev = Event.from_json(ev)
        self.events.append(ev)
        name = ev.name
        if name in PHASES and PHASES.index(name) > PHASES.index(self.phase):
            self.phase = name
            return True
        return False

    def event(self, name: str) -> Event | None:
        """The last event of kind ``name``."""
        for ev in reversed(self.events):
            if ev.name == name:
                return ev
        return None

    def last(self, kind: type[P]) -> P | None:
        """The payload of the last event of that kind (cutedebug/event_kinds.py), or None."""
        ev = self.event(NAME_OF[kind])
        return None if ev is None else ev.as_kind(kind)

    def all(self, kind: type[P]) -> list[P]:
        """The payloads of every event of that kind, in order."""
        name = NAME_OF[kind]
        return [ev.as_kind(kind) for ev in self.events if ev.name == name]


@dataclass
class Classified:
    verdict: Verdict
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _died(o: Outcome) -> str:
    if o.returncode is None:
        return "did not exit"
    if o.returncode < 0:
        return f"killed by {_signal_name(o.returncode)}"
    return f"exited with status {o.returncode}"


# Each rule: (name, predicate, verdict, reason builder). First match wins; the order is the
# precedence (harness faults first, then the strongest evidence about the kernel).
def _rules():
    return [
        (
            "harness_error_event",
            lambda o: o.last(HarnessError) is not None,
            Verdict.HARNESS_ERROR,
            lambda o: "worker failed: " + (o.last(HarnessError).message or ""),
        ),
        (
            "malformed_events",
            lambda o: bool(o.malformed_lines) and o.last(Done) is None,
            Verdict.HARNESS_ERROR,
            lambda o: (
                f"worker wrote {len(o.malformed_lines)} malformed event line(s), first: "
                f"{o.malformed_lines[0][:120]!r}"
            ),
        ),
        (
            "stuck_records",
            lambda o: bool(_stuck_records(o)),
            Verdict.HANG,
            lambda o: (
                f"bounded waits timed out: {len(_stuck_records(o))} stuck "
                "record(s)"
                + (
                    f"; the kernel then faulted ({o.last(CudaError).name}"
                    ") after warps left their timed-out waits"
                    if o.last(CudaError)
                    else ""
                )
            ),
        ),
        (
            "stall",
            lambda o: o.killed_by_watchdog == "stall",
            Verdict.HANG,
            lambda o: "no probe counter moved for the stall window; child killed",
        ),
        (
            "kernel_deadline",
            lambda o: (
                (o.killed_by_watchdog or "").startswith("deadline") and o.phase in ("launched",)
            ),
            Verdict.HANG,
            lambda o: (
                f"kernel did not finish before the deadline ({o.killed_by_watchdog}); child killed"
            ),
        ),
        (
            "compile_deadline",
            lambda o: (
                (o.killed_by_watchdog or "").startswith("deadline") and o.phase == "compiling"
            ),
            Verdict.COMPILER_CRASH,
            lambda o: "compiler did not finish before the compile deadline; child killed",
        ),
        (
            "other_deadline",
            lambda o: o.killed_by_watchdog is not None,
            Verdict.HARNESS_ERROR,
            lambda o: f"worker stuck in phase {o.phase!r} ({o.killed_by_watchdog}); child killed",
        ),
        (
            "unsupported",
            lambda o: o.last(Unsupported) is not None,
            Verdict.UNSUPPORTED,
            lambda o: o.last(Unsupported).reason or "",
        ),
        (
            "compile_error",
            lambda o: o.last(CompileError) is not None,
            Verdict.COMPILE_ERROR,
            lambda o: (o.last(CompileError).message or "")[:2000],
        ),
        (
            "cuda_error",
            lambda o: o.last(CudaError) is not None,
            Verdict.CRASH,
            lambda o: f"{o.last(CudaError).name}: {(o.last(CudaError).message or '')[:500]}",
        ),
        (
            "died_compiling",
            lambda o: o.last(Done) is None and o.phase == "compiling",
            Verdict.COMPILER_CRASH,
            lambda o: f"compiler process {_died(o)}",
        ),
        (
            "died_running",
            lambda o: o.last(Done) is None and o.phase in ("launched", "synced"),
            Verdict.CRASH,
            lambda o: f"child {_died(o)} while the kernel ran",
        ),
        (
            "died_early",
            lambda o: o.last(Done) is None,
            Verdict.HARNESS_ERROR,
            lambda o: f"worker {_died(o)} in phase {o.phase!r} before reporting a result",
        ),
        (
            "perturb_nondeterministic",
            lambda o: (o.last(PerturbSummary) or PerturbSummary()).nondeterministic is True,
            Verdict.NONDETERMINISTIC,
            lambda o: (
                f"outputs differ bit for bit across perturbation seeds "
                f"({o.last(PerturbSummary).distinct_outputs} distinct outputs) for "
                f"a kernel that declares DETERMINISTIC"
            ),
        ),
        (
            "mismatch",
            lambda o: (o.last(Checked) or Checked()).ok is False,
            Verdict.MISMATCH,
            lambda o: _mismatch_reason(o.last(Checked)),
        ),
        (
            "pass",
            lambda o: (o.last(Checked) or Checked()).ok is True,
            Verdict.PASS,
            lambda o: _not_applied_prefix(o) + "output matches the reference",
        ),
    ]


def _not_applied_prefix(o: Outcome) -> str:
    """A PASS of a fault that applied at 0 sites is no evidence: the reason says so first."""
    note = (o.last(Compiled) or Compiled()).fault_not_applied
    return f"{note}; " if note else ""


RULES = _rules()


def _stuck_records(o: Outcome) -> list:
    """Stuck records from the final probe report, or, when the kernel then faulted, from the
    last live picture streamed before the fault."""
    final = (o.last(ProbeReport) or ProbeReport()).stuck
    if final:
        return final
    if o.last(CudaError) is not None:
        for ev in reversed(o.all(Progress)):
            if ev.picture:
                return ev.picture.get("stuck") or []
    return []


def _mismatch_reason(ev: Checked) -> str:
    return (
        f"{ev.n_bad} of {ev.numel} elements differ "
        f"({100.0 * (ev.frac_bad or 0):.3g}%), max abs err {ev.max_abs_err:.4g}, "
        f"first bad index {ev.first_bad_index}"
    )


def classify(o: Outcome) -> Classified:
    for name, pred, verdict, reason in RULES:
        if pred(o):
            return Classified(verdict, reason(o), {"rule": name})
    return Classified(
        Verdict.HARNESS_ERROR, f"no rule matched (phase {o.phase!r}, {_died(o)})", {"rule": None}
    )
