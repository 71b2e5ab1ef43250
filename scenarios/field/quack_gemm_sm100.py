"""Adapter: quack-kernels 0.6.5 SM100 GEMM (``quack.gemm_default_epi.GemmDefaultSm100``), unmodified.

D = A @ B^T in bf16 with fp32 accumulation in tensor memory, A (m, k) and B (n, k) k-major,
D (m, n) n-major, unbatched (quack appends the batch mode at trace time). The library's kernel
object is built inside this adapter's ``@cute.jit __call__`` as quack's host code builds it,
so every ``cutlass.pipeline`` call it traces is quack's: a persistent warp-specialized
Blackwell kernel (quack's ``GemmSm100`` docstring lists the roles), the A/B ring a
``PipelineTmaUmma`` (full: TMA tx bytes; empty: a tcgen05.commit per peer CTA), the
accumulator handoff a ``PipelineUmmaAsync`` (full: a tcgen05.commit; empty: one arrive per
epilogue warp), the tile scheduler's ring a ``PipelineAsync`` armed by cluster launch control
(CLC) try_cancel, TMEM allocated by the MMA warp and freed after the epilogue. With
``tile_m=256, cluster_m=2`` the MMA is the 2-CTA tcgen05 form.

No kernel-level switches: the library's source is not edited, so only patch faults apply.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int32
from field_host import GemmNTHost
from quack.gemm_default_epi import GemmDefaultSm100
from quack.tile_scheduler import TileSchedulerOptions


class QuackGemmSm100(GemmNTHost):
    PARAMS = {"m": 2048, "n": 2048, "k": 2048, "tile_m": 128, "tile_n": 256, "cluster_m": 1}
    CHOICES = {"tile_m": (128, 256), "cluster_m": (1, 2)}
    SHRINKABLE = ("m", "n", "k")
    ARCHS = ("sm_100a",)
    TOLERANCE = (2e-2, 2e-2)  # bf16 output of an fp32 accumulation over k = 2048

    def __init__(self, m=2048, n=2048, k=2048, tile_m=128, tile_n=256, cluster_m=1):
        self.m, self.n, self.k = m, n, k
        self.tile = (tile_m, tile_n)
        self.cluster = (cluster_m, 1, 1)

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mD: cute.Tensor, stream):
        gemm = GemmDefaultSm100(Float32, mA.element_type, self.tile, self.cluster)
        epi_args = gemm.EpilogueArguments()
        sched = TileSchedulerOptions(max_active_clusters=Int32(148 // self.cluster[0]))
        gemm(mA, mB, mD, None, epi_args, sched, None, stream)
