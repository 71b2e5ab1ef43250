"""triage --perturb N: the request reaches every GPU run (not the compiles), the matrix shows the
exposing seed in its "exposed by perturbation" column, and detection counts it."""

from __future__ import annotations

import json

import pytest
from test_triage import H200, FakeEngine, run_triage, scenarios_dir

from cutedebug.commands import triage as T
from cutedebug.engine import runner


class PerturbedEngine(FakeEngine):
    def __init__(self, exposed: dict[str, tuple[int, str]]):
        super().__init__()
        self.exposed, self.perturb_seen = exposed, []

    def __call__(self, sc, *, perturb=None, mode="run", **kw):
        self.perturb_seen.append((sc.id, mode, perturb))
        res = super().__call__(sc, mode=mode, **kw)
        if mode == "run" and perturb:
            hit = self.exposed.get(sc.id)
            res.evidence["perturbation"] = {
                "runs": (hit[0] + 1) if hit else perturb["n"],
                "exposed_by": hit[0] if hit else None,
                "exposing_outcome": hit[1] if hit else None,
                "described": [f"a 20 us delay before consumer_release at k-tile {hit[0]}"]
                if hit
                else None,
                # seeds history_from..exposed_by-1 ran before it in its worker
                "history_from": hit[2] if hit and len(hit) > 2 else None,
            }
            if hit:
                res.verdict = type(res.verdict)(hit[1])
        return res


@pytest.fixture
def perturbed(monkeypatch):
    def install(exposed):
        fake = PerturbedEngine(exposed)
        monkeypatch.setattr(runner, "run_scenario", fake)
        monkeypatch.setattr(T, "detect_gpu", lambda: H200)
        monkeypatch.setattr(runner, "health_check", lambda **kw: {"healthy": True})
        monkeypatch.setattr(runner, "start_forkserver", lambda *a, **k: None)
        return fake

    return install


def test_exposed_scenarios_show_their_seed_and_count_in_detection(tmp_path, perturbed):
    scenarios_dir(
        tmp_path,
        {
            "clean": ("PASS", None),
            "latent": ("PASS", "skip_producer_tail"),
            "hidden": ("PASS", "missing_init_fence"),
        },
    )
    fake = perturbed({"k/latent": (3, "HANG")})
    spec = {"n": 8, "seed": 0, "shrink": False, "policy": {"name": "random"}}
    rc, lines, out = run_triage(tmp_path, perturb=spec)
    runs = {(sid, mode): p for sid, mode, p in fake.perturb_seen}
    assert runs[("k/latent", "run")] == spec and runs[("k/clean", "run")] == spec
    assert all(p is None for (sid, mode), p in runs.items() if mode == "compile")
    m = json.loads((out / "matrix.json").read_text())
    assert m["rates"]["counts"]["exposed_by_perturbation"] == 1
    assert m["rates"]["detection"]["hits"] == 1 and m["rates"]["detection"]["of"] == 2
    md = (out / "matrix.md").read_text()
    assert "exposed by perturbation" in md
    row = next(line for line in md.splitlines() if "k/latent" in line and "seed 3" in line)
    assert "seed 3: HANG" in row
    assert "none of 8 seeds" in next(
        line for line in md.splitlines() if "k/hidden" in line and "seeds" in line
    )
    assert "1 exposed by perturbation (counted in detection)" in md


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--perturb", "0"], "argument --perturb: 0: allowed 1..4096"),
        (["--perturb", "nan"], "a whole number of seeds"),
        (["--shrink"], "--shrink needs --perturb N or --replay SEED"),
        (["--perturb", "4", "--policy", "role"], "--policy role needs role=producer|consumer"),
        (["--perturb", "4", "--perturb-density", "nan"], "allowed (0, 1]"),
        (["--perturb", "4", "--perturb-delay-us", "0"], "allowed (0, 10000] microseconds"),
    ],
)
def test_bad_perturbation_options_exit_2_naming_the_option(argv, says, tmp_path, capsys):
    from cutedebug.commands import cli

    scenarios_dir(tmp_path, {"clean": ("PASS", None)})
    sc = tmp_path / "scen" / "k" / "clean.toml"
    with pytest.raises(SystemExit) as e:
        rc = cli.main(["run", str(sc), "--runs-dir", str(tmp_path / "runs"), *argv])
        raise SystemExit(rc)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert says in err, err


def test_an_exposure_after_earlier_seeds_names_them_and_its_report_the_replay_with_them(
    tmp_path, perturbed
):
    """The H200's sm90_gemm/missing_init_fence: CRASH at seed 9 after seeds 0-8, never alone."""
    scenarios_dir(tmp_path, {"hidden": ("PASS", "missing_init_fence")})
    perturbed({"k/hidden": (9, "CRASH", 0)})
    spec = {"n": 32, "seed": 0, "shrink": False, "policy": {"name": "random"}}
    rc, lines, out = run_triage(tmp_path, perturb=spec)
    md = (out / "matrix.md").read_text()
    row = next(line for line in md.splitlines() if "k/hidden" in line and "seed 9" in line)
    assert "seed 9 (after 0-8): CRASH" in row
    rec = json.loads(next((out / "results").glob("*.json")).read_text())
    cmd = rec["run"]["perturbation"]["replay_command"]
    assert cmd.startswith("cutedebug run ") and cmd.endswith("--replay 9 --replay-from 0")
    report = next(tmp_path.rglob("report.md")).read_text()
    assert cmd in report.split("## Reproduce", 1)[1]
    assert "**Seed 9** exposed it: CRASH, after seeds 0-8 in the same process" in report
