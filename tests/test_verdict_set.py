"""The verdict set is closed in code: one enum, predicates beside it, one serialisation; the
lists other modules keep are derived from it; the sanitizer's own classes are a second closed
enum whose finding classes are verdicts."""

import re
from pathlib import Path

import pytest

from cutedebug.analyses.sanitizer.findings import (
    API_ERROR,
    BARRIER_MISUSE,
    PARSE_FAILURE,
    RAW_HAZARD,
    UNINIT_READ,
)
from cutedebug.analyses.sanitizer.triage import CLASSES, kind_class
from cutedebug.commands import sanitize, triage
from cutedebug.engine import verdict as V
from cutedebug.engine.verdict import SanitizerClass, Verdict
from cutedebug.instrument import faults

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_enum_is_the_documented_closed_set():
    text = README.read_text()
    documented = re.search(r"Verdicts \(closed set\): `([^`]+)`", text, re.S).group(1).split()
    assert list(V.ALL) == documented


def test_predicates():
    assert V.values(lambda v: v.is_sanitizer_finding) == (
        "RACE",
        "MEMORY_ERROR",
        "SYNC_ERROR",
        "UNINIT",
    )
    assert V.values(lambda v: v.ends_at_compile) == (
        "COMPILE_ERROR",
        "COMPILER_CRASH",
        "HARNESS_ERROR",
    )
    assert V.values(lambda v: v.ran_to_completion) == ("PASS", "MISMATCH")
    assert not any(v.is_failure for v in (Verdict.PASS, Verdict.UNSUPPORTED, Verdict.HARNESS_ERROR))
    assert all(Verdict(x).is_failure for x in ("HANG", "CRASH", "NONDETERMINISTIC", "RACE"))
    assert V.is_failure("HANG") and not V.is_failure(Verdict.PASS)
    assert [v for v in Verdict if v.is_ours] == [Verdict.HARNESS_ERROR]


def test_modules_derive_their_lists_from_the_enum():
    assert triage.COMPILE_FINAL == V.values(lambda v: v.ends_at_compile)
    assert sanitize.FINDING_VERDICTS == V.values(lambda v: v.is_sanitizer_finding)
    assert CLASSES == tuple(c.value for c in SanitizerClass)
    assert set(faults.VERDICTS) <= set(V.ALL)
    assert {rule[2] for rule in V.RULES} <= set(Verdict)


def test_serialisation_round_trip_and_errors():
    for v in Verdict:
        assert Verdict.from_json(v.to_json()) is v and str(v) == v.value
    with pytest.raises(ValueError, match=r"'CLEAN' is not a verdict; one of \['PASS'"):
        Verdict.from_json("CLEAN", "report.json verdict")


def test_sanitizer_classes():
    assert {c.verdict for c in SanitizerClass if c.is_finding} == V.SANITIZER_FINDINGS
    assert [c.value for c in SanitizerClass if not c.is_finding] == [
        "API_ERROR",
        "UNREADABLE",
        "CLEAN",
    ]
    assert V.sanitize_verdict("CLEAN") is SanitizerClass.CLEAN
    assert V.sanitize_verdict("RACE") is Verdict.RACE  # a finding class is the verdict
    assert V.sanitize_verdict("HANG") is Verdict.HANG  # the kernel's own, when it never ran
    with pytest.raises(ValueError, match="not a sanitize verdict"):
        V.sanitize_verdict("MAYBE")
    kinds = [
        RAW_HAZARD,
        BARRIER_MISUSE,
        UNINIT_READ,
        API_ERROR,
        PARSE_FAILURE,
        "INVALID_GLOBAL_WRITE",
        "???",
    ]
    for kind in kinds:
        for tool in ("memcheck", "racecheck", "synccheck", "initcheck", "other"):
            assert kind_class(kind, tool) in SanitizerClass._value2member_map_
