"""``python -m cutedebug.analyses.sanitizer``: used by tools/capture_sanitizer_samples.sh and for
quick looks."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from cutedebug.analyses.sanitizer.parse import analyze
from cutedebug.analyses.sanitizer.result import make_result
from cutedebug.analyses.sanitizer.tool import build_command, child_env, find_sanitizer


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
        print(json.dumps(result.to_json(), indent=2, default=str))
        return 0
    print(_main.__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
