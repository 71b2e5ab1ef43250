"""Classification, localization and reports on runs recorded on the H200 (tests/data/runs).

Each directory holds the request and the worker's event stream of one real GPU run; replaying
them checks the host side (verdict table, probe decoding, diagnosis, grading, report) on real
data without a GPU.
"""

from pathlib import Path

from helpers import recorded_runs

from cutedebug.engine import runner
from cutedebug.engine.verdict import Verdict
from cutedebug.reporting import report

DATA = Path(__file__).parent / "data" / "runs"


def test_expect_tx_hang_is_localized_to_the_full_barrier():
    r = runner.replay(DATA / "wrong_expect_tx_plus")
    assert r.verdict is Verdict.HANG
    assert r.evidence["rule"] == "stuck_records"
    # 16 CTAs x (4 consumer warps + 1 producer warp), every one timed out.
    assert len(r.evidence["stuck_sites"]) == 80
    assert r.localization["ok"] is True
    groups = report.group_sites(r.evidence["stuck_sites"])
    assert [
        (g["role"], g["op"], g["barrier"], g["stage"], g["ctas"], g["count"]) for g in groups
    ] == [
        ("consumer", "consumer_wait", "full", 0, "0-15", 64),
        ("producer", "producer_acquire", "empty", 0, "0-15", 16),
    ]
    assert any("expect_tx larger than the bytes delivered" in d for d in r.evidence["diagnosis"])
    md = report.to_markdown(r)
    assert "**TL;DR** HANG (as expected)" in md
    assert "| 0-15 | 0-3 | consumer | consumer_wait | full\\[0\\] | 0 |" in md
    assert "comparison skipped: bounded waits timed out" in md


def test_fault_after_timeouts_without_records_stays_a_crash_with_last_events():
    # Recorded before the worker decoded the probe buffer after a CUDA error: the last live
    # picture has no stuck record, so the evidence is a CRASH with each warp's last event.
    r = runner.replay(DATA / "missing_phase_flip_producer")
    assert r.verdict is Verdict.CRASH
    assert "cudaErrorLaunchFailure" in r.reason
    assert "before the fault" in r.evidence["probe_source"]
    warps = r.evidence["warps"]
    assert len(warps) == 80
    assert {w["role"] for w in warps} == {"consumer", "producer"}
    assert all("last" in w for w in warps)
    m, text = report.stuck_map(r)
    # CTAs whose five warps last completed the same waits share a row: 16 CTAs in 5 rows.
    assert sorted(c for row in m.rows for c in row.ctas) == list(range(16))
    assert [(row.ctas, [c.label for c in row.cells]) for row in m.rows][:2] == [
        ([0, 1, 2, 6, 8, 11], ["wait full[3] p0"] * 4 + ["acq empty[3] p1"]),
        ([3, 5, 10, 12], ["wait full[0] p0"] * 4 + ["acq empty[1] p1"]),
    ]
    assert {c.state for row in m.rows for c in row.cells} == {"progressed"}
    assert "acq empty[3] p1" in text


def test_stuck_records_decide_over_a_later_fault(tmp_path):
    # The same run, as the worker now reports it: the probe buffer decoded after the fault
    # holds stuck records, so the verdict is the HANG and the fault is a consequence.
    import json
    import shutil

    src = DATA / "missing_phase_flip_producer"
    dst = tmp_path / "run"
    shutil.copytree(src, dst)
    events = [json.loads(x) for x in recorded_runs.lines("missing_phase_flip_producer")]
    picture = next(e["picture"] for e in reversed(events) if e.get("picture"))
    stuck = [
        {
            "site_id": 0,
            "block": [0, 0, 0],
            "block_linear": 0,
            "warp": 4,
            "stage": 3,
            "phase": 1,
            "seq": 13,
            "waited_ns": 500_000_000,
            "smid": 0,
            "lane": 0,
            "globaltimer": 1,
        }
    ]
    report_ev = {
        **picture,
        "event": "probe_report",
        "t": 8.2,
        "stuck": stuck,
        "after_cuda_error": True,
    }
    cuda = next(e for e in events if e["event"] == "cuda_error")
    i = events.index(cuda)
    events.insert(i, report_ev)
    (dst / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    r = runner.replay(dst)
    assert r.verdict is Verdict.HANG
    assert "faulted (cudaErrorLaunchFailure)" in r.reason


def test_a_run_folder_kept_gzipped_replays_as_the_plain_one(tmp_path):
    """runner.replay reads events.jsonl.gz where the folder has no events.jsonl (the recorded
    runs here are kept so); the plain copy gives the same verdict, reason and evidence."""
    import shutil

    for case in ("wrong_expect_tx_plus", "missing_phase_flip_producer"):
        plain = tmp_path / case
        recorded_runs.events_file(case, plain)
        shutil.copy(DATA / case / "request.json", plain / "request.json")
        a, b = runner.replay(DATA / case), runner.replay(plain)
        assert (a.verdict, a.reason, a.evidence) == (b.verdict, b.reason, b.evidence)
        assert len(a.outcome.events) == len(recorded_runs.lines(case)) > 10
