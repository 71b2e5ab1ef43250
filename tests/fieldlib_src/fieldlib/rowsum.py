"""The host side the row-sum stand-ins share (an x of m x k floats in, y = x.sum(dim=1) out):
fake tensors for a compile, real inputs for a run, the reference and the output."""

from __future__ import annotations

import cutlass
from cutlass.cute.runtime import from_dlpack, make_fake_tensor


class RowSumIO:
    m: int
    k: int

    def fake_args(self):
        return (
            make_fake_tensor(
                cutlass.Float32, (self.m, self.k), stride=(self.k, 1), assumed_align=16
            ),
            make_fake_tensor(cutlass.Float32, (self.m,), stride=(1,), assumed_align=16),
        )

    def make_inputs(self, device):
        import torch

        g = torch.Generator(device="cpu").manual_seed(0)
        return {
            "x": torch.randn(self.m, self.k, generator=g).to(device),
            "y": torch.zeros(self.m, device=device),
        }

    def cute_args(self, tensors):
        return tuple(from_dlpack(tensors[n], assumed_align=16) for n in "xy")

    def reference(self, tensors):
        return tensors["x"].double().sum(dim=1).float()

    def output(self, tensors):
        return tensors["y"]
