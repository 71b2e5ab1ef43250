"""The fault registry's entries: each fault's parameters, expected verdict and patch.

Imported by ``faults`` (which owns the types and ``FAULTS``); a module with more faults
registers them the same way, with ``faults.register(Fault(...))``.
"""

from __future__ import annotations

from typing import Any

from cutedebug.instrument import fault_patches as fp
from cutedebug.instrument import fault_sync_patches as fs
from cutedebug.instrument.faults import DEPENDS, Fault, Param, register

# ---- verdict refinements ---------------------------------------------------------------------


def _refine_expect_tx(args: dict[str, Any]) -> tuple[str, str]:
    if args["delta_bytes"] > 0:
        return "HANG", "the full barrier's tx count never reaches zero: consumer_wait never returns"
    return "MISMATCH", (
        "the full barrier completes before all bytes land: the consumer may read "
        "a partly written stage (timing-dependent; may PASS)"
    )


def _refine_arrive_count(args: dict[str, Any]) -> tuple[str, str]:
    side = "producer_acquire" if args["barrier"] == "empty" else "consumer_wait"
    if args["delta"] > 0:
        return "HANG", f"the {args['barrier']} barrier never completes: {side} never returns"
    return DEPENDS, (
        f"the {args['barrier']} barrier completes before every arrive: {side} "
        "returns early; MISMATCH or RACE when the stage is overwritten/read early"
    )


def _refine_barrier_threads(args: dict[str, Any]) -> tuple[str, str]:
    if args["delta"] > 0:
        return "HANG", (
            "the named barrier waits for threads that never arrive (no mbarrier: "
            "probes cannot bound it, printf-bisection localizes it)"
        )
    return DEPENDS, (
        "the named barrier opens before every participant arrived: MISMATCH / "
        "RACE; leftover arrivals may leave a later barrier incomplete (HANG)"
    )


# ---- the registry ----------------------------------------------------------------------------

_AT_ITERATION = Param(
    int,
    0,
    "consumer state count at which it happens (run-time test); -1 = every iteration",
    minimum=-1,
)

_PIPELINE = Param(
    int,
    -1,
    "which pipeline, in the order the kernel creates them (0 = first; "
    "`cutedebug lint` / `cutedebug run` list them); -1 = all",
    minimum=-1,
    omit_default=True,
)

