"""Probes: hangs that report where they are stuck.

Trace-time instrumentation, active only inside ``instrument(cfg, buffer_addr)`` around
``cute.compile``; every patch is restored on exit. While active:

- every mbarrier wait (``MbarrierArray.wait`` under cutlass.pipeline, and raw
  ``cute.arch.mbarrier_wait`` wherever that name was imported) becomes a try_wait loop bounded by
  ``cfg.budget_ns`` of ``%globaltimer``. On timeout the lowest timed-out lane of the warp writes a
  stuck record with system-scope stores into a host-mapped buffer, printfs one line, and every
  timed-out thread exits, so the grid finishes, printf flushes and the context stays usable;
- after each completed wait, lane 0 stores one 64-bit beacon (site, stage, phase, sequence) into
  the slot of its (CTA, warp): the host reads the buffer live while the kernel is still stuck.

The fast path (barrier already complete) costs one try_wait and, with beacons on, one
``st.relaxed.sys.b64`` by lane 0; ``%globaltimer`` is read only once a wait has to spin.

Buffer layout (little endian; ``buffer_nbytes(cfg)`` bytes; the worker allocates it zeroed,
pinned, and passes ``data_ptr()``: under UVA a pinned host pointer is a valid device address):

    header   64 B   u32 magic "CDPB" | u32 version | u32 n_stuck (sys-scope atomic counter of
                    stuck reports, may exceed max_records) | u32 max_records | u32 max_ctas |
                    u32 max_warps | u64 budget_ns | reserved. The device writes magic/version with
                    its first stuck record; ``init_buffer`` writes all of it (optional).
    beacons  max_ctas * max_warps * 8 B, slot = (linear_block % max_ctas) * max_warps
                    + warp % max_warps; one u64 each, see ``pack_beacon``:
                    bits 0..22  seq: PipelineState.count + 1 of the completed wait (mod 2**23);
                                for waits without a PipelineState, %globaltimer >> 10 (a tick)
                    bits 23..30 stage (255: unknown, raw wait)   bit 31 phase
                    bits 32..43 site id + 1 (0: slot never written)
                    bits 44..63 linear block id (mod 2**20): CTAs beyond max_ctas share slots, the
                                last writer wins, its block id says who it was.
    records  max_records * 64 B, see ``RECORD_FMT``; a record is complete once its first word
                    holds RECORD_VALID (stored last, with release semantics).

Host side (this module imports no cutlass/torch at module level; the runner imports it to
decode): ``decode`` → ``ProbeSnapshot``; ``StallDetector`` (no beacon moved for ``stall_s``);
``diagnose`` (one line per recognized pattern). The stuck map is drawn from the same snapshot
by ``cutedebug.reporting.stuck_map``.

Limits: waits the probes cannot bound (named barriers, flag spins, TMEM allocation) only show
as a stall of the beacons; a wait executed by lanes that exclude lane 0 leaves no beacon.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from cutedebug.instrument.layer import Call
from cutedebug.instrument.probe_device import _banner, _device, _Plan, device_ids  # noqa: F401
from cutedebug.instrument.probe_layout import *  # noqa: F401,F403  (part of this interface)
from cutedebug.instrument.probe_layout import (  # noqa: F401
    RAW_OPS,
    WAIT_OPS,
    ProbeConfig,
    Site,
    SiteTable,
    _as_sites,
    _static_int,
    beacons_offset,
    buffer_nbytes,
    init_buffer,
    records_offset,
    sized_for_grid,
)


class _Instrumenter:
    def __init__(
        self,
        cfg: ProbeConfig,
        buffer_addr: int | None,
        allocate: Callable[[ProbeConfig], int] | None,
    ):
        if cfg.budget_ns <= 0 or cfg.max_ctas <= 0 or cfg.max_warps <= 0 or cfg.max_records <= 0:
            raise ValueError(f"invalid ProbeConfig: {cfg}")
        if (buffer_addr is None) == (allocate is None):
            raise ValueError("probes: give a buffer address or an allocate callback")
        self.cfg, self.addr, self.allocate = cfg, buffer_addr, allocate
        self.plan: _Plan | None = None
        self.table = SiteTable()

    def _plan(self) -> _Plan:
        if self.plan is None:  # no launch traced (or sized): the configured layout
            self._fix(self.cfg)
        return self.plan

    def _fix(self, cfg: ProbeConfig) -> None:
        if self.allocate is not None:
            self.table.buffer = self.allocate(cfg)
            self.addr = (
                self.table.buffer if isinstance(self.table.buffer, int) else self.table.buffer[1]
            )
        self.table.config = cfg
        self.plan = _Plan(
            addr=int(self.addr),
            budget_ns=int(cfg.budget_ns),
            beacons=bool(cfg.beacons),
            max_ctas=int(cfg.max_ctas),
            max_warps=int(cfg.max_warps),
            max_records=int(cfg.max_records),
            beacons_off=beacons_offset(cfg),
            records_off=records_offset(cfg),
        )

    def on_launch(self, call: Call) -> Any:
        if self.plan is None:
            cfg = (
                self.cfg
                if self.allocate is None
                else sized_for_grid(self.cfg, call.kwargs.get("grid"), call.kwargs.get("block"))
            )
            self._fix(cfg)
        return call.proceed()

    def _emit(self, mbar_ptr: Any, phase: Any, stage: Any, state: Any, site: Site) -> None:
        dev = _device()
        count = getattr(state, "_count", None) if state is not None else None
        seq = dev.Int32(count) + 1 if count is not None else dev.Int32(0)
        dev.bounded_wait(
            mbar_ptr,
            dev.Int32(phase),
            dev.Int32(stage),
            seq,
            site.id,
            self._plan(),
            _banner(site),
            count is None,
        )

    def on_array_wait(self, call: Call) -> Any:
        """MbarrierArray.wait: bounded, on the pipeline's barrier."""
        if call.dead:  # a branch a static `if` never takes: folded away, never a site
            return call.proceed()
        fields = pipeline_wait_fields(call)
        state = fields.pop("state")
        site = self.table.add(kind="pipeline", **fields)
        array = call.self_obj
        with array._mbar_scope("wait"):
            ptr = array.get_barrier(call.arg(1, "index"), loc=call.loc, ip=call.ip)
            self._emit(ptr, call.arg(2, "phase"), call.arg(1, "index"), state, site)

    def on_raw_wait(self, call: Call) -> Any:
        """cute.arch.mbarrier_wait: bounded."""
        if call.dead:
            return call.proceed()
        fields = raw_wait_fields(call)
        state = fields.pop("state")
        site = self.table.add(kind="raw", **fields)
        self._emit(call.arg(0, "mbar_ptr"), call.arg(1, "phase"), -1, state, site)

    def on_raw_op(self, call: Call) -> Any:
        """Raw mbarrier arrivals / expect_tx / complete_tx senders / inits of kernel code:
        who makes a raw barrier's phase complete (for the raw waits' diagnosis)."""
        if call.parent is None and not call.dead:  # a dead branch never arms anything
            where = call.site
            nbytes = call.arg(1, "bytes") if "expect_tx" in call.name else None
            self.table.add_raw_op(
                op=call.name,
                barrier="",
                pipeline_class="",
                pipeline_name="",
                stages=None,
                pipeline_index=None,
                tx_bytes=_static_int(nbytes),
                via=where.via or "",
                file=where.file or "",
                line=where.line or 0,
                function=where.function or "",
                code=where.code,
            )
        return call.proceed()


