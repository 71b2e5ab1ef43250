"""The pytest plugin, driven through pytester: collection of scenario files, item statuses
(pass / fail / skip / HANG), option precedence, the outer timeout, the fixture.

The inner sessions run with runner.run_scenario replaced by a fake that returns recorded
RunResults (a conftest in the pytester directory installs it and restores it afterwards), and
with a fake nvidia-smi on PATH where a GPU is needed: no GPU and no cutlass involved.
"""

import json
import os
import stat
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from cutedebug import pytest_plugin as P
from cutedebug.engine import runner
from cutedebug.engine import scenario as S
from cutedebug.engine import verdict as V

pytest_plugins = ["pytester"]

KERNEL = """
class K:
    PARAMS = {"n": 4}
    SWITCHES = {"my_switch": "makes the kernel misbehave"}
"""

# The fake engine: outcomes.json says, per scenario id (or "fault:<name>" for ad-hoc runs)
# and mode, what run_scenario returns; every call is appended to calls.jsonl.
FAKE_CONFTEST = """
import json
import time
from pathlib import Path

from cutedebug.engine import runner
from cutedebug.engine import verdict as V

HERE = Path(__file__).parent
_real = runner.run_scenario


class FakeForkServer:
    def close(self):
        (HERE / "forkserver_closed").write_text("1")


def fake_run_scenario(sc, *, runs_root="runs", run_dir=None, mode="run", probes=None,
                      wait_budget_ms=None, repeat=1, command="", forkserver=None,
                      compile_checks=(), gpu_token=None):
    table = json.loads((HERE / "outcomes.json").read_text())
    spec = (table.get(sc.id) or table.get(f"fault:{sc.fault}") or {}).get(mode, {})
    t0 = time.monotonic()
    time.sleep(table.get("__delay__", 0.0))
    with open(HERE / "calls.jsonl", "a") as f:
        f.write(json.dumps({"id": sc.id, "mode": mode, "probes": probes, "repeat": repeat,
                            "deadline_s": sc.limits.deadline_s,
                            "compile_s": sc.limits.compile_s,
                            "runs_root": str(runs_root), "t0": t0,
                            "forked": isinstance(forkserver, FakeForkServer),
                            "token": gpu_token,
                            "checks": [f"{c.__module__}:{c.__qualname__}"
                                       for c in compile_checks],
                            "t1": time.monotonic()}) + "\\n")
    d = Path(runs_root) / sc.id.replace("/", "__") / mode
    d.mkdir(parents=True, exist_ok=True)
    o = V.Outcome(phase="done")
    evidence = {"stuck_sites": spec.get("stuck_sites", [])}
    if spec.get("compiled", True):
        compiled = {"secs": 0.1, "arch": sc.archs[0], "fault_count": spec.get("fault_count")}
        o.add({"event": "compiled", **compiled})
        evidence["compiled"] = compiled
    default = "UNSUPPORTED" if mode == "compile" else "PASS"
    return runner.RunResult(scenario=sc, verdict=V.Verdict(spec.get("verdict", default)),
                            reason=spec.get("reason", "recorded outcome"), run_dir=d,
                            outcome=o, evidence=evidence, mode=mode)


_real_fs = runner.start_forkserver


def pytest_configure(config):
    runner.run_scenario = fake_run_scenario
    runner.start_forkserver = lambda runs_root="runs": FakeForkServer()


def pytest_unconfigure(config):
    runner.run_scenario = _real
    runner.start_forkserver = _real_fs
"""


def scenario_toml(
    sid: str,
    expect: str,
    fault: str | None = None,
    extra: str = "",
    kernel: str = "../../kernels/k.py",
    where: str = "",
) -> str:
    """A scenario file; ``where`` goes into [expect] (localization), ``extra`` after it."""
    return (
        textwrap.dedent(f'''
        id = "{sid}"
        [kernel]
        file = "{kernel}"
        entry = "K"
        ''')
        + (f'[fault]\nkind = "{fault}"\n' if fault else "")
        + f'[expect]\nverdict = "{expect}"\n{where}'
        + extra
    )


