"""exec target on a GPU: a CuTe DSL kernel faults and the program first hears of it from torch's
cuBLAS, as the H200's faulted field mutants did (2026-12-02: "CUBLAS_STATUS_INTERNAL_ERROR when
calling `cublasCreate(handle)`").

kernels/minimal.py with its ``oob_store`` switch writes 256 MiB past a 4 MiB output (an illegal
address); the program then waits without a CUDA call and runs its first matmul into a tensor
allocated beforehand, so the first CUDA call after the fault is the cuBLAS handle's creation.
``--clean``: the same program without the switch (exits 0).
"""

import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "kernels"))

import cutlass.cute as cute  # noqa: E402
from minimal import Minimal  # noqa: E402

kernel = Minimal(n=1 << 20, oob_offset=1 << 26, oob_store="--clean" not in sys.argv)
tensors = kernel.make_inputs("cuda")
a, b = torch.randn(256, 256, device="cuda"), torch.randn(256, 256, device="cuda")
c = torch.empty(256, 256, device="cuda")
torch.cuda.synchronize()
args = kernel.cute_args(tensors)
compiled = cute.compile(kernel, *args)
compiled(*args)
time.sleep(1.0)  # no CUDA call: the kernel has ended (or faulted) before the next one
torch.matmul(a, b, out=c)
torch.cuda.synchronize()
print("matmul done", flush=True)
