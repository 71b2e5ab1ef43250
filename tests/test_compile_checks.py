"""engine/compile_checks.py: the checks a worker runs on the recorded protocol are handed in by
its caller (the engine does not import analyses), by reference across the process boundary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cutedebug.analyses import lint
from cutedebug.engine import compile_checks as CC
from cutedebug.engine import runner
from cutedebug.engine import scenario as S
from cutedebug.instrument.protocol import Event, Protocol

ROOT = Path(__file__).resolve().parent.parent

_SEEN: list[Protocol] = []


def _capture(proto: Protocol) -> list[dict]:
    """A compile check that keeps the protocol it was given and finds nothing."""
    _SEEN.append(proto)
    return []


def _broken(proto: Protocol) -> list[dict]:
    raise KeyError("checker bug")


def test_a_check_is_handed_over_by_reference_and_resolved_back():
    ref = CC.reference(lint.static_findings)
    assert ref == "cutedebug.analyses.lint:static_findings"
    assert CC.resolve(ref) is lint.static_findings
    assert CC.references([lint.static_findings, _capture])[1].endswith(":_capture")


def test_what_a_worker_could_not_import_back_is_refused():
    def nested(proto):
        return []

    for check in (lambda p: [], nested, Protocol().pipeline_table):
        with pytest.raises(ValueError, match="compile check"):
            CC.reference(check)


def test_no_check_handed_in_is_nothing_checked_not_no_findings():
    assert CC.run(None, Protocol()) is None
    assert CC.run([], Protocol()) is None


def test_a_check_that_cannot_run_leaves_a_visible_error_finding():
    proto = Protocol()
    (missing,) = CC.run(["cutedebug.analyses.lint:no_such_check"], proto)
    assert missing["severity"] == "error" and missing["check"] == lint.HARNESS_CHECK
    assert "cutedebug.analyses.lint:no_such_check" in missing["message"]
    assert "AttributeError" in missing["message"]
    (crashed,) = CC.run([CC.reference(_broken)], proto)
    assert crashed["check"] == lint.HARNESS_CHECK and "KeyError" in crashed["message"]
    assert "test_compile_checks.py" in crashed["message"]  # where it raised
    # the same shape as a lint finding, so every reader of static_findings reads it
    assert set(crashed) == set(lint.Finding("error", "x", None, "m").to_json())


def test_findings_of_several_checks_are_concatenated_in_order():
    proto = Protocol(events=[Event(seq=0, kind="expect_tx", detail={"bytes": 16})])
    refs = CC.references([lint.static_findings, _capture])
    assert CC.run(refs, proto) == lint.static_findings(proto)
    assert _SEEN[-1] is proto


def test_the_worker_runs_the_check_it_was_handed_on_the_live_protocol(tmp_path):
    """One CPU compile of a scenario with a static fault: the worker records the protocol
    itself and runs the handed checks on that very object (the compiled event's findings are
    lint's over the captured protocol, and they name the fault's arithmetic)."""
    from cutedebug.engine import worker

    sc = S.load(ROOT / "scenarios" / "tma_stream" / "wrong_expect_tx_plus.toml")
    req, events_path, _ = runner.write_request(
        tmp_path, sc, mode="compile", compile_checks=[lint.static_findings, _capture]
    )
    request = json.loads(req.read_text())
    assert request["compile_checks"] == [
        "cutedebug.analyses.lint:static_findings",
        CC.reference(_capture),
    ]
    _SEEN.clear()
    events = worker.Events(str(events_path))
    try:
        worker.run(request, events)
    finally:
        events._f.close()
    evs = [json.loads(ln) for ln in events_path.read_text().splitlines() if ln.strip()]
    compiled = next(e for e in evs if e["event"] == "compiled")
    (proto,) = _SEEN
    assert proto.pipelines, "the protocol the check saw was recorded during the compile"
    assert compiled["static_findings"] == lint.static_findings(proto)
    errors = [f for f in compiled["static_findings"] if f["severity"] == "error"]
    assert [f["check"] for f in errors] == ["expect_tx"]
    # the scenario asks 16 B more than the three loads deliver (33024 B)
    assert "expect_tx 33040 B per stage, TMA copies deliver 33024 B" in errors[0]["message"]


def test_a_request_without_checks_says_nothing_was_checked(tmp_path):
    req, _, _ = runner.write_request(tmp_path, S.load(ROOT / "scenarios/minimal/clean.toml"))
    assert json.loads(req.read_text())["compile_checks"] == []
