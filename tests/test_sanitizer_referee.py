"""A racecheck RACE in a kernel that orders shared memory by mbarriers: the caveat is shown
where the verdict is read (the command's line, the report's TL;DR and summary), not only in
sanitize.json's ``reason``.

The fa4_bwd_sm90 report of the H200 (reports/2026-12-02-h200-s2/call1/sanitize_rest) had no
caveat although the kernel has two PipelineTmaAsync: the caveat was computed into the
result's ``reason``, which a RACE's report never prints (it shows the finding instead).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.sanitize_runs import SCEN, sanitize_tool, tool_report

from cutedebug.analyses.sanitizer.triage import mbarrier_caveat

REPO = Path(__file__).resolve().parents[1]
FIELD = REPO / "scenarios" / "field"
# The pipelines the worker's "compiled" event carries for field/fa4_bwd_sm90/clean, recorded
# by a compile for sm_90a on CPU (test_field_kernels_carry_their_pipelines checks it again
# where the field libraries are installed).
FA4_BWD_PIPELINES = [
    {
        "index": 0,
        "class": "PipelineTmaAsync",
        "file": "flash_attn/cute/flash_bwd_sm90.py",
        "line": 694,
        "where": "flash_bwd_sm90.py:694",
        "via": None,
        "stages": 2,
        "key": "PipelineTmaAsync#0@flash_bwd_sm90.py:694",
    },
    {
        "index": 1,
        "class": "PipelineTmaAsync",
        "file": "flash_attn/cute/flash_bwd_sm90.py",
        "line": 702,
        "where": "flash_bwd_sm90.py:702",
        "via": None,
        "stages": 2,
        "key": "PipelineTmaAsync#1@flash_bwd_sm90.py:702",
    },
]


def test_a_race_in_a_pipelined_kernel_shows_its_caveat(fake_sanitizer, tmp_path):
    """The captured race replayed for a worker whose compile recorded FA-4 backward's two
    pipelines: the caveat is on the command's output and in both reports."""
    events = {"compiled": {"pipelines": FA4_BWD_PIPELINES}}
    r = sanitize_tool(
        fake_sanitizer,
        "racecheck_raw",
        "simulate",
        SCEN / "clean.toml",
        "racecheck",
        tmp_path / "runs",
        expect="RACE",
        env={"FAKE_SANITIZER_EVENTS": json.dumps(events)},
    )
    want = mbarrier_caveat("RACE", FA4_BWD_PIPELINES, None)
    assert "(2 pipeline(s))" in want
    lines = r.stdout.splitlines()
    assert lines[0].startswith("racecheck: RACE — RAW_HAZARD at race_smem.py:28")
    assert lines[1] == f"  caveat: {want}"
    summary, md, res = tool_report(r, "racecheck")
    assert (res["verdict"], res["caveat"], res["reason"]) == ("RACE", want, "findings below")
    assert "- **racecheck → RACE**: RAW_HAZARD at race_smem.py:28" in md
    assert "(caveat: the kernel orders shared memory by mbarriers; see below)" in md
    assert "**Caveat:** racecheck does not credit mbarrier arrive/wait ordering" in md


def test_a_race_without_mbarriers_has_no_caveat(fake_sanitizer, tmp_path):
    r = sanitize_tool(
        fake_sanitizer,
        "racecheck_raw",
        "simulate",
        SCEN / "clean.toml",
        "racecheck",
        tmp_path / "runs",
        expect="RACE",
    )
    assert "caveat" not in r.stdout
    _, md, res = tool_report(r, "racecheck")
    assert res["caveat"] is None and "Caveat" not in md


def _field_compiled(name: str, tmp_path: Path):
    from cutedebug.engine import runner
    from cutedebug.engine import scenario as S
    from cutedebug.event_kinds import Compiled, ProtocolSites

    sc = S.load(FIELD / name / "clean.toml")
    if sc.missing_modules():
        pytest.skip(f"field libraries not installed: {sc.missing_modules()}")
    _, outcome, _ = runner.run_once(sc, tmp_path / name, mode="compile", lineinfo=True)
    compiled, sites = outcome.last(Compiled), outcome.last(ProtocolSites)
    assert compiled is not None, (tmp_path / name / "worker.log").read_text()[-3000:]
    return compiled, sites


@pytest.mark.parametrize(
    "name, classes",
    [
        ("fa4_bwd_sm90", ["PipelineTmaAsync", "PipelineTmaAsync"]),
        ("quack_gemm_sm90", ["PipelineTmaAsync", "PipelineAsync"]),
    ],
)
def test_field_kernels_carry_their_pipelines(name, classes, tmp_path, monkeypatch):
    """The two field kernels racecheck reported a RACE on (H200): their compile records the
    pipelines the caveat names, so a RACE of theirs carries it."""
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    compiled, sites = _field_compiled(name, tmp_path)
    assert [p["class"] for p in compiled.pipelines] == classes
    if name == "fa4_bwd_sm90":
        got = [
            {k: p[k] for k in ("index", "class", "line", "where", "stages", "key")}
            for p in compiled.pipelines
        ]
        want = [
            {k: p[k] for k in ("index", "class", "line", "where", "stages", "key")}
            for p in FA4_BWD_PIPELINES
        ]
        assert got == want
        assert all(os.path.basename(p["file"]) == "flash_bwd_sm90.py" for p in compiled.pipelines)
    caveat = mbarrier_caveat("RACE", compiled.pipelines, sites and sites.sites)
    assert caveat is not None and f"({len(classes)} pipeline(s))" in caveat
