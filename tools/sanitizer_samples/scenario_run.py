"""Sample program: one scenario's worker in this process, as `cutedebug sanitize` runs it.

The scenario's fault is injected at trace time exactly as in a cutedebug run (probes off,
line info on), so compute-sanitizer sees the same kernel `cutedebug sanitize` wraps, in a
single process. Used for the synccheck captures (tma_stream's missing_init_fence and
extra_consumer_release faults are real synccheck errors; no small standalone program gave one).

Run from the repository root with PYTHONPATH=.:

    python tools/sanitizer_samples/scenario_run.py scenarios/tma_stream/missing_init_fence.toml

Prints the worker's events (JSON lines) and exits with the worker's status.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    from cutedebug import scenario, worker

    sc = scenario.load(argv[0])
    with tempfile.TemporaryDirectory(prefix="cutedebug-sample-") as tmp:
        events = Path(tmp) / "events.jsonl"
        request = Path(tmp) / "request.json"
        request.write_text(json.dumps({"scenario": sc.to_json(), "mode": "run",
                                       "events": str(events), "probes": None,
                                       "lineinfo": True, "dump_dir": tmp}))
        rc = worker.main([str(request)])
        print(events.read_text() if events.exists() else "(no events)", end="")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