@pytest.fixture
def clean_env(monkeypatch):
    for opt in P.OPTIONS:
        monkeypatch.delenv(opt.env, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return monkeypatch


@pytest.fixture
def fake_gpu(tmp_path_factory, clean_env):
    """A fake nvidia-smi on PATH that reports one H200."""
    bindir = tmp_path_factory.mktemp("fakebin")
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 9.0, 580.65.06'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    clean_env.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return bindir


@pytest.fixture
def no_gpu(tmp_path_factory, clean_env):
    clean_env.setenv("PATH", str(tmp_path_factory.mktemp("emptybin")))


def project(
    pytester, scenarios: dict[str, str], outcomes: dict, conftest_extra: str = "", ini: str = ""
):
    """A pytester directory with the fake engine, kernels/k.py and scenarios/fam/*.toml,
    configured (pytest.ini) to collect scenarios/ (plus the ``ini`` lines)."""
    pytester.makeconftest(FAKE_CONFTEST + conftest_extra)
    (pytester.path / "pytest.ini").write_text(
        "[pytest]\ncutedebug_scenario_dirs = scenarios\n" + ini
    )
    (pytester.path / "kernels").mkdir()
    (pytester.path / "kernels" / "k.py").write_text(KERNEL)
    fam = pytester.path / "scenarios" / "fam"
    fam.mkdir(parents=True)
    for name, text in scenarios.items():
        (fam / f"{name}.toml").write_text(text)
    (pytester.path / "outcomes.json").write_text(json.dumps(outcomes))


LINT_CHECK = "cutedebug.analyses.lint:static_findings"


def calls(pytester) -> list[dict]:
    path = pytester.path / "calls.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


HANG_SITE = {
    "role": "consumer",
    "op": "consumer_wait",
    "barrier": "full",
    "stage": 0,
    "cta": 0,
    "warp": 4,
    "location": "k.py:12",
}
LOC = 'role = "consumer"\nop = "consumer_wait"\nbarrier = "full"\n'


# ---- collection ------------------------------------------------------------------------------
def test_scenario_files_become_compile_and_run_items(pytester, no_gpu):
    project(
        pytester,
        {
            "clean": scenario_toml("fam/clean", "PASS"),
            "hang": scenario_toml("fam/hang", "HANG", "my_switch"),
        },
        {},
    )
    (pytester.path / "other").mkdir()
    (pytester.path / "other" / "settings.toml").write_text("x = 1\n")  # not a scenario dir
    res = pytester.runpytest("--collect-only", "-q", "--cutedebug-compile-jobs=1")
    ids = [ln for ln in res.outlines if "::" in ln]
    assert ids == [
        "scenarios/fam/clean.toml::compile",
        "scenarios/fam/clean.toml::run",
        "scenarios/fam/hang.toml::compile",
        "scenarios/fam/hang.toml::run",
    ]
    # compiling in parallel: every compile item comes before the first run item
    res = pytester.runpytest("--collect-only", "-q", "--cutedebug-compile-jobs=2")
    ids = [ln for ln in res.outlines if "::" in ln]
    assert ids == [
        "scenarios/fam/clean.toml::compile",
        "scenarios/fam/hang.toml::compile",
        "scenarios/fam/clean.toml::run",
        "scenarios/fam/hang.toml::run",
    ]
    # a .toml named on the command line is taken as a scenario wherever it is
    res = pytester.runpytest("-q", "other/settings.toml")
    res.assert_outcomes(failed=1)
    assert "settings.toml: unknown field 'x'" in res.stdout.str()


def test_bad_scenario_file_is_one_failing_item_and_the_rest_still_runs(pytester, no_gpu):
    bad = scenario_toml("fam/bad", "PASS") + "[limits]\ndeadline_sec = 3.0\n"
    project(
        pytester, {"bad": bad, "clean": scenario_toml("fam/clean", "PASS"), "broken": "id = \n"}, {}
    )
    res = pytester.runpytest("-v")
    res.assert_outcomes(passed=1, failed=2, skipped=1)
    out = res.stdout.str()
    assert "scenarios/fam/bad.toml::load FAILED" in out
    assert "unknown field 'limits.deadline_sec'" in out
    assert "scenarios/fam/broken.toml::load FAILED" in out and "not valid TOML" in out
    assert res.ret == 1


# ---- statuses --------------------------------------------------------------------------------
STATUS_SCENARIOS = {
    "clean": scenario_toml("fam/clean", "PASS"),
    "mismatch": scenario_toml("fam/mismatch", "MISMATCH", "my_switch"),
    "hang_unexpected": scenario_toml("fam/hang_unexpected", "PASS"),
    "hang_expected": scenario_toml("fam/hang_expected", "HANG", "my_switch", where=LOC),
    "hang_wrong_place": scenario_toml("fam/hang_wrong_place", "HANG", "my_switch", where=LOC),
    "compile_error": scenario_toml("fam/compile_error", "COMPILE_ERROR", "my_switch"),
    "sm100": scenario_toml("fam/sm100", "PASS", extra='[requires]\narch = ["sm_100a"]\n'),
    "no_cuda": scenario_toml("fam/no_cuda", "PASS"),
}
STATUS_OUTCOMES = {
    "fam/mismatch": {"run": {"verdict": "PASS", "reason": "output matches the reference"}},
    "fam/hang_unexpected": {"run": {"verdict": "HANG", "reason": "kernel did not finish"}},
    "fam/hang_expected": {"run": {"verdict": "HANG", "stuck_sites": [HANG_SITE]}},
    "fam/hang_wrong_place": {
        "run": {
            "verdict": "HANG",
            "stuck_sites": [
                dict(HANG_SITE, role="producer", op="producer_acquire", barrier="empty")
            ],
        }
    },
    "fam/compile_error": {
        "compile": {"verdict": "COMPILE_ERROR", "compiled": False},
        "run": {"verdict": "COMPILE_ERROR", "compiled": False},
    },
    "fam/no_cuda": {
        "run": {
            "verdict": "UNSUPPORTED",
            "reason": "execution skipped: no CUDA GPU visible to torch",
        }
    },
}


def test_run_items_pass_fail_skip_and_hang_get_their_letter(pytester, fake_gpu):
    project(pytester, STATUS_SCENARIOS, STATUS_OUTCOMES)
    res = pytester.runpytest("-v", "-rs", "-p", "no:cacheprovider")
    out = res.stdout.str()
    status = {
        ln.split(" ")[0]: ln.split(" ")[1]
        for ln in res.outlines
        if ln.startswith("scenarios/") and "::" in ln
    }
    assert status["scenarios/fam/clean.toml::run"] == "PASSED"
    assert status["scenarios/fam/mismatch.toml::run"] == "FAILED"
    assert status["scenarios/fam/hang_unexpected.toml::run"] == "HANG"
    assert status["scenarios/fam/hang_expected.toml::run"] == "PASSED"
    assert status["scenarios/fam/hang_wrong_place.toml::run"] == "HANG"
    assert status["scenarios/fam/compile_error.toml::compile"] == "PASSED"
    assert status["scenarios/fam/compile_error.toml::run"] == "PASSED"
    assert status["scenarios/fam/sm100.toml::run"] == "SKIPPED"
    assert status["scenarios/fam/no_cuda.toml::run"] == "SKIPPED"
    assert all(status[f"scenarios/fam/{n}.toml::compile"] == "PASSED" for n in STATUS_SCENARIOS)
    # failure messages: the TL;DR and the report path
    assert "PASS (EXPECTED MISMATCH) — fam/mismatch: output matches the reference" in out
    assert "HANG (EXPECTED PASS) — fam/hang_unexpected: kernel did not finish" in out
    assert (
        "localization wrong: expected {'role': 'consumer', 'op': 'consumer_wait', "
        "'barrier': 'full'}" in out
    )
    reports = [ln.split("report: ", 1)[1] for ln in res.outlines if ln.startswith("report: ")]
    assert len(reports) == 3 and all(Path(r).is_file() for r in reports)
    assert "needs sm_100a; this GPU is sm_90a (NVIDIA H200)" in out
    assert "cutedebug: 3 HANG verdict(s), 2 unexpected" in out
    res.assert_outcomes(passed=11, failed=3, skipped=2)
    # the one-letter progress line: H for an unexpected hang, h for an expected one
    res = pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "--cutedebug-compile-jobs=1",
        "scenarios/fam/hang_unexpected.toml",
        "scenarios/fam/hang_expected.toml",
    )
    lines = [ln for ln in res.outlines if ln.startswith("scenarios/fam/hang")]
    assert lines[0].startswith("scenarios/fam/hang_unexpected.toml .H")
    assert lines[1].startswith("scenarios/fam/hang_expected.toml .h")


