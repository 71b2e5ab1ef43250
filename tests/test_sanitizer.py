"""cutedebug.analyses.sanitizer on CPU: command, parsing of the real H200 captures (exact findings),
noise, grouping, classification, report, shrink, and `cutedebug sanitize` end to end through a
fake compute-sanitizer that replays those captures (tests/helpers/fake_compute_sanitizer.py).

Captures: tests/data/sanitizer/h200/ (compute-sanitizer 2025.3.1, driver 580, H200, CuTe DSL
4.8.1; see versions.txt and manifest.tsv). Paths inside them are the GPU machine's checkout
(GPU_CHECKOUT); source lines are read from this checkout through source_line's suffix mapping.
Synthetic fixtures (synthetic_*) remain only for shapes no capture has.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import psutil
import pytest
from helpers.h200_captures import captures
from helpers.sanitize_runs import (
    SCEN,
    cutedebug_sanitize,
    fake_env,
    replayed_oob_store,
    replayed_race,
    report,
    sanitize_tool,
    tool_report,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from cutedebug.analyses.sanitizer.findings import Finding, Site, source_line
from cutedebug.analyses.sanitizer.parse import (
    _kind_from_text,
    analyze,
    crosscheck,
    parse_summary,
    parse_text,
    parse_xml,
)
from cutedebug.analyses.sanitizer.result import ToolResult, make_result
from cutedebug.analyses.sanitizer.shrink import shrink
from cutedebug.analyses.sanitizer.tool import (
    DEFAULT_PRINT_LIMIT,
    ERROR_EXITCODE,
    TOOLS,
    build_command,
    child_env,
    find_sanitizer,
)
from cutedebug.analyses.sanitizer.triage import (
    CLASSES,
    CLEAN,
    NOISE_ANALYSIS_DUP,
    NOISE_PROC_ADDRESS,
    NOISE_TMA,
    classify,
    enclosing_def,
    filter_noise,
    group,
)
from cutedebug.commands import sanitize as cmd
from cutedebug.reporting import sanitize as sanitize_report

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "sanitizer"
H200 = captures()  # DATA / "h200", its .gz captures unpacked
SAMPLES = REPO / "tools" / "sanitizer_samples"
GPU_CHECKOUT = "/work/main"  # where the captures were made
RACE_PY = f"{GPU_CHECKOUT}/tools/sanitizer_samples/race_smem.py"
UNINIT_PY = f"{GPU_CHECKOUT}/tools/sanitizer_samples/uninit_read.py"
MINIMAL_PY = f"{GPU_CHECKOUT}/kernels/minimal.py"
RACE_KERNEL = (
    "kernel_cutlass_race_kernel_tensorptrf32gmemalign16o1281_tensorptrf32gmemalign16o1281_False_0"
)
MINIMAL_KERNEL = (
    "kernel_cutlass_kernel_cutedebug_kernel_minimalMinimal_object_at__"
    "tensorptrf32gmemalign16o40961_tensorptrf32gmemalign16o40961_0"
)
UNINIT_KERNEL = (
    "kernel_cutlass_uninit_kernel_tensorptrf32gmemalign16o1281_tensorptrf32gmemalign16o1281_0"
)


def read_here(file, line):
    return source_line(file, line, roots=(REPO, SAMPLES, REPO / "kernels"))


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


def finding(
    kind="RAW_HAZARD", lines=((RACE_PY, 28), (RACE_PY, 31)), tool="racecheck", **kw
) -> Finding:
    sites = tuple(Site(f, ln) for f, ln in lines)
    base = {
        "tool": tool,
        "kind": kind,
        "severity": "error",
        "kernel": "k",
        "file": sites[0].file,
        "line": sites[0].line,
        "sites": sites,
    }
    return Finding(**(base | kw))


# ---- command and environment --------------------------------------------------------------
def test_build_command_racecheck_wraps_worker_argv_last():
    worker = [sys.executable, "-m", "cutedebug.engine.worker", "/tmp/req.json"]
    cmd = build_command("racecheck", worker, "/tmp/out.xml", sanitizer="/cs")
    assert cmd[0] == "/cs"
    assert cmd[-4:] == worker
    opts = cmd[1:-4]
    pairs = dict(itertools.pairwise(opts))
    assert pairs["--tool"] == "racecheck"
    assert opts[opts.index("--xml") + 1] == "--save"
    assert pairs["--save"] == "/tmp/out.xml"
    assert pairs["--report-api-errors"] == "no"
    assert pairs["--error-exitcode"] == str(ERROR_EXITCODE)
    assert pairs["--print-limit"] == str(DEFAULT_PRINT_LIMIT)
    assert pairs["--racecheck-report"] == "all"
    assert "--racecheck-deadlock-timeout" not in opts


def test_build_command_tool_specific_options():
    mem = build_command("memcheck", ["w"], "x.xml", sanitizer="cs", report_api_errors=True)
    assert "--racecheck-report" not in mem
    assert mem[mem.index("--report-api-errors") + 1] == "all"
    race = build_command("racecheck", ["w"], "x.xml", sanitizer="cs", deadlock_timeout_s=20)
    assert race[race.index("--racecheck-deadlock-timeout") + 1] == "20"
    with pytest.raises(ValueError, match="unknown sanitizer tool"):
        build_command("leakcheck", ["w"], "x.xml", sanitizer="cs")


def test_child_env_turns_caching_off_where_it_hides_errors():
    for tool in TOOLS:
        assert child_env(tool)["CUTE_DSL_LINEINFO"] == "1"
    assert child_env("memcheck")["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
    assert child_env("initcheck")["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" not in child_env("racecheck")


def test_find_sanitizer_env_override_then_path(tmp_path, monkeypatch):
    tool = tmp_path / "bin" / "compute-sanitizer"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("COMPUTE_SANITIZER", str(tool))
    assert find_sanitizer() == str(tool)
    monkeypatch.delenv("COMPUTE_SANITIZER")
    monkeypatch.setenv("PATH", str(tool.parent))
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        monkeypatch.delenv(var, raising=False)
    assert find_sanitizer() == str(tool)
    tool.chmod(0o644)  # not executable: not a sanitizer
    found = find_sanitizer()
    assert found != str(tool)


def test_module_imports_without_torch_or_cutlass():
    code = (
        "import sys, cutedebug.analyses.sanitizer; "
        "bad = [m for m in ('torch', 'cutlass') if m in sys.modules]; "
        "sys.exit(1 if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_cli_command_prints_argv_and_text_only_variant():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cutedebug.analyses.sanitizer",
            "command",
            "memcheck",
            "-",
            "--",
            "python",
            "prog.py",
            "--flag",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert "--xml" not in out and "--save" not in out
    assert out[-3:] == ["python", "prog.py", "--flag"]
    assert out[out.index("--tool") + 1] == "memcheck"


# ---- the captures: what they are -------------------------------------------------------------
def h200_case(case: str) -> tuple[list[Finding], str]:
    """Findings of a capture's XML and the stdout of that same --xml run."""
    tool = case.split("_", 1)[0]
    return (
        parse_xml(H200 / f"{case}.xml", tool),
        (H200 / f"{case}.txt").read_text(errors="replace"),
    )


def manifest() -> dict[tuple[str, str], int]:
    rows = (H200 / "manifest.tsv").read_text().splitlines()[1:]
    return {(c, m): int(code) for c, _t, m, code, _s in (r.split("\t") for r in rows)}


CASES = sorted(p.stem for p in H200.glob("*.xml"))
# captures whose records differ between the --xml run and the text-only run (timing)
RUN_DEPENDENT_CAPTURES = {"synccheck_extra_release"}
CLEAN_CASES = [
    "initcheck_clean",
    "memcheck_clean",
    "memcheck_oob_cached",
    "racecheck_clean",
    "synccheck_clean",
    "synccheck_divergent_block",
    "synccheck_divergent_warp",
]


def test_capture_set_and_exit_codes():
    assert CASES == sorted(
        CLEAN_CASES
        + [
            "initcheck_uninit",
            "memcheck_api_noise",
            "memcheck_oob",
            "racecheck_raw",
            "synccheck_extra_release",
        ]
    )
    codes = manifest()
    found_errors = {
        "racecheck_raw",
        "memcheck_oob",
        "initcheck_uninit",
        "memcheck_api_noise",
        "synccheck_extra_release",
        "synccheck_unfenced_init",
    }
    for case in [*CASES, "synccheck_unfenced_init"]:
        for mode in ("xml", "text"):
            assert codes[(case, mode)] == (ERROR_EXITCODE if case in found_errors else 0)
    assert {
        codes[(f"plain_{p}", "plain")]
        for p in ("race_smem", "oob_store", "uninit_read", "divergent_barrier")
    } == {0}
    assert "Version 2025.3.1.0" in (H200 / "versions.txt").read_text()


