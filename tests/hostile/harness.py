"""A harness process for the adversarial tests to SIGKILL / SIGINT / SIGTERM.

usage: python harness.py MODE WORKDIR

Prints one JSON line {"ready": ...} once its child is running, then waits on it:
- watch: watchdog.watch on tests/helpers/fake_worker.py hostile_tree (deadline 600 s)
- lint: commands.lint.lint_scenario on scenarios/minimal/clean.toml (its temp dir is named)
"""

import json
import sys
import threading
import time
from pathlib import Path

from cutedebug.engine import watchdog
from cutedebug.engine.scenario import Limits

mode, work = sys.argv[1], Path(sys.argv[2])
HERE = Path(__file__).resolve().parent
LONG = Limits(compile_s=600, deadline_s=600, import_s=600, check_s=600)


def announce(**facts):
    print(json.dumps({"ready": True, **facts}), flush=True)


if mode == "watch":
    events, pidfile = work / "events.jsonl", work / "pids"
    events.write_text("")
    argv = [
        sys.executable,
        str(HERE.parent / "helpers" / "fake_worker.py"),
        str(events),
        "hostile_tree",
        str(pidfile),
    ]

    def report():
        while not (pidfile.exists() and pidfile.read_text().strip()):
            time.sleep(0.02)
        announce(pids=[int(p) for p in pidfile.read_text().split()])

    threading.Thread(target=report, daemon=True).start()
    try:
        watchdog.watch(argv, events, work / "log", LONG)
    except KeyboardInterrupt:
        print(json.dumps({"interrupted": time.monotonic()}), flush=True)
        sys.exit(130)
elif mode == "lint":
    import tempfile

    from cutedebug.commands import lint
    from cutedebug.engine import scenario as S

    before = set(Path(tempfile.gettempdir()).glob("cutedebug-lint-*"))

    def report():
        while True:
            new = set(Path(tempfile.gettempdir()).glob("cutedebug-lint-*")) - before
            if new:
                announce(tmp=[str(p) for p in new])
                return
            time.sleep(0.02)

    threading.Thread(target=report, daemon=True).start()
    sc = S.load(HERE.parents[1] / "scenarios" / "minimal" / "clean.toml")
    lint.lint_scenario(sc)
