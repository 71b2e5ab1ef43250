"""Every wait a kernel emits, in emission order, recorded while it is traced; the code is unchanged.

A coredump gives each stuck warp's PC and the SASS instruction there (a ``SYNCS.PHASECHK`` wait
loop, a ``BAR.SYNC``), but the line table of a DSL-generated wait loop is imprecise. This table
is the other half of the exact PC -> site mapping (cutedebug.analyses.coredump): the k-th
mbarrier wait loop of the SASS is the k-th mbarrier wait traced, the k-th ``BAR.SYNC`` the k-th
barrier call. Each entry says what the probes' site says (op, full/empty, pipeline, kernel
file:line) without bounding anything: the compiled kernel is byte-identical to an uninstrumented
one.

Recorded (a layer observer: the call proceeds unchanged):
- ``MbarrierArray.wait`` (under every producer_acquire / consumer_wait / producer_tail) and raw
  ``cute.arch.mbarrier_wait`` / ``mbarrier_try_wait`` wherever those names were imported;
- ``cute.arch.barrier`` (named barrier sync, its id and thread count), ``barrier_arrive``,
  ``sync_threads`` (barrier 0), ``cluster_wait``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cutedebug import records
from cutedebug.instrument import probes


@dataclass
class WaitSite(records.Record):
    seq: int  # emission order while tracing
    kind: str  # mbarrier_wait | mbarrier_try_wait | named_barrier_sync | named_barrier_arrive
    #            | sync_threads | cluster_wait
    op: str = ""  # producer_acquire | consumer_wait | producer_tail | raw_wait | ... (mbarrier)
    barrier: str = ""  # full | empty | "" for mbarriers; "named" for bar.sync
    pipeline_class: str = ""
    pipeline_name: str = ""
    stages: int | None = None
    arrive_count: int | None = None
    tx_count: int | None = None
    barrier_id: int | None = None  # named barriers (0 for sync_threads)
    threads: int | None = None  # named barriers: thread count (None: the whole CTA)
    file: str = ""
    line: int = 0
    function: str = ""
    code: str = ""
    # added after the recorded H200 cores (tests/data/coredump): an older file reads the default
    pipeline_index: int | None = records.later(None)  # the layer's identity (creation order)
    via: str = records.later("")  # a library wrapper line between the kernel's call and wait
    absent: frozenset[str] = records.absent_keys()

    @property
    def role(self) -> str:
        if self.op.startswith("producer"):
            return "producer"
        if self.op.startswith("consumer"):
            return "consumer"
        return "any"


_STATIC = probes._static_int


MARKER_BASE = 0x5A000  # markers=True: "nanosleep.u32 MARKER_BASE + seq" before each wait


@contextlib.contextmanager
def record(markers: bool = False) -> Iterator[list[WaitSite]]:
    """Record the waits of every kernel traced inside; yields the list it fills.

    An observer of the instrumentation layer ("waitsites": inside the faults, so it records
    what they make the kernel emit; outside the probes). ``markers=True`` (validation only, it
    changes the code): a ``nanosleep.u32`` whose immediate is MARKER_BASE + seq is emitted
    before each recorded wait, so the SASS shows which traced wait each wait loop came from
    (tools/waitsite_markers.py)."""
    import cutlass.cute as cute

    from cutedebug.instrument import layer

    sites: list[WaitSite] = []
    inside: list[str] = []  # a recorded call in progress: what it calls is the same wait

    def recorded(kind: str, fields: dict[str, Any], call: Any) -> Any:
        fields.pop("state", None)
        # a branch a static `if` never takes is folded away: no wait loop in the SASS
        if not inside and not call.dead:
            if markers:
                cute.arch.inline_ptx(
                    f"nanosleep.u32 {MARKER_BASE + len(sites)};", loc=call.loc, ip=call.ip
                )
            sites.append(WaitSite(seq=len(sites), kind=kind, **fields))
        inside.append(kind)
        try:
            return call.proceed()
        finally:
            inside.pop()

    def array_wait(call: Any) -> Any:
        return recorded("mbarrier_wait", probes.pipeline_wait_fields(call), call)

    def raw(kind: str) -> Any:
        def handler(call: Any) -> Any:
            return recorded(kind, probes.raw_wait_fields(call), call)

        return handler

    def barrier(kind: str) -> Any:
        def handler(call: Any) -> Any:
            bid = call.kwargs.get("barrier_id")
            nthreads = call.kwargs.get("number_of_threads")
            fields = probes.raw_wait_fields(call)
            fields.update(
                op=kind,
                barrier="cluster" if kind == "cluster_wait" else "named",
                pipeline_class="",
                pipeline_index=None,
                barrier_id=(
                    _STATIC(bid) if bid is not None else (0 if kind == "sync_threads" else None)
                ),
                threads=_STATIC(nthreads),
            )
            return recorded(kind, fields, call)

        return handler

    handlers = {
        "array.wait": array_wait,
        "mbarrier_wait": raw("mbarrier_wait"),
        "mbarrier_try_wait": raw("mbarrier_try_wait"),
        "barrier": barrier("named_barrier_sync"),
        "barrier_arrive": barrier("named_barrier_arrive"),
        "sync_threads": barrier("sync_threads"),
        "cluster_wait": barrier("cluster_wait"),
    }
    with layer.observe("waitsites", handlers):
        yield sites


def sites_from_json(items: list[dict[str, Any]] | None) -> list[WaitSite]:
    return [WaitSite.from_json(d) for d in items or []]
