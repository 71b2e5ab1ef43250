"""Exit codes of every `cutedebug` command, in one place (the README and `--help` list them).

When results are mixed, the most serious wins: harness error > unexpected verdict > could not
run here > as expected.
"""

from __future__ import annotations

EXIT_OK = 0  # every verdict (and localization) as expected
EXIT_UNEXPECTED = 1  # some verdict or localization was not the expected one
EXIT_USAGE = 2  # bad input: a scenario, an option, a path that cannot be read/written
EXIT_HARNESS = 3  # a harness error: a bug of ours, a dead fork server, a process left
EXIT_NOT_RUN = 4  # could not run here (no GPU, another arch); nothing else went wrong
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + the signal number for SIGTERM / SIGHUP)
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of the output went away (`| head`)

HELP = """exit codes:
  0  every verdict (and localization) as expected
  1  some verdict or localization not as expected
  2  bad input: scenario file, option value, unreadable or unwritable path
  3  harness error: a bug of cutedebug's, a dead fork server, a process left behind
  4  could not run here (no GPU, or another GPU arch); everything else as expected
  130 interrupted (Ctrl-C); 143 / 129 terminated by SIGTERM / SIGHUP
  141 the reader of the output went away (`cutedebug ... | head`)"""

_RANK = {EXIT_OK: 0, EXIT_NOT_RUN: 1, EXIT_UNEXPECTED: 2, EXIT_HARNESS: 3}


def worst(*codes: int) -> int:
    """The most serious of several exit codes (usage and interrupts are returned directly)."""
    return max(codes, key=lambda c: _RANK.get(c, 4), default=EXIT_OK)
