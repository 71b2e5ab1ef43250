"""Records as dataclasses (cutedebug/records.py): the files earlier versions wrote on the H200
read back and write out unchanged, and a record that does not fit is refused naming the field."""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any, Literal

import pytest
from helpers import recorded_runs
from helpers.h200_captures import captures

from cutedebug import records
from cutedebug.commands import shard
from cutedebug.commands import triage as T
from cutedebug.engine.triage_record import CallRecord, TriageMatrix, TriageRecord
from cutedebug.engine.verdict import Verdict
from cutedebug.records import ABSENT, Absent, RecordError

ROOT = Path(__file__).resolve().parent.parent
# Triage matrices of four H200 sessions, oldest first: the record grew keys between them
# (expected.also, a call's work_s, perturbation and value_diagnosis).
MATRICES = [
    "reports/2026-11-30-h200/triage2-matrix.json.gz",
    "reports/2026-11-30-h200-s2/matrix.json.gz",
    "reports/2026-11-30-h200-s3/matrix.json.gz",
    "reports/2026-12-01-h200/final/matrix.json.gz",
]


def read_text(rel: str) -> str:
    path = ROOT / rel
    return (gzip.open(path, "rt") if rel.endswith(".gz") else path.open()).read()


@pytest.mark.parametrize("rel", MATRICES)
def test_a_recorded_matrix_round_trips_unchanged(rel):
    text = read_text(rel)
    m = TriageMatrix.from_json(json.loads(text))
    assert m.to_json() == json.loads(text)
    # byte for byte as the triage writes it (write_matrix: indent=1)
    assert json.dumps(m.to_json(), indent=1, default=str) == text
    # and the records are typed: verdicts are the enum, calls are CallRecords
    done = [r for r in m.scenarios if r.done and r.verdict]
    assert done and all(isinstance(r.verdict, Verdict) for r in done)
    assert all(isinstance(r.final, CallRecord) for r in done)


def test_old_records_lack_later_keys_and_keep_lacking_them():
    oldest = TriageMatrix.from_json(json.loads(read_text(MATRICES[0])))
    rec = next(r for r in oldest.scenarios if r.run)
    assert rec.expected.also is ABSENT and rec.run.work_s is ABSENT
    assert "also" not in rec.to_json()["expected"] and "work_s" not in rec.to_json()["run"]
    # its rates predate "exposed_by_perturbation" (read as 0, not written back); no facts yet
    counts = oldest.rates.counts
    assert counts.exposed_by_perturbation == 0 and "exposed_by_perturbation" not in counts.to_json()
    assert oldest.facts is None and oldest.environment.gpu == "NVIDIA H200"
    assert oldest.rates.detection.text().endswith(
        f"({oldest.rates.detection.hits}/{oldest.rates.detection.of})"
    )
    # a pending record of the last session has no grading fields yet
    final = TriageMatrix.from_json(json.loads(read_text(MATRICES[-1])))
    pending = [r for r in final.scenarios if not r.done]
    assert pending and all(r.verdict is ABSENT and "verdict" not in r.to_json() for r in pending)


def recorded_record() -> dict[str, Any]:
    m = json.loads(read_text(MATRICES[-1]))
    return next(r for r in m["scenarios"] if r["run"] and r.get("verdict") == "HANG")


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(extra=1), r"field 'extra' unknown \(TriageRecord\); allowed: \["),
        (lambda d: d.pop("kernel"), r"field 'kernel' missing \(TriageRecord\)"),
        (lambda d: d["run"].pop("wall_s"), r"field 'run.wall_s' missing \(CallRecord\)"),
        (lambda d: d["run"].update(verdict="MAYBE"), r"'run.verdict': 'MAYBE' is not a verdict"),
        (lambda d: d.update(status="later"), r"'status': 'later' is not one of \['pending'"),
        (lambda d: d.update(repeat=True), r"field 'repeat': expected int, got bool"),
        (lambda d: d["compile"].update(wall_s="3"), r"'compile.wall_s': expected float, got str"),
        (lambda d: d["run"]["verdicts"].append(7), r"'run.verdicts\[1\]': 7 is not a verdict"),
        (lambda d: d.update(expected=[]), r"field 'expected': expected a JSON object"),
        (lambda d: d.update(schema="x/2"), r"'schema': 'x/2' is not one of \['cutedebug.triage"),
    ],
)
def test_a_record_that_does_not_fit_is_refused_naming_the_field(change, message):
    data = recorded_record()
    TriageRecord.from_json(data)  # the recorded one fits
    bad = copy.deepcopy(data)
    change(bad)
    with pytest.raises(RecordError, match=message):
        TriageRecord.from_json(bad)


