"""What the traces of a watched command have (mutate's clean run), and which kernel a trace-time
call belongs to.

``_enter_recorder`` records one trace with the instrumentation layer's recorder
(``instrument/recorder.py``, pipeline identity = creation order, what faults select);
``recorded_summary`` turns it into what mutate plans by: the pipelines in creation order with
the ops traced on each, and the kernel-wide synchronization calls.
``current_kernel`` names the ``@cute.kernel`` being traced.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

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


def recorded_summary(proto: Any) -> dict[str, Any]:
    """What mutate plans by, from either recorder: pipelines in creation order with their ops,
    and the kernel-wide synchronization calls."""
    if isinstance(proto, dict):
        return proto
    pipes = []
    for row in proto.pipeline_table():
        ops: dict[str, int] = {}
        for ev in proto.events:
            if ev.pipeline == row["key"] and ev.kind in PIPELINE_OPS:
                ops[ev.kind] = ops.get(ev.kind, 0) + 1
        pipes.append(
            {
                "index": row["index"],
                "class": row["class"],
                "file": row["file"],
                "line": row["line"],
                "kernel": None,
                "stages": row.get("stages"),
                "via": row.get("via"),
                "ops": ops,
            }
        )
    arch: dict[str, int] = {}
    for ev in proto.events:
        name = _RECORDER_ARCH.get(ev.kind)
        if name is not None and ev.pipeline is None:
            arch[name] = arch.get(name, 0) + 1
    return {"pipelines": pipes, "arch_ops": arch, "untagged_ops": {}, "kernel_names": []}
