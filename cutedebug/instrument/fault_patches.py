"""How each patch fault changes the kernel: handlers registered with the instrumentation layer.

Each ``apply_*`` takes a ``FaultContext`` (the normalized args, the ``Applied`` record, the
pipeline selection) and returns ``{entry point: handler}`` for ``layer.observe("faults",
...)``. A handler sees one traced call (``layer.Call``): the semantic op, the pipeline it
belongs to (``call.pipeline.index``, what ``pipeline=N`` selects), the kernel's call site. It
records a site for every call it alters and runs the rest with ``call.proceed()`` (zero, one
or two times). cutlass is imported inside the handlers only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cutedebug.instrument import frames
from cutedebug.instrument.layer import Call

Handler = Callable[[Call], Any]


def _static_value(x: Any) -> Any:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


class FaultContext:
    """What every fault's handlers share: args, the record, which pipeline is selected."""

    def __init__(self, args: dict[str, Any], applied: Any, error: type[Exception]):
        self.args, self.applied, self.error = args, applied, error
        self.wanted = args.get("pipeline", -1)

    def selects(self, call: Call, info: Any = None) -> bool:
        """All pipelines (-1), or the call belongs to pipeline ``wanted``."""
        if self.wanted < 0:
            return True
        info = info if info is not None else call.pipeline
        return info is not None and info.index == self.wanted

    def extra(self) -> dict[str, Any]:
        return {} if self.wanted < 0 else {"pipeline_index": self.wanted}

    def site(self, call: Call, op: str, detail: str, **extra: Any) -> dict[str, Any]:
        if call.dead:  # a branch a static `if` never takes: the change never runs
            note = f"{op} in a branch a static `if` never takes: not counted"
            if note not in self.applied.notes:
                self.applied.notes.append(note)
            return {}
        where = call.site
        if where.via:
            extra.setdefault("via", where.via)
        return self.applied.add_site(
            op, detail, where=(where.file, where.line, where.function), **extra
        )


def _has_empty(pipe: Any) -> bool:
    """PipelineTmaStore (a bulk-group pipeline) has no empty barriers: no release, no drain."""
    return getattr(pipe, "sync_object_empty", None) is not None


_INIT_FUNCTIONS = frozenset({"create", "pipeline_init_wait", "pipeline_init_arrive"})


def _dsl_pipeline_caller() -> bool:
    """The call comes from a pipeline's initialisation in the DSL (create()'s init sync,
    pipeline_init_wait / _arrive): those syncs belong to missing_init_fence."""
    import sys

    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_name in _INIT_FUNCTIONS and (
            f.f_globals.get("__name__", "") or ""
        ).startswith("cutlass.pipeline"):
            return True
        f = f.f_back
    return False


# ---- expect_tx -------------------------------------------------------------------------------


def apply_wrong_expect_tx(fx: FaultContext) -> dict[str, Handler]:
    delta = fx.args["delta_bytes"]

    def handler(call: Call) -> Any:
        if fx.wanted >= 0 and not fx.selects(call):
            return call.proceed()
        tx = call.arg(1, "bytes")
        static = _static_value(tx)
        if static is not None and static + delta < 0:
            raise fx.error(f"wrong_expect_tx: {static} + {delta} tx bytes < 0")
        change = f"{static} -> {static + delta}" if static is not None else f"+ {delta}"
        fx.site(call, call.name, f"tx bytes {change}", tx_bytes=static, **fx.extra())
        call.set_arg(1, "bytes", tx + delta)
        return call.proceed()

    return {"mbarrier_arrive_and_expect_tx": handler, "mbarrier_expect_tx": handler}


# ---- phase flip ------------------------------------------------------------------------------

_NO_FLIP_STATE: type | None = None


def advance_without_flip(state: Any, count: Any, loc: Any, ip: Any) -> None:
    """PipelineState.advance with the phase flip removed: the index wraps, the phase stays."""
    from cutlass.cutlass_dsl import Int32, if_generate

    if isinstance(count, int) and count < 1:
        raise ValueError("count must be >= 1")
    if not isinstance(count, int) or count > 1:
        state._count = state._count + count
        state._index = (state._index + count) % state._stages
        return
    state._index = state._index + 1
    state._count = state._count + 1
    state._index = if_generate(
        state._index == state._stages,
        lambda index: Int32(0),
        lambda index: index,
        [state._index],
        [Int32],
        loc=loc,
        ip=ip,
    )