def test_resume_reuses_a_record_an_older_version_wrote(tmp_path):
    """--resume reads the records of the oldest recorded triage (no expected.also, no
    work_s): they are reused, and written back unchanged."""
    oldest = json.loads(read_text(MATRICES[0]))["scenarios"]
    results = tmp_path / "results"
    results.mkdir()
    for r in oldest:
        (results / T.record_name(r["id"])).write_text(json.dumps(r))
    damaged: list[str] = []
    loaded = T.load_records(results, damaged)
    assert damaged == [] and len(loaded) == len(oldest)
    assert [loaded[r["id"]].to_json() for r in oldest] == oldest
    # one damaged file is named with its field, the others still load
    bad = dict(oldest[0], verdict_ok="yes")
    (results / T.record_name(bad["id"])).write_text(json.dumps(bad))
    damaged = []
    assert len(T.load_records(results, damaged)) == len(oldest) - 1
    assert damaged == [f"{T.record_name(bad['id'])}: field 'verdict_ok': expected bool, got str"]


def test_merge_of_shards_an_older_version_wrote(tmp_path):
    """`cutedebug merge` of two shards in the oldest recorded shape gives one matrix whose
    records are the shards' records (reports relinked), key for key."""
    m = json.loads(read_text(MATRICES[0]))
    recs = m["scenarios"]
    half = len(recs) // 2
    for name, part in (("a", recs[:half]), ("b", recs[half:])):
        d = tmp_path / name
        (d / "results").mkdir(parents=True)
        for r in part:
            (d / "results" / T.record_name(r["id"])).write_text(json.dumps(r))
        (d / "matrix.json").write_text(json.dumps(dict(m, scenarios=part)))
    merged = shard.merge([tmp_path / "a", tmp_path / "b"], tmp_path / "all")
    written = json.loads((tmp_path / "all" / "matrix.json").read_text())
    by_id = {r["id"]: r for r in recs}
    for r in written["scenarios"]:
        orig = by_id[r["id"]]
        for call in ("compile", "run"):
            if orig[call] and orig[call]["report"]:
                r[call]["report"] = orig[call]["report"]  # relinked from all/ to a/ or b/
        assert r == orig
    assert len(merged.scenarios) == len(recs)


# ---- records.py on a small record type ----------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class Inner:
    n: int

    def to_json(self):
        return records.to_json(self)

    @classmethod
    def from_json(cls, data, where=""):
        return records.from_json(cls, data, where)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outer:
    kind: Literal["a", "b"]
    inner: Inner | None
    items: list[Inner]
    by_name: dict[str, float]
    later: str | Absent = ABSENT


def test_records_reads_nested_types_and_leaves_absent_keys_out():
    data = {"kind": "a", "inner": {"n": 1}, "items": [{"n": 2}], "by_name": {"x": 1, "y": 2.5}}
    o = records.from_json(Outer, data)
    assert o.inner == Inner(n=1) and o.items == [Inner(n=2)] and o.later is ABSENT
    assert records.to_json(o) == data  # 1 stays 1 (not 1.0): the file's own numbers
    assert records.to_json(dataclasses.replace(o, later="x")) == dict(data, later="x")
    with pytest.raises(RecordError, match=r"field 'items\[0\].n': expected int, got str"):
        records.from_json(Outer, dict(data, items=[{"n": "2"}]))
    with pytest.raises(RecordError, match=r"field 'inner.m' unknown \(Inner\); allowed: \['n'\]"):
        records.from_json(Outer, dict(data, inner={"n": 1, "m": 2}))
    with pytest.raises(RecordError, match=r"field 'by_name.y': expected float, got NoneType"):
        records.from_json(Outer, dict(data, by_name={"y": None}))
    assert not ABSENT and records.present(ABSENT, 3) == 3 and records.present(0, 3) == 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Keyword:
    kernel: str
    class_: str = records.named("class")
    n: int = records.later(0)
    lacked: frozenset = records.absent_keys()


def test_a_named_field_is_its_json_key():
    """``named``: the field ``class_`` is the key ``class``, in writing, reading and errors."""
    data = {"kernel": "k", "class": "RACE"}
    o = records.from_json(Keyword, data)
    assert o.class_ == "RACE" and o.lacked == {"n"} and records.to_json(o) == data
    assert list(records.to_json(dataclasses.replace(o, n=2))) == ["kernel", "class", "n"]
    with pytest.raises(RecordError, match=r"field 'class' missing \(Keyword\)"):
        records.from_json(Keyword, {"kernel": "k"})
    with pytest.raises(
        RecordError, match=r"field 'class_' unknown \(Keyword\); allowed: \['class'"
    ):
        records.from_json(Keyword, dict(data, class_="RACE"))
    with pytest.raises(RecordError, match=r"field 'class': expected str, got int"):
        records.from_json(Keyword, dict(data, **{"class": 1}))