@pytest.mark.parametrize("case", CASES)
def test_every_flag_we_emit_was_accepted(case):
    """The .cmd lines are build_command's argv; the tool complained about none of them."""
    out = (H200 / f"{case}.txt").read_text() + (H200 / f"{case}.text.txt").read_text()
    assert not re.search(r"unrecognized|unknown option|invalid option|usage:", out, re.IGNORECASE)
    xml_cmd, _text_cmd = (H200 / f"{case}.cmd").read_text().splitlines()
    tool = case.split("_", 1)[0]
    built = build_command(
        tool,
        ["W"],
        re.search(r"--save (\S+)", xml_cmd).group(1),
        sanitizer="/usr/local/cuda/bin/compute-sanitizer",
        report_api_errors=case == "memcheck_api_noise",
    )
    assert " ".join(built[:-1]) in xml_cmd


@pytest.mark.parametrize("case", CASES)
def test_xml_run_still_prints_the_text_report(case):
    """--xml --save does not silence stdout: same records as the text-only run."""

    def records(name):
        text = (H200 / name).read_text()
        return [
            re.sub(r"0x7f[0-9a-f]+", "ADDR", ln)
            for ln in text.splitlines()
            if ln.startswith("=========")
        ]

    xml_run, text_run = records(f"{case}.txt"), records(f"{case}.text.txt")
    if case in RUN_DEPENDENT_CAPTURES:
        # which threads reach the bad arrive before the kernel faults differs run to run:
        # the same distinct report lines, thread/block lines and the summary aside
        def shape(lines):
            return {ln for ln in lines if "by thread" not in ln and "SUMMARY" not in ln}

        assert shape(xml_run) == shape(text_run)
        assert len(xml_run) != len(text_run)  # 61 vs 59 records: really two different runs
    else:
        assert xml_run == text_run


# ---- racecheck: RAW hazard of race_smem.py (no barrier between smem write and read) -------
def test_real_racecheck_raw_xml_exact():
    found, _ = h200_case("racecheck_raw")
    write, read = (marker_line(SAMPLES / "race_smem.py", m) for m in ("RACE_WRITE", "RACE_READ"))
    assert (write, read) == (28, 31)
    hazards, analysis = found[:-1], found[-1]
    assert len(hazards) == 512
    # each thread w writes buf[w]; thread w-32 reads it: 128 pairs x 4 bytes, one record per byte
    pairs = {}
    for f in hazards:
        assert (f.tool, f.kind, f.severity, f.kernel) == (
            "racecheck",
            "RAW_HAZARD",
            "error",
            RACE_KERNEL,
        )
        (w,), (r,) = f.sites[0].thread[:1], f.sites[1].thread[:1]
        assert f.sites == (
            Site(RACE_PY, write, RACE_KERNEL, "Write", (w, 0, 0)),
            Site(RACE_PY, read, RACE_KERNEL, "Read", (r, 0, 0)),
        )
        assert (f.file, f.line) == (RACE_PY, write)
        assert f.threads == ((w, 0, 0), (r, 0, 0))
        assert f.blocks == ((0, 0, 0),)
        assert (f.address_space, f.size, f.count, f.noise_reason) == ("shared", None, 1, None)
        assert r == (w - 32) % 128
        pairs[(w, r)] = pairs.get((w, r), 0) + 1
    assert len(pairs) == 128 and set(pairs.values()) == {4}
    assert sorted(int(f.address, 16) for f in hazards) == list(range(0x400, 0x600))
    assert hazards[0].threads == ((64, 0, 0), (32, 0, 0)) and hazards[0].address == "0x500"
    # the <kind>Analysis</kind> record: both sides, 512 hazards, no threads
    assert (analysis.kind, analysis.severity, analysis.count, analysis.text) == (
        "RACE",
        "error",
        512,
        "Race condition",
    )
    assert analysis.sites == (
        Site(RACE_PY, write, RACE_KERNEL, "Write"),
        Site(RACE_PY, read, RACE_KERNEL, "Read"),
    )
    assert analysis.threads == () and analysis.blocks == ()


def test_real_racecheck_raw_filtered_grouped_classified():
    found, stdout = h200_case("racecheck_raw")
    kept, filtered = filter_noise(found, read_source=read_here)
    assert [f.kind for f in filtered] == ["RACE"]
    assert filtered[0].noise_reason == NOISE_ANALYSIS_DUP
    assert len(kept) == 512
    (g,) = group(kept)
    assert (g.kind, g.severity, g.count, g.records) == ("RAW_HAZARD", "error", 512, 512)
    assert g.lines == ((RACE_PY, 28), (RACE_PY, 31))
    assert g.accesses == ("Write", "Read")
    assert g.threads == [(64, 0, 0), (32, 0, 0), (65, 0, 0), (33, 0, 0)]
    assert g.blocks == [(0, 0, 0)]
    assert classify(kept, "racecheck") == "RACE"
    assert parse_summary(stdout) == {"hazards": 513, "errors": 513, "warnings": 0}
    assert crosscheck(found, stdout, "racecheck") == []
    assert analyze("racecheck", H200 / "racecheck_raw.xml", stdout) == found


def test_real_racecheck_raw_text_agrees_with_xml():
    found, _ = h200_case("racecheck_raw")
    text = parse_text((H200 / "racecheck_raw.text.txt").read_text(), "racecheck")
    assert len(text) == 513

    # the text report names files by base name; kinds, lines, threads, blocks, addresses agree
    def key(f):
        return (
            f.kind,
            tuple((os.path.basename(s.file), s.line, s.access, s.thread) for s in f.sites),
            f.blocks,
            f.address,
            f.count,
            f.severity,
        )

    assert [key(f) for f in text[:-1]] == [key(f) for f in found[:-1]]
    race = text[-1]
    assert (race.kind, race.count) == ("RACE", 512)
    assert race.lines == (("race_smem.py", 28), ("race_smem.py", 31))
    kept, filtered = filter_noise(text, read_source=read_here)
    assert len(kept) == 512 and [f.noise_reason for f in filtered] == [NOISE_ANALYSIS_DUP]
    # a bare file name still maps to the source through the roots
    assert read_here("race_smem.py", 28).endswith("# RACE_WRITE")


# ---- memcheck: out-of-bounds store of kernels/minimal.py (oob_store switch, n=4096, +64) ----
def minimal_store_line() -> int:
    lines = (REPO / "kernels" / "minimal.py").read_text().splitlines()
    return next(i for i, t in enumerate(lines, 1) if re.search(r"y\[i \+ self\.oob", t))


def test_real_memcheck_oob_xml_exact():
    found, stdout = h200_case("memcheck_oob")
    store = minimal_store_line()
    assert store == 64
    assert len(found) == 64
    base = 0x7F7F3A808000  # 16 KiB past the output's start: its end
    for tid, f in zip(range(64, 128), found):
        assert f == Finding(
            tool="memcheck",
            kind="INVALID_GLOBAL_WRITE",
            severity="error",
            kernel=MINIMAL_KERNEL,
            file=MINIMAL_PY,
            line=store,
            threads=((tid, 0, 0),),
            blocks=((31, 0, 0),),
            address_space="global",
            size=4,
            count=1,
            text="Invalid __global__ write of size 4 bytes is out of bounds",
            sites=(Site(MINIMAL_PY, store, MINIMAL_KERNEL, None, (tid, 0, 0)),),
            address=hex(base + 4 * (tid - 64)),
        )
    kept, filtered = filter_noise(found, read_source=read_here)
    assert filtered == [] and classify(kept, "memcheck") == "MEMORY_ERROR"
    (g,) = group(kept)
    assert (g.kind, g.count, g.lines, g.size) == (
        "INVALID_GLOBAL_WRITE",
        64,
        ((MINIMAL_PY, 64),),
        4,
    )
    assert read_here(MINIMAL_PY, store).startswith("y[i + self.oob_offset] =")
    assert parse_summary(stdout) == {"errors": 64}
    assert crosscheck(found, stdout, "memcheck") == []


def test_real_memcheck_oob_text_exact():
    stdout = (H200 / "memcheck_oob.text.txt").read_text()
    found = parse_text(stdout, "memcheck")  # the app's torch traceback is not a record
    assert [
        (f.kind, f.file, f.line, f.threads, f.blocks, f.size, f.address_space) for f in found
    ] == [
        ("INVALID_GLOBAL_WRITE", "minimal.py", 64, ((t, 0, 0),), ((31, 0, 0),), 4, "global")
        for t in range(64, 128)
    ]
    assert all(f.kernel == MINIMAL_KERNEL for f in found)
    assert found[0].address == "0x7f0424808000"
    assert parse_summary(stdout) == {"errors": 64}


