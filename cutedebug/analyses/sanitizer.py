"""compute-sanitizer around the worker: command, environment, parsing, triage, shrinking.

The runner wraps the same worker command (``python -m cutedebug.engine.worker request.json``) in
``compute-sanitizer --tool T --xml --save F ...`` under its watchdog. This module builds that
command and environment, turns the XML file (and the plain-text stdout, as fallback and as a
cross-check) into one record type, ``Finding``, filters known noise with the reason kept,
groups duplicates, classifies the run, renders the triage report, and shrinks the problem
size while the same finding persists.

It never imports torch or cutlass: the parent process imports it.

Output formats, as captured on an H200 (compute-sanitizer 2025.3.1, driver 580; the files are
tests/data/sanitizer/h200/, tests pin every shape below):

- ``--xml --save F`` writes ``<ComputeSanitizerOutput>`` (``<ComputeSanitizerOutput/>`` when
  clean) holding one ``<record>`` per report, told apart by ``<kind>``:

  - ``Hazard`` (racecheck, one per byte of shared memory)::

      <what><text>Potential RAW hazard detected</text><common><gridid/><type>RAW</type>
      <address>0x500</address><blockIdx><x/><y/><z/></blockIdx><current/>
      <isCudaBarrierOp/></common><thread0><access>Write</access><threadIdx/>
      <where><func/><path>/abs/file.py</path><line>28</line><pc/></where></thread0>
      <thread1>...</thread1></what>

  - ``Analysis`` (racecheck's summary of those hazards)::

      <level>Error</level><what><text>Race condition</text><source><direction>Write</direction>
      <where>...</where></source><destination><direction>Read</direction><where>...</where>
      <count>512</count></destination></what>

  - ``Precise`` (memcheck)::

      <level>Error</level><who><threadIdx/><blockIdx/></who><what><text>Invalid __global__
      write of size 4 bytes is out of bounds</text><space>__global__</space><size>4</size>
      <direction>write</direction><error>out of bounds</error><address/></what><where>...</where>

  - ``Initcheck``: like ``Precise`` without level/space/direction, text "Uninitialized
    __global__ memory read of size 4 bytes".
  - ``Synccheck``: ``<who><threadIdx/><blockIdx/></who><what><text>Barrier error</text>
    <type>Missing wait</type></what><where>...</where>`` (type "Missing init" for an mbarrier
    used before its init was fenced; "Missing wait" for an arrive beyond the phase's count).
  - ``Api`` (only with ``--report-api-errors all``): ``<what><text>Program hit
    CUDA_ERROR_INVALID_VALUE (error 1) due to "invalid argument" on CUDA API call to
    cuGetProcAddress_v2.</text><api/><error/><message/><result/></what>``, no location.

  The reader still looks elements up by name anywhere inside a record (host stacks excluded)
  and takes the kind from ``<type>``/``<kind>`` or else the message text, so a record kind we
  have no sample of is read, not dropped.
- ``--xml`` does not silence the text report: stdout carries the same findings as the plain
  run (``========= ``-prefixed blocks, the file named by its base name only), so the summary
  line is always there to cross-check the XML against::

    ========= Invalid __global__ write of size 4 bytes
    =========     at kernel+0x210 in minimal.py:64
    =========     by thread (64,0,0) in block (31,0,0)
    =========     Access to 0x7f7f3a808000 is out of bounds
    ...
    ========= Error: Potential RAW hazard detected at __shared__ 0x500 in block (0,0,0) :
    =========     Write Thread (64,0,0) at kernel+0xe0 in race_smem.py:28
    =========     Read Thread (32,0,0) at kernel+0xf0 in race_smem.py:31
    ========= Error: Race reported between Write access at kernel+0xe0 in race_smem.py:28
    =========     and Read access at kernel+0xf0 in race_smem.py:31 [512 hazards]
    ========= ERROR SUMMARY: 64 errors
    ========= RACECHECK SUMMARY: 513 hazards displayed (513 errors, 0 warnings)
- Every flag ``build_command`` emits was accepted by 2025.3.1. ``--error-exitcode`` also fires
  on API errors when they are reported (the API-noise capture exited 86 with no kernel error).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from cutedebug.engine.verdict import SanitizerClass

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")

# Distinct from the worker's own exit codes so the runner can tell "sanitizer found errors".
ERROR_EXITCODE = 86
DEFAULT_PRINT_LIMIT = 1000

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

# ---- run classes (closed set) ------------------------------------------------------------
CLEAN = SanitizerClass.CLEAN.value
CLASSES = tuple(c.value for c in SanitizerClass)  # the closed set is engine.verdict's
TOOL_CLASS = {
    "memcheck": "MEMORY_ERROR",
    "racecheck": "RACE",
    "synccheck": "SYNC_ERROR",
    "initcheck": "UNINIT",
}


def kind_class(kind: str, tool: str) -> str:
    """The run class a finding kind stands for."""
    if kind in HAZARD_KINDS:
        return "RACE"
    if kind.startswith("INVALID_") or kind in (MISALIGNED, HARDWARE_EXCEPTION, LEAK):
        return "MEMORY_ERROR"
    if kind == BARRIER_MISUSE:
        return "SYNC_ERROR"
    if kind == UNINIT_READ:
        return "UNINIT"
    if kind == API_ERROR:
        return "API_ERROR"
    if kind in (PARSE_FAILURE, TOOL_ERROR):
        return "UNREADABLE"
    return TOOL_CLASS.get(tool, "UNREADABLE")


# Which class wins when one run has several: the tool's own class first, then this order.
_CLASS_PRIORITY = ("MEMORY_ERROR", "RACE", "SYNC_ERROR", "UNINIT", "API_ERROR", "UNREADABLE")


# ---- locating and running the tool -------------------------------------------------------
def find_sanitizer() -> str | None:
    """Path of compute-sanitizer: $COMPUTE_SANITIZER, PATH, $CUDA_HOME/bin, /usr/local/cuda*."""
    candidates: list[str] = []
    if os.environ.get("COMPUTE_SANITIZER"):
        candidates.append(os.environ["COMPUTE_SANITIZER"])
    on_path = shutil.which("compute-sanitizer")
    if on_path:
        candidates.append(on_path)
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "compute-sanitizer"))
    candidates.append("/usr/local/cuda/bin/compute-sanitizer")
    versioned = glob.glob("/usr/local/cuda-*/bin/compute-sanitizer")
    candidates.extend(sorted(versioned, key=_version_key, reverse=True))
    candidates.append("/opt/nvidia/compute-sanitizer/compute-sanitizer")
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _version_key(path: str) -> tuple[int, ...]:
    m = re.search(r"cuda-(\d+(?:\.\d+)*)", path)
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def build_command(
    tool: str,
    worker_argv: list[str],
    xml_path: str,
    *,
    sanitizer: str,
    print_limit: int = DEFAULT_PRINT_LIMIT,
    report_api_errors: bool = False,
    racecheck_report: str = "all",
    deadlock_timeout_s: int | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """compute-sanitizer argv around ``worker_argv``; XML goes to ``xml_path``.

    Line info is not a flag here: the worker's kernels get it from CUTE_DSL_LINEINFO=1
    (``child_env``).
    """
    if tool not in TOOLS:
        raise ValueError(f"unknown sanitizer tool {tool!r}; choose from {TOOLS}")
    cmd = [
        sanitizer,
        "--tool",
        tool,
        "--xml",
        "--save",
        xml_path,  # spelling seen working on 2025.3.1 (REFERENCE.md)
        "--print-limit",
        str(print_limit),
        "--error-exitcode",
        str(ERROR_EXITCODE),
        # cuda-bindings probes the driver with cuGetProcAddress; each miss is an API error.
        "--report-api-errors",
        "all" if report_api_errors else "no",
        "--show-backtrace",
        "device",  # Python host frames say nothing about the kernel
        "--target-processes",
        "all",
    ]
    if tool == "racecheck":
        # "all" = per-hazard records (RAW/WAR/WAW, both threads) + the analysis summary.
        cmd += ["--racecheck-report", racecheck_report]
        if deadlock_timeout_s is not None:
            cmd += ["--racecheck-deadlock-timeout", str(deadlock_timeout_s)]
    cmd += list(extra)
    return cmd + list(worker_argv)


def child_env(tool: str) -> dict[str, str]:
    """Environment additions for the sanitized worker."""
    env = {"CUTE_DSL_LINEINFO": "1"}  # kernel .py file:line in the cubin, nothing else
    if tool in ("memcheck", "initcheck"):
        # The caching allocator hands out slices of big segments: an out-of-bounds store
        # inside a segment is invisible to memcheck (REFERENCE.md: 0 errors with caching on),
        # and reused blocks look initialised to initcheck.
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return env


# ---- the record type ---------------------------------------------------------------------
Triple = tuple[int, int, int]


@dataclass(frozen=True)
class Site:
    """One source location a finding points at (a hazard has two: both accesses)."""

    file: str | None
    line: int | None
    func: str | None = None
    access: str | None = None  # "Read" / "Write" for hazards
    thread: Triple | None = None


@dataclass(frozen=True)
class Finding:
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _failure(tool: str, text: str) -> Finding:
    return Finding(
        tool=tool,
        kind=PARSE_FAILURE,
        severity="error",
        kernel=None,
        file=None,
        line=None,
        text=text,
    )


# ---- message text → kind, space, size ----------------------------------------------------
_SPACE_RE = r"(?:__(\w+?)__|(\w+))"
_INVALID_RE = re.compile(rf"Invalid {_SPACE_RE} (read|write|atomic)", re.IGNORECASE)
_HAZARD_RE = re.compile(r"Potential (RAW|WAR|WAW) hazard", re.IGNORECASE)
_SIZE_RE = re.compile(r"of size (\d+) bytes?", re.IGNORECASE)
_API_RE = re.compile(r"on CUDA API call to (\w+)", re.IGNORECASE)
_SPACE_WORD_RE = re.compile(r"__(global|shared|local|generic)__")


def _kind_from_text(tool: str, text: str) -> str:
    if re.search(r"Internal Sanitizer Error|Sanitizer failed", text, re.IGNORECASE):
        return TOOL_ERROR
    if m := _HAZARD_RE.search(text):
        return f"{m.group(1).upper()}_HAZARD"
    # "Race reported between" (text analysis record), "Race condition" (its XML <text>)
    if re.search(r"Race reported between|^Race condition", text, re.IGNORECASE | re.MULTILINE):
        return RACE
    if _API_RE.search(text) or re.search(r"^Program hit ", text):
        return API_ERROR
    if re.search(r"misaligned", text, re.IGNORECASE):
        return MISALIGNED
    if m := _INVALID_RE.search(text):
        space = (m.group(1) or m.group(2)).upper()
        return f"INVALID_{space}_{m.group(3).upper()}"
    if re.search(r"uninitiali[sz]ed", text, re.IGNORECASE):
        return UNINIT_READ
    if re.search(r"barrier|divergent thread|synchroniz", text, re.IGNORECASE):
        return BARRIER_MISUSE
    if re.search(r"leak", text, re.IGNORECASE):
        return LEAK
    if re.search(
        r"^(Warp|Lane|Device) |illegal|out-of-range|exception|malformed|trap", text, re.IGNORECASE
    ):
        return HARDWARE_EXCEPTION
    return {"racecheck": RACE, "synccheck": BARRIER_MISUSE, "initcheck": UNINIT_READ}.get(
        tool, UNKNOWN
    )


def _space_from_text(kind: str, text: str) -> str | None:
    if m := _SPACE_WORD_RE.search(text):
        return m.group(1)
    if kind in HAZARD_KINDS:
        return "shared"  # racecheck only checks shared memory
    if kind == UNINIT_READ:
        return "global"  # initcheck only checks global memory
    return None


def _severity(kind: str, level: str | None, text: str) -> str:
    if level:
        lv = level.strip().lower()
        return {"err": "error", "warn": "warning"}.get(lv, lv)
    if re.match(r"\s*warning\b", text, re.IGNORECASE):
        return "warning"
    if re.match(r"\s*info\b", text, re.IGNORECASE):
        return "info"
    return "error"


# ---- XML ---------------------------------------------------------------------------------
_SKIP = frozenset({"hostStack", "hoststack"})  # host frames carry func/path/line too


def _walk(elem: ET.Element) -> Iterator[ET.Element]:
    """Descendants of ``elem`` (itself included), host stacks excluded."""
    yield elem
    for child in elem:
        if child.tag not in _SKIP:
            yield from _walk(child)


def _first(elem: ET.Element, *names: str) -> ET.Element | None:
    for e in _walk(elem):
        if e.tag in names:
            return e
    return None


def _text(elem: ET.Element | None, *names: str) -> str | None:
    if elem is None:
        return None
    e = _first(elem, *names) if names else elem
    if e is None or e.text is None:
        return None
    return e.text.strip() or None


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value, 0)
    except ValueError:
        return None


def _triple(elem: ET.Element | None) -> Triple | None:
    """<threadIdx><x>1</x><y>0</y><z>0</z></threadIdx> or x/y/z attributes."""
    if elem is None:
        return None
    vals = []
    for axis in ("x", "y", "z"):
        v = elem.get(axis)
        if v is None:
            child = elem.find(axis)
            v = child.text if child is not None else None
        iv = _int(v.strip() if v else None)
        if iv is None:
            return None
        vals.append(iv)
    return (vals[0], vals[1], vals[2])


def _site_from(elem: ET.Element) -> Site | None:
    where = _first(elem, "where")
    if where is None:
        return None
    return Site(
        file=_text(where, "path", "file"),
        line=_int(_text(where, "line")),
        func=_text(where, "func", "function"),
        # <access> in a hazard's <threadN>, <direction> in an analysis record's side
        access=(_text(elem, "access", "accessType", "direction") if elem.tag != "record" else None),
        thread=_triple(_first(elem, "threadIdx")),
    )


# Sides of a two-sided record: <thread0>/<thread1> (Hazard), <source>/<destination> (Analysis).
_THREAD_TAG = re.compile(r"^((thread|access)\d+|source|destination)$")
# Elements that explain a record ("misaligned", "out of bounds"); names of code never are.
_NOTE_TAGS = frozenset({"error", "cause", "description", "message", "reason"})


def _finding_from_record(rec: ET.Element, tool: str) -> Finding:
    kind_tag = _text(rec.find("kind")) or ""
    what = rec.find("what")
    text = _text(what if what is not None else rec, "text") or kind_tag
    hazard_type = None
    common = _first(rec, "common")
    if common is not None:
        hazard_type = _text(common, "type")
    # synccheck says which barrier rule broke in <what><type>: "Missing wait", "Missing init"
    detail = _text(what.find("type")) if what is not None else None
    if detail and detail.lower() not in text.lower():
        text = f"{text}: {detail}"
    if hazard_type and hazard_type.upper() in ("RAW", "WAR", "WAW"):
        kind = f"{hazard_type.upper()}_HAZARD"
    elif kind_tag.lower() in ("api", "apierror", "api_error"):
        kind = API_ERROR
    elif kind_tag.lower() == "analysis":
        kind = RACE
    else:
        notes = [t for t in (_text(e) for e in _walk(rec) if e.tag in _NOTE_TAGS) if t]
        kind = _kind_from_text(tool, "\n".join([text, *notes]))

    # Both sides of a hazard live in <thread0>/<thread1>; other records have one <where>.
    sides = [e for e in _walk(rec) if _THREAD_TAG.match(e.tag)]
    sites = tuple(s for s in (_site_from(e) for e in sides) if s is not None)
    if not sites:
        site = _site_from(rec)
        if site is not None:
            site = replace(site, thread=site.thread or _triple(_first(rec, "threadIdx")))
            sites = (site,)
    threads = tuple(s.thread for s in sites if s.thread is not None)
    if not threads:
        threads = tuple(
            t for t in (_triple(e) for e in _walk(rec) if e.tag == "threadIdx") if t is not None
        )
    blocks = tuple(
        dict.fromkeys(
            t for t in (_triple(e) for e in _walk(rec) if e.tag == "blockIdx") if t is not None
        )
    )
    size = _int(_text(rec, "size", "accessSize"))
    if size is None and (m := _SIZE_RE.search(text)):
        size = int(m.group(1))
    space = _text(rec, "space", "addressSpace")
    space = space.strip("_").lower() if space else _space_from_text(kind, text)
    api = _text(rec, "api", "apiName", "function_name")
    if api is None and (m := _API_RE.search(text)):
        api = m.group(1)
    count = _int(_text(rec, "count", "numHazards")) or 1
    kernel = _text(rec, "kernel", "kernelName") or (sites[0].func if sites else None)
    first = sites[0] if sites else Site(None, None)
    return Finding(
        tool=tool,
        kind=kind,
        severity=_severity(kind, _text(rec, "level", "severity"), text),
        kernel=kernel,
        file=first.file,
        line=first.line,
        threads=threads,
        blocks=blocks,
        address_space=space,
        size=size,
        count=count,
        text=text,
        sites=sites,
        api=api,
        address=_text(rec, "address", "accessAddress"),
    )


_RECORD_BLOCK = re.compile(r"<record\b.*?</record>", re.DOTALL)


def parse_xml(path_or_text: str | os.PathLike, tool: str) -> list[Finding]:
    """Findings in a ``--xml --save`` file (a path, or the XML itself as a string).

    A missing, empty, truncated or malformed file yields a PARSE_FAILURE finding (plus
    whatever complete records could be salvaged), never an empty "clean" list.
    """
    text, where = _read_source(path_or_text)
    if text is None:
        return [_failure(tool, f"sanitizer XML {where} could not be read")]
    if not text.strip():
        return [_failure(tool, f"sanitizer XML {where} is empty (the tool did not finish?)")]
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        salvaged = []
        for block in _RECORD_BLOCK.findall(text):
            try:
                rec = ET.fromstring(block)
                _strip_namespaces(rec)
                salvaged.append(_finding_from_record(rec, tool))
            except ET.ParseError:
                continue
        note = (
            f"sanitizer XML {where} is not well-formed ({exc}); "
            f"{len(salvaged)} complete record(s) salvaged"
        )
        return [_failure(tool, note)] + salvaged
    _strip_namespaces(root)
    return [_finding_from_record(r, tool) for r in root.iter("record")]


def _strip_namespaces(root: ET.Element) -> None:
    """``{uri}record`` → ``record``, so a namespaced file is not read as empty ("clean")."""
    for e in root.iter():
        if isinstance(e.tag, str) and "}" in e.tag:
            e.tag = e.tag.split("}", 1)[1]


def _read_source(path_or_text: str | os.PathLike) -> tuple[str | None, str]:
    s = os.fspath(path_or_text)
    if isinstance(path_or_text, str) and s.lstrip().startswith("<"):
        return s, "(inline)"
    try:
        return Path(s).read_text(errors="replace"), s
    except OSError:
        return None, s


# ---- plain text --------------------------------------------------------------------------
_PREFIX = re.compile(r"^=+ ?")
_NOT_RECORD = re.compile(
    r"^(COMPUTE-SANITIZER|(ERROR|RACECHECK|LEAK) SUMMARY|Target application|"
    r"This (error|report)|Saved host|Host Frame|Device Frame|"
    r"Error: (process didn't terminate|Target application))",
    re.IGNORECASE,
)
_BY_THREAD = re.compile(r"by thread \((\d+),(\d+),(\d+)\) in block \((\d+),(\d+),(\d+)\)")
_IN_BLOCK = re.compile(r"in block \((\d+),(\d+),(\d+)\)")
_HAZ_THREAD = re.compile(r"^(Read|Write)\s+Thread \((\d+),(\d+),(\d+)\) at (.*)$")
_RACE_SIDE = re.compile(
    r"^(?:.*?Race reported between |and )(\w+) access at (.*?)"
    r"(?:\s+\[(\d+) hazards?\])?$"
)
_AT = re.compile(r"^at (.*)$")
# "Access to 0x.. is out of bounds" (memcheck), "Address 0x.." (initcheck), "at __shared__
# 0x500 in block" (racecheck header)
_ADDRESS = re.compile(r"(?:^Access to|^Address|at __\w+__) (0x[0-9a-fA-F]+)")
# Lines that name code (kernel, file, host frames): never read for the finding's kind.
_LOCATION_LINE = re.compile(
    r"^(at |and \w+ access at |(Read|Write)\s+Thread |by thread |Saved host|Host Frame|"
    r"Device Frame)"
)
_LOC = re.compile(r"^(?P<file>\S+?):(?P<line>\d+)(?::(?P<func>.*))?$")
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_RACE_SUMMARY = re.compile(
    r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)"
)


def _location(rest: str) -> tuple[str | None, int | None, str | None]:
    """``func+0xd0 in /p/f.py:25`` or ``0x3c8 in /p/f.cu:17:func`` → (file, line, func)."""
    if " in " not in rest:
        func = rest.strip() or None
        return None, None, func
    head, tail = rest.rsplit(" in ", 1)
    func = re.sub(r"\+0x[0-9a-fA-F]+$", "", head.strip()) or None
    if func and re.fullmatch(r"0x[0-9a-fA-F]+", func):
        func = None
    m = _LOC.match(tail.strip())
    if not m:
        return None, None, func or tail.strip() or None
    return m.group("file"), int(m.group("line")), func or m.group("func")


def _blocks_from_text(text: str) -> list[list[str]]:
    """Record blocks: a non-indented report line and the indented lines under it."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for raw in text.splitlines():
        if not _PREFIX.match(raw):
            continue  # the application's own output
        body = _PREFIX.sub("", raw, count=1).rstrip()
        if not body.strip():
            current = None
            continue
        if body[0] in " \t":
            if current is not None:
                current.append(body.strip())
            continue
        if _NOT_RECORD.match(body):
            current = None
            continue
        current = [body]
        blocks.append(current)
    return blocks