# ---- report.json ----------------------------------------------------------------------------
RUNS = ROOT / "tests" / "data" / "runs"


@pytest.mark.parametrize("case", ["wrong_expect_tx_plus", "missing_phase_flip_producer"])
def test_the_report_of_a_recorded_h200_run_round_trips(case, tmp_path):
    """report.json of a run replayed from its H200 events reads back as a RunReport and
    writes out byte for byte; its stuck map rows are typed."""
    from cutedebug.engine import runner
    from cutedebug.engine.run_report import RunReport
    from cutedebug.reporting import report

    res = runner.replay(RUNS / case)
    res.run_dir = tmp_path
    jpath, _ = report.write(res)
    text = jpath.read_text()
    rep = RunReport.from_json(json.loads(text))
    assert json.dumps(rep.to_json(), indent=1, default=str) == text
    assert rep.verdict is res.verdict and rep.schema_version == 1
    if rep.stuck_map is not None:
        assert sum(r.n_ctas for r in rep.stuck_map.rows) > 0
    bad = dict(json.loads(text), schema_version=2)
    with pytest.raises(RecordError, match=r"field 'schema_version': 2 is not one of \[1\]"):
        RunReport.from_json(bad)


def test_the_exec_report_of_recorded_h200_events_round_trips(tmp_path):
    """report.json of `cutedebug exec` over the recorded tma_stream hang's events (one
    process of an exec'd command) reads back as an ExecReport, byte for byte."""
    from cutedebug.commands import exec as X
    from cutedebug.engine.run_report import ExecReport

    tree = X._Tree()
    for line in recorded_runs.lines("wrong_expect_tx_plus"):
        tree.add({**json.loads(line), "pid": 4242})
    res = X.ExecResult(
        settings=X.Settings(argv=["python", "repro.py"]),
        verdict=Verdict.PASS,
        reason="",
        run_dir=tmp_path,
        returncode=-9,
        killed_by="stuck records",
        elapsed_s=1.0,
        processes=tree.procs,
    )
    X.classify(res)
    X.write_report(res, expect="HANG", command="cutedebug exec -- python repro.py")
    text = (tmp_path / "report.json").read_text()
    rep = ExecReport.from_json(json.loads(text))
    assert json.dumps(rep.to_json(), indent=1, default=str) == text
    assert rep.verdict is Verdict.HANG and rep.as_expected and rep.processes[0].pid == 4242


# ---- probe sites, stuck records, beacons --------------------------------------------------------
def recorded_events(case: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in recorded_runs.lines(case)]


@pytest.mark.parametrize("case", ["wrong_expect_tx_plus", "missing_phase_flip_producer"])
def test_recorded_sites_stuck_records_and_beacons_round_trip(case):
    """The H200 run's probe sites (written before pipeline_index, via and tx_bytes existed),
    its stuck records and beacons read as their types and write back key for key."""
    from cutedebug.instrument.probes import Beacon, Site, SiteTable, StuckRecord

    events = recorded_events(case)
    sites = next(e for e in events if e["event"] == "compiled")["probe_sites"]
    assert sites and all("via" not in s for s in sites)  # the older shape
    typed = [Site.from_json(s) for s in sites]
    assert [s.to_json() for s in typed] == sites
    assert all(s.via == "" and s.pipeline_index is None for s in typed)  # their defaults
    assert SiteTable.from_json(sites).to_json() == sites
    # the live pictures, and the final report where the kernel finished (the other faulted)
    pictures = [e["picture"] for e in events if e.get("picture")]
    pictures += [e for e in events if e["event"] == "probe_report"]
    n = 0
    for pic in pictures:
        for r in pic["stuck"]:
            rec = StuckRecord.from_json(r)
            assert rec.to_json() == r and isinstance(rec.block, tuple)
            n += 1
        for b in pic["beacons"]:
            assert Beacon.from_json(b).to_json() == b
    assert pictures and n or case == "missing_phase_flip_producer"
    # a field set since the file was written is written
    moved = dataclasses.replace(typed[0], via="lib.py:12")
    assert moved.to_json()["via"] == "lib.py:12"