def test_caching_allocator_hides_the_oob_store():
    """The same program with the torch caching allocator on: memcheck sees 0 errors (the
    stray stores land inside a cached segment). child_env turns caching off for this."""
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING=1" in (H200 / "memcheck_oob.cmd").read_text()
    cached_cmd = (H200 / "memcheck_oob_cached.cmd").read_text()
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING=1" not in cached_cmd
    assert "oob_store.py" in cached_cmd and "--clean" not in cached_cmd
    found, stdout = h200_case("memcheck_oob_cached")
    assert found == [] and parse_summary(stdout) == {"errors": 0}
    assert child_env("memcheck")["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"


# ---- initcheck: uninit_read.py loads x before anything wrote it ------------------------------
def test_real_initcheck_uninit_exact():
    found, stdout = h200_case("initcheck_uninit")
    load = marker_line(SAMPLES / "uninit_read.py", "UNINIT_LOAD")
    assert load == 28 and len(found) == 128
    for f in found:
        tid = f.threads[0][0]
        assert f == Finding(
            tool="initcheck",
            kind="UNINIT_READ",
            severity="error",
            kernel=UNINIT_KERNEL,
            file=UNINIT_PY,
            line=load,
            threads=((tid, 0, 0),),
            blocks=((0, 0, 0),),
            address_space="global",
            size=4,
            count=1,
            text="Uninitialized __global__ memory read of size 4 bytes",
            sites=(Site(UNINIT_PY, load, UNINIT_KERNEL, None, (tid, 0, 0)),),
            address=f.address,
        )
        assert int(f.address, 16) - 0x7FEEB2800000 == 4 * tid  # x[tid]
    assert sorted(f.threads[0][0] for f in found) == list(range(128))
    assert classify(found, "initcheck") == "UNINIT"
    (g,) = group(found)
    assert (g.kind, g.count, g.lines) == ("UNINIT_READ", 128, ((UNINIT_PY, 28),))
    assert parse_summary(stdout) == {"errors": 128}
    text = parse_text((H200 / "initcheck_uninit.text.txt").read_text(), "initcheck")
    assert [(f.kind, f.line, f.threads, f.size) for f in text] == [
        (f.kind, f.line, f.threads, f.size) for f in found
    ]


# ---- API errors: cuda-bindings' cuGetProcAddress probing (--report-api-errors all) -----------
def test_real_api_noise_filtered_with_reason():
    found, stdout = h200_case("memcheck_api_noise")
    assert len(found) == 34
    text = (
        'Program hit CUDA_ERROR_INVALID_VALUE (error 1) due to "invalid argument" on CUDA '
        "API call to cuGetProcAddress_v2."
    )
    assert {(f.kind, f.api, f.file, f.line, f.text, f.severity) for f in found} == {
        ("API_ERROR", "cuGetProcAddress_v2", None, None, text, "error")
    }
    kept, filtered = filter_noise(found)
    assert kept == [] and len(filtered) == 34
    assert {f.noise_reason for f in filtered} == {NOISE_PROC_ADDRESS}
    assert classify(kept, "memcheck") == "CLEAN"
    # the error exit code fired on the noise alone: exit 86 is not "the kernel is broken"
    assert manifest()[("memcheck_api_noise", "xml")] == ERROR_EXITCODE
    assert parse_summary(stdout) == {"errors": 34}
    assert [f.api for f in parse_text(stdout, "memcheck")] == ["cuGetProcAddress_v2"] * 34
    result = make_result("memcheck", ["cs"], found)
    assert result.verdict == "CLEAN"
    assert result.to_json()["filtered"] == [{"reason": NOISE_PROC_ADDRESS, "count": 34}]
    assert sanitize_report.noise_cell(result) == "34 api-probing"


def test_synthetic_real_api_error_is_kept():
    """No capture has a non-probing API error; this synthetic file keeps one among noise."""
    found = parse_xml(xml("synthetic_api_noise.xml"), "memcheck")
    kept, filtered = filter_noise(found)
    assert [f.api for f in kept] == ["cuStreamSynchronize"]
    assert len(filtered) == 3 and {f.noise_reason for f in filtered} == {NOISE_PROC_ADDRESS}
    assert classify(kept, "memcheck") == "API_ERROR"


# ---- clean captures, and why synccheck reported nothing ----------------------------------------
@pytest.mark.parametrize("case", CLEAN_CASES)
def test_real_clean_captures_are_clean(case):
    tool = case.split("_", 1)[0]
    assert (H200 / f"{case}.xml").read_text().strip().endswith("<ComputeSanitizerOutput/>")
    found, stdout = h200_case(case)
    assert found == [] and parse_text(stdout, tool) == []
    summary = {"hazards": 0, "errors": 0, "warnings": 0} if tool == "racecheck" else {"errors": 0}
    assert parse_summary(stdout) == summary
    assert analyze(tool, H200 / f"{case}.xml", stdout) == []
    assert classify([], tool) == "CLEAN"


def test_divergent_barrier_captures_found_no_synccheck_error():
    """divergent_barrier.py --mode warp|block put sync_threads (bar.sync 0) under `if`. The
    lanes/warps that skip it go straight to their last store and exit (the PTX is
    `@p bra END; bar.sync 0; ...; END: st.global; ret;`), and on sm_70+ a CTA barrier waits
    only for threads that have not exited: the barrier completed, every output is 2.0, the
    run exited 0 and synccheck 2025.3.1 reported 0 errors. The real synccheck errors are the
    mbarrier ones of the tma_stream captures below."""
    for mode in ("warp", "block"):
        case = f"synccheck_divergent_{mode}"
        assert f"--mode {mode}" in (H200 / f"{case}.cmd").read_text()
        found, stdout = h200_case(case)
        assert found == [] and "ERROR SUMMARY: 0 errors" in stdout
        assert "divergent_barrier: launched; all outputs 2.0: True" in stdout
        assert manifest()[(case, "xml")] == 0
    assert (SAMPLES / "divergent_barrier.py").read_text().count("# DIVERGENT_BARRIER") == 2


# ---- synccheck: mbarrier misuse in tma_stream (cutedebug faults, scenario_run.py) ----------
TMA_STREAM_PY = f"{GPU_CHECKOUT}/kernels/tma_stream.py"


# The synccheck captures of tma_stream (versions.txt: "second capture", 2026-11-30 13:26Z) were
# recorded against kernels/tma_stream.py as of the commit that added them (unchanged since
# d5b120f); their line numbers are that revision's, not today's (the kernel has gained lines and
# a second consumer_release since). Expected lines are looked up in that revision's source.
TMA_STREAM_CAPTURE_REV = "f35089f7b4cc0fd2b01005bd534e20e9c2088b32"


def tma_stream_capture_source() -> str:
    """kernels/tma_stream.py as the tma_stream synccheck captures were made against: a copy of
    that revision (git show TMA_STREAM_CAPTURE_REV:kernels/tma_stream.py) kept beside the
    captures, so the tests need no git history (CI may check out a shallow clone)."""
    import gzip

    return gzip.decompress((H200 / "tma_stream_at_capture.py.gz").read_bytes()).decode()


def tma_stream_line(pattern: str) -> int:
    """The one line of the captured kernel revision that matches ``pattern``."""
    lines = tma_stream_capture_source().splitlines()
    (hit,) = [i for i, t in enumerate(lines, 1) if re.search(pattern, t)]
    return hit


def tma_stream_capture_text(line: int) -> str:
    return tma_stream_capture_source().splitlines()[line - 1].strip()


def gz_case(case: str) -> tuple[Path, str, str]:
    """A capture kept gzip-compressed (h200/gz/): its XML (unpacked), stdout, text-only run."""
    import gzip
    import tempfile

    gz = H200 / "gz"
    tmp = Path(tempfile.mkdtemp(prefix="cutedebug-gz-")) / f"{case}.xml"
    tmp.write_bytes(gzip.decompress((gz / f"{case}.xml.gz").read_bytes()))
    return (
        tmp,
        gzip.decompress((gz / f"{case}.txt.gz").read_bytes()).decode(),
        gzip.decompress((gz / f"{case}.text.txt.gz").read_bytes()).decode(),
    )


def test_real_synccheck_extra_release_exact():
    """tma_stream + extra_consumer_release: one consumer_release too many at iteration 0.
    synccheck reports "Barrier error / Missing wait" at the release line, from the signaling
    lane (lane 0) of each of the 4 consumer warps, in all 16 CTAs, then the kernel faults."""
    found, stdout = h200_case("synccheck_extra_release")
    release = tma_stream_line(r"^\s*ring\.consumer_release\(state\)")
    assert len(found) == 61
    for f in found:
        assert (f.tool, f.kind, f.severity, f.file, f.line) == (
            "synccheck",
            "BARRIER_MISUSE",
            "error",
            TMA_STREAM_PY,
            release,
        )
        assert f.text == "Barrier error: Missing wait" and f.count == 1
        assert f.sites == (Site(TMA_STREAM_PY, release, f.kernel, None, f.threads[0]),)
        assert f.threads[0] in {(0, 0, 0), (32, 0, 0), (64, 0, 0), (96, 0, 0)}
    assert {b for f in found for b in f.blocks} == {(b, 0, 0) for b in range(16)}
    assert found[0].threads == ((64, 0, 0),) and found[0].blocks == ((14, 0, 0),)
    assert parse_summary(stdout) == {"errors": 61}
    assert crosscheck(found, stdout, "synccheck") == []
    assert '"event": "cuda_error"' in stdout and "cudaErrorLaunchFailure" in stdout
    (g,) = group(found)
    assert (g.kind, g.count, g.lines) == ("BARRIER_MISUSE", 61, ((TMA_STREAM_PY, release),))
    assert classify(found, "synccheck") == "SYNC_ERROR"
    assert tma_stream_capture_text(release) == "ring.consumer_release(state)"
    # the text-only run (a separate run: 59 records that time) reads the same way
    text = parse_text((H200 / "synccheck_extra_release.text.txt").read_text(), "synccheck")
    assert len(text) == 59 and {(f.kind, f.file, f.line) for f in text} == {
        ("BARRIER_MISUSE", "tma_stream.py", release)
    }
    assert all(f.text.startswith("Barrier error detected. Missing wait.") for f in text)


def test_real_synccheck_unfenced_init_exact():
    """tma_stream + missing_init_fence (no fence.mbarrier_init, no CTA sync after init):
    synccheck reports "Barrier error / Missing init" at the TMA copy that signals the full
    barrier, for every lane of the producer warp (threads 128-159) of all 16 CTAs."""
    xml_path, stdout, text_only = gz_case("synccheck_unfenced_init")
    copy = tma_stream_line(r"cute\.copy\(tma_s, .*tma_bar_ptr=full\)")
    found = analyze("synccheck", xml_path, stdout)
    assert len(found) == 512
    assert {(f.kind, f.file, f.line, f.text, f.count) for f in found} == {
        ("BARRIER_MISUSE", TMA_STREAM_PY, copy, "Barrier error: Missing init", 1)
    }
    assert sorted({(f.threads[0][0], f.blocks[0][0]) for f in found}) == [
        (t, b) for t in range(128, 160) for b in range(16)
    ]
    assert parse_summary(stdout) == {"errors": 512}
    kept, filtered = filter_noise(found, read_source=read_here)
    assert filtered == [] and classify(kept, "synccheck") == "SYNC_ERROR"
    (g,) = group(kept)
    assert (g.count, g.lines) == (512, ((TMA_STREAM_PY, copy),))
    text = parse_text(text_only, "synccheck")
    assert len(text) == 512 and {f.line for f in text} == {copy}
    assert all("Missing init." in f.text for f in text)


def test_synthetic_synccheck_text():
    sync = parse_text(text("synthetic_synccheck_divergent.txt"), "synccheck")
    assert [(f.kind, f.line, f.threads) for f in sync] == [
        ("BARRIER_MISUSE", 29, ((0, 0, 0),)),
        ("BARRIER_MISUSE", 29, ((32, 0, 0),)),
    ]
    assert classify(sync, "synccheck") == "SYNC_ERROR"


def test_synthetic_memcheck_misaligned_and_api_text():
    """Shapes without a capture: the "at 0xPC in file:line:func" spelling, a misaligned
    access, an API error between device records, host backtrace lines."""
    found = parse_text(text("synthetic_memcheck_misaligned_api.txt"), "memcheck")
    assert [f.kind for f in found] == [
        "INVALID_GLOBAL_WRITE",
        "INVALID_GLOBAL_WRITE",
        "API_ERROR",
        "MISALIGNED",
    ]
    assert found[2].api == "cuStreamSynchronize"
    m = found[3]
    assert (m.file, m.line, m.kernel, m.size, m.address) == (
        "/h200/cutedebug/kernels/minimal.py",
        63,
        "kernel_cutlass_kernel_Minimal_0",
        16,
        "0x7f2a1c000004",
    )
    assert parse_summary(text("synthetic_memcheck_misaligned_api.txt")) == {"errors": 4}


# ---- unreadable output is a finding --------------------------------------------------------
def truncated_copy(tmp_path: Path, case: str, records: int, extra: int = 300) -> Path:
    """The real XML cut ``extra`` bytes into record number ``records + 1``."""
    full = (H200 / f"{case}.xml").read_text()
    cut = 0
    for _ in range(records):
        cut = full.index("</record>", cut) + len("</record>")
    path = tmp_path / f"{case}_truncated.xml"
    path.write_text(full[: cut + extra])
    return path


def test_truncated_real_xml_is_a_parse_failure_with_salvaged_records(tmp_path):
    path = truncated_copy(tmp_path, "racecheck_raw", records=3)
    found = parse_xml(path, "racecheck")
    assert found[0].kind == "PARSE_FAILURE" and found[0].severity == "error"
    assert "not well-formed" in found[0].text and "3 complete record(s)" in found[0].text
    complete = parse_xml(H200 / "racecheck_raw.xml", "racecheck")[:3]
    assert found[1:] == complete
    assert classify(found, "racecheck") == "RACE"
    assert classify(found[:1], "racecheck") == "UNREADABLE"
    # a run killed mid-write: the summary line says 513, the XML holds 3 and a failure
    stdout = (H200 / "racecheck_raw.txt").read_text()
    assert [f.kind for f in analyze("racecheck", path, "")][:1] == ["PARSE_FAILURE"]
    # with the text report there, the text decides and the XML failure stays as info
    both = analyze("racecheck", path, stdout)
    assert [f.kind for f in both].count("RAW_HAZARD") == 512
    assert [(f.kind, f.severity) for f in both if f.kind == "PARSE_FAILURE"] == [
        ("PARSE_FAILURE", "info")
    ]


def test_truncated_clean_xml_is_never_clean(tmp_path):
    path = tmp_path / "cut.xml"
    path.write_text((H200 / "memcheck_clean.xml").read_text()[:50])
    found = parse_xml(path, "memcheck")
    assert [f.kind for f in found] == ["PARSE_FAILURE"]
    assert classify(filter_noise(found)[0], "memcheck") == "UNREADABLE"


@pytest.mark.parametrize(
    "content", ["", "   \n", "garbage, not xml", ("<ComputeSanitizerOutput><record><kind>Hazard")]
)
def test_unreadable_xml_is_never_clean(tmp_path, content):
    path = tmp_path / "out.xml"
    path.write_text(content)
    found = parse_xml(path, "memcheck")
    assert found and found[0].kind == "PARSE_FAILURE"
    kept, _filtered = filter_noise(found)
    assert classify(kept, "memcheck") == "UNREADABLE"


def test_missing_xml_is_never_clean(tmp_path):
    found = parse_xml(tmp_path / "absent.xml", "racecheck")
    assert [f.kind for f in found] == ["PARSE_FAILURE"]
    assert "could not be read" in found[0].text
    assert classify(analyze("racecheck", None, ""), "racecheck") == "UNREADABLE"


def test_namespaced_xml_is_read_not_taken_for_empty():
    plain = (H200 / "memcheck_oob.xml").read_text()
    namespaced = plain.replace(
        "<ComputeSanitizerOutput>", '<ComputeSanitizerOutput xmlns="urn:example:sanitizer">'
    )
    assert parse_xml(namespaced, "memcheck") == parse_xml(plain, "memcheck")


# ---- cross-check of XML against the summary line ----------------------------------------
def test_crosscheck_flags_lost_records():
    found, _ = h200_case("memcheck_oob")
    assert crosscheck(found, "========= ERROR SUMMARY: 64 errors\n", "memcheck") == []
    lost = crosscheck(found[:2], "========= ERROR SUMMARY: 64 errors\n", "memcheck")
    assert [f.kind for f in lost] == ["PARSE_FAILURE"]
    assert "64 error(s)" in lost[0].text and "2 record(s)" in lost[0].text
    # over the print limit the XML holds fewer records than the summary counts: expected
    assert crosscheck(found, "ERROR SUMMARY: 5000 errors", "memcheck", print_limit=64) == []
    assert crosscheck(found, "", "memcheck") == []  # no summary (killed run)
    analyzed = analyze("memcheck", H200 / "memcheck_oob.xml", "ERROR SUMMARY: 99 errors")
    assert [f.kind for f in analyzed] == ["INVALID_GLOBAL_WRITE"] * 64 + ["PARSE_FAILURE"]


def test_crosscheck_racecheck_summary_with_no_records():
    summary = "========= RACECHECK SUMMARY: 3 hazards displayed (3 errors, 0 warnings)\n"
    assert [f.kind for f in crosscheck([], summary, "racecheck")] == ["PARSE_FAILURE"]
    found, _ = h200_case("racecheck_raw")
    assert crosscheck(found, summary, "racecheck") == []


def test_analyze_falls_back_to_text_when_xml_unreadable(tmp_path):
    stdout = (H200 / "memcheck_oob.txt").read_text()
    found = analyze("memcheck", tmp_path / "absent.xml", stdout)
    assert [f.kind for f in found].count("INVALID_GLOBAL_WRITE") == 64
    failure = [f for f in found if f.kind == "PARSE_FAILURE"]
    assert len(failure) == 1 and failure[0].severity == "info"  # kept visible, not the verdict
    assert classify(found, "memcheck") == "MEMORY_ERROR"


# ---- noise ---------------------------------------------------------------------------------
def test_racecheck_analysis_record_alone_is_the_finding():
    found, _ = h200_case("racecheck_raw")
    kept, filtered = filter_noise(found[-1:], read_source=read_here)
    assert [f.kind for f in kept] == ["RACE"] and filtered == []
    assert classify(kept, "racecheck") == "RACE"


def test_tma_hazard_filtered_by_source_line(tmp_path):
    kernel = tmp_path / "k.py"
    kernel.write_text(
        "x = 1\ncute.copy(tma_atom, tAgA[None, k], tAsA[None, s], tma_bar_ptr=b)\nacc = sA[i]\n"
    )
    tma = finding(kind="WAR_HAZARD", lines=((str(kernel), 2), (str(kernel), 3)))
    plain = finding(kind="RAW_HAZARD", lines=((str(kernel), 1), (str(kernel), 3)))
    kept, filtered = filter_noise([tma, plain])
    assert kept == [plain]
    assert filtered == [replace(tma, noise_reason=NOISE_TMA)]
    kept, filtered = filter_noise([tma, plain], tma=False)
    assert kept == [tma, plain] and filtered == []
    on = make_result("racecheck", ["cs"], [tma, plain])
    off = make_result("racecheck", ["cs"], [tma, plain], tma_filter=False)
    assert [g.kind for g in on.groups] == ["RAW_HAZARD"] and sanitize_report.noise_cell(
        on
    ) == "1 tma"
    assert [g.kind for g in off.groups] == ["WAR_HAZARD", "RAW_HAZARD"]
    assert (off.tma_filter, sanitize_report.noise_cell(off)) == (False, "0")


def test_tma_hazard_filtered_by_the_library_helper_the_line_is_in(tmp_path):
    """FA-4's backward on the H200: racecheck's writer was a plain `cute.copy(` line of a
    library's bulk-copy helper (quack copy_utils' `def copy_bulk`), its reader the kernel's
    load of the stage: the helper's name says TMA where the line does not. A `cute.copy(` in a
    function that is not a bulk copy, or after such a helper ended, stays a finding."""
    lib = tmp_path / "copy_utils.py"
    lib.write_text(
        "def make_fns(src, dst):\n"
        "    def copy_bulk(src_idx, dst_idx, tma_bar_ptr):\n"
        "        atom = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), src.element_type)\n"
        "        with cute.arch.elect_one():\n"
        "            cute.copy(\n"
        "                atom, src[None, src_idx], dst[None, dst_idx], mbar_ptr=tma_bar_ptr\n"
        "            )\n"
        "    cute.copy(atom, src, dst)\n"
        "    return copy_bulk\n"
        "\n"
        "def store_tile(src, dst):\n"
        "    cute.copy(atom, src, dst)\n"
    )
    kernel = tmp_path / "flash_bwd.py"
    kernel.write_text("x = 1\ntLSErLSE = copy_utils.load_s2r(tLSEsLSE[None, smem_idx_Q])\n")
    bulk = finding(kind="WAR_HAZARD", lines=((str(kernel), 2), (str(lib), 5)))
    after = finding(kind="WAR_HAZARD", lines=((str(kernel), 2), (str(lib), 8)))
    plain = finding(kind="WAR_HAZARD", lines=((str(kernel), 2), (str(lib), 12)))
    kept, filtered = filter_noise([bulk, after, plain])
    assert filtered == [replace(bulk, noise_reason=NOISE_TMA)] and kept == [after, plain]
    assert enclosing_def(str(lib), 5, partial(source_line, strip=False)) == "copy_bulk"
    assert enclosing_def(str(lib), 8, partial(source_line, strip=False)) == "make_fns"
    assert enclosing_def(str(lib), 1, partial(source_line, strip=False)) is None


def test_real_race_is_not_taken_for_tma():
    found, _ = h200_case("racecheck_raw")
    kept, filtered = filter_noise(found, read_source=read_here)
    assert all(f.noise_reason != NOISE_TMA for f in filtered) and len(kept) == 512


# ---- grouping and classification ---------------------------------------------------------
def test_group_sums_counts_and_orders_errors_first():
    a = finding(count=5, severity="warning")
    b = finding(kind="WAR_HAZARD", count=2)
    c = finding(kind="WAR_HAZARD", count=3)
    d = finding(lines=((RACE_PY, 40), (RACE_PY, 41)), count=1)
    groups = group([a, b, c, d])
    assert [(g.kind, g.lines[0][1], g.count) for g in groups] == [
        ("WAR_HAZARD", 28, 5),
        ("RAW_HAZARD", 40, 1),
        ("RAW_HAZARD", 28, 5),
    ]


@pytest.mark.parametrize(
    ("kinds", "tool", "expected"),
    [
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
    ],
)
def test_classify_table(kinds, tool, expected):
    found = [finding(kind=k, tool=tool) for k in kinds]
    assert classify(found, tool) == expected
    assert expected in CLASSES


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("racecheck_raw", "RACE"),
        ("memcheck_oob", "MEMORY_ERROR"),
        ("initcheck_uninit", "UNINIT"),
        ("memcheck_api_noise", "CLEAN"),
        ("synccheck_extra_release", "SYNC_ERROR"),
        *[(c, "CLEAN") for c in CLEAN_CASES],
    ],
)
def test_real_capture_classification(case, expected):
    tool = case.split("_", 1)[0]
    stdout = (H200 / f"{case}.txt").read_text()
    kept, _ = filter_noise(analyze(tool, H200 / f"{case}.xml", stdout), read_source=read_here)
    assert classify(kept, tool) == expected


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
        "Potential WAW hazard detected at __shared__ 0x8 in block (1,0,0) :": "WAW_HAZARD",
        "Race condition": "RACE",
        "Something new the tool says": "UNKNOWN",
    }
    for message, kind in cases.items():
        assert _kind_from_text("memcheck", message) == kind, message


