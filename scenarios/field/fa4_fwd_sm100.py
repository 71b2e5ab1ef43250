"""Adapter: flash-attn-4 4.0.0b36 SM100 forward (``FlashAttentionForwardSm100``), unmodified.

O = softmax(Q K^T / sqrt(d)) V in bf16, Q/K/V/O laid out (batch, seqlen, heads, head_dim),
d = 128, no causal mask. The kernel object is built inside this adapter's ``@cute.jit
__call__`` with the configuration FA-4's own host code picks on Blackwell for these shapes
(``interface._flash_attn_fwd``: tile 128 x 128, 2 Q stages, the 2-CTA tcgen05 MMA for
d = 128 without a mask) except the scheduler: one tile per CTA (what FA-4 picks for a causal
mask), because its static persistent scheduler asks the driver for the SM count while tracing
(no compile without a GPU). Every pipeline it traces is FA-4's:
TMA loads of Q and K/V (``PipelineTmaUmma``), S and P / O handoffs between the MMA warp and
the softmax / correction warpgroups through tensor memory (``PipelineUmmaAsync`` /
``PipelineAsyncUmma``), the output through a TMA store. Needs an sm_100 GPU to run; it
compiles for sm_100a on any machine.

No kernel-level switches: the library's source is not edited, so only patch faults apply.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.cute.runtime import from_dlpack, make_fake_stream, make_fake_tensor
from flash_attn.cute.flash_fwd_sm100 import FlashAttentionForwardSm100


class FA4FwdSm100:
    PARAMS = {"batch": 2, "heads": 8, "seqlen": 1024, "head_dim": 128, "two_cta": True}
    SHRINKABLE = ("seqlen", "batch", "heads")
    ARCHS = ("sm_100a",)
    TOLERANCE = (2e-2, 2e-2)  # bf16 output, fp32 softmax and accumulation

    def __init__(self, batch=2, heads=8, seqlen=1024, head_dim=128, two_cta=True):
        self.batch, self.heads, self.seqlen, self.head_dim = batch, heads, seqlen, head_dim
        self.two_cta = bool(two_cta)

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, stream):
        attn = FlashAttentionForwardSm100(
            self.head_dim,
            self.head_dim,
            qhead_per_kvhead=1,
            is_causal=False,
            m_block_size=128,
            n_block_size=128,
            q_stage=2,
            is_static_persistent=False,
            use_2cta_instrs=self.two_cta,
        )
        attn(mQ, mK, mV, mO, None, Float32(1.0 / math.sqrt(self.head_dim)), stream=stream)

    # ---- interface ------------------------------------------------------------------------
    def _shape(self):
        return (self.batch, self.seqlen, self.heads, self.head_dim)

    def fake_args(self):
        b, s, h, d = self._shape()
        stride = (s * h * d, h * d, d, 1)
        q, k, v, o = (
            make_fake_tensor(cutlass.BFloat16, (b, s, h, d), stride=stride, assumed_align=16)
            for _ in range(4)
        )
        return (q, k, v, o, make_fake_stream())

    def make_inputs(self, device):
        import torch

        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v = (
            torch.randn(*self._shape(), generator=g).to(device, torch.bfloat16) for _ in range(3)
        )
        return {"q": q, "k": k, "v": v, "o": torch.zeros_like(q)}

    def cute_args(self, tensors):
        import torch

        args = tuple(from_dlpack(tensors[x], assumed_align=16) for x in ("q", "k", "v", "o"))
        return (*args, cuda.CUstream(torch.cuda.current_stream().cuda_stream))

    def reference(self, tensors):
        import torch.nn.functional as F

        q, k, v = (tensors[x].transpose(1, 2) for x in ("q", "k", "v"))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2)

    def output(self, tensors):
        return tensors["o"]
