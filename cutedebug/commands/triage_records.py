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
from cutedebug.reporting.matrix import expect_of

RECORD_SCHEMA = "cutedebug.triage.record/1"
MATRIX_SCHEMA = "cutedebug.triage.matrix/1"
COMPILE_FINAL = V.values(lambda v: v.ends_at_compile)
STATIC_HARNESS_CHECK = "harness_error"  # analyses/lint.py HARNESS_CHECK: the checker crashed


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


def environment(gpu: dict[str, Any]) -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "host": platform.node(),
        "python": platform.python_version(),
        "cutlass": _version("nvidia-cutlass-dsl"),
        "torch": _version("torch"),
        "gpu": gpu.get("name"),
        "arch": gpu.get("arch"),
        "driver": gpu.get("driver"),
        "gpu_reason": gpu.get("reason"),
    }


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


# What a record must hold to be reused by --resume (anything less is redone).
_RECORD_KEYS = {
    "schema": str,
    "id": str,
    "digest": (str, type(None)),
    "repeat": int,
    "status": str,
    "expected": dict,
    "compile": (dict, type(None)),
    "run": (dict, type(None)),
    "not_run": (str, type(None)),
}
_DONE_KEYS = {
    "verdict": (str, type(None)),
    "verdict_ok": (bool, type(None)),
    "localization_ok": (bool, type(None)),
    "frequencies": dict,
    "harness_errors": int,
}


def record_problem(rec: Any) -> str | None:
    """Why a stored record cannot be reused, or None."""
    if not isinstance(rec, dict) or rec.get("schema") != RECORD_SCHEMA:
        return "not a triage record"
    for keys in (_RECORD_KEYS, _DONE_KEYS if rec.get("status") == "done" else {}):
        for k, t in keys.items():
            if k not in rec:
                return f"field {k!r} missing"
            if not isinstance(rec[k], t) or isinstance(rec[k], bool) and t is int:
                return f"field {k!r} has the wrong type"
    exp = rec["expected"]
    if not isinstance(exp.get("verdict"), str) or not isinstance(exp.get("localization"), dict):
        return "field 'expected' incomplete"
    for call in ("compile", "run"):
        c = rec.get(call)
        if c is not None and not all(k in c for k in ("verdict", "compiled", "localization")):
            return f"field {call!r} incomplete"
    return None


