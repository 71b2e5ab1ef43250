"""tools/gpu_pending.py: the catalogue of device checks stays runnable as the code moves.

Every scenario, tool and example a step names must exist (a renamed scenario would otherwise
surface only on the GPU, inside a call that costs device time), every step must fit one device
call, and running a step without the wheels it needs says so instead of failing half-way.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import gpu_pending  # noqa: E402


def _paths(command: str) -> set[str]:
    return set(
        re.findall(
            r"(?:scenarios|tools|examples|reports)/[\w./-]+\.(?:toml|py|json)(?:\.gz)?", command
        )
    )


@pytest.mark.parametrize("step", gpu_pending.STEPS, ids=lambda s: s.name)
def test_every_file_a_step_names_exists(step):
    for p in _paths(step.command):
        assert (ROOT / p).is_file(), f"{step.name}: {p} does not exist"
    for d in re.findall(r"scenarios/field/\$k|scenarios/(?:field|\w+)(?=\s|/?;)", step.command):
        assert "$" in d or (ROOT / d).is_dir(), d


def test_latent_and_clean_scenarios_exist_and_are_what_they_say():
    import tomllib

    for name in gpu_pending.LATENT + gpu_pending.CLEAN:
        path = ROOT / "scenarios" / f"{name}.toml"
        assert path.is_file(), path
        data = tomllib.loads(path.read_text())
        faulted = bool(data.get("fault") or data.get("faults"))
        assert faulted == (name in gpu_pending.LATENT), (name, data.get("fault"))
    for fam in gpu_pending.FAMILIES:
        assert (ROOT / "scenarios" / fam).is_dir(), fam


def _note(name: str) -> str:
    import tomllib

    return tomllib.loads((ROOT / "scenarios" / f"{name}.toml").read_text())["expect"]["note"]


def test_the_field_latent_faults_are_faulted_pass_scenarios_each_with_its_prediction():
    """#20's field population: faulted, expected PASS, each note's perturbation prediction
    either a written reason (benign by construction) or the schedule a check runs, named in
    the note with the same flags (cutedebug run's spelling: --perturb-target for --target)."""
    import tomllib

    checks = {i: (name, flags) for name, flags, ids in gpu_pending.PERTURB_CHECKS for i in ids}
    field = gpu_pending.LATENT_FIELD
    assert len(field) == len(set(field)) == 12
    assert {i for i in checks if i.startswith("field/")} <= set(field)
    for name in field:
        data = tomllib.loads((ROOT / "scenarios" / f"{name}.toml").read_text())
        assert data.get("fault") and data["expect"]["verdict"] == "PASS", name
        note = _note(name)
        assert "Schedule perturbation (issue 20): predicted" in note, name
        benign = "predicted benign by construction" in note
        assert benign != (name in checks), name  # a reason or a schedule, never both
        if not benign:
            flags = (
                checks[name][1].replace("--", "--perturb-").replace("--perturb-policy", "--policy")
            )
            assert flags in note, (name, flags)
    runs = gpu_pending.BY_NAME["perturb_field_quack"].command
    runs += gpu_pending.BY_NAME["perturb_field_fa4"].command
    assert all(runs.count(f"scenarios/{n}.toml") == 1 for n in field)
    assert "--seeds 32" in runs and all(
        gpu_pending.BY_NAME[s].wheels
        for s in ("perturb_field_quack", "perturb_field_fa4", "perturb_field_checks")
    )


def test_the_field_checks_run_apart_from_the_projects():
    own = gpu_pending.BY_NAME["perturb"].command
    field = gpu_pending.BY_NAME["perturb_field_checks"].command
    assert "scenarios/field/" not in own
    for name, flags, ids in gpu_pending.PERTURB_CHECKS:
        for i in ids:
            cmd = field if i.startswith("field/") else own
            seg = [c for c in cmd.split("; ") if f"$STEP_OUT/{name}.json" in c]
            assert len(seg) == 1 and flags in seg[0], (name, i)
            assert f"scenarios/{i}.toml" in seg[0], (name, i)


def test_field_copies_cover_every_field_kernel():
    import fnmatch

    patterns = [
        p for s in gpu_pending.STEPS for p in re.findall(r"cp -r scenarios/field/(\S+) ", s.command)
    ]
    kernels = [d.name for d in (ROOT / "scenarios" / "field").iterdir() if any(d.glob("*.toml"))]
    covered = {k for k in kernels for p in patterns if fnmatch.fnmatch(k, p)}
    assert covered == set(kernels), (patterns, kernels)


def test_field_sanitize_kernels_have_clean_scenarios():
    step = gpu_pending.BY_NAME["field_sanitize"]
    kernels = re.search(r"for k in ([\w ]+); do", step.command).group(1).split()
    for k in kernels:
        assert (ROOT / "scenarios" / "field" / k / "clean.toml").is_file(), k


def test_plan_fits_calls_and_keeps_order():
    calls = gpu_pending.plan(gpu_pending.STEPS, 540)
    flat = [s.name for c in calls for s in c]
    assert sorted(flat) == sorted(s.name for s in gpu_pending.STEPS)
    for c in calls:
        assert sum(s.seconds for s in c) <= 540 or len(c) == 1
        assert len({s.wheels for s in c}) == 1  # a call carries the wheels or not at all
    assert all(s.seconds * 1.5 <= 600 for s in gpu_pending.STEPS)  # one command's limit


def test_a_wheel_step_without_wheels_is_reported_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_pending, "ROOT", tmp_path)  # no .whl there
    assert gpu_pending.run(["field_fa4"], tmp_path / "out", budget_s=600) == 0
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| field_fa4 | not run (no .whl) |" in summary


