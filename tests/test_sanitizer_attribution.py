"""Sanitizer findings attributed per kernel: compute-sanitizer checks every kernel of the
process (the torch reference's too); only the kernel under test's findings make the verdict,
the others are counted apart and shown.

Real captures (tests/data/sanitizer/h200/, see its README) carry the CuTe kernel's symbol in
<func>; tests/data/sanitizer/synthetic_mixed_kernels.xml (hand-written, NOT tool output) mixes
one real race_smem hazard record with three hazards of a PyTorch flash-attention kernel
(no line info, as torch's own kernels have none).
"""

from __future__ import annotations

import re

from helpers.sanitize_runs import replayed_race, tool_report
from test_sanitizer import DATA, H200, MINIMAL_KERNEL, RACE_KERNEL, read_here

from cutedebug.analyses.sanitizer.attribution import attribute, is_launched_kernel
from cutedebug.analyses.sanitizer.findings import PARSE_FAILURE
from cutedebug.analyses.sanitizer.parse import parse_xml
from cutedebug.analyses.sanitizer.result import make_result
from cutedebug.analyses.sanitizer.triage import CLEAN
from cutedebug.engine.worker import ptx_entries
from cutedebug.reporting import sanitize as sanitize_report

MIXED = DATA / "synthetic_mixed_kernels.xml"
TORCH_FLASH = "void pytorch_flash::flash_fwd_kernel<"


def test_attribute_the_real_captures_by_their_kernel_name():
    oob = parse_xml(H200 / "memcheck_oob.xml", "memcheck")
    own, others = attribute(oob, [MINIMAL_KERNEL])
    assert (len(own), len(others)) == (64, 0)
    # the same records while another kernel was the one under test: all set apart
    own, others = attribute(oob, [RACE_KERNEL])
    assert (len(own), len(others)) == (0, 64)
    assert {f.kernel for f in others} == {MINIMAL_KERNEL}


def test_unknown_launched_kernels_set_nothing_apart():
    race = parse_xml(H200 / "racecheck_raw.xml", "racecheck")
    own, others = attribute(race, [])
    assert (len(own), others) == (513, [])


def test_findings_without_a_kernel_name_stay_with_the_run():
    noise = parse_xml(DATA / "synthetic_api_noise.xml", "memcheck")
    broken = parse_xml("<ComputeSanitizerOutput><record>", "racecheck")
    own, others = attribute(noise + broken, [RACE_KERNEL])
    assert others == [] and len(own) == len(noise) + len(broken)
    assert any(f.kind == PARSE_FAILURE for f in own)


def test_prefix_of_a_shortened_symbol_still_matches():
    assert is_launched_kernel(MINIMAL_KERNEL[:60], [MINIMAL_KERNEL])
    assert is_launched_kernel(MINIMAL_KERNEL, [MINIMAL_KERNEL[:60]])
    assert not is_launched_kernel("kernel_cutlass", [MINIMAL_KERNEL])  # too short to tell
    assert not is_launched_kernel(None, [MINIMAL_KERNEL])


def test_mixed_capture_verdict_from_the_kernel_under_test_only():
    findings = parse_xml(MIXED, "racecheck")
    assert len(findings) == 4
    res = make_result(
        "racecheck",
        ["compute-sanitizer"],
        findings,
        read_source=read_here,
        kernel_names=[RACE_KERNEL],
    ).to_json()
    assert res["verdict"] == "RACE"
    (g,) = res["groups"]
    assert (g["kind"], g["count"], g["kernel"]) == ("RAW_HAZARD", 1, RACE_KERNEL)
    (other,) = res["other_kernels"]
    assert other["kernel"].startswith(TORCH_FLASH)
    assert (other["class"], other["records"], other["count"]) == ("RACE", 3, 3)
    assert [(g["kind"], g["count"]) for g in other["groups"]] == [
        ("WAR_HAZARD", 2),
        ("RAW_HAZARD", 1),
    ]


def test_mixed_capture_clean_kernel_is_clean_with_the_others_shown():
    findings = parse_xml(MIXED, "racecheck")
    res = make_result(
        "racecheck",
        ["compute-sanitizer"],
        findings,
        read_source=read_here,
        kernel_names=[MINIMAL_KERNEL],
    )
    assert res.verdict == CLEAN and res.groups == []
    counts = {k.kernel[:24]: k.count for k in res.other_kernels}
    assert counts == {RACE_KERNEL[:24]: 1, TORCH_FLASH[:24]: 3}
    md = sanitize_report.render_markdown(res)
    assert "**TL;DR** racecheck → **CLEAN**" in md
    assert "Other kernels of the process: 4 finding(s) in 2 kernel(s)" in md
    assert "## Other kernels of the process (not the kernel under test; not the verdict)" in md
    assert re.search(r"- `void pytorch_flash::flash_fwd_kernel<.*\.\.\.`: RACE, 3 \(3 record", md)


def test_ptx_entries_are_the_symbols_the_sanitizer_reports():
    ptx = (
        ".version 8.5\n.target sm_90a\n.visible .entry " + MINIMAL_KERNEL + "(\n"
        ".param .u64 p0\n)\n{\nret;\n}\n.visible .entry kernel_cutlass_second_0()\n{ret;}\n"
    )
    assert ptx_entries(ptx) == [MINIMAL_KERNEL, "kernel_cutlass_second_0"]
    assert ptx_entries("") == []


def test_sanitize_end_to_end_other_kernels_race_is_not_the_verdict(fake_sanitizer, tmp_path):
    # the captured race, replayed while the worker says it launched the minimal kernel only
    r = replayed_race(fake_sanitizer, tmp_path / "runs", expect="PASS", kernels=[MINIMAL_KERNEL])
    summary, md, res = tool_report(r, "racecheck")
    assert (res["verdict"], res["records"], res["other_kernel_records"]) == ("CLEAN", 0, 513)
    assert res["kernel_names"] == [MINIMAL_KERNEL]
    (other,) = res["other_kernels"]
    assert (other["kernel"], other["class"], other["count"]) == (RACE_KERNEL, "RACE", 512)
    assert "| racecheck | CLEAN | - | RACE ×512 in 1 kernel(s) |" in md


def test_sanitize_end_to_end_own_kernel_race_is_the_verdict(fake_sanitizer, tmp_path):
    kernels = [MINIMAL_KERNEL, RACE_KERNEL]
    r = replayed_race(fake_sanitizer, tmp_path / "runs", expect="RACE", kernels=kernels)
    summary, _, res = tool_report(r, "racecheck")
    assert (res["verdict"], res["records"], res["other_kernels"]) == ("RACE", 513, [])