def _finding_from_block(block: list[str], tool: str) -> Finding:
    header = block[0]
    body = re.sub(r"^(ERROR|Error|WARNING|Warning|INFO|Info):\s*", "", header)
    # "Address 0x... is misaligned" comes on a detail line under "Invalid ... read".
    details = [ln for ln in block[1:] if not _LOCATION_LINE.match(ln)]
    kind = _kind_from_text(tool, "\n".join([header, *details]))
    sites: list[Site] = []
    threads: list[Triple] = []
    blocks: list[Triple] = []
    count = 1
    if kind == RACE:
        count = 0
        for line in [header] + block[1:]:
            if m := _RACE_SIDE.match(line):
                f, ln, fn = _location(m.group(2))
                sites.append(Site(f, ln, fn, access=m.group(1)))
                count += int(m.group(3) or 1) if line.startswith("and ") else 0
        count = max(count, 1)
    for line in block[1:]:
        if m := _HAZ_THREAD.match(line):
            f, ln, fn = _location(m.group(5))
            t = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
            sites.append(Site(f, ln, fn, access=m.group(1), thread=t))
            threads.append(t)
        elif (m := _AT.match(line)) and kind != RACE:
            f, ln, fn = _location(m.group(1))
            sites.append(Site(f, ln, fn))
        elif m := _BY_THREAD.match(line):
            threads.append(tuple(int(g) for g in m.groups()[:3]))  # type: ignore[arg-type]
            blocks.append(tuple(int(g) for g in m.groups()[3:]))  # type: ignore[arg-type]
    if m := _IN_BLOCK.search(header):
        blocks.append(tuple(int(g) for g in m.groups()))  # type: ignore[arg-type]
    if sites and threads and len(sites) == 1 and sites[0].thread is None:
        sites[0] = replace(sites[0], thread=threads[0])
    size = int(m.group(1)) if (m := _SIZE_RE.search(header)) else None
    api = m.group(1) if (m := _API_RE.search(header)) else None
    first = sites[0] if sites else Site(None, None)
    address = next((m.group(1) for ln in [body, *block[1:]] if (m := _ADDRESS.search(ln))), None)
    text = "\n".join([body] + block[1:])
    return Finding(
        tool=tool,
        kind=kind,
        severity=_severity(kind, None, header),
        kernel=first.func,
        file=first.file,
        line=first.line,
        threads=tuple(dict.fromkeys(threads)),
        blocks=tuple(dict.fromkeys(blocks)),
        address_space=_space_from_text(kind, header),
        size=size,
        count=count,
        text=text,
        sites=tuple(sites),
        api=api,
        address=address,
    )


