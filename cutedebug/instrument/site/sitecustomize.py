"""cutedebug exec: instrumentation in every Python process of the watched command.

This folder is put first on the command's PYTHONPATH by ``cutedebug exec`` / ``mutate``
(cutedebug/instrument/launch.py says what happens here). A sitecustomize that this one shadows
(a later entry of sys.path) still runs, after ours.
"""

import os
import sys


def _cutedebug_activate():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))  # holds cutedebug/
    # The cutedebug next to this file, not another install: imported with its root first on
    # sys.path, which is then taken off again (the program's own packages keep precedence).
    sys.path.insert(0, root)
    try:
        from cutedebug.instrument import launch

        launch.activate()
    except Exception as e:  # the parent finds no 'instrumented' event: a harness error
        sys.stderr.write(
            f"cutedebug: instrumentation failed to activate in pid {os.getpid()}: "
            f"{type(e).__name__}: {e}\n"
        )
    finally:
        if sys.path and sys.path[0] == root:
            del sys.path[0]


def _chain():
    """Run the sitecustomize this one shadows, if there is one further down sys.path."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if os.environ.get("CUTEDEBUG_EXEC"):
    _cutedebug_activate()
_chain()
