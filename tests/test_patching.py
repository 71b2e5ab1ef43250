"""The layer's patcher (instrument/patching.py): names rebound in every module in one pass,
and every one of them put back, in modules imported meanwhile too."""

import sys
import types

import pytest

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
