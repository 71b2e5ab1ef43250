"""cutedebug.sanitizer on CPU: command, parsing (synthetic and captured fixtures), noise,
grouping, classification, report, shrink."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutedebug import sanitizer as san
from cutedebug.sanitizer import Finding, Site

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "sanitizer"
H200 = DATA / "h200"
SAMPLES = REPO / "tools" / "sanitizer_samples"
RACE_PY = "/h200/cutedebug/tools/sanitizer_samples/race_smem.py"
MINIMAL_PY = "/h200/cutedebug/kernels/minimal.py"


def read_here(file, line):
    return san.source_line(file, line, roots=(REPO,))


def marker_line(path: Path, marker: str) -> int:
    """Line of ``# MARKER`` in a sample program, so tests follow edits of the samples."""
    for i, text in enumerate(path.read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# {marker}"):
            return i
    raise AssertionError(f"{marker} not in {path}")


def xml(name: str) -> str:
    return str(DATA / name)


def text(name: str) -> str:
    return (DATA / name).read_text()


def finding(kind="RAW_HAZARD", lines=((RACE_PY, 28), (RACE_PY, 31)), tool="racecheck",
            **kw) -> Finding:
    sites = tuple(Site(f, ln) for f, ln in lines)
    base = {"tool": tool, "kind": kind, "severity": "error", "kernel": "k",
            "file": sites[0].file, "line": sites[0].line, "sites": sites}
    return Finding(**(base | kw))


# ---- command and environment --------------------------------------------------------------
def test_build_command_racecheck_wraps_worker_argv_last():
    worker = [sys.executable, "-m", "cutedebug.worker", "/tmp/req.json"]
    cmd = san.build_command("racecheck", worker, "/tmp/out.xml", sanitizer="/cs")
    assert cmd[0] == "/cs"
    assert cmd[-4:] == worker
    opts = cmd[1:-4]
    pairs = dict(itertools.pairwise(opts))
    assert pairs["--tool"] == "racecheck"
    assert opts[opts.index("--xml") + 1] == "--save"
    assert pairs["--save"] == "/tmp/out.xml"
    assert pairs["--report-api-errors"] == "no"
    assert pairs["--error-exitcode"] == str(san.ERROR_EXITCODE)
    assert pairs["--print-limit"] == str(san.DEFAULT_PRINT_LIMIT)
    assert pairs["--racecheck-report"] == "all"
    assert "--racecheck-deadlock-timeout" not in opts


def test_build_command_tool_specific_options():
    mem = san.build_command("memcheck", ["w"], "x.xml", sanitizer="cs", report_api_errors=True)
    assert "--racecheck-report" not in mem
    assert mem[mem.index("--report-api-errors") + 1] == "all"
    race = san.build_command("racecheck", ["w"], "x.xml", sanitizer="cs", deadlock_timeout_s=20)
    assert race[race.index("--racecheck-deadlock-timeout") + 1] == "20"
    with pytest.raises(ValueError, match="unknown sanitizer tool"):
        san.build_command("leakcheck", ["w"], "x.xml", sanitizer="cs")


def test_child_env_turns_caching_off_where_it_hides_errors():
    for tool in san.TOOLS:
        assert san.child_env(tool)["CUTE_DSL_LINEINFO"] == "1"
    assert san.child_env("memcheck")["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
    assert san.child_env("initcheck")["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" not in san.child_env("racecheck")


def test_find_sanitizer_env_override_then_path(tmp_path, monkeypatch):
    tool = tmp_path / "bin" / "compute-sanitizer"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("COMPUTE_SANITIZER", str(tool))
    assert san.find_sanitizer() == str(tool)
    monkeypatch.delenv("COMPUTE_SANITIZER")
    monkeypatch.setenv("PATH", str(tool.parent))
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        monkeypatch.delenv(var, raising=False)
    assert san.find_sanitizer() == str(tool)
    tool.chmod(0o644)  # not executable: not a sanitizer
    found = san.find_sanitizer()
    assert found != str(tool)


def test_module_imports_without_torch_or_cutlass():
    code = ("import sys, cutedebug.sanitizer; "
            "bad = [m for m in ('torch', 'cutlass') if m in sys.modules]; "
            "sys.exit(1 if bad else 0)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_cli_command_prints_argv_and_text_only_variant():
    out = subprocess.run([sys.executable, "-m", "cutedebug.sanitizer", "command", "memcheck",
                          "-", "--", "python", "prog.py", "--flag"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    assert "--xml" not in out and "--save" not in out
    assert out[-3:] == ["python", "prog.py", "--flag"]
    assert out[out.index("--tool") + 1] == "memcheck"


# ---- XML (synthetic, after the REFERENCE.md record shape) --------------------------------
def test_parse_xml_racecheck_hazards_exact():
    found = san.parse_xml(xml("synthetic_racecheck_raw.xml"), "racecheck")
    assert [(f.kind, f.severity) for f in found] == [
        ("RAW_HAZARD", "error"), ("RAW_HAZARD", "error"), ("WAW_HAZARD", "warning")]
    raw = found[0]
    assert raw.sites == (
        Site(RACE_PY, 28, "kernel_cutlass_race_kernel_0", "Write", (65, 0, 0)),
        Site(RACE_PY, 31, "kernel_cutlass_race_kernel_0", "Read", (33, 0, 0)))
    assert (raw.file, raw.line, raw.kernel) == (RACE_PY, 28, "kernel_cutlass_race_kernel_0")
    assert raw.threads == ((65, 0, 0), (33, 0, 0))
    assert raw.blocks == ((0, 0, 0),)
    assert raw.address_space == "shared"
    assert raw.address == "0x104"
    assert raw.count == 1
    assert raw.noise_reason is None
    assert found[2].lines == ((RACE_PY, 28), (RACE_PY, 28))
    assert found[2].blocks == ((1, 0, 0),)
    # host stack frames (ceval.c:4181, libcuda) never become the finding's location
    assert all(ln in (28, 31) for f in found for _, ln in f.lines)


def test_parse_xml_memcheck_invalid_global_write_exact():
    found = san.parse_xml(xml("synthetic_memcheck_oob.xml"), "memcheck")
    assert len(found) == 2
    first = found[0]
    assert first.kind == "INVALID_GLOBAL_WRITE"
    assert (first.file, first.line) == (MINIMAL_PY, 64)
    assert (first.size, first.address_space) == (4, "global")
    assert first.threads == ((64, 0, 0),) and first.blocks == ((31, 0, 0),)
    assert first.kernel == "kernel_cutlass_kernel_Minimal_0"
    assert first.address == "0x7f2a1c004100"
    assert found[1].threads == ((65, 0, 0),)
    assert san.classify(found, "memcheck") == "MEMORY_ERROR"


def test_parse_xml_api_records():
    found = san.parse_xml(xml("synthetic_api_noise.xml"), "memcheck")
    assert [f.kind for f in found] == ["API_ERROR"] * 4
    assert [f.api for f in found] == ["cuGetProcAddress_v2"] * 3 + ["cuStreamSynchronize"]
    assert all(f.file is None and f.line is None for f in found)


def test_truncated_xml_is_a_finding_with_salvaged_records():
    found = san.parse_xml(xml("synthetic_truncated.xml"), "racecheck")
    assert found[0].kind == "PARSE_FAILURE"
    assert "not well-formed" in found[0].text and "1 complete record" in found[0].text
    assert [f.kind for f in found[1:]] == ["RAW_HAZARD"]
    assert san.classify(found, "racecheck") == "RACE"
    only_failure = [f for f in found if f.kind == "PARSE_FAILURE"]
    assert san.classify(only_failure, "racecheck") == "UNREADABLE"


@pytest.mark.parametrize("content", ["", "   \n", "garbage, not xml", ("<ComputeSanitizerOutput>"
                                     "<record><kind>Hazard")])
def test_unreadable_xml_is_never_clean(tmp_path, content):
    path = tmp_path / "out.xml"
    path.write_text(content)
    found = san.parse_xml(path, "memcheck")
    assert found and found[0].kind == "PARSE_FAILURE"
    kept, _filtered = san.filter_noise(found)
    assert san.classify(kept, "memcheck") == "UNREADABLE"


def test_missing_xml_is_never_clean(tmp_path):
    found = san.parse_xml(tmp_path / "absent.xml", "racecheck")
    assert [f.kind for f in found] == ["PARSE_FAILURE"]
    assert "could not be read" in found[0].text
    assert san.classify(san.analyze("racecheck", None, ""), "racecheck") == "UNREADABLE"


def test_empty_report_is_clean():
    found = san.parse_xml('<?xml version="1.0"?><ComputeSanitizerOutput/>', "racecheck")
    assert found == []
    assert san.classify(found, "racecheck") == "CLEAN"


# ---- plain text --------------------------------------------------------------------------
def test_parse_text_racecheck_exact():
    found = san.parse_text(text("synthetic_racecheck_raw.txt"), "racecheck")
    assert [(f.kind, f.severity, f.count) for f in found] == [
        ("RACE", "error", 96), ("RAW_HAZARD", "error", 1), ("WAW_HAZARD", "warning", 1)]
    analysis, raw, waw = found
    assert analysis.lines == ((RACE_PY, 28), (RACE_PY, 31))
    assert [s.access for s in analysis.sites] == ["Write", "Read"]
    assert raw.sites == (
        Site(RACE_PY, 28, "kernel_cutlass_race_kernel_0", "Write", (65, 0, 0)),
        Site(RACE_PY, 31, "kernel_cutlass_race_kernel_0", "Read", (33, 0, 0)))
    assert raw.blocks == ((0, 0, 0),) and raw.address_space == "shared"
    assert waw.threads == ((0, 0, 0), (32, 0, 0))
    assert san.parse_summary(text("synthetic_racecheck_raw.txt")) == {
        "hazards": 2, "errors": 1, "warnings": 1}


def test_parse_text_memcheck_exact():
    found = san.parse_text(text("synthetic_memcheck_oob.txt"), "memcheck")
    assert [f.kind for f in found] == [
        "INVALID_GLOBAL_WRITE", "INVALID_GLOBAL_WRITE", "API_ERROR", "MISALIGNED"]
    w = found[0]
    assert (w.file, w.line, w.kernel, w.size) == (MINIMAL_PY, 64,
                                                  "kernel_cutlass_kernel_Minimal_0", 4)
    assert w.threads == ((64, 0, 0),) and w.blocks == ((31, 0, 0),)
    assert found[2].api == "cuStreamSynchronize"
    # the old "at 0xPC in file:line:func" spelling
    m = found[3]
    assert (m.file, m.line, m.kernel, m.size) == (MINIMAL_PY, 63,
                                                  "kernel_cutlass_kernel_Minimal_0", 16)
    assert san.parse_summary(text("synthetic_memcheck_oob.txt")) == {"errors": 4}


def test_parse_text_synccheck_and_initcheck():
    sync = san.parse_text(text("synthetic_synccheck_divergent.txt"), "synccheck")
    assert [(f.kind, f.line, f.threads) for f in sync] == [
        ("BARRIER_MISUSE", 29, ((0, 0, 0),)), ("BARRIER_MISUSE", 29, ((32, 0, 0),))]
    assert san.classify(sync, "synccheck") == "SYNC_ERROR"
    init = san.parse_text(text("synthetic_initcheck_uninit.txt"), "initcheck")
    assert [(f.kind, f.line, f.size, f.address_space) for f in init] == [
        ("UNINIT_READ", 28, 4, "global")]
    assert san.classify(init, "initcheck") == "UNINIT"


def test_application_output_between_reports_is_ignored():
    found = san.parse_text(text("synthetic_initcheck_uninit.txt"), "initcheck")
    assert all("launched" not in f.text for f in found)


# ---- cross-check of XML against the summary line ----------------------------------------
def test_crosscheck_flags_lost_records():
    found = san.parse_xml(xml("synthetic_memcheck_oob.xml"), "memcheck")
    assert san.crosscheck(found, "========= ERROR SUMMARY: 2 errors\n", "memcheck") == []
    lost = san.crosscheck(found, "========= ERROR SUMMARY: 5 errors\n", "memcheck")
    assert [f.kind for f in lost] == ["PARSE_FAILURE"]
    assert "5 error(s)" in lost[0].text and "2 record(s)" in lost[0].text
    # over the print limit the XML holds fewer records than the summary counts: expected
    assert san.crosscheck(found, "ERROR SUMMARY: 5000 errors", "memcheck", print_limit=2) == []
    # no summary (e.g. killed run): nothing to compare
    assert san.crosscheck(found, "", "memcheck") == []


def test_crosscheck_racecheck_summary_with_no_records():
    summary = "========= RACECHECK SUMMARY: 3 hazards displayed (3 errors, 0 warnings)\n"
    assert [f.kind for f in san.crosscheck([], summary, "racecheck")] == ["PARSE_FAILURE"]
    found = san.parse_xml(xml("synthetic_racecheck_raw.xml"), "racecheck")
    assert san.crosscheck(found, summary, "racecheck") == []


def test_analyze_falls_back_to_text_when_xml_unreadable(tmp_path):
    found = san.analyze("memcheck", tmp_path / "absent.xml", text("synthetic_memcheck_oob.txt"))
    kinds = [f.kind for f in found]
    assert kinds.count("INVALID_GLOBAL_WRITE") == 2
    failure = [f for f in found if f.kind == "PARSE_FAILURE"]
    assert len(failure) == 1 and failure[0].severity == "info"  # kept visible, not the verdict
    assert san.classify(found, "memcheck") == "MEMORY_ERROR"


def test_analyze_adds_crosscheck_failure():
    found = san.analyze("memcheck", xml("synthetic_memcheck_oob.xml"),
                        "========= ERROR SUMMARY: 9 errors")
    assert [f.kind for f in found] == ["INVALID_GLOBAL_WRITE"] * 2 + ["PARSE_FAILURE"]


# ---- noise -------------------------------------------------------------------------------
def test_proc_address_probing_filtered_with_reason_real_api_error_kept():
    found = san.parse_xml(xml("synthetic_api_noise.xml"), "memcheck")
    kept, filtered = san.filter_noise(found)
    assert [f.api for f in kept] == ["cuStreamSynchronize"]
    assert len(filtered) == 3
    assert {f.noise_reason for f in filtered} == {san.NOISE_PROC_ADDRESS}
    assert all(f.noise_reason is None for f in kept)
    only_noise = found[:3]
    kept, _ = san.filter_noise(only_noise)
    assert san.classify(kept, "memcheck") == "CLEAN"


def test_racecheck_analysis_record_dropped_when_hazards_cover_it():
    found = san.parse_text(text("synthetic_racecheck_raw.txt"), "racecheck")
    kept, filtered = san.filter_noise(found, read_source=read_here)
    assert [f.kind for f in filtered] == ["RACE"]
    assert filtered[0].noise_reason == san.NOISE_ANALYSIS_DUP
    assert [f.kind for f in kept] == ["RAW_HAZARD", "WAW_HAZARD"]
    # an analysis record alone (racecheck-report analysis) is the finding itself
    kept, filtered = san.filter_noise(found[:1], read_source=read_here)
    assert [f.kind for f in kept] == ["RACE"] and filtered == []


def test_tma_hazard_filtered_by_source_line(tmp_path):
    kernel = tmp_path / "k.py"
    kernel.write_text("x = 1\ncute.copy(tma_atom, tAgA[None, k], tAsA[None, s], tma_bar_ptr=b)\n"
                      "acc = sA[i]\n")
    tma = finding(kind="WAR_HAZARD", lines=((str(kernel), 2), (str(kernel), 3)))
    plain = finding(kind="RAW_HAZARD", lines=((str(kernel), 1), (str(kernel), 3)))
    kept, filtered = san.filter_noise([tma, plain])
    assert kept == [plain]
    assert filtered == [replace(tma, noise_reason=san.NOISE_TMA)]
    kept, filtered = san.filter_noise([tma, plain], tma=False)
    assert kept == [tma, plain] and filtered == []


def test_racecheck_of_sample_race_is_not_taken_for_tma():
    found = san.parse_xml(xml("synthetic_racecheck_raw.xml"), "racecheck")
    kept, filtered = san.filter_noise(found, read_source=read_here)
    assert filtered == [] and len(kept) == 3


# ---- grouping and classification ---------------------------------------------------------
def test_group_merges_same_kind_and_lines():
    found = san.parse_xml(xml("synthetic_racecheck_raw.xml"), "racecheck")
    groups = san.group(found)
    assert [(g.kind, g.severity, g.count, g.records) for g in groups] == [
        ("RAW_HAZARD", "error", 2, 2), ("WAW_HAZARD", "warning", 1, 1)]
    raw = groups[0]
    assert raw.lines == ((RACE_PY, 28), (RACE_PY, 31))
    assert raw.threads == [(65, 0, 0), (33, 0, 0), (66, 0, 0), (34, 0, 0)]
    assert raw.blocks == [(0, 0, 0)]
    assert raw.accesses == ("Write", "Read")


def test_group_sums_counts_and_orders_errors_first():
    a = finding(count=5, severity="warning")
    b = finding(kind="WAR_HAZARD", count=2)
    c = finding(kind="WAR_HAZARD", count=3)
    d = finding(lines=((RACE_PY, 40), (RACE_PY, 41)), count=1)
    groups = san.group([a, b, c, d])
    assert [(g.kind, g.lines[0][1], g.count) for g in groups] == [
        ("WAR_HAZARD", 28, 5), ("RAW_HAZARD", 40, 1), ("RAW_HAZARD", 28, 5)]


@pytest.mark.parametrize(("kinds", "tool", "expected"), [
    ([], "racecheck", "CLEAN"),
    (["RAW_HAZARD"], "racecheck", "RACE"),
    (["RACE"], "racecheck", "RACE"),
    (["INVALID_GLOBAL_WRITE"], "memcheck", "MEMORY_ERROR"),
    (["INVALID_SHARED_READ"], "memcheck", "MEMORY_ERROR"),
    (["MISALIGNED"], "memcheck", "MEMORY_ERROR"),
    (["HARDWARE_EXCEPTION"], "memcheck", "MEMORY_ERROR"),
    (["BARRIER_MISUSE"], "synccheck", "SYNC_ERROR"),
    (["UNINIT_READ"], "initcheck", "UNINIT"),
    (["API_ERROR"], "memcheck", "API_ERROR"),
    (["PARSE_FAILURE"], "initcheck", "UNREADABLE"),
    (["TOOL_ERROR"], "memcheck", "UNREADABLE"),
    (["UNKNOWN"], "synccheck", "SYNC_ERROR"),
    (["PARSE_FAILURE", "API_ERROR", "INVALID_GLOBAL_READ"], "memcheck", "MEMORY_ERROR"),
    # the tool's own class wins over a side finding
    (["INVALID_GLOBAL_WRITE", "RAW_HAZARD"], "racecheck", "RACE"),
    (["API_ERROR", "UNINIT_READ"], "racecheck", "UNINIT"),
])
def test_classify_table(kinds, tool, expected):
    found = [finding(kind=k, tool=tool) for k in kinds]
    assert san.classify(found, tool) == expected
    assert expected in san.CLASSES


def test_text_kinds():
    cases = {
        "Invalid __shared__ read of size 8 bytes": "INVALID_SHARED_READ",
        "Invalid __local__ write of size 4 bytes": "INVALID_LOCAL_WRITE",
        "Invalid __global__ atomic of size 4 bytes": "INVALID_GLOBAL_ATOMIC",
        "Warp Illegal Address": "HARDWARE_EXCEPTION",
        "Warp Misaligned Address": "MISALIGNED",
        "Barrier error detected. Invalid arguments": "BARRIER_MISUSE",
        "Leaked 1024 bytes at 0x7f0000000000": "LEAK",
        "Internal Sanitizer Error: The Sanitizer failed to initialize": "TOOL_ERROR",
        "Something new the tool says": "UNKNOWN",
    }
    for message, kind in cases.items():
        assert san._kind_from_text("memcheck", message) == kind, message


# ---- source lines and report -------------------------------------------------------------
def test_source_line_local_foreign_and_missing(tmp_path):
    f = tmp_path / "k.py"
    f.write_text("a = 1\n    b = x[i]  # load\n")
    assert san.source_line(str(f), 2) == "b = x[i]  # load"
    assert san.source_line(str(f), 3) is None
    assert san.source_line(str(tmp_path / "nope.py"), 1) is None
    assert san.source_line(None, 1) is None and san.source_line(str(f), None) is None
    line = marker_line(SAMPLES / "race_smem.py", "RACE_WRITE")
    assert read_here(RACE_PY, line).endswith("# RACE_WRITE")  # foreign path, mapped here


def test_make_result_and_markdown():
    findings = (san.parse_xml(xml("synthetic_racecheck_raw.xml"), "racecheck")
                + san.parse_xml(xml("synthetic_api_noise.xml"), "racecheck")[:2])
    cmd = san.build_command("racecheck", ["python", "-m", "cutedebug.worker", "r.json"],
                            "/tmp/r.xml", sanitizer="compute-sanitizer")
    result = san.make_result("racecheck", cmd, findings, env=san.child_env("racecheck"),
                             exit_code=86, sanitizer_seconds=12.0, plain_seconds=1.5,
                             xml_path="/tmp/r.xml", read_source=read_here)
    assert json.loads(json.dumps(result)) == result  # JSON-able as is
    assert result["verdict"] == "RACE"
    assert result["slowdown"] == pytest.approx(8.0)
    assert result["filtered"] == [{"reason": san.NOISE_PROC_ADDRESS, "count": 2}]
    g = result["groups"][0]
    write_line = marker_line(SAMPLES / "race_smem.py", "RACE_WRITE")
    assert g["kind"] == "RAW_HAZARD" and g["count"] == 2
    assert g["lines"][0]["source"] == read_here(RACE_PY, write_line)
    assert result["reproduce"].startswith("CUTE_DSL_LINEINFO=1 compute-sanitizer --tool racecheck")

    md = san.render_markdown(result)
    tldr = next(ln for ln in md.splitlines() if ln.startswith("**TL;DR**"))
    assert "racecheck → **RACE**" in tldr
    assert "RAW_HAZARD at race_smem.py:28 / race_smem.py:31" in tldr
    assert "2×" in tldr and "# RACE_WRITE" in tldr
    assert "## Noise filtered" in md and "2 × cuda-bindings probes" in md
    assert result["reproduce"] in md
    assert "slowdown 8.0×" in md and "exit code 86" in md
    assert "Write at" in md and "Read at" in md
    assert md.index("## Findings") < md.index("## Noise filtered") < md.index("## Reproduce")


def test_markdown_clean_run():
    result = san.make_result("memcheck", ["cs", "w"], [], sanitizer_seconds=3.0)
    md = san.render_markdown(result)
    assert result["verdict"] == "CLEAN"
    assert "no findings after noise filtering" in md and "- none" in md


# ---- shrink ------------------------------------------------------------------------------
OOB = (MINIMAL_PY, 64)


def oob_at(line=64, kind="INVALID_GLOBAL_WRITE"):
    return finding(kind=kind, tool="memcheck", lines=((MINIMAL_PY, line),))


class FakeRun:
    """memcheck over a kernel whose OOB store shows up for n >= threshold; below that a
    different finding (another line) appears, which must not count as the same."""

    def __init__(self, threshold: int, other_below: int | None = None,
                 broken=lambda p: False):
        self.threshold, self.other_below, self.broken = threshold, other_below, broken
        self.calls: list[dict] = []

    def __call__(self, params):
        self.calls.append(dict(params))
        if self.broken(params):
            raise RuntimeError("size rejected by the kernel")
        if params["n"] >= self.threshold:
            return [oob_at(), oob_at()]
        if self.other_below is not None and params["n"] >= self.other_below:
            return [oob_at(line=70)]
        return []


def assert_no_rerun(calls):
    keys = [tuple(sorted(c.items())) for c in calls]
    assert len(keys) == len(set(keys)), "a candidate was run twice"


def test_shrink_finds_threshold_without_rerunning():
    run = FakeRun(threshold=37)
    ticks = iter(range(1000))
    res = san.shrink({"n": 1 << 20, "stages": 4}, ("n",), run, clock=lambda: next(ticks))
    assert res.shrunk == {"n": 37, "stages": 4}
    assert res.original == {"n": 1 << 20, "stages": 4}
    assert res.signature == ("INVALID_GLOBAL_WRITE", (OOB,))
    assert_no_rerun(run.calls)
    assert len(res.runs) == len(run.calls)
    assert res.original_seconds == 1 and res.shrunk_seconds == 1
    assert json.loads(json.dumps(res.to_dict()))["shrunk"]["n"] == 37


def test_shrink_keeps_the_same_signature_not_any_finding():
    run = FakeRun(threshold=100, other_below=1)  # below 100 only line 70 is reported
    res = san.shrink({"n": 4096}, ("n",), run)
    assert res.shrunk["n"] == 100
    assert_no_rerun(run.calls)
    for r in res.runs:
        assert r["reproduced"] == (r["params"]["n"] >= 100)


def test_shrink_several_params_and_broken_candidates():
    def run(p):
        calls.append(dict(p))
        if p["n"] % 2:
            raise ValueError("n must be even")
        return [oob_at()] if p["n"] >= 10 and p["m"] >= 3 else []

    calls: list[dict] = []
    res = san.shrink({"n": 256, "m": 64, "flag": True}, ("n", "m", "flag"), run)
    assert res.shrunk == {"n": 10, "m": 3, "flag": True}
    assert_no_rerun(calls)
    errors = [r for r in res.runs if "error" in r]
    assert errors and all(not r["reproduced"] for r in errors)


def test_shrink_explicit_target_and_original_must_reproduce():
    run = FakeRun(threshold=50)
    with pytest.raises(ValueError, match="do not reproduce"):
        san.shrink({"n": 10}, ("n",), run)
    res = san.shrink({"n": 64}, ("n",), FakeRun(threshold=50),
                     target=("INVALID_GLOBAL_WRITE", (OOB,)))
    assert res.shrunk["n"] == 50


def test_shrink_ignores_noise_when_choosing_target():
    noise = finding(kind="API_ERROR", tool="memcheck", lines=((None, None),),
                    api="cuGetProcAddress_v2")

    def run(p):
        return [noise] + ([oob_at()] if p["n"] >= 5 else [])

    res = san.shrink({"n": 40}, ("n",), run)
    assert res.signature == ("INVALID_GLOBAL_WRITE", (OOB,)) and res.shrunk["n"] == 5


@settings(max_examples=60, deadline=None)
@given(start=st.integers(1, 1 << 16), data=st.data())
def test_shrink_property_monotone_threshold(start, data):
    threshold = data.draw(st.integers(1, start))
    run = FakeRun(threshold=threshold)
    res = san.shrink({"n": start}, ("n",), run, max_runs=200)
    assert res.shrunk["n"] == threshold
    assert_no_rerun(run.calls)
    assert len(run.calls) <= 2 * start.bit_length() + 2


# ---- real captures from the H200 (tests/data/sanitizer/h200/) ----------------------------
# Expected class per capture case of tools/capture_sanitizer_samples.sh.
REAL_EXPECTED = {
    "racecheck_raw": "RACE",
    "racecheck_clean": "CLEAN",
    "memcheck_oob": "MEMORY_ERROR",
    "memcheck_oob_cached": "CLEAN",  # REFERENCE.md: caching hides the OOB store
    "memcheck_clean": "CLEAN",
    "memcheck_api_noise": "CLEAN",  # only after filtering
    "synccheck_divergent_warp": "SYNC_ERROR",
    "synccheck_divergent_block": "SYNC_ERROR",
    "synccheck_clean": "CLEAN",
    "initcheck_uninit": "UNINIT",
    "initcheck_clean": "CLEAN",
}
REAL_CASES = sorted(p.stem for p in H200.glob("*.xml")) if H200.is_dir() else []


def tool_of(case: str) -> str:
    return case.split("_", 1)[0]


@pytest.mark.skipif(not REAL_CASES, reason="no H200 captures in tests/data/sanitizer/h200 yet")
@pytest.mark.parametrize("case", REAL_CASES)
def test_real_capture_classifies_as_expected(case):
    tool = tool_of(case)
    stdout = (H200 / f"{case}.txt").read_text(errors="replace")
    found = san.analyze(tool, H200 / f"{case}.xml", stdout)
    assert not [f for f in found if f.kind == "PARSE_FAILURE"], [f.text for f in found]
    kept, filtered = san.filter_noise(found, read_source=read_here)
    if case in REAL_EXPECTED:
        assert san.classify(kept, tool) == REAL_EXPECTED[case]
    if case == "memcheck_api_noise":
        assert filtered and {f.noise_reason for f in filtered} == {san.NOISE_PROC_ADDRESS}
    text_run = H200 / f"{case}.text.txt"
    if text_run.exists():  # the text report agrees with the XML on kinds and lines
        from_text = san.parse_text(text_run.read_text(errors="replace"), tool)
        kept_text, _ = san.filter_noise(from_text, read_source=read_here)
        assert {g.lines for g in san.group(kept_text) if g.kind != "RACE"} >= {
            g.lines for g in san.group(kept) if g.kind != "RACE"}


@pytest.mark.skipif(not REAL_CASES, reason="no H200 captures in tests/data/sanitizer/h200 yet")
@pytest.mark.parametrize(("case", "program", "markers"), [
    ("racecheck_raw", "race_smem.py", ("RACE_WRITE", "RACE_READ")),
    ("initcheck_uninit", "uninit_read.py", ("UNINIT_LOAD",)),
    ("synccheck_divergent_warp", "divergent_barrier.py", ("DIVERGENT_BARRIER",)),
])
def test_real_capture_points_at_the_sample_lines(case, program, markers):
    if case not in REAL_CASES:
        pytest.skip(f"{case} not captured")
    tool = tool_of(case)
    found = san.analyze(tool, H200 / f"{case}.xml", (H200 / f"{case}.txt").read_text())
    kept, _ = san.filter_noise(found, read_source=read_here)
    lines = {ln for f in kept for path, ln in f.lines if path and path.endswith(program)}
    src = SAMPLES / program
    wanted = {marker_line(src, m) for m in markers} | (
        {i for i, t in enumerate(src.read_text().splitlines(), 1) if "# DIVERGENT_BARRIER" in t}
        if "DIVERGENT_BARRIER" in markers else set())
    assert lines & wanted, (lines, wanted)


@pytest.mark.skipif(not (H200 / "memcheck_oob.xml").exists(), reason="no H200 capture")
def test_real_memcheck_oob_points_at_minimal_store_line():
    found = san.analyze("memcheck", H200 / "memcheck_oob.xml",
                        (H200 / "memcheck_oob.txt").read_text())
    writes = [f for f in found if f.kind == "INVALID_GLOBAL_WRITE"]
    assert writes
    minimal = (REPO / "kernels" / "minimal.py").read_text().splitlines()
    store = next(i for i, t in enumerate(minimal, 1) if re.search(r"y\[i \+ self\.oob", t))
    assert {(os.path.basename(f.file or ""), f.line) for f in writes} == {("minimal.py", store)}
    assert all(f.size == 4 for f in writes)


def test_markdown_reports_shrink_sizes_and_times():
    ticks = iter(range(0, 10_000, 3))
    res = san.shrink({"n": 4096}, ("n",), FakeRun(threshold=129), clock=lambda: next(ticks))
    found = [oob_at()]
    result = san.make_result("memcheck", ["cs", "w"], found, shrink_result=res)
    assert result["shrink"]["shrunk"] == {"n": 129}
    md = san.render_markdown(result)
    section = md[md.index("## Shrunk"):md.index("## Reproduce")]
    assert "original {'n': 4096} (3.0 s)" in section
    assert "shrunk {'n': 129} (3.0 s)" in section
    assert "same finding INVALID_GLOBAL_WRITE at minimal.py:64" in section
    assert f"{len(res.runs)} candidate run(s), none repeated" in section


def test_namespaced_xml_is_read_not_taken_for_empty():
    plain = (DATA / "synthetic_memcheck_oob.xml").read_text()
    namespaced = plain.replace("<ComputeSanitizerOutput>",
                               '<ComputeSanitizerOutput xmlns="urn:example:sanitizer">')
    assert san.parse_xml(namespaced, "memcheck") == san.parse_xml(plain, "memcheck")
