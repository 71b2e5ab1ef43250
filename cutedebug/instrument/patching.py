"""Replacing DSL attributes and putting every one of them back (the layer's only patcher)."""

from __future__ import annotations

import contextlib
import sys
from typing import Any


class Patcher:
    """Replaces attributes and remembers how to put every one of them back."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, bool, Any]] = []
        self._swaps: list[tuple[Any, Any]] = []
        self.patched: list[str] = []  # "owner.attr" replaced, for messages

    def set_attr(self, owner: Any, attr: str, value: Any) -> None:
        had = attr in vars(owner)
        self._undo.append((owner, attr, had, vars(owner).get(attr)))
        setattr(owner, attr, value)
        self.patched.append(f"{getattr(owner, '__name__', owner)}.{attr}")

    def replace_everywhere(self, original: Any, replacement: Any) -> int:
        """Rebind every module global that holds ``original`` (names imported with `from`)."""
        n = 0
        for module in list(sys.modules.values()):
            for attr, value in _module_items(module):
                if value is original:
                    self.set_attr(module, attr, replacement)
                    n += 1
        self._swaps.append((replacement, original))
        return n

    def restore(self) -> None:
        while self._undo:
            owner, attr, had, old = self._undo.pop()
            if had:
                setattr(owner, attr, old)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(owner, attr)
        # A module imported inside the context may have bound a replacement by name.
        for replacement, original in reversed(self._swaps):
            for module in list(sys.modules.values()):
                for attr, value in _module_items(module):
                    if value is replacement:
                        setattr(module, attr, original)
        self._swaps.clear()


def _module_items(module: Any) -> list[tuple[str, Any]]:
    try:
        return list(vars(module).items())
    except TypeError:
        return []