def test_a_site_or_stuck_record_that_does_not_fit_is_refused():
    from cutedebug.instrument.probes import Site, StuckRecord, snapshot_from_json

    events = recorded_events("wrong_expect_tx_plus")
    site = next(e for e in events if e["event"] == "compiled")["probe_sites"][0]
    with pytest.raises(RecordError, match=r"field 'op' missing \(Site\)"):
        Site.from_json({k: v for k, v in site.items() if k != "op"})
    with pytest.raises(RecordError, match=r"field 'line': expected int, got str"):
        Site.from_json(dict(site, line="238"))
    # `cutedebug exec` adds the kernel a site was traced in: written only when known
    exec_site = dict(site, kernel="TmaStream.kernel", symbol="kernel_0")
    assert Site.from_json(exec_site).to_json() == exec_site
    stuck = next(e for e in events if e["event"] == "probe_report")["stuck"][0]
    with pytest.raises(RecordError, match=r"field 'block': expected 3 items, got 2"):
        StuckRecord.from_json(dict(stuck, block=[0, 0]))
    with pytest.raises(RecordError, match=r"field 'stuck\[0\].waited_ns' missing"):
        snapshot_from_json({"stuck": [{k: v for k, v in stuck.items() if k != "waited_ns"}]})


# ---- sanitizer findings -------------------------------------------------------------------------
SANITIZER_H200 = captures()  # tests/data/sanitizer/h200, its .gz captures unpacked


def test_findings_of_the_h200_sanitizer_captures_round_trip():
    """Every finding parsed from the compute-sanitizer XML captured on the H200 writes out and
    reads back as the same Finding; every group of each capture's result reads back as its
    GroupRecord, key for key."""
    from cutedebug.analyses.sanitizer.findings import Finding
    from cutedebug.analyses.sanitizer.parse import parse_xml
    from cutedebug.analyses.sanitizer.result import make_result
    from cutedebug.analyses.sanitizer.triage import GroupRecord

    n, groups, every = 0, 0, []
    for xml in sorted(SANITIZER_H200.glob("*.xml")):
        tool = xml.stem.split("_", 1)[0]
        findings = parse_xml(xml, tool)
        every += findings
        for f in findings:
            data = json.loads(json.dumps(f.to_json()))
            assert Finding.from_json(data) == f and Finding.from_json(data).to_json() == data
            n += 1
        result = make_result(
            tool, ["python", "w.py"], findings, read_source=lambda f, ln: None
        ).to_json()
        for key in ("groups", "filtered_groups"):
            for g in result[key]:
                assert GroupRecord.from_json(g).to_json() == g
                groups += 1
    assert n > 100 and groups > 0  # hundreds of records, in a few groups
    sample = json.loads(json.dumps(every[0].to_json()))
    with pytest.raises(RecordError, match=r"field 'threads\[0\]': expected 3 items, got 2"):
        Finding.from_json(dict(sample, threads=[[0, 1]]))
    with pytest.raises(RecordError, match=r"field 'severity' missing \(Finding\)"):
        Finding.from_json({k: v for k, v in sample.items() if k != "severity"})


# ---- sanitize.json ----------------------------------------------------------------------------
# No H200 session kept a sanitize.json; these two were written by `cutedebug sanitize` before
# the result was typed (commit 69b7e67), from the H200 captures replayed by the fake
# compute-sanitizer (tests/data/sanitizer/README.md): a racecheck run with its plain run, and a
# memcheck run with --shrink.
SANITIZE_JSON = sorted((ROOT / "tests" / "data" / "sanitizer" / "recorded").glob("*.json"))


@pytest.mark.parametrize("path", SANITIZE_JSON, ids=lambda p: p.name)
def test_a_recorded_sanitize_json_round_trips_byte_for_byte(path):
    """Each tool's result of a sanitize.json written before the result was typed reads as a
    ToolResult (shrink, groups and noise counts typed) and the file writes back byte for
    byte through the command's own writer."""
    from cutedebug.analyses.sanitizer.result import (
        KernelSeconds,
        NoiseCount,
        PlainRun,
        SanitizeSummary,
        ToolResult,
    )
    from cutedebug.analyses.sanitizer.shrink import ShrinkResult
    from cutedebug.analyses.sanitizer.triage import GroupRecord
    from cutedebug.commands.sanitize import dump_summary

    text = path.read_text()
    summary = json.loads(text)
    typed = SanitizeSummary.from_json(summary)
    assert dump_summary(typed) == text
    assert typed.as_expected is True and typed.verdicts() == {
        t: r["verdict"] for t, r in summary["tools"].items()
    }
    assert typed.plain is None or isinstance(typed.plain, PlainRun)
    tools = typed.tools
    for data, res in zip(summary["tools"].values(), tools.values()):
        assert ToolResult.from_json(res.to_json()) == res
        assert list(res.to_json()) == list(data)  # the keys in the order they were written
        assert all(isinstance(g, GroupRecord) for g in res.groups + res.filtered_groups)
        assert all(isinstance(n, NoiseCount) for n in res.filtered)
        assert isinstance(res.kernel_seconds, KernelSeconds)
        assert res.shrink is None or isinstance(res.shrink, ShrinkResult)
        assert res.verdict == data["verdict"] and res.records == data["records"]
    one = next(iter(summary["tools"].values()))
    with pytest.raises(RecordError, match=r"field 'verdict': 'MAYBE' is not a sanitize verdict"):
        ToolResult.from_json(dict(one, verdict="MAYBE"))
    with pytest.raises(RecordError, match=r"field 'kernel_seconds.slowdown' missing"):
        ToolResult.from_json(dict(one, kernel_seconds={"sanitized": 1.0, "plain": None}))
    with pytest.raises(RecordError, match=r"field 'filtered\[0\].count': expected int"):
        ToolResult.from_json(dict(one, filtered=[{"reason": "x", "count": "1"}]))