def test_compile_item_fails_when_the_fault_never_reached_the_kernel(pytester, no_gpu):
    project(
        pytester,
        {
            "dud": scenario_toml("fam/dud", "HANG", "my_switch"),
            "nocomp": scenario_toml("fam/nocomp", "PASS"),
        },
        {
            "fam/dud": {"compile": {"fault_count": 0}},
            "fam/nocomp": {
                "compile": {
                    "verdict": "COMPILER_CRASH",
                    "compiled": False,
                    "reason": "compiler process killed by SIGSEGV",
                }
            },
        },
    )
    res = pytester.runpytest("-v", "-rs")
    out = res.stdout.str()
    assert "fault my_switch never triggered while tracing" in out
    assert "did not compile: COMPILER_CRASH" in out and "killed by SIGSEGV" in out
    res.assert_outcomes(failed=2, skipped=2)
    assert "no NVIDIA GPU on this machine (nvidia-smi not found)" in out


def test_run_items_skip_with_the_reason_without_a_gpu(pytester, no_gpu):
    project(pytester, {"clean": scenario_toml("fam/clean", "PASS")}, {})
    res = pytester.runpytest("-rs")
    res.assert_outcomes(passed=1, skipped=1)
    assert "no NVIDIA GPU on this machine (nvidia-smi not found)" in res.stdout.str()
    assert [c["mode"] for c in calls(pytester)] == ["compile"]  # the run never started


