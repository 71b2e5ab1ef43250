"""A perturbed run that hangs without probes is rerun with them: the rerun must replay the
exposing seed (not launch the kernel unperturbed, which graded another kernel: the H200
perturbation run of 2026-12-02 read sm90_gemm/missing_init_fence_cluster as a plain PASS with
no perturbation evidence after its perturbed run was killed at the deadline), after the seeds
that ran before it in the killed process (a failure can need them: the H200's
sm90_gemm/missing_init_fence crashed at seed 9 after seeds 0-8 and never alone)."""

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


@pytest.mark.parametrize("replay_hangs, first", [(True, 0), (False, 0), (True, 7), (False, 7)])
def test_the_rerun_with_probes_replays_the_exposing_seed(
    tmp_path, monkeypatch, replay_hangs, first
):
    sc = dataclasses.replace(S.load(ROOT / "scenarios/minimal/clean.toml"), probes=False)
    passed = [
        ev
        for s in range(first, 7)
        for ev in (
            {"event": "perturb_seed", "seed": s, "tag": "seed", "rules": []},
            {"event": "perturb_result", "seed": s, "tag": "seed", "outcome": "PASS"},
        )
    ]
    killed = outcome(
        {"event": "compiled"},
        {"event": "perturb_positions", "positions": [], "policy": {"name": "random"}},
        *passed,
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
    spec = {"n": 32, "seed": first, "shrink": True, "policy": {"name": "random"}}
    res = runner.run_scenario(sc, runs_root=tmp_path, perturb=spec)
    assert requests[0]["perturb"] == spec
    # seeds first..6 ran before 7 in the killed process: the rerun runs them again, in order
    history = first if first < 7 else None
    assert requests[1]["perturb"] == {**spec, "replay": 7, "replay_from": history, "shrink": False}
    assert res.verdict is V.Verdict.HANG  # never the unperturbed (or unreproduced) PASS
    assert res.evidence["rerun_with_probes"]["first_verdict"] == "HANG"
    if not replay_hangs:
        after = " after seeds 0-6" if first == 0 else ""
        assert f"replay with probes{after} gave PASS" in res.reason
    assert res.evidence["perturbation"]["exposed_by"] == 7


def test_a_seed_whose_kernel_faults_is_a_crash_exposure_not_a_harness_error(monkeypatch):
    """The H200 recheck (2026-12-02, reports/2026-12-02-h200 call5): every perturbed CRASH read
    HARNESS_ERROR: the seed's collector took the event name as a parameter called ``name``, and
    cuda_error's own field ``name`` (the CUDA error's) made it raise TypeError inside the
    launch. Here the worker's perturbed path over a launch that faults at its second seed."""
    from cutedebug.engine import perturb_runs
    from cutedebug.instrument import perturb as device
    from cutedebug.instrument import perturb_plan as P

    monkeypatch.setattr(device, "write_table", lambda table, raw: None)
    live = []

    class Events:
        def emit(self, event, **fields):
            live.append((event, fields))

    class Launch:
        kernel = object()
        seeds = 0

        def once(self, emit, live=None, fresh=False):
            emit("launched")
            self.seeds += 1
            if self.seeds == 2:
                msg = "CUDA error: unspecified launch failure"
                emit("cuda_error", name="cudaErrorLaunchFailure", message=msg)
                return
            emit("synced", kernel_s=0.001)
            emit("checked", ok=True, digest="d")

    class Sess:
        positions = [
            P.Position(id=0, role="producer", op="producer_commit", where="after", pipeline=0)
        ]
        dropped = 0
        shape = {"ctas": 2, "warps": 4, "cluster": 1}

    spec = {"n": 8, "seed": 0, "policy": {"name": "random"}}
    perturb_runs.run_in_worker(spec, Sess(), None, Launch(), Events())
    names = [e for e, _ in live]
    summary = dict(live[names.index("perturb_summary")][1])
    assert summary["exposed_by"] == 1 and summary["exposing_outcome"] == "CRASH"
    crash = dict(live[names.index("cuda_error")][1])  # the exposing run's events, re-emitted
    assert crash["name"] == "cudaErrorLaunchFailure"
