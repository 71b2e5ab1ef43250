"""What the traces of a watched command have (mutate's clean run), and which kernel a trace-time
call belongs to.

``_enter_recorder`` records one trace: the instrumentation layer's recorder
(``instrument/recorder.py``, pipeline identity = creation order, what faults select) when this
cutedebug has it, else a small one of our own that numbers pipelines the way the faults'
``pipeline=`` does; ``recorded_summary`` turns either into what mutate plans by: the pipelines
in creation order with the ops traced on each, and the kernel-wide synchronization calls.
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
_PIPELINE_INDEX = "_cutedebug_recorded_index"

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
    """The pipelines and ops of one trace: the instrumentation layer's recorder when this
    cutedebug has it (its pipeline identity is what faults select), else our own."""
    try:
        from cutedebug.instrument import recorder
    except ImportError:
        return _enter_own_recorder(stack)
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


def _enter_own_recorder(stack: contextlib.ExitStack) -> dict[str, Any]:
    """Observe what the traced kernels have: pipelines numbered in create() order exactly as the
    faults' ``pipeline`` argument numbers them (outermost create() of a cutlass.pipeline class
    with mbarriers, PipelineTmaStore left out), the ops traced on each, and the kernel-wide
    synchronization calls (outside pipeline init) the other faults act on."""
    from cutedebug.instrument import faults, frames

    recorded: dict[str, Any] = {
        "pipelines": [],
        "arch_ops": {},
        "untagged_ops": {},
        "kernel_names": [],
    }

    def note_kernel() -> str | None:
        name = current_kernel().get("kernel")
        if name and name not in recorded["kernel_names"]:
            recorded["kernel_names"].append(name)
        return name

    patcher = faults._Patcher(faults.Applied(None, {}))
    stack.callback(patcher.restore)
    depth = faults._Depth()
    for cls in faults._pipeline_classes("create", exclude=("PipelineTmaStore",)):

        def create(*a, _orig=cls.create, _cls=cls, **kw):
            with depth.enter() as outermost:
                if not outermost:
                    return _orig(*a, **kw)
                file, line, _ = frames.kernel_frame()
                rec = {
                    "index": len(recorded["pipelines"]),
                    "class": _cls.__name__,
                    "file": file,
                    "line": line,
                    "kernel": note_kernel(),
                    "stages": kw.get("num_stages")
                    if isinstance(kw.get("num_stages"), int)
                    else None,
                    "ops": {},
                }
                recorded["pipelines"].append(rec)
                pipe = _orig(*a, **kw)
                with contextlib.suppress(AttributeError, TypeError):
                    object.__setattr__(pipe, _PIPELINE_INDEX, rec["index"])
                return pipe

        patcher.set_attr(cls, "create", staticmethod(create))
    for op in PIPELINE_OPS:
        op_depth = faults._Depth()
        for cls in faults._pipeline_classes(op):

            def wrapper(self, *a, _orig=vars(cls)[op], _op=op, _d=op_depth, **kw):
                with _d.enter() as outermost:
                    if outermost:
                        idx = getattr(self, _PIPELINE_INDEX, None)
                        ops = (
                            recorded["pipelines"][idx]["ops"]
                            if idx is not None
                            else recorded["untagged_ops"].setdefault(type(self).__name__, {})
                        )
                        ops[_op] = ops.get(_op, 0) + 1
                    return _orig(self, *a, **kw)

            wrapper.__name__ = op
            patcher.set_attr(cls, op, faults._user_op(wrapper))
    import cutlass.cute as cute

    for name in ARCH_OPS:
        original = getattr(cute.arch, name, None)
        if original is None:
            continue

        def arch_wrapper(*a, _orig=original, _name=name, **kw):
            if _name == "mbarrier_init_fence" or not faults._called_from(faults._INIT_FUNCTIONS):
                note_kernel()
                ops = recorded["arch_ops"]
                ops[_name] = ops.get(_name, 0) + 1
            return _orig(*a, **kw)

        patcher.replace_everywhere(original, faults._user_op(arch_wrapper))
    return recorded
