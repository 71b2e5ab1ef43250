"""Replay with history: a perturbed failure that needs the launches before it in its process.

The H200 (reports/2026-12-02-h200, call1 and call5): sm90_gemm/missing_init_fence crashed at
seed 9 of ``--perturb 32`` (seeds 0-8 ran before it in the same worker) and never when seed 9
ran alone (``--replay 9``: 0/3, 0/5); sm90_attention/missing_init_fence likewise at seed 1
(0/5). Here a fake kernel with that property (it faults only when earlier launches of its
process left a trace) runs through the real seed loop (engine/perturb_runs.drive), the real
runner and the real ``cutedebug run`` front end: the report prints the exact command that
replays it, with its history, and that command, parsed by the CLI again, reproduces it.
"""

from __future__ import annotations

import shlex
import struct
import sys
from pathlib import Path

import pytest

from cutedebug.commands import cli, perturb_args
from cutedebug.engine import perturb_runs as R
from cutedebug.engine import runner
from cutedebug.engine import verdict as V
from cutedebug.instrument import perturb_plan as P

ROOT = Path(__file__).resolve().parents[1]
POS = [
    P.Position(0, "producer", "create", "before", 0, "/k/gemm.py", 340),
    P.Position(1, "producer", "producer_acquire", "after", 0, "/k/gemm.py", 380),
    P.Position(2, "consumer", "consumer_wait", "after", 0, "/k/gemm.py", 420),
    P.Position(3, "consumer", "consumer_release", "before", 0, "/k/gemm.py", 431),
]


