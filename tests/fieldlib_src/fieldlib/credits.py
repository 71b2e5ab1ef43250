"""y[i] = sum_k x[i, k] with FA-4's SM100 pipeline idioms (tests only; compile-only shapes).

Two warps, a 2-CTA cluster launch, two CTA-local PipelineAsync (no cluster layout; STAGES = 2):

- ``data``: the producer (warp 0) fills a stage and commits; the consumer (warp 1) waits on
  the stage, then releases both stages at the end of each pair of k-tiles in a loop unrolled
  over the stages with the stage named statically (FA-4's ``consumer_release_w_index(stage)``);
- ``credits``: never committed nor waited on: the producer acquires a credit per k-tile, the
  consumer releases one (FA-4's softmax-statistics pipeline, a credit counter on the empty
  barrier);
- after its loop the producer drains ``data`` with one more producer_acquire that fills
  nothing (FA-4's "equivalent to producer_tail"), unless ``drain=False``.
"""

from __future__ import annotations

from typing import ClassVar

import cutlass
from cutlass import cute
from cutlass.memory import SmemAllocator
from cutlass.pipeline import (
    Agent,
    CooperativeGroup,
    PipelineAsync,
    PipelineState,
    PipelineUserType,
    make_pipeline_state,
)

from fieldlib.rowsum import RowSumIO

ROWS = 32
STAGES = 2


class Credits(RowSumIO):
    PARAMS: ClassVar[dict[str, object]] = {"m": 64, "k": 16, "drain": True}
    ARCHS = ("sm_90a",)

    def __init__(self, m=PARAMS["m"], k=PARAMS["k"], drain=True):
        self.m, self.k, self.drain = m, k, bool(drain)

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor):
        grid = (cute.ceil_div(x.shape[0], ROWS), 1, 1)
        self.kernel(x, y).launch(grid=grid, block=(64, 1, 1), cluster=(2, 1, 1))

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = tid % 32
        row = bid * ROWS + lane

        smem = SmemAllocator()
        bars = smem.allocate_array(cutlass.Int64, 4 * STAGES, byte_alignment=8)
        s_x = smem.allocate_tensor(
            cutlass.Float32, cute.make_layout((ROWS, STAGES)), byte_alignment=16
        )
        data = PipelineAsync.create(
            num_stages=STAGES,
            producer_group=CooperativeGroup(Agent.Thread, 32),
            consumer_group=CooperativeGroup(Agent.Thread, 32),
            barrier_storage=bars,
        )
        credits = PipelineAsync.create(
            num_stages=STAGES,
            producer_group=CooperativeGroup(Agent.Thread, 32),
            consumer_group=CooperativeGroup(Agent.Thread, 32),
            barrier_storage=bars + 2 * STAGES,
        )
        pairs = x.shape[1] // STAGES
        if warp == 0:
            ps = make_pipeline_state(PipelineUserType.Producer, STAGES)
            cr = make_pipeline_state(PipelineUserType.Producer, STAGES)
            for p in cutlass.range(pairs, unroll=1):
                for s in cutlass.range_constexpr(STAGES):
                    credits.producer_acquire(cr)
                    cr.advance()
                    data.producer_acquire(ps)
                    s_x[lane, ps.index] = x[row, p * STAGES + s]
                    data.producer_commit(ps)
                    ps.advance()
            if cutlass.const_expr(self.drain):
                data.producer_acquire(ps)
        if warp == 1:
            cs = make_pipeline_state(PipelineUserType.Consumer, STAGES)
            acc = cutlass.Float32(0.0)
            for _p in cutlass.range(pairs, unroll=1):
                for _s in cutlass.range_constexpr(STAGES):
                    data.consumer_wait(cs)
                    acc += s_x[lane, cs.index]
                    cs.advance()
                for s in cutlass.range_constexpr(STAGES):
                    data.consumer_release(PipelineState(STAGES, cutlass.Int32(0), s, 0))
                    credits.consumer_release(PipelineState(STAGES, cutlass.Int32(0), s, 0))
            y[row] = acc
