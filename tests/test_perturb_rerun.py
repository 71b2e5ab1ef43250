"""A perturbed run that hangs without probes is rerun with them: the rerun must replay the
exposing seed (not launch the kernel unperturbed, which graded another kernel: the H200
perturbation run of 2026-12-02 read sm90_gemm/missing_init_fence_cluster as a plain PASS with
no perturbation evidence after its perturbed run was killed at the deadline)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cutedebug.engine import runner
from cutedebug.engine import scenario as S
from cutedebug.engine import verdict as V

ROOT = Path(__file__).resolve().parents[1]


def outcome(*events, killed=None, rc=0):
    o = V.Outcome(returncode=rc, killed_by_watchdog=killed)
    for i, ev in enumerate(events):
        o.add({"t": float(i), **ev})
    return o


def facts():
    return {"t_call": 0.0, "t_return": 1.0}


@pytest.mark.parametrize("replay_hangs", [True, False])
def test_the_rerun_with_probes_replays_the_exposing_seed(tmp_path, monkeypatch, replay_hangs):
    sc = dataclasses.replace(S.load(ROOT / "scenarios/minimal/clean.toml"), probes=False)
    killed = outcome(
        {"event": "compiled"},
        {"event": "perturb_positions", "positions": [], "policy": {"name": "random"}},
        {"event": "perturb_seed", "seed": 0, "tag": "seed", "rules": []},
        {"event": "perturb_result", "seed": 0, "tag": "seed", "outcome": "PASS"},
        {"event": "perturb_seed", "seed": 7, "tag": "seed", "rules": []},
        {"event": "launched"},
        killed="deadline:launched",
        rc=-9,
    )
    # the replay hangs again (killed at its deadline: the probes' bounded waits are another
    # test's subject) or passes
    replay = outcome(
        {"event": "compiled"},
        {"event": "perturb_seed", "seed": 7, "tag": "seed", "rules": []},
        {"event": "launched"},
        *([] if replay_hangs else [{"event": "checked", "ok": True}, {"event": "done"}]),
        killed="deadline:launched" if replay_hangs else None,
        rc=-9 if replay_hangs else 0,
    )
    requests = []

    def attempt(scenario, run_dir, *, mode, forkserver, gpu_token, **kw):
        requests.append(kw["request_extra"])
        o = killed if len(requests) == 1 else replay
        return V.classify(o), o, facts(), None

    monkeypatch.setattr(runner, "_attempt", attempt)
    spec = {"n": 32, "seed": 0, "shrink": True, "policy": {"name": "random"}}
    res = runner.run_scenario(sc, runs_root=tmp_path, perturb=spec)
    assert requests[0]["perturb"] == spec
    assert requests[1]["perturb"] == {**spec, "replay": 7, "shrink": False}
    assert res.verdict is V.Verdict.HANG  # never the unperturbed (or unreproduced) PASS
    assert res.evidence["rerun_with_probes"]["first_verdict"] == "HANG"
    if not replay_hangs:
        assert "replay with probes gave PASS" in res.reason
    assert res.evidence["perturbation"]["exposed_by"] == 7
