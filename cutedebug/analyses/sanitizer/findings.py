"""The one record type of a sanitizer report, ``Finding`` (and its ``Site``s), the finding
kinds, and the source line a finding points at. Serialised only through ``to_json`` /
``from_json`` (cutedebug/records.py: an unknown, missing or mistyped field is refused,
naming it)."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cutedebug import records

# ---- finding kinds -----------------------------------------------------------------------
RAW_HAZARD, WAR_HAZARD, WAW_HAZARD = "RAW_HAZARD", "WAR_HAZARD", "WAW_HAZARD"
RACE = "RACE"  # racecheck analysis record ("Race reported between ..."): no hazard type given
MISALIGNED = "MISALIGNED"
HARDWARE_EXCEPTION = "HARDWARE_EXCEPTION"  # "Warp Illegal Address", "Illegal Instruction", ...
LEAK = "LEAK"
UNINIT_READ = "UNINIT_READ"
BARRIER_MISUSE = "BARRIER_MISUSE"
API_ERROR = "API_ERROR"
PARSE_FAILURE = "PARSE_FAILURE"
TOOL_ERROR = "TOOL_ERROR"  # "Internal Sanitizer Error": the run's results cannot be trusted
UNKNOWN = "UNKNOWN"  # a record we could read but not name: kept, never dropped
# plus INVALID_<SPACE>_<READ|WRITE|ATOMIC>, e.g. INVALID_GLOBAL_WRITE, INVALID_SHARED_READ

HAZARD_KINDS = frozenset({RAW_HAZARD, WAR_HAZARD, WAW_HAZARD, RACE})


# ---- the record type ---------------------------------------------------------------------
Triple = tuple[int, int, int]


@dataclass(frozen=True)
class Site(records.Record):
    """One source location a finding points at (a hazard has two: both accesses)."""

    file: str | None
    line: int | None
    func: str | None = None
    access: str | None = None  # "Read" / "Write" for hazards
    thread: Triple | None = None


@dataclass(frozen=True)
class Finding(records.Record):
    tool: str
    kind: str
    severity: str  # "error" | "warning" | "info"
    kernel: str | None
    file: str | None
    line: int | None
    threads: tuple[Triple, ...] = ()
    blocks: tuple[Triple, ...] = ()
    address_space: str | None = None  # "global" | "shared" | "local" | ...
    size: int | None = None  # bytes per access
    count: int = 1  # hazards/errors this record stands for
    text: str = ""
    noise_reason: str | None = None  # None unless filtered
    sites: tuple[Site, ...] = ()
    api: str | None = None  # CUDA API call, for API_ERROR
    address: str | None = None

    @property
    def lines(self) -> tuple[tuple[str | None, int | None], ...]:
        if self.sites:
            return tuple((s.file, s.line) for s in self.sites)
        return ((self.file, self.line),)

    @property
    def signature(self) -> tuple[str, tuple[tuple[str | None, int | None], ...]]:
        """What makes two findings "the same": kind + source lines (threads may differ)."""
        return (self.kind, self.lines)


def parse_failure(tool: str, text: str) -> Finding:
    """A PARSE_FAILURE finding: output that could not be read is never "clean"."""
    return Finding(
        tool=tool,
        kind=PARSE_FAILURE,
        severity="error",
        kernel=None,
        file=None,
        line=None,
        text=text,
    )


# ---- source lines ------------------------------------------------------------------------
def source_line(
    file: str | None,
    line: int | None,
    roots: Sequence[str | os.PathLike] = (),
    *,
    strip: bool = True,
) -> str | None:
    """The stripped source line ``file:line`` (the kernel's Python), None if unreadable.

    A path recorded on another machine (a fixture, a copied report) is tried as its longest
    suffix that exists under ``roots`` or the current directory.
    """
    if not file or not line or line < 1:
        return None
    path = _resolve_source(file, roots)
    if path is None:
        return None
    try:
        stat = path.stat()
    except OSError:
        return None
    lines = _lines(str(path), stat.st_mtime_ns, stat.st_size)
    if lines is None or line > len(lines):
        return None
    return lines[line - 1].strip() if strip else lines[line - 1]


@functools.lru_cache(maxsize=64)
def _lines(path: str, _mtime_ns: int, _size: int) -> tuple[str, ...] | None:
    """A source file's lines, read once per version of it (a report reads thousands of lines
    of the same few files: racecheck repeats a hazard up to 1000 times, and the noise rules
    walk up from a line to its `def`)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return tuple(text.rstrip("\n") for text in fh)
    except OSError:
        return None


def _resolve_source(file: str, roots: Sequence[str | os.PathLike]) -> Path | None:
    path = Path(file)
    if path.is_file():
        return path
    parts = path.parts
    # The text report names the file only ("race_smem.py:28"): try it under each root too.
    start = 1 if path.is_absolute() else 0
    for root in (*roots, Path.cwd()):
        for i in range(start, len(parts)):
            candidate = Path(root, *parts[i:])
            if candidate.is_file():
                return candidate
    return None


_DEF = re.compile(r"^(\s*)(?:async\s+)?def\s+(\w+)")


def enclosing_def(
    file: str | None,
    line: int | None,
    read: Callable[[str | None, int | None], str | None],
    reach: int = 60,
) -> str | None:
    """The name of the Python function a source line is in: the nearest `def` above it that is
    indented less (within ``reach`` lines); None when there is none or the file is unreadable.
    ``read`` gives a line as written (indentation kept)."""
    if not file or not line:
        return None
    src = read(file, line)
    if src is None:
        return None
    indent = len(src) - len(src.lstrip())
    for k in range(line - 1, max(0, line - reach), -1):
        text = read(file, k)
        if text is None:
            return None
        m = _DEF.match(text)
        if m and len(m.group(1)) < indent:
            return m.group(2)
    return None