@pytest.mark.parametrize("jobs", [1, 3])
def test_compile_items_run_compile_jobs_children_at_once(pytester, no_gpu, jobs):
    names = [f"s{i}" for i in range(6)]
    project(
        pytester,
        {n: scenario_toml(f"fam/{n}", "PASS") for n in names},
        {"__delay__": 0.3, "fam/s4": {"compile": {"fault_count": 0}}},
    )
    (pytester.path / "scenarios" / "fam" / "s4.toml").write_text(
        scenario_toml("fam/s4", "PASS", "my_switch")
    )
    res = pytester.runpytest("-p", "no:cacheprovider", f"--cutedebug-compile-jobs={jobs}")
    res.assert_outcomes(passed=5, failed=1, skipped=6)
    assert "fault my_switch never triggered" in res.stdout.str()  # graded from the pool too
    spans = sorted((c["t0"], c["t1"]) for c in calls(pytester) if c["mode"] == "compile")
    at_once = max(sum(a <= start < b for a, b in spans) for start, _ in spans)
    assert len(spans) == 6
    assert at_once == 1 if jobs == 1 else at_once >= 2


# ---- options ---------------------------------------------------------------------------------
MARKER_CONFTEST = """

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "marked" in str(item.path):
            item.add_marker(pytest.mark.cutedebug(deadline=7.0, repeat=5))
"""


