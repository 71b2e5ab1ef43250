"""exec / mutate target on a GPU: a plain repro script around kernels/tma_stream.py, written the
way a user writes one (no cutedebug in it).

Compiles the persistent warp-specialized PipelineTmaAsync kernel, runs it on 16 CTAs, compares
its output with torch, prints one line and exits 1 when they differ. Run it under
`cutedebug exec --probes --fault wrong_expect_tx:delta_bytes=16 -- python3 THIS` to see a hang
localized without an adapter.
"""

import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "kernels"))

import cutlass.cute as cute  # noqa: E402
from tma_stream import TmaStream  # noqa: E402


def main() -> int:
    kernel = TmaStream(m=2000, n=2052, ctas=16)
    tensors = kernel.make_inputs("cuda")
    args = kernel.cute_args(tensors)
    compiled = cute.compile(kernel, *args)
    compiled(*args)
    torch.cuda.synchronize()
    out, ref = kernel.output(tensors), kernel.reference(tensors)
    bad = int((~torch.isclose(out.float(), ref.float(), atol=1e-5, rtol=1e-5)).sum())
    print(f"tma_stream: {bad} of {ref.numel()} elements differ from torch", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
