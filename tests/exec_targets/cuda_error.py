"""exec target: fails the way a PyTorch program fails after a kernel faulted (the message torch
prints for cudaErrorIllegalAddress), without needing a GPU."""

import sys

print("launching", flush=True)
sys.stderr.write(
    "Traceback (most recent call last):\n"
    '  File "repro.py", line 12, in <module>\n'
    "    torch.cuda.synchronize()\n"
    "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\n"
)
sys.exit(1)
