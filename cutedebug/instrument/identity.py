"""What the instrumentation layer knows about the kernel's objects while it is traced:
pipelines (creation order = what ``pipeline=N`` selects), their barrier arrays, pipeline state
lineages, and call sites. Tags are set on the DSL objects with ``object.__setattr__`` and follow
rebuilt copies (layer.py)."""

from __future__ import annotations

import dataclasses
import dis
import inspect
import linecache
import os
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class PipelineInfo:
    """One pipeline the kernel created: what ``pipeline=N`` selects."""

    index: int
    cls: str
    file: str | None
    line: int | None
    function: str | None = None
    via: str | None = None  # innermost library wrapper line of the create() call
    stages: int | None = None
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    arrays: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)  # side -> array
    obj: Any = dataclasses.field(default=None, repr=False)
    # pipeline ops whose method, as the pipeline's class resolves it, does nothing (a library's
    # ``def producer_commit(...): pass``): op -> "file:line" of that method
    noop_ops: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{os.path.basename(self.file or '?')}:{self.line}"

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "class": self.cls,
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "via": self.via,
            "stages": self.stages,
            "noop_ops": dict(self.noop_ops),
        }


@dataclasses.dataclass
class ArrayTag:
    pipeline: PipelineInfo | None
    side: str | None  # full | empty | None (not made by a pipeline's create)


@dataclasses.dataclass
class Lineage:
    """A pipeline state and every clone / rebuilt copy of it."""

    id: int
    role: str  # producer | consumer
    stages: Any
    file: str | None
    line: int | None
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)  # observers' marks


@dataclasses.dataclass
class Site:
    file: str | None
    line: int | None
    function: str | None
    via: str | None = None

    @property
    def code(self) -> str:
        return linecache.getline(self.file, self.line).strip() if self.file and self.line else ""


def _static(x: Any) -> int | None:
    if isinstance(x, int) and not isinstance(x, bool):
        return x
    v = getattr(x, "value", None)  # Int32(1): a DSL numeric holding a Python int
    return v if isinstance(v, int) and not isinstance(v, bool) else None


_EMPTY_BODY = (("LOAD_CONST", None), ("RETURN_VALUE", None))
_GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def is_noop_function(fn: Any) -> bool:
    """A function whose body does nothing (``pass``, a docstring, ``...``): its bytecode only
    returns None. Decorators made with functools.wraps (the DSL's dsl_user_op) are seen
    through."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(fn, "__code__", None)
    if code is None or code.co_flags & _GENERATOR_FLAGS:
        return False
    ops = [
        (i.opname, i.argval)
        for i in dis.get_instructions(code)
        if i.opname not in ("RESUME", "NOP", "CACHE", "EXTENDED_ARG")
    ]
    return ops in ([("RETURN_CONST", None)], [(op, None) for op, _ in _EMPTY_BODY])


def noop_ops(
    cls: type, ops: tuple[str, ...], original: Callable[[type, str], Any]
) -> dict[str, str]:
    """The ops of ``ops`` that the class ``cls`` resolves to a no-op method (its own or an
    ancestor's), as op -> "file:line" of that method. ``original(klass, attr)`` gives the
    unpatched attribute of a class that defines it (the layer may have wrapped it)."""
    out = {}
    for op in ops:
        owner = next((k for k in cls.__mro__ if op in vars(k)), None)
        if owner is None:
            continue
        fn = original(owner, op)
        if is_noop_function(fn):
            code = inspect.unwrap(getattr(fn, "__func__", fn)).__code__
            out[op] = f"{os.path.basename(code.co_filename)}:{_def_line(code)}"
    return out


def _def_line(code: Any) -> int:
    """The ``def`` line of a function (co_firstlineno is its first decorator's)."""
    line = code.co_firstlineno
    for n in range(line, line + 20):
        if linecache.getline(code.co_filename, n).lstrip().startswith(("def ", "async def ")):
            return n
    return line