def parse_text(stdout_text: str, tool: str) -> list[Finding]:
    """Findings in the plain-text report (fallback when the XML is unusable)."""
    return [_finding_from_block(b, tool) for b in _blocks_from_text(stdout_text)]


def parse_summary(stdout_text: str) -> dict[str, int] | None:
    """The tool's closing count: {"errors": N} or, for racecheck, hazards/errors/warnings."""
    if m := _RACE_SUMMARY.search(stdout_text):
        return {"hazards": int(m.group(1)), "errors": int(m.group(2)), "warnings": int(m.group(3))}
    if m := _ERROR_SUMMARY.search(stdout_text):
        return {"errors": int(m.group(1))}
    return None


def crosscheck(
    findings: Sequence[Finding], stdout_text: str, tool: str, print_limit: int = DEFAULT_PRINT_LIMIT
) -> list[Finding]:
    """A PARSE_FAILURE when the summary line reports errors the XML does not hold."""
    summary = parse_summary(stdout_text)
    if summary is None:
        return []
    records = [f for f in findings if f.kind != PARSE_FAILURE]
    reported = summary.get("hazards", summary["errors"])
    if tool == "racecheck":
        # Hazard vs analysis record counting differs; only "N hazards, no records" is sure.
        lost = reported > 0 and not records
    else:
        limit = print_limit if print_limit > 0 else reported
        lost = len(records) < min(reported, limit)
    if not lost:
        return []
    return [
        _failure(
            tool,
            f"summary line reports {reported} error(s) but only "
            f"{len(records)} record(s) were parsed",
        )
    ]


