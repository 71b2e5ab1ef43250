"""Every wait a kernel emits, in emission order, recorded while it is traced; the code is unchanged.

A coredump gives each stuck warp's PC and the SASS instruction there (a ``SYNCS.PHASECHK`` wait
loop, a ``BAR.SYNC``), but the line table of a DSL-generated wait loop is imprecise. This table
is the other half of the exact PC -> site mapping (cutedebug.analyses.coredump): the k-th
mbarrier wait loop of the SASS is the k-th mbarrier wait traced, the k-th ``BAR.SYNC`` the k-th
barrier call. Each entry says what the probes' site says (op, full/empty, pipeline, kernel
file:line) without bounding anything: the compiled kernel is byte-identical to an uninstrumented
one.

Recorded (wrapped, then the original called with the same arguments):
- ``MbarrierArray.wait`` (under every producer_acquire / consumer_wait / producer_tail) and raw
  ``cute.arch.mbarrier_wait`` / ``mbarrier_try_wait`` wherever those names were imported;
- ``cute.arch.barrier`` (named barrier sync, its id and thread count), ``barrier_arrive``,
  ``sync_threads`` (barrier 0), ``cluster_wait``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from cutedebug.instrument import probes


@dataclass
class WaitSite:
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

    @property
    def role(self) -> str:
        if self.op.startswith("producer"):
            return "producer"
        if self.op.startswith("consumer"):
            return "consumer"
        return "any"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> WaitSite:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


_STATIC = probes._static_int


MARKER_BASE = 0x5A000  # markers=True: "nanosleep.u32 MARKER_BASE + seq" before each wait


@contextlib.contextmanager
def record(markers: bool = False) -> Iterator[list[WaitSite]]:
    """Record the waits of every kernel traced inside; yields the list it fills.

    ``markers=True`` (validation only, it changes the code): a ``nanosleep.u32`` whose
    immediate is MARKER_BASE + seq is emitted before each recorded wait, so the SASS shows
    which traced wait each wait loop came from (tools/waitsite_markers.py)."""
    import cutlass.cute as cute
    from cutlass._mlir_helpers import op as op_mod
    from cutlass.pipeline import helpers

    from cutedebug.instrument import faults

    sites: list[WaitSite] = []
    patcher = faults._Patcher(faults.Applied(fault=None, args={}))
    user_op = faults._user_op

    inside: list[str] = []  # a recorded call in progress: what it calls is the same wait

    def add(kind: str, loc: Any = None, ip: Any = None, **fields: Any) -> None:
        fields.pop("state", None)
        if not inside:
            if markers:
                cute.arch.inline_ptx(f"nanosleep.u32 {MARKER_BASE + len(sites)};", loc=loc,
                                     ip=ip)
            sites.append(WaitSite(seq=len(sites), kind=kind, **fields))

    @contextlib.contextmanager
    def recorded(kind: str, fields: dict[str, Any], loc: Any = None,
                 ip: Any = None) -> Iterator[None]:
        add(kind, loc, ip, **fields)
        inside.append(kind)
        try:
            yield
        finally:
            inside.pop()

    orig_array_wait = vars(helpers.MbarrierArray)["wait"]

    def array_wait(self, index, phase, *, loc=None, ip=None):
        with recorded("mbarrier_wait", probes.pipeline_wait_fields(self), loc, ip):
            return orig_array_wait(self, index, phase, loc=loc, ip=ip)

    def raw(kind: str, orig: Any) -> Any:
        def wrapper(*a, loc=None, ip=None, **kw):
            with recorded(kind, probes.raw_wait_fields(), loc, ip):
                return orig(*a, loc=loc, ip=ip, **kw)

        wrapper.__name__ = orig.__name__
        return user_op(wrapper)

    def barrier(kind: str, orig: Any) -> Any:
        def wrapper(*a, loc=None, ip=None, **kw):
            bid = kw.get("barrier_id", a[0] if a else None)
            nthreads = kw.get("number_of_threads", a[1] if len(a) > 1 else None)
            fields = probes.raw_wait_fields()
            fields.update(
                op=kind,
                barrier="cluster" if kind == "cluster_wait" else "named",
                pipeline_class="",
                barrier_id=(
                    _STATIC(bid) if bid is not None else (0 if kind == "sync_threads" else None)
                ),
                threads=_STATIC(nthreads),
            )
            with recorded(kind, fields, loc, ip):
                return orig(*a, loc=loc, ip=ip, **kw)

        wrapper.__name__ = orig.__name__
        return user_op(wrapper)

    try:
        # Our wrappers must not be the frame the DSL takes a missing loc from.
        op_mod._is_framework_frame(__file__)
        patcher.set_attr(
            op_mod, "_FRAMEWORK_MODULE_PREFIXES", (*op_mod._FRAMEWORK_MODULE_PREFIXES, __name__)
        )
        patcher.set_attr(helpers.MbarrierArray, "wait", array_wait)
        arch = cute.arch
        for name, make, kind in (
            ("mbarrier_wait", raw, "mbarrier_wait"),
            ("mbarrier_try_wait", raw, "mbarrier_try_wait"),
            ("barrier", barrier, "named_barrier_sync"),
            ("barrier_arrive", barrier, "named_barrier_arrive"),
            ("sync_threads", barrier, "sync_threads"),
            ("cluster_wait", barrier, "cluster_wait"),
        ):
            orig = getattr(arch, name, None)
            if orig is not None:
                patcher.replace_everywhere(orig, make(kind, orig))
        yield sites
    finally:
        patcher.restore()


def sites_from_json(items: list[dict[str, Any]] | None) -> list[WaitSite]:
    return [WaitSite.from_json(d) for d in items or []]