# ---- source lines and report -------------------------------------------------------------
def test_source_line_local_foreign_and_missing(tmp_path):
    f = tmp_path / "k.py"
    f.write_text("a = 1\n    b = x[i]  # load\n")
    assert source_line(str(f), 2) == "b = x[i]  # load"
    assert source_line(str(f), 3) is None
    assert source_line(str(tmp_path / "nope.py"), 1) is None
    assert source_line(None, 1) is None and source_line(str(f), None) is None


def test_capture_paths_map_onto_this_checkout_by_suffix():
    """A capture made in another checkout: its paths still find the sample's lines here."""
    moved = (H200 / "racecheck_raw.xml").read_text().replace(GPU_CHECKOUT, "/elsewhere/ckout")
    found = parse_xml(moved, "racecheck")
    assert found[0].file == "/elsewhere/ckout/tools/sanitizer_samples/race_smem.py"
    assert source_line(found[0].file, found[0].line, roots=(REPO,)).endswith("# RACE_WRITE")
    assert source_line(found[0].sites[1].file, 31, roots=(REPO,)).endswith("# RACE_READ")
    moved = (H200 / "memcheck_oob.xml").read_text().replace(GPU_CHECKOUT, "/elsewhere/ckout")
    f = parse_xml(moved, "memcheck")[0]
    assert source_line(f.file, f.line, roots=(REPO,)).startswith("y[i + self.oob_offset]")