def analyze(
    tool: str,
    xml_path: str | os.PathLike | None,
    stdout_text: str = "",
    print_limit: int = DEFAULT_PRINT_LIMIT,
) -> list[Finding]:
    """All findings of one sanitizer run: the XML, else the text report, cross-checked."""
    findings = (
        parse_xml(xml_path, tool)
        if xml_path is not None
        else [_failure(tool, "no sanitizer XML file was produced")]
    )
    xml_failed = any(f.kind == PARSE_FAILURE for f in findings)
    if xml_failed and stdout_text:
        from_text = parse_text(stdout_text, tool)
        if from_text:
            # Keep the XML failure visible but let the text records decide the verdict.
            notes = [replace(f, severity="info") for f in findings if f.kind == PARSE_FAILURE]
            return from_text + notes + crosscheck(from_text, stdout_text, tool, print_limit)
    return findings + crosscheck(findings, stdout_text, tool, print_limit)


# ---- noise -------------------------------------------------------------------------------
NOISE_PROC_ADDRESS = (
    "cuda-bindings probes driver entry points with cuGetProcAddress; "
    "a miss is reported as an API error but is not a kernel error"
)
NOISE_TMA = (
    "one side of the hazard is a bulk async copy (TMA); racecheck does not follow "
    "the mbarrier transaction count that orders it"
)
NOISE_ANALYSIS_DUP = "racecheck analysis record summarising hazards already reported one by one"

