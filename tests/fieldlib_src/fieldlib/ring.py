"""y[i] = sum_k x[i, k] through an ExchangePipeline ring (tests only; quack's RMSNorm backward
exchange pattern in one CTA).

One warp per ROWS = 32 rows. Every lane is producer and consumer: it acquires the stage
(empty[s], arrive count 32: every lane releases), stores its row's element, and lane 0 arrives
on the stage's full barrier (arrive count 1) through ``producer_get_barrier``'s pointer after a
warp sync; producer_commit, a no-op in ExchangePipeline, is never called. Every lane then waits
on full[s] with a raw mbarrier wait whose phase the kernel reads from its consumer state, reads
its element and releases the stage. The consumer state advances with ``advance_iters(1)`` (or
``advance()``), the producer's with ``advance()``; ``producer_tail`` drains the ring.
STAGES = 2.
"""

from __future__ import annotations

from typing import ClassVar

import cutlass
from cutlass import cute
from cutlass.memory import SmemAllocator
from cutlass.pipeline import PipelineUserType

from fieldlib import pipeline as fl
from fieldlib.rowsum import RowSumIO

ROWS = 32
STAGES = 2


class Ring(RowSumIO):
    PARAMS: ClassVar[dict[str, object]] = {"m": 64, "k": 16}
    ARCHS = ("sm_90a",)

    def __init__(self, m=PARAMS["m"], k=PARAMS["k"], iters=True):
        if m % ROWS:
            raise ValueError(f"m must be a multiple of {ROWS}")
        self.m, self.k = m, k
        self.iters = iters  # the consumer state advances with advance_iters(1), else advance()

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor):
        grid = (cute.ceil_div(x.shape[0], ROWS), 1, 1)
        self.kernel(x, y).launch(grid=grid, block=(ROWS, 1, 1))

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor):
        lane, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        row = bid * ROWS + lane

        smem = SmemAllocator()
        bars = smem.allocate_array(cutlass.Int64, 2 * STAGES, byte_alignment=8)
        s_x = smem.allocate_tensor(
            cutlass.Float32, cute.make_layout((ROWS, STAGES)), byte_alignment=16
        )
        ring = fl.ExchangePipeline.create(STAGES, ROWS, bars)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        ps = fl.make_state(PipelineUserType.Producer, STAGES)
        cs = fl.make_state(PipelineUserType.Consumer, STAGES)
        acc = cutlass.Float32(0.0)
        for kt in cutlass.range(x.shape[1], unroll=1):
            ring.producer_acquire(ps)
            full = ring.producer_get_barrier(ps)
            s_x[lane, ps.index] = x[row, kt]
            cute.arch.sync_warp()
            if lane == 0:
                cute.arch.mbarrier_arrive(full)
            fl.exchange_wait(full, cs.phase)
            acc += s_x[lane, cs.index]
            ring.consumer_release(cs)
            ps.advance()
            if cutlass.const_expr(self.iters):
                cs.advance_iters(1)
            else:
                cs.advance()
        ring.producer_tail(ps)
        y[row] = acc
