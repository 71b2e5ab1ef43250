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
package's public API, what a caller needs to run one tool and read what it said
(``from cutedebug.analyses import sanitizer as san``; ``san.analyze``); everything else is
imported from its step module (``from cutedebug.analyses.sanitizer.triage import classify``).
"""

from __future__ import annotations

from cutedebug.analyses.sanitizer.findings import Finding
from cutedebug.analyses.sanitizer.parse import analyze
from cutedebug.analyses.sanitizer.result import SanitizeSummary, ToolResult, make_result
from cutedebug.analyses.sanitizer.tool import TOOLS, build_command, child_env, find_sanitizer

__all__ = [
    "TOOLS",
    "Finding",
    "SanitizeSummary",
    "ToolResult",
    "analyze",
    "build_command",
    "child_env",
    "find_sanitizer",
    "make_result",
]