_TMA_SOURCE = re.compile(
    r"tma|cp_async_bulk|bulk_copy|copy_bulk|TmaCopy|CopyBulk|store_async_dsmem", re.IGNORECASE
)
_TMA_TEXT = re.compile(r"bulk|async copy|cp\.async\.bulk|UTMA|UBLKCP|\btma\b", re.IGNORECASE)


def filter_noise(
    findings: Iterable[Finding],
    *,
    tma: bool = True,
    read_source: Callable[[str | None, int | None], str | None] | None = None,
) -> tuple[list[Finding], list[Finding]]:
    """(kept, filtered); every filtered finding carries its ``noise_reason``."""
    read = read_source or source_line
    findings = list(findings)
    kept: list[Finding] = []
    filtered: list[Finding] = []
    typed_hazard_lines = {
        ln for f in findings if f.kind in (RAW_HAZARD, WAR_HAZARD, WAW_HAZARD) for ln in f.lines
    }
    for f in findings:
        reason = None
        if f.kind == API_ERROR and "cuGetProcAddress" in ((f.api or "") + f.text):
            reason = NOISE_PROC_ADDRESS
        elif f.kind == RACE and f.lines and set(f.lines) <= typed_hazard_lines:
            reason = NOISE_ANALYSIS_DUP
        elif tma and f.kind in HAZARD_KINDS and _touches_bulk_copy(f, read):
            reason = NOISE_TMA
        if reason:
            filtered.append(replace(f, noise_reason=reason))
        else:
            kept.append(f)
    return kept, filtered