def no_flip_state_class() -> type:
    """A PipelineState whose advance never flips the phase (made once, on first use)."""
    global _NO_FLIP_STATE
    if _NO_FLIP_STATE is not None:
        return _NO_FLIP_STATE
    from cutlass.cutlass_dsl import Int32, dsl_user_op
    from cutlass.pipeline import PipelineState

    class NoPhaseFlipState(PipelineState):
        """Injected by cutedebug (missing_phase_flip): index wraps, phase stays."""

        def _like(self, count, index, phase):
            return NoPhaseFlipState(self._stages, count, index, phase)

        def clone(self, *, loc=None, ip=None):
            return self._like(self._count, self._index, self._phase)

        @dsl_user_op
        def advance(self, count=1, *, loc=None, ip=None):
            advance_without_flip(self, count, loc, ip)

        def __new_from_mlir_values__(self, values):
            return self._like(Int32(values[0]), Int32(values[1]), Int32(values[2]))

    _NO_FLIP_STATE = NoPhaseFlipState
    return NoPhaseFlipState


# Without a flip the phase a role waits on never leaves its initial value (consumer 0, producer
# 1): the waits that read a state of that role, whoever built it.
PHASE_READERS = {
    "consumer": ("consumer_wait", "consumer_try_wait"),
    "producer": ("producer_acquire", "producer_try_acquire", "producer_tail"),
}
INITIAL_PHASE = {"consumer": 0, "producer": 1}


def apply_missing_phase_flip(fx: FaultContext) -> dict[str, Handler]:
    """States of the role lose the flip in ``advance`` (PipelineState and every subclass,
    however the kernel or its library builds them: lineage from the phase they start with);
    a wait whose state has no such lineage (built from a raw index / phase, or a state class
    that is not a PipelineState) waits on the role's initial phase instead. With
    ``pipeline=N`` only the waits of that pipeline change (their state's phase is frozen)."""
    role = fx.args["role"]
    readers = PHASE_READERS[role]

    def advance(call: Call) -> Any:
        lineage = call.layer.lineage_of(call.self_obj)
        if fx.wanted >= 0 or lineage is None or lineage.role != role:
            return call.proceed()
        # advance(count) or a library's advance_iters(num_iterations): count steps, no flip
        count = call.arg(1, "count" if call.name == "state.advance" else "num_iterations", 1)
        if isinstance(count, int) and count == 0:
            return call.proceed()
        where = call.site
        lineage.notes.setdefault("no_flip_advances", []).append(
            (where.file, where.line, where.function, where.via)
        )
        advance_without_flip(call.self_obj, count, call.loc, call.ip)
        return None

    def phase_read(call: Call) -> Any:
        """Kernel code that reads a state's phase itself (for a raw mbarrier wait, or to build
        another state) reads the frozen phase: its state counts as read by a wait."""
        reader = _reader_frame()
        lineage = call.layer.lineage_of(call.self_obj)
        if (
            fx.wanted < 0
            and reader is not None
            and lineage is not None
            and lineage.role == role
            and call.parent is None
            and not frames.is_library(reader.f_code.co_filename)
            and not frames.is_pipeline_code(reader)
        ):
            lineage.notes.setdefault("phase_reads", []).append(
                (reader.f_code.co_filename, reader.f_lineno)
            )
        return call.proceed()

    def reader(call: Call) -> Any:
        state = call.state()
        # PipelineTmaStore's acquire / tail take no state: bulk groups, no phase to freeze
        if (
            not call.outermost
            or state is None
            or not _has_empty(call.self_obj)
            or not fx.selects(call)
        ):
            return call.proceed()
        lineage = call.layer.lineage_of(state)
        if fx.wanted < 0 and lineage is not None:
            if lineage.role == role:
                lineage.notes["waited"] = True
            return call.proceed()
        from cutlass.cutlass_dsl import Int32

        stages = getattr(state, "stages", getattr(state, "_stages", None))
        frozen = no_flip_state_class()(
            stages,
            state.count if hasattr(state, "count") else Int32(0),
            state.index,
            Int32(INITIAL_PHASE[role]),
        )
        how = (
            f"state of pipeline {fx.wanted}"
            if fx.wanted >= 0
            else f"{type(state).__name__} built without a {role} lineage"
        )
        fx.site(
            call,
            call.name,
            f"{role} {how}: phase never flips on wrap",
            pipeline=type(call.self_obj).__name__,
            **fx.extra(),
        )
        call.set_arg(1, "state", frozen)
        return call.proceed()

    return {
        "state.advance": advance,
        "state.advance_iters": advance,
        "state.phase": phase_read,
        **{op: reader for op in readers},
    }


