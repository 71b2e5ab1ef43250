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
        return self.replace_many_everywhere([(original, replacement)])

    def replace_many_everywhere(self, pairs: list[tuple[Any, Any]]) -> int:
        """:meth:`replace_everywhere` for several originals in one pass over the modules'
        globals (a process with torch loaded has a thousand modules: a pass per original
        cost ~0.4 s of every instrumented compile). Each original appears once."""
        by_id = {id(original): replacement for original, replacement in pairs}
        if len(by_id) != len(pairs):
            raise ValueError("replace_many_everywhere: an original appears twice")
        n = 0
        for module, attr, value in _holding(by_id.keys()):
            self.set_attr(module, attr, by_id[id(value)])
            n += 1
        self._swaps.extend((replacement, original) for original, replacement in pairs)
        return n

    def restore(self) -> None:
        while self._undo:
            owner, attr, had, old = self._undo.pop()
            if had:
                setattr(owner, attr, old)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(owner, attr)
        # A module imported inside the context may have bound a replacement by name: one pass
        # puts every original back (a replacement of a replacement: back to the first one).
        originals = {id(replacement): original for replacement, original in self._swaps}
        # (the replacements were made after any freeze: a frozen module holds one only where
        # set_attr put it, undone above)
        for module, attr, value in _holding(originals.keys(), made_since_freeze=True):
            while id(value) in originals:
                value = originals[id(value)]
            setattr(module, attr, value)
        self._swaps.clear()


# A fork server's modules, frozen before it forks (``freeze``): a forked worker skips, in its
# scans, every module that held none of the hooked functions then. Scanning every global of the
# ~1500 modules torch and cutlass load costs a worker ~0.1 s per compile (measured on the
# 2-core CPU machine), most of it in copy-on-write faults of the pages it touches.
_skip: dict[str, Any] = {}  # module name -> the module object frozen (skipped while it is that)
_frozen_ids: frozenset[int] = frozenset()  # ids of the functions the freeze looked for
_frozen_objs: list[Any] = []  # and the functions themselves: their ids stay theirs


def freeze(originals: list[Any]) -> int:
    """In a fork server, after its imports and before it forks: remember the modules that
    hold none of ``originals`` (the functions the layer rebinds everywhere); returns how many.
    A module imported later, or replaced in sys.modules, is scanned as before."""
    global _skip, _frozen_ids, _frozen_objs
    ids = frozenset(id(o) for o in originals)
    holders = {id(m) for m, _, _ in _holding(ids, use_freeze=False)}
    _skip = {n: m for n, m in list(sys.modules.items()) if m is not None and id(m) not in holders}
    _frozen_ids, _frozen_objs = ids, list(originals)
    return len(_skip)


def thaw() -> None:
    global _skip, _frozen_ids, _frozen_objs
    _skip, _frozen_ids, _frozen_objs = {}, frozenset(), []


def _holding(
    ids: Any, *, made_since_freeze: bool = False, use_freeze: bool = True
) -> list[tuple[Any, str, Any]]:
    """(module, name, value) of every module global whose value's id is in ``ids``. After a
    ``freeze``, the frozen modules that held none of its functions are skipped when ``ids``
    are among those functions or objects ``made_since_freeze``."""
    found: list[tuple[Any, str, Any]] = []
    if not ids:
        return found
    skip = _skip if use_freeze and (made_since_freeze or _frozen_ids.issuperset(ids)) else {}
    for name, module in list(sys.modules.items()):
        if skip and skip.get(name) is module:
            continue
        try:
            items = list(vars(module).items())
        except TypeError:
            continue
        found += [(module, attr, value) for attr, value in items if id(value) in ids]
    return found
