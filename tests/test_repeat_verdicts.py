"""tools/repeat_verdicts.py: verdict frequencies, with the engine faked (no GPU needed)."""

import json
import sys
from pathlib import Path

from cutedebug.engine import runner
from cutedebug.engine import verdict as V

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import repeat_verdicts  # noqa: E402


def test_frequencies_count_expect_also_as_expected(monkeypatch, tmp_path, capsys):
    runs = {
        "sm90_attention/drop_sync_epilogue": ["PASS", "MISMATCH", "PASS", "PASS"],
        "tma_stream/drop_sync": ["PASS", "HANG", "PASS", "PASS"],
    }

    def fake_run(sc, runs_root, repeat, forkserver):
        reps = [{"verdict": v, "digest": None} for v in runs[sc.id][:repeat]]
        return runner.RunResult(
            scenario=sc,
            verdict=V.Verdict.NONDETERMINISTIC,
            reason="x",
            run_dir=tmp_path,
            outcome=V.Outcome(),
            repeats=reps,
        )

    monkeypatch.setattr(repeat_verdicts, "detect_gpu", lambda: {"present": True})
    monkeypatch.setattr(runner, "start_forkserver", lambda *a, **k: None)
    monkeypatch.setattr(runner, "run_scenario", fake_run)
    out_json = tmp_path / "rep.json"
    assert (
        repeat_verdicts.main(
            [
                "-n",
                "4",
                "--out",
                str(tmp_path),
                "--json",
                str(out_json),
                str(ROOT / "scenarios/sm90_attention/drop_sync_epilogue.toml"),
                str(ROOT / "scenarios/tma_stream/drop_sync.toml"),
            ]
        )
        == 0
    )
    rows = {r["scenario"]: r for r in json.loads(out_json.read_text())}
    attn, tma = rows["sm90_attention/drop_sync_epilogue"], rows["tma_stream/drop_sync"]
    # PASS with also = ["MISMATCH"]: every run is an expected verdict
    assert attn["expected"] == "PASS/MISMATCH" and attn["expected_share"] == 1.0
    assert attn["frequencies"] == {"PASS": 3, "MISMATCH": 1}
    assert tma["expected"] == "PASS" and tma["expected_share"] == 0.75
    out = capsys.readouterr().out
    assert "| tma_stream/drop_sync | PASS | PASS 3/4, HANG 1/4 | 0.75 |" in out
    assert "1 of 2 scenarios gave their expected verdict on every run" in out
