"""Probes: the @cute.jit device helpers (bounded wait, stuck record, beacon), built once on
first use; cutlass is imported inside the builders only. See probes.py."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from cutedebug.instrument.probe_layout import (
    BLOCK_MASK,
    MAGIC,
    RECORD_BYTES,
    RECORD_VALID,
    SEQ_MASK,
    VERSION,
    Site,
)


@dataclass(frozen=True)
class _Plan:
    """Everything the device code needs, as compile-time constants."""

    addr: int
    budget_ns: int
    beacons: bool
    max_ctas: int
    max_warps: int
    max_records: int
    beacons_off: int
    records_off: int


@functools.cache
def device_ids() -> Any:
    """The @cute.jit helpers that say who is running, shared with checkpoint.py's marks.

    - ``lowest_active_lane()``: true in one lane of the active ones (the writer of a record);
    - ``warp_id()``: linear thread index // 32, without make_warp_uniform's shfl.sync: these
      run in one lane;
    - ``linear_block_id()``: bx + gx * (by + gy * bz);
    - ``warp_slot(linear, warp, max_ctas, max_warps)``: the (CTA, warp) slot of a per-warp
      table of max_ctas x max_warps entries (wrapping).
    """
    import cutlass
    from cutlass import Uint32, cute

    @cute.jit
    def lowest_active_lane():
        active = cute.arch.inline_ptx("activemask.b32 {$w0};", write_only_types=[Uint32])
        return (active & cute.arch.lanemask_lt()) == Uint32(0)

    @cute.jit
    def warp_id():
        tx, ty, tz = cute.arch.thread_idx()
        nx, ny, _ = cute.arch.block_dim()
        return Uint32(tx + nx * (ty + ny * tz)) >> Uint32(5)

    @cute.jit
    def linear_block_id():
        bx, by, bz = cute.arch.block_idx()
        gx, gy, _ = cute.arch.grid_dim()
        return bx + gx * (by + gy * bz)

    @cute.jit
    def warp_slot(linear, warp, max_ctas: cutlass.Constexpr, max_warps: cutlass.Constexpr):
        return (linear % Uint32(max_ctas)) * Uint32(max_warps) + warp % Uint32(max_warps)

    return SimpleNamespace(
        lowest_active_lane=lowest_active_lane,
        warp_id=warp_id,
        linear_block_id=linear_block_id,
        warp_slot=warp_slot,
    )


@functools.cache
def _device() -> Any:
    """Build the @cute.jit device helpers once (cutlass is imported only here)."""
    import cutlass
    from cutlass import Int32, Int64, Uint32, Uint64, cute

    gmem = cute.AddressSpace.gmem

    ids = device_ids()
    warp_id, linear_block_id = ids.warp_id, ids.linear_block_id

    @cute.jit
    def report_stuck(
        phase,
        stage,
        seq,
        waited,
        site: cutlass.Constexpr,
        plan: cutlass.Constexpr,
        banner: cutlass.Constexpr,
    ):
        """Lowest timed-out lane: claim a record slot, fill it, publish it, printf one line."""
        if ids.lowest_active_lane():
            now = cute.arch.globaltimer()
            bx, by, bz = cute.arch.block_idx()
            warp = warp_id()
            smid = cute.arch.smid()
            lane = cute.arch.lane_idx()
            linear = linear_block_id()
            hdr = cute.make_ptr(Uint32, plan.addr, gmem, assumed_align=8)
            cute.arch.store(hdr, Uint32(MAGIC), sem="relaxed", scope="sys")
            cute.arch.store(hdr + 1, Uint32(VERSION), sem="relaxed", scope="sys")
            slot = cute.arch.atomic_add(hdr + 2, Uint32(1), sem="relaxed", scope="sys")
            if slot < Uint32(plan.max_records):
                base = Int64(plan.addr + plan.records_off) + Int64(slot) * RECORD_BYTES
                rec = cute.make_ptr(Uint32, base, gmem, assumed_align=8)
                rec64 = cute.make_ptr(Uint64, base, gmem, assumed_align=8)
                cute.arch.store(rec + 1, Uint32(site), sem="relaxed", scope="sys")
                cute.arch.store(rec + 2, Uint32(bx), sem="relaxed", scope="sys")
                cute.arch.store(rec + 3, Uint32(by), sem="relaxed", scope="sys")
                cute.arch.store(rec + 4, Uint32(bz), sem="relaxed", scope="sys")
                cute.arch.store(rec + 5, Uint32(warp), sem="relaxed", scope="sys")
                cute.arch.store(rec + 6, Uint32(stage), sem="relaxed", scope="sys")
                cute.arch.store(rec + 7, Uint32(phase), sem="relaxed", scope="sys")
                cute.arch.store(rec64 + 4, Uint64(waited), sem="relaxed", scope="sys")
                cute.arch.store(rec64 + 5, Uint64(now), sem="relaxed", scope="sys")
                cute.arch.store(rec + 12, Uint32(smid), sem="relaxed", scope="sys")
                cute.arch.store(rec + 13, Uint32(lane), sem="relaxed", scope="sys")
                cute.arch.store(rec + 14, Uint32(seq), sem="relaxed", scope="sys")
                cute.arch.store(rec + 15, Uint32(linear), sem="relaxed", scope="sys")
                cute.arch.store(rec, Uint32(RECORD_VALID), sem="release", scope="sys")
            cute.printf(
                banner + " block=(%d,%d,%d) warp=%d stage=%d phase=%d seq=%d "
                "waited_ns=%lld smid=%d",
                Int32(bx),
                Int32(by),
                Int32(bz),
                Int32(warp),
                Int32(stage),
                Int32(phase),
                Int32(seq),
                Int64(waited),
                Int32(smid),
            )

    @cute.jit
    def write_beacon(phase, stage, seq, site: cutlass.Constexpr, plan: cutlass.Constexpr):
        linear = Uint32(linear_block_id())
        slot = ids.warp_slot(linear, warp_id(), plan.max_ctas, plan.max_warps)
        word = (
            (Uint64(seq) & Uint64(SEQ_MASK))
            | ((Uint64(stage) & Uint64(0xFF)) << Uint64(23))
            | ((Uint64(phase) & Uint64(1)) << Uint64(31))
            | Uint64((site + 1) << 32)
            | ((Uint64(linear) & Uint64(BLOCK_MASK)) << Uint64(44))
        )
        ptr = cute.make_ptr(
            Uint64, Int64(plan.addr + plan.beacons_off) + Int64(slot) * 8, gmem, assumed_align=8
        )
        cute.arch.store(ptr, word, sem="relaxed", scope="sys")

    @cute.jit
    def bounded_wait(
        mbar_ptr,
        phase,
        stage,
        seq,
        site: cutlass.Constexpr,
        plan: cutlass.Constexpr,
        banner: cutlass.Constexpr,
        timed_seq: cutlass.Constexpr,
    ):
        done = cute.arch.mbarrier_try_wait(mbar_ptr, phase)
        if not done:
            t0 = cute.arch.globaltimer()
            waited = Int64(0)
            while not done and waited < plan.budget_ns:
                done = cute.arch.mbarrier_try_wait(mbar_ptr, phase)
                waited = cute.arch.globaltimer() - t0
            if not done:
                report_stuck(phase, stage, seq, waited, site, plan, banner)
                cute.arch.inline_ptx("exit;")
        if cutlass.const_expr(plan.beacons):  # noqa: SIM102  (static test, then a staged one)
            if cute.arch.lane_idx() == 0:
                if cutlass.const_expr(timed_seq):
                    write_beacon(phase, stage, Int32(cute.arch.globaltimer() >> 10), site, plan)
                else:
                    write_beacon(phase, stage, seq, site, plan)

    return SimpleNamespace(bounded_wait=bounded_wait, Int32=Int32)


def _banner(site: Site) -> str:
    text = f"cutedebug: STUCK site {site.id} {site.op} {site.barrier or 'mbarrier'} at {site.where}"
    return text.replace("%", "%%").replace("{", "(").replace("}", ")")
