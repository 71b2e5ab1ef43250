"""`cutedebug triage DIR --out OUT`: every scenario under DIR, graded, as one matrix.

    cutedebug triage scenarios --out reports/triage [--resume] [--repeat N] [--jobs J]
                                                    [--bisect]

Compiles run J at a time on the CPU (compile-only children); GPU runs go one at a time, in
the order their compiles finish. A scenario whose compile already decides its verdict
(COMPILE_ERROR, COMPILER_CRASH, HARNESS_ERROR) is not run. Without a suitable GPU the run is
recorded as "not run: <why>" and left out of every rate, never counted as a miss.

Output, written as results come (each file replaced atomically):

    OUT/results/<scenario>.json   one record per scenario (the source of truth)
    OUT/matrix.json|.md|.html     regenerated from the records after each one
    OUT/runs/                     the run directories (report.md, events, logs, PTX)

With ``--bisect``, a scenario that HANGs where only printf-bisection can say where (its
expected localization is not graded by the run: named barriers, flag spins, early exits) is
then bisected (``cutedebug bisect``, on the GPU queue, the same fork server); the record keeps
the bisection's answer and grades the localization by it (10-20 s per such hang on an H200).

An interrupted triage keeps every finished record; ``--resume`` skips the scenarios whose
record is complete and whose scenario file and kernel source are unchanged (and runs, on a
GPU machine, those a CPU-only triage could not).

Rates (each over the scenarios that have a verdict; "not run" ones are left out):
detection = faulted scenarios whose verdict is a failure (not PASS / UNSUPPORTED /
HARNESS_ERROR); classification = verdict equals the expected one; localization = expected
localization matched (over scenarios that state one); false alarms = clean scenarios (no
fault) whose verdict is not PASS.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import tempfile
import time
import traceback
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from cutedebug.commands import exits
from cutedebug.engine import lifeline, watchdog
from cutedebug.engine import scenario as S
from cutedebug.engine import verdict as V
from cutedebug.engine.health import detect_gpu
from cutedebug.reporting.files import atomic_write
from cutedebug.reporting.matrix import (
    expect_of,
    facts_lines,
    not_as_expected,
    progress_line,
    rate_text,
    state,
    write_matrix,
)

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
        "value_diagnosis": {
            k: (res.evidence.get("value_diagnosis") or {}).get(k)
            for k in ("row", "pattern", "summary", "lines")
        }
        if res.evidence.get("value_diagnosis")
        else None,
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


# ---- the triage run ----------------------------------------------------------------------------
@dataclass
class Options:
    dir: Path
    out: Path
    resume: bool = False
    repeat: int = 1
    jobs: int = 1
    probes: bool | None = None
    runs_dir: Path | None = None
    command: str = ""
    bisect: bool = False
    coredump: bool = False
    gpus: list[str] | None = None  # --gpus: one lane per GPU (None: no binding, one lane)
    shard: tuple[int, int] | None = None
    durations: dict[str, float] | None = None


@dataclass
class _Plan:
    sc: S.Scenario
    rec: dict[str, Any]
    work: list[str] = field(default_factory=list)  # "compile", "run"


def _call(sc: S.Scenario, mode: str, opts: Options, runs_dir: Path, forkserver=None):
    """One run_scenario call in a pool thread: (result, wall seconds)."""
    from cutedebug.engine import runner
    from cutedebug.reporting import report

    core, probes = None, opts.probes
    if opts.coredump and mode == "run":
        from cutedebug.analyses import coredump

        core = coredump.Localizer()
        probes = False if probes is None else probes  # the core localizes every hang
    t0 = time.monotonic()
    res = runner.run_scenario(
        sc,
        runs_root=runs_dir,
        mode=mode,
        probes=probes,
        repeat=1 if mode == "compile" else opts.repeat,
        forkserver=forkserver,
        **({"core": core} if core else {}),
    )
    wall = time.monotonic() - t0
    from cutedebug.analyses import mismatch

    mismatch.attach(res)  # failure-table diagnosis of wrong values (no-op for other verdicts)
    report.write(res, mismatch.report_sections(res))
    return res, wall


def _lane_call(sc: S.Scenario, mode: str, opts: Options, runs_dir: Path, *, lane):
    """_call on a GPU lane (engine/lanes.py): forked from the lane's server, bound to its GPU;
    the evidence says which GPU ran it."""
    res, wall = _call(sc, mode, opts, runs_dir, lane.forkserver)
    if lane.gpu is not None:
        res.evidence["gpu_lane"] = lane.gpu
    return res, wall


def _lane_bisect(sc: S.Scenario, runs_dir: Path, *, lane):
    return _bisect_call(sc, runs_dir, lane.forkserver)


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


def _bisect_call(sc: S.Scenario, runs_dir: Path, forkserver=None):
    """One printf-bisection in the GPU pool thread: (result, wall seconds)."""
    from cutedebug.analyses import bisect
    from cutedebug.reporting import bisect as bisect_report

    t0 = time.monotonic()
    res = bisect.bisect(
        sc, runs_root=runs_dir, server=forkserver, command=f"cutedebug bisect {sc.source}"
    )
    bisect_report.write(res)
    return res, time.monotonic() - t0


def bisect_record(fut: Future, out_dir: Path) -> dict[str, Any]:
    """What a finished bisection contributes to a record: its status, answer per role and
    grade (status "error" with the traceback when it raised: a bug of ours)."""
    from cutedebug.analyses import bisect

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
        "answer": {role: bisect.role_answer(st, res.by_id) for role, st in res.searches.items()},
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


def plan(
    opts: Options, gpu: dict[str, Any], damaged: list[str] | None = None
) -> tuple[list[_Plan], list[dict[str, Any]]]:
    """What each scenario still needs; the records of those that need nothing. Two files
    with one id are bad input (TriageInputError naming both)."""
    results = opts.out / "results"
    old = load_records(results, damaged) if opts.resume else {}
    plans, kept = [], []
    seen: dict[str, str] = {}
    loaded: list[tuple[Path, S.Scenario | S.ScenarioError]] = []
    for path in S.discover(opts.dir):
        try:
            loaded.append((path, S.load(path)))
        except S.ScenarioError as e:
            loaded.append((path, e))
    if opts.shard:
        from cutedebug.commands import shard

        keys = [x.id if isinstance(x, S.Scenario) else str(p) for p, x in loaded]
        mine = shard.select(keys, opts.shard, opts.durations)
        loaded = [(p, x) for (p, x), k in zip(loaded, keys) if k in mine]
    for path, sc in loaded:
        if isinstance(sc, S.ScenarioError):
            kept.append(invalid_record(str(path), str(path), str(sc)))
            continue
        if sc.id in seen:
            raise TriageInputError(
                f"scenario id {sc.id!r} is used by two files: {seen[sc.id]} "
                f"and {path}; ids must be unique"
            )
        seen[sc.id] = str(path)
        digest = scenario_digest(sc)
        prev = old.get(sc.id)
        reuse = (
            prev
            if prev and prev.get("digest") == digest and prev.get("repeat") == opts.repeat
            else None
        )
        can_run = not_run_reason(gpu, sc.archs) is None
        if reuse and reuse["status"] == "done" and not (reuse.get("not_run") and can_run):
            kept.append(reuse)
            continue
        compiled_ok = bool(
            reuse
            and (reuse.get("compile") or {}).get("compiled")
            and reuse["compile"]["verdict"] not in COMPILE_FINAL
        )
        if compiled_ok:
            rec = dict(reuse, status="compiled", run=None)
            plans.append(_Plan(sc, rec, ["run"]))
        else:
            plans.append(_Plan(sc, new_record(sc, digest, opts.repeat), ["compile", "run"]))
    return plans, kept


def triage(opts: Options, *, out=print) -> int:
    """Run the triage; returns the exit status (commands/exits.py: 0 all as expected, 1 not,
    3 harness error, 4 could not run here, 130 interrupted). Raises TriageInputError (exit 2)
    for duplicate ids and an --out that is in use or cannot be written."""
    lock = lock_out(opts.out)
    try:
        return _triage(opts, out)
    finally:
        lock.close()


def _writable(path: Path, what: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-")  # noqa: SIM115
        probe.close()
    except OSError as e:
        raise TriageInputError(f"{what} {path}: cannot write there: {e.strerror}") from None


def _triage(opts: Options, out) -> int:
    t_start = time.monotonic()
    results = opts.out / "results"
    runs_dir = opts.runs_dir or opts.out / "runs"
    _writable(results, "--out")
    _writable(runs_dir, "--runs-dir")
    damaged: list[str] = []
    gpu = detect_gpu()
    env = environment(gpu)
    plans, kept = plan(opts, gpu, damaged)  # before deleting anything: may refuse
    for stale in results.glob(".*.tmp"):
        stale.unlink(missing_ok=True)
    if not opts.resume:
        for old in results.glob("*.json"):
            old.unlink()
    for d in damaged:
        out(f"resume: record {d}: run again")
    records: dict[str, dict[str, Any]] = {r["id"]: r for r in kept}
    for p in plans:
        records[p.sc.id] = p.rec
    total = len(records)

    def save(rec: dict[str, Any], facts: dict[str, Any] | None = None) -> None:
        records[rec["id"]] = rec
        if rec.get("digest") is not None or rec.get("invalid"):
            atomic_write(results / record_name(rec["id"]), json.dumps(rec, indent=1, default=str))
        write_matrix(
            opts.out,
            build_matrix(
                list(records.values()),
                dir_=str(opts.dir),
                command=opts.command,
                env=env,
                facts=facts,
            ),
        )

    finished = 0

    def progress(rec: dict[str, Any]) -> None:
        nonlocal finished
        finished += 1
        comp = rec.get("compile") or {}
        pre = f"compiled {comp['wall_s']:.1f}s; " if rec.get("not_run") and comp else ""
        out(progress_line(rec, finished, total, pre, rec.get("time_to_verdict_s")))
        vd = (rec.get("run") or {}).get("value_diagnosis") or (rec.get("compile") or {}).get(
            "value_diagnosis"
        )
        if vd:
            out(f"      diagnosis: row {vd.get('row')} ({vd.get('pattern')}): {vd.get('summary')}")

    for rec in kept:
        if rec.get("invalid"):
            save(rec)
        progress(rec)

    # Every child of this triage carries the scope's tag: the final sweep finds leftovers.
    scope = lifeline.scope()
    tag = scope.__enter__()
    interrupted = False
    from cutedebug.engine.lanes import Lanes, NoHealthyGpu, processes_by_gpu

    # Workers fork from a process that imported torch and cutlass once (seconds per run):
    # one per GPU lane, bound to its GPU; GPU work goes to whichever lane is free. Compiles
    # fork from the first lane's server (they do not touch the GPU).
    lanes = Lanes(opts.gpus or [None], opts.out)
    fs = lanes.lanes[0].forkserver
    compile_pool = ThreadPoolExecutor(max(1, opts.jobs), thread_name_prefix="compile")
    pending: dict[Future, tuple[str, _Plan]] = {}

    def submit_run(p: _Plan) -> None:
        reason = not_run_reason(gpu, p.sc.archs)
        if reason:
            finalize(p.rec, None, reason)
            save(p.rec)
            progress(p.rec)
            return
        save(p.rec)  # the compile result, kept if the run is interrupted
        pending[lanes.submit(_lane_call, p.sc, "run", opts, runs_dir)] = ("run", p)

    write_matrix(
        opts.out,
        build_matrix(list(records.values()), dir_=str(opts.dir), command=opts.command, env=env),
    )
    try:
        for p in plans:
            if p.work[0] == "compile":
                pending[compile_pool.submit(_call, p.sc, "compile", opts, runs_dir, fs)] = (
                    "compile",
                    p,
                )
            else:
                submit_run(p)
        while pending:
            done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for fut in done:
                mode, p = pending.pop(fut)
                if mode == "bisect":
                    apply_bisect(p.rec, bisect_record(fut, opts.out))
                    save(p.rec)
                    progress(p.rec)
                    continue
                try:
                    res, wall = fut.result()
                    call = call_record(res, wall, opts.out)
                    if "gpu_lane" in res.evidence:
                        call["gpu"] = res.evidence["gpu_lane"]
                except NoHealthyGpu as e:  # every GPU failed its health check
                    finalize(p.rec, None, f"not run: no healthy GPU — {e}")
                    save(p.rec)
                    progress(p.rec)
                    continue
                except S.ScenarioError as e:  # the kernel could not be loaded
                    rec = invalid_record(p.sc.id, p.sc.source, str(e))
                    rec["digest"] = p.rec["digest"]
                    save(rec)
                    progress(rec)
                    continue
                except Exception as e:  # noqa: BLE001  (a bug of ours: HARNESS_ERROR)
                    call = _harness_call(mode, e)
                p.rec[mode] = call
                if mode == "compile":
                    p.rec["status"] = "compiled"
                    if not call["compiled"] or call["verdict"] in COMPILE_FINAL:
                        finalize(p.rec, call, None)
                    else:
                        submit_run(p)
                        continue
                else:
                    if (
                        call["verdict"] == "UNSUPPORTED"
                        and p.rec["expected"]["verdict"] != "UNSUPPORTED"
                    ):
                        finalize(p.rec, None, f"not run: unsupported — {call['reason']}")
                    else:
                        finalize(p.rec, call, None)
                        if opts.bisect and needs_bisect(p.rec):
                            p.rec["status"] = "bisecting"
                            save(p.rec)
                            pending[lanes.submit(_lane_bisect, p.sc, runs_dir)] = ("bisect", p)
                            continue
                save(p.rec)
                progress(p.rec)
    except KeyboardInterrupt as e:
        interrupted = e
        # Kill the running children now (their watchers raise Interrupted in the pool
        # threads): never wait for a hung kernel's own deadline.
        watchdog.abort_all()
        for fut in pending:
            fut.cancel()
        out(
            "triage: interrupted; the running children were killed (finished results are "
            "kept; --resume continues)"
        )
    finally:
        health = None
        try:
            compile_pool.shutdown(wait=True, cancel_futures=True)
            lanes.shutdown(cancel=True)
            if gpu["present"] and not interrupted:
                # forked from each lane's server while it still runs (a fresh interpreter:
                # seconds more); one per GPU, in parallel
                health = lanes.final_health(opts.out)
        finally:
            lanes.close(timeout=1.0 if interrupted else 10.0)
            scope.__exit__(None, None, None)
            watchdog.reset_abort()

    left_by_gpu = (
        processes_by_gpu([p.pid for p in lifeline.processes(tag)]) if len(lanes.lanes) > 1 else None
    )
    left = lifeline.sweep(tag)
    recs = list(records.values())
    overheads = overhead_list(recs)
    facts = {
        "harness_errors": sum(r.get("harness_errors", 0) for r in recs),
        "processes_left": left,
        "gpu_health": health,
        "overhead_s": {
            "n": len(overheads),
            "mean": sum(o for o, _ in overheads) / len(overheads),
            "max": max(overheads)[0],
            "max_id": max(overheads)[1],
        }
        if overheads
        else {"n": 0},
        "total_s": round(time.monotonic() - t_start, 3),
        "interrupted": bool(interrupted),
    }
    if len(lanes.lanes) > 1:
        facts["gpus"] = lanes.summary()
        if left_by_gpu:
            facts["processes_left_by_gpu"] = left_by_gpu
    m = build_matrix(recs, dir_=str(opts.dir), command=opts.command, env=env, facts=facts)
    write_matrix(opts.out, m)
    rt = m["rates"]
    out("")
    for key in ("detection", "classification", "localization", "false_alarms"):
        out(f"{key.replace('_', ' '):>15}: {rate_text(rt[key])}")
    for why, n in rt["counts"]["not_run_reasons"].items():
        out(f"{'not run':>15}: {n} (left out of the rates): {why}")
    for line in facts_lines(facts):
        out(line)
    out(
        f"matrix: {opts.out / 'matrix.md'} | {opts.out / 'matrix.html'} | "
        f"{opts.out / 'matrix.json'}"
    )
    if interrupted:
        return (
            128 + interrupted.signum if hasattr(interrupted, "signum") else exits.EXIT_INTERRUPTED
        )
    return exit_status(recs, left, health)


def exit_status(recs: list[dict[str, Any]], left: list[int], health: dict[str, Any] | None) -> int:
    """3 a harness error (or a process left, or an unhealthy GPU), 1 a scenario not as
    expected, 4 some could not run here, 0 all as expected."""
    codes = [exits.EXIT_OK]
    if (
        left
        or (health is not None and health.get("healthy") is False)
        or any(state(r) == "harness" for r in recs)
    ):
        codes.append(exits.EXIT_HARNESS)
    if any(state(r) != "harness" for r in not_as_expected(recs)):
        codes.append(exits.EXIT_UNEXPECTED)
    if any(state(r) == "notrun" for r in recs):
        codes.append(exits.EXIT_NOT_RUN)
    return exits.worst(*codes)


# ---- command line ------------------------------------------------------------------------------
def default_jobs() -> int:
    return max(1, min(8, (os.cpu_count() or 2) - 1))


def add_parser(sub) -> None:
    t = sub.add_parser("triage", help="run every scenario under DIR and write the matrix")
    t.add_argument("dir", help="directory of scenario files (searched recursively)")
    t.add_argument("--out", required=True, help="output directory (results, matrix, runs)")
    t.add_argument("--resume", action="store_true", help="skip scenarios already done")
    t.add_argument(
        "--repeat",
        type=S.limit_arg("repeat"),
        default=1,
        help="run each scenario N times and report verdict frequencies",
    )
    t.add_argument(
        "--jobs",
        type=S.limit_arg("jobs"),
        default=default_jobs(),
        help="compile-only children at a time (default %(default)s)",
    )
    t.add_argument(
        "--probes",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bounded waits + beacons (default: each scenario's setting)",
    )
    t.add_argument("--runs-dir", help="where run directories go (default OUT/runs)")
    t.add_argument(
        "--bisect",
        action="store_true",
        help="printf-bisect the hangs whose "
        "localization only bisection can grade (named barriers, flag spins, early "
        "exits; 10-20 s each on an H200); with --coredump, a cross-check of the "
        "core's answer",
    )
    t.add_argument(
        "--coredump",
        action="store_true",
        help="probes off (unless --probes): "
        "every hang localized from a GPU coredump taken before the kill (cuda-gdb)",
    )
    t.add_argument(
        "--gpus",
        help="run on these GPUs at once, one queue each with its own fork "
        "server, work going to whichever is free: 'all' or a comma list (0,1) of "
        "CUDA_VISIBLE_DEVICES names (default: the first visible GPU only)",
    )
    t.add_argument(
        "--shard",
        help="I/N: only shard I of N of the scenarios, by scenario id "
        "(`cutedebug merge` joins the shards' outputs)",
    )
    t.add_argument(
        "--durations",
        help="balance --shard by the seconds an earlier triage "
        "recorded (its matrix.json or output folder)",
    )
    t.set_defaults(func=cmd_triage)


def cmd_triage(args: argparse.Namespace) -> int:
    from cutedebug.commands import shard
    from cutedebug.engine import gpus
    from cutedebug.reporting.report import command_line

    try:
        chosen = gpus.parse_gpus(args.gpus, gpus.visible_gpus()) if args.gpus else None
        which = shard.parse_shard(args.shard) if args.shard else None
        if args.durations and not which:
            raise shard.ShardError("--durations needs --shard")
        durations = shard.durations_from(args.durations) if args.durations else None
    except (gpus.GpuSpecError, shard.ShardError) as e:
        raise TriageInputError(str(e)) from None
    opts = Options(
        dir=Path(args.dir),
        out=Path(args.out),
        resume=args.resume,
        repeat=args.repeat,
        jobs=args.jobs,
        probes=args.probes,
        runs_dir=Path(args.runs_dir) if args.runs_dir else None,
        command=command_line(),
        bisect=args.bisect,
        coredump=args.coredump,
        gpus=chosen or None,
        shard=which,
        durations=durations,
    )
    return triage(opts)
