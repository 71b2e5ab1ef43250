"""A triage's records and matrix model: one JSON record per scenario (the source of truth,
written as results come), their validation for ``--resume``, the rates and the matrix built
from them. The triage run itself is commands/triage.py; rendering is reporting/matrix.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
import traceback
from collections import Counter
from concurrent.futures import Future
from importlib import metadata
from pathlib import Path
from typing import Any

from cutedebug.engine import scenario as S
from cutedebug.engine import verdict as V
from cutedebug.engine.compile_checks import HARNESS_CHECK
from cutedebug.engine.triage_record import (
    MATRIX_SCHEMA,
    RECORD_SCHEMA,
    BisectCall,
    CallRecord,
    Counts,
    Environment,
    Expected,
    Facts,
    Rate,
    Rates,
    TriageMatrix,
    TriageRecord,
)
from cutedebug.event_kinds import Compiled
from cutedebug.records import RecordError

__all__ = [
    "MATRIX_SCHEMA",
    "RECORD_SCHEMA",
    "BisectCall",
    "CallRecord",
    "Counts",
    "Environment",
    "Expected",
    "Facts",
    "Rate",
    "Rates",
    "TriageMatrix",
    "TriageRecord",
]
COMPILE_FINAL = V.values(lambda v: v.ends_at_compile)
STATIC_HARNESS_CHECK = HARNESS_CHECK  # the finding a static checker that crashed leaves


# ---- machine facts (never imports torch or cutlass) -----------------------------------------
def not_run_reason(gpu: dict[str, Any], archs: tuple[str, ...]) -> str | None:
    """Why a scenario cannot run here, as "not run: <short> — <detail>", or None."""
    if not gpu["present"]:
        return f"not run: no GPU — {gpu['reason']}"
    if gpu["arch"] not in archs:
        return f"not run: needs {' or '.join(archs)} — this GPU is {gpu['arch']} ({gpu['name']})"
    return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment(gpu: dict[str, Any]) -> Environment:
    return Environment(
        date=time.strftime("%Y-%m-%d %H:%M:%S %z"),
        host=platform.node(),
        python=platform.python_version(),
        cutlass=_version("nvidia-cutlass-dsl"),
        torch=_version("torch"),
        gpu=gpu.get("name"),
        arch=gpu.get("arch"),
        driver=gpu.get("driver"),
        gpu_reason=gpu.get("reason"),
    )


# ---- files ---------------------------------------------------------------------------------
def record_name(sid: str) -> str:
    """The record file of scenario ``sid``: readable, and distinct for distinct ids (``c/a``
    and ``c__a`` differ in their hash), short enough for any file system."""
    readable = "".join(
        c if c.isascii() and (c.isalnum() or c in "-_.") else "__" for c in sid.replace("/", "__")
    )[:100]
    return f"{readable}.{hashlib.sha1(sid.encode('utf-8', 'surrogatepass')).hexdigest()[:10]}.json"


class TriageInputError(S.ScenarioError):
    """Bad input to a triage (duplicate ids, an --out in use or unwritable): exit 2."""


LOCK_NAME = ".cutedebug-triage.lock"


def lock_out(out: Path):
    """Hold OUT for this triage: a second triage on the same OUT is refused (exit 2) instead
    of deleting this one's records. Returns the open lock file (closing it releases)."""
    import fcntl

    try:
        out.mkdir(parents=True, exist_ok=True)
        f = open(out / LOCK_NAME, "a+")  # noqa: SIM115
    except OSError as e:
        raise TriageInputError(f"--out {out}: cannot write there: {e.strerror}") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip()[:40]
        f.close()
        raise TriageInputError(
            f"--out {out}: another triage is writing there"
            + (f" (pid {holder})" if holder else "")
            + "; use another --out or wait for it"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def scenario_digest(sc: S.Scenario) -> str:
    h = hashlib.sha256(json.dumps(sc.to_json(), sort_keys=True, default=str).encode())
    try:
        h.update(Path(sc.kernel_file).read_bytes())
    except OSError:
        pass
    return h.hexdigest()[:16]


def record_problem(rec: Any) -> str | None:
    """Why a stored record (its JSON) cannot be reused, or None."""
    if not isinstance(rec, dict) or rec.get("schema") != RECORD_SCHEMA:
        return "not a triage record"
    try:
        TriageRecord.from_json(rec)
    except RecordError as e:
        return str(e)
    return None


def load_records(results_dir: Path, damaged: list[str] | None = None) -> dict[str, TriageRecord]:
    """Records by scenario id; files that cannot be read or reused are skipped (they get
    redone) and, given ``damaged``, named there with the reason (the field at fault)."""
    out: dict[str, TriageRecord] = {}
    for p in sorted(results_dir.glob("*.json")):
        rec = None
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
            why = record_problem(data)
            if why is None:
                rec = TriageRecord.from_json(data)
        except (OSError, ValueError, RecursionError) as e:
            why = f"unreadable ({type(e).__name__})"
        if rec is not None:
            out[rec.id] = rec
        elif damaged is not None:
            damaged.append(f"{p.name}: {why}")
    return out


# ---- records -------------------------------------------------------------------------------
def _serious(findings: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The static checks' errors and warnings; None when the checks did not run."""
    if findings is None:
        return None
    return [
        f for f in findings if isinstance(f, dict) and f.get("severity") in ("error", "warning")
    ]


def call_record(res, wall_s: float, out_dir: Path) -> CallRecord:
    """What one run_scenario call (compile or run) contributes to a record."""
    compiled = res.evidence.get("compiled") or {}
    t = res.timings
    compile_s = float(t.get("compile_s") or 0.0)
    kernel_s = float(t.get("kernel_s") or t.get("launch_to_kill_s") or 0.0)
    # compile + kernel + reference check, plus a blind hang's first run and the health check
    work = float(t["work_s"]) if t.get("work_s") is not None else compile_s + kernel_s
    attempts = max(1, len(res.repeats))
    waited = t.get("gpu_wait_s")  # other runs' kernels (engine/lanes.py): not this call's time
    verdicts = [V.Verdict.from_json(r["verdict"]) for r in res.repeats] or [res.verdict]
    vd = res.evidence.get("value_diagnosis")
    return CallRecord(
        mode=res.mode,
        verdict=res.verdict,
        reason=res.reason[:1000],
        compiled=res.outcome.last(Compiled) is not None,
        fault_count=compiled.get("fault_count"),
        static_findings=_serious(compiled.get("static_findings")),
        localization=res.localization,
        verdicts=verdicts,
        harness_errors=verdicts.count(V.Verdict.HARNESS_ERROR),
        wall_s=round(wall_s, 3),
        compile_s=round(compile_s, 3),
        kernel_s=round(kernel_s, 6),
        work_s=round(work, 3),
        overhead_s=round((wall_s - (waited or 0.0)) / attempts - work, 3),
        device=res.evidence.get("device"),
        report=_relative(Path(res.run_dir) / "report.md", out_dir),
        perturbation=_perturbation(res.evidence.get("perturbation")),
        value_diagnosis={k: vd.get(k) for k in ("row", "pattern", "summary", "lines")}
        if vd
        else None,
        **({"gpu_wait_s": round(float(waited), 3)} if waited is not None else {}),
    )


def _perturbation(p: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the matrix shows of a perturbed run: the exposing seed, its outcome, its delays."""
    if not p:
        return None
    shrunk = p.get("shrunk") or {}
    return {
        "runs": p.get("runs"),
        "exposed_by": p.get("exposed_by"),
        "outcome": p.get("exposing_outcome") or p.get("killed_during"),
        "delays": (shrunk.get("described") or p.get("described") or [])[:3],
        # seeds history_from..exposed_by-1 ran before it in its process (None: it was first)
        "history_from": p.get("history_from"),
        "replay_command": p.get("replay_command"),
    }


def _relative(path: Path, out_dir: Path) -> str:
    """A report's path as the matrix links it: relative to the triage's output folder."""
    try:
        return os.path.relpath(path, out_dir)
    except ValueError:
        return str(path)


def new_record(sc: S.Scenario, digest: str, repeat: int) -> TriageRecord:
    return TriageRecord(
        id=sc.id,
        source=sc.source,
        kernel=f"{Path(sc.kernel_file).name}:{sc.kernel_entry}",
        fault=sc.fault,
        fault_args=sc.fault_args,
        params=sc.params,
        digest=digest,
        repeat=repeat,
        expected=Expected(
            verdict=sc.expect.verdict,
            also=list(sc.expect.also),
            localization=sc.expect.localization(),
        ),
        compile=None,
        run=None,
        not_run=None,
        invalid=None,
        status="pending",
    )


def finalize(rec: TriageRecord, final: CallRecord | None, not_run: str | None) -> None:
    """Grade a record from the call that decided its verdict (None: not run)."""
    rec.status = "done"
    rec.not_run = not_run
    rec.finished_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    # the compile-only call's static findings, else the run's own compile's (a run worker that
    # compiled for itself: commands/triage.py without a compile-only pass)
    compiled_by = rec.compile or rec.run
    findings = compiled_by.static_findings if compiled_by else None
    # a crashed checker's finding is a harness error, not a fault caught statically
    crashed = [f for f in findings or [] if f.get("check") == STATIC_HARNESS_CHECK]
    rec.caught_statically = None if findings is None or crashed else bool(findings)
    rec.harness_errors = len(crashed) + sum(
        c.harness_errors for c in (rec.compile, rec.run) if c is not None
    )
    if final is None:
        rec.verdict = None
        rec.verdict_ok = None
        rec.localization_ok = None
        rec.frequencies = {}
        rec.timing_dependent = False
        rec.time_to_verdict_s = None
        rec.overhead_s = None
        return
    exp = rec.expected
    # a compile-time verdict (a run whose own compile failed too) says nothing about where a
    # kernel hangs
    graded = exp.localization and final.mode == "run" and final.compiled
    loc_ok = final.localization.get("ok") if graded else None
    freq = dict(Counter(v.value for v in final.verdicts or [final.verdict]))
    expect = exp.expect()
    # a verdict the scenario lists under expect.also counts as expected, and marks the
    # scenario timing-dependent (as disagreeing repeats do)
    rec.verdict = final.verdict
    rec.verdict_ok = all(expect.accepts(v) for v in freq)
    rec.localization_ok = loc_ok
    rec.frequencies = freq
    rec.timing_dependent = len(freq) > 1 or expect.timing_dependent
    rec.time_to_verdict_s = final.own_s
    rec.overhead_s = final.overhead_s


def invalid_record(sid: str, source: str | None, message: str) -> TriageRecord:
    return TriageRecord(
        id=sid,
        source=source,
        kernel="?",
        fault=None,
        fault_args={},
        params={},
        digest=None,
        repeat=1,
        expected=Expected(verdict="?", localization={}),
        compile=None,
        run=None,
        not_run=None,
        invalid=message,
        status="done",
        verdict=None,
        verdict_ok=None,
        localization_ok=None,
        caught_statically=None,
        frequencies={},
        timing_dependent=False,
        time_to_verdict_s=None,
        overhead_s=None,
        harness_errors=0,
    )


# ---- rates ---------------------------------------------------------------------------------
def _rate(hits: int, of: int, what: str) -> Rate:
    return Rate(hits=hits, of=of, rate=round(hits / of, 4) if of else None, what=what)


def rates(records: list[TriageRecord]) -> Rates:
    done = [r for r in records if r.done and not r.invalid]
    judged = [r for r in done if r.verdict is not None]
    faulted = [r for r in judged if r.fault]
    clean = [r for r in judged if not r.fault]
    located = [r for r in judged if r.expected.localization]
    return Rates(
        detection=_rate(
            sum(r.verdict.is_failure for r in faulted),
            len(faulted),
            "faulted scenarios whose verdict is a failure",
        ),
        classification=_rate(
            sum(bool(r.verdict_ok) for r in judged),
            len(judged),
            "verdict equals the expected one",
        ),
        localization=_rate(
            sum(r.localization_ok is True for r in located),
            len(located),
            "expected localization matched",
        ),
        false_alarms=_rate(
            sum(r.verdict is not V.Verdict.PASS for r in clean),
            len(clean),
            "clean scenarios (no fault) whose verdict is not PASS",
        ),
        counts=Counts(
            scenarios=len(records),
            with_verdict=len(judged),
            not_run=sum(r.not_run is not None for r in done),
            invalid=sum(bool(r.invalid) for r in records),
            pending=sum(not r.done for r in records),
            not_run_reasons=dict(Counter(r.not_run for r in done if r.not_run)),
            harness_errors=sum(r.harness_errors or 0 for r in records),
            timing_dependent=sum(bool(r.timing_dependent) for r in records),
            # faulted scenarios whose failure only a perturbed schedule showed (--perturb)
            exposed_by_perturbation=sum(
                bool(r.run and r.run.perturbation)
                and r.run.perturbation.get("exposed_by") is not None
                for r in faulted
            ),
        ),
    )


def build_matrix(
    records: list[TriageRecord],
    *,
    dir_: str,
    command: str,
    env: Environment,
    facts: Facts | None = None,
) -> TriageMatrix:
    return TriageMatrix(
        dir=dir_,
        command=command,
        environment=env,
        rates=rates(records),
        facts=facts,
        scenarios=sorted(records, key=lambda r: r.id),
    )


def overhead_list(recs: list[TriageRecord]) -> list[tuple[float, str]]:
    """Per scenario, wall - work time of its last call (the run, else the compile-only one):
    what the harness costs beyond compiling, running, checking the result, a blind hang's
    first run and the health check after a kill."""
    out = []
    for r in recs:
        call = r.final
        if call is not None and call.wall_s:
            out.append((call.overhead_s, r.id))
    return out


def overhead_summary(recs: list[TriageRecord]) -> dict[str, Any]:
    """The facts' overhead: n, mean, max and the scenario of the max ({"n": 0}: none)."""
    overheads = overhead_list(recs)
    if not overheads:
        return {"n": 0}
    return {
        "n": len(overheads),
        "mean": sum(o for o, _ in overheads) / len(overheads),
        "max": max(overheads)[0],
        "max_id": max(overheads)[1],
    }


def _harness_call(mode: str, exc: BaseException) -> CallRecord:
    tb = "".join(traceback.format_exception(exc))[-1500:]
    return CallRecord(
        mode=mode,
        verdict=V.Verdict.HARNESS_ERROR,
        reason=f"triage: {tb}",
        compiled=False,
        fault_count=None,
        static_findings=None,
        localization={"ok": None},
        verdicts=[V.Verdict.HARNESS_ERROR],
        harness_errors=1,
        wall_s=0.0,
        compile_s=0.0,
        kernel_s=0.0,
        work_s=0.0,
        overhead_s=0.0,
        device=None,
        report=None,
        perturbation=None,
        value_diagnosis=None,
    )


def needs_bisect(rec: TriageRecord) -> bool:
    """A HANG whose expected localization the run could not grade (ok None: only a
    printf-bisection can, e.g. a named-barrier hang), or one its GPU core graded in
    bisection's terms (then the bisection is the cross-check)."""
    return (
        rec.verdict is V.Verdict.HANG
        and bool(rec.expected.localization)
        and (rec.localization_ok is None or graded_by_core(rec))
        and rec.run is not None
        and rec.run.mode == "run"
    )


def graded_by_core(rec: TriageRecord) -> bool:
    """The run's localization came from its GPU core in bisection's terms."""
    return rec.run is not None and rec.run.localization.get("by") == "coredump"


def bisect_record(fut: Future, out_dir: Path) -> BisectCall:
    """What a finished bisection contributes to a record: its status, answer per role and
    grade (status "error" with the traceback when it raised: a bug of ours)."""
    from cutedebug.analyses.bisect_answer import role_answer

    try:
        res, wall_s = fut.result()
    except Exception as e:  # noqa: BLE001
        return BisectCall(
            status="error",
            ok=None,
            reason="".join(traceback.format_exception(e))[-1500:],
        )
    return BisectCall(
        status=res.status,
        ok=res.grade.passed,
        grade=res.grade.to_json(),
        reason=res.reason[:500],
        answer={role: role_answer(st, res.by_id) for role, st in res.searches.items()},
        runs=len(res.runs),
        timing_bug=[p.site for p in res.timing_bugs],
        wall_s=round(wall_s, 3),
        report=_relative(Path(res.run_dir) / "bisect.md", out_dir),
    )


def apply_bisect(rec: TriageRecord, bis: BisectCall) -> None:
    """Grade the record's localization by its bisection (a failed bisection grades nothing)."""
    rec.bisect = bis
    rec.status = "done"
    if graded_by_core(rec):  # the core graded it; the bisection cross-checks
        rec.core_vs_bisect = {
            "core": rec.localization_ok,
            "bisect": bis.ok,
            "agree": bis.status == "localized" and bis.ok == rec.localization_ok,
        }
    elif bis.status == "localized":
        rec.localization_ok = bis.ok
    rec.harness_errors = (rec.harness_errors or 0) + (bis.status == "error")