@pytest.mark.parametrize(
    "layers, want",
    [
        (("ini", "env", "cli"), 4.0),
        (("ini", "env"), 3.0),
        (("ini",), 2.0),
        ((), 9.0),  # the scenario's own limits.deadline_s
    ],
)
def test_option_precedence_marker_cli_env_ini(pytester, fake_gpu, monkeypatch, layers, want):
    project(
        pytester,
        {
            "marked": scenario_toml("fam/marked", "PASS"),
            "plain": scenario_toml("fam/plain", "PASS", extra="[limits]\ndeadline_s = 9.0\n"),
        },
        {},
        MARKER_CONFTEST,
        ini="cutedebug_deadline = 2\ncutedebug_probes = on\n" if "ini" in layers else "",
    )
    args = ["-p", "no:cacheprovider"]
    if "env" in layers:
        monkeypatch.setenv("CUTEDEBUG_DEADLINE", "3")
        monkeypatch.setenv("CUTEDEBUG_PROBES", "off")
    if "cli" in layers:
        args += ["--cutedebug-deadline", "4", "--cutedebug-repeat", "2"]
    res = pytester.runpytest(*args)
    res.assert_outcomes(passed=4)
    runs = {c["id"]: c for c in calls(pytester) if c["mode"] == "run"}
    assert runs["fam/marked"]["deadline_s"] == 7.0 and runs["fam/marked"]["repeat"] == 5
    assert runs["fam/plain"]["deadline_s"] == want
    assert runs["fam/plain"]["repeat"] == (2 if "cli" in layers else 1)
    probes = {("ini",): True, ("ini", "env"): False, ("ini", "env", "cli"): False}
    assert runs["fam/plain"]["probes"] == probes.get(tuple(layers))


def test_bad_option_value_is_a_usage_error_naming_its_source(pytester, no_gpu, monkeypatch):
    project(pytester, {"clean": scenario_toml("fam/clean", "PASS")}, {})
    monkeypatch.setenv("CUTEDEBUG_REPEAT", "many")
    res = pytester.runpytest()
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert "CUTEDEBUG_REPEAT repeat = 'many'" in res.stderr.str()


def test_runs_dir_option_and_outer_timeout_above_the_watchdog(pytester, fake_gpu):
    extra = "[limits]\ncompile_s = 40.0\ndeadline_s = 5.0\nimport_s = 10.0\ncheck_s = 20.0\n"
    project(
        pytester,
        {
            "clean": scenario_toml("fam/clean", "PASS", extra=extra),
            "marked": scenario_toml("fam/marked", "PASS"),
        },
        {},
        MARKER_CONFTEST,
    )
    args = ("--cutedebug-timeout-margin", "15", "--cutedebug-runs-dir", "out/runs")
    items, _ = pytester.inline_genitems(*args, "--cutedebug-prefetch=off")
    timeout = {i.nodeid: i.get_closest_marker("timeout").args[0] for i in items}
    # the watchdog restarts its clock at each phase: spawned, started, imported, compiled and
    # done are timed by import_s, synced and checked by check_s. compile mode: no launch;
    # run: twice everything (blind-hang rerun with probes) + the health check after a kill
    assert timeout["scenarios/fam/clean.toml::compile"] == 5 * 10 + 40 + 15
    once = 5 * 10 + 40 + 5 + 2 * 20
    assert timeout["scenarios/fam/clean.toml::run"] == 2 * once + 60 + 15
    lim = S.Limits()
    once = 5 * lim.import_s + lim.compile_s + 7.0 + 2 * lim.check_s  # marker: deadline 7
    assert timeout["scenarios/fam/marked.toml::run"] == 5 * (2 * once + 60) + 15  # repeat 5
    # the run prefetch (2 ahead): a run may wait for the GPU behind the 2 runs started ahead
    items, _ = pytester.inline_genitems(*args)
    prefetched = {i.nodeid: i.get_closest_marker("timeout").args[0] for i in items}
    assert prefetched["scenarios/fam/marked.toml::run"] == 3 * 5 * (2 * once + 60) + 15
    assert prefetched["scenarios/fam/clean.toml::compile"] == 5 * 10 + 40 + 15
    res = pytester.runpytest("--cutedebug-runs-dir", "out/runs", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=4)
    assert {c["runs_root"] for c in calls(pytester)} == {str(pytester.path / "out" / "runs")}
    # one fork server for the session, handed to every run, closed at the end
    assert all(c["forked"] for c in calls(pytester))
    assert (pytester.path / "forkserver_closed").exists()
    # every item hands the worker the static protocol checks (engine/compile_checks.py)
    assert all(c["checks"] == [LINT_CHECK] for c in calls(pytester))
    # run items take the GPU token of the run prefetch, compile items never do (no launch)
    tokens = {c["mode"]: c["token"] for c in calls(pytester)}
    assert tokens["compile"] is None and Path(tokens["run"]).name == "gpu-default.token"
    (pytester.path / "calls.jsonl").unlink()
    pytester.runpytest("--cutedebug-forkserver=off", "--cutedebug-prefetch=off").assert_outcomes(
        passed=4
    )
    assert not any(c["forked"] or c["token"] for c in calls(pytester))
    assert list((pytester.path / "out" / "runs").glob("*/run/report.md"))


