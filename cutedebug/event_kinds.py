"""The payload of each event kind of the event channel (cutedebug/event.py has the envelope).

One record type a kind, registered in ``KINDS`` by the kind's name; ``Event.from_json`` reads a
line's payload with it (a key the kind does not have, or a value of the wrong type, is refused
naming the field) and ``Events.emit`` builds it from the writer's keywords (a keyword the kind
does not have is a TypeError in the writer). A kind this version does not know (a later one's,
a test double's) keeps its fields as an open object (``OtherPayload``).

Every field may be left out: writers give what they have (the worker's ``compiled`` and
``cutedebug exec``'s differ), recordings of earlier versions lack later keys, and a line cut to
its scalars (``cut_by_cutedebug``) lacks the rest; a field left out reads as None. ``keys``
keeps the keys given, in their order, so that a line reads back and writes back as it was.

Imports no other cutedebug module but records (every layer may use it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from cutedebug import records

P = TypeVar("P", bound="Payload")
Json = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Payload(records.Record):
    """An event kind's own fields (the base of every kind's record)."""

    # what Events.emit wrote when the line passed its size limit (only its scalars kept)
    cut_by_cutedebug: str | None = None
    keys: tuple[str, ...] | None = records.transient(None)  # given, in order (None: every field)

    @classmethod
    def of(cls: type[P], **fields: Any) -> P:
        """The payload of a writer's keywords (TypeError naming one the kind lacks)."""
        return cls(**fields, keys=tuple(fields))

    @classmethod
    def from_json(cls: type[P], data: Any, where: str = "") -> P:
        rec = records.from_json(cls, data, where)
        return dataclasses.replace(rec, keys=tuple(data))

    def given(self) -> tuple[str, ...]:
        """The payload's JSON keys, in order."""
        return self.keys if self.keys is not None else tuple(f.name for f in _own(type(self)))

    def value(self, key: str) -> Any:
        """The value of JSON key ``key`` (KeyError when not given)."""
        if key not in self.given():
            raise KeyError(key)
        return getattr(self, key)

    def to_json(self) -> Json:
        return {k: records.to_json_value(getattr(self, k)) for k in self.given()}


def _own(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.name not in ("keys", "cut_by_cutedebug")]


@dataclass(frozen=True, slots=True, kw_only=True)
class OtherPayload:
    """The fields of a kind this version does not know, as they came."""

    fields: Json

    def given(self) -> tuple[str, ...]:
        return tuple(self.fields)

    def value(self, key: str) -> Any:
        return self.fields[key]

    def to_json(self) -> Json:
        return records.to_json_value(self.fields)

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> OtherPayload:
        return cls(fields=dict(data))


KINDS: dict[str, type[Payload]] = {}
NAME_OF: dict[type[Payload], str] = {}


def kind(name: str):
    """Register a payload record as the kind ``name``'s (one record type, one kind)."""

    def register(cls: type[P]) -> type[P]:
        KINDS[name], NAME_OF[cls] = cls, name
        return cls

    return register


def payload_of(name: str, fields: Json) -> Payload | OtherPayload:
    """A writer's keywords as the kind's payload."""
    cls = KINDS.get(name)
    return OtherPayload(fields=fields) if cls is None else cls.of(**fields)


def read_payload(name: str, data: Json, where: str = "") -> Payload | OtherPayload:
    """A line's payload keys as the kind's payload (RecordError naming a field that does not
    fit)."""
    cls = KINDS.get(name)
    return OtherPayload.from_json(data) if cls is None else cls.from_json(data, where)


# ---- the worker (engine/worker.py, engine/launching.py) -----------------------------------------
@kind("started")
@dataclass(frozen=True, slots=True, kw_only=True)
class Started(Payload):
    pid: int | None = None
    python: str | None = None
    mono0: float | None = None  # the worker's t = 0 on the system-wide monotonic clock


@kind("device")
@dataclass(frozen=True, slots=True, kw_only=True)
class Device(Payload):
    """The GPU the worker would run on (engine/worker.py: detect_device), or why none."""

    present: bool | None = None
    reason: str | None = None
    name: str | None = None
    cc: list[int] | None = None
    arch: str | None = None
    torch: str | None = None
    cuda: str | None = None


@kind("unsupported")
@dataclass(frozen=True, slots=True, kw_only=True)
class Unsupported(Payload):
    reason: str | None = None


@kind("imported")
@dataclass(frozen=True, slots=True, kw_only=True)
class Imported(Payload):
    params: Json | None = None  # the kernel's parameters, defaults filled in


@kind("compiling")
@dataclass(frozen=True, slots=True, kw_only=True)
class Compiling(Payload):
    arch: str | None = None
    fault: str | None = None
    fault_args: Json | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure(Payload):
    """An exception: what was raised, where, its traceback's end."""

    type: str | None = None
    frame: str | None = None  # harness_error: the cutedebug frame that raised
    message: str | None = None
    traceback: str | None = None


@kind("harness_error")
@dataclass(frozen=True, slots=True, kw_only=True)
class HarnessError(Failure):
    """A bug of ours (or the worker died under us: the parent adds one)."""