def test_a_step_that_does_not_fit_the_budget_is_not_started(tmp_path):
    assert gpu_pending.run(["pytest_gpu"], tmp_path / "out", budget_s=10) == 0
    summary = (tmp_path / "out" / "summary.md").read_text()
    needs = gpu_pending.BY_NAME["pytest_gpu"].seconds
    assert f"not run (budget: 10 s left, needs ~{needs})" in summary
    assert not (tmp_path / "out" / "pytest_gpu" / "log.txt").exists()


def test_unknown_step_is_an_error_naming_the_steps(capsys):
    with pytest.raises(SystemExit) as e:
        gpu_pending.main(["--out", "/tmp/x", "nope"])
    assert e.value.code == 2
    assert "unknown step(s) nope" in capsys.readouterr().err


def test_the_matrix_copy_keeps_every_scenarios_kernel_path(tmp_path):
    """The triage and xdist steps run a copy of the sm_90 families; their TOML files name
    `../../kernels/X.py`, so the copy must sit one level below the repository root (a copy
    under /tmp made every scenario INVALID: 'no such file (/kernels/...)')."""
    import subprocess

    from cutedebug.engine import scenario as S

    for d in ("scenarios", "kernels"):
        (tmp_path / d).symlink_to(ROOT / d)
    copy = gpu_pending._matrix_copy(gpu_pending.MATRIX_DIR)
    for name in ("triage", "xdist"):
        step = gpu_pending.BY_NAME[name].command
        assert step.startswith(copy) and f" {gpu_pending.MATRIX_DIR} " in step, name
    subprocess.run(["bash", "-c", copy], cwd=tmp_path, check=True)
    tomls = sorted((tmp_path / gpu_pending.MATRIX_DIR).rglob("*.toml"))
    assert {p.parent.name for p in tomls} == set(gpu_pending.FAMILIES)
    for p in tomls:
        S.load(p)  # ScenarioError naming the field if its kernel file does not resolve


def test_priority_names_every_step_once_and_sessions_fit_their_budget():
    assert sorted(gpu_pending.PRIORITY) == sorted(gpu_pending.BY_NAME)
    ordered = [gpu_pending.BY_NAME[n] for n in gpu_pending.PRIORITY]
    calls = gpu_pending.plan(ordered, 540)
    sess = gpu_pending.sessions(calls, 1800, 120)
    assert [c for s in sess for c in s] == calls  # every call, in order, once
    for s in sess:
        cost = sum(sum(st.seconds for st in c) + 120 for c in s)
        assert cost <= 1800 or len(s) == 1
    assert sess[0][0][0].name == gpu_pending.PRIORITY[0]  # the order is kept


def _copy_tail(command: str, tmp: Path) -> str:
    """The folders a step makes in $STEP_OUT and its loops copying files there, in order,
    with their /tmp/ folders moved under ``tmp``."""
    parts = re.findall(r"mkdir -p \$STEP_OUT/\w+|for f in [^;]+; do [^;]+; done", command)
    return "; ".join(parts).replace("/tmp/", f"{tmp}/")


def _step_copy(command: str, tmp: Path) -> list[str]:
    """Run a step's copy tail as the step would (bash, $STEP_OUT set): the files it kept."""
    import os
    import subprocess

    out = tmp / "step_out"
    out.mkdir()
    subprocess.run(
        ["bash", "-c", _copy_tail(command, tmp)],
        cwd=ROOT,
        env=dict(os.environ, STEP_OUT=str(out)),
        check=False,
        capture_output=True,
    )
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def test_the_sanitize_rest_step_keeps_each_sanitize_report(tmp_path, fake_sanitizer):
    """sanitize_rest's `cp` of the reports: `cutedebug sanitize --runs-dir D` writes
    D/<run>/sanitize/sanitize.md (made here through the fake compute-sanitizer, the layout the
    command itself makes), and the step must copy each one to $STEP_OUT/md (a glob that
    matches nothing copies nothing, silently, on the GPU)."""
    import os

    from helpers.sanitize_runs import cutedebug_sanitize

    env = dict(
        os.environ,
        COMPUTE_SANITIZER=str(fake_sanitizer),
        FAKE_SANITIZER_CASE="racecheck_clean",
        FAKE_SANITIZER_MODE="simulate",
        CUTE_DSL_ARCH="sm_90a",
    )
    cmd = gpu_pending.BY_NAME["sanitize_rest"].command
    for runs in re.findall(r"--runs-dir /tmp/(\w+)", cmd):
        r = cutedebug_sanitize(
            str(ROOT / "scenarios/minimal/clean.toml"),
            "--tool",
            "racecheck",
            "--no-plain",
            "--runs-dir",
            str(tmp_path / runs),
            env=env,
        )
        assert "report:" in r.stdout, r.stdout + r.stderr
    kept = _step_copy(cmd, tmp_path)
    assert len(kept) == 2 and all(k.startswith("md/minimal__clean-") for k in kept), kept
    assert all(k.endswith("sanitize.md") for k in kept), kept