# ---- fixture ---------------------------------------------------------------------------------
USER_TESTS = """
import pytest

from cutedebug.pytest_plugin import assert_verdict


def test_clean_kernel(cutedebug_run):
    res = cutedebug_run("kernels/k.py:K", params={"n": 8})
    assert_verdict(res, "PASS")
    assert res.scenario.params == {"n": 8}


def test_would_hang(cutedebug_run):
    cutedebug_run("kernels/k.py:K", fault="my_switch")


def test_expected_hang_where(cutedebug_run):
    res = cutedebug_run("kernels/k.py:K", fault="my_switch", expect="HANG")
    assert_verdict(res, "HANG", op="consumer_wait", barrier="full")


def test_hang_in_the_wrong_place(cutedebug_run):
    res = cutedebug_run("kernels/k.py:K", fault="my_switch", expect="HANG")
    assert_verdict(res, "HANG", op="producer_acquire")


@pytest.mark.cutedebug(deadline=7.0)
def test_call_arguments_win_over_the_marker(cutedebug_run):
    assert cutedebug_run("kernels/k.py:K", deadline=11.0).scenario.limits.deadline_s == 11.0
    assert cutedebug_run("kernels/k.py:K").scenario.limits.deadline_s == 7.0


def test_bad_kernel_is_a_readable_failure(cutedebug_run):
    cutedebug_run("kernels/k.py:Nope")
"""


def test_fixture_runs_kernels_and_fails_hangs(pytester, fake_gpu):
    project(
        pytester,
        {},
        {
            "fault:my_switch": {
                "run": {
                    "verdict": "HANG",
                    "reason": "bounded waits timed out",
                    "stuck_sites": [HANG_SITE],
                }
            }
        },
    )
    pytester.makepyfile(test_user=USER_TESTS)
    res = pytester.runpytest("-v", "-p", "no:cacheprovider", "test_user.py")
    out = res.stdout.str()
    status = {
        ln.split(" ")[0].split("::")[1]: ln.split(" ")[1]
        for ln in res.outlines
        if ln.startswith("test_user.py::")
    }
    assert status == {
        "test_clean_kernel": "PASSED",
        "test_would_hang": "HANG",
        "test_expected_hang_where": "PASSED",
        "test_hang_in_the_wrong_place": "HANG",
        "test_call_arguments_win_over_the_marker": "PASSED",
        "test_bad_kernel_is_a_readable_failure": "FAILED",
    }
    assert "adhoc/k.K: expected PASS, got HANG: bounded waits timed out" in out
    assert "where: consumer consumer_wait full[0] k.py:12" in out
    assert "localization {'op': 'producer_acquire'} not found" in out
    assert "cutedebug_run: field kernel.entry = 'Nope': no such class" in out
    assert "During handling" not in out
    assert {tuple(c["checks"]) for c in calls(pytester)} == {(LINT_CHECK,)}
    # the fixture's runs take the GPU token of the run prefetch (one kernel at a time)
    tokens = {c["token"] for c in calls(pytester)}
    assert len(tokens) == 1 and Path(tokens.pop()).name == "gpu-default.token"
    # every test using the fixture also gets the outer guard
    items, _ = pytester.inline_genitems("test_user.py")
    assert all(i.get_closest_marker("timeout") for i in items)