class Process:
    """One worker process: its launches leave a residue (say, stale barrier words in shared
    memory) that a later launch delayed at position 0 (before the barriers' init) trips on.
    ``needs``: the earlier launches with a delay at position 3 it takes; 0 = any schedule
    delayed at position 0 faults, whatever ran before (a failure that needs no history)."""

    def __init__(self, needs: int = 2):
        self.needs, self.residue, self.rows = needs, 0, []
        self.launches = 0

    def write(self, raw: bytes) -> None:
        self.rows = [struct.unpack_from("<16i", raw, i * 64) for i in range(len(raw) // 64)]

    def launch(self) -> R.OneRun:
        self.launches += 1
        delayed = {i for i, row in enumerate(self.rows) if row[0]}
        if 0 in delayed and self.residue >= self.needs:
            msg = "CUDA error: unspecified launch failure"
            return R.OneRun(
                "CRASH", [("cuda_error", {"name": "cudaErrorLaunchFailure", "message": msg})]
            )
        self.residue += 3 in delayed
        return R.OneRun("PASS", [("checked", {"ok": True, "digest": "d"})], "d")


def drive(request: dict, process: Process | None = None) -> dict:
    """The worker's seed loop in a fresh process; the summary event it emitted."""
    process = process or Process()
    events: list[tuple[str, dict]] = []
    R.drive(
        R.spec_from_request(request),
        POS,
        process.write,
        process.launch,
        lambda event, /, **f: events.append((event, f)),
        ctas=8,
        iterations=16,
        deterministic=False,
        warps=12,
    )
    summary = dict(events)["perturb_summary"]
    summary["launched"] = [f["seed"] for n, f in events if n == "perturb_seed"]
    return summary


RANDOM = {"name": "random"}


def exposing_seed() -> int:
    """The first seed that faults after its predecessors in one process (checked > 0 below)."""
    s = drive({"n": 64, "seed": 0, "policy": RANDOM})
    assert s["exposed_by"] is not None
    return s["exposed_by"]


# ---- the seed loop ---------------------------------------------------------------------------


def test_the_summary_names_the_seeds_that_ran_before_the_exposing_one():
    seed = exposing_seed()
    s = drive({"n": 64, "seed": 0, "policy": RANDOM})
    assert seed > 0 and s["exposing_outcome"] == "CRASH"
    assert s["history_from"] == 0 and s["seeds"] == list(range(seed + 1))
    assert s["replay_of"] is None
    # a failure that needs no history, exposed by the first seed run: no history to name
    first = drive({"n": 64, "seed": seed, "policy": RANDOM}, Process(needs=0))
    assert first["exposed_by"] == seed and first["history_from"] is None


def test_the_seed_alone_does_not_fault_and_with_its_history_it_does():
    seed = exposing_seed()
    alone = drive({"n": 1, "replay": seed, "policy": RANDOM})
    assert alone["exposed_by"] is None and alone["replay_of"] == seed  # the H200's 0/3
    again = drive({"n": 1, "replay": seed, "replay_from": 0, "policy": RANDOM})
    assert again["launched"] == list(range(seed + 1))  # in order, one process
    assert again["exposed_by"] == seed and again["exposing_outcome"] == "CRASH"
    assert again["replay_of"] == seed and again["history_from"] == 0


def test_an_earlier_seed_that_exposes_is_reported_as_itself_never_as_the_replayed_one():
    seed = exposing_seed()
    later = drive({"n": 1, "replay": seed + 3, "replay_from": 0, "policy": RANDOM})
    assert later["launched"] == list(range(seed + 1))  # stopped where it faulted
    assert later["exposed_by"] == seed and later["replay_of"] == seed + 3
    from types import SimpleNamespace

    from cutedebug.reporting import perturbation

    line = perturbation.summary_line(SimpleNamespace(evidence={"perturbation": later}))
    assert f"replay of seed {seed + 3} after seeds 0-{seed + 2}: seed {seed}, BEFORE it" in line
    assert f"not seed {seed + 3}'s" in line


def test_a_replay_from_after_the_seed_is_refused_before_any_launch():
    with pytest.raises(P.PerturbError, match="the first seed must be 0..4"):
        R.spec_from_request({"replay": 4, "replay_from": 5})


def test_a_killed_run_names_its_history_from_its_seed_events():
    o = V.Outcome(returncode=-9, killed_by_watchdog="deadline:launched")
    for i, ev in enumerate(
        [
            {"event": "perturb_positions", "positions": [], "policy": RANDOM, "replay_of": 6},
            *[{"event": "perturb_seed", "seed": s, "tag": "seed", "rules": []} for s in (4, 5, 6)],
        ]
    ):
        o.add({"t": float(i), **ev})
    p = R.evidence(o)["perturbation"]
    assert p["exposed_by"] == 6 and p["history_from"] == 4 and p["replay_of"] == 6


# ---- the command the report prints ----------------------------------------------------------


def _request(argv: list[str]) -> dict:
    args = cli.build_parser("run").parse_args(["run", "x.toml", *argv])
    return perturb_args.request_field(args)


@pytest.mark.parametrize(
    "typed",
    [
        "--perturb 32",
        "--perturb 32 --seed=3 --shrink --deadline 30",
        "--perturb=32 --policy role --perturb-role consumer --perturb-scope 'rank=1 warp=0' "
        "--see 3 --shr",
        "--perturb 8 --perturb-density 0.25 --perturb-delay-us 20 --replay 5",
    ],
)
def test_the_replay_command_parses_back_to_the_same_policy_and_seeds(typed):
    request = _request(shlex.split(typed))
    base = f"cutedebug run scenarios/sm90_gemm/missing_init_fence.toml {typed} --runs-dir r"
    cmd = perturb_args.replay_command(base, request["policy"], 9, 0)
    argv = shlex.split(cmd)
    assert argv[:3] == ["cutedebug", "run", "scenarios/sm90_gemm/missing_init_fence.toml"]
    assert argv[-4:] == ["--replay", "9", "--replay-from", "0"]
    assert "--runs-dir" in argv and ("--deadline" in argv) == ("--deadline" in typed)
    again = _request(argv[3:])
    assert again["policy"] == request["policy"]
    assert (again["replay"], again["replay_from"], again["shrink"]) == (9, 0, False)
    alone = _request(shlex.split(perturb_args.replay_command(base, request["policy"], 9, None))[3:])
    assert (alone["replay"], alone["replay_from"]) == (9, None)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--replay-from", "3"], "--replay-from 3 needs --replay SEED"),
        (
            ["--replay", "2", "--replay-from", "5"],
            "--replay-from 5: allowed 0..2 (at most --replay)",
        ),
        (["--replay", "5000", "--replay-from", "0"], "5001 seeds, allowed at most 4096"),
        (["--replay", "2", "--replay-from", "x"], "argument --replay-from: 'x': a seed is a whole"),
    ],
)
def test_bad_replay_from_exits_2_naming_the_option(argv, says, tmp_path, capsys):
    sc = ROOT / "scenarios/minimal/clean.toml"
    rc = cli.main(["run", str(sc), "--no-warm", "--runs-dir", str(tmp_path), *argv])
    assert rc == 2
    err = capsys.readouterr().err
    assert says in err, err


