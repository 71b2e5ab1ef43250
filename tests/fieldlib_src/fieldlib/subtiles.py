"""y[i] = sum_k x[i, k] over SUBTILES static subtiles per stage (tests only; the patterns of
quack's SM100 GEMM that a trace sees).

Two warps, one PipelineAsync (STAGES = 2; full arrive count 1, empty arrive count 32):

- the producer (warp 0) arms the stage's full barrier itself, like a cluster launch control
  query: after ``producer_acquire`` one lane calls ``mbarrier_arrive_and_expect_tx`` on
  ``producer_get_barrier``'s pointer (a fused arrive; 0 bytes here, the hardware's response
  in quack) and never calls ``producer_commit``;
- the consumer (warp 1) waits once per stage and walks SUBTILES subtiles in a static loop; it
  releases the stage inside ``if sub in release_at`` with Python ints (quack's epilogue:
  ``if epi_coord[1] == acc_release_idx``). The DSL builds an scf.if on a constant and traces
  the body once per subtile: only one of them ever runs.
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
    PipelineUserType,
    make_pipeline_state,
)

from fieldlib.rowsum import RowSumIO

ROWS = 32
STAGES = 2
SUBTILES = 4
RELEASE_AT = SUBTILES - 1


class Subtiles(RowSumIO):
    PARAMS: ClassVar[dict[str, object]] = {"m": 64, "k": 16}
    ARCHS = ("sm_90a",)

    def __init__(self, m=PARAMS["m"], k=PARAMS["k"], release_at=(RELEASE_AT,)):
        self.m, self.k = m, k
        self.release_at = tuple(release_at)  # two entries: a real double release

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor):
        grid = (cute.ceil_div(x.shape[0], ROWS), 1, 1)
        self.kernel(x, y).launch(grid=grid, block=(64, 1, 1))

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = tid % 32
        row = bid * ROWS + lane

        smem = SmemAllocator()
        bars = smem.allocate_array(cutlass.Int64, 2 * STAGES, byte_alignment=8)
        s_x = smem.allocate_tensor(
            cutlass.Float32, cute.make_layout((ROWS, STAGES)), byte_alignment=16
        )
        pipe = PipelineAsync.create(
            num_stages=STAGES,
            producer_group=CooperativeGroup(Agent.Thread, 1),
            consumer_group=CooperativeGroup(Agent.Thread, 32),
            barrier_storage=bars,
        )
        k_tiles = x.shape[1]
        if warp == 0:
            ps = make_pipeline_state(PipelineUserType.Producer, STAGES)
            for kt in cutlass.range(k_tiles, unroll=1):
                pipe.producer_acquire(ps)
                s_x[lane, ps.index] = x[row, kt]
                cute.arch.sync_warp()
                full = pipe.producer_get_barrier(ps)
                if lane == 0:
                    cute.arch.mbarrier_arrive_and_expect_tx(full, 0)
                ps.advance()
            pipe.producer_tail(ps)
        if warp == 1:
            cs = make_pipeline_state(PipelineUserType.Consumer, STAGES)
            acc = cutlass.Float32(0.0)
            for _kt in cutlass.range(k_tiles, unroll=1):
                pipe.consumer_wait(cs)
                for sub in cutlass.range_constexpr(SUBTILES):
                    if sub == 0:
                        acc += s_x[lane, cs.index]
                    if sub in self.release_at:
                        pipe.consumer_release(cs)
                cs.advance()
            y[row] = acc