def test_other_kernels_of_a_mixed_capture_read_back_with_their_class():
    """The findings of a kernel the worker did not launch: an OtherKernel whose JSON key
    ``class`` (not a field name) reads and writes back, its groups typed."""
    from cutedebug.analyses.sanitizer.attribution import OtherKernel
    from cutedebug.analyses.sanitizer.parse import parse_xml
    from cutedebug.analyses.sanitizer.result import ToolResult, make_result
    from cutedebug.analyses.sanitizer.triage import GroupRecord

    xml = ROOT / "tests" / "data" / "sanitizer" / "synthetic_mixed_kernels.xml"
    findings = parse_xml(xml, "racecheck")
    mine = [f.kernel for f in findings if f.kernel and "pytorch" not in f.kernel][:1]
    res = make_result("racecheck", ["cs"], findings, kernel_names=mine)
    data = json.loads(json.dumps(res.to_json()))
    (other,) = data["other_kernels"]
    assert list(other) == ["kernel", "records", "count", "class", "groups"]
    assert other["class"] == "RACE" and res.other_kernels[0].class_ == "RACE"
    back = ToolResult.from_json(data)
    assert back == res and back.to_json() == data
    assert isinstance(back.other_kernels[0], OtherKernel)
    assert isinstance(back.other_kernels[0].groups[0], GroupRecord)


def test_a_result_made_from_a_capture_alone_leaves_the_run_keys_out():
    """make_result's record (no worker run) writes only its own keys, as it always did, and
    reads back equal."""
    from cutedebug.analyses.sanitizer.parse import parse_xml
    from cutedebug.analyses.sanitizer.result import ToolResult, make_result

    findings = parse_xml(SANITIZER_H200 / "racecheck_raw.xml", "racecheck")
    res = make_result("racecheck", ["cs"], findings, read_source=lambda f, ln: None)
    data = json.loads(json.dumps(res.to_json()))
    assert "sanitizer_class" not in data and "records" not in data and data["verdict"] == "RACE"
    assert list(data)[-1] == "other_kernels" and ToolResult.from_json(data) == res


# ---- bisect.json ------------------------------------------------------------------------------
# No H200 session kept a bisect.json; these three were written by `cutedebug bisect` before it
# was typed (commit d045c7b): on this CPU through the real worker (the baseline compiles, the
# site table is real, the run is UNSUPPORTED), and over the same real compiled site table with
# the checkpoint runs of tests/test_bisect.py's fake (localized; and with a timing bug).
BISECT_JSON = sorted((ROOT / "tests" / "data" / "bisect").glob("*.bisect.json"))


@pytest.mark.parametrize("path", BISECT_JSON, ids=lambda p: p.name)
def test_a_recorded_bisect_json_round_trips_byte_for_byte(path):
    from cutedebug.analyses.bisect_record import BisectReport, Grade, GradeMatch
    from cutedebug.analyses.bisect_search import RunRecord, SearchRecord
    from cutedebug.instrument.checkpoint import CheckpointSite

    text = path.read_text()
    report = BisectReport.from_json(json.loads(text))
    assert json.dumps(report.to_json(), indent=1, default=str) == text  # as reporting writes it
    assert BisectReport.from_json(report.to_json()) == report
    assert len(report.sites) == 6 and all(isinstance(s, CheckpointSite) for s in report.sites)
    assert all(isinstance(r, RunRecord) for r in report.runs) and report.n_runs == len(report.runs)
    assert all(isinstance(st, SearchRecord) for st in report.searches.values())
    assert isinstance(report.grade, Grade)
    if report.status == "nothing_to_bisect":
        assert report.grade.to_json() == {} and report.grade.passed is None
    else:
        assert report.searches["consumer"].first_unreached in (3, 4)
    if report.ok:
        assert isinstance(report.grade.matched, GradeMatch) and report.grade.matched.site == 3


