"""Errors shared by the command front ends (no imports: any layer may raise them)."""

from __future__ import annotations


class UsageError(Exception):
    """Bad command-line input: the message names the option, the value and what is allowed;
    the command prints it and exits with status 2."""
