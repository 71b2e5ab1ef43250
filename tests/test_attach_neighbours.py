"""tools/attach_neighbours.py's reading of its sides (the GPU part runs in gpu_pending's
attach_neighbours step): the neighbour's batches and a hung run's report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import attach_neighbours as A  # noqa: E402


def test_the_longest_batch_and_where_it_began():
    s = A.summarize([0.01, 0.012, 0.9, 0.011], wrong=1, error=None)
    assert s == {
        "batches": 4,
        "wrong": 1,
        "error": None,
        "median_s": 0.0115,
        "max_s": 0.9,
        "max_at_s": 0.022,
    }
    assert A.summarize([], 0, "CUDA error: unspecified launch failure")["max_s"] is None


def _report(tmp_path: Path, coredump: dict, verdict: str = "HANG") -> Path:
    d = tmp_path / "runs"
    (d / "tma_stream__x-1").mkdir(parents=True)
    (d / "tma_stream__x-1" / "report.json").write_text(
        json.dumps(
            {
                "verdict": verdict,
                "evidence": {"coredump": coredump},
                "localization": {"ok": True},
                "health": {"healthy": True},
                "timings": {"attach_s": coredump.get("attach", {}).get("attach_s")},
            }
        )
    )
    return d


def test_a_run_read_attached_and_one_that_fell_back_to_the_dump(tmp_path):
    d = _report(tmp_path / "a", {"attach": {"attach_s": 1.2, "warps": 80}, "warps": 80})
    r = A.hang_row("tma_stream/x", 0, d, 7.04)
    assert (r["verdict"], r["read"], r["attach_s"], r["localization_ok"]) == (
        "HANG",
        "attach",
        1.2,
        True,
    )
    d = _report(
        tmp_path / "b",
        {
            "attach": {"error": "RuntimeError: attach refused", "attach_s": 0.3},
            "dump": {"dump_s": 0.4},
        },
    )
    r = A.hang_row("tma_stream/x", 0, d, 7.0)
    assert r["read"] == "dump" and r["attach_error"] == "RuntimeError: attach refused"
    assert A.hang_row("x", 1, tmp_path / "none", 1.0)["error"] == "no report.json"
