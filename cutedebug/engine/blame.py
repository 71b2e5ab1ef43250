"""Whose exception is it? An exception raised by cutedebug's own code (its innermost frame in
the package, and not one of the errors cutedebug raises on purpose about the user's input) is
a HARNESS_ERROR naming our frame; one raised by the kernel, its adapter, the DSL or a library
keeps the user's class (a kernel adapter's error is the user's to fix: exit 2); a CUDA error is
the GPU's wherever it surfaces (a CRASH, never ours nor the adapter's).
"""

from __future__ import annotations

import os
from typing import Any

from cutedebug.errors import gpu_error_name

# Exceptions cutedebug raises on purpose about the user's input (a fault that cannot apply
# to this kernel, an entry that does not load): the user's to fix, not a bug of ours.
_USER_FACING = (
    "FaultApplyError",
    "FaultSpecError",
    "FaultNotTriggered",
    "KernelLoadError",
    "Unsupported",
)


def our_frame(exc: BaseException) -> str | None:
    """``file:line in function`` when cutedebug's own code raised ``exc`` (its innermost
    frame is in the cutedebug package and it is not one of the errors about the user's
    input); None when the kernel, its adapter, the DSL or a library raised it."""
    from cutedebug.instrument.frames import PACKAGE_DIR

    tb = exc.__traceback__
    if tb is None or type(exc).__name__ in _USER_FACING:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    if not os.path.abspath(code.co_filename).startswith(PACKAGE_DIR):
        return None
    return f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"


def user_call(where: str, what: str, fn, *args: Any) -> Any:
    """Call the kernel adapter's ``what`` (make_inputs, fake_args, reference, ...): an
    exception it raises is the user's (KernelLoadError naming the method, keeping the
    user's exception class in ``user_type``), unless cutedebug's own code raised it."""
    try:
        return fn(*args)
    except Exception as e:
        if our_frame(e) or gpu_error_name(e):  # ours, or the GPU's (a CRASH, errors.py)
            raise
        from cutedebug.kernel_api import KernelLoadError

        err = KernelLoadError(f"{where}: the kernel's {what}() raised {type(e).__name__}: {e}")
        err.user_type = type(e).__name__
        raise err from e
