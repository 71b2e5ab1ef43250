"""Command-line values shared by `cutedebug run`, `lint` and friends: NAME=VALUE pairs and
fault specs (``name`` or ``name:arg=v,arg2=w``). Values use TOML scalar syntax (1, 2.5, true,
"s"), else the bare string; a malformed pair is a UsageError (exit status 2)."""

from __future__ import annotations

from typing import Any

from cutedebug.engine.scenario import parse_value
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
