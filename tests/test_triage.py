"""`cutedebug triage`: rates and rendering on hand-built records, the scheduling (parallel
compiles, one GPU run at a time), interruption + --resume, atomic writes, GPU detection.

The engine is replaced by a fake run_scenario returning recorded RunResults; the GPU by a
fake detect_gpu (or a fake nvidia-smi on PATH): no cutlass, no GPU.
"""

import json
import os
import stat
import threading
import time
import uuid
from pathlib import Path

import pytest
from helpers.overlap_triage import FAKE_H200

from cutedebug.analyses import lint
from cutedebug.commands import cli
from cutedebug.commands import triage as T
from cutedebug.engine import gpus, runner
from cutedebug.engine import scenario as S
from cutedebug.engine import verdict as V
from cutedebug.reporting import matrix as M

H200 = FAKE_H200  # the device a fake GPU machine reports (tests/helpers/overlap_triage.py)
NO_GPU = {"present": False, "reason": "no NVIDIA GPU on this machine (nvidia-smi not found)"}
SITE = {"role": "consumer", "op": "consumer_wait", "barrier": "full", "stage": 1}


# ---- records by hand ---------------------------------------------------------------------------
def call(
    mode: str,
    verdict: str,
    *,
    loc_ok=None,
    verdicts=None,
    findings=None,
    wall=3.0,
    compile_s=1.0,
    kernel_s=0.5,
    compiled=True,
    reason="recorded",
) -> T.CallRecord:
    verdicts = verdicts or [verdict]
    return T.CallRecord.from_json(
        {
            "mode": mode,
            "verdict": verdict,
            "reason": reason,
            "compiled": compiled,
            "fault_count": 1,
            "static_findings": findings,
            "localization": {"ok": loc_ok},
            "verdicts": verdicts,
            "harness_errors": verdicts.count("HARNESS_ERROR"),
            "wall_s": wall,
            "compile_s": compile_s,
            "kernel_s": kernel_s,
            "overhead_s": round(wall / len(verdicts) - compile_s - kernel_s, 3),
            "device": None,
            "report": f"runs/{mode}/report.md",
        }
    )


def record(
    sid, fault, expect, *, loc=None, compile_call=None, run_call=None, not_run=None, also=()
):
    rec = T.TriageRecord(
        id=sid,
        source=f"/s/{sid}.toml",
        kernel=sid.split("/")[0] + ".py:K",
        fault=fault,
        fault_args={},
        params={},
        digest="d",
        repeat=1,
        expected=T.Expected(verdict=expect, also=list(also), localization=loc or {}),
        compile=compile_call or call("compile", "UNSUPPORTED"),
        run=run_call,
        not_run=None,
        invalid=None,
        status="compiled",
    )
    final = (
        run_call
        if run_call is not None
        else (rec.compile if rec.compile.verdict in T.COMPILE_FINAL else None)
    )
    T.finalize(rec, final, not_run)
    return rec


LOC = {"op": "consumer_wait"}
RECORDS = [
    record("k/a", "f1", "HANG", loc=LOC, run_call=call("run", "HANG", loc_ok=True)),
    record("k/b", "f2", "MISMATCH", run_call=call("run", "PASS")),
    record("k/c", "f3", "HANG", loc=LOC, run_call=call("run", "HANG", loc_ok=False)),
    record("k/d", None, "PASS", run_call=call("run", "PASS")),
    record("k/e", None, "PASS", run_call=call("run", "MISMATCH", reason="3 of 8 <bad>")),
    record("k/f", "f4", "HANG", loc=LOC, not_run="not run: no GPU — nvidia-smi not found"),
    record(
        "k/g",
        "f5",
        "COMPILE_ERROR",
        compile_call=call("compile", "COMPILE_ERROR", compiled=False, findings=[]),
    ),
    record("j/h", "f6", "CRASH", run_call=call("run", "HARNESS_ERROR")),
    record(
        "j/i",
        "f7",
        "HANG",
        run_call=call("run", "NONDETERMINISTIC", verdicts=["HANG", "PASS", "HANG"]),
    ),
    T.invalid_record("j/broken.toml", "/s/j/broken.toml", "unknown field 'x'"),
]


