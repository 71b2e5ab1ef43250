"""compute-sanitizer around the worker: command, environment, parsing, triage, shrinking.

The runner wraps the same worker command (``python -m cutedebug.engine.worker request.json``) in
``compute-sanitizer --tool T --xml --save F ...`` under its watchdog. The package builds that
command and environment, turns the XML file (and the plain-text stdout, as fallback and as a
cross-check) into one record type, ``Finding``, filters known noise with the reason kept,
groups duplicates, sets other kernels' findings apart, classifies the run, builds the triage
record (``cutedebug.reporting.sanitize`` renders it), and shrinks the problem size while the
same finding persists. One module per step:

- ``tool``: finding compute-sanitizer, ``build_command``, ``child_env``;
- ``findings``: ``Finding``/``Site``, the finding kinds, ``source_line``;
- ``parse``: XML, plain text, the summary line, their cross-check (the formats, as captured on
  an H200, are in its docstring), ``analyze`` = all of it for one run;
- ``triage``: noise filter, grouping, the run classes and ``classify``;
- ``attribution``: which kernel of the process a finding belongs to;
- ``result``: ``ToolResult``, one tool's run in sanitize.json, and ``make_result``;
- ``shrink``: the smallest problem size that still shows the same finding;
- ``__main__``: ``python -m cutedebug.analyses.sanitizer`` (the capture script uses it).

It never imports torch or cutlass: the parent process imports it. The names below are the
package's public API (``from cutedebug.analyses import sanitizer as san``; ``san.analyze``).
"""

from __future__ import annotations

from cutedebug.analyses.sanitizer.attribution import (
    OtherKernel,
    attribute,
    is_launched_kernel,
    other_kernels,
)
from cutedebug.analyses.sanitizer.findings import (
    API_ERROR,
    BARRIER_MISUSE,
    HARDWARE_EXCEPTION,
    HAZARD_KINDS,
    LEAK,
    MISALIGNED,
    PARSE_FAILURE,
    RACE,
    RAW_HAZARD,
    TOOL_ERROR,
    UNINIT_READ,
    UNKNOWN,
    WAR_HAZARD,
    WAW_HAZARD,
    Finding,
    Site,
    Triple,
    source_line,
)
from cutedebug.analyses.sanitizer.parse import (
    _kind_from_text,
    analyze,
    crosscheck,
    parse_summary,
    parse_text,
    parse_xml,
)
from cutedebug.analyses.sanitizer.result import (
    KernelSeconds,
    NoiseCount,
    PlainRun,
    SanitizeSummary,
    ToolResult,
    make_result,
)
from cutedebug.analyses.sanitizer.shrink import ShrinkResult, Signature, shrink
from cutedebug.analyses.sanitizer.tool import (
    DEFAULT_PRINT_LIMIT,
    ERROR_EXITCODE,
    TOOLS,
    build_command,
    child_env,
    find_sanitizer,
)
from cutedebug.analyses.sanitizer.triage import (
    CLASSES,
    CLEAN,
    NOISE_ANALYSIS_DUP,
    NOISE_PROC_ADDRESS,
    NOISE_TMA,
    TOOL_CLASS,
    Group,
    classify,
    filter_noise,
    group,
    kind_class,
)

__all__ = [
    "API_ERROR",
    "BARRIER_MISUSE",
    "CLASSES",
    "CLEAN",
    "DEFAULT_PRINT_LIMIT",
    "ERROR_EXITCODE",
    "HARDWARE_EXCEPTION",
    "HAZARD_KINDS",
    "LEAK",
    "MISALIGNED",
    "NOISE_ANALYSIS_DUP",
    "NOISE_PROC_ADDRESS",
    "NOISE_TMA",
    "PARSE_FAILURE",
    "RACE",
    "RAW_HAZARD",
    "TOOLS",
    "TOOL_CLASS",
    "TOOL_ERROR",
    "UNINIT_READ",
    "UNKNOWN",
    "WAR_HAZARD",
    "WAW_HAZARD",
    "Finding",
    "Group",
    "ShrinkResult",
    "Signature",
    "Site",
    "Triple",
    "_kind_from_text",
    "analyze",
    "attribute",
    "build_command",
    "child_env",
    "classify",
    "crosscheck",
    "filter_noise",
    "find_sanitizer",
    "group",
    "is_launched_kernel",
    "kind_class",
    "make_result",
    "KernelSeconds",
    "NoiseCount",
    "OtherKernel",
    "PlainRun",
    "SanitizeSummary",
    "ToolResult",
    "other_kernels",
    "parse_summary",
    "parse_text",
    "parse_xml",
    "shrink",
    "source_line",
]