def pipeline_wait_fields(call: Call) -> dict[str, Any]:
    """A pipeline wait's site fields (op, full/empty, pipeline and its index, the kernel's
    call file:line, the library line in between as ``via``) and its PipelineState (key
    "state"), for a layer call of ``MbarrierArray.wait`` (probes, waitsites). The op is the
    open pipeline op (a subclass's or a wrapper's wait is still that op), else the barrier's
    side: full -> consumer_wait, empty -> producer_acquire."""
    array = call.self_obj
    tag = call.layer.array_tag(array)
    info = tag.pipeline if tag is not None else None
    parent = call.parent
    pipe = parent.pipe if parent is not None else (info.obj if info else None)
    if info is None and pipe is not None:
        info = call.layer.pipeline_of(pipe)
    if tag is not None and tag.side:
        barrier = tag.side
    elif pipe is not None and getattr(pipe, "sync_object_full", None) is array:
        barrier = "full"
    elif pipe is not None and getattr(pipe, "sync_object_empty", None) is array:
        barrier = "empty"
    else:
        barrier = (getattr(array, "name", "") or "").rpartition(".")[2]
    if parent is not None and parent.op in WAIT_OPS:
        op = parent.op
    else:
        op = {"full": "consumer_wait", "empty": "producer_acquire"}.get(barrier, "wait")
    name = getattr(array, "name", "") or ""
    return dict(
        op=op,
        barrier=barrier,
        pipeline_class=type(pipe).__name__ if pipe is not None else (info.cls if info else ""),
        pipeline_name=name.rpartition(".")[0] if "." in name else name,
        stages=_static_int(getattr(array, "num_stages", None)),
        arrive_count=_static_int(getattr(array, "arrive_count", None)),
        tx_count=_static_int(getattr(array, "tx_count", None)) or None,
        pipeline_index=info.index if info else None,
        state=parent.call.state() if parent is not None else None,
        **_where(call),
    )


