"""Which Python frame is the kernel's: trace-time code finds its call site in the kernel file.

Faults, probes, the lint recorder and checkpoints all wrap cutlass functions; what they record
(a site's file:line) is the innermost frame that is neither cutlass (the installed DSL
package), nor the standard library, nor cutedebug itself. Paths are compared by prefix, so a
user's checkout that happens to sit in a folder named ``cutlass`` still counts as user code.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from functools import cache
from typing import Any

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # cutedebug/


@cache
def library_prefixes() -> tuple[str, ...]:
    """Path prefixes of code that is never the kernel's: the DSL, the stdlib, cutedebug."""
    import cutlass

    root = os.path.dirname(os.path.abspath(cutlass.__file__))
    up = root
    while up != os.path.dirname(up) and os.path.basename(up) != "nvidia_cutlass_dsl":
        up = os.path.dirname(up)
    if os.path.basename(up) == "nvidia_cutlass_dsl":
        root = up      # the wheel's whole tree: dsl_packages, python_packages, lib
    paths = sysconfig.get_paths()
    stdlib = {paths["stdlib"] + os.sep, paths["platstdlib"] + os.sep}
    return (root + os.sep, *sorted(stdlib), PACKAGE_DIR)


def is_library(filename: str) -> bool:
    return filename.startswith("<") or os.path.abspath(filename).startswith(library_prefixes())


def is_user_frame(frame: Any) -> bool:
    return not is_library(frame.f_code.co_filename)


def kernel_frame(depth: int = 1) -> tuple[str | None, int | None, str | None]:
    """(file, line, function) of the innermost user frame above the caller's ``depth``."""
    frame = sys._getframe(depth)
    while frame is not None:
        if is_user_frame(frame):
            return frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return None, None, None