def test_make_result_and_markdown():
    findings = (
        parse_xml(H200 / "racecheck_raw.xml", "racecheck")
        + parse_xml(H200 / "memcheck_api_noise.xml", "racecheck")[:2]
    )
    cmd = build_command(
        "racecheck",
        ["python", "-m", "cutedebug.engine.worker", "r.json"],
        "/tmp/r.xml",
        sanitizer="compute-sanitizer",
    )
    result = make_result(
        "racecheck",
        cmd,
        findings,
        env=child_env("racecheck"),
        exit_code=86,
        sanitizer_seconds=12.0,
        plain_seconds=1.5,
        xml_path="/tmp/r.xml",
        read_source=read_here,
    )
    assert ToolResult.from_json(json.loads(json.dumps(result.to_json()))) == result
    data, result = result, result.to_json()  # the JSON object, as sanitize.json holds it
    assert result["verdict"] == "RACE"
    assert result["slowdown"] == pytest.approx(8.0)
    # filtered counts are records: 2 probing errors, 1 analysis record (of 512 hazards)
    assert result["filtered"] == [
        {"reason": NOISE_ANALYSIS_DUP, "count": 1},
        {"reason": NOISE_PROC_ADDRESS, "count": 2},
    ]
    (g,) = result["groups"]
    assert g["kind"] == "RAW_HAZARD" and g["count"] == 512
    assert g["lines"][0]["source"] == "buf[tid] = x[tid]  # RACE_WRITE"
    assert g["lines"][1]["source"] == "y[tid] = buf[(tid + 32) % THREADS]  # RACE_READ"
    assert result["reproduce"].startswith("CUTE_DSL_LINEINFO=1 compute-sanitizer --tool racecheck")

    md = sanitize_report.render_markdown(data)
    tldr = next(ln for ln in md.splitlines() if ln.startswith("**TL;DR**"))
    assert "racecheck → **RACE**" in tldr
    assert "RAW_HAZARD at race_smem.py:28 / race_smem.py:31" in tldr
    assert "512×" in tldr and "# RACE_WRITE" in tldr
    assert "## Noise filtered" in md and "2 × cuda-bindings probes" in md
    assert "1 × racecheck analysis record" in md
    assert result["reproduce"] in md
    assert "slowdown 8.0×" in md and "exit code 86" in md
    assert "Write at" in md and "Read at" in md
    assert md.index("## Findings") < md.index("## Noise filtered") < md.index("## Reproduce")