def test_the_recheck_step_keeps_each_run_report(tmp_path):
    """recheck's `cp` of the field runs' reports: `cutedebug run --runs-dir D` writes
    D/<run>/report.md (a compile-only run here makes the same layout)."""
    import os
    import subprocess

    cmd = gpu_pending.BY_NAME["recheck"].command
    (runs,) = set(re.findall(r"--runs-dir /tmp/(\w+)", cmd))
    subprocess.run(
        [sys.executable, "-m", "cutedebug", "run", "--compile-only", "--no-warm"]
        + ["--runs-dir", str(tmp_path / runs), str(ROOT / "scenarios/minimal/clean.toml")],
        cwd=ROOT,
        env=dict(os.environ, CUTE_DSL_ARCH="sm_90a"),
        check=False,
        capture_output=True,
        timeout=300,
    )
    kept = _step_copy(cmd, tmp_path)
    assert len(kept) == 1 and re.fullmatch(r"reports/minimal__clean-.*\.md", kept[0]), kept


def test_pack_keeps_every_step_in_one_archive_rewritten_after_each(tmp_path, monkeypatch):
    """A device call brings back at most 8 files (2026-12-02's call1 lost two logs): --pack
    writes the whole out folder as one .tar.gz after every step."""
    import tarfile

    steps = {
        n: gpu_pending.Step(
            n, "0", 1, False, f"for i in 1 2 3 4 5; do echo {n} > $STEP_OUT/f$i; done", n
        )
        for n in ("one", "two")
    }
    monkeypatch.setattr(gpu_pending, "BY_NAME", steps)
    monkeypatch.setattr(gpu_pending, "ours_left", lambda grace: [])
    pack = tmp_path / "call.tgz"
    # an earlier call's step left in the same folder (the device kept /tmp), and the clocks
    # the call's command wrote before the tool
    (tmp_path / "out" / "old").mkdir(parents=True)
    (tmp_path / "out" / "old" / "log.txt").write_text("an earlier call's\n")
    (tmp_path / "out" / "clocks.txt").write_text("NVIDIA H200, 345 MHz\n")
    assert gpu_pending.run(["one", "two"], tmp_path / "out", budget_s=60, pack=pack) == 0
    with tarfile.open(pack) as tar:
        names = set(tar.getnames())
    assert {f"out/{n}/f{i}" for n in ("one", "two") for i in range(1, 6)} <= names
    assert {"out/summary.md", "out/clocks.txt", "out/one/log.txt", "out/two/log.txt"} <= names
    assert not any(n.startswith("out/old") for n in names), names


def test_the_orphan_count_leaves_out_the_shells_that_started_the_script(monkeypatch):
    """A device command that goes on after gpu_pending keeps its shells alive, and their
    command line names cutedebug (past any terminal width): they are the script's ancestors,
    not processes left."""
    monkeypatch.setenv("COLUMNS", "80")  # as pytest's own environment may have it
    probe = (  # the module's name split: a line naming it is left out on its own
        "import sys; sys.path.insert(0, 'tools'); m = __import__('gpu_scale' + '_run'); "
        "print([ln.split()[0] for ln in m.ours_left(0)])"
    )
    shell_line = f'echo $$; {sys.executable} -c "{probe}"; : cutedebug bisect'
    out = subprocess.run(
        ["bash", "-c", shell_line], cwd=ROOT, capture_output=True, text=True, timeout=60
    ).stdout.split("\n", 1)
    shell, listed = out[0].strip(), out[1]
    assert shell.isdigit() and f"'{shell}'" not in listed, out
    # and a process that is no ancestor, named late in a long command line, is counted
    other = subprocess.Popen(["bash", "-c", "sleep 30; : " + "x" * 100 + " cutedebug"], cwd=ROOT)
    try:
        import gpu_scale_run  # on the path with gpu_pending

        assert any(ln.split()[0] == str(other.pid) for ln in gpu_scale_run.ours_left(0))
    finally:
        other.kill()
        other.wait()