def _touches_bulk_copy(f: Finding, read: Callable[[str | None, int | None], str | None]) -> bool:
    if _TMA_TEXT.search(f.text):
        return True
    for s in f.sites:
        if s.func and _TMA_SOURCE.search(s.func):
            return True
        src = read(s.file, s.line)
        if src and _TMA_SOURCE.search(src):
            return True
    return False


# ---- attribution: which kernel of the process a finding belongs to -------------------------
# compute-sanitizer checks every kernel the process launches: the torch reference's too
# (racecheck reported 1000 hazards inside PyTorch's attention kernel under a clean FA-4
# forward). The worker names the kernels it launched (the compiled module's PTX entries, the
# symbols the sanitizer reports in <func>); findings of any other kernel are counted apart.


def is_launched_kernel(name: str | None, kernel_names: Sequence[str]) -> bool:
    """``name`` (a finding's kernel) is one the worker launched: equal, or one a prefix of
    the other (a tool that shortens long symbols)."""
    if not name:
        return False
    return any(
        name == k or (min(len(name), len(k)) >= 16 and (name.startswith(k) or k.startswith(name)))
        for k in kernel_names
    )


def attribute(
    findings: Iterable[Finding], kernel_names: Sequence[str]
) -> tuple[list[Finding], list[Finding]]:
    """(the kernel under test's findings, other kernels' findings).

    A finding belongs to another kernel only when it names a kernel and that kernel is not one
    the worker launched. Findings that name no kernel (API errors, parse failures, the
    summary cross-check) stay with the run, and so does everything when the launched kernels
    are unknown (no names: nothing is set aside, never a finding hidden).
    """
    own: list[Finding] = []
    others: list[Finding] = []
    for f in findings:
        if kernel_names and f.kernel and not is_launched_kernel(f.kernel, kernel_names):
            others.append(f)
        else:
            own.append(f)
    return own, others


def other_kernels(
    others: Iterable[Finding],
    tool: str,
    read: Callable[[str | None, int | None], str | None] | None = None,
    max_groups: int = 4,
) -> list[dict[str, Any]]:
    """Per other kernel: its name, records, count, class and first groups (most first)."""
    by_kernel: dict[str, list[Finding]] = {}
    for f in others:
        by_kernel.setdefault(f.kernel or "?", []).append(f)
    out = [
        {
            "kernel": name,
            "records": len(fs),
            "count": sum(f.count for f in fs),
            "class": classify(fs, tool),
            "groups": [g.to_dict(read) for g in group(fs)[:max_groups]],
        }
        for name, fs in by_kernel.items()
    ]
    out.sort(key=lambda k: -k["count"])
    return out


