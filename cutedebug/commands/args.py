"""Command-line values shared by `cutedebug run`, `lint` and friends: NAME=VALUE pairs, fault
specs (``name`` or ``name:arg=v,arg2=w``) and the ad-hoc scenario of a ``FILE.py:Class``
target. Values use TOML scalar syntax (1, 2.5, true, "s"), else the bare string; a malformed
pair is a UsageError (exit status 2)."""

from __future__ import annotations

import argparse
from typing import Any

from cutedebug.engine.scenario import Scenario, adhoc, parse_value
from cutedebug.errors import UsageError


def parse_kv(items: list[str], what: str) -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}``; ``what`` names the option in errors."""
    out = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"{what} {item!r}: expected NAME=VALUE")
        k, v = item.split("=", 1)
        out[k.strip()] = parse_value(v.strip())
    return out


def parse_fault(text: str | None) -> tuple[str | None, dict[str, Any]]:
    """`name` or `name:arg=v,arg2=w` -> (name, args); (None, {}) for no fault."""
    if not text:
        return None, {}
    name, _, rest = text.partition(":")
    args = parse_kv([a for a in rest.split(",") if a], "--fault argument") if rest else {}
    return name, args


DEFAULT_ARCHS = ("sm_90a",)


def adhoc_scenario(target: str, args: argparse.Namespace, expect: str = "PASS") -> Scenario:
    """The scenario of a ``FILE.py:Class`` target from ``--param`` / ``--fault`` / ``--arch``
    (``DEFAULT_ARCHS`` without ``--arch``)."""
    fault, fault_args = parse_fault(args.fault)
    archs = tuple(args.arch) if args.arch else DEFAULT_ARCHS
    return adhoc(target, parse_kv(args.param, "--param"), fault, fault_args, expect, archs)