def load_records(results_dir: Path, damaged: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Records by scenario id; files that cannot be read or reused are skipped (they get
    redone) and, given ``damaged``, named there with the reason."""
    out: dict[str, dict[str, Any]] = {}
    for p in sorted(results_dir.glob("*.json")):
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
            why = record_problem(rec)
        except (OSError, ValueError, RecursionError) as e:
            why = f"unreadable ({type(e).__name__})"
        if why is None:
            out[rec["id"]] = rec
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


def call_record(res, wall_s: float, out_dir: Path) -> dict[str, Any]:
    """What one run_scenario call (compile or run) contributes to a record."""
    compiled = res.evidence.get("compiled") or {}
    t = res.timings
    compile_s = float(t.get("compile_s") or 0.0)
    kernel_s = float(t.get("kernel_s") or t.get("launch_to_kill_s") or 0.0)
    # compile + kernel + reference check, plus a blind hang's first run and the health check
    work = float(t["work_s"]) if t.get("work_s") is not None else compile_s + kernel_s
    attempts = max(1, len(res.repeats))
    verdicts = [r["verdict"] for r in res.repeats] or [res.verdict.value]
    return {
        "mode": res.mode,
        "verdict": res.verdict.value,
        "reason": res.reason[:1000],
        "compiled": res.outcome.event("compiled") is not None,
        "fault_count": compiled.get("fault_count"),
        "static_findings": _serious(compiled.get("static_findings")),
        "localization": res.localization,
        "verdicts": verdicts,
        "harness_errors": verdicts.count("HARNESS_ERROR"),
        "wall_s": round(wall_s, 3),
        "compile_s": round(compile_s, 3),
        "kernel_s": round(kernel_s, 6),
        "work_s": round(work, 3),
        "overhead_s": round(wall_s / attempts - work, 3),
        "device": res.evidence.get("device"),
        "report": _relative(Path(res.run_dir) / "report.md", out_dir),
        "perturbation": _perturbation(res.evidence.get("perturbation")),
        "value_diagnosis": {
            k: (res.evidence.get("value_diagnosis") or {}).get(k)
            for k in ("row", "pattern", "summary", "lines")
        }
        if res.evidence.get("value_diagnosis")
        else None,
    }


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
    }


def _relative(path: Path, out_dir: Path) -> str:
    """A report's path as the matrix links it: relative to the triage's output folder."""
    try:
        return os.path.relpath(path, out_dir)
    except ValueError:
        return str(path)


def new_record(sc: S.Scenario, digest: str, repeat: int) -> dict[str, Any]:
    return {
        "schema": RECORD_SCHEMA,
        "id": sc.id,
        "source": sc.source,
        "kernel": f"{Path(sc.kernel_file).name}:{sc.kernel_entry}",
        "fault": sc.fault,
        "fault_args": sc.fault_args,
        "params": sc.params,
        "digest": digest,
        "repeat": repeat,
        "expected": {
            "verdict": sc.expect.verdict,
            "also": list(sc.expect.also),
            "localization": sc.expect.localization(),
        },
        "compile": None,
        "run": None,
        "not_run": None,
        "invalid": None,
        "status": "pending",
    }


def finalize(rec: dict[str, Any], final: dict[str, Any] | None, not_run: str | None) -> None:
    """Grade a record from the call that decided its verdict (None: not run)."""
    rec["status"] = "done"
    rec["not_run"] = not_run
    rec["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    comp = rec.get("compile") or {}
    findings = comp.get("static_findings")
    # a crashed checker's finding is a harness error, not a fault caught statically
    crashed = [f for f in findings or [] if f.get("check") == STATIC_HARNESS_CHECK]
    rec["caught_statically"] = None if findings is None or crashed else bool(findings)
    rec["harness_errors"] = len(crashed) + sum(
        (c or {}).get("harness_errors", 0) for c in (rec.get("compile"), rec.get("run"))
    )
    if final is None:
        rec.update(
            verdict=None,
            verdict_ok=None,
            localization_ok=None,
            frequencies={},
            timing_dependent=False,
            time_to_verdict_s=None,
            overhead_s=None,
        )
        return
    exp = rec["expected"]
    verdict = final["verdict"]
    # a compile-time verdict says nothing about where a kernel hangs
    loc_ok = (
        final["localization"].get("ok") if exp["localization"] and final["mode"] == "run" else None
    )
    freq = dict(Counter(final.get("verdicts") or [verdict]))
    expect = expect_of(rec)
    # a verdict the scenario lists under expect.also counts as expected, and marks the
    # scenario timing-dependent (as disagreeing repeats do)
    ok = all(expect.accepts(v) for v in freq)
    rec.update(
        verdict=verdict,
        verdict_ok=ok,
        localization_ok=loc_ok,
        frequencies=freq,
        timing_dependent=len(freq) > 1 or expect.timing_dependent,
        time_to_verdict_s=final["wall_s"],
        overhead_s=final["overhead_s"],
    )


def invalid_record(sid: str, source: str | None, message: str) -> dict[str, Any]:
    return {
        "schema": RECORD_SCHEMA,
        "id": sid,
        "source": source,
        "kernel": "?",
        "fault": None,
        "fault_args": {},
        "params": {},
        "digest": None,
        "repeat": 1,
        "expected": {"verdict": "?", "localization": {}},
        "compile": None,
        "run": None,
        "not_run": None,
        "invalid": message,
        "status": "done",
        "verdict": None,
        "verdict_ok": None,
        "localization_ok": None,
        "caught_statically": None,
        "frequencies": {},
        "timing_dependent": False,
        "time_to_verdict_s": None,
        "overhead_s": None,
        "harness_errors": 0,
    }


# ---- rates ---------------------------------------------------------------------------------
def _rate(hits: int, of: int, what: str) -> dict[str, Any]:
    return {"hits": hits, "of": of, "rate": round(hits / of, 4) if of else None, "what": what}


def rates(records: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in records if r.get("status") == "done" and not r.get("invalid")]
    judged = [r for r in done if r.get("verdict") is not None]
    faulted = [r for r in judged if r.get("fault")]
    clean = [r for r in judged if not r.get("fault")]
    located = [r for r in judged if r["expected"]["localization"]]
    return {
        "detection": _rate(
            sum(V.is_failure(V.Verdict(r["verdict"])) for r in faulted),
            len(faulted),
            "faulted scenarios whose verdict is a failure",
        ),
        "classification": _rate(
            sum(bool(r["verdict_ok"]) for r in judged),
            len(judged),
            "verdict equals the expected one",
        ),
        "localization": _rate(
            sum(r["localization_ok"] is True for r in located),
            len(located),
            "expected localization matched",
        ),
        "false_alarms": _rate(
            sum(r["verdict"] != "PASS" for r in clean),
            len(clean),
            "clean scenarios (no fault) whose verdict is not PASS",
        ),
        "counts": {
            "scenarios": len(records),
            "with_verdict": len(judged),
            "not_run": sum(r.get("not_run") is not None for r in done),
            "invalid": sum(bool(r.get("invalid")) for r in records),
            "pending": sum(r.get("status") != "done" for r in records),
            "not_run_reasons": dict(Counter(r["not_run"] for r in done if r.get("not_run"))),
            "harness_errors": sum(r.get("harness_errors", 0) for r in records),
            "timing_dependent": sum(bool(r.get("timing_dependent")) for r in records),
            # faulted scenarios whose failure only a perturbed schedule showed (--perturb)
            "exposed_by_perturbation": sum(
                ((r.get("run") or {}).get("perturbation") or {}).get("exposed_by") is not None
                for r in faulted
            ),
        },
    }


def build_matrix(
    records: list[dict[str, Any]],
    *,
    dir_: str,
    command: str,
    env: dict[str, Any],
    facts: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "schema": MATRIX_SCHEMA,
        "dir": dir_,
        "command": command,
        "environment": env,
        "rates": rates(records),
        "facts": facts,
        "scenarios": sorted(records, key=lambda r: r["id"]),
    }


def overhead_list(recs: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """Per scenario, wall - work time of its last call (the run, else the compile-only one):
    what the harness costs beyond compiling, running, checking the result, a blind hang's
    first run and the health check after a kill."""
    out = []
    for r in recs:
        call = r.get("run") or r.get("compile") or {}
        if call.get("overhead_s") is not None and call.get("wall_s"):
            out.append((call["overhead_s"], r["id"]))
    return out


def _harness_call(mode: str, exc: BaseException) -> dict[str, Any]:
    tb = "".join(traceback.format_exception(exc))[-1500:]
    return {
        "mode": mode,
        "verdict": "HARNESS_ERROR",
        "reason": f"triage: {tb}",
        "compiled": False,
        "fault_count": None,
        "static_findings": None,
        "localization": {"ok": None},
        "verdicts": ["HARNESS_ERROR"],
        "harness_errors": 1,
        "wall_s": 0.0,
        "compile_s": 0.0,
        "kernel_s": 0.0,
        "overhead_s": 0.0,
        "device": None,
        "report": None,
    }


def needs_bisect(rec: dict[str, Any]) -> bool:
    """A HANG whose expected localization the run could not grade (ok None: only a
    printf-bisection can, e.g. a named-barrier hang), or one its GPU core graded in
    bisection's terms (then the bisection is the cross-check)."""
    return (
        rec.get("verdict") == "HANG"
        and bool(rec["expected"]["localization"])
        and (rec.get("localization_ok") is None or graded_by_core(rec))
        and (rec.get("run") or {}).get("mode") == "run"
    )


def graded_by_core(rec: dict[str, Any]) -> bool:
    """The run's localization came from its GPU core in bisection's terms."""
    return ((rec.get("run") or {}).get("localization") or {}).get("by") == "coredump"


def bisect_record(fut: Future, out_dir: Path) -> dict[str, Any]:
    """What a finished bisection contributes to a record: its status, answer per role and
    grade (status "error" with the traceback when it raised: a bug of ours)."""
    from cutedebug.analyses.bisect_answer import role_answer

    try:
        res, wall_s = fut.result()
    except Exception as e:  # noqa: BLE001
        return {
            "status": "error",
            "ok": None,
            "reason": "".join(traceback.format_exception(e))[-1500:],
        }
    return {
        "status": res.status,
        "ok": res.grade.get("ok"),
        "grade": res.grade,
        "reason": res.reason[:500],
        "answer": {role: role_answer(st, res.by_id) for role, st in res.searches.items()},
        "runs": len(res.runs),
        "timing_bug": [p.site for p in res.timing_bugs],
        "wall_s": round(wall_s, 3),
        "report": _relative(Path(res.run_dir) / "bisect.md", out_dir),
    }


def apply_bisect(rec: dict[str, Any], bis: dict[str, Any]) -> None:
    """Grade the record's localization by its bisection (a failed bisection grades nothing)."""
    rec["bisect"] = bis
    rec["status"] = "done"
    if graded_by_core(rec):  # the core graded it; the bisection cross-checks
        rec["core_vs_bisect"] = {
            "core": rec.get("localization_ok"),
            "bisect": bis.get("ok"),
            "agree": bis["status"] == "localized" and bis.get("ok") == rec.get("localization_ok"),
        }
    elif bis["status"] == "localized":
        rec["localization_ok"] = bis["ok"]
    rec["harness_errors"] = rec.get("harness_errors", 0) + (bis["status"] == "error")
