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
from helpers.sanitize_runs import SCEN, fake_env, replayed_race, report_md, tool_report

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
    r = replayed_race(
        fake_sanitizer, tmp_path / "runs", "--referee", "0", expect="RACE", events=events
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


def test_a_race_in_a_raw_mbarrier_kernel_shows_its_caveat(fake_sanitizer, tmp_path):
    """A kernel with no pipeline whose compile recorded raw mbarrier waits (the worker's
    protocol_sites event, raw_waits: before, raw waits were never among its sites, so this
    branch of the caveat could not fire)."""
    wait = {"op": "mbarrier_wait", "pipeline": None, "file": "/k/handoff.py", "line": 66}
    events = {"compiled": {"pipelines": []}, "protocol_sites": {"sites": [], "raw_waits": [wait]}}
    r = replayed_race(
        fake_sanitizer, tmp_path / "runs", "--referee", "0", expect="RACE", events=events
    )
    _, _, res = tool_report(r, "racecheck")
    assert "(1 raw mbarrier wait line(s))" in res["caveat"]


def test_a_race_without_mbarriers_has_no_caveat(fake_sanitizer, tmp_path):
    r = replayed_race(fake_sanitizer, tmp_path / "runs", expect="RACE")
    assert "caveat" not in r.stdout
    _, md, res = tool_report(r, "racecheck")
    assert res["caveat"] is None and "Caveat" not in md and res["referee"] is None


def _compiled(sc, run_dir: Path, **run_kw):
    """The Compiled and ProtocolSites events of a compile-only run of scenario ``sc``."""
    from cutedebug.engine import runner
    from cutedebug.event_kinds import Compiled, ProtocolSites

    _, outcome, _ = runner.run_once(sc, run_dir, mode="compile", **run_kw)
    compiled, sites = outcome.last(Compiled), outcome.last(ProtocolSites)
    assert compiled is not None, (run_dir / "worker.log").read_text()[-3000:]
    return compiled, sites


def _field_compiled(name: str, tmp_path: Path):
    from cutedebug.engine import scenario as S

    sc = S.load(FIELD / name / "clean.toml")
    if sc.missing_modules():
        pytest.skip(f"field libraries not installed: {sc.missing_modules()}")
    # The pipelines and protocol sites are recorded while tracing: the worker stops after the
    # trace (CUTE_DSL_DRYRUN; the lowering of these kernels is their scenarios' compile items')
    return _compiled(sc, tmp_path / name, extra_env={"CUTE_DSL_DRYRUN": "1"})


@pytest.mark.parametrize(
    "name, classes",
    [
        ("fa4_bwd_sm90", ["PipelineTmaAsync", "PipelineTmaAsync"]),
        ("quack_gemm_sm90", ["PipelineTmaAsync", "PipelineAsync"]),
    ],
)
@pytest.mark.slow  # two field-library compiles, 10-12 s each
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


# ---- the referee's schedules (engine/perturb_runs: referee_plans, drive) --------------------
def _positions():
    from cutedebug.instrument import perturb_plan as P

    return [
        P.Position(0, "producer", "create", "before", 0, "/k/k.py", 10),
        P.Position(1, "producer", "producer_acquire", "after", 0, "/k/k.py", 20),
        P.Position(2, "producer", "producer_commit", "after", 0, "/k/k.py", 22),
        P.Position(3, "consumer", "consumer_wait", "after", 0, "/k/k.py", 30),
        P.Position(4, "consumer", "consumer_release", "before", 0, "/k/k.py", 34),
    ]


def test_referee_plans_cycle_roles_targets_and_random():
    from cutedebug.engine.perturb_runs import referee_plans

    plans = referee_plans(_positions(), 12)
    assert [s for s, _ in plans] == list(range(12))
    got = [
        (p.name, p.role, p.target, p.delay_us) for _, p in plans
    ]  # round-robin over the four families, widest delays first
    assert got[:8] == [
        ("role", "producer", None, 50.0),
        ("role", "consumer", None, 50.0),
        ("targeted", None, 4, 200.0),  # before consumer_release first
        ("random", None, None, None),
        ("role", "producer", None, 200.0),
        ("role", "consumer", None, 200.0),
        ("targeted", None, 1, 200.0),  # then after producer_acquire
        ("random", None, None, None),
    ]
    assert [p.target for _, p in plans if p.name == "targeted"] == [4, 1, 3]
    # create is never a target (an init race is not the hand-off's window)
    assert all(p.target != 0 for _, p in plans)
    # a raw-mbarrier kernel (role "any"): targeted and random only
    from cutedebug.instrument import perturb_plan as P

    raw = [
        P.Position(0, "any", "mbarrier_init", "before", None, "/k/r.py", 5),
        P.Position(1, "any", "mbarrier_arrive", "before", None, "/k/r.py", 9),
    ]
    assert [(p.name, p.target) for _, p in referee_plans(raw, 3)] == [
        ("targeted", 1),
        ("random", None),
        ("targeted", 1),
    ]
    assert referee_plans([], 8) == []


def _drive_referee(spec, outcome_of):
    import struct

    from cutedebug.engine import perturb_runs as R

    table, events = {}, []

    def write(raw):
        table["rows"] = [struct.unpack_from("<16i", raw, i * 64) for i in range(len(raw) // 64)]

    def launch():
        out = outcome_of(table["rows"])
        return R.OneRun(out, [("checked", {"ok": out == "PASS", "digest": "d"})], "d")

    R.drive(
        R.spec_from_request(spec),
        _positions(),
        write,
        launch,
        lambda name, **f: events.append((name, f)),
        ctas=4,
        iterations=8,
        deterministic=False,
        warps=8,
    )
    return events


def test_referee_drive_names_each_seeds_policy_and_the_exposing_one():
    # the "race": shows only when the consumer's release is delayed by 100 us or more
    def release_late(rows):
        return "MISMATCH" if rows[4][0] >= 100_000 else "PASS"

    spec = {"n": 16, "seed": 0, "referee": True, "policy": {"name": "random"}}
    ev = _drive_referee(spec, release_late)
    seeds = [f for n, f in ev if n == "perturb_seed"]
    summary = dict(ev)["perturb_summary"]
    # role consumer 50 us (seed 1) does not reach 100 us; the targeted 200 us (seed 2) does
    assert [s["seed"] for s in seeds] == [0, 1, 2]
    assert seeds[1]["policy"]["role"] == "consumer" and seeds[1]["policy"]["delay_us"] == 50.0
    assert summary["exposed_by"] == 2 and summary["exposing_outcome"] == "MISMATCH"
    pol = summary["exposing_policy"]
    assert (pol["name"], pol["target"], pol["delay_us"]) == ("targeted", 4, 200.0)
    assert summary["described"] == [
        "a 200 us delay before consumer_release of pipeline 0 (k.py:34) (consumer) in every CTA"
    ]
    assert summary["referee"] == {
        "runs": {"role producer": 1, "role consumer": 1, "targeted": 1},
        "targets": ["before consumer_release of pipeline 0 (k.py:34)"],
        "targets_total": 1,
    }
    # the replay the report prints (the seed under its own policy, as `cutedebug run` builds
    # it from --replay / --policy / --perturb-target / --perturb-delay-us) gives the same rules
    from cutedebug.analyses.sanitizer.referee import replay_args

    args = replay_args(2, pol)
    assert args == [
        "--perturb", "1", "--replay", "2", "--policy", "targeted",
        "--perturb-target", "4", "--perturb-delay-us", "200",
    ]  # fmt: skip
    replay = {"n": 1, "seed": 0, "replay": 2, "policy": {"name": "targeted", "target": 4,
              "delay_us": 200.0}}  # fmt: skip
    again = dict(_drive_referee(replay, release_late))["perturb_summary"]
    assert again["exposing_rules"] == summary["exposing_rules"]
    # and the referee's own replay of seed 2 (the rerun with probes after a hang) too
    own = dict(_drive_referee({**spec, "replay": 2}, release_late))["perturb_summary"]
    assert own["exposing_rules"] == summary["exposing_rules"] and own["runs"] == 1


def test_referee_drive_all_matched_and_no_position():
    spec = {"n": 8, "seed": 0, "referee": True, "policy": {"name": "random"}}
    summary = dict(_drive_referee(spec, lambda rows: "PASS"))["perturb_summary"]
    assert summary["runs"] == 8 and summary["exposed_by"] is None
    assert summary["referee"]["runs"] == {
        "role producer": 2,
        "role consumer": 2,
        "targeted": 2,
        "random": 2,
    }
    from cutedebug.engine import perturb_runs as R

    events = []
    R.drive(
        R.spec_from_request(spec),
        [],
        lambda raw: None,
        lambda: R.OneRun("PASS", [("checked", {"ok": True})], "d"),
        lambda name, **f: events.append((name, f)),
        ctas=1,
        iterations=None,
        deterministic=False,
    )
    summary = dict(events)["perturb_summary"]
    assert summary["runs"] == 1 and summary["referee"] is None  # one launch as it is


# ---- the referee's verdict (analyses/sanitizer/referee.judge) ------------------------------
def test_referee_judge_table():
    from cutedebug.analyses.sanitizer.referee import judge

    ran = {"positions": 14, "runs": 32, "exposed_by": None}
    out, why = judge("PASS", "output matches", ran, 32)
    assert out == "UNCONFIRMED" and why.startswith("all 32 perturbed run(s) matched")
    assert "neither shown nor ruled out" in why
    hit = {"positions": 14, "runs": 7, "exposed_by": 6, "exposing_outcome": "MISMATCH"}
    out, why = judge("MISMATCH", "max error 3", hit, 32)
    assert (out, why) == (
        "CONFIRMED",
        "perturbed run 7 of 32 (seed 6) gave MISMATCH: the hazard's order is not enforced",
    )
    killed = {"positions": 14, "runs": 3, "exposed_by": 2, "killed_during": "seed"}
    assert judge("HANG", "killed", killed, 32) == (
        "CONFIRMED",
        "perturbed run 3 of 32 (seed 2) gave HANG (killed at the deadline during that seed's "
        "launch): the hazard's order is not enforced",
    )
    out, why = judge("UNSUPPORTED", "execution skipped: no GPU", {}, 32)
    assert out == "NOT_RUN" and "no GPU" in why
    out, why = judge("PASS", "ok", {"positions": 0, "runs": 1}, 32)
    assert out == "NOT_RUN" and "no delay position" in why
    out, why = judge("HARNESS_ERROR", "ours", {"positions": 3, "runs": 1}, 32)
    assert out == "NOT_RUN" and why.endswith("ours")


# ---- `cutedebug sanitize` with the referee, end to end ---------------------------------------
def _perturbed_result(outcome_of, verdict):
    """What runner.run_scenario gives for the referee's perturbed run: the evidence built by
    the engine (perturb_runs.evidence) from the events drive() emits over a fake launch."""
    from types import SimpleNamespace

    from cutedebug.engine import perturb_runs as R
    from cutedebug.engine import verdict as V

    spec = {"n": 32, "seed": 0, "referee": True, "policy": {"name": "random"}}
    o = V.Outcome(returncode=0)
    o.add({"t": 0.0, "event": "compiled"})
    for i, (name, fields) in enumerate(_drive_referee(spec, outcome_of)):
        o.add({"t": float(i + 1), "event": name, **fields})
    return SimpleNamespace(
        verdict=V.Verdict(verdict), reason="from the fake run", evidence=R.evidence(o)
    )


@pytest.mark.parametrize("confirmed", [True, False])
def test_sanitize_referees_a_caveated_race(
    fake_sanitizer, tmp_path, monkeypatch, capsys, confirmed
):
    from cutedebug.commands.cli import main
    from cutedebug.engine import runner

    def release_late(rows):
        return "MISMATCH" if confirmed and rows[4][0] >= 100_000 else "PASS"

    asked = []

    def run_scenario(sc, *, run_dir, perturb, **kw):
        asked.append((sc.id, perturb, kw))
        return _perturbed_result(release_late, "MISMATCH" if confirmed else "PASS")

    monkeypatch.setattr(runner, "run_scenario", run_scenario)
    events = {"compiled": {"pipelines": FA4_BWD_PIPELINES}}
    for k, v in fake_env(fake_sanitizer, "racecheck_raw", "simulate", events=events).items():
        monkeypatch.setenv(k, v)
    scen = str(SCEN / "clean.toml")
    rc = main(["sanitize", scen, "--tool", "racecheck", "--no-plain", "--expect", "RACE",
               "--referee", "32", "--runs-dir", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    ((sid, spec, _),) = asked  # one referee run: 32 schedules after one compile
    assert sid == "minimal/clean" and spec["n"] == 32 and spec["referee"] is True
    lines = out.splitlines()
    md = report_md(out)
    res = json.loads((md.parent / "sanitize.json").read_text())["tools"]["racecheck"]
    ref = res["referee"]
    assert res["verdict"] == "RACE"  # the class is kept either way
    if confirmed:
        assert lines[0].startswith("racecheck: RACE — RAW_HAZARD at race_smem.py:28")
        assert (ref["outcome"], ref["exposed_by"], ref["runs"]) == ("CONFIRMED", 2, 3)
        replay = (
            f"cutedebug run {scen} --perturb 1 --replay 2 --policy targeted "
            "--perturb-target 4 --perturb-delay-us 200"
        )
        assert ref["replay"] == replay
        assert lines[2] == (
            "  referee: CONFIRMED — perturbed run 3 of 32 (seed 2) gave MISMATCH: "
            "the hazard's order is not enforced; a 200 us delay before consumer_release of "
            f"pipeline 0 (k.py:34) (consumer) in every CTA; replay: {replay}"
        )
        assert "**racecheck → RACE (CONFIRMED by a perturbed run)**" in md.read_text()
        assert "**Referee: CONFIRMED**" in md.read_text()
    else:
        assert (ref["outcome"], ref["exposed_by"], ref["replay"]) == ("UNCONFIRMED", None, None)
        assert ref["schedules"] == {
            "role producer": 8,
            "role consumer": 8,
            "targeted": 8,
            "random": 8,
        }
        assert lines[2].startswith(
            "  referee: UNCONFIRMED — all 32 perturbed run(s) matched the reference; racecheck "
            "does not credit mbarrier ordering"
        )
        assert lines[2].endswith(
            "(schedules: 8 role producer, 8 role consumer, 8 targeted (at 4 position(s)), 8 random)"
        )
        text = md.read_text()
        assert "**racecheck → RACE (UNCONFIRMED: 32 perturbed runs matched)**" in text
        assert "CLEAN" not in text.split("## compute-sanitizer")[0]


def test_sanitize_referee_without_a_gpu_is_not_run(fake_sanitizer, tmp_path):
    """The real referee run on this CPU machine: the worker compiles the kernel with the delay
    positions, cannot launch it, and the referee says it was not run, and why."""
    events = {"compiled": {"pipelines": FA4_BWD_PIPELINES}}
    r = replayed_race(
        fake_sanitizer, tmp_path / "runs", "--referee", "4", expect="RACE", events=events
    )
    _, md, res = tool_report(r, "racecheck")
    ref = res["referee"]
    assert (ref["outcome"], ref["run_verdict"], ref["asked"]) == ("NOT_RUN", "UNSUPPORTED", 4)
    assert ref["reason"].startswith("no perturbed run was made: UNSUPPORTED: execution skipped")
    assert "racecheck → RACE (not refereed)" in md
    assert r.stdout.splitlines()[2].startswith("  referee: NOT_RUN — no perturbed run was made")


# ---- the sample scenarios the GPU step referees (tools/sanitizer_samples) -------------------
SAMPLES = REPO / "tools" / "sanitizer_samples"


@pytest.mark.parametrize(
    "toml, mode, waits",
    [
        ("mbarrier_handoff_clean.toml", "mbarrier", 14),
        ("mbarrier_handoff_nowait.toml", "nowait", 6),
    ],
)
def test_handoff_samples_are_caveated_and_perturbable(toml, mode, waits, tmp_path, monkeypatch):
    """Both sample scenarios compile for sm_90a with raw mbarrier waits among their protocol
    sites (so a RACE of theirs carries the caveat and is refereed): the correct hand-off waits
    on full and empty (8 + 6 unrolled waits), the race only on empty (the producer's 6); and
    the referee's first targeted schedules delay after those waits, in code that reads its
    row of the rule table."""
    import cutlass.cute as cute

    from cutedebug import kernel_api
    from cutedebug.engine import scenario as S
    from cutedebug.engine.perturb_runs import referee_plans
    from cutedebug.instrument import perturb

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    sc = S.load(SAMPLES / toml)
    assert sc.params == {"mode": mode} and Path(sc.kernel_file).name == "mbarrier_handoff.py"
    compiled, sites = _compiled(sc, tmp_path / "c", lineinfo=True)
    raw_waits = sites.raw_waits
    assert {(Path(s["file"]).name, s["pipeline"]) for s in raw_waits} == {
        ("mbarrier_handoff.py", None)
    }
    caveat = mbarrier_caveat("RACE", compiled.pipelines, sites.sites + raw_waits)
    assert caveat is not None and "raw mbarrier wait line(s)" in caveat

    cls = kernel_api.load_entry(sc.kernel_file, sc.kernel_entry)
    k = cls(mode=mode)
    opts = (cute.GPUArch("sm_90a"), cute.KeepPTX())
    plain = cute.compile[opts](k, *k.fake_args()).__ptx__
    assert plain.count("mbarrier.try_wait") == waits
    with perturb.instrument(0x7E0000000000) as sess:
        ptx = cute.compile[opts](k, *k.fake_args()).__ptx__
    assert ptx.count("%globaltimer") == 2 * len(sess.positions)  # one delay loop each
    plans = referee_plans(sess.positions, 8)
    first = sess.positions[plans[0][1].target]
    assert (first.op, first.where) == ("mbarrier_wait", "after")
    assert {p.name for _, p in plans} == {"targeted", "random"}  # raw ops have no role
