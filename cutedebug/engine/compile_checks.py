"""Checks of the recorded protocol that a worker runs after compiling, handed in by its caller.

The worker records the kernel's barrier protocol while it compiles (instrument/recorder.py);
what checks that protocol is an analysis (``cutedebug.analyses.lint.static_findings``), and the
engine does not import analyses. So the caller hands the checks in::

    runner.run_scenario(sc, compile_checks=[lint.static_findings])

and the request carries each as a reference, ``"module:qualname"`` (the way pickle names a
function), which the worker resolves in its own process (fork-server workers included). A
check takes the ``Protocol`` and returns findings as JSON dicts (severity, check, pipeline,
message, arithmetic, file, line). The compiled event's ``static_findings`` is their
concatenation, or None when no check was handed in: nothing was checked, which a report must
not read as "no findings". A check that cannot be resolved or that raises leaves one error
finding (check ``harness_error``), never a clean list.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from cutedebug.instrument.protocol import Protocol

CompileCheck = Callable[[Protocol], list[dict[str, Any]]]

HARNESS_CHECK = "harness_error"  # the finding a check that could not run leaves


def reference(check: CompileCheck) -> str:
    """``"module:qualname"`` of a module-level function; ValueError for anything the worker
    could not import back (a lambda, a nested function, a bound method)."""
    module, qualname = getattr(check, "__module__", None), getattr(check, "__qualname__", "")
    if not module or "<" in qualname:
        raise ValueError(f"a compile check must be a module-level function, not {check!r}")
    ref = f"{module}:{qualname}"
    if resolve(ref) is not check:
        raise ValueError(f"compile check {check!r} is not importable as {ref}")
    return ref


def references(checks: Iterable[CompileCheck]) -> list[str]:
    return [reference(c) for c in checks]


def resolve(ref: str) -> CompileCheck:
    module, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def harness_finding(what: str, e: BaseException) -> dict[str, Any]:
    """The error finding ``what`` leaves when it raised ``e``: visible, never "clean"."""
    tb = traceback.extract_tb(e.__traceback__)
    at = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return {
        "severity": "error",
        "check": HARNESS_CHECK,
        "pipeline": None,
        "message": f"HARNESS_ERROR: {what} crashed ({type(e).__name__}: {str(e)[:300]}"
        f"{at}); nothing was checked",
        "arithmetic": "",
        "file": None,
        "line": None,
    }


def run(refs: Sequence[str] | None, protocol: Protocol) -> list[dict[str, Any]] | None:
    """Every referenced check over ``protocol``, findings in order; None when there is none."""
    if not refs:
        return None
    found: list[dict[str, Any]] = []
    for ref in refs:
        try:
            found += resolve(ref)(protocol)
        except Exception as e:  # a bug of ours: a visible finding, the run goes on
            found.append(harness_finding(f"the compile check {ref}", e))
    return found
