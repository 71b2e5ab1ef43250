"""Root conftest: `pytest scenarios` from a source checkout, and which scenarios are `slow`.

Installed, cutedebug's pytest plugin comes in through its pytest11 entry point; from a plain
checkout (nothing installed, or the entry point hidden with ``-p no:cutedebug``) it is
registered here instead, never twice.
"""

import sys
from pathlib import Path

import pytest

if "cutedebug.pytest_plugin" not in sys.modules:
    pytest_plugins = ["cutedebug.pytest_plugin"]

# The developer's loop (`pytest -n 2 --dist loadfile -m "not slow"`, the README's test command)
# compiles, of these families, only the scenarios without a fault (the clean ones): their fault
# scenarios cost seconds of CPU each (a probed compile of a GEMM, attention or field-library
# kernel in a forked worker). Their faults are exercised elsewhere: test_sm90_gemm.py and
# test_sm100_gemm.py compile each fault of their scenarios on the GEMM and check the PTX it
# changes (in the loop; sm90's 2-CTA cluster twins slow), test_sm90_attention.py each on the
# attention kernel (slow),
# test_field.py traces three faults onto each field adapter's library lines (in the loop).
# CI (.ci/run) runs the slow part too (`-m slow`), so every scenario still compiles there.
SLOW_FAULT_FAMILIES = ("field", "sm100_gemm", "sm90_attention", "sm90_gemm")
_SCENARIOS = Path(__file__).resolve().parent / "scenarios"


def slow_scenario(path: Path, fault: str | None, expected: str) -> bool:
    """A scenario of SLOW_FAULT_FAMILIES with a fault whose verdict no compile decides."""
    try:
        family = Path(path).resolve().relative_to(_SCENARIOS).parts[0]
    except ValueError:  # not one of this checkout's scenarios
        return False
    from cutedebug.commands.pytest_items import COMPILE_VERDICTS

    return family in SLOW_FAULT_FAMILIES and fault is not None and expected not in COMPILE_VERDICTS


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects (the mark plugin's hook)
def pytest_collection_modifyitems(config, items):
    for item in items:
        sc = getattr(item, "scenario", None)
        if sc is not None and slow_scenario(item.path, sc.fault, sc.expect.verdict):
            item.add_marker(pytest.mark.slow)