def test_rates_count_what_they_say():
    r = T.rates(RECORDS)
    # faulted with a verdict: a b c g h i -> detected a c g i (PASS, HARNESS_ERROR are not)
    assert (r.detection.hits, r.detection.of) == (4, 6)
    # with a verdict: a b c d e g h i -> verdict as expected: a c d g
    assert (r.classification.hits, r.classification.of) == (4, 8)
    # expected localization and a verdict: a c (f was not run)
    assert (r.localization.hits, r.localization.of) == (1, 2)
    # clean: d e -> e is a false alarm
    assert (r.false_alarms.hits, r.false_alarms.of) == (1, 2)
    assert r.false_alarms.rate == 0.5
    c = r.counts
    assert (c.scenarios, c.with_verdict, c.not_run, c.invalid) == (10, 8, 1, 1)
    assert c.harness_errors == 1 and c.timing_dependent == 1
    assert c.not_run_reasons == {"not run: no GPU — nvidia-smi not found": 1}


def test_rates_without_verdicts_are_not_applicable_rather_than_zero():
    r = T.rates([RECORDS[5]])
    assert all(
        r.rate(k).rate is None and r.rate(k).of == 0
        for k in ("detection", "classification", "localization", "false_alarms")
    )


def test_finalize_grades_verdict_localization_statics_and_frequencies():
    a, c, f, g, i = (
        next(r for r in RECORDS if r.id == k) for k in ("k/a", "k/c", "k/f", "k/g", "j/i")
    )
    assert (a.verdict_ok, a.localization_ok, a.caught_statically) == (True, True, None)
    assert (c.verdict_ok, c.localization_ok) == (True, False)
    assert f.verdict is None and f.verdict_ok is None and f.localization_ok is None
    assert g.verdict == "COMPILE_ERROR" and g.caught_statically is False
    assert i.frequencies == {"HANG": 2, "PASS": 1} and i.timing_dependent
    assert i.overhead_s == round(3.0 / 3 - 1.0 - 0.5, 3)
    assert [M.state(r) for r in RECORDS] == [
        "ok",
        "miss",
        "miss",
        "ok",
        "miss",
        "notrun",
        "ok",
        "harness",
        "timing",
        "invalid",
    ]


def test_declared_timing_dependent_scenarios_accept_their_alternatives():
    alt = record("k/t", "f8", "MISMATCH", also=["PASS"], run_call=call("run", "PASS"))
    assert alt.verdict_ok and alt.timing_dependent and M.state(alt) == "timing"
    assert M.expected_text(alt) == "MISMATCH or PASS"
    other = record("k/u", "f8", "MISMATCH", also=["PASS"], run_call=call("run", "HANG"))
    assert not other.verdict_ok and M.state(other) == "timing"
    # repeats that disagree pass only when every verdict seen is accepted
    mixed = record(
        "k/v",
        "f8",
        "MISMATCH",
        also=["PASS"],
        run_call=call("run", "NONDETERMINISTIC", verdicts=["MISMATCH", "PASS", "MISMATCH"]),
    )
    assert mixed.verdict_ok and mixed.frequencies == {"MISMATCH": 2, "PASS": 1}
    md = M.render_markdown(
        T.build_matrix([alt, other], dir_="s", command="c", env=T.environment(NO_GPU), facts=None)
    )
    bad = md.split("## Not as expected")[1]
    assert "k/u" in bad and "k/t" not in bad


def matrix():
    facts = T.Facts(
        harness_errors=1,
        processes_left=[],
        gpu_health=None,
        overhead_s={"n": 2, "mean": 1.25, "max": 1.5, "max_id": "k/a"},
        total_s=12.5,
        interrupted=False,
    )
    return T.build_matrix(
        RECORDS,
        dir_="scenarios",
        command="cutedebug triage scenarios",
        env=T.environment(NO_GPU),
        facts=facts,
    )


def test_markdown_matrix_says_not_run_and_rates():
    md = M.render_markdown(matrix())
    assert "| detection | 67% (4/6) |" in md
    assert "| false alarms | 50% (1/2) |" in md
    assert "1 × not run: no GPU — nvidia-smi not found" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| k.py:K | f4 |"))
    assert "| not run: no GPU | – | n.a. |" in row
    row = next(ln for ln in md.splitlines() if ln.startswith("| j.py:K | f7 |"))
    assert "NONDETERMINISTIC (HANG 2/3, PASS 1/3) | ~ |" in row
    # the kernel × fault grid: one column per kernel, one row per fault, clean first
    grid = [
        ln
        for ln in md.split("## Matrix")[1].split("## Scenarios")[0].splitlines()
        if ln.startswith("| ")
    ]
    assert grid[0] == "| fault | j.py:K | k.py:K |"
    assert grid[1].startswith("| none (clean) |  | ✓ d: PASS<br>✗ e: MISMATCH |")
    assert "- HARNESS_ERROR: 1" in md and "- total time: 12.5 s" in md
    assert "`k/e`: expected PASS, got MISMATCH" in md


