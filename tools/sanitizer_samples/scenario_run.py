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

import sys
import tempfile
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    from cutedebug.engine import runner, scenario, worker

    sc = scenario.load(argv[0])
    with tempfile.TemporaryDirectory(prefix="cutedebug-sample-") as tmp:
        request, events, _ = runner.write_request(Path(tmp), sc, lineinfo=True)
        rc = worker.main([str(request)])
        print(events.read_text(), end="")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
