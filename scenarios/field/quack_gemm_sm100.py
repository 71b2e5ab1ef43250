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

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import from_dlpack, make_fake_stream, make_fake_tensor
from quack.gemm_default_epi import GemmDefaultSm100
from quack.tile_scheduler import TileSchedulerOptions


class QuackGemmSm100:
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

    # ---- interface ------------------------------------------------------------------------
    def fake_args(self):
        bf16 = cutlass.BFloat16
        a = make_fake_tensor(bf16, (self.m, self.k), stride=(self.k, 1), assumed_align=16)
        b = make_fake_tensor(bf16, (self.n, self.k), stride=(self.k, 1), assumed_align=16)
        d = make_fake_tensor(bf16, (self.m, self.n), stride=(self.n, 1), assumed_align=16)
        return (a, b, d, make_fake_stream())

    def make_inputs(self, device):
        import torch

        g = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(self.m, self.k, generator=g).to(device, torch.bfloat16)
        b = torch.randn(self.n, self.k, generator=g).to(device, torch.bfloat16)
        return {
            "a": a,
            "b": b,
            "d": torch.zeros(self.m, self.n, dtype=torch.bfloat16, device=device),
        }

    def cute_args(self, tensors):
        import torch

        args = tuple(from_dlpack(tensors[x], assumed_align=16) for x in ("a", "b", "d"))
        return (*args, cuda.CUstream(torch.cuda.current_stream().cuda_stream))

    def reference(self, tensors):
        return tensors["a"].float() @ tensors["b"].float().T

    def output(self, tensors):
        return tensors["d"]