@kind("kernel_error")
@dataclass(frozen=True, slots=True, kw_only=True)
class KernelError(Failure):
    """The user's kernel file failed (import, construction, inputs): their input."""


@kind("instrument_error")
@dataclass(frozen=True, slots=True, kw_only=True)
class InstrumentError(Failure):
    """cutedebug exec: the instrumentation failed inside the command."""


@kind("compile_error")
@dataclass(frozen=True, slots=True, kw_only=True)
class CompileError(Failure):
    """The DSL rejected the kernel; for its alignment errors, the evidence
    (engine/valuemap.py: alignment_fields)."""

    copy_sites: list[Json] | None = None
    misaligned_args: list[Json] | None = None
    claim_lines: list[Any] | None = None


@kind("compiled")
@dataclass(frozen=True, slots=True, kw_only=True)
class Compiled(Payload):
    """A finished trace: the worker's (the first block) or, under ``cutedebug exec``, one
    trace of the command (the second block; instrument/launch.py)."""

    secs: float | None = None
    arch: str | None = None
    ptx_bytes: int | None = None
    kernel_names: list[str] | None = None
    compile_key: str | None = None
    fault_sites: list[Json] | None = None
    fault_count: int | None = None
    fault_not_applied: str | None = None  # instrument/faults: a fault at 0 sites says so
    probe_sites: list[Json] | None = None
    wait_sites: list[Json] | None = None
    static_findings: list[Json] | None = None
    pipelines: list[Json] | None = None  # instrument/protocol: pipeline_table
    compile_cache: Json | None = None  # engine/compile_cache: whether the back end was reused
    # cutedebug exec
    index: int | None = None
    function: str | None = None
    occurrence: int | None = None
    test: str | None = None  # the pytest item that traced it (its node id), under pytest
    test_occurrence: int | None = None  # the n-th trace of the function in that test
    kernels: list[str] | None = None
    error: str | None = None
    gpu: bool | None = None
    fault_applied: int | None = None
    protocol: Json | None = None  # instrument/launch_record: RecordedProtocol


@kind("protocol_sites")
@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolSites(Payload):
    """The lines a wrong-value diagnosis can point at (engine/valuemap.py)."""

    sites: list[Json] | None = None
    stores: list[Json] | None = None
    raw_waits: list[Json] | None = None  # raw mbarrier wait lines (the sanitizer's caveat)


@kind("launched")
@dataclass(frozen=True, slots=True, kw_only=True)
class Launched(Payload):
    pass


@kind("synced")
@dataclass(frozen=True, slots=True, kw_only=True)
class Synced(Payload):
    kernel_s: float | None = None


@kind("done")
@dataclass(frozen=True, slots=True, kw_only=True)
class Done(Payload):
    pass


@kind("cuda_error")
@dataclass(frozen=True, slots=True, kw_only=True)
class CudaError(Payload):
    name: str | None = None  # e.g. cudaErrorIllegalAddress
    message: str | None = None
    surfaced: str | None = None  # where the sticky error was raised, when not at the launch
    kernel: str | None = None  # the CuTe DSL kernel(s) last launched before it (exec's query)


@kind("cuda_context")
@dataclass(frozen=True, slots=True, kw_only=True)
class CudaContext(Payload):
    """What `cutedebug exec`'s query of a process's CUDA context read when the process ended
    (instrument/launch_context.py): ``ok`` / ``busy`` (no error; work still in flight),
    ``error`` (the sticky error a faulted kernel left: the driver's name), ``unread`` (``why``)
    or ``none`` (no context left); ``launched`` at the process's first CuTe DSL launch (the
    reading is due at its end)."""

    state: str | None = None
    error: str | None = None  # e.g. CUDA_ERROR_ILLEGAL_ADDRESS
    message: str | None = None
    why: str | None = None
    via: str | None = None
    kernel: str | None = None  # the CuTe DSL kernel(s) last launched in the process
    when: str | None = None  # exit / os._exit


@kind("gpu_check")
@dataclass(frozen=True, slots=True, kw_only=True)
class GpuCheck(Payload):
    """The GPU check the worker makes in its own CUDA context after the probes ended a hang
    (engine/health.py: in_worker_check); the runner takes it for the check in a new process
    when nothing was killed (engine/runner.py: worker_gpu_check)."""

    healthy: bool | None = None
    device: str | None = None
    free_gib: float | None = None
    via: str | None = None
    error: str | None = None
    reason: str | None = None
    secs: float | None = None


@kind("checked")
@dataclass(frozen=True, slots=True, kw_only=True)
class Checked(Payload):
    """The output against the reference (engine/launching.py: compare), or why it was not
    compared (``skipped``); for wrong values, where they are (engine/valuemap.py)."""

    skipped: str | None = None
    ok: bool | None = None
    numel: int | None = None
    n_bad: int | None = None
    frac_bad: float | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    first_bad_index: list[int] | None = None  # per dimension
    shape_mismatch: list[list[int]] | None = None
    n_nan: int | None = None
    atol: float | None = None
    rtol: float | None = None
    digest: str | None = None
    mismatch_map: Json | None = None
    mismatch_mask: str | None = None
    mismatch_map_error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Picture(Payload):
    """A probe picture's keys (instrument/probe_host.py: ProbePicture reads them strictly)."""

    warps: list[Json] | None = None
    stuck: list[Json] | None = None
    beacons: list[Json] | None = None
    stuck_unlisted: int | None = None
    beacons_unlisted: int | None = None
    progress_counter_total: int | None = None
    n_stuck_reported: int | None = None
    header_magic: int | None = None
    max_ctas: int | None = None
    diagnosis: list[str] | None = None


