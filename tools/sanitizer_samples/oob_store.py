"""memcheck sample: kernels/minimal.py with its ``oob_store`` switch on.

The store index is shifted by ``oob_offset`` elements, so the last ``oob_offset`` threads
write past the end of the output: memcheck reports "Invalid __global__ write of size 4
bytes" at the store line of kernels/minimal.py. The torch caching allocator must be off
(PYTORCH_NO_CUDA_MEMORY_CACHING=1): inside a cached segment the stray stores hit memory
that memcheck counts as allocated. ``--clean`` runs the same kernel without the switch.

Run from the repository root with PYTHONPATH=. (it loads the kernel through
cutedebug.kernel_api, as the worker does).

    python tools/sanitizer_samples/oob_store.py [--n 4096] [--oob-offset 64] [--clean]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from cutlass import cute

from cutedebug.kernel_api import load_entry

KERNEL = Path(__file__).resolve().parents[2] / "kernels" / "minimal.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--oob-offset", type=int, default=64)
    ap.add_argument("--clean", action="store_true", help="no out-of-bounds store")
    ap.add_argument("--compile-only", action="store_true", help="compile for sm_90a, no GPU")
    args = ap.parse_args()
    cls = load_entry(KERNEL, "Minimal")
    kernel = cls(n=args.n, oob_offset=args.oob_offset, oob_store=not args.clean)
    if args.compile_only:
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        cute.compile(kernel, *kernel.fake_args())
        print("compiled")
        return
    import torch

    tensors = kernel.make_inputs("cuda")
    cargs = kernel.cute_args(tensors)
    compiled = cute.compile(kernel, *cargs)
    compiled(*cargs)
    torch.cuda.synchronize()
    print("oob_store: launched")


if __name__ == "__main__":
    main()
