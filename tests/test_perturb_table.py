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


# ---- the two replay rates: the seed alone, and after the seeds that ran before it --------------


def test_the_table_measures_the_replay_alone_and_with_its_history(tmp_path, monkeypatch, capsys):
    """As on the H200 (reports/2026-12-02-h200): sm90_gemm/missing_init_fence crashed at seed 9
    after seeds 0-8 and never alone; tma_stream's at seed 0 (no history, the same command).
    sm90_attention's replays with history: one in two stopped at an earlier seed, which is
    counted apart, never as the replayed seed's."""
    from cutedebug.engine import runner

    calls = []
    attention_runs = [0]

    def run_scenario(sc, *, runs_root, forkserver, perturb):
        calls.append((sc.id, {k: perturb.get(k) for k in ("replay", "replay_from")}))
        replay, first = perturb.get("replay"), perturb.get("replay_from")
        crash = {"exposed_by": replay, "exposing_outcome": "CRASH", "runs": 1}
        if sc.id == "sm90_gemm/missing_init_fence":
            if replay is None:
                p = {**crash, "exposed_by": 9, "history_from": 0, "runs": 10}
            else:
                p = crash if first == 0 else {"exposed_by": None, "runs": 1}
        elif sc.id == "tma_stream/missing_init_fence":
            p = {**crash, "exposed_by": 0}
        else:
            if replay is None:
                p = {**crash, "exposed_by": 1, "history_from": 0, "runs": 2}
            elif first is None:
                p = {"exposed_by": None, "runs": 1}
            else:
                attention_runs[0] += 1
                p = {**crash, "exposed_by": 0 if attention_runs[0] % 2 else 1}
        v = V.Verdict.CRASH if p.get("exposed_by") is not None else V.Verdict.PASS
        return SimpleNamespace(
            verdict=v, evidence={"perturbation": p}, reason="", run_dir=tmp_path, health=None
        )

    monkeypatch.setattr(runner, "run_scenario", run_scenario)
    monkeypatch.setattr(runner, "start_forkserver", lambda d: SimpleNamespace(close=lambda **k: 0))
    out_json = tmp_path / "rows.json"
    rc = perturb_table.main(
        [
            "--seeds",
            "32",
            "--replays",
            "3",
            "--history-replays",
            "4",
            "--json",
            str(out_json),
            *(
                str(ROOT / "scenarios" / f / "missing_init_fence.toml")
                for f in ("tma_stream", "sm90_gemm", "sm90_attention")
            ),
        ]
    )
    assert rc == 0
    gemm = [c for sid, c in calls if sid == "sm90_gemm/missing_init_fence"]
    assert (
        gemm
        == [{"replay": None, "replay_from": None}]
        + [{"replay": 9, "replay_from": None}] * 3
        + [{"replay": 9, "replay_from": 0}] * 4
    )
    tma = [c for sid, c in calls if sid == "tma_stream/missing_init_fence"]
    assert tma == [{"replay": None, "replay_from": None}] + [{"replay": 0, "replay_from": None}] * 3
    text = capsys.readouterr().out
    table = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if "|" in line}
    assert "| 9 (after 0-8) | CRASH | 0/3 | 4/4 |" in table["sm90_gemm/missing_init_fence"]
    assert "| 0 | CRASH | 3/3 | = alone (first seed) |" in table["tma_stream/missing_init_fence"]
    assert (
        "| 0/3 | 2/4 (2 stopped at an earlier seed) |" in table["sm90_attention/missing_init_fence"]
    )
    assert "replay alone: 3/9 replays gave the exposing verdict at the exposing seed (33%)" in text
    assert "replay with history: 6/8 replays " in text and "; 2 stopped at an earlier seed" in text
    # as the report prints it: tma alone (3/3), gemm and attention with history (4/4, 2/4)
    assert "replay as the report prints it (with history when there was one): 9/11" in text


def test_combine_counts_the_population_once_with_the_latest_perturbed_row(capsys):
    """--combine over the H200's own files (the project's 19 latent faults were perturbed in
    parts): call1's 19 rows, s3 call3's recheck (3 rows superseding call1's HARNESS_ERROR /
    unperturbed ones, 2 skipped by its budget: they supersede nothing) and s3 call4's
    tail_cluster (skip_producer_tail_cluster's CRASH). Counted by hand from those rows: 19
    perturbed, 8 exposed (CRASH tma_stream, sm90_gemm missing_init_fence and
    skip_producer_tail_cluster; HANG skip_init_cluster_sync x2, missing_init_fence_cluster,
    wrong_arrive_count_empty_minus_cluster; MISMATCH drop_sync_epilogue), 9 predicted benign by
    construction (none exposed), sm90_attention/missing_init_fence still call1's HARNESS_ERROR."""
    r = ROOT / "reports"
    files = [
        r / "2026-12-02-h200/call1/perturb/latent.json.gz",
        r / "2026-12-02-h200-s3/call3/recheck/latent.json.gz",
        r / "2026-12-02-h200-s3/call4/tail_cluster/role.json",
        r / "2026-12-02-h200-s3/call4/tail_cluster/seeds.json",
    ]
    assert perturb_table.main(["--combine", *map(str, files)]) == 1  # one row is not a result
    out = capsys.readouterr().out
    assert "exposed: 8/19 scenarios (42%)" in out
    assert (
        "exposed among those not predicted benign by construction: 8/10; predicted benign by "
        "construction and exposed anyway (a reason proven wrong): []"
    ) in out
    assert out.count("NOT A RESULT: ") == 1 and "NOT A RESULT: sm90_attention/missing_init" in out
    assert "NOT PERTURBED" not in out  # the recheck's skipped rows superseded nothing
    lines = [x for x in out.splitlines() if x.startswith("sm90_gemm/skip_producer_tail_cluster:")]
    assert lines == [
        f"sm90_gemm/skip_producer_tail_cluster: CRASH (exposed by seed 8)  ({files[3]})"
    ]


def test_policy_of_gives_the_spec_a_run_takes():
    from cutedebug.instrument import perturb_plan as P

    args = perturb_table.parser().parse_args(
        ["--policy", "role", "--role", "consumer", "--scope", "rank=1 warpgroup=1", "x.toml"]
    )
    policy = perturb_table.policy_of(args)
    assert policy == {"name": "role", "role": "consumer", "scope": "rank=1 warpgroup=1"}
    assert P.Policy(**policy).scope == "rank=1 warpgroup=1"  # what perturb_runs.drive builds
