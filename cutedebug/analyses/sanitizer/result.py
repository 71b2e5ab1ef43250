"""The JSON-able triage record of one tool's run (``cutedebug.reporting.sanitize`` renders it)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cutedebug.analyses.sanitizer.attribution import attribute, other_kernels
from cutedebug.analyses.sanitizer.findings import Finding, source_line
from cutedebug.analyses.sanitizer.shrink import ShrinkResult
from cutedebug.analyses.sanitizer.triage import Group, classify, filter_noise, group


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
        "groups": [g.record(read).to_json() for g in group(kept)],
        "filtered": [{"reason": r, "count": n} for r, n in reasons.items()],
        "filtered_groups": [
            g.record(read, reason=_reason_of(g, filtered)).to_json() for g in group(filtered)
        ],
        "sanitizer_seconds": sanitizer_seconds,
        "plain_seconds": plain_seconds,
        "slowdown": slowdown,
        "shrink": shrink_result.to_json() if shrink_result else None,
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
