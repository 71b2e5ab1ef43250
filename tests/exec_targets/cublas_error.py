"""exec target: fails the way the H200's faulted GEMM mutants failed under pytest (2026-12-02,
mutate over examples/test_field_libs.py): the kernel's sticky error surfaced in torch's
reference matmul as a cuBLAS status that names no CUDA error. The line is the captured one
(tests/data/mutate/h200_crash_mutants.jsonl). With ``--os-exit`` the process ends through
os._exit (as forked workers do, skipping atexit); with ``--fork`` a forked child ends through
os._exit first (it must not read the parent's context)."""

import os
import sys

print("examples/test_field_libs.py F", flush=True)
if "--fork" in sys.argv:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
print(
    "E       RuntimeError: CUDA error: CUBLAS_STATUS_INTERNAL_ERROR when calling "
    "`cublasCreate(handle)`\n"
    "FAILED examples/test_field_libs.py::test_gemm_bf16 - RuntimeError: CUDA error: "
    "CUBLAS_STATUS_INTERNAL_ERROR when calling `cublasCreate(handle)`\n"
    "1 failed, 3 deselected in 20.26s",
    flush=True,
)
if "--os-exit" in sys.argv:
    os._exit(1)
sys.exit(1)
