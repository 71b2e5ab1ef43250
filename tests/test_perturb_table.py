"""tools/perturb_table.py: a row that is not a result about the kernel (HARNESS_ERROR) carries
what its run folder says, since the folders stay on the GPU machine (the 2026-12-02 H200 table
had four HARNESS_ERROR rows and no word of why: reports/2026-12-02-h200/call1/perturb)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from cutedebug.engine import verdict as V

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import perturb_table  # noqa: E402


def _res(tmp_path, events, verdict=None, log="", malformed=()):
    o = V.Outcome(returncode=1, malformed_lines=list(malformed))
    for i, ev in enumerate(events):
        o.add({"t": float(i), **ev})
    (tmp_path / "worker.log").write_text(log)
    v = verdict or V.classify(o).verdict
    return SimpleNamespace(verdict=v, outcome=o, run_dir=tmp_path)


def test_a_harness_error_row_keeps_the_exception_and_the_log(tmp_path):
    tb = "Traceback (most recent call last):\n" + "  x\n" * 600 + "KeyError: 7\n"
    res = _res(
        tmp_path,
        [
            {"event": "launched"},
            {
                "event": "harness_error",
                "type": "KeyError",
                "frame": "/r/cutedebug/engine/perturb_runs.py:90 in drive",
                "message": "7",
                "traceback": tb,
            },
        ],
        log="a\n" * 2000 + "last line\n",
    )
    assert res.verdict is V.Verdict.HARNESS_ERROR
    row = perturb_table.not_a_result(res)
    assert row["harness_error"]["type"] == "KeyError"
    assert row["harness_error"]["frame"].endswith("perturb_runs.py:90 in drive")
    assert row["harness_error"]["traceback"].endswith("KeyError: 7\n")
    assert len(row["harness_error"]["traceback"]) == 1500
    assert row["worker_log_tail"].endswith("last line\n") and len(row["worker_log_tail"]) == 1500


def test_a_kernel_verdict_row_gets_nothing_more(tmp_path):
    res = _res(tmp_path, [{"event": "launched"}, {"event": "cuda_error", "name": "x"}])
    assert res.verdict is V.Verdict.CRASH
    assert perturb_table.not_a_result(res) == {}


def test_malformed_events_are_kept(tmp_path):
    res = _res(tmp_path, [{"event": "launched"}], malformed=["{not json" * 100])
    assert res.verdict is V.Verdict.HARNESS_ERROR
    row = perturb_table.not_a_result(res)
    assert row["malformed_lines"] == [("{not json" * 100)[:300]] and "harness_error" not in row
