"""racecheck sample: a shared-memory RAW hazard between warps.

One CTA of 128 threads. Every thread writes its own element of a shared buffer, then reads
the element written by the thread 32 places further on (another warp). Without a barrier
between the write and the read, racecheck reports a RAW hazard (write line / read line);
with ``--sync`` a ``sync_threads`` orders them and the run is clean (the control case).

    python tools/sanitizer_samples/race_smem.py [--sync] [--compile-only]
"""

from __future__ import annotations

import argparse
import os

import cutlass
from cutlass import cute
from cutlass.memory import SmemAllocator

THREADS = 128


@cute.kernel
def race_kernel(x: cute.Tensor, y: cute.Tensor, with_sync: cutlass.Constexpr):
    tid, _, _ = cute.arch.thread_idx()
    smem = SmemAllocator()
    buf = smem.allocate_tensor(cutlass.Float32, cute.make_layout(THREADS), byte_alignment=16)
    buf[tid] = x[tid]  # RACE_WRITE
    if cutlass.const_expr(with_sync):
        cute.arch.sync_threads()
    y[tid] = buf[(tid + 32) % THREADS]  # RACE_READ


@cute.jit
def race_host(x: cute.Tensor, y: cute.Tensor, with_sync: cutlass.Constexpr):
    race_kernel(x, y, with_sync).launch(grid=(1, 1, 1), block=(THREADS, 1, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sync", action="store_true", help="put the barrier in (clean control)")
    ap.add_argument("--compile-only", action="store_true", help="compile for sm_90a, no GPU")
    args = ap.parse_args()
    if args.compile_only:
        from cutlass.cute.runtime import make_fake_tensor

        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        fake = [make_fake_tensor(cutlass.Float32, (THREADS,), stride=(1,), assumed_align=16)
                for _ in range(2)]
        cute.compile(race_host, *fake, args.sync)
        print("compiled")
        return
    import torch
    from cutlass.cute.runtime import from_dlpack

    x = torch.arange(THREADS, dtype=torch.float32, device="cuda")
    y = torch.zeros_like(x)
    race_host(from_dlpack(x, assumed_align=16), from_dlpack(y, assumed_align=16), args.sync)
    torch.cuda.synchronize()
    expect = torch.roll(x, -32)
    print("race_smem: launched; output", "matches" if torch.equal(y, expect) else "differs")


if __name__ == "__main__":
    main()