def test_bisect_json_with_the_probes_answer_round_trips_and_refuses_a_bad_field():
    """The probes' answer and the baseline's stuck sites (a run with probes) read back typed;
    a wrong status or a run without its timing_bug is refused naming the field."""
    from cutedebug.analyses.bisect_record import BisectReport, ProbesAnswer, RoleAgreement

    data = json.loads(
        (ROOT / "tests/data/bisect/flag_spin_never_set.localized.bisect.json").read_text()
    )
    stuck = [{"role": "consumer", "op": "consumer_wait", "location": "flag_spin.py:139"}]
    data["baseline"] = {**data["baseline"], "probes": True, "stuck_sites": stuck, "diagnosis": []}
    data["probes_answer"] = {
        "roles": {
            "consumer": {
                "probe": "consumer_wait at flag_spin.py:139",
                "location": "flag_spin.py:139",
                "op": "consumer_wait",
                "agreement": "agree",
                "n_stuck_warps": 1,
            }
        },
        "agree": True,
    }
    report = BisectReport.from_json(data)
    assert isinstance(report.probes_answer, ProbesAnswer) and report.probes_answer.agree is True
    assert isinstance(report.probes_answer.roles["consumer"], RoleAgreement)
    assert report.baseline.stuck_sites == stuck and report.to_json() == data
    with pytest.raises(RecordError, match=r"field 'status': 'done' is not one of"):
        BisectReport.from_json(dict(data, status="done"))
    run = {k: v for k, v in data["runs"][0].items() if k != "timing_bug"}
    with pytest.raises(RecordError, match=r"field 'runs\[0\].timing_bug' missing"):
        BisectReport.from_json(dict(data, runs=[run]))
    bad = copy.deepcopy(data)
    bad["probes_answer"]["roles"]["consumer"]["agreement"] = "maybe"
    with pytest.raises(RecordError, match=r"probes_answer.roles.consumer.agreement"):
        BisectReport.from_json(bad)


# ---- events ----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["wrong_expect_tx_plus", "missing_phase_flip_producer"])
def test_a_recorded_event_stream_round_trips_line_for_line(case, tmp_path):
    """Every line of the H200 run's events.jsonl reads as an Event (through the watchdog's
    reader) and writes back as the same line, byte for byte as the worker wrote it."""
    from cutedebug.engine.watchdog import EventReader
    from cutedebug.event import Event

    path = recorded_runs.events_file(case, tmp_path)
    events, bad = EventReader(path).poll()
    lines = path.read_text().splitlines()
    assert bad == [] and len(events) == len(lines)
    for ev, line in zip(events, lines):
        assert isinstance(ev, Event) and ev == json.loads(line)  # reads like its JSON object
        assert json.dumps(ev.to_json(), default=str) == line
        assert Event.from_json(json.loads(line)) == ev
    compiled = next(e for e in events if e.name == "compiled")
    assert compiled["secs"] == compiled.fields["secs"] and compiled.get("missing") is None
    assert {**compiled}["event"] == "compiled"
    # each payload is its kind's record; keys of later versions read as None
    from cutedebug.event_kinds import KINDS, Checked, Compiled

    assert all(type(e.payload) is KINDS[e.name] for e in events)
    c = compiled.as_kind(Compiled)
    assert c.secs == json.loads(lines[events.index(compiled)])["secs"] and c.kernel_names is None
    assert c.probe_sites and all("op" in s for s in c.probe_sites)
    for e in (e for e in events if e.name == "checked"):
        checked = e.as_kind(Checked)
        assert checked.ok is None and checked.skipped == "bounded waits timed out"


def test_the_payloads_the_gpu_paths_write_fit_their_kinds(tmp_path):
    """What the worker writes only on a GPU, made here by the same functions: the check's
    statistics (equal, wrong values, wrong shape), a checkpoint's counters, the device facts,
    written through Events.emit and read back as their kinds' records."""
    import torch

    from cutedebug.engine import launching, worker
    from cutedebug.engine.events import Events
    from cutedebug.event import Event
    from cutedebug.event_kinds import Checked, Checkpoint, Device
    from cutedebug.instrument import checkpoint as C

    events = Events(str(tmp_path / "e.jsonl"))
    ref = torch.arange(12.0).reshape(3, 4)
    bad = ref.clone()
    bad[1, 2] = float("nan")
    for out in (ref.clone(), bad, ref[:2]):
        stats = launching.compare(out, ref, 1e-5, 1e-5)
        events.emit("checked", **stats, digest=launching.digest(out))
    cfg = C.MarkConfig(max_ctas=2, max_warps=4)
    buf = bytearray(C.buffer_nbytes(cfg))
    C.init_buffer(buf, cfg, 3)
    events.emit("checkpoint", reached=False, final=True, **C.decode(buf, cfg))
    events.emit("device", **worker.detect_device())
    lines = (tmp_path / "e.jsonl").read_text().splitlines()
    got = [Event.from_json(json.loads(ln)) for ln in lines]
    assert [json.dumps(e.to_json()) for e in got] == lines
    ok, wrong, shape = (e.as_kind(Checked) for e in got[:3])
    assert ok.ok is True and wrong.ok is False and wrong.first_bad_index == [1, 2]
    assert wrong.n_nan == 1 and shape.shape_mismatch == [[2, 4], [3, 4]]
    assert got[3].as_kind(Checkpoint).site == 3 and got[3].as_kind(Checkpoint).hits == 0
    assert isinstance(got[4].as_kind(Device).present, bool)