def test_fixture_skips_without_a_gpu(pytester, no_gpu):
    project(pytester, {}, {})
    pytester.makepyfile(
        test_user="""
def test_it(cutedebug_run):
    cutedebug_run("kernels/k.py:K")

def test_compile_only_runs_anyway(cutedebug_run):
    res = cutedebug_run("kernels/k.py:K", mode="compile", expect="UNSUPPORTED")
    assert res.outcome.event("compiled") is not None
"""
    )
    res = pytester.runpytest("-rs", "test_user.py")
    res.assert_outcomes(passed=1, skipped=1)
    assert "nvidia-smi not found" in res.stdout.str()


def test_assert_verdict_message(tmp_path):
    kfile = tmp_path / "k.py"
    kfile.write_text(KERNEL)
    sc = S.adhoc(f"{kfile}:K", {}, None, {}, "PASS")
    res = runner.RunResult(
        scenario=sc,
        verdict=V.Verdict.CRASH,
        run_dir=tmp_path,
        reason="cudaErrorIllegalAddress: an illegal memory access",
        outcome=V.Outcome(),
        evidence={"checked": {"first_bad_index": 3}},
    )
    with pytest.raises(AssertionError) as e:
        P.assert_verdict(res, "PASS")
    msg = str(e.value)
    assert msg.startswith("adhoc/k.K: expected PASS, got CRASH: cudaErrorIllegalAddress")
    assert "where: first bad element at index 3" in msg
    assert f"report: {tmp_path / 'report.md'}" in msg
    P.assert_verdict(res, "CRASH")
    with pytest.raises(ValueError, match="unknown verdict"):
        P.assert_verdict(res, "BROKEN")


def test_repeats_are_as_expected_only_when_every_verdict_is_accepted(tmp_path):
    kfile = tmp_path / "k.py"
    kfile.write_text(KERNEL)
    sc = S.adhoc(f"{kfile}:K", {}, None, {}, "MISMATCH")
    timing = sc.with_overrides(expect=replace(sc.expect, also=("PASS",)))

    def result(scenario, verdicts):
        return runner.RunResult(
            scenario=scenario,
            verdict=V.Verdict.NONDETERMINISTIC,
            reason="",
            run_dir=tmp_path,
            outcome=V.Outcome(),
            repeats=[{"verdict": v, "digest": None} for v in verdicts],
        )

    assert result(timing, ["MISMATCH", "PASS"]).verdict_ok
    assert not result(timing, ["MISMATCH", "HANG"]).verdict_ok
    assert not result(sc, ["MISMATCH", "PASS"]).verdict_ok


def test_localization_is_not_graded_on_a_timing_dependent_alternative_verdict(tmp_path):
    kfile = tmp_path / "k.py"
    kfile.write_text(KERNEL)
    sc = S.adhoc(f"{kfile}:K", {}, None, {}, "HANG")
    sc = sc.with_overrides(
        expect=replace(
            sc.expect, also=("CRASH",), role="producer", op="producer_acquire", barrier="empty"
        )
    )

    def result(verdict, sites):
        return runner.RunResult(
            scenario=sc,
            verdict=V.Verdict(verdict),
            reason="",
            run_dir=tmp_path,
            outcome=V.Outcome(),
            evidence={"stuck_sites": sites},
        )

    where = {"role": "producer", "op": "producer_acquire", "barrier": "empty"}
    crash = result("CRASH", [])
    assert crash.localization["ok"] is None and "expect.also" in crash.localization["why"]
    assert crash.expected
    assert result("HANG", [where]).expected
    wrong_place = result("HANG", [dict(where, op="consumer_wait")])
    assert wrong_place.localization["ok"] is False and not wrong_place.expected
    assert not result("HANG", []).expected


def test_sigterm_is_left_alone_outside_cutedebug_items(pytester):
    """A session without cutedebug items keeps Python's SIGTERM handling (the plugin turns
    SIGTERM into a KeyboardInterrupt only while its items run: tests/test_adversarial.py)."""
    pytester.makepyfile(
        test_sig="""
import signal


def test_handler():
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
"""
    )
    res = pytester.runpytest_subprocess("test_sig.py")
    res.assert_outcomes(passed=1)
