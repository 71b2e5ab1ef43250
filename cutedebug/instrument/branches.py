"""Branches a kernel's static `if` never takes: traced, but they never run.

The DSL builds an scf.if even for a condition known while tracing (``if epi_coord[1] ==
acc_release_idx`` on Python ints, in quack's SM100 epilogue loop over 8 subtiles) and traces
both branches; the compiler folds the one never taken away. The layer counts how deep the
trace is inside such a branch (``layer.dead``); every call made there is ``Call.dead``: the
recorder leaves it out of the protocol, a fault does not count it as a site, the wait table
leaves it out (it has no wait loop in the SASS).
"""

from __future__ import annotations

from typing import Any


def static_truth(pred: Any) -> bool | None:
    """An `if` condition's value known while tracing (a Python bool or int, a DSL numeric
    holding one), else None (a run-time value)."""
    if isinstance(pred, (bool, int)):
        return bool(pred)
    v = getattr(pred, "value", None)
    return bool(v) if isinstance(v, (bool, int)) else None


def if_execute(layer: Any, call: Any) -> Any:
    """The layer's handling of the DSL's ``Executor.if_execute(pred, then_block, else_block,
    ...)``: the branch a static condition never takes runs with ``layer.dead`` raised."""
    taken = static_truth(call.arg(1, "pred"))
    index, key = (3, "else_block") if taken else (2, "then_block")
    body = call.arg(index, key) if taken is not None else None
    if body is None:
        return call.proceed()

    def dead(*args: Any) -> Any:
        layer.dead += 1
        try:
            return body(*args)
        finally:
            layer.dead -= 1

    call.set_arg(index, key, dead)
    return call.proceed()