# ---- end to end: `cutedebug run --perturb`, its report, the printed command run again ----------


def main(monkeypatch, argv: list[str]) -> int:
    monkeypatch.setattr(sys, "argv", ["cutedebug", *argv])  # what the report's command quotes
    return cli.main(argv)


def test_cutedebug_run_prints_the_command_that_replays_it_and_that_command_does(
    tmp_path, monkeypatch, capsys
):
    """Each worker is a fresh Process (the fake kernel); the real runner, verdicts, evidence,
    report and terminal line."""
    sc_path = ROOT / "scenarios/minimal/clean.toml"
    requests = []

    def attempt(scenario, run_dir, *, mode, forkserver, gpu_token, **kw):
        request = kw["request_extra"]["perturb"]
        requests.append(request)
        o = V.Outcome(returncode=0)
        n = [0]

        def emit(event, /, **fields):
            o.add({"t": float(n[0]), **fields, "event": event})
            n[0] += 1

        emit("compiled", secs=0.1)
        process = Process()
        spec = R.spec_from_request(request)
        R.drive(spec, POS, process.write, process.launch, emit, ctas=8, iterations=16,
                deterministic=False, warps=12)  # fmt: skip
        emit("done")
        return V.classify(o), o, {"t_call": 0.0, "t_return": 1.0}, None

    monkeypatch.setattr(runner, "_attempt", attempt)
    seed = exposing_seed()
    argv = ["run", str(sc_path), "--no-warm", "--runs-dir", str(tmp_path), "--perturb", "32"]
    main(monkeypatch, argv)
    out = capsys.readouterr().out
    assert out.startswith("CRASH"), out
    line = next(x for x in out.splitlines() if x.strip().startswith("replay (with"))
    assert f"replay (with seeds 0-{seed - 1} before it): cutedebug run " in line
    cmd = line.split("before it): ", 1)[1]
    assert cmd.endswith(f"--replay {seed} --replay-from 0") and "--perturb" not in cmd
    md = next(tmp_path.glob("*/report.md")).read_text()
    reproduce = md.split("## Reproduce", 1)[1]
    # the same exact command, first in the Reproduce section
    assert reproduce.split("```")[1].strip() == cmd
    assert f"after seeds 0-{seed - 1} in the same process" in md
    assert f"Seed {seed} alone, in a fresh worker: `" in reproduce

    # the printed command, run as printed: seed `seed` faults again, after the same seeds
    for old in tmp_path.glob("*"):
        old.rename(tmp_path.parent / f"done-{old.name}-{id(old)}")
    main(monkeypatch, shlex.split(cmd)[1:])
    out = capsys.readouterr().out
    assert out.startswith("CRASH"), out
    assert requests[-1]["replay"] == seed and requests[-1]["replay_from"] == 0
    assert f"replay of seed {seed} after seeds 0-{seed - 1}: reproduced (CRASH)" in out
    # and the seed alone, as the H200 ran it: not reproduced, and said so
    alone = shlex.split(cmd)[1:-2]
    main(monkeypatch, alone)
    out = capsys.readouterr().out
    assert out.startswith("PASS"), out
    assert f"replay of seed {seed}: NOT reproduced, no seed exposed a failure" in out
