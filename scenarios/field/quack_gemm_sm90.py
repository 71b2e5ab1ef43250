"""Adapter: quack-kernels 0.6.5 SM90 GEMM (``quack.gemm_default_epi.GemmDefaultSm90``), unmodified.

D = A @ B^T in bf16 with fp32 accumulation, A (m, k) and B (n, k) k-major, D (m, n) n-major,
unbatched (quack appends the batch mode at trace time). The library's kernel object is built
inside this adapter's ``@cute.jit __call__`` exactly as quack's own host code builds it
(``gemm_tvm_ffi_utils.compile_gemm_kernel``), so every ``cutlass.pipeline`` call it traces is
quack's: a persistent warp-specialized kernel, one TMA producer warp feeding 1-2 consumer
warpgroups through quack's ``PipelineTmaAsync`` ring (full/empty mbarriers per stage), a
static persistent tile scheduler over ``ctas`` clusters, an epilogue through a TMA store
pipeline with a named barrier among the epilogue warps.

No kernel-level switches: the library's source is not edited, so only patch faults apply.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int32
from field_host import GemmNTHost
from quack.gemm_default_epi import GemmDefaultSm90
from quack.tile_scheduler import TileSchedulerOptions


class QuackGemmSm90(GemmNTHost):
    PARAMS = {
        "m": 2048,
        "n": 2048,
        "k": 2048,
        "tile_m": 128,
        "tile_n": 256,
        "cluster_m": 1,
        "ctas": 32,
        "pingpong": False,
    }
    CHOICES = {"tile_m": (64, 128, 256), "cluster_m": (1, 2), "pingpong": (False, True)}
    SHRINKABLE = ("m", "n", "k")
    ARCHS = ("sm_90a",)
    TOLERANCE = (2e-2, 2e-2)  # bf16 output of an fp32 accumulation over k = 2048

    def __init__(
        self, m=2048, n=2048, k=2048, tile_m=128, tile_n=256, cluster_m=1, ctas=32, pingpong=False
    ):
        self.m, self.n, self.k = m, n, k
        # pingpong: two consumer warpgroups take alternate tiles, each skipping the other's
        # pipeline steps with the library's PipelineStateWAdvance.advance_iters
        self.pingpong = pingpong
        self.tile = (tile_m, tile_n)
        self.cluster = (cluster_m, 1, 1)
        self.ctas = ctas

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mD: cute.Tensor, stream):
        gemm = GemmDefaultSm90(
            Float32,
            mA.element_type,
            self.tile,
            self.cluster,
            pingpong=self.pingpong,
            is_persistent=True,
        )
        epi_args = gemm.EpilogueArguments()
        sched = TileSchedulerOptions(
            max_active_clusters=Int32(self.ctas // self.cluster[0]), max_swizzle_size=Int32(8)
        )
        gemm(mA, mB, mD, None, epi_args, sched, None, stream, None, None)
