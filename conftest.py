"""Root conftest: `pytest scenarios` from a source checkout.

Installed, cutedebug's pytest plugin comes in through its pytest11 entry point; from a plain
checkout (nothing installed, or the entry point hidden with ``-p no:cutedebug``) it is
registered here instead, never twice.
"""

import sys

if "cutedebug.pytest_plugin" not in sys.modules:
    pytest_plugins = ["cutedebug.pytest_plugin"]