def test_an_event_payload_that_does_not_fit_its_kind_is_refused_naming_the_field(tmp_path):
    """Reading: a key the kind lacks or a value of the wrong type is refused (the watchdog
    counts the line malformed); writing: a keyword the kind lacks is the writer's TypeError;
    a kind this version does not know keeps its fields as they came."""
    from cutedebug.engine.events import Events
    from cutedebug.event import Event
    from cutedebug.event_kinds import OtherPayload, Synced

    with pytest.raises(RecordError, match=r"field 'kernel_s': expected float, got str"):
        Event.from_json({"event": "synced", "t": 1.0, "kernel_s": "fast"})
    with pytest.raises(RecordError, match=r"field 'kernel_seconds' unknown \(Synced\)"):
        Event.from_json({"event": "synced", "t": 1.0, "kernel_seconds": 0.1})
    ev = Event.from_json({"event": "synced", "t": 1.0, "kernel_s": 0.5})
    assert ev.as_kind(Synced).kernel_s == 0.5 and ev.to_json()["kernel_s"] == 0.5
    later = Event.from_json({"event": "a_later_kind", "t": 1.0, "x": [1]})
    assert isinstance(later.payload, OtherPayload) and later.to_json()["x"] == [1]
    events = Events(str(tmp_path / "e.jsonl"))
    with pytest.raises(TypeError, match="kernel_seconds"):
        events.emit("synced", kernel_seconds=0.1)
    events.emit("synced", kernel_s=0.25)
    (line,) = (tmp_path / "e.jsonl").read_text().splitlines()
    assert Event.from_json(json.loads(line)).as_kind(Synced).kernel_s == 0.25


def test_a_line_that_is_not_an_event_is_malformed(tmp_path):
    from cutedebug.engine.watchdog import EventReader
    from cutedebug.event import Event

    path = tmp_path / "events.jsonl"
    good = '{"event": "started", "t": 0.1, "pid": 7}'
    path.write_text(
        "\n".join([good, '{"t": 1}', '{"event": "x", "t": "soon"}', '{"event": ""}', "[1]"]) + "\n"
    )
    events, bad = EventReader(path).poll()
    assert [e.to_json() for e in events] == [json.loads(good)] and len(bad) == 4
    with pytest.raises(RecordError, match=r"field 'event' missing \(EventEnvelope\)"):
        Event.from_json({"t": 1})
    with pytest.raises(RecordError, match=r"field 't': expected float, got str"):
        Event.from_json({"event": "x", "t": "soon"})
    # an event the parent makes up has no time: none is written
    assert Event.from_json({"event": "harness_error", "message": "m"}).to_json() == {
        "event": "harness_error",
        "message": "m",
    }


# ---- checkpoint sites and wait sites ------------------------------------------------------------
COREDUMP = ROOT / "tests" / "data" / "coredump"


def _json_any(path: Path) -> Any:
    return json.loads((gzip.open(path, "rt") if path.suffix == ".gz" else path.open()).read())


def test_recorded_checkpoint_and_wait_sites_round_trip():
    """The checkpoint and wait sites of the H200 coredump captures (wait sites written before
    pipeline_index and via existed) read as their types and write back key for key."""
    from cutedebug.instrument.checkpoint import CheckpointSite
    from cutedebug.instrument.waitsites import WaitSite

    files = sorted(COREDUMP.glob("h200/*/facts.json")) + sorted(COREDUMP.glob("h200-runs/*.gz"))
    lists = [_json_any(p) for p in sorted(COREDUMP.glob("*.wait_sites.json"))]
    n_cp = n_ws = 0
    for p in files:
        facts = _json_any(p)
        for d in facts["checkpoint_sites"]:
            assert CheckpointSite.from_json(d).to_json() == d
            n_cp += 1
        lists.append(facts["wait_sites"])
    for sites in lists:
        for d in sites:
            ws = WaitSite.from_json(d)
            assert ws.to_json() == d and ws.via == "" and ws.pipeline_index is None
            n_ws += 1
    assert n_cp > 100 and n_ws > 100
    with pytest.raises(RecordError, match=r"field 'frames' unknown \(CheckpointSite\)"):
        CheckpointSite.from_json(dict(d_cp := facts["checkpoint_sites"][0], frames=[]))
    assert "frames" not in CheckpointSite.from_json(d_cp).to_json()  # trace-time only
    with pytest.raises(RecordError, match=r"field 'line': expected int, got NoneType"):
        WaitSite.from_json(dict(sites[0], line=None))