def test_html_matrix_is_one_self_contained_colored_page():
    page = M.render_html(matrix())
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page and "http" not in page and "<link" not in page
    for cls in ("ok", "miss", "notrun", "harness", "timing", "invalid"):
        assert f"<tr class='{cls}'>" in page
        assert f".{cls}{{background" in page
    assert "3 of 8 &lt;bad&gt;" in page and "<bad>" not in page
    assert "<a href='runs/run/report.md'>k/a</a>" in page


# ---- the triage run with a fake engine -----------------------------------------------------
KERNEL = 'class K:\n    PARAMS = {"n": 4}\n    SWITCHES = {"bad": "misbehaves"}\n'


def scenarios_dir(root: Path, specs: dict[str, tuple[str, str | None]]) -> Path:
    d = root / "scen"
    (d / "k").mkdir(parents=True)
    (root / "k.py").write_text(KERNEL)
    for name, (expect, fault) in specs.items():
        (d / "k" / f"{name}.toml").write_text(
            f'id = "k/{name}"\n[kernel]\nfile = "../../k.py"\nentry = "K"\n'
            + (f'[fault]\nkind = "{fault}"\n' if fault else "")
            + f'[expect]\nverdict = "{expect}"\n'
        )
    return d


class FakeEngine:
    """runner.run_scenario stand-in: outcomes by (id, mode); records concurrency. A run handed
    a GPU token (triage's overlap) compiles for itself (the (id, "compile") outcome is its own
    compile's: findings, a compile error that ends it there), then launches holding the token
    through the real instrument/launch_gpu functions, as a worker and its runner do."""

    def __init__(self, outcomes=None, delay=0.0, interrupt_on=None):
        self.outcomes, self.delay, self.interrupt_on = outcomes or {}, delay, interrupt_on
        self.calls: list[tuple[str, str]] = []
        self.launches: list[str] = []
        self.tokens: set[str] = set()
        self.lock = threading.Lock()
        self.active = {"compile": 0, "run": 0, "launch": 0}
        self.peak = {"compile": 0, "run": 0, "launch": 0}

    def launch(self, token: str, sid: str) -> float:
        """Take the token, hold the GPU for ``delay``, give it back: the seconds waited."""
        from cutedebug.instrument.launch_gpu import acquire_gpu_token, release_gpu_token

        tag = uuid.uuid4().hex
        waited = acquire_gpu_token(token, tag)
        with self.lock:
            self.launches.append(sid)
            self.active["launch"] += 1
            self.peak["launch"] = max(self.peak["launch"], self.active["launch"])
        time.sleep(self.delay)
        with self.lock:
            self.active["launch"] -= 1
        assert release_gpu_token(token, tag)
        return waited

    def __call__(
        self,
        sc,
        *,
        runs_root="runs",
        run_dir=None,
        mode="run",
        probes=None,
        wait_budget_ms=None,
        repeat=1,
        command="",
        forkserver=None,
        compile_checks=(),
        gpu_token=None,
    ):
        with self.lock:
            self.calls.append((sc.id, mode))
            self.active[mode] += 1
            self.peak[mode] = max(self.peak[mode], self.active[mode])
        try:
            if (sc.id, mode) == self.interrupt_on:
                raise KeyboardInterrupt
            time.sleep(self.delay)  # the compile (and, without a token, the launch)
            spec = self.outcomes.get((sc.id, mode), {})
            waited = None
            if mode == "run" and gpu_token:
                self.tokens.add(gpu_token)
                own = self.outcomes.get((sc.id, "compile"), {})
                if not own.get("compiled", True) or own.get("verdict") in T.COMPILE_FINAL:
                    spec = own  # its compile decided: no launch
                else:
                    spec = {"findings": own.get("findings"), **spec}
                    waited = self.launch(gpu_token, sc.id)
            d = Path(runs_root) / sc.id.replace("/", "__") / mode
            d.mkdir(parents=True, exist_ok=True)
            o = V.Outcome(phase="done")
            if spec.get("compiled", True):
                o.add({"event": "compiled", "secs": 0.4})
            verdict = spec.get("verdict", "UNSUPPORTED" if mode == "compile" else "PASS")
            reps = [{"verdict": v, "digest": None} for v in spec.get("repeats", [])]
            return runner.RunResult(
                scenario=sc,
                verdict=V.Verdict(verdict),
                reason="fake",
                run_dir=d,
                outcome=o,
                evidence={
                    "compiled": {
                        "secs": 0.4,
                        "fault_count": 1,
                        # as the worker: findings only from the check it was handed
                        "static_findings": spec.get("findings")
                        if lint.static_findings in compile_checks
                        else None,
                    }
                },
                timings={"compile_s": 0.4, "kernel_s": 0.1}
                | ({"gpu_wait_s": waited} if waited is not None else {}),
                repeats=reps,
                mode=mode,
            )
        finally:
            with self.lock:
                self.active[mode] -= 1


