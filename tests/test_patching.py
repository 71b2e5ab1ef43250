"""The layer's patcher (instrument/patching.py): names rebound in every module in one pass,
and every one of them put back, in modules imported meanwhile too."""

import sys
import types

import pytest
from helpers.program_json import program_json

from cutedebug.instrument.patching import Patcher


def _module(name: str, **names) -> types.ModuleType:
    m = types.ModuleType(name)
    vars(m).update(names)
    sys.modules[name] = m
    return m


@pytest.fixture
def mods():
    def f():
        return "f"

    def g():
        return "g"

    made = [_module(f"_patch_test_{i}", f=f, g=g, other=len) for i in range(3)]
    yield f, g, made
    for m in made:
        sys.modules.pop(m.__name__, None)
    sys.modules.pop("_patch_test_late", None)


def test_many_originals_rebound_in_one_pass_and_put_back(mods):
    f, g, made = mods
    f2, g2 = (lambda: "f2"), (lambda: "g2")
    p = Patcher()
    assert p.replace_many_everywhere([(f, f2), (g, g2)]) == 2 * len(made)
    assert all(m.f is f2 and m.g is g2 and m.other is len for m in made)
    late = _module("_patch_test_late", f=f2, g=g2)  # imported inside: bound the replacements
    p.restore()
    assert all(m.f is f and m.g is g for m in [*made, late])


def test_a_replacement_of_a_replacement_goes_back_to_the_first(mods):
    f, _, made = mods
    f2, f3 = (lambda: "f2"), (lambda: "f3")
    p = Patcher()
    p.replace_everywhere(f, f2)
    late = _module("_patch_test_late", f=f2)
    p.replace_everywhere(f2, f3)
    assert all(m.f is f3 for m in [*made, late])
    p.restore()
    assert all(m.f is f for m in [*made, late])


def test_an_original_given_twice_is_refused(mods):
    f, _, made = mods
    with pytest.raises(ValueError, match="appears twice"):
        Patcher().replace_many_everywhere([(f, len), (f, abs)])
    assert all(m.f is f for m in made)


def test_a_fork_servers_freeze_skips_only_modules_that_held_no_hooked_function(mods):
    from cutedebug.instrument import patching

    f, g, made = mods
    bystander = _module("_patch_test_bystander", other=len)  # holds neither f nor g
    try:
        assert patching.freeze([f, g]) >= 1
        assert patching._skip.get("_patch_test_bystander") is bystander
        assert all(m.__name__ not in patching._skip for m in made)  # holders: scanned
        late = _module("_patch_test_late", f=f)  # imported after the freeze: scanned
        f2 = lambda: "f2"  # noqa: E731
        p = Patcher()
        assert p.replace_everywhere(f, f2) == len(made) + 1
        assert all(m.f is f2 for m in [*made, late])
        # a replacement bound by a module imported inside the context goes back too
        later = _module("_patch_test_later", f=f2)
        p.restore()
        assert all(m.f is f for m in [*made, late, later])
        # an original the freeze did not look for: every module is scanned, as without it
        other, other2 = (lambda: "o"), (lambda: "o2")
        bystander.h = other
        p2 = Patcher()
        assert p2.replace_everywhere(other, other2) == 1
        assert bystander.h is other2
        p2.restore()
        assert bystander.h is other
    finally:
        patching.thaw()
        for name in ("_patch_test_bystander", "_patch_test_later"):
            sys.modules.pop(name, None)
    assert patching._skip == {}


def test_a_fork_servers_preload_freezes_its_modules_and_objects():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    program = (
        "import gc, json, sys\n"
        "from cutedebug.engine import forkserver\n"
        "forkserver.preload()\n"
        "from cutedebug.instrument import entry_points, patching\n"
        "fns = entry_points.rebound_everywhere()\n"
        "holders = sorted(n for n, m in sys.modules.items()\n"
        "                 if any(v is f for v in vars(m).values() for f in fns))\n"
        "print(json.dumps({'frozen_objects': gc.get_freeze_count(), 'fns': len(fns),\n"
        "  'skipped_holders': [h for h in holders if h in patching._skip],\n"
        "  'holders': len(holders), 'skipped': len(patching._skip),\n"
        "  'modules': len(sys.modules)}))\n"
    )
    out = program_json(program, root, timeout=300)
    assert out["fns"] >= 10 and out["holders"] >= 1
    assert out["skipped_holders"] == []  # a module holding a hooked function is scanned
    assert out["skipped"] + out["holders"] >= out["modules"] - 5
    assert out["frozen_objects"] > 10_000  # the server's objects: out of the collector's reach