def test_markdown_clean_run():
    result = make_result("memcheck", ["cs", "w"], [], sanitizer_seconds=3.0)
    md = sanitize_report.render_markdown(result)
    assert result.verdict == "CLEAN"
    assert "no findings after noise filtering" in md and "- none" in md


# ---- shrink ------------------------------------------------------------------------------
OOB = (MINIMAL_PY, 64)


def oob_at(line=64, kind="INVALID_GLOBAL_WRITE"):
    return finding(kind=kind, tool="memcheck", lines=((MINIMAL_PY, line),))


class FakeRun:
    """memcheck over a kernel whose OOB store shows up for n >= threshold; below that a
    different finding (another line) appears, which must not count as the same."""

    def __init__(self, threshold: int, other_below: int | None = None, broken=lambda p: False):
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
    res = shrink({"n": 1 << 20, "stages": 4}, ("n",), run, clock=lambda: next(ticks))
    assert res.shrunk == {"n": 37, "stages": 4}
    assert res.original == {"n": 1 << 20, "stages": 4}
    assert res.signature == ("INVALID_GLOBAL_WRITE", (OOB,))
    assert_no_rerun(run.calls)
    assert len(res.runs) == len(run.calls)
    assert res.original_seconds == 1 and res.shrunk_seconds == 1
    assert json.loads(json.dumps(res.to_json()))["shrunk"]["n"] == 37


def test_shrink_reuses_the_original_run():
    run = FakeRun(threshold=37)
    res = shrink({"n": 64}, ("n",), run, original=([oob_at()], 7.5))
    assert {"n": 64} not in run.calls
    assert res.runs[0] == {"params": {"n": 64}, "reproduced": True, "seconds": 7.5}
    assert res.original_seconds == 7.5 and res.shrunk == {"n": 37}


def test_shrink_keeps_the_same_signature_not_any_finding():
    run = FakeRun(threshold=100, other_below=1)  # below 100 only line 70 is reported
    res = shrink({"n": 4096}, ("n",), run)
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
    res = shrink({"n": 256, "m": 64, "flag": True}, ("n", "m", "flag"), run)
    assert res.shrunk == {"n": 10, "m": 3, "flag": True}
    assert_no_rerun(calls)
    errors = [r for r in res.runs if "error" in r]
    assert errors and all(not r["reproduced"] for r in errors)


def test_shrink_explicit_target_and_original_must_reproduce():
    run = FakeRun(threshold=50)
    with pytest.raises(ValueError, match="do not reproduce"):
        shrink({"n": 10}, ("n",), run)
    res = shrink({"n": 64}, ("n",), FakeRun(threshold=50), target=("INVALID_GLOBAL_WRITE", (OOB,)))
    assert res.shrunk["n"] == 50


def test_shrink_ignores_noise_when_choosing_target():
    noise = finding(
        kind="API_ERROR", tool="memcheck", lines=((None, None),), api="cuGetProcAddress_v2"
    )

    def run(p):
        return [noise] + ([oob_at()] if p["n"] >= 5 else [])

    res = shrink({"n": 40}, ("n",), run)
    assert res.signature == ("INVALID_GLOBAL_WRITE", (OOB,)) and res.shrunk["n"] == 5


@settings(max_examples=60, deadline=None)
@given(start=st.integers(1, 1 << 16), data=st.data())
def test_shrink_property_monotone_threshold(start, data):
    threshold = data.draw(st.integers(1, start))
    run = FakeRun(threshold=threshold)
    res = shrink({"n": start}, ("n",), run, max_runs=200)
    assert res.shrunk["n"] == threshold
    assert_no_rerun(run.calls)
    assert len(run.calls) <= 2 * start.bit_length() + 2


def test_markdown_reports_shrink_sizes_and_times():
    ticks = iter(range(0, 10_000, 3))
    res = shrink({"n": 4096}, ("n",), FakeRun(threshold=129), clock=lambda: next(ticks))
    result = make_result("memcheck", ["cs", "w"], [oob_at()], shrink_result=res)
    assert result.to_json()["shrink"]["shrunk"] == {"n": 129}
    md = sanitize_report.render_markdown(result)
    section = md[md.index("## Shrunk") : md.index("## Reproduce")]
    assert "original {'n': 4096} (3.0 s)" in section
    assert "shrunk {'n': 129} (3.0 s)" in section
    assert "same finding INVALID_GLOBAL_WRITE at minimal.py:64" in section
    assert f"{len(res.runs)} candidate run(s), none repeated" in section


def test_shrinkable_params_read_without_importing_the_kernel(tmp_path):
    assert cmd.shrinkable_params(REPO / "kernels" / "minimal.py", "Minimal") == ("n",)
    assert cmd.shrinkable_params(REPO / "kernels" / "tma_stream.py", "TmaStream") == (
        "m",
        "n",
        "ctas",
    )
    assert cmd.shrinkable_params(REPO / "kernels" / "minimal.py", "Nope") == ()
    k = tmp_path / "k.py"
    k.write_text("class K:\n    PARAMS = {'n': 4}\n")
    assert cmd.shrinkable_params(k, "K") == ()


# ---- the verdict of one sanitized run ------------------------------------------------------
@pytest.mark.parametrize(
    ("cls", "kernel", "kw", "expected"),
    [
        # findings decide once the kernel ran, whatever the worker made of the launch
        ("RACE", "PASS", {}, "RACE"),
        ("MEMORY_ERROR", "CRASH", {"synced": False}, "MEMORY_ERROR"),
        ("UNINIT", "MISMATCH", {}, "UNINIT"),
        # a watchdog kill wins: a sanitized hang is a HANG
        ("UNREADABLE", "HANG", {"killed": "deadline:launched:100s"}, "HANG"),
        ("RACE", "HANG", {"killed": "deadline:launched:100s"}, "HANG"),
        # the kernel never ran: never CLEAN, and findings cannot be this launch's
        (CLEAN, "UNSUPPORTED", {"launched": False, "synced": False}, "UNSUPPORTED"),
        ("MEMORY_ERROR", "UNSUPPORTED", {"launched": False, "synced": False}, "UNSUPPORTED"),
        (CLEAN, "COMPILE_ERROR", {"launched": False, "synced": False}, "COMPILE_ERROR"),
        ("UNREADABLE", "PASS", {}, "UNREADABLE"),
        # error exit code with nothing read: the output was lost
        (CLEAN, "PASS", {"exit_code": 86, "records": 0}, "UNREADABLE"),
        # error exit code from filtered noise only (API errors on): clean
        (CLEAN, "PASS", {"exit_code": 86, "records": 34}, CLEAN),
        # the kernel crashed and the sanitizer named no cause: the crash, not CLEAN
        (CLEAN, "CRASH", {"synced": False}, "CRASH"),
        (CLEAN, "MISMATCH", {}, CLEAN),
        (CLEAN, "PASS", {}, CLEAN),
    ],
)
def test_tool_verdict_table(cls, kernel, kw, expected):
    args = {"launched": True, "synced": True, "killed": None, "exit_code": 0, "records": 0}
    verdict, reason = cmd.tool_verdict(cls, kernel, "worker says so", **(args | kw))
    assert verdict == expected
    assert reason
    if not kw.get("launched", True):
        assert "never ran" in reason


def test_parse_tools():
    assert cmd.parse_tools("all") == TOOLS
    assert cmd.parse_tools("racecheck,synccheck") == ("racecheck", "synccheck")
    assert cmd.parse_tools(["memcheck", "memcheck,initcheck"]) == ("memcheck", "initcheck")
    with pytest.raises(ValueError, match="unknown sanitizer tool 'leakcheck'"):
        cmd.parse_tools("leakcheck")