@pytest.fixture
def engine(monkeypatch):
    def install(gpu=H200, **kw):
        fake = FakeEngine(**kw)
        monkeypatch.setattr(runner, "run_scenario", fake)
        monkeypatch.setattr(T, "detect_gpu", lambda: gpu)

        def health_check(**kw):
            fake.health_calls.append(kw)
            return {"healthy": True}

        fake.health_calls = []
        monkeypatch.setattr(runner, "health_check", health_check)
        monkeypatch.setattr(runner, "start_forkserver", lambda *a, **k: None)
        return fake

    return install


SPECS = {
    "clean": ("PASS", None),
    "hang": ("HANG", "bad"),
    "crash": ("CRASH", "bad"),
    "cerr": ("COMPILE_ERROR", "bad"),
    "miss": ("MISMATCH", "bad"),
}
ERR = {"severity": "error", "check": "tx_bytes", "message": "expect_tx 16 B above the copy"}
NOTE = {"severity": "info", "check": "stages", "message": "4 stages"}
OUTCOMES = {
    ("k/hang", "run"): {"verdict": "HANG"},
    ("k/crash", "run"): {"verdict": "CRASH"},
    ("k/hang", "compile"): {"findings": [ERR, NOTE]},
    ("k/clean", "compile"): {"findings": [NOTE]},
    ("k/cerr", "compile"): {"verdict": "COMPILE_ERROR", "compiled": False},
    ("k/miss", "run"): {"verdict": "NONDETERMINISTIC", "repeats": ["MISMATCH", "PASS"]},
}


def run_triage(tmp_path, **kw) -> tuple[int, list[str], Path]:
    lines: list[str] = []
    out = tmp_path / "out"
    opts = T.Options(dir=tmp_path / "scen", out=out, command="cutedebug triage", **kw)
    return T.triage(opts, out=lines.append), lines, out


@pytest.mark.parametrize("overlap", [True, False])
def test_compiles_in_parallel_gpu_runs_one_at_a_time(tmp_path, engine, overlap):
    scenarios_dir(tmp_path, SPECS)
    fake = engine(outcomes=OUTCOMES, delay=0.15)
    rc, lines, out = run_triage(tmp_path, jobs=3, repeat=2, overlap=overlap)
    ran = ["k/clean", "k/crash", "k/hang", "k/miss"]
    if overlap:
        # run workers compile at once; one at a time holds the GPU's token and launches;
        # nothing is compiled twice (no compile-only child where the run compiles)
        assert fake.peak["run"] >= 2 and fake.peak["launch"] == 1
        assert sorted(fake.calls) == sorted((f"k/{n}", "run") for n in SPECS)
        assert sorted(fake.launches) == ran  # the compile error never launched
        assert len(fake.tokens) == 1 and not any(Path(t).exists() for t in fake.tokens)
    else:
        assert fake.peak["run"] == 1 and fake.peak["compile"] >= 2
        # the compile error decides its verdict: no GPU run for it
        assert sorted(i for i, m in fake.calls if m == "run") == ran
    recs = {k: r.to_json() for k, r in T.load_records(out / "results").items()}
    assert {k: r["verdict"] for k, r in recs.items()} == {
        "k/clean": "PASS",
        "k/hang": "HANG",
        "k/crash": "CRASH",
        "k/cerr": "COMPILE_ERROR",
        "k/miss": "NONDETERMINISTIC",
    }
    assert recs["k/miss"]["frequencies"] == {"MISMATCH": 1, "PASS": 1}
    # caught statically: errors and warnings of the static checks count, notes do not (the
    # findings of the call that compiled it: the run's own compile when overlapping)
    assert recs["k/hang"]["caught_statically"] is True
    compiled_by = "run" if overlap else "compile"
    assert recs["k/hang"][compiled_by]["static_findings"] == [ERR]
    assert recs["k/cerr"]["localization_ok"] is None
    assert recs["k/clean"]["caught_statically"] is False
    assert recs["k/crash"]["caught_statically"] is None  # the checks did not run
    progress = [ln for ln in lines if ln.startswith("[")]
    assert len(progress) == 5 and progress[-1].startswith("[  5/5]")
    assert "HARNESS_ERROR: 0" in lines and "processes of ours left: 0" in lines
    assert "GPU health: healthy" in lines
    # one health check at the end, handed the fork server (None here) and the output folder
    assert fake.health_calls == [{"forkserver": None, "run_dir": out}]
    assert any(
        ln.startswith("overhead beyond compile + run + check per scenario: mean") for ln in lines
    )
    assert rc == 1  # k/miss is timing-dependent, not as expected
    m = json.loads((out / "matrix.json").read_text())
    assert m["rates"]["detection"]["of"] == 4 and m["facts"]["processes_left"] == []
    assert (out / "matrix.html").is_file() and (out / "matrix.md").is_file()


