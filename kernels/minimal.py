"""Minimal kernel for testing the cutedebug engine end to end: y = 2 * x + 1 (fp32).

One thread per element, 128 threads per CTA, tail predicated. Barriers: one mbarrier per CTA in
shared memory, initialised with arrive count 1 by thread 0, fenced, then arrived on by thread 0
and waited on by every thread (phase 0) before the store, so the kernel always carries an
mbarrier wait that probes can bound.

Kernel-level switches (faults that cannot be a patch of cutlass.pipeline):
- ``spin_hang``: nobody arrives on the mbarrier; every thread waits on phase 0 forever.
- ``oob_store``: the output index is shifted by ``oob_offset`` elements, so the last CTAs write
  past the end of the output allocation.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import from_dlpack, make_fake_tensor
from cutlass.memory import SmemAllocator

THREADS = 128


class Minimal:
    PARAMS = {"n": 1 << 20, "oob_offset": 1 << 16}
    SHRINKABLE = ("n",)
    ARCHS = ("sm_90a", "sm_100a")
    SWITCHES = {
        "spin_hang": "no thread arrives on the CTA's mbarrier: every thread waits forever",
        "oob_store": "output index shifted by oob_offset elements: writes past the allocation",
    }
    TOLERANCE = (1e-6, 1e-6)

    def __init__(self, n=PARAMS["n"], oob_offset=PARAMS["oob_offset"], spin_hang=False,
                 oob_store=False):
        self.n = n
        self.oob_offset = oob_offset if oob_store else 0
        self.spin_hang = spin_hang

    # ---- host side ------------------------------------------------------------------------
    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor):
        grid = (cute.ceil_div(x.shape[0], THREADS), 1, 1)
        self.kernel(x, y).launch(grid=grid, block=(THREADS, 1, 1))

    # ---- device side ----------------------------------------------------------------------
    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        smem = SmemAllocator()
        mbar = smem.allocate_array(cutlass.Int64, 1, byte_alignment=8)
        if tid == 0:
            cute.arch.mbarrier_init(mbar, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if cutlass.const_expr(not self.spin_hang):
            if tid == 0:
                cute.arch.mbarrier_arrive(mbar)
        cute.arch.mbarrier_wait(mbar, 0)

        i = bid * THREADS + tid
        if i < x.shape[0]:
            y[i + self.oob_offset] = x[i] * cutlass.Float32(2.0) + cutlass.Float32(1.0)

    # ---- interface ------------------------------------------------------------------------
    def fake_args(self):
        x = make_fake_tensor(cutlass.Float32, (self.n,), stride=(1,), assumed_align=16)
        y = make_fake_tensor(cutlass.Float32, (self.n,), stride=(1,), assumed_align=16)
        return (x, y)

    def make_inputs(self, device):
        import torch

        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(self.n, generator=g).to(device)
        return {"x": x, "y": torch.zeros_like(x)}

    def cute_args(self, tensors):
        return (from_dlpack(tensors["x"], assumed_align=16),
                from_dlpack(tensors["y"], assumed_align=16))

    def reference(self, tensors):
        return tensors["x"] * 2.0 + 1.0

    def output(self, tensors):
        return tensors["y"]