def test_as_expected():
    assert cmd.as_expected("RACE", {"memcheck": "CLEAN", "racecheck": "RACE"})
    assert not cmd.as_expected("RACE", {"racecheck": "HANG"})
    assert cmd.as_expected("PASS", {"memcheck": "CLEAN", "racecheck": "CLEAN"})
    assert not cmd.as_expected("PASS", {"memcheck": "CLEAN", "initcheck": "UNSUPPORTED"})
    assert not cmd.as_expected("CRASH", {"memcheck": "MEMORY_ERROR"})


def test_judge_checks_plain_run_verdicts_against_the_plain_run():
    found = {"memcheck": "MEMORY_ERROR"}
    assert cmd.judge("MEMORY_ERROR", found, "MISMATCH") == (
        True,
        "expected MEMORY_ERROR: as expected",
    )
    # the oob_store scenario expects MISMATCH of its plain run: memcheck's finding is no miss
    assert cmd.judge("MISMATCH", found, "MISMATCH") == (
        True,
        "expected MISMATCH (plain run): got MISMATCH, as expected",
    )
    assert cmd.judge("MISMATCH", found, "PASS")[0] is False
    ok, line = cmd.judge("HANG", found, None)
    assert ok is None and "not checked" in line and "--expect RACE|MEMORY_ERROR" in line
    assert cmd.judge("PASS", {"racecheck": "RACE"}, "PASS")[0] is False


# ---- `cutedebug sanitize` end to end through the fake compute-sanitizer ---------------------
def minimal_pass_scenario(path: Path, deadline_s: float) -> Path:
    """A scenario at ``path`` of kernels/minimal.py that expects PASS within ``deadline_s``
    (the fake's ``hang`` mode makes its launch never end)."""
    path.write_text(
        f'id = "t/hang"\n[kernel]\nfile = "{REPO / "kernels" / "minimal.py"}"\n'
        'entry = "Minimal"\n[expect]\nverdict = "PASS"\n'
        f"[limits]\ndeadline_s = {deadline_s}\n"
    )
    return path


def test_sanitize_racecheck_finds_the_captured_race(fake_sanitizer, tmp_path):
    r = replayed_race(fake_sanitizer, tmp_path / "runs", expect="RACE")
    first = r.stdout.splitlines()[0]
    assert first.startswith(
        "racecheck: RACE — RAW_HAZARD at race_smem.py:28 / race_smem.py:31 "
        "×512: `buf[tid] = x[tid]  # RACE_WRITE`"
    )
    summary, md, res = tool_report(r, "racecheck")
    assert (res["verdict"], res["sanitizer_class"], res["kernel_verdict"]) == (
        "RACE",
        "RACE",
        "PASS",
    )
    assert res["exit_code"] == ERROR_EXITCODE and res["records"] == 513
    (g,) = res["groups"]
    assert (g["kind"], g["count"], [(ln["line"], ln["source"]) for ln in g["lines"]]) == (
        "RAW_HAZARD",
        512,
        [
            (28, "buf[tid] = x[tid]  # RACE_WRITE"),
            (31, "y[tid] = buf[(tid + 32) % THREADS]  # RACE_READ"),
        ],
    )
    assert res["filtered"] == [{"reason": NOISE_ANALYSIS_DUP, "count": 1}]
    # the wrapped command: the sanitizer's options, then the unchanged worker command
    run_dir = Path(res["run_dir"])
    argv = res["command"]
    assert argv[0] == str(fake_sanitizer)
    assert argv[-4:] == [
        sys.executable,
        "-m",
        "cutedebug.engine.worker",
        str(run_dir / "request.json"),
    ]
    assert argv[argv.index("--save") + 1] == str(run_dir / "racecheck.xml")
    assert argv[argv.index("--tool") + 1] == "racecheck"
    request = json.loads((run_dir / "request.json").read_text())
    assert request["lineinfo"] is True and request["probes"] is None
    assert (run_dir / "racecheck.xml").read_bytes() == (H200 / "racecheck_raw.xml").read_bytes()
    # the sanitizer's text went to the worker log
    assert "RACECHECK SUMMARY: 513 hazards" in (run_dir / "worker.log").read_text()
    assert res["reproduce"].startswith("CUTE_DSL_LINEINFO=1 ")
    assert res["reproduce_cutedebug"] == (
        f"cutedebug sanitize {SCEN / 'clean.toml'} --tool racecheck --expect RACE"
    )
    assert "**TL;DR** racecheck → **RACE**: RAW_HAZARD at race_smem.py:28" in md
    assert (
        "| racecheck | RACE | RAW_HAZARD@race_smem.py:28 / race_smem.py:31 ×512 | 0 | "
        "1 analysis-dup |"
    ) in md
    assert "Expected RACE: as expected." in md
    assert summary["as_expected"] is True


def test_sanitize_synccheck_names_the_extra_release(fake_sanitizer, tmp_path):
    """The H200 capture of tma_stream/extra_consumer_release under synccheck, end to end: the
    sanitizer's SYNC_ERROR at the release line wins over the kernel's launch failure. The
    capture's records point at the kernel source it was made against (TMA_STREAM_CAPTURE_REV),
    so the report quotes the line the capture names."""
    scen = REPO / "scenarios" / "tma_stream" / "extra_consumer_release.toml"
    src = tmp_path / "capture_src"
    (src / "kernels").mkdir(parents=True)
    (src / "kernels" / "tma_stream.py").write_text(tma_stream_capture_source())
    r = sanitize_tool(
        fake_sanitizer,
        "synccheck_extra_release",
        "simulate-crash",
        scen,
        "synccheck",
        tmp_path,
        expect="SYNC_ERROR",
        env={"FAKE_SANITIZER_SOURCE_ROOT": f"{GPU_CHECKOUT}={src}"},
    )
    release = tma_stream_line(r"^\s*ring\.consumer_release\(state\)")
    assert r.stdout.splitlines()[0].startswith(
        f"synccheck: SYNC_ERROR — BARRIER_MISUSE at tma_stream.py:{release} ×61: "
        "`ring.consumer_release(state)`"
    )
    summary, md, res = tool_report(r, "synccheck")
    assert (res["verdict"], res["kernel_verdict"], res["records"]) == ("SYNC_ERROR", "CRASH", 61)
    (g,) = res["groups"]
    assert g["text"] == "Barrier error: Missing wait" and g["count"] == 61
    assert summary["as_expected"] is True


def test_sanitize_pass_scenario_with_a_race_is_not_as_expected(fake_sanitizer, tmp_path):
    r = replayed_race(fake_sanitizer, tmp_path, rc=1)
    assert "expected PASS: NOT as expected" in r.stdout


def test_sanitize_clean_and_noise_only_runs_are_clean(fake_sanitizer, tmp_path):
    r = sanitize_tool(
        fake_sanitizer, "memcheck_clean", "simulate", SCEN / "clean.toml", "memcheck", tmp_path
    )
    res = report(r)[0]["tools"]["memcheck"]
    assert (res["verdict"], res["groups"], res["filtered"]) == ("CLEAN", [], [])
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING=1" in res["reproduce"]
    # cuGetProcAddress noise makes the tool exit with the error code; still clean, with reason
    r = sanitize_tool(
        fake_sanitizer, "memcheck_api_noise", "simulate", SCEN / "clean.toml", "memcheck", tmp_path
    )
    summary, md, res = tool_report(r, "memcheck")
    assert (res["verdict"], res["exit_code"], res["filtered_count"]) == ("CLEAN", 86, 34)
    assert "34 × cuda-bindings probes" in md


def test_sanitize_memcheck_error_that_stops_the_kernel(fake_sanitizer, tmp_path):
    r = replayed_oob_store(fake_sanitizer, tmp_path, expect="MEMORY_ERROR")
    res = report(r)[0]["tools"]["memcheck"]
    assert (res["verdict"], res["kernel_verdict"]) == ("MEMORY_ERROR", "CRASH")
    (g,) = res["groups"]
    assert (g["kind"], g["count"], g["lines"][0]["line"], g["blocks"]) == (
        "INVALID_GLOBAL_WRITE",
        64,
        64,
        [[31, 0, 0]],
    )


def test_sanitize_hang_ends_as_hang(fake_sanitizer, tmp_path):
    toml = minimal_pass_scenario(tmp_path / "hang.toml", deadline_s=0.5)
    r = sanitize_tool(
        fake_sanitizer,
        "racecheck_clean",
        "hang",
        toml,
        "racecheck",
        tmp_path,
        "--deadline-scale",
        "3",
        rc=1,
        timeout=120,
    )
    res = report(r)[0]["tools"]["racecheck"]
    assert res["verdict"] == "HANG"
    assert res["killed_by_watchdog"] == "deadline:launched:1.5s"
    assert res["deadline_scale"] == 3.0
    assert 1.5 <= res["sanitizer_seconds"] < 30
    assert res["reason"].startswith("the sanitized run was killed by the watchdog")


