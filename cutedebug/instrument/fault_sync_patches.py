"""How the sync, named-barrier, cluster-scope and 2-CTA faults change the kernel: handlers
registered with the instrumentation layer (see fault_patches.py for the conventions)."""

from __future__ import annotations

from typing import Any

from cutedebug.instrument.fault_patches import FaultContext, Handler, _dsl_pipeline_caller
from cutedebug.instrument.layer import Call


def _static_value(x: Any) -> Any:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


# ---- syncs and named barriers ----------------------------------------------------------------

SYNC_KINDS = {
    "cta": ("sync_threads", "barrier"),
    "warp": ("sync_warp",),
    "any": ("sync_threads", "barrier", "sync_warp"),
}


def apply_drop_sync(fx: FaultContext) -> dict[str, Handler]:
    which = fx.args["which"]
    traced = [0]  # one trace-order sequence over every patched kind

    def handler(call: Call) -> Any:
        # Barrier-init syncs inside pipeline create() belong to missing_init_fence.
        if _dsl_pipeline_caller():
            return call.proceed()
        index, traced[0] = traced[0], traced[0] + 1
        if which in (-1, index):
            bar = call.kwargs.get("barrier_id", 0) if call.name != "sync_warp" else None
            what = "warp sync" if bar is None else f"barrier id {bar}"
            fx.site(
                call,
                call.name,
                f"sync call site #{index} dropped ({what})",
                sync_index=index,
                barrier_id=_static_value(bar),
            )
            return None
        return call.proceed()

    return {name: handler for name in SYNC_KINDS[fx.args["sync"]]}


def apply_wrong_barrier_threads(fx: FaultContext) -> dict[str, Handler]:
    delta, which = fx.args["delta"], fx.args["which"]
    if delta % 32:
        raise fx.error(
            f"wrong_barrier_threads: delta {delta} is not a multiple of 32 "
            "(bar.sync counts whole warps)"
        )
    traced = [0]  # one trace-order sequence over barrier and barrier_arrive

    def handler(call: Call) -> Any:
        count = call.kwargs.get("number_of_threads")
        # A whole-CTA barrier has no count to get wrong; init syncs belong to other faults.
        if count is None or _dsl_pipeline_caller():
            return call.proceed()
        index, traced[0] = traced[0], traced[0] + 1
        if which not in (-1, index):
            return call.proceed()
        static = _static_value(count)
        if static is not None and static + delta < 32:
            raise fx.error(f"wrong_barrier_threads: {static} + {delta} threads < 32")
        change = f"{static} -> {static + delta}" if static is not None else f"+ {delta}"
        bar = _static_value(call.kwargs.get("barrier_id"))
        fx.site(
            call,
            call.name,
            f"barrier id {bar}: number_of_threads {change}",
            barrier_id=bar,
            number_of_threads=static,
            sync_index=index,
        )
        call.kwargs["number_of_threads"] = count + delta
        return call.proceed()

    return {"barrier": handler, "barrier_arrive": handler}


# ---- cluster scope / 2-CTA -------------------------------------------------------------------

SCOPE_WHAT = ("fence", "cluster_arrive", "mbarrier_arrive", "all")


def apply_cta_scope_sync(fx: FaultContext) -> dict[str, Handler]:
    from cutlass import cute
    from cutlass._mlir.dialects import nvvm

    what = fx.args["what"]
    cluster, cta = nvvm.MemScopeKind.CLUSTER, nvvm.MemScopeKind.CTA
    handlers: dict[str, Handler] = {}
    if what in ("fence", "all"):

        def fence(call: Call) -> Any:
            fx.site(call, "fence_acq_rel_cluster", "fence.acq_rel.cluster -> fence.acq_rel.cta")
            return cute.arch.fence_acq_rel_cta(loc=call.loc, ip=call.ip)

        handlers["fence_acq_rel_cluster"] = fence
    if what in ("cluster_arrive", "all"):

        def arrive(call: Call) -> Any:
            fx.site(
                call,
                "cluster_arrive",
                "barrier.cluster.arrive (release) -> barrier.cluster.arrive.relaxed",
            )
            # the kernel's barrier, relaxed: observers below see a cluster_arrive_relaxed
            return call.layer.call_as_kernel(
                cute.arch.cluster_arrive_relaxed,
                aligned=call.kwargs.get("aligned"),
                loc=call.loc,
                ip=call.ip,
            )

        handlers["cluster_arrive"] = arrive
    if what in ("mbarrier_arrive", "all"):

        def scope(call: Call) -> Any:
            # mbarrier_expect_tx defaults to cluster scope for a remote (peer) barrier
            remote = call.arg(2, "peer_cta_rank_in_cluster")
            given = call.kwargs.get("scope")
            implied = call.name == "mbarrier_expect_tx" and given is None and remote is not None
            if given == cluster or implied:
                fx.site(call, call.name, f"{call.name}: .cluster scope -> .cta")
                call.kwargs["scope"] = cta
            return call.proceed()

        for name in ("mbarrier_arrive", "mbarrier_arrive_and_expect_tx", "mbarrier_expect_tx"):
            handlers[name] = scope
    return handlers


def apply_expect_tx_no_2cta_doubling(fx: FaultContext) -> dict[str, Handler]:
    from cutlass import cute
    from cutlass.pipeline import PipelineTmaUmma

    def create(call: Call) -> Any:
        if call.owner_cls is not PipelineTmaUmma:
            return call.proceed()
        layout = call.kwargs.get("cta_layout_vmnk")
        if layout is not None and cute.size(layout, mode=[0]) == 2:
            tx = call.kwargs["tx_count"]
            static = _static_value(tx)
            change = f"{static} -> {static // 2}" if static is not None else "halved"
            fx.site(
                call,
                "PipelineTmaUmma.create",
                f"tx_count {change}: only this CTA's bytes, not the pair's",
                tx_bytes=static,
            )
            call.kwargs["tx_count"] = tx // 2
        return call.proceed()

    def acquire(call: Call) -> Any:
        expected = call.kwargs.get("expected_tx")
        if (
            call.owner_cls is PipelineTmaUmma
            and expected is not None
            and call.self_obj.cta_group == cute.nvgpu.tcgen05.CtaGroup.TWO
        ):
            fx.site(call, "producer_acquire", "expected_tx override halved")
            call.kwargs["expected_tx"] = expected // 2
        return call.proceed()

    return {"create": create, "producer_acquire": acquire}
