"""Errors shared by the command front ends, and the names of CUDA errors (no imports: any layer
may raise or read them)."""

from __future__ import annotations


class UsageError(Exception):
    """Bad command-line input: the message names the option, the value and what is allowed;
    the command prints it and exits with status 2."""


# CUDA error names by the message the driver/runtime gives them (torch and cuda-python both
# surface these strings).
CUDA_ERRORS = (
    ("illegal memory access", "cudaErrorIllegalAddress"),
    ("illegal instruction", "cudaErrorIllegalInstruction"),
    ("misaligned address", "cudaErrorMisalignedAddress"),
    ("unspecified launch failure", "cudaErrorLaunchFailure"),
    ("device-side assert", "cudaErrorAssert"),
    ("operation not supported on global/shared address space", "cudaErrorInvalidAddressSpace"),
    ("invalid program counter", "cudaErrorInvalidPc"),
    ("too many resources requested", "cudaErrorLaunchOutOfResources"),
    ("launch timed out", "cudaErrorLaunchTimeout"),
    ("hardware stack error", "cudaErrorHardwareStackError"),
    ("out of memory", "cudaErrorMemoryAllocation"),
    ("trap", "cudaErrorAssert"),
)

# The driver's names of the errors a faulted kernel leaves in its context (sticky: every later
# call of the context returns it), with the runtime's names `run` and the programs print.
DRIVER_ERRORS = {
    "CUDA_ERROR_ILLEGAL_ADDRESS": "cudaErrorIllegalAddress",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION": "cudaErrorIllegalInstruction",
    "CUDA_ERROR_MISALIGNED_ADDRESS": "cudaErrorMisalignedAddress",
    "CUDA_ERROR_LAUNCH_FAILED": "cudaErrorLaunchFailure",
    "CUDA_ERROR_ASSERT": "cudaErrorAssert",
    "CUDA_ERROR_HARDWARE_STACK_ERROR": "cudaErrorHardwareStackError",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE": "cudaErrorInvalidAddressSpace",
    "CUDA_ERROR_INVALID_PC": "cudaErrorInvalidPc",
    "CUDA_ERROR_LAUNCH_TIMEOUT": "cudaErrorLaunchTimeout",
    "CUDA_ERROR_TENSOR_MEMORY_LEAK": "cudaErrorTensorMemoryLeak",
    "CUDA_ERROR_ECC_UNCORRECTABLE": "cudaErrorECCUncorrectable",
    "CUDA_ERROR_OUT_OF_MEMORY": "cudaErrorMemoryAllocation",
}


def driver_error_name(driver_name: str) -> str:
    """The runtime's name of a driver error (``CUDA_ERROR_ILLEGAL_ADDRESS`` ->
    ``cudaErrorIllegalAddress``); one without a known runtime name keeps the driver's."""
    return DRIVER_ERRORS.get(driver_name, driver_name)


# How a raised exception says it is the GPU's error (torch 2.11 raises AcceleratorError for
# what it used to raise RuntimeError("CUDA error: ...") for; cuda-python names CUDA_ERROR_*).
_GPU_ERROR_TYPES = ("AcceleratorError", "CUDAError", "CudaError")
_GPU_ERROR_TEXT = ("cuda error:", "cuda_error_", "cudaerror")


def known_cuda_error(message: str) -> str | None:
    """The CUDA error a driver / runtime message names by CUDA_ERRORS, or None (no guess)."""
    low = message.lower()
    return next((name for needle, name in CUDA_ERRORS if needle in low), None)


def cuda_error_name(message: str) -> str | None:
    """known_cuda_error, else cudaErrorUnknown for a message that says "CUDA" and "error"."""
    if (name := known_cuda_error(message)) is not None:
        return name
    low = message.lower()
    return "cudaErrorUnknown" if "cuda" in low and "error" in low else None


def gpu_error_name(exc: BaseException) -> str | None:
    """The CUDA error ``exc`` reports (its name), or None when it is not the GPU's error.

    A CUDA error raised wherever it surfaces (the program's next CUDA call, or cutedebug's own
    query of an event or a buffer in the same context) is a fault of what ran on the GPU, never
    a bug of cutedebug's: the context's sticky error is reported by every later call."""
    msg = str(exc)
    low = msg.lower()
    if type(exc).__name__ in _GPU_ERROR_TYPES or any(t in low for t in _GPU_ERROR_TEXT):
        return cuda_error_name(msg) or "cudaErrorUnknown"
    return None