def raw_wait_fields(call: Call) -> dict[str, Any]:
    """A raw ``cute.arch.mbarrier_wait``'s site fields and PipelineState, as above: called by
    kernel code it is a raw_wait; inside a pipeline op it is that op's wait."""
    parent = call.parent
    op, barrier, cls_name, state, info = "raw_wait", "", "", None, None
    if parent is not None and parent.pipe is not None:
        cls_name = type(parent.pipe).__name__
        op = parent.op
        barrier = "full" if op.startswith("consumer") else "empty"
        state, info = parent.call.state(), call.layer.pipeline_of(parent.pipe)
    return dict(
        op=op,
        barrier=barrier,
        pipeline_class=cls_name,
        pipeline_name="",
        stages=None,
        arrive_count=None,
        tx_count=None,
        pipeline_index=info.index if info else None,
        state=state,
        **_where(call),
    )


def _where(call: Call) -> dict[str, Any]:
    where = call.site
    return dict(
        via=where.via or "",
        file=where.file or "",
        line=where.line or 0,
        function=where.function or "",
        code=where.code,
    )


def pinned_allocator(runnable: bool) -> Callable[[ProbeConfig], tuple[Any, int]]:
    """``allocate`` for ``instrument``: a zeroed, pinned (host-mapped) torch buffer of the
    layout sized at the launch, header written; in a warm pool worker, at the address the pool
    reserved (instrument/probe_memory.py) where the driver allows; on a machine that will not
    run the kernel the address only has to be a plausible constant (and the buffer is a
    bytearray)."""

    def allocate(cfg: ProbeConfig) -> tuple[Any, int]:
        if not runnable:  # never read by a kernel: no torch import (1.7 s of CPU) for it
            host = bytearray(buffer_nbytes(cfg))
            init_buffer(host, cfg)
            return host, 0x7F0000000000
        from cutedebug.instrument import probe_memory

        if probe_memory.reserved() is not None:  # a warm pool worker: the same address each
            fixed = probe_memory.fixed_buffer(buffer_nbytes(cfg))  # run, so the same IR
            if fixed is not None:
                init_buffer(fixed[0].numpy(), cfg)
                return fixed
        import torch

        buf = torch.zeros(buffer_nbytes(cfg), dtype=torch.uint8, pin_memory=runnable)
        init_buffer(buf.numpy(), cfg)
        return buf, buf.data_ptr() if runnable else 0x7F0000000000

    return allocate


_ACTIVE: list[_Instrumenter] = []


@contextlib.contextmanager
def instrument(
    cfg: ProbeConfig,
    buffer_addr: int | None = None,
    *,
    allocate: Callable[[ProbeConfig], Any] | None = None,
) -> Iterator[SiteTable]:
    """Bound every mbarrier wait traced inside this context; yields the SiteTable it fills.

    Either ``buffer_addr`` (the layout of ``cfg``), or ``allocate(cfg) -> addr`` (or -> a
    tuple whose second item is the address): called once, at the kernel's launch, with the
    config sized from its grid (``sized_for_grid``); ``table.config`` / ``table.buffer`` then
    hold what the device code was built for.
    """
    if _ACTIVE:
        raise RuntimeError("cutedebug probes: instrument() is already active")
    from cutedebug.instrument import layer

    inst = _Instrumenter(cfg, buffer_addr, allocate)
    handlers = {
        "array.wait": inst.on_array_wait,
        "mbarrier_wait": inst.on_raw_wait,
        "launch": inst.on_launch,
        **{n: inst.on_raw_op for n in RAW_OPS},
    }
    _ACTIVE.append(inst)
    try:
        with layer.observe("probes", handlers):
            yield inst.table
        if inst.plan is None and allocate is not None:
            inst._fix(cfg)  # no wait traced: the caller still gets a buffer
    finally:
        _ACTIVE.clear()


# The host side (decode, stuck maps) and the diagnosis live in probe_host.py and
# probe_diagnosis.py; their names are part of this module's interface.
from cutedebug.instrument.probe_diagnosis import *  # noqa: E402,F401,F403
from cutedebug.instrument.probe_diagnosis import (  # noqa: E402,F401
    _cta_rules,
    _phase_rule,
    _progress_on,
    _ranges,
)
from cutedebug.instrument.probe_host import *  # noqa: E402,F401,F403