def test_without_a_gpu_runs_are_not_run_not_misses(tmp_path, engine):
    scenarios_dir(tmp_path, SPECS)
    fake = engine(gpu=NO_GPU, outcomes=OUTCOMES)
    rc, lines, out = run_triage(tmp_path, jobs=2)
    assert {m for _, m in fake.calls} == {"compile"}
    assert rc == 4  # could not run here (exits.EXIT_NOT_RUN), nothing else wrong
    recs = {k: r.to_json() for k, r in T.load_records(out / "results").items()}
    assert recs["k/cerr"]["verdict"] == "COMPILE_ERROR" and recs["k/cerr"]["verdict_ok"]
    assert all(r["not_run"].startswith("not run: no GPU") for k, r in recs.items() if k != "k/cerr")
    md = (out / "matrix.md").read_text()
    assert "| classification | 100% (1/1) |" in md and "4 × not run: no GPU" in md
    assert "GPU health: n.a. (no GPU)" in lines and fake.health_calls == []


@pytest.mark.parametrize("overlap", [True, False])
def test_interrupted_triage_keeps_results_and_resume_finishes_the_rest(tmp_path, engine, overlap):
    scenarios_dir(tmp_path, SPECS)
    fake = engine(outcomes=OUTCOMES, interrupt_on=("k/hang", "run"))
    rc, lines, out = run_triage(tmp_path, jobs=1, overlap=overlap)
    assert rc == 130 and any("interrupted" in ln for ln in lines)
    files = sorted((out / "results").iterdir())
    assert not [f for f in files if f.name.endswith(".tmp")]
    recs = {r["id"]: r for r in (json.loads(f.read_text()) for f in files)}
    done = {k for k, r in recs.items() if r["status"] == "done"}
    # overlapping, nothing was compiled apart from the run: it is still pending
    assert "k/hang" not in done
    assert recs["k/hang"]["status"] == ("pending" if overlap else "compiled")
    assert json.loads((out / "matrix.json").read_text())["facts"]["interrupted"] is True
    assert not list(out.glob(".gpu-*.token"))  # the GPU token is gone with the triage

    fake = engine(outcomes=OUTCOMES)
    rc, lines, out = run_triage(tmp_path, jobs=1, resume=True, overlap=overlap)
    assert rc == 1  # k/miss is timing-dependent
    # finished ones are skipped; k/hang's compile is reused, only its run is redone
    assert ("k/hang", "compile") not in fake.calls and ("k/hang", "run") in fake.calls
    assert not {i for i, _ in fake.calls} & done
    recs = {k: r.to_json() for k, r in T.load_records(out / "results").items()}
    assert len(recs) == 5 and all(r["status"] == "done" for r in recs.values())
    assert recs["k/hang"]["verdict"] == "HANG"


def test_resume_redoes_changed_scenarios_and_not_run_ones_once_a_gpu_is_there(tmp_path, engine):
    scen = scenarios_dir(tmp_path, {"clean": ("PASS", None), "hang": ("HANG", "bad")})
    engine(gpu=NO_GPU, outcomes=OUTCOMES)
    run_triage(tmp_path)
    fake = engine(gpu=NO_GPU, outcomes=OUTCOMES)
    run_triage(tmp_path, resume=True)
    assert fake.calls == []  # nothing changed, nothing redone
    (scen / "k" / "clean.toml").write_text(
        (scen / "k" / "clean.toml").read_text() + "[params]\nn = 8\n"
    )
    fake = engine(gpu=NO_GPU, outcomes=OUTCOMES)
    run_triage(tmp_path, resume=True)
    assert fake.calls == [("k/clean", "compile")]
    fake = engine(gpu=H200, outcomes=OUTCOMES)  # the same results on a GPU machine
    rc, _, out = run_triage(tmp_path, resume=True)
    assert sorted(fake.calls) == [("k/clean", "run"), ("k/hang", "run")] and rc == 0
    # without --resume everything is redone (by the runs alone, when they overlap)
    fake = engine(gpu=H200, outcomes=OUTCOMES)
    run_triage(tmp_path)
    assert sorted(fake.calls) == [("k/clean", "run"), ("k/hang", "run")]
    fake = engine(gpu=H200, outcomes=OUTCOMES)
    run_triage(tmp_path, overlap=False)
    assert len(fake.calls) == 4


