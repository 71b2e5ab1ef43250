"""What the traces of a watched command have (mutate's clean run), and which kernel a trace-time
call belongs to.

``_enter_recorder`` records one trace with the instrumentation layer's recorder
(``instrument/recorder.py``, pipeline identity = creation order, what faults select);
``recorded_summary`` turns it into what mutate plans by: the pipelines in creation order with
the ops traced on each, and the kernel-wide synchronization calls.
``current_kernel`` names the ``@cute.kernel`` being traced. The summary is a
``RecordedProtocol`` record (its pipelines ``PipelineEntry`` records): the ``protocol`` of a
``compiled`` event, of a trace in exec's report.json / mutate's clean.json, and of a trace of
mutate's matrix.json.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, replace
from typing import Any

from cutedebug import records

PIPELINE_OPS = (
    "producer_acquire",
    "producer_commit",
    "consumer_wait",
    "consumer_release",
    "producer_tail",
)
ARCH_OPS = (
    "sync_threads",
    "sync_warp",
    "barrier",
    "barrier_arrive",
    "cluster_arrive",
    "cluster_arrive_relaxed",
    "fence_acq_rel_cluster",
    "mbarrier_init_fence",
)

# The layer recorder's event kinds -> the names mutate plans kernel-wide faults by.
_RECORDER_ARCH = {
    "sync_threads": "sync_threads",
    "sync_warp": "sync_warp",
    "named_barrier_sync": "barrier",
    "named_barrier_arrive": "barrier_arrive",
    "cluster_arrive": "cluster_arrive",
    "init_fence": "mbarrier_init_fence",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineEntry(records.Record):
    """A pipeline of one trace, numbered in creation order (a fault's ``pipeline=N``), with the
    ops traced on it. Files of the version that ran on the H200 (ff954a1) lack ``via``."""

    index: int
    class_: str = records.named("class")
    file: str | None
    line: int | None
    kernel: str | None  # the @cute.kernel that created it, when one trace has one kernel
    stages: int | None
    via: str | None = records.later(None)  # a library wrapper line between kernel and create()
    ops: dict[str, int]
    lacked: frozenset[str] = records.absent_keys()


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedProtocol(records.Record):
    """What mutate plans by, for one trace: its pipelines and the kernel-wide syncs."""

    pipelines: list[PipelineEntry]
    arch_ops: dict[str, int]
    untagged_ops: dict[str, int]
    kernel_names: list[str]

    def with_kernel_names(self, names: list[str]) -> RecordedProtocol:
        """The kernels of this trace named; with one kernel, each pipeline's ``kernel`` too."""
        pipes = [
            replace(p, kernel=names[0]) if p.kernel is None and len(names) == 1 else p
            for p in self.pipelines
        ]
        return replace(self, kernel_names=names, pipelines=pipes)


def current_kernel() -> dict[str, Any]:
    """The @cute.kernel function being traced (its qualified name and generated symbol), from
    the DSL's kernel-generation frame on the stack; {} outside a kernel body."""
    f = sys._getframe(1)
    while f is not None:
        loc = f.f_locals
        if (
            "funcBody" in loc
            and "kernel_name" in loc
            and f.f_code.co_filename.endswith(os.path.join("base_dsl", "dsl.py"))
        ):
            body = loc["funcBody"]
            return {
                "kernel": getattr(body, "__qualname__", str(body)),
                "module": getattr(body, "__module__", None),
                "file": getattr(getattr(body, "__code__", None), "co_filename", None),
                "symbol": str(loc["kernel_name"]),
            }
        f = f.f_back
    return {}


def _enter_recorder(stack: contextlib.ExitStack) -> Any:
    """The pipelines and ops of one trace: the instrumentation layer's recorder (its pipeline
    identity is what faults select)."""
    from cutedebug.instrument import recorder

    return stack.enter_context(recorder.record())


def recorded_summary(proto: Any) -> RecordedProtocol:
    """What mutate plans by, from the recorder's protocol: pipelines in creation order with
    their ops, and the kernel-wide synchronization calls (a summary's JSON object reads as
    itself)."""
    if isinstance(proto, dict):
        return RecordedProtocol.from_json(proto)
    pipes = []
    for row in proto.pipeline_table():
        ops: dict[str, int] = {}
        for ev in proto.events:
            if ev.pipeline == row["key"] and ev.kind in PIPELINE_OPS:
                ops[ev.kind] = ops.get(ev.kind, 0) + 1
        pipes.append(
            PipelineEntry(
                index=row["index"],
                class_=row["class"],
                file=row["file"],
                line=row["line"],
                kernel=None,
                stages=row.get("stages"),
                via=row.get("via"),
                ops=ops,
            )
        )
    arch: dict[str, int] = {}
    for ev in proto.events:
        name = _RECORDER_ARCH.get(ev.kind)
        if name == "cluster_arrive" and ev.detail.get("relaxed"):
            name = "cluster_arrive_relaxed"  # no release to demote: cta_scope_sync leaves it
        if name is not None and ev.pipeline is None:
            arch[name] = arch.get(name, 0) + 1
    return RecordedProtocol(pipelines=pipes, arch_ops=arch, untagged_ops={}, kernel_names=[])
