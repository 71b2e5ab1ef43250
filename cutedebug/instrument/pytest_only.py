"""A pytest plugin that runs one test item of the command and deselects the rest: how
`cutedebug mutate` runs a mutant of a kernel only in the test that traced it.

Loaded in the mutant's interpreters through ``PYTEST_PLUGINS`` (pytest-xdist's workers inherit
it and deselect alike); the item's node id is in ``CUTEDEBUG_ONLY_TEST``. When no collected item
has that id (the command's collection changed since the clean run), nothing is deselected and
the run says so: the mutant then runs against the whole command, as without the plugin.
"""

from __future__ import annotations

import os
import sys

ONLY_TEST_ENV = "CUTEDEBUG_ONLY_TEST"
ONLY_TEST_PLUGIN = "cutedebug.instrument.pytest_only"


def pytest_collection_modifyitems(config, items) -> None:
    wanted = os.environ.get(ONLY_TEST_ENV)
    if not wanted:
        return
    keep = [i for i in items if i.nodeid == wanted]
    if not keep:
        say = f"cutedebug: {ONLY_TEST_ENV}={wanted!r} matches none of the {len(items)} " + (
            "collected test(s): all of them run"
        )
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(say)
        else:
            print(say, file=sys.stderr)
        return
    drop = [i for i in items if i.nodeid != wanted]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