@pytest.mark.parametrize("case", ["wrong_expect_tx_plus", "missing_phase_flip_producer"])
def test_recorded_probe_pictures_round_trip(case):
    """The live pictures and the final probe report of the H200 run (written before
    stuck_unlisted, beacons_unlisted and max_ctas existed) read as ProbePictures and write
    back key for key; the snapshot they give keeps every stuck record."""
    from cutedebug.event import Event
    from cutedebug.instrument.probes import ProbePicture, snapshot_from_json

    events = recorded_events(case)
    pictures = [e["picture"] for e in events if e.get("picture")]
    pictures += [Event.from_json(e).fields for e in events if e["event"] == "probe_report"]
    assert pictures
    for pic in pictures:
        typed = ProbePicture.from_json(pic)
        assert typed.to_json() == pic and "max_ctas" not in pic and typed.max_ctas == 0
        assert len(typed.snapshot().stuck) == len(pic["stuck"])
    report = [e for e in events if e["event"] == "probe_report"]
    for e in report:  # a probe_report event reads as the picture it carries
        assert snapshot_from_json(e).stuck == ProbePicture.from_json(pic).snapshot().stuck
    with pytest.raises(RecordError, match=r"field 'n_stuck_reported' missing \(ProbePicture\)"):
        ProbePicture.from_json({k: v for k, v in pictures[0].items() if k != "n_stuck_reported"})


# ---- tools/records_roundtrip.py ---------------------------------------------------------------
def test_the_roundtrip_tool_passes_the_recorded_files_and_names_what_differs(tmp_path, capsys):
    """The tool the GPU session runs on its sanitize/bisect/mutate outputs: OK for every file
    under tests/data, DIFFERS with the line for a file not written the commands' way, REFUSED
    with the field for one that is not a record, 2 when there is nothing to check."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rt", ROOT / "tools" / "records_roundtrip.py")
    rt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rt)
    assert rt.main([str(ROOT / "tests" / "data")]) == 0
    out = capsys.readouterr().out
    assert out.count("OK ") == 15 and "DIFFERS" not in out
    src = ROOT / "tests/data/bisect/flag_spin_never_set.localized.bisect.json"
    compact = tmp_path / "a" / "bisect.json"
    compact.parent.mkdir()
    compact.write_text(json.dumps(json.loads(src.read_text())))  # not indented as written
    bad = tmp_path / "b" / "bisect.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps(dict(json.loads(src.read_text()), status="done"), indent=1))
    assert rt.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"DIFFERS {compact} (BisectReport): line 1:" in out
    assert f"REFUSED {bad}: field 'status': 'done' is not one of" in out
    assert rt.main([str(tmp_path / "none")]) == 2


def test_every_literal_emit_writes_only_keys_its_kind_declares():
    """Events.emit refuses a keyword the event kind does not declare (a TypeError in the
    writer). Many writers run only on a GPU (launch tokens, perturbation, checkpoints, the
    probe monitor), where CPU CI never reaches them: read every ``emit("kind", key=...)`` of
    the package from its source instead. A ``**fields`` argument cannot be read this way; its
    kinds are named so that a new one is looked at."""
    import ast
    import dataclasses

    from cutedebug import event_kinds as K

    declared = {n: {f.name for f in dataclasses.fields(c)} for n, c in K.KINDS.items()}
    wrong, spread = [], set()
    for path in sorted((ROOT / "cutedebug").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            fn = node.func
            name = getattr(fn, "attr", None) or getattr(fn, "id", None) or ""
            first = node.args[0]
            if "emit" not in name or not isinstance(first, ast.Constant):
                continue
            if not isinstance(first.value, str):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            kind = first.value
            if kind not in declared:
                wrong.append(f"{where}: kind {kind!r} has no payload record")
                continue
            for kw in node.keywords:
                if kw.arg is None:
                    spread.add(kind)
                elif kw.arg not in declared[kind]:
                    wrong.append(f"{where}: {kind!r} does not declare {kw.arg!r}")
    assert wrong == []
    # the kinds written from a dict: each checked by a test that builds that dict for real
    assert spread <= {
        "device",
        "compile_error",
        "checked",
        "progress",
        "probe_report",
        "compiled",
        "exit",
        "checkpoint",
        "gpu_check",  # tests/test_run_seconds.py
    }, spread