@kind("probe_report")
@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeReport(Picture):
    """The probe buffer after the kernel (a ProbePicture)."""

    after_cuda_error: bool | None = None  # read after the context died


@kind("progress")
@dataclass(frozen=True, slots=True, kw_only=True)
class Progress(Payload):
    """Live: the progress counter and the stuck count, with a picture now and then."""

    counter: int | None = None
    stuck: int | None = None
    picture: Json | None = None


# ---- perturbation (engine/perturb_runs.py) ------------------------------------------------------
@kind("perturb_positions")
@dataclass(frozen=True, slots=True, kw_only=True)
class PerturbPositions(Payload):
    positions: list[Json] | None = None
    dropped: int | None = None
    policy: Json | None = None
    shape: Json | None = None  # the launch the random keys were drawn for (ctas, warps, ...)
    replay_of: int | None = None  # the seed a replay asked for (--replay SEED)


@kind("perturb_seed")
@dataclass(frozen=True, slots=True, kw_only=True)
class PerturbSeed(Payload):
    seed: int | None = None
    tag: str | None = None  # seed | shrink | shrunk
    rules: list[Json] | None = None
    policy: Json | None = None  # the seed's own policy (the sanitizer's referee: one per seed)


@kind("perturb_result")
@dataclass(frozen=True, slots=True, kw_only=True)
class PerturbResult(Payload):
    seed: int | None = None
    tag: str | None = None
    outcome: str | None = None
    digest: str | None = None


@kind("perturb_shrunk")
@dataclass(frozen=True, slots=True, kw_only=True)
class PerturbShrunk(Payload):
    seed: int | None = None
    rules: list[Json] | None = None
    described: list[str] | None = None
    runs: int | None = None
    from_rules: int | None = None
    reproduced: bool | None = None
    error: str | None = None


@kind("perturb_summary")
@dataclass(frozen=True, slots=True, kw_only=True)
class PerturbSummary(Payload):
    seeds: list[int | None] | None = None
    runs: int | None = None
    exposed_by: int | None = None
    exposing_outcome: str | None = None
    exposing_policy: Json | None = None  # the exposing seed's policy (its replay's)
    exposing_rules: list[Json] | None = None
    described: list[str] | None = None
    nondeterministic: bool | None = None
    distinct_outputs: int | None = None
    digest_seeds: dict[str, int | None] | None = None
    referee: Json | None = None  # the referee's schedules: runs per family, targets (words)
    # the seed a replay asked for (--replay SEED, alone or after its history); None otherwise
    replay_of: int | None = None
    # the first seed this process ran when the exposing seed was not it: seeds history_from..
    # exposed_by - 1 ran before it after the same compile (--replay-from reruns them)
    history_from: int | None = None


# ---- printf-bisection (instrument/checkpoint.py) ------------------------------------------------
@kind("checkpoint")
@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint(Payload):
    """The enabled site's hit counters (checkpoint.decode), streamed while the kernel runs."""

    reached: bool | None = None
    final: bool | None = None
    site: int | None = None
    hits: int | None = None
    n_warps: int | None = None
    warps: list[list[int]] | None = None
    ctas: int | None = None


@kind("checkpoint_sites")
@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSites(Payload):
    sites: list[Json] | None = None  # CheckpointSite records
    enabled: int | None = None
    emitted: int | None = None  # how many times the enabled checkpoint was traced
    roles: Any = None


# ---- cutedebug exec: each process of the command (instrument/launch.py) ------------------------
@kind("process")
@dataclass(frozen=True, slots=True, kw_only=True)
class Process(Payload):
    ppid: int | None = None
    argv: list[str] | None = None


@kind("instrumented")
@dataclass(frozen=True, slots=True, kw_only=True)
class Instrumented(Payload):
    fault: str | None = None
    fault_args: Json | None = None
    probes: Json | None = None
    record: bool | None = None
    fault_trace: Json | None = None
    cutlass: str | None = None


@kind("stall")
@dataclass(frozen=True, slots=True, kw_only=True)
class Stall(Payload):
    still_s: float | None = None  # nothing moved for this long while a launch ran
    picture: Json | None = None


@kind("exit")
@dataclass(frozen=True, slots=True, kw_only=True)
class Exit(Payload):
    traces: int | None = None
    fault_count: int | None = None


@kind("gpu_wait")
@dataclass(frozen=True, slots=True, kw_only=True)
class GpuWait(Payload):
    owner: str | None = None  # the run tag holding the GPU token


@kind("gpu_acquired")
@dataclass(frozen=True, slots=True, kw_only=True)
class GpuAcquired(Payload):
    waited_s: float | None = None