def _reader_frame() -> Any:
    """The frame that read the attribute: the first one up the stack outside cutedebug."""
    import sys

    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(frames.PACKAGE_DIR):
        f = f.f_back
    return f


def finish_missing_phase_flip(fx: FaultContext, layer: Any) -> None:
    """Sites of the advance patch: advances of states that a wait of the role reads."""
    role = fx.args["role"]
    unread = 0
    for lineage in layer.lineages:
        advances = lineage.notes.get("no_flip_advances") or []
        if lineage.role != role or not advances or lineage.notes.get("shadow"):
            continue
        reads = sorted({f"{_base(f)}:{n}" for f, n in lineage.notes.get("phase_reads") or []})
        if not lineage.notes.get("waited") and not reads:
            unread += 1
            continue
        read = f"; its phase read by the kernel at {', '.join(reads)}" if reads else ""
        for file, line, function, via in advances:
            extra = {"via": via} if via else {}
            fx.applied.add_site(
                "advance",
                f"{role} state advanced without phase flip "
                f"(state made at {_base(lineage.file)}:{lineage.line}{read})",
                where=(file, line, function),
                **extra,
            )
    if unread:
        fx.applied.notes.append(
            f"{unread} {role} state(s) advanced without the flip but never "
            "read by a pipeline wait nor their phase by the kernel: not counted"
        )


def _base(path: str | None) -> str:
    import os

    return os.path.basename(path or "?")


# ---- producer tail / releases / early exit ---------------------------------------------------


def apply_skip_producer_tail(fx: FaultContext) -> dict[str, Handler]:
    def handler(call: Call) -> Any:
        pipe = call.self_obj
        if not call.outermost or not _has_empty(pipe) or not fx.selects(call):
            return call.proceed()
        n = getattr(pipe, "num_stages", None)
        fx.site(
            call,
            "producer_tail",
            f"{type(pipe).__name__}.producer_tail skipped ({n} empty-barrier waits removed)",
            pipeline=type(pipe).__name__,
            num_stages=n,
            **fx.extra(),
        )
        return None

    return {"producer_tail": handler}


def _release(fx: FaultContext, extra: bool) -> dict[str, Handler]:
    from cutlass.cutlass_dsl import if_generate

    k = fx.args["at_iteration"]
    traced = [0]
    fault = "extra" if extra else "skip"

    def handler(call: Call) -> Any:
        pipe = call.self_obj
        if not call.outermost or not _has_empty(pipe) or not fx.selects(call):
            return call.proceed()
        state = call.state()
        pname = type(pipe).__name__
        count = getattr(state, "count", None)
        ip = call.ip
        if k == -1:
            if extra:
                call.proceed()
                call.proceed()
            fx.site(
                call,
                "consumer_release",
                f"{fault} release, every iteration",
                pipeline=pname,
                at_iteration=k,
                **fx.extra(),
            )
            return None
        if count is None:  # no run-time count: the k-th traced call site
            index, traced[0] = traced[0], traced[0] + 1
            hit = index == k
            if extra or not hit:
                call.proceed()
            if hit:
                if extra:
                    call.proceed()
                fx.site(
                    call,
                    "consumer_release",
                    f"{fault} release at traced call site {k} (the state has no count)",
                    pipeline=pname,
                    at_iteration=k,
                    **fx.extra(),
                )
            return None
        static = _static_value(count)
        if static is not None:  # a compile-time count: decide now
            if extra or static != k:
                call.proceed()
            if static == k:
                if extra:
                    call.proceed()
                fx.site(
                    call,
                    "consumer_release",
                    f"{fault} release at count {k}",
                    pipeline=pname,
                    at_iteration=k,
                    **fx.extra(),
                )
            return None
        if extra:
            call.proceed()
            if_generate(count == k, lambda: call.proceed(ip=None), loc=call.loc, ip=ip)
        else:
            if_generate(count != k, lambda: call.proceed(ip=None), loc=call.loc, ip=ip)
        fx.site(
            call,
            "consumer_release",
            f"{fault} release when state.count == {k} (run-time test)",
            pipeline=pname,
            at_iteration=k,
            **fx.extra(),
        )
        return None

    return {"consumer_release": handler}


