"""The host side the field adapters share, per kind of library kernel: fake tensors for a
compile, real inputs for a run, the reference a user would compare with, and the output.
The SM90 and SM100 adapters of one library kernel differ only in how they build the kernel
object (their ``__call__``); their tensors are the same."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
from cutlass.cute.runtime import from_dlpack, make_fake_stream, make_fake_tensor


def _stream():
    import torch

    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)


class GemmNTHost:
    """D = A @ B^T in bf16: A (m, k) and B (n, k) k-major, D (m, n) n-major, then a stream."""

    m: int
    n: int
    k: int

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
        args = tuple(from_dlpack(tensors[x], assumed_align=16) for x in ("a", "b", "d"))
        return (*args, _stream())

    def reference(self, tensors):
        # fp32 on the device (cuBLAS), compared in fp32; the kernel rounds its fp32 sum to bf16
        return tensors["a"].float() @ tensors["b"].float().T

    def output(self, tensors):
        return tensors["d"]


class AttentionBSHDHost:
    """O = softmax(Q K^T / sqrt(d)) V in bf16, Q/K/V/O (batch, seqlen, heads, head_dim), then
    a stream."""

    batch: int
    seqlen: int
    heads: int
    head_dim: int
    causal = False

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
        args = tuple(from_dlpack(tensors[x], assumed_align=16) for x in ("q", "k", "v", "o"))
        return (*args, _stream())

    def reference(self, tensors):
        # What a user compares with: PyTorch's SDPA on the same bf16 inputs (its flash kernel
        # on the H200). compute-sanitizer sees that kernel too; its findings are another
        # kernel's, counted apart (cutedebug sanitize), never this kernel's verdict.
        import torch.nn.functional as F

        q, k, v = (tensors[x].transpose(1, 2) for x in ("q", "k", "v"))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return out.transpose(1, 2)

    def output(self, tensors):
        return tensors["o"]