@pytest.mark.parametrize("overlap", [True, False])
def test_harness_bugs_and_unloadable_kernels_are_recorded_not_raised(
    tmp_path, engine, monkeypatch, overlap
):
    from cutedebug.engine.scenario import ScenarioError

    scenarios_dir(
        tmp_path, {"clean": ("PASS", None), "hang": ("HANG", "bad"), "gone": ("PASS", None)}
    )
    (tmp_path / "scen" / "k" / "junk.toml").write_text("id = \n")
    fake = engine()

    def flaky(sc, **kw):
        if sc.id == "k/hang":
            raise RuntimeError("bug in the harness")
        if sc.id == "k/gone":
            raise ScenarioError("importing the kernel file failed: ImportError: nope")
        return fake(sc, **kw)

    monkeypatch.setattr(runner, "run_scenario", flaky)
    rc, lines, out = run_triage(tmp_path, overlap=overlap)
    recs = {k: r.to_json() for k, r in T.load_records(out / "results").items()}
    assert recs["k/hang"]["verdict"] == "HARNESS_ERROR" and recs["k/hang"]["harness_errors"] == 1
    assert "bug in the harness" in recs["k/hang"]["run" if overlap else "compile"]["reason"]
    assert "ImportError: nope" in recs["k/gone"]["invalid"]
    junk = next(r for r in recs.values() if r["id"].endswith("junk.toml"))
    assert "not valid TOML" in junk["invalid"]
    assert recs["k/clean"]["verdict"] == "PASS"
    assert "HARNESS_ERROR: 1" in lines and rc == 3  # exits.EXIT_HARNESS


# ---- atomic writes and the machine ---------------------------------------------------------
def test_atomic_write_keeps_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    target = tmp_path / "results" / "a.json"
    T.atomic_write(target, '{"v": 1}')

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        T.atomic_write(target, '{"v": 2}')
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in target.parent.iterdir()] == ["a.json"]


def test_half_written_records_are_ignored_and_redone(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "k__a.json").write_text('{"schema": "cutedebug.triage.record/1", "id": "k/')
    (results / "k__b.json").write_text(json.dumps(RECORDS[0].to_json()))
    assert list(T.load_records(results)) == ["k/a"]  # RECORDS[0]'s id


def fake_smi(tmp_path, monkeypatch, output: str) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '{output}'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_detect_gpu_reads_nvidia_smi(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, "NVIDIA H200, 9.0, 580.65.06\\nNVIDIA B200, 10.0, 580\\n")
    assert T.detect_gpu() == H200
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert T.detect_gpu()["arch"] == "sm_100a"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert T.detect_gpu()["present"] is False
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert T.detect_gpu() == {"present": False, "reason": NO_GPU["reason"]}


def test_detect_gpu_with_a_broken_driver(tmp_path, monkeypatch):
    fake_smi(
        tmp_path,
        monkeypatch,
        "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.\\n",
    )
    g = T.detect_gpu()
    assert g["present"] is False and "could not communicate" in g["reason"]


def test_nvidia_smi_rows_one_per_gpu_or_why_none(tmp_path, monkeypatch):
    """gpus.smi_rows: the one way the harness asks nvidia-smi (detect_gpu, smi_gpus,
    preloads.uniform_cc): lines with the asked fields only, stripped; else why not."""
    fake_smi(tmp_path, monkeypatch, "Warning: a note\\n0, 9.0\\n 1 , 10.0 \\n")
    assert gpus.smi_rows("index,compute_cap") == ([["0", "9.0"], ["1", "10.0"]], "")
    assert gpus.smi_rows("index,compute_cap", tied=False)[0] == [["0", "9.0"], ["1", "10.0"]]
    fake_smi(tmp_path, monkeypatch, "0\\n1\\n")
    assert gpus.smi_gpus() == ["0", "1"]
    fake_smi(tmp_path, monkeypatch, "")
    assert gpus.smi_rows("index") == ([], "nvidia-smi lists no usable GPU: ")
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert gpus.smi_rows("index") == ([], "no NVIDIA GPU on this machine (nvidia-smi not found)")
    assert gpus.smi_gpus() == []


