"""`cutedebug mutate` on CPU: which mutants apply, and a real run over a compile-only target.

tests/exec_targets/compile_ptx_check.py compiles kernels/tma_stream.py for sm_90a and fails when
the PTX's expect_tx bytes or mbarrier.init counts differ from the clean kernel's; it checks
nothing else. So, independently of cutedebug: wrong_expect_tx and wrong_arrive_count (which
change exactly those numbers, see test_faults.py) must be caught as FAIL, and
skip_producer_tail (which removes the tail's try_wait loops only) must survive.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cutedebug.analyses import mutate as M
from cutedebug.analyses.mutate_record import CleanReport, MutantRecord, MutationMatrix, Trace
from cutedebug.commands import exec as X
from cutedebug.engine import verdict as V
from cutedebug.instrument.launch_record import PipelineEntry

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "tests" / "exec_targets" / "compile_ptx_check.py"

# The recorder's output for the one trace of kernels/tma_stream.py (captured from a clean run of
# TARGET: the trace's function name shortened).
TMA_STREAM_TRACE = {
    "t": 0,
    "pid": 1,
    "function": "cutlass___call___tma_streamTmaStream_object_at__FakeTensor",
    "occurrence": 0,
    "kernel": "TmaStream.kernel",
    "kernels": [],
    "pipelines": [
        {
            "index": 0,
            "class": "PipelineTmaAsync",
            "file": "kernels/tma_stream.py",
            "line": 200,
            "kernel": "TmaStream.kernel",
            "stages": 4,
            "ops": {
                "producer_acquire": 1,
                "producer_commit": 1,
                "producer_tail": 1,
                "consumer_wait": 1,
                "consumer_release": 1,
            },
        }
    ],
    "arch_ops": {"mbarrier_init_fence": 1, "sync_warp": 1},
}
TMA_STREAM = Trace.from_json(TMA_STREAM_TRACE)


def mutate(*args: str, out: Path, timeout: float = 900) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-m", "cutedebug", "mutate", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(ROOT),
    )
    return r.returncode, r.stdout + r.stderr


PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def mutate_wrong_expect_tx(out: Path, *command: str) -> tuple[str, dict]:
    """`cutedebug mutate --jobs 2 --faults wrong_expect_tx -- COMMAND`: it exits 0; its output
    and matrix.json."""
    rc, text = mutate("--jobs", "2", "--faults", "wrong_expect_tx", "--", *command, out=out)
    assert rc == 0, text
    return text, json.loads((out / "matrix.json").read_text())


def test_plan_follows_the_recorded_ops():
    from cutedebug.instrument import faults

    mutants = M.plan([TMA_STREAM], None, None)
    assert [m.id for m in mutants] == [
        "t0.p0.wrong_expect_tx+16",
        "t0.p0.missing_phase_flip.consumer",
        "t0.p0.missing_phase_flip.producer",
        "t0.p0.skip_producer_tail",
        "t0.p0.skip_consumer_release",
        "t0.p0.extra_consumer_release",
        "t0.p0.skip_consumer_wait",
        "t0.p0.release_before_read",
        "t0.p0.wrong_arrive_count.empty+1",
        "t0.p0.wrong_arrive_count.full+1",
        "t0.p0.early_exit.consumer",
        "t0.p0.early_exit.producer",
        "t0.kernel-wide.missing_init_fence",
        "t0.kernel-wide.drop_sync.warp",
    ]
    for m in mutants:
        assert faults.validate(m.fault, m.args) is not None  # every spec is a valid fault
        assert m.trace == {"function": TMA_STREAM_TRACE["function"], "occurrence": 0}
        assert m.target == "t0.kernel-wide" or m.args.get("pipeline") == 0
    # a second trace: a consumer-only pipeline, a PipelineTmaUmma, named barriers, a cluster
    other = Trace(
        t=1,
        function="f",
        occurrence=2,
        kernels=["kernel_x_0"],
        kernel=None,
        pipelines=[
            PipelineEntry(
                index=i, class_=cls, file=None, line=None, kernel=None, stages=None, ops=o
            )
            for i, cls, o in (
                (0, "PipelineAsync", {"consumer_wait": 2}),
                (1, "PipelineTmaUmma", {"producer_acquire": 1}),
            )
        ],
        arch_ops={"barrier": 2, "cluster_arrive": 1},
        pid=2,
    )
    mutants = M.plan([TMA_STREAM, other], None, [1])
    assert [m.id for m in mutants if m.target.startswith("t1")] == [
        "t1.p1.wrong_expect_tx+16",
        "t1.p1.missing_phase_flip.producer",
        "t1.p1.wrong_arrive_count.empty+1",
        "t1.p1.wrong_arrive_count.full+1",
        "t1.p1.expect_tx_no_2cta_doubling",
        "t1.kernel-wide.missing_init_fence",
        "t1.kernel-wide.drop_sync.cta",
        "t1.kernel-wide.wrong_barrier_threads+32",
        "t1.kernel-wide.cta_scope_sync",
    ]
    assert {m.trace["occurrence"] for m in mutants if m.target.startswith("t1")} == {2}
    assert [m.id for m in M.plan([other], ["missing_phase_flip"], None)] == [
        "t1.p0.missing_phase_flip.consumer",
        "t1.p1.missing_phase_flip.producer",
    ]
    labels = M.targets([TMA_STREAM, other])
    assert labels["t0.p0"] == "t0.p0: PipelineTmaAsync @tma_stream.py:200 in TmaStream.kernel"
    assert labels["t1.kernel-wide"] == "t1: kernel-wide in kernel_x_0"


def _result(verdict: V.Verdict, fault_count: int) -> X.ExecResult:
    res = X.ExecResult(
        settings=X.Settings(argv=["x"], fault="skip_producer_tail"),
        verdict=verdict,
        reason="",
        run_dir=Path("."),
        returncode=0,
        killed_by=None,
        elapsed_s=0.0,
    )
    res.processes = {1: {"pid": 1, "fault_count": fault_count}}
    return res


def test_status_of_a_mutant():
    assert M.status_of(_result(V.Verdict.HANG, 2)) == M.CAUGHT
    assert M.status_of(_result(V.Verdict.FAIL, 1)) == M.CAUGHT
    assert M.status_of(_result(V.Verdict.PASS, 1)) == M.SURVIVED
    # the fault changed nothing: neither caught nor survived, whatever the command did
    assert M.status_of(_result(V.Verdict.PASS, 0)) == M.NOT_APPLIED
    assert M.status_of(_result(V.Verdict.FAIL, 0)) == M.NOT_APPLIED
    assert M.status_of(_result(V.Verdict.HARNESS_ERROR, 3)) == M.HARNESS


@pytest.mark.slow
def test_mutate_over_a_compile_only_target_then_resume(tmp_path):
    out = tmp_path / "m"
    rc, text = mutate(
        "--jobs",
        "2",
        "--faults",
        "wrong_expect_tx,wrong_arrive_count,skip_producer_tail",
        "--",
        sys.executable,
        str(TARGET),
        out=out,
    )
    assert rc == 0, text
    m = json.loads((out / "matrix.json").read_text())
    status = {r["id"]: (r["status"], r["verdict"]) for r in m["mutants"]}
    assert status == {
        "t0.p0.wrong_expect_tx+16": ("CAUGHT", "FAIL"),
        "t0.p0.wrong_arrive_count.empty+1": ("CAUGHT", "FAIL"),
        "t0.p0.wrong_arrive_count.full+1": ("CAUGHT", "FAIL"),
        "t0.p0.skip_producer_tail": ("SURVIVED", "PASS"),
    }
    assert m["score"]["score"] == 0.75 and m["score"]["counts"]["SURVIVED"] == 1
    surv = next(r for r in m["mutants"] if r["status"] == "SURVIVED")
    tail = [
        i
        for i, ln in enumerate((ROOT / "kernels/tma_stream.py").read_text().splitlines(), 1)
        if "ring.producer_tail(state)" in ln
    ]
    # the site is producer_tail's call in the kernel
    assert [(os.path.basename(s["file"]), s["line"]) for s in surv["sites"]] == [
        ("tma_stream.py", *tail)
    ]
    assert "t0.p0.skip_producer_tail" in (out / "matrix.md").read_text().split("## Survivors")[1]
    page = (out / "matrix.html").read_text()
    assert page.count("<td class='ok'") == 3 and page.count("<td class='miss'") == 1
    assert "[  4/4]" in text and "mutation score 75%" in text
    assert "processes of ours left: 0" in text and m["facts"]["processes_left"] == []
    assert m["facts"]["gpu_health"] is None  # nothing ran on a GPU
    assert len((out / "results.jsonl").read_text().splitlines()) == 4
    text_json = (out / "matrix.json").read_text()  # reads back as its record, byte for byte
    assert json.dumps(MutationMatrix.from_json(m).to_json(), indent=1, default=str) == text_json
    # --resume: the clean run and the four mutants are kept, nothing runs again
    rc, text = mutate(
        "--resume",
        "--faults",
        "wrong_expect_tx,wrong_arrive_count,skip_producer_tail",
        "--",
        sys.executable,
        str(TARGET),
        out=out,
    )
    assert rc == 0 and "4 mutant(s), 4 already done" in text, text
    assert "clean run: /" not in text  # not rerun
    assert json.loads((out / "matrix.json").read_text())["score"] == m["score"]


def test_a_command_that_fails_clean_is_not_scored(tmp_path):
    rc, text = mutate(
        "--", sys.executable, str(ROOT / "tests/exec_targets/exits_nonzero.py"), out=tmp_path / "m"
    )
    assert rc == 1 and "does not pass without faults" in text
    m = json.loads((tmp_path / "m" / "matrix.json").read_text())
    assert m["clean"]["verdict"] == "FAIL" and m["mutants"] == [] and m["score"]["score"] is None


@pytest.mark.slow
def test_each_mutant_changes_only_its_own_trace(tmp_path):
    """Two traces of tma_stream in one process: the mutant of trace t0 changes the first
    kernel's expect_tx only, the mutant of t1 the second's only (the script prints both)."""
    out = tmp_path / "m"
    target = ROOT / "tests" / "exec_targets" / "compile_two.py"
    _, m = mutate_wrong_expect_tx(out, sys.executable, str(target))
    assert [t["occurrence"] for t in m["traces"]] == [0, 0]  # two functions, once each
    assert [t["kernel"] for t in m["traces"]] == ["TmaStream.kernel"] * 2
    by_id = {r["id"]: r for r in m["mutants"]}
    assert sorted(by_id) == ["t0.p0.wrong_expect_tx+16", "t1.p0.wrong_expect_tx+16"]
    for rid, changed, kept in (
        ("t0.p0.wrong_expect_tx+16", "first", "second"),
        ("t1.p0.wrong_expect_tx+16", "second", "first"),
    ):
        r = by_id[rid]
        assert r["status"] == "CAUGHT" and r["fault_count"] == 1
        log = (out / Path(r["report"]).parent / "command.log").read_text()
        assert f"{changed} expect_tx [33040]" in log and f"{kept} expect_tx [33024]" in log


@pytest.mark.slow
def test_a_kernel_traced_twice_alike_is_named_both_times(tmp_path):
    """The same kernel and shapes traced twice (quack's RMSNorm forward in two test items on the
    H200: the second trace was labelled by its mangled symbol): the second trace adds no new
    wait site, and is named by the kernel it launches."""
    target = ROOT / "tests" / "exec_targets" / "compile_two.py"
    text, m = mutate_wrong_expect_tx(tmp_path / "m", sys.executable, str(target), "--same")
    assert [t["kernel"] for t in m["traces"]] == ["TmaStream.kernel"] * 2
    assert "trace t1: TmaStream.kernel, 1 pipeline(s)" in text


def test_a_mutant_that_changed_nothing_says_why(tmp_path):
    m = M.Mutant(
        "t0.p1.skip_producer_tail",
        "skip_producer_tail",
        {"pipeline": 1},
        {"function": "f", "occurrence": 0},
        "t0.p1",
        "skip_producer_tail",
        "",
    )
    res = _result(V.Verdict.PASS, 0)
    res.run_dir = tmp_path
    res.processes[1]["traces"] = [
        {
            "function": "f",
            "fault_not_applied": "fault skip_producer_tail(pipeline=1) NOT APPLIED: 0 sites",
        }
    ]
    r = M.mutant_record(m, res, tmp_path)
    assert r.status == "NOT_APPLIED" and "NOT APPLIED: 0 sites" in r.reason
    assert MutantRecord.from_json(json.loads(M.result_line(r))) == r
    res.processes[1]["traces"] = [{"function": "g"}]  # the trace never came in this run
    r = M.mutant_record(m, res, tmp_path)
    assert "not traced in this run" in r.reason


# ---- recorded matrices ---------------------------------------------------------------------------
# tests/data/mutate/: OUT folders of `cutedebug mutate` over TARGET on this CPU, written before the
# matrix was typed: ff954a1/ by the version that ran on the H200 (reports/2026-12-01-h200/exec:
# its mutant records lack trace, gpu_wait_s, killed_by, used_gpu, left_pids), current/ by
# ff91d99 (6 mutants, with facts), clean_fails/ by ff91d99 over exits_nonzero.py.
MUTATE_DATA = ROOT / "tests" / "data" / "mutate"


@pytest.mark.parametrize("name", ["ff954a1", "current", "clean_fails"])
def test_a_recorded_matrix_and_its_results_round_trip_byte_for_byte(name):
    from cutedebug.records import RecordError

    text = (MUTATE_DATA / name / "matrix.json").read_text()
    m = MutationMatrix.from_json(json.loads(text))
    assert json.dumps(m.to_json(), indent=1, default=str) == text
    results = MUTATE_DATA / name / "results.jsonl"
    if results.exists():
        lines = results.read_text().splitlines()
        done = M.load_results(results)
        assert [M.result_line(done[json.loads(ln)["id"]]) for ln in lines] == lines
        assert list(done.values()) == [r for r in m.mutants if r.id in done]
        old = name == "ff954a1"
        assert all(bool(r.lacked) == old for r in done.values())
        if old:  # the keys it lacks read as what that version did: no token, nothing left
            assert {r.gpu_wait_s for r in done.values()} == {0.0}
            assert all(r.left_pids == [] and r.trace == {} for r in done.values())
        one = json.loads(lines[0])
        with pytest.raises(RecordError, match=r"field 'status': 'CAUGHTX' is not one of"):
            MutantRecord.from_json(dict(one, status="CAUGHTX"))
        with pytest.raises(RecordError, match=r"field 'verdict': 'MAYBE' is not a verdict"):
            MutantRecord.from_json(dict(one, verdict="MAYBE"))
        with pytest.raises(RecordError, match=r"field 'sites\[0\].pid' missing"):
            MutantRecord.from_json(
                dict(one, sites=[{k: v for k, v in one["sites"][0].items() if k != "pid"}])
            )
    else:
        assert m.mutants == [] and m.score.score is None and m.clean.verdict == "FAIL"


@pytest.mark.parametrize("name", ["ff954a1", "current", "clean_fails"])
def test_a_recorded_clean_json_round_trips_and_a_bad_field_is_named(name):
    """OUT/clean.json reads as a CleanReport (the keys ff954a1's lacks read as the defaults)
    and writes back byte for byte; a pipeline entry that does not fit is refused by its path."""
    from cutedebug.records import RecordError

    path = MUTATE_DATA / name / "clean.json"
    clean = M.load_clean(path)
    assert M.clean_text(clean) == path.read_text()
    assert bool(clean.lacked) == (name == "ff954a1") and clean.used_gpu is False
    if name == "clean_fails":
        assert M.recorded(clean) == [] and clean.processes[0].traces == []
        return
    (trace,) = M.recorded(clean)
    assert [p.class_ for p in trace.pipelines] == ["PipelineTmaAsync"]
    assert trace.pipelines[0].ops["producer_acquire"] == 1
    data = json.loads(path.read_text())
    data["processes"][0]["traces"][0]["protocol"]["pipelines"][0]["index"] = "0"
    with pytest.raises(
        RecordError,
        match=r"field 'processes\[0\].traces\[0\].protocol.pipelines\[0\].index': expected int",
    ):
        M.CleanReport.from_json(data)


def test_resume_keeps_the_mutants_an_earlier_version_recorded(tmp_path):
    """--resume over the OUT folder of the version that ran on the H200: nothing runs again,
    results.jsonl stays as it was, the matrix lists its records unchanged and scores them."""
    import shutil

    out = tmp_path / "m"
    shutil.copytree(MUTATE_DATA / "ff954a1", out)
    clean = json.loads((out / "clean.json").read_text())
    before = (out / "results.jsonl").read_text()
    rc, text = mutate(
        "--resume", "--faults", "wrong_expect_tx,skip_producer_tail", "--", *clean["argv"], out=out
    )
    assert rc == 0 and "2 mutant(s), 2 already done" in text, text
    assert "clean run: /" not in text and (out / "results.jsonl").read_text() == before
    m = json.loads((out / "matrix.json").read_text())
    old = {r["id"]: r for r in map(json.loads, before.splitlines())}
    assert {r["id"]: r for r in m["mutants"]} == old  # key for key, nothing added
    assert m["score"]["score"] == 0.5 and m["facts"]["processes_left"] == []


@pytest.mark.slow
def test_under_pytest_a_mutant_runs_only_the_test_that_traced_its_kernel(tmp_path):
    """Two test items trace the same function (the process's occurrences 0 and 1): each mutant
    runs only its own item (the other deselected), and the fault still lands there although that
    item's trace is then the process's first: a trace is its test's n-th, not the process's."""
    out = tmp_path / "m"
    target = "tests/exec_targets/pytest_two.py"
    text, m = mutate_wrong_expect_tx(out, *PYTEST, target)
    tests = [(t["test"], t["test_occurrence"], t["occurrence"]) for t in m["traces"]]
    assert tests == [(f"{target}::test_first", 0, 0), (f"{target}::test_second", 0, 1)]
    by_id = {r["id"]: r for r in m["mutants"]}
    assert sorted(by_id) == ["t0.p0.wrong_expect_tx+16", "t1.p0.wrong_expect_tx+16"]
    for rid, name in (
        ("t0.p0.wrong_expect_tx+16", "test_first"),
        ("t1.p0.wrong_expect_tx+16", "test_second"),
    ):
        r = by_id[rid]
        assert r["status"] == "CAUGHT" and r["verdict"] == "FAIL" and r["fault_count"] == 1, r
        assert r["trace"]["test"] == f"{target}::{name}"
        log = (out / Path(r["report"]).parent / "command.log").read_text()
        assert "1 failed, 1 deselected" in log and f"FAILED {target}::{name}" in log, log
        assert r["only_test"] == f"{target}::{name}"
    # each item ran alone first, without a fault: the baseline of its mutants' times
    alone = m["facts"]["alone_s"]
    assert sorted(alone) == [f"{target}::test_first", f"{target}::test_second"]
    assert all(s is not None and s > 0 for s in alone.values())
    assert f"alone: {target}::test_first: PASS in" in text
    # --all-tests: the whole command per mutant (both items run; only the mutant's one fails)
    rc, text = mutate(
        "--all-tests",
        "--faults",
        "wrong_expect_tx",
        "--pipelines",
        "0",
        "--",
        *PYTEST,
        target,
        out=tmp_path / "w",
    )
    assert rc == 0, text
    w = json.loads((tmp_path / "w" / "matrix.json").read_text())
    r = w["mutants"][1]
    log = (tmp_path / "w" / Path(r["report"]).parent / "command.log").read_text()
    assert "1 failed, 1 passed" in log and f"FAILED {target}::test_second" in log, log
    assert "only_test" not in r and "alone_s" not in w["facts"]


def test_the_selection_plugin_keeps_every_item_when_none_has_the_id(tmp_path):
    from cutedebug.instrument import pytest_only

    (tmp_path / "test_x.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), **M.only_test_env("test_x.py::test_b", {}))
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_x.py"]
    r = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 0 and "1 passed, 1 deselected" in r.stdout, r.stdout + r.stderr
    env[pytest_only.ONLY_TEST_ENV] = "test_x.py::test_gone"
    r = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout + r.stderr
    assert "matches none of the 2 collected test(s): all of them run" in r.stdout
    assert M.only_test_env("a::b", {"PYTEST_PLUGINS": "x.y"})["PYTEST_PLUGINS"] == (
        "x.y," + pytest_only.ONLY_TEST_PLUGIN
    )


@pytest.mark.slow
def test_sigterm_stops_mutate_and_its_running_mutants_at_once(tmp_path):
    """SIGTERM while mutants run (each sleeping, as a hung program would): mutate kills them,
    starts no other, records none, and exits 143 within seconds, leaving no process behind."""
    import signal
    import time

    import psutil

    out = tmp_path / "m"
    target = ROOT / "tests" / "exec_targets" / "sleeps_when_faulted.py"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "cutedebug", "mutate", "--out", str(out), "--jobs", "2"]
    argv += ["--faults", "wrong_expect_tx,wrong_arrive_count", "--", sys.executable, str(target)]
    p = subprocess.Popen(argv, cwd=str(ROOT), env=env, stdout=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        sleeping = []
        while time.monotonic() - t0 < 300 and not sleeping:  # a mutant reached its sleep
            sleeping = list((out / "mutants").glob("*/command.log"))
            sleeping = [f for f in sleeping if "sleeping" in f.read_text()]
            time.sleep(0.5)
        assert sleeping, "no mutant reached its sleep"
        kids = [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
        t1 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
        took = time.monotonic() - t1
    finally:
        if p.poll() is None:
            p.kill()
    text = p.stdout.read()
    assert rc == 143 and took < 10, (rc, took, text)
    # only the mutants that had ended by themselves are recorded: not the one killed asleep
    rec = out / "results.jsonl"
    done = [json.loads(ln) for ln in (rec.read_text().splitlines() if rec.exists() else [])]
    assert all(r["killed_by"] is None for r in done), done
    assert "t0.p0.wrong_expect_tx+16" not in {r["id"] for r in done}
    time.sleep(0.5)
    assert [
        k for k in kids if psutil.pid_exists(k) and psutil.Process(k).status() != "zombie"
    ] == []


@pytest.mark.slow
def test_an_item_that_fails_alone_gets_its_mutants_run_over_the_whole_command(tmp_path):
    """test_second passes only after test_first: alone it FAILs, so a FAIL of its mutant alone
    would say nothing about the fault: its mutants run the whole command (and still catch)."""
    out = tmp_path / "m"
    target = "tests/exec_targets/pytest_order.py"
    text, m = mutate_wrong_expect_tx(out, *PYTEST, target)
    assert m["facts"]["alone_s"][f"{target}::test_second"] is None
    assert m["facts"]["alone_s"][f"{target}::test_first"] > 0
    assert "its mutants run the whole command" in text
    by_id = {r["id"]: r for r in m["mutants"]}
    first, second = by_id["t0.p0.wrong_expect_tx+16"], by_id["t1.p0.wrong_expect_tx+16"]
    assert first["only_test"] == f"{target}::test_first" and "only_test" not in second
    assert second["status"] == "CAUGHT" and second["fault_count"] == 1
    log = (out / Path(second["report"]).parent / "command.log").read_text()
    assert "1 failed, 1 passed" in log and f"FAILED {target}::test_second" in log, log


def test_a_bug_of_ours_in_one_mutant_is_its_harness_error_not_the_end_of_the_matrix(
    tmp_path, monkeypatch
):
    """The H200's mutate over the field tests (2026-12-02-h200-s2 call3) stopped at mutant 15
    of 77 with a traceback: one mutant's report.json could not be written. That mutant is a
    HARNESS_ERROR (traceback kept beside it), the others go on."""
    from cutedebug.commands import mutate as cmd

    m = M.Mutant(
        "t0.p0.skip_producer_tail",
        "skip_producer_tail",
        {"pipeline": 0},
        {"function": "f", "occurrence": 0},
        "t0.p0",
        "skip_producer_tail",
        "producer_tail traced",
    )
    clean = X.Settings(argv=["python", "x.py"])

    def boom(*a, **k):
        raise RuntimeError("run failed")

    monkeypatch.setattr(M, "run_mutant", boom)
    r = cmd.run_and_report(m, clean, 10.0, tmp_path)
    assert r.status == M.HARNESS and r.verdict == "HARNESS_ERROR"
    assert "a bug of ours" in r.reason and "RuntimeError: run failed" in r.reason
    assert "run failed" in (tmp_path / r.report).read_text()
    assert MutantRecord.from_json(json.loads(M.result_line(r))) == r

    fine = replace(r, status=M.CAUGHT, verdict="CRASH", reason="cudaErrorLaunchFailure")
    res = X.ExecResult(
        settings=clean,
        verdict=V.Verdict.CRASH,
        reason="",
        run_dir=tmp_path / "run",
        returncode=1,
        killed_by=None,
        elapsed_s=1.0,
        processes={},
    )
    (tmp_path / "run").mkdir()
    monkeypatch.setattr(M, "run_mutant", lambda *a, **k: (fine, res))
    monkeypatch.setattr(X, "write_report", boom)
    r = cmd.run_and_report(m, clean, 10.0, tmp_path)
    assert r.status == M.HARNESS and "could not write this mutant's report" in r.reason
    assert "the command said CRASH" in r.reason
    assert "run failed" in (tmp_path / "run" / "harness_error.txt").read_text()


def test_a_relaxed_cluster_arrive_plans_no_cta_scope_sync():
    """quack's cluster kernels arrive on the cluster barrier relaxed only (the H200's mutate run
    planned cta_scope_sync on them: NOT_APPLIED three times, 2026-12-02-h200-s2 call3): a
    relaxed arrive has no release for the fault to demote, so it is counted apart and plans
    nothing; a plain cluster_arrive still plans the fault."""
    from types import SimpleNamespace

    from cutedebug.instrument.launch_record import recorded_summary
    from cutedebug.instrument.protocol import Event

    def summary(*detail):
        events = [
            Event(i, "cluster_arrive", None, "k.py", 10 + i, detail=d) for i, d in enumerate(detail)
        ]
        return recorded_summary(SimpleNamespace(events=events, pipeline_table=lambda: []))

    relaxed = summary({"relaxed": True})
    assert relaxed.arch_ops == {"cluster_arrive_relaxed": 1}
    plain = summary({}, {"relaxed": True})
    assert plain.arch_ops == {"cluster_arrive": 1, "cluster_arrive_relaxed": 1}

    def kernel_wide(arch):
        tr = replace(TMA_STREAM, pipelines=[], arch_ops=arch)
        return [m.variant for m in M.plan([tr], None, None)]

    assert "cta_scope_sync" not in kernel_wide(relaxed.arch_ops)
    assert "cta_scope_sync" in kernel_wide(plain.arch_ops)


# The H200's mutate over examples/test_field_libs.py (reports/2026-12-02-h200-s3/call1): 73
# mutants, written before a test item's alone time left out its wait for the GPU token.
H200_FIELD = ROOT / "reports" / "2026-12-02-h200-s3" / "call1" / "mutate_all"


def test_a_mutant_and_its_item_alone_are_timed_alike_without_the_gpu_wait():
    from cutedebug.records import read_text
    from cutedebug.reporting.mutation_matrix import facts_lines

    m = MutationMatrix.from_json(json.loads(read_text(H200_FIELD / "matrix.json.gz")))
    assert m.score.scored == 73 and not m.facts.alone_wait_s  # as the H200 wrote it
    clean = CleanReport.from_json(json.loads(read_text(H200_FIELD / "clean.json.gz")))
    # no mutant killed: no GPU health check on this CPU
    recs = [replace(r, killed_by=None) for r in m.mutants]
    bwd = "examples/test_field_libs.py::test_rmsnorm_backward_4cta_cluster"
    alone = dict(m.facts.alone_s)
    by_id = {r.id: r for r in recs}
    tail = by_id["t2.p0.skip_producer_tail"]  # 41.185 s, 17.55 s of it waiting for the GPU
    assert (tail.elapsed_s, tail.gpu_wait_s) == (41.185, 17.55)
    # the H200's baseline for the backward item (21.113 s) was its wall: its mutants' own
    # 23.635 s lay over 21.113 + 2
    f = M.run_facts(clean, recs, 292.7, alone)
    assert "t2.p0.skip_producer_tail" in f.over_clean_plus_2s
    # an alone run's own time, its wait left out, is the baseline: 22.0 s alone + 2 s covers it
    f = M.run_facts(clean, recs, 292.7, {**alone, bwd: 22.0}, {bwd: 3.5})
    assert "t2.p0.skip_producer_tail" not in f.over_clean_plus_2s
    own = sorted(round(r.elapsed_s - r.gpu_wait_s, 3) for r in recs)
    assert f.mutant_own_s == {
        "median": own[len(own) // 2],
        "max": own[-1],
        "wall_per_mutant": round(292.7 / 73, 3),
    }
    lines = "\n".join(facts_lines(f))
    assert f"{bwd}: 22.0 s (+ 3.5 s waiting for the GPU)" in lines
    assert "mutate's wall per mutant 4.01 s" in lines