# ---- grouping and classification ---------------------------------------------------------
@dataclass
class Group:
    kind: str
    tool: str
    severity: str
    lines: tuple[tuple[str | None, int | None], ...]
    kernel: str | None
    count: int = 0  # hazards/errors, summed over records
    records: int = 0
    threads: list[Triple] = field(default_factory=list)  # first few, distinct
    blocks: list[Triple] = field(default_factory=list)
    address_space: str | None = None
    size: int | None = None
    text: str = ""  # the first record's message
    accesses: tuple[str | None, ...] = ()

    def to_dict(
        self, read_source: Callable[[str | None, int | None], str | None] | None = None
    ) -> dict[str, Any]:
        d = asdict(self)
        d["lines"] = [
            {"file": f, "line": ln, "source": (read_source or source_line)(f, ln)}
            for f, ln in self.lines
        ]
        return d


_MAX_EXAMPLES = 4
_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def group(findings: Iterable[Finding]) -> list[Group]:
    """Findings with the same tool, kind and source lines, counted; errors first."""
    groups: dict[tuple, Group] = {}
    for f in findings:
        key = (f.tool, f.kind, f.lines)
        g = groups.get(key)
        if g is None:
            g = groups[key] = Group(
                kind=f.kind,
                tool=f.tool,
                severity=f.severity,
                lines=f.lines,
                kernel=f.kernel,
                address_space=f.address_space,
                size=f.size,
                text=f.text,
                accesses=tuple(s.access for s in f.sites),
            )
        g.count += f.count
        g.records += 1
        if _SEVERITY_ORDER.get(f.severity, 3) < _SEVERITY_ORDER.get(g.severity, 3):
            g.severity = f.severity
        for t in f.threads:
            if t not in g.threads and len(g.threads) < _MAX_EXAMPLES:
                g.threads.append(t)
        for b in f.blocks:
            if b not in g.blocks and len(g.blocks) < _MAX_EXAMPLES:
                g.blocks.append(b)
    order = list(groups.values())
    order.sort(
        key=lambda g: (_SEVERITY_ORDER.get(g.severity, 3), g.kind == PARSE_FAILURE, -g.count)
    )
    return order


def classify(kept: Iterable[Finding], tool: str) -> str:
    """One of CLASSES for the kept (not filtered) findings of one tool's run."""
    classes = {kind_class(f.kind, f.tool or tool) for f in kept if f.severity != "info"}
    if not classes:
        return CLEAN
    own = TOOL_CLASS.get(tool)
    if own in classes:
        return own
    return next(c for c in _CLASS_PRIORITY if c in classes)


# ---- source lines ------------------------------------------------------------------------
def source_line(
    file: str | None, line: int | None, roots: Sequence[str | os.PathLike] = ()
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
        with open(path, encoding="utf-8", errors="replace") as fh:
            for i, text in enumerate(fh, 1):
                if i == line:
                    return text.strip()
    except OSError:
        return None
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


# ---- result and report -------------------------------------------------------------------
def make_result(
    tool: str,
    command: Sequence[str],
    findings: Sequence[Finding],
    *,
    env: Mapping[str, str] | None = None,
    exit_code: int | None = None,
    sanitizer_seconds: float | None = None,
    plain_seconds: float | None = None,
    xml_path: str | None = None,
    shrink_result: ShrinkResult | None = None,
    read_source: Callable[[str | None, int | None], str | None] | None = None,
    tma_filter: bool = True,
    kernel_names: Sequence[str] = (),
) -> dict[str, Any]:
    """The JSON-able triage record of one tool's run (``render_markdown`` reads it).

    ``kernel_names``: the kernels the worker launched; findings of other kernels are listed
    under ``other_kernels`` and never decide the verdict (see ``attribute``).
    """
    read = read_source or source_line
    kept, filtered = filter_noise(findings, tma=tma_filter, read_source=read)
    kept, others = attribute(kept, kernel_names)
    reasons: dict[str, int] = {}
    for f in filtered:
        reasons[f.noise_reason or ""] = reasons.get(f.noise_reason or "", 0) + 1  # records
    env_part = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted((env or {}).items()))
    slowdown = sanitizer_seconds / plain_seconds if sanitizer_seconds and plain_seconds else None
    result = {
        "tool": tool,
        "verdict": classify(kept, tool),
        "exit_code": exit_code,
        "command": list(command),
        "reproduce": (env_part + " " if env_part else "") + shlex.join(command),
        "xml": xml_path,
        "groups": [g.to_dict(read) for g in group(kept)],
        "filtered": [{"reason": r, "count": n} for r, n in reasons.items()],
        "filtered_groups": [
            g.to_dict(read) | {"reason": _reason_of(g, filtered)} for g in group(filtered)
        ],
        "sanitizer_seconds": sanitizer_seconds,
        "plain_seconds": plain_seconds,
        "slowdown": slowdown,
        "shrink": shrink_result.to_dict() if shrink_result else None,
        "tma_filter": tma_filter,
        "kernel_names": list(kernel_names),
        "other_kernels": other_kernels(others, tool, read),
    }
    return json.loads(json.dumps(result))  # plain lists/dicts: equal to its stored JSON


def _reason_of(g: Group, filtered: Sequence[Finding]) -> str | None:
    for f in filtered:
        if (f.tool, f.kind, f.lines) == (g.tool, g.kind, g.lines):
            return f.noise_reason
    return None


# ---- shrinking ---------------------------------------------------------------------------
Signature = tuple[str, tuple[tuple[str | None, int | None], ...]]


