"""y[i] = sum_k (a[i, k] + b[i, k] + c[i, k]) through three SignalPipelines (tests only).

One CTA per ROWS = 32 rows, 64 threads: warp 0 produces (lane l puts row l's element of a, b
and c for k-tile kt into the current stage of pipeline A, B and C), warp 1 consumes and sums.
Pipelines A, B, C (``make_pipe``, one line): STAGES = 2; full[s] arrive count 32 (every
producer lane publishes), empty[s] arrive count 32 (every consumer lane releases). A and B are
waited through ``Reader`` (lambdas), C through ``consumer_wait_w_index_phase`` (a state built
from a raw index and phase). The producer drains each pipeline with ``producer_tail``.
"""

from __future__ import annotations

from typing import ClassVar

import cutlass
from cutlass import cute
from cutlass.cute.runtime import from_dlpack, make_fake_tensor
from cutlass.memory import SmemAllocator
from cutlass.pipeline import PipelineUserType

from fieldlib import pipeline as fl

ROWS = 32
STAGES = 2
THREADS = 64


class Sum3:
    PARAMS: ClassVar[dict[str, object]] = {"m": 64, "k": 16}
    ARCHS = ("sm_90a",)

    def __init__(self, m=PARAMS["m"], k=PARAMS["k"]):
        if m % ROWS:
            raise ValueError(f"m must be a multiple of {ROWS}")
        self.m, self.k = m, k

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, y: cute.Tensor):
        grid = (cute.ceil_div(a.shape[0], ROWS), 1, 1)
        self.kernel(a, b, c, y).launch(grid=grid, block=(THREADS, 1, 1))

    @cute.kernel
    def kernel(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, y: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = tid % 32
        row = bid * ROWS + lane

        smem = SmemAllocator()
        bars = smem.allocate_array(cutlass.Int64, 3 * 2 * STAGES, byte_alignment=8)
        layout = cute.make_layout((ROWS, STAGES))
        s_a = smem.allocate_tensor(cutlass.Float32, layout, byte_alignment=16)
        s_b = smem.allocate_tensor(cutlass.Float32, layout, byte_alignment=16)
        s_c = smem.allocate_tensor(cutlass.Float32, layout, byte_alignment=16)
        pipes = [fl.make_pipe(bars + 2 * STAGES * i, STAGES, 32, 32) for i in range(3)]
        pa, pb, pc = pipes
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        k_tiles = a.shape[1]

        if warp == 0:
            sa = fl.make_state(PipelineUserType.Producer, STAGES)
            sb = fl.make_state(PipelineUserType.Producer, STAGES)
            sc = fl.make_state(PipelineUserType.Producer, STAGES)
            for kt in cutlass.range(k_tiles, unroll=1):
                pa.producer_acquire(sa)
                s_a[lane, sa.index] = a[row, kt]
                pa.producer_publish(sa)
                pa.producer_commit(sa)
                sa.advance()
                pb.producer_acquire(sb)
                s_b[lane, sb.index] = b[row, kt]
                pb.producer_publish(sb)
                pb.producer_commit(sb)
                sb.advance()
                pc.producer_acquire(sc)
                s_c[lane, sc.index] = c[row, kt]
                pc.producer_publish(sc)
                pc.producer_commit(sc)
                sc.advance()
            pa.producer_tail(sa)
            pb.producer_tail(sb)
            pc.producer_tail(sc)

        if warp == 1:
            ca = fl.make_state(PipelineUserType.Consumer, STAGES)
            cb = fl.make_state(PipelineUserType.Consumer, STAGES)
            cc = fl.make_state(PipelineUserType.Consumer, STAGES)
            acc = cutlass.Float32(0.0)
            for _kt in cutlass.range(k_tiles, unroll=1):
                ra, rb = fl.Reader(pa), fl.Reader(pb)
                ra.wait(ca)
                acc += s_a[lane, ca.index]
                ra.release(ca)
                ca.advance()
                rb.wait(cb)
                acc += s_b[lane, cb.index]
                rb.release(cb)
                cb.advance()
                pc.consumer_wait_w_index_phase(cc.index, cc.phase)
                acc += s_c[lane, cc.index]
                pc.consumer_release(cc)
                cc.advance()
            y[row] = acc

    # ---- interface ------------------------------------------------------------------------
    def fake_args(self):
        shape = (self.m, self.k)
        return tuple(
            make_fake_tensor(cutlass.Float32, shape, stride=(self.k, 1), assumed_align=16)
            for _ in range(3)
        ) + (make_fake_tensor(cutlass.Float32, (self.m,), stride=(1,), assumed_align=16),)

    def make_inputs(self, device):
        import torch

        g = torch.Generator(device="cpu").manual_seed(0)
        out = {n: torch.randn(self.m, self.k, generator=g).to(device) for n in "abc"}
        out["y"] = torch.zeros(self.m, device=device)
        return out

    def cute_args(self, tensors):
        return tuple(from_dlpack(tensors[n], assumed_align=16) for n in "abcy")

    def reference(self, tensors):
        return (tensors["a"] + tensors["b"] + tensors["c"]).double().sum(dim=1).float()

    def output(self, tensors):
        return tensors["y"]