def apply_skip_consumer_release(fx: FaultContext) -> dict[str, Handler]:
    return _release(fx, extra=False)


def apply_extra_consumer_release(fx: FaultContext) -> dict[str, Handler]:
    return _release(fx, extra=True)


EXIT_AT = {"consumer": "consumer_release", "producer": "producer_commit"}


def apply_early_exit(fx: FaultContext) -> dict[str, Handler]:
    from cutlass import cute
    from cutlass.cutlass_dsl import if_generate

    role, k = fx.args["role"], fx.args["at_iteration"]
    op = EXIT_AT[role]

    def handler(call: Call) -> Any:
        pipe = call.self_obj
        if call.outermost and _has_empty(pipe) and fx.selects(call):
            count = getattr(call.state(), "count", None)
            static = _static_value(count)
            pname = type(pipe).__name__
            if count is None or static is not None:
                if count is None or static == k:  # no run-time count: leave here
                    cute.arch.inline_ptx("exit;")
                    fx.site(
                        call,
                        op,
                        f"{role} warps exit before {op} (the state has "
                        f"{'no' if count is None else 'a static'} count)",
                        pipeline=pname,
                        at_iteration=k,
                        **fx.extra(),
                    )
            else:
                if_generate(
                    count == k, lambda: cute.arch.inline_ptx("exit;"), loc=call.loc, ip=call.ip
                )
                fx.site(
                    call,
                    op,
                    f"{role} warps exit before {op} when state.count == {k} (run-time test)",
                    pipeline=pname,
                    at_iteration=k,
                    **fx.extra(),
                )
        return call.proceed()

    return {op: handler}


# ---- barrier initialization ------------------------------------------------------------------


def apply_wrong_arrive_count(fx: FaultContext) -> dict[str, Handler]:
    """Every barrier array a pipeline's create() initialises, whatever create() passes: the
    side comes from _make_sync_object's ``phase`` when given, else from the order of the
    arrays (full first, then empty, as every cutlass pipeline builds them)."""
    from cutlass.pipeline import Agent, CooperativeGroup
    from cutlass.pipeline.helpers import _get_thread_arrive_count

    delta, which = fx.args["delta"], fx.args["barrier"]

    def handler(call: Call) -> Any:
        tag = call.extra.get("array_tag")
        if (
            tag is None
            or tag.pipeline is None
            or tag.side != which
            or not fx.selects(call, tag.pipeline)
        ):
            return call.proceed()
        op, group = call.arg(3, "agent")
        count = _get_thread_arrive_count(group)
        static = _static_value(count)
        if static is not None and static + delta < 1:
            raise fx.error(
                f"wrong_arrive_count: {which} barrier arrive count {static} + {delta} < 1"
            )
        call.set_arg(3, "agent", (op, CooperativeGroup(Agent.Thread, count + delta)))
        change = f"{static} -> {static + delta}" if static is not None else f"+ {delta}"
        fx.site(
            call,
            "mbarrier_init",
            f"{which} barriers: arrive count {change}",
            pipeline=tag.pipeline.cls,
            arrive_count=static,
            num_stages=_static_value(call.arg(2, "num_stages")),
            **fx.extra(),
        )
        return call.proceed()

    return {"array.__init__": handler}


def apply_missing_init_fence(fx: FaultContext) -> dict[str, Handler]:
    import cutlass.pipeline as pl

    drop = fx.args["drop"]
    handlers: dict[str, Handler] = {}
    if drop in ("fence", "both"):

        def fence(call: Call) -> Any:
            fx.site(call, "mbarrier_init_fence", "fence.mbarrier_init dropped")
            return None

        handlers["mbarrier_init_fence"] = fence
    if drop in ("sync", "both"):
        # Only the DSL's own uses (create / pipeline_init_wait), not a kernel's direct calls.
        def agent_sync(call: Call) -> Any:
            group = call.arg(0, "group")
            if group in (pl.Agent.ThreadBlock, pl.Agent.ThreadBlockCluster):
                fx.site(call, "agent_sync", f"post-init {group.name} sync dropped")
                return None
            return call.proceed()

        handlers["agent_sync"] = agent_sync
    return handlers
