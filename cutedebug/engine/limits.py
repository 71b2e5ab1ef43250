"""Every limit, wherever it comes from (a scenario's [limits], a command-line flag, a pytest
option, an environment variable, an ini key), is checked here: finite, positive, within its
bounds. An unbounded or NaN limit would switch the watchdog off; zero would kill every run at
once; a negative budget would be a harness error later instead of a clear message now.
"""

from __future__ import annotations

import math
from typing import Any


class LimitError(ValueError):
    """A limit value that cannot be used (the message names it, the value and the range)."""


# name -> (type, lowest, highest) of every limit
LIMIT_RANGES: dict[str, tuple[type, float, float]] = {
    "compile_s": (float, 1, 3600),
    "deadline_s": (float, 0.1, 3600),
    "stall_s": (float, 0.05, 600),
    "wait_budget_ms": (int, 1, 600_000),
    "import_s": (float, 1, 3600),
    "check_s": (float, 1, 3600),
    "repeat": (int, 1, 1000),
    "jobs": (int, 1, 256),
    "timeout_margin": (float, 1, 3600),
    # the other commands' limits
    "command_deadline_s": (float, 0.1, 86400),  # exec / mutate: the whole command
    "window_s": (float, 0.05, 600),  # bisect: seconds before a checkpoint run counts as hung
    "deadline_scale": (float, 1, 100),  # sanitize: deadlines under the sanitizer
    "shrink_max_runs": (int, 1, 1000),
    "print_limit": (int, 1, 1_000_000),
    "racecheck_deadlock_timeout": (int, 1, 3600),
    "referee": (int, 0, 4096),  # sanitize: perturbed runs of a caveated RACE (0: none)
    "min_score": (float, 0, 1),  # mutate: a fraction, 0 allowed
}


def check_limit(name: str, value: Any, where: str = "", label: str | None = None) -> float | int:
    """``value`` (a number or its text) as limit ``name``, or LimitError saying why not
    (``where``: the file or option it came from; ``label``: the name to show, e.g. the field)."""
    kind, lo, hi = LIMIT_RANGES[name]
    prefix = f"{where}: " if where else ""
    bad = (
        f"{prefix}{label or name} = {value!r}: expected a finite {'whole ' if kind is int else ''}"
        f"number within [{lo:g}, {hi:g}]"
    )
    if isinstance(value, bool):
        raise LimitError(bad)
    try:
        num = float(value.strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError, OverflowError):
        raise LimitError(bad) from None
    if not math.isfinite(num) or not lo <= num <= hi or (kind is int and num != int(num)):
        raise LimitError(bad)
    return int(num) if kind is int else num


def limit_arg(name: str):
    """An argparse ``type`` for limit ``name``: the same check, reported by argparse (exit 2)."""
    import argparse

    def convert(text: str) -> float | int:
        try:
            return check_limit(name, text)
        except LimitError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = name
    return convert