@dataclass
class ShrinkResult:
    original: dict[str, Any]
    shrunk: dict[str, Any]
    signature: Signature
    original_seconds: float | None
    shrunk_seconds: float | None
    runs: list[dict[str, Any]] = field(default_factory=list)  # every candidate, once

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def shrink(
    params: Mapping[str, Any],
    shrinkable: Sequence[str],
    run: Callable[[dict[str, Any]], Sequence[Finding]],
    *,
    target: Signature | None = None,
    minimum: int = 1,
    max_runs: int = 48,
    clock: Callable[[], float] = time.monotonic,
    original: tuple[Sequence[Finding], float | None] | None = None,
) -> ShrinkResult:
    """Smallest ``shrinkable`` int params for which ``run`` still shows the same finding.

    "Same" = same kind and source lines (``Finding.signature``); ``target`` defaults to the
    first group of the original run's kept findings. Each parameter is shrunk in turn by an
    exponential probe downward (v/2, v/4, ...) and a binary search between the last value
    that reproduced and the first that did not, repeated until nothing shrinks. A candidate
    is never run twice (memoized); a run that raises counts as "does not reproduce".
    ``original`` = (findings, seconds) of a run of ``params`` already made: it is not rerun.
    """
    memo: dict[tuple, bool] = {}
    runs: list[dict[str, Any]] = []
    seconds: dict[tuple, float] = {}

    def key(p: Mapping[str, Any]) -> tuple:
        return tuple(sorted(p.items()))

    def attempt(p: dict[str, Any]) -> bool:
        k = key(p)
        if k in memo:
            return memo[k]
        if len(runs) >= max_runs:
            return False
        error = None
        if original is not None and k == key(params):
            found, dt = list(original[0]), original[1] or 0.0
        else:
            t0 = clock()
            # A broken candidate (e.g. a size the kernel rejects) does not reproduce.
            try:
                found = list(run(dict(p)))
            except Exception as exc:  # noqa: BLE001
                found, error = [], f"{type(exc).__name__}: {exc}"
            dt = clock() - t0
        kept, _ = filter_noise(found)
        nonlocal target
        if target is None:
            groups = group(kept)
            target = (groups[0].kind, groups[0].lines) if groups else None
            ok = target is not None
        else:
            ok = any(f.signature == target for f in kept)
        memo[k], seconds[k] = ok, dt
        runs.append(
            {
                "params": dict(p),
                "reproduced": ok,
                "seconds": dt,
                **({"error": error} if error else {}),
            }
        )
        return ok

    current = dict(params)
    if not attempt(current):
        raise ValueError("the original parameters do not reproduce the finding to shrink")
    assert target is not None
    changed = True
    while changed and len(runs) < max_runs:
        changed = False
        for name in shrinkable:
            value = current.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= minimum:
                continue
            if memo.get(key({**current, name: value - 1})) is False:
                continue  # already minimal for the other params as they stand
            best = _shrink_one(current, name, value, minimum, attempt)
            if best < value:
                current[name] = best
                changed = True
    return ShrinkResult(
        original=dict(params),
        shrunk=current,
        signature=target,
        original_seconds=seconds.get(key(params)),
        shrunk_seconds=seconds.get(key(current)),
        runs=runs,
    )


def _shrink_one(
    current: dict[str, Any],
    name: str,
    value: int,
    minimum: int,
    attempt: Callable[[dict[str, Any]], bool],
) -> int:
    def ok(v: int) -> bool:
        return attempt({**current, name: v})

    good = value
    bad = None
    probe = max(minimum, value // 2)
    while probe < good:  # exponential probe: halve until it stops reproducing
        if ok(probe):
            good = probe
            probe = max(minimum, probe // 2)
        else:
            bad = probe
            break
    if bad is None:
        return good
    while good - bad > 1:  # binary search in (bad, good]
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


# ---- command line (used by tools/capture_sanitizer_samples.sh and for quick looks) --------
def _main(argv: Sequence[str]) -> int:
    """Usage: python -m cutedebug.analyses.sanitizer
    command TOOL XML|- [--api-errors] -- ARGV...   the sanitizer argv, one per line
                                                  (XML "-": text report only)
    env TOOL                                      child_env(TOOL) as KEY=VALUE lines
    json TOOL XML [STDOUT_FILE]                   the triage result as JSON (its Markdown:
                                                  cutedebug.reporting.sanitize.render_markdown)
    """
    if len(argv) >= 3 and argv[0] == "command":
        tool, xml = argv[1], argv[2]
        rest = list(argv[3:])
        api = "--api-errors" in rest[: rest.index("--")] if "--" in rest else False
        worker = rest[rest.index("--") + 1 :] if "--" in rest else rest
        sanitizer = find_sanitizer() or "compute-sanitizer"
        cmd = build_command(tool, worker, xml, sanitizer=sanitizer, report_api_errors=api)
        if xml == "-":
            i = cmd.index("--xml")
            del cmd[i : i + 3]
        print("\n".join(cmd))
        return 0
    if len(argv) == 2 and argv[0] == "env":
        print("\n".join(f"{k}={v}" for k, v in child_env(argv[1]).items()))
        return 0
    if len(argv) >= 3 and argv[0] == "json":
        tool, xml = argv[1], argv[2]
        stdout = Path(argv[3]).read_text(errors="replace") if len(argv) > 3 else ""
        result = make_result(tool, [], analyze(tool, xml, stdout), xml_path=xml)
        print(json.dumps(result, indent=2, default=str))
        return 0
    print(_main.__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