def test_cli_triage(tmp_path, engine, capsys):
    scenarios_dir(tmp_path, {"clean": ("PASS", None)})
    engine()
    rc = cli.main(["triage", str(tmp_path / "scen"), "--out", str(tmp_path / "o"), "--jobs", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "[  1/1] ✓ k/clean" in out and "classification: 100% (1/1)" in out
    assert (
        cli.main(["triage", str(tmp_path / "scen"), "--out", str(tmp_path / "o"), "--repeat", "0"])
        == 2
    )


def test_cli_triage_bisect_flag(tmp_path, engine, monkeypatch):
    scenarios_dir(tmp_path, {"clean": ("PASS", None)})
    (tmp_path / "scen" / "k" / "nb.toml").write_text(NAMED)
    fake = engine(outcomes={("k/nb", "run"): {"verdict": "HANG"}})
    monkeypatch.setattr(T, "_bisect_call", fake_bisect(fake))
    rc = cli.main(
        ["triage", str(tmp_path / "scen"), "--out", str(tmp_path / "o"), "--jobs", "1", "--bisect"]
    )
    assert rc == 0 and ("k/nb", "bisect") in fake.calls


def test_overhead_leaves_out_the_check_a_blind_first_run_and_the_health_check(tmp_path):
    o = V.Outcome(
        phase="done",
        events=[
            {"event": "compiled", "secs": 1.5, "t": 2.0},
            {"event": "launched", "t": 2.1},
            {"event": "synced", "kernel_s": 0.25, "t": 2.4},
            {"event": "checked", "ok": False, "t": 4.9},
        ],
    )
    t = runner._timings(o, {})
    assert (t["compile_s"], t["kernel_s"], t["check_s"]) == (1.5, 0.25, 2.5)
    assert runner.work_s(t) == 1.5 + 0.25 + 2.5
    # a hang killed by the watchdog: the kernel's time is launch -> kill
    assert runner.work_s({"compile_s": 1.0, "launch_to_kill_s": 1.5}) == 2.5
    sc = S.adhoc(
        str(Path(runner.REPO_ROOT) / "kernels" / "minimal.py") + ":Minimal", {}, None, {}, "HANG"
    )
    res = runner.RunResult(
        scenario=sc,
        verdict=V.Verdict.HANG,
        reason="",
        run_dir=tmp_path,
        outcome=o,
        timings={"compile_s": 1.0, "launch_to_kill_s": 1.5, "work_s": 2.5 + 3.0 + 4.0},
    )
    rec = T.call_record(res, wall_s=11.0, out_dir=tmp_path)
    assert rec.work_s == 9.5 and rec.overhead_s == 1.5
    # recorded results without work_s: compile + kernel, as before
    res.timings = {"compile_s": 1.0, "kernel_s": 0.5}
    assert T.call_record(res, wall_s=2.0, out_dir=tmp_path).overhead_s == 0.5


# ---- --bisect: hangs that only printf-bisection can localize ----------------------------------
NAMED = (
    'id = "k/nb"\n[kernel]\nfile = "../../k.py"\nentry = "K"\n[fault]\nkind = "bad"\n'
    '[expect]\nverdict = "HANG"\nrole = "consumer"\nop = "named_barrier"\n'
    'barrier = "named"\nlocalized_by = "bisect"\n'
)


def fake_bisect(fake, *, found_op="named_barrier", fail=False):
    from cutedebug.analyses import bisect as B
    from cutedebug.instrument.checkpoint import CheckpointSite

    def bisect_call(sc, runs_dir, forkserver=None, token=None):
        with fake.lock:
            fake.calls.append((sc.id, "bisect"))
        if token:  # its runs launch holding the GPU's token, as the runs do
            fake.launch(token, sc.id + "#bisect")
        with fake.lock:
            fake.bisect_seen.append((threading.current_thread().name, dict(fake.active)))
        if fail:
            raise RuntimeError("bisect broke")
        site = CheckpointSite(
            id=3,
            kind="named_barrier",
            op=found_op,
            barrier="named",
            file="/k.py",
            line=12,
            role="consumer",
            detail="bar.sync 1, 256",
        )
        search = B.RoleSearch(role="consumer", sites=[3], lo=-1, hi=0, runs=1, budget=2)
        grade = B.grade(
            {"role": "consumer", "op": "named_barrier", "barrier": "named"},
            {"consumer": search},
            {3: site},
        )
        d = Path(runs_dir) / "nb-bisect"
        d.mkdir(parents=True, exist_ok=True)
        res = B.BisectResult(
            scenario=sc,
            run_dir=d,
            baseline=B.Baseline(
                verdict="HANG", reason="", probes=False, seconds=0.0, dir="baseline", compile_s=None
            ),
            sites=[site],
            roles={"consumer": [3]},
            searches={"consumer": search},
            runs=[B.CheckpointRun(site=3, reached=False, verdict="HANG")],
            grade=grade,
        )
        return res, 17.5

    fake.bisect_seen = []
    return bisect_call


def test_bisect_grades_the_hangs_a_run_cannot_localize(tmp_path, engine, monkeypatch):
    scenarios_dir(tmp_path, SPECS)
    (tmp_path / "scen" / "k" / "nb.toml").write_text(NAMED)
    fake = engine(outcomes=OUTCOMES | {("k/nb", "run"): {"verdict": "HANG"}})
    monkeypatch.setattr(T, "_bisect_call", fake_bisect(fake))
    rc, lines, out = run_triage(tmp_path, jobs=2, bisect=True)
    # only the named-barrier hang is bisected (k/hang states no localization), on the GPU
    # queue: its runs launch holding the GPU's token, never beside another launch
    assert [c for c in fake.calls if c[1] == "bisect"] == [("k/nb", "bisect")]
    ((thread, active),) = fake.bisect_seen
    assert thread.startswith("gpu") and "k/nb#bisect" in fake.launches
    assert fake.peak["launch"] == 1
    rec = T.load_records(out / "results")["k/nb"].to_json()
    assert rec["status"] == "done" and rec["localization_ok"] is True
    b = rec["bisect"]
    assert (b["status"], b["ok"], b["runs"], b["wall_s"]) == ("localized", True, 1, 17.5)
    assert b["answer"]["consumer"].startswith("never reached its first site #3 named_barrier")
    assert b["report"] == os.path.join("runs", "nb-bisect", "bisect.md")
    # the bisection is extra; the run's own time is its wall less any wait for the GPU token
    # (a few ms when the other run still held it: 0.002 s against a 0.003 s wall, once)
    own = round(rec["run"]["wall_s"] - rec["run"].get("gpu_wait_s", 0.0), 3)
    assert rec["time_to_verdict_s"] == own
    nb = next(ln for ln in lines if "k/nb" in ln)
    assert "HANG (expected HANG) loc right (bisect)" in nb
    m = json.loads((out / "matrix.json").read_text())
    assert (m["rates"]["localization"]["hits"], m["rates"]["localization"]["of"]) == (1, 1)
    assert rc == 1  # k/miss is still not as expected


def test_without_bisect_the_named_barrier_hang_stays_ungraded(tmp_path, engine, monkeypatch):
    scenarios_dir(tmp_path, {"clean": ("PASS", None)})
    (tmp_path / "scen" / "k" / "nb.toml").write_text(NAMED)
    fake = engine(outcomes={("k/nb", "run"): {"verdict": "HANG"}})
    monkeypatch.setattr(T, "_bisect_call", fake_bisect(fake))
    rc, lines, out = run_triage(tmp_path, jobs=1)
    assert not [c for c in fake.calls if c[1] == "bisect"]
    rec = T.load_records(out / "results")["k/nb"].to_json()
    assert rec["localization_ok"] is None and "bisect" not in rec
    assert any("k/nb" in ln and "loc n.a." in ln for ln in lines) and rc == 0


def test_a_failing_bisection_is_a_harness_error_not_a_localization(tmp_path, engine, monkeypatch):
    scenarios_dir(tmp_path, {"clean": ("PASS", None)})
    (tmp_path / "scen" / "k" / "nb.toml").write_text(NAMED)
    fake = engine(outcomes={("k/nb", "run"): {"verdict": "HANG"}})
    monkeypatch.setattr(T, "_bisect_call", fake_bisect(fake, fail=True))
    rc, lines, out = run_triage(tmp_path, jobs=1, bisect=True)
    rec = T.load_records(out / "results")["k/nb"].to_json()
    assert rec["status"] == "done" and rec["localization_ok"] is None
    assert rec["bisect"]["status"] == "error" and "bisect broke" in rec["bisect"]["reason"]
    assert rec["harness_errors"] == 1 and "HARNESS_ERROR: 1" in lines and rc == 3


def test_a_core_graded_hang_keeps_its_grade_and_bisection_cross_checks():
    """triage --coredump --bisect: a bisection-only hang the core graded is still bisected,
    as a cross-check; the record keeps the core's grade and says whether they agree."""
    rec = record(
        "k/core",
        "f",
        "HANG",
        loc={"role": "consumer"},
        run_call=call("run", "HANG", loc_ok=True),
    )
    rec.run.localization["by"] = "coredump"
    assert T.graded_by_core(rec) and T.needs_bisect(rec)
    T.apply_bisect(rec, T.BisectCall(status="localized", ok=False))
    assert rec.localization_ok is True
    assert rec.core_vs_bisect == {"core": True, "bisect": False, "agree": False}
    # without a core, the bisection grades as before
    plain = record("k/plain", "f", "HANG", loc={"role": "consumer"}, run_call=call("run", "HANG"))
    assert not T.graded_by_core(plain) and T.needs_bisect(plain)
    T.apply_bisect(plain, T.BisectCall(status="localized", ok=True))
    assert plain.localization_ok is True and "core_vs_bisect" not in plain.to_json()
