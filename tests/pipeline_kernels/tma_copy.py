"""Row sums through a TMA pipeline: y[m] = sum_k x[m, k] (fp32), for testing fault injection.

A second, independent kernel built on ``cutlass.pipeline`` (beside kernels/tma_stream.py), so the
fault tests show that a trace-time patch reaches any kernel that uses the library's pipelines.

Each CTA owns TILE_M = 64 rows of x (M, K), row-major, and walks the K dimension in k-tiles of
TILE_K = 64 columns with a dynamic loop (K is a runtime value, a multiple of TILE_K).

Warp roles (160 threads):
- warps 0..3 (128 threads) consume: thread t sums row t % 64, columns [32 * (t // 64), +32) of
  each k-tile out of shared memory;
- warp 4 produces: one elected lane issues one TMA load per k-tile into the next stage.

Pipeline: ``PipelineTmaAsync`` with STAGES = 3 stages, barriers full[0..3) then empty[0..3).
- full[s]: arrive count 1 (producer group = 1 thread, the elected ``arrive.expect_tx``);
  tx bytes per stage = TILE_M * TILE_K * 4 = 16384 (one TMA box of fp32).
- empty[s]: arrive count 4 = one signaling lane per consumer warp (``PipelineTmaAsync``
  releases from lane 0 of each warp in a single CTA), so the consumer group is 4 Threads.
The producer drains the pipeline with ``producer_tail`` before it exits.

Epilogue: the upper 64 consumer threads put their half-row sums in shared memory, a named
barrier (id 1, 128 threads) orders them before the lower 64 threads read them and store y.

Kernel-level switch: ``oob_store`` shifts the output index by ``oob_offset`` elements.
"""

from __future__ import annotations

from typing import ClassVar

import cutlass
from cutlass import cute, pipeline
from cutlass.cute.nvgpu import cpasync
from cutlass.cute.runtime import from_dlpack, make_fake_tensor
from cutlass.memory import SmemAllocator

TILE_M = 64
TILE_K = 64
STAGES = 3
CONSUMER_WARPS = 4
PRODUCER_WARP = CONSUMER_WARPS
THREADS = 32 * (CONSUMER_WARPS + 1)
CONSUMER_THREADS = 32 * CONSUMER_WARPS
HALF_K = TILE_K // 2
REDUCE_BARRIER_ID = 1


class TmaCopy:
    PARAMS: ClassVar[dict[str, object]] = {"m": 256, "k": 1024, "oob_offset": 1 << 16}
    SHRINKABLE = ("m", "k")
    ARCHS = ("sm_90a",)
    SWITCHES: ClassVar[dict[str, str]] = {
        "oob_store": "output index shifted by oob_offset: writes past the allocation"}
    TOLERANCE = (1e-3, 1e-5)

    def __init__(self, m=PARAMS["m"], k=PARAMS["k"], oob_offset=PARAMS["oob_offset"],
                 oob_store=False):
        if m % TILE_M or k % TILE_K:
            raise ValueError(f"m must be a multiple of {TILE_M} and k of {TILE_K}")
        self.m, self.k = m, k
        self.oob_offset = oob_offset if oob_store else 0

    # ---- host side ------------------------------------------------------------------------
    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor):
        stage_layout = cute.make_layout((TILE_M, TILE_K), stride=(TILE_K, 1))
        tma_atom, tma_x = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), x, stage_layout, (TILE_M, TILE_K))
        grid = (cute.ceil_div(x.shape[0], TILE_M), 1, 1)
        self.kernel(tma_atom, tma_x, y).launch(grid=grid, block=(THREADS, 1, 1))

    # ---- device side ----------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tma_atom: cute.CopyAtom, tma_x: cute.Tensor, y: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())

        # ---- prologue: shared memory, pipeline ----
        smem = SmemAllocator()
        barriers = smem.allocate_array(cutlass.Int64, 2 * STAGES, byte_alignment=8)
        s_x = smem.allocate_tensor(
            cutlass.Float32,
            cute.make_layout((TILE_M, TILE_K, STAGES), stride=(TILE_K, 1, TILE_M * TILE_K)),
            byte_alignment=128)
        s_half = smem.allocate_tensor(cutlass.Float32, cute.make_layout(TILE_M), byte_alignment=16)
        pipe = pipeline.PipelineTmaAsync.create(
            num_stages=STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CONSUMER_WARPS),
            tx_count=TILE_M * TILE_K * 4,
            barrier_storage=barriers,
        )
        g_x = cute.local_tile(tma_x, (TILE_M, TILE_K), (bid, None))  # (TILE_M, TILE_K, k_tiles)
        t_s, t_g = cpasync.tma_partition(
            tma_atom, 0, cute.make_layout(1), cute.group_modes(s_x, 0, 2),
            cute.group_modes(g_x, 0, 2))
        k_tiles = cute.size(g_x, mode=[2])

        # ---- producer warp: one TMA load per k-tile ----
        if warp == PRODUCER_WARP:
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, STAGES)
            for kt in cutlass.range(k_tiles):
                pipe.producer_acquire(state)
                cute.copy(tma_atom, t_g[(None, kt)], t_s[(None, state.index)],
                          tma_bar_ptr=pipe.producer_get_barrier(state))
                pipe.producer_commit(state)
                state.advance()
            pipe.producer_tail(state)

        # ---- consumer warps: half-row sums out of shared memory ----
        if warp < CONSUMER_WARPS:
            row = tid % TILE_M
            col0 = (tid // TILE_M) * HALF_K
            acc = cutlass.Float32(0.0)
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, STAGES)
            for _kt in cutlass.range(k_tiles):
                pipe.consumer_wait(state)
                for c in cutlass.range_constexpr(HALF_K):
                    acc += s_x[row, col0 + c, state.index]
                pipe.consumer_release(state)
                state.advance()

            # ---- epilogue: combine the two halves of each row ----
            if tid >= TILE_M:
                s_half[row] = acc
            cute.arch.barrier(barrier_id=REDUCE_BARRIER_ID, number_of_threads=CONSUMER_THREADS)
            if tid < TILE_M:
                y[bid * TILE_M + row + self.oob_offset] = acc + s_half[row]

    # ---- interface ------------------------------------------------------------------------
    def fake_args(self):
        k = cute.sym_int(divisibility=TILE_K)
        x = make_fake_tensor(cutlass.Float32, (self.m, k), stride=(k, 1), assumed_align=16)
        y = make_fake_tensor(cutlass.Float32, (self.m,), stride=(1,), assumed_align=16)
        return (x, y)

    def make_inputs(self, device):
        import torch

        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(self.m, self.k, generator=g).to(device)
        return {"x": x, "y": torch.zeros(self.m, device=device)}

    def cute_args(self, tensors):
        x = from_dlpack(tensors["x"], assumed_align=16).mark_layout_dynamic(leading_dim=1)
        return (x, from_dlpack(tensors["y"], assumed_align=16))

    def reference(self, tensors):
        return tensors["x"].double().sum(dim=1).float()

    def output(self, tensors):
        return tensors["y"]
