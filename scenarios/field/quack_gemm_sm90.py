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

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import from_dlpack, make_fake_stream, make_fake_tensor
from quack.gemm_default_epi import GemmDefaultSm90
from quack.tile_scheduler import TileSchedulerOptions


class QuackGemmSm90:
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
        # fp32 on the device (cuBLAS), compared in fp32; the kernel rounds its fp32 sum to bf16
        return tensors["a"].float() @ tensors["b"].float().T

    def output(self, tensors):
        return tensors["d"]
