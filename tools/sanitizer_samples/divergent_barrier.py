"""synccheck sample: a CTA barrier inside divergent code.

One CTA of 128 threads. ``--mode warp`` (default): only lanes 0-15 of every warp execute
``sync_threads`` (bar.sync 0), so each warp reaches the barrier diverged. ``--mode block``:
only warps 0-1 execute it, warps 2-3 skip it. Both are invalid barrier use that synccheck
reports; outside the sanitizer the behaviour is undefined (it may hang: run under a timeout).
``--mode none`` keeps the barrier outside the branch (clean control).

    python tools/sanitizer_samples/divergent_barrier.py [--mode warp|block|none] [--compile-only]
"""

from __future__ import annotations

import argparse
import os

import cutlass
from cutlass import cute

THREADS = 128


@cute.kernel
def divergent_kernel(y: cute.Tensor, mode: cutlass.Constexpr):
    tid, _, _ = cute.arch.thread_idx()
    y[tid] = cutlass.Float32(1.0)
    if cutlass.const_expr(mode == "warp"):
        if tid % 32 < 16:
            cute.arch.sync_threads()  # DIVERGENT_BARRIER
    elif cutlass.const_expr(mode == "block"):
        if tid < 64:
            cute.arch.sync_threads()  # DIVERGENT_BARRIER
    else:
        cute.arch.sync_threads()
    y[tid] = y[tid] + cutlass.Float32(1.0)


@cute.jit
def divergent_host(y: cute.Tensor, mode: cutlass.Constexpr):
    divergent_kernel(y, mode).launch(grid=(1, 1, 1), block=(THREADS, 1, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("warp", "block", "none"), default="warp")
    ap.add_argument("--compile-only", action="store_true", help="compile for sm_90a, no GPU")
    args = ap.parse_args()
    if args.compile_only:
        from cutlass.cute.runtime import make_fake_tensor

        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        y = make_fake_tensor(cutlass.Float32, (THREADS,), stride=(1,), assumed_align=16)
        cute.compile(divergent_host, y, args.mode)
        print("compiled")
        return
    import torch
    from cutlass.cute.runtime import from_dlpack

    y = torch.zeros(THREADS, dtype=torch.float32, device="cuda")
    divergent_host(from_dlpack(y, assumed_align=16), args.mode)
    torch.cuda.synchronize()
    print("divergent_barrier: launched; all outputs 2.0:", bool((y == 2.0).all()))


if __name__ == "__main__":
    main()
