"""initcheck sample: a kernel reads a global buffer that nothing ever wrote.

``x = torch.empty(n)`` is allocated (caching allocator off, so it is a fresh cudaMalloc
that initcheck tracks) and never written; the kernel computes ``y[i] = x[i] + 1``, so every
load of ``x`` is an uninitialized __global__ read. ``--init`` fills ``x`` first (clean
control).

    python tools/sanitizer_samples/uninit_read.py [--init] [--compile-only]
"""

from __future__ import annotations

import argparse
import os

# Before torch is imported: a cached block may have been written by an earlier tensor.
os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")

import cutlass
from cutlass import cute

THREADS = 128


@cute.kernel
def uninit_kernel(x: cute.Tensor, y: cute.Tensor):
    tid, _, _ = cute.arch.thread_idx()
    y[tid] = x[tid] + cutlass.Float32(1.0)  # UNINIT_LOAD


@cute.jit
def uninit_host(x: cute.Tensor, y: cute.Tensor):
    uninit_kernel(x, y).launch(grid=(1, 1, 1), block=(THREADS, 1, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", action="store_true", help="write x before the launch (clean)")
    ap.add_argument("--compile-only", action="store_true", help="compile for sm_90a, no GPU")
    args = ap.parse_args()
    if args.compile_only:
        from cutlass.cute.runtime import make_fake_tensor

        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        fake = [make_fake_tensor(cutlass.Float32, (THREADS,), stride=(1,), assumed_align=16)
                for _ in range(2)]
        cute.compile(uninit_host, *fake)
        print("compiled")
        return
    import torch
    from cutlass.cute.runtime import from_dlpack

    x = torch.empty(THREADS, dtype=torch.float32, device="cuda")
    if args.init:
        x.fill_(1.0)
    y = torch.zeros_like(x)
    uninit_host(from_dlpack(x, assumed_align=16), from_dlpack(y, assumed_align=16))
    torch.cuda.synchronize()
    print("uninit_read: launched")


if __name__ == "__main__":
    main()
