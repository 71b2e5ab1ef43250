"""Which Python frame is the kernel's: trace-time code finds its call site in the kernel file.

Faults, probes, the lint recorder and checkpoints all wrap cutlass functions; what they record
(a site's file:line) is the innermost frame that is kernel code. Everything is kernel code
except three trees: the DSL (the installed nvidia_cutlass_dsl package), the standard library
proper and cutedebug itself. Installed libraries are kernel code: a package under
site-packages / dist-packages is the user's kernel even though, in a venv (and for a system or
conda Python), those folders lie inside the stdlib's ``lib/pythonX.Y`` (sysconfig's ``stdlib``
/ ``platstdlib``). Paths are compared by prefix, so a user's checkout that happens to sit in a
folder named ``cutlass`` still counts as user code.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from functools import cache
from typing import Any

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # cutedebug/
# Folders inside the stdlib tree that hold installed packages, not the stdlib.
INSTALL_DIRS = ("site-packages", "dist-packages")


def dsl_root() -> str:
    """The installed DSL's tree: the wheel's whole nvidia_cutlass_dsl folder when there is one."""
    import cutlass

    root = os.path.dirname(os.path.abspath(cutlass.__file__))
    up = root
    while up != os.path.dirname(up) and os.path.basename(up) != "nvidia_cutlass_dsl":
        up = os.path.dirname(up)
    return up if os.path.basename(up) == "nvidia_cutlass_dsl" else root


@cache
def library_prefixes() -> tuple[str, ...]:
    """Path prefixes of code that is never the kernel's: the DSL, the stdlib, cutedebug. Paths
    under the stdlib prefixes are exempt when they lie in an INSTALL_DIRS folder (is_library)."""
    paths = sysconfig.get_paths()
    stdlib = {paths["stdlib"] + os.sep, paths["platstdlib"] + os.sep}
    return (dsl_root() + os.sep, *sorted(stdlib), PACKAGE_DIR)


def classify(path: str, dsl: str, stdlib: tuple[str, ...], own: str = PACKAGE_DIR) -> str:
    """ "dsl", "stdlib", "cutedebug" or "kernel" for an absolute path (the frame rule, pure)."""
    if path.startswith(own):
        return "cutedebug"
    if path.startswith(dsl):
        return "dsl"
    for prefix in stdlib:
        if path.startswith(prefix):
            parts = path[len(prefix) :].split(os.sep)
            return "kernel" if any(p in INSTALL_DIRS for p in parts[:-1]) else "stdlib"
    return "kernel"


@cache
def _classify_cached(path: str) -> str:
    dsl, *stdlib, own = library_prefixes()
    return classify(path, dsl, tuple(stdlib), own)


def is_library(filename: str) -> bool:
    """True for code that is not the kernel's: the DSL, the stdlib proper, cutedebug, and
    synthesized code (``<string>``, ``<frozen ...>``)."""
    if filename.startswith("<"):
        return True
    return _classify_cached(os.path.abspath(filename)) != "kernel"


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


# ---- the kernel's own frames: helpers are lifted to the kernel's call of them ----------------

# The DSL function that calls a @cute.kernel body while tracing it (base_dsl/dsl.py, 4.8.1).
KERNEL_CALLER = "kernel_wrapper"


def kernel_body_frame(frame: Any) -> Any:
    """The frame of the @cute.kernel body that ``frame`` runs inside (the kernel-code frame
    the DSL's kernel_wrapper called), or None (host code, or a DSL that calls it otherwise)."""
    f = frame
    while f is not None:
        up = f.f_back
        if (
            up is not None
            and up.f_code.co_name == KERNEL_CALLER
            and is_library(up.f_code.co_filename)
            and not is_library(f.f_code.co_filename)
        ):
            return f
        f = up
    return None


def kernel_own_frame(frame: Any) -> Any:
    """The innermost frame from ``frame`` up to the kernel body that is the kernel's own: the
    body itself, a function nested in it, or a method of the kernel object (the body's
    ``self``: a library kernel class's methods, wherever its base classes live). A free helper
    function or another object's method (quack's ``row_reduce`` -> ``cluster_reduce``, FA-4's
    copy closures, a tile scheduler) is lifted to the kernel's line that called it, so two
    calls of one helper are two sites. ``frame`` itself when no kernel body is on the stack."""
    body = kernel_body_frame(frame)
    if body is None:
        return frame
    chain = []  # kernel-code frames from ``frame`` up to the body, innermost first
    f = frame
    while f is not body:
        if not is_library(f.f_code.co_filename):
            chain.append(f)
        f = f.f_back
    obj = body.f_locals.get("self")
    own_names = [_qualname(body)]
    innermost = body
    for f in reversed(chain):
        # the DSL turns dynamic loop / if bodies into nested functions (``load.<locals>.
        # loop_body_4``): one of an own frame is own too, whether it uses ``self`` or not
        name = _qualname(f)
        if (obj is not None and f.f_locals.get("self") is obj) or any(
            name.startswith(n + ".<locals>.") for n in own_names
        ):
            own_names.append(name)
            innermost = f
    return innermost


def _qualname(frame: Any) -> str:
    return getattr(frame.f_code, "co_qualname", frame.f_code.co_name)


# ---- pipeline code: what the site rule skips besides library code ----------------------------


def _subclasses_defining(base: type, attr: str) -> list[type]:
    seen: list[type] = []
    todo = [base]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in seen if attr in vars(c)]


_PIPELINE_TYPES: tuple[type, ...] | None = None
_PIPELINE_NAMES: set[str] = set()


def is_pipeline_code(frame: Any) -> bool:
    """A frame of a pipeline's own code: a method whose ``self`` is a pipeline, barrier array or
    pipeline state (subclasses and mixins included) or holds a pipeline (a wrapper class), a
    static method of a pipeline class, or a function / lambda nested in one of those."""
    global _PIPELINE_TYPES
    if _PIPELINE_TYPES is None:
        from cutlass.pipeline import MbarrierArray, PipelineAsync, PipelineState

        _PIPELINE_TYPES = (PipelineAsync, MbarrierArray, PipelineState)
    obj = frame.f_locals.get("self")
    if obj is not None and (isinstance(obj, _PIPELINE_TYPES) or _is_handle(obj)):
        return True
    # a static method (create) of a pipeline class, or a lambda / function nested in a method
    owner = getattr(frame.f_code, "co_qualname", "").split(".<locals>.")[0].rpartition(".")[0]
    return bool(owner) and owner in _pipeline_class_names()


def _is_handle(obj: Any) -> bool:
    """A wrapper that holds a pipeline as an attribute (cutlass's PipelineProducer, a
    library's reader / writer class): its methods are the pipeline's code, not the kernel's.
    Kernel classes create their pipelines inside the kernel body and do not hold them."""
    try:
        values = vars(obj).values()
    except TypeError:
        return False
    from cutlass.pipeline import PipelineAsync

    return any(isinstance(v, PipelineAsync) for v in values)


def _pipeline_class_names() -> set[str]:
    if not _PIPELINE_NAMES:
        from cutlass.pipeline import MbarrierArray, PipelineAsync, PipelineState

        for base in (PipelineAsync, MbarrierArray, PipelineState):
            for cls in _subclasses_defining(base, "__module__"):
                for k in cls.__mro__:
                    if k is not object:
                        _PIPELINE_NAMES.add(k.__qualname__)
    return _PIPELINE_NAMES


def forget_pipeline_classes() -> None:
    """Subclasses may have been defined since (a library imported after cutlass)."""
    _PIPELINE_NAMES.clear()