def test_sanitize_without_output_is_unreadable_not_clean(fake_sanitizer, tmp_path):
    r = sanitize_tool(
        fake_sanitizer,
        "memcheck_clean",
        "simulate",
        SCEN / "clean.toml",
        "memcheck",
        tmp_path,
        rc=1,
        env={"FAKE_SANITIZER_XML": "0", "FAKE_SANITIZER_TEXT": "0"},
    )
    res = report(r)[0]["tools"]["memcheck"]
    assert res["verdict"] == "UNREADABLE"
    assert [g["kind"] for g in res["groups"]] == ["PARSE_FAILURE"]
    # XML lost but the text report there: the text decides, the XML failure is kept as info
    r = replayed_race(fake_sanitizer, tmp_path, expect="RACE", env={"FAKE_SANITIZER_XML": "0"})
    res = report(r)[0]["tools"]["racecheck"]
    assert res["verdict"] == "RACE"
    assert [(g["kind"], g["severity"]) for g in res["groups"]] == [
        ("RAW_HAZARD", "error"),
        ("PARSE_FAILURE", "info"),
    ]


@pytest.mark.skipif(
    __import__("shutil").which("nvidia-smi") is not None, reason="checks the no-GPU path"
)
@pytest.mark.slow
def test_sanitize_real_worker_without_gpu_is_not_clean(fake_sanitizer, tmp_path):
    """The fake runs the real worker, which compiles and reports UNSUPPORTED here: the kernel
    never ran, so the verdict is UNSUPPORTED although the replayed XML holds findings."""
    r = sanitize_tool(
        fake_sanitizer,
        "memcheck_oob",
        "exec",
        SCEN / "oob_store.toml",
        "memcheck",
        tmp_path,
        "--param",
        "n=4096",
        "--param",
        "oob_offset=64",
        expect="MEMORY_ERROR",
        plain=True,
        rc=1,
    )
    summary, md, res = tool_report(r, "memcheck")
    assert (res["verdict"], res["kernel_verdict"]) == ("UNSUPPORTED", "UNSUPPORTED")
    assert "never ran under the sanitizer" in res["reason"]
    assert "64 record(s) that cannot come from this kernel's launch" in res["reason"]
    assert res["groups"][0]["count"] == 64  # still shown
    assert summary["scenario"]["params"] == {"n": 4096, "oob_offset": 64}
    assert summary["plain"]["verdict"] == "UNSUPPORTED" and summary["plain"]["seconds"] > 0
    assert res["plain_seconds"] == summary["plain"]["seconds"]
    events = [
        json.loads(ln)["event"]
        for ln in (Path(res["run_dir"]) / "events.jsonl").read_text().splitlines()
    ]
    assert "compiled" in events and "launched" not in events
    assert "**TL;DR** memcheck → **UNSUPPORTED**" in md


def test_sanitize_shrink_keeps_the_finding(fake_sanitizer, tmp_path):
    r = replayed_oob_store(
        fake_sanitizer,
        tmp_path,
        "--param",
        "n=4096",
        "--shrink",
        expect="MEMORY_ERROR",
        env={"FAKE_SANITIZER_BELOW": "n=300:memcheck_clean"},
    )
    summary, md = report(r)
    shrunk = summary["tools"]["memcheck"]["shrink"]
    assert shrunk["original"]["n"] == 4096 and shrunk["shrunk"]["n"] == 300
    assert shrunk["signature"][0] == "INVALID_GLOBAL_WRITE"
    assert shrunk["signature"][1][0][1] == 64
    tried = [run["params"]["n"] for run in shrunk["runs"]]
    assert tried[0] == 4096 and len(tried) == len(set(tried))  # original reused, none rerun
    assert all(run["reproduced"] == (run["params"]["n"] >= 300) for run in shrunk["runs"])
    assert "## Shrunk" in md and "shrunk {'n': 300" in md
    assert "shrunk {'n': 4096" not in md


def test_sanitize_missing_sanitizer_is_a_clear_error(monkeypatch, capsys, tmp_path):
    from cutedebug.commands import cli

    monkeypatch.setattr(cmd, "find_sanitizer", lambda: None)
    rc = cli.main(["sanitize", str(SCEN / "clean.toml"), "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "compute-sanitizer not found" in err
    assert "$COMPUTE_SANITIZER" in err and "/usr/local/cuda/bin" in err
    rc = cli.main(["sanitize", str(SCEN / "clean.toml"), "--sanitizer", "/no/such/cs"])
    assert rc == 2 and "/no/such/cs (--sanitizer)" in capsys.readouterr().err
    assert cli.main(["sanitize", str(SCEN / "clean.toml"), "--tool", "leakcheck"]) == 2
    assert not list(tmp_path.iterdir())  # nothing ran


# ---- on the H200 (real compute-sanitizer) ---------------------------------------------------
def real_sanitizer():
    path = find_sanitizer()
    if path is None:
        pytest.skip("compute-sanitizer not found")
    return path


@pytest.mark.gpu
def test_gpu_sanitize_minimal_oob_store(tmp_path):
    real_sanitizer()
    r = cutedebug_sanitize(
        str(SCEN / "oob_store.toml"),
        "--tool",
        "memcheck",
        "--param",
        "n=4096",
        "--param",
        "oob_offset=64",
        "--expect",
        "MEMORY_ERROR",
        "--runs-dir",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    res = report(r)[0]["tools"]["memcheck"]
    (g,) = res["groups"]
    assert (
        g["kind"],
        g["count"],
        os.path.basename(g["lines"][0]["file"]),
        g["lines"][0]["line"],
    ) == ("INVALID_GLOBAL_WRITE", 64, "minimal.py", minimal_store_line())


@pytest.mark.gpu
def test_gpu_sanitize_minimal_clean_and_hang(tmp_path):
    real_sanitizer()
    r = cutedebug_sanitize(
        str(SCEN / "clean.toml"), "--tool", "memcheck,initcheck", "--runs-dir", str(tmp_path)
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = cutedebug_sanitize(
        str(SCEN / "spin_hang.toml"),
        "--tool",
        "memcheck",
        "--no-plain",
        "--deadline-scale",
        "3",
        "--runs-dir",
        str(tmp_path),
    )
    assert report(r)[0]["tools"]["memcheck"]["verdict"] == "HANG", r.stdout + r.stderr


# ---- tools/gpu_sanitize_table.py ---------------------------------------------------------------
def load_table_tool():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gpu_sanitize_table", REPO / "tools" / "gpu_sanitize_table.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_table_plan_defaults_and_overrides():
    tool = load_table_tool()
    default = {p.relative_to(REPO / "scenarios").as_posix(): t for p, t in tool.plan([], None)}
    assert default["tma_stream/clean.toml"] == TOOLS
    assert default["tma_stream/oob_store.toml"] == ("memcheck",)
    assert default["tma_stream/drop_sync.toml"] == ("racecheck", "synccheck")
    assert set(default) >= {
        f"tma_stream/{n}.toml"
        for n in (
            "clean",
            "drop_sync",
            "oob_store",
            "missing_init_fence",
            "wrong_expect_tx_minus",
            "extra_consumer_release",
        )
    } | {"minimal/clean.toml", "minimal/oob_store.toml"}
    assert sum(len(t) for t in default.values()) == 16  # ~7-15 s each: fits the 6 minutes
    assert {t for _, t in tool.plan([], "memcheck")} == {("memcheck",)}
    assert tool.plan(["a.toml=racecheck", "b.toml"], None) == [
        (Path("a.toml"), ("racecheck",)),
        (Path("b.toml"), TOOLS),
    ]


@pytest.mark.skipif(
    __import__("shutil").which("nvidia-smi") is not None, reason="checks the no-GPU path"
)
def test_table_without_gpu_says_so():
    r = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gpu_sanitize_table.py")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert (r.returncode, r.stdout) == (0, "no GPU\n")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sanitize_killed_by_a_signal_leaves_no_process_behind(fake_sanitizer, tmp_path, sig):
    """`timeout 100 cutedebug sanitize ...` on a hung kernel: the sanitizer and the worker go
    too (they did not, before SIGTERM was handled: the H200 run of --shrink left both)."""
    toml = minimal_pass_scenario(tmp_path / "hang.toml", deadline_s=600)
    env = dict(os.environ, **fake_env(fake_sanitizer, "racecheck_clean", "hang"))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cutedebug",
            "sanitize",
            str(toml),
            "--tool",
            "racecheck",
            "--no-plain",
            "--runs-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        parent = psutil.Process(proc.pid)
        deadline = time.monotonic() + 120
        launched = []
        while time.monotonic() < deadline and not launched:  # the sanitized kernel "runs"
            launched = [p for p in tmp_path.rglob("events.jsonl") if '"launched"' in p.read_text()]
            time.sleep(0.2)
        assert launched, "the fake sanitized worker never launched"
        children = parent.children(recursive=True)
        assert children
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig, out + err
        assert f"terminated by {signal.Signals(sig).name}" in err
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
