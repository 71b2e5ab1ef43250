"""compute-sanitizer's output → ``Finding``s: the XML file, the plain-text report (fallback and
cross-check), the closing summary line.

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

import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from cutedebug.analyses.sanitizer.findings import (
    API_ERROR,
    BARRIER_MISUSE,
    HARDWARE_EXCEPTION,
    HAZARD_KINDS,
    LEAK,
    MISALIGNED,
    PARSE_FAILURE,
    RACE,
    TOOL_ERROR,
    UNINIT_READ,
    UNKNOWN,
    Finding,
    Site,
    Triple,
    parse_failure,
)
from cutedebug.analyses.sanitizer.tool import DEFAULT_PRINT_LIMIT

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
        return [parse_failure(tool, f"sanitizer XML {where} could not be read")]
    if not text.strip():
        return [parse_failure(tool, f"sanitizer XML {where} is empty (the tool did not finish?)")]
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
        return [parse_failure(tool, note)] + salvaged
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
        parse_failure(
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
        else [parse_failure(tool, "no sanitizer XML file was produced")]
    )
    xml_failed = any(f.kind == PARSE_FAILURE for f in findings)
    if xml_failed and stdout_text:
        from_text = parse_text(stdout_text, tool)
        if from_text:
            # Keep the XML failure visible but let the text records decide the verdict.
            notes = [replace(f, severity="info") for f in findings if f.kind == PARSE_FAILURE]
            return from_text + notes + crosscheck(from_text, stdout_text, tool, print_limit)
    return findings + crosscheck(findings, stdout_text, tool, print_limit)
