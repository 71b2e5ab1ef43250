"""What the instrumentation layer knows about the kernel's objects while it is traced:
pipelines (creation order = what ``pipeline=N`` selects), their barrier arrays, pipeline state
lineages, and call sites. Tags are set on the DSL objects with ``object.__setattr__`` and follow
rebuilt copies (layer.py)."""

from __future__ import annotations

import dataclasses
import linecache
import os
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