for _fault in (
    Fault(
        "wrong_expect_tx",
        "expect_tx byte count off by delta_bytes on every arrive.expect_tx",
        {
            "delta_bytes": Param(
                int, 16, "bytes added to each expect_tx (negative: fewer)", nonzero=True
            ),
            "pipeline": _PIPELINE,
        },
        DEPENDS,
        expected_note="delta > 0: HANG (full barrier never completes); delta < 0: "
        "MISMATCH (phase completes before the data lands)",
        patches=("cute.arch.mbarrier_arrive_and_expect_tx", "cute.arch.mbarrier_expect_tx"),
        apply=fp.apply_wrong_expect_tx,
        refine=_refine_expect_tx,
    ),
    Fault(
        "missing_phase_flip",
        "the PipelineState of one role wraps its index without flipping the phase bit",
        {
            "role": Param(
                str,
                "consumer",
                "whose states lose the flip (producer states start at "
                "phase 1, consumer states at 0)",
                choices=("producer", "consumer"),
            ),
            "pipeline": _PIPELINE,
        },
        DEPENDS,
        expected_note="consumer: MISMATCH (waits on an already-completed parity, reads "
        "stale stages); producer: MISMATCH/RACE (overwrites stages still being read), HANG if "
        "a full barrier is lapped",
        patches=(
            "PipelineState.advance and overrides (states of the role, however built), and a "
            "library subclass's advance_iters (quack's PipelineStateWAdvance)",
            "a state whose phase the kernel reads itself (a raw mbarrier wait) counts as read",
            "waits of the role (consumer_wait / producer_acquire / producer_tail) on a "
            "state without a role lineage, or of pipeline N",
        ),
        apply=fp.apply_missing_phase_flip,
        finish=fp.finish_missing_phase_flip,
    ),
    Fault(
        "skip_producer_tail",
        "producer_tail (drain of every empty barrier before exit) is a no-op",
        {"pipeline": _PIPELINE},
        DEPENDS,
        expected_note="PASS in a single CTA; in a cluster a consumer's remote arrive "
        "may target an exited CTA (CRASH or HANG)",
        patches=("PipelineAsync.producer_tail and overrides",),
        apply=fp.apply_skip_producer_tail,
    ),
    Fault(
        "skip_consumer_release",
        "one consumer_release is not performed (run-time test on the state's count)",
        {"at_iteration": _AT_ITERATION, "pipeline": _PIPELINE},
        "HANG",
        expected_note="the empty barrier of that stage never completes: the producer "
        "(producer_acquire or producer_tail) waits forever; PASS only if at_iteration is never "
        "reached",
        patches=("PipelineAsync.consumer_release and overrides",),
        apply=fp.apply_skip_consumer_release,
    ),
    Fault(
        "extra_consumer_release",
        "one consumer_release is performed twice (run-time test on the state's count)",
        {"at_iteration": _AT_ITERATION, "pipeline": _PIPELINE},
        "MISMATCH",
        expected_note="the empty barrier runs one phase ahead: the producer "
        "overwrites a stage still being read (RACE under racecheck; timing-dependent)",
        patches=("PipelineAsync.consumer_release and overrides",),
        apply=fp.apply_extra_consumer_release,
    ),
    Fault(
        "wrong_arrive_count",
        "the pipeline's barriers are initialised with an arrive count off by delta",
        {
            "delta": Param(
                int, 1, "arrivals added to the init count (negative: fewer)", nonzero=True
            ),
            "barrier": Param(
                str, "empty", "which barriers of each pipeline", choices=("empty", "full")
            ),
            "pipeline": _PIPELINE,
        },
        DEPENDS,
        expected_note="delta > 0: HANG; delta < 0: MISMATCH/RACE (phase completes "
        "before every agent arrived)",
        patches=("PipelineAsync._make_sync_object and overrides (agent group)",),
        apply=fp.apply_wrong_arrive_count,
        refine=_refine_arrive_count,
    ),
    Fault(
        "missing_init_fence",
        "barrier init is not fenced and/or not synced before first use",
        {
            "drop": Param(
                str, "both", "what to drop after mbarrier.init", choices=("fence", "sync", "both")
            )
        },
        DEPENDS,
        expected_note="usually PASS at run time (init wins the race); a warp that "
        "uses an uninitialised barrier may HANG or pass a wait early (MISMATCH); synccheck/"
        "racecheck may report",
        patches=(
            "cute.arch.mbarrier_init_fence",
            ("agent_sync inside cutlass.pipeline (create / pipeline_init_wait)"),
        ),
        apply=fp.apply_missing_init_fence,
    ),
    Fault(
        "drop_sync",
        "a sync_threads / named-barrier / sync_warp call of the kernel is dropped",
        {
            "which": Param(
                int, 0, "which call site in trace order (0 = first); -1 = all", minimum=-1
            ),
            "sync": Param(
                str,
                "any",
                "which calls count: cta = sync_threads and named barriers, warp = sync_warp",
                choices=tuple(fs.SYNC_KINDS),
            ),
        },
        "RACE",
        expected_note="shared-memory hazard (racecheck RAW/WAR); MISMATCH when the race "
        "is lost at run time. Pipeline-init syncs are not counted (see missing_init_fence)",
        patches=("cute.arch.sync_threads", "cute.arch.barrier", "cute.arch.sync_warp"),
        apply=fs.apply_drop_sync,
    ),
    Fault(
        "oob_store",
        "kernel switch: the output store is shifted past the allocation",
        {},
        "MEMORY_ERROR",
        kind="switch",
        expected_note="memcheck reports an invalid global write "
        "(needs the torch caching allocator off); without a sanitizer usually PASS or CRASH",
    ),
    Fault(
        "spin_hang",
        "kernel switch: nobody arrives on a barrier that every thread waits on",
        {},
        "HANG",
        kind="switch",
    ),
    Fault(
        "expect_tx_no_2cta_doubling",
        "2-CTA (cta_group::2) PipelineTmaUmma expects only this "
        "CTA's TMA bytes, not the pair's (tx_count / 2)",
        {},
        "HANG",
        expected_note="the leader's full barrier completes when half the pair's bytes "
        "landed (the MMA may read a partial stage); the other half lands on the next phase, "
        "whose tx count then never returns to zero: consumer_wait hangs. Not triggered by "
        "1-CTA kernels (same PTX as wrong_expect_tx with delta_bytes = -tx/2)",
        patches=(
            "PipelineTmaUmma.create (tx_count)",
            "PipelineTmaUmma.producer_acquire (expected_tx)",
        ),
        apply=fs.apply_expect_tx_no_2cta_doubling,
    ),
    Fault(
        "cta_scope_sync",
        "cluster-scope synchronization demoted to CTA scope: "
        "fence.acq_rel.cluster -> .cta, barrier.cluster.arrive loses its release, mbarrier "
        "arrive / expect_tx at .cluster scope -> .cta",
        {"what": Param(str, "all", "which operations are demoted", choices=fs.SCOPE_WHAT)},
        "PASS",
        expected_note="formally a data race on cross-CTA (DSMEM) data; current "
        "hardware orders it anyway, so runs PASS: visible in the PTX only",
        patches=(
            "cute.arch.fence_acq_rel_cluster",
            "cute.arch.cluster_arrive",
            "cute.arch.mbarrier_arrive / mbarrier_arrive_and_expect_tx / "
            "mbarrier_expect_tx (scope)",
        ),
        apply=fs.apply_cta_scope_sync,
    ),
    Fault(
        "skip_init_cluster_sync",
        "kernel switch: no cluster barrier between mbarrier init and "
        "the first remote (DSMEM) arrive / complete_tx; the CTA syncs only itself",
        {},
        DEPENDS,
        kind="switch",
        expected_note="usually PASS (peers send only after their own "
        "work); a remote complete_tx that reaches a barrier before its init is lost: HANG",
    ),
    Fault(
        "skip_cluster_tail",
        "kernel switch: no trailing cluster barrier: a CTA may exit while "
        "a peer still reads or writes its shared memory",
        {},
        DEPENDS,
        kind="switch",
        expected_note="PASS when every CTA waits for all its incoming "
        "DSMEM traffic before exiting; CRASH or corrupted smem of the next CTA on that SM when "
        "it does not",
    ),
    Fault(
        "cluster_mismatch",
        "kernel switch: launch cluster dims differ from the cluster size "
        "the kernel's DSMEM protocol assumes",
        {},
        "HANG",
        kind="switch",
        expected_note="CTAs that the protocol expects partials from are "
        "absent (or extra CTAs send to the wrong peers): some barrier's tx count never "
        "reaches zero; CRASH if a remote address names a CTA outside the cluster",
    ),
    Fault(
        "wrong_barrier_threads",
        "named barriers with a thread count (bar.sync / bar.arrive "
        "id, count) expect delta threads more than the kernel passes",
        {
            "delta": Param(
                int,
                32,
                "threads added to number_of_threads (a multiple of 32; negative: fewer)",
                nonzero=True,
            ),
            "which": Param(
                int,
                -1,
                "which counted barrier call site in trace order (0 = first); -1 = all",
                minimum=-1,
            ),
        },
        DEPENDS,
        expected_note="delta > 0: HANG at the barrier; delta < 0: MISMATCH/RACE (opens "
        "early) or HANG (leftover arrivals). Count-less barriers (sync_threads) and pipeline-init "
        "syncs are not counted",
        patches=("cute.arch.barrier", "cute.arch.barrier_arrive"),
        apply=fs.apply_wrong_barrier_threads,
        refine=_refine_barrier_threads,
    ),
    Fault(
        "early_exit",
        "the warps of one role exit (PTX exit) where they should arrive: before "
        "consumer_release (consumer) or producer_commit (producer), when the state's count == "
        "at_iteration (an early `return` in a role's loop)",
        {
            "role": Param(str, "consumer", "whose warps leave", choices=("producer", "consumer")),
            "at_iteration": Param(
                int, 0, "state count at which they leave (run-time test)", minimum=0
            ),
            "pipeline": _PIPELINE,
        },
        "HANG",
        expected_note="consumer: the empty barrier misses their releases -> producer_acquire "
        "(next lap) or producer_tail waits forever; producer: no later stage is filled -> "
        "consumer_wait waits forever (PipelineTmaAsync's commit is a no-op: the stage being "
        "filled still lands)",
        patches=("PipelineAsync.consumer_release / producer_commit and overrides",),
        apply=fp.apply_early_exit,
    ),
    Fault(
        "never_set",
        "kernel switch: waiters spin on a flag in global memory that is never stored",
        {},
        "HANG",
        kind="switch",
        expected_note="an unbounded spin without mbarrier: probes see no "
        "stuck wait, only a stall; printf-bisection localizes it",
    ),
):
    register(_fault)
