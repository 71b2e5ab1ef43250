"""`cutedebug triage DIR --out OUT`: every scenario under DIR, graded, as one matrix.

    cutedebug triage scenarios --out reports/triage [--resume] [--repeat N] [--jobs J]
                                                    [--bisect] [--no-overlap]

On a GPU, J run workers compile at once; only the one holding the GPU's token launches
(engine/lanes.py; its wait is off the run's clocks, reported as ``gpu_wait_s``). A run whose
compile decides its verdict (COMPILE_ERROR, COMPILER_CRASH, HARNESS_ERROR) never launches. A
scenario that cannot run here (no GPU, another arch) is only compiled (J compile-only children
at a time) and recorded as "not run: <why>", left out of every rate, never counted as a miss.
``--no-overlap``: a compile-only child per scenario first, then the runs one at a time.

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
import json
import os
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutedebug.commands import exits
from cutedebug.commands.triage_records import (  # noqa: F401  (T.<name> for callers)
    COMPILE_FINAL,
    MATRIX_SCHEMA,
    BisectCall,
    CallRecord,
    Environment,
    Expected,
    Facts,
    Rates,
    TriageInputError,
    TriageMatrix,
    TriageRecord,
    _harness_call,
    apply_bisect,
    bisect_record,
    build_matrix,
    call_record,
    environment,
    finalize,
    graded_by_core,
    invalid_record,
    load_records,
    lock_out,
    needs_bisect,
    new_record,
    not_run_reason,
    overhead_summary,
    rates,
    record_name,
    scenario_digest,
)
from cutedebug.engine import lifeline, preloads, watchdog
from cutedebug.engine import scenario as S
from cutedebug.engine import verdict as V
from cutedebug.engine.health import detect_gpu
from cutedebug.reporting.files import atomic_write
from cutedebug.reporting.matrix import (
    RATE_KEYS,
    facts_lines,
    not_as_expected,
    progress_line,
    rate_text,
    state,
    write_matrix,
)


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
    perturb: dict[str, Any] | None = None  # --perturb N: the worker request's perturb field
    overlap: bool = True  # run workers compile at once, one per GPU launches (its token)


@dataclass
class _Plan:
    sc: S.Scenario
    rec: TriageRecord
    work: list[str] = field(default_factory=list)  # "compile", "run"


def _call(sc: S.Scenario, mode: str, opts: Options, runs_dir: Path, forkserver=None, token=None):
    """One run_scenario call in a pool thread: (result, wall seconds)."""
    from cutedebug.analyses import lint
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
        compile_checks=[lint.static_findings],
        **({"core": core} if core else {}),
        **({"perturb": opts.perturb} if opts.perturb and mode == "run" else {}),
        **({"gpu_token": token} if token and mode == "run" else {}),
    )
    wall = time.monotonic() - t0
    from cutedebug.analyses import mismatch
    from cutedebug.commands import perturb_args
    from cutedebug.reporting import mismatch_map, perturbation

    mismatch.attach(res)  # failure-table diagnosis of wrong values (no-op for other verdicts)
    if mode == "run":  # the exact command that replays a perturbed exposure
        perturb_args.attach_replay(res, opts.perturb)
    report.write(res, mismatch_map.report_sections(res) + perturbation.report_sections(res))
    return res, wall


def _lane_call(sc: S.Scenario, mode: str, opts: Options, runs_dir: Path, *, lane):
    """_call on a GPU lane (engine/lanes.py): forked from the lane's server, bound to its GPU;
    the evidence says which GPU ran it."""
    res, wall = _call(sc, mode, opts, runs_dir, lane.forkserver, lane.token)
    if lane.gpu is not None:
        res.evidence["gpu_lane"] = lane.gpu
    return res, wall


def _lane_bisect(sc: S.Scenario, runs_dir: Path, *, lane):
    return _bisect_call(sc, runs_dir, lane.forkserver, lane.token)


def _bisect_call(sc: S.Scenario, runs_dir: Path, forkserver=None, token=None):
    """One printf-bisection in the GPU pool thread: (result, wall seconds)."""
    from cutedebug.analyses import bisect
    from cutedebug.reporting import bisect as bisect_report

    t0 = time.monotonic()
    res = bisect.bisect(
        sc,
        runs_root=runs_dir,
        server=forkserver,
        command=f"cutedebug bisect {sc.source}",
        **({"gpu_token": token} if token else {}),
    )
    bisect_report.write(res)
    return res, time.monotonic() - t0


def plan(
    opts: Options, gpu: dict[str, Any], damaged: list[str] | None = None
) -> tuple[list[_Plan], list[TriageRecord]]:
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
        from cutedebug.engine import shards as shard

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
        reuse = prev if prev and prev.digest == digest and prev.repeat == opts.repeat else None
        can_run = not_run_reason(gpu, sc.archs) is None
        if reuse and reuse.done and not (reuse.not_run and can_run):
            kept.append(reuse)
            continue
        compiled_ok = bool(
            reuse
            and reuse.compile
            and reuse.compile.compiled
            and reuse.compile.verdict not in COMPILE_FINAL
        )
        if compiled_ok:
            # the compile is reused; the run and the grading are redone
            rec = TriageRecord.from_json(reuse.to_json())
            rec.status, rec.run = "compiled", None
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
    records: dict[str, TriageRecord] = {r.id: r for r in kept}
    for p in plans:
        records[p.sc.id] = p.rec
    total = len(records)

    def save(rec: TriageRecord, facts: Facts | None = None) -> None:
        records[rec.id] = rec
        if rec.digest is not None or rec.invalid:
            atomic_write(
                results / record_name(rec.id), json.dumps(rec.to_json(), indent=1, default=str)
            )
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

    def progress(rec: TriageRecord) -> None:
        nonlocal finished
        finished += 1
        comp = rec.compile
        pre = f"compiled {comp.wall_s:.1f}s; " if rec.not_run and comp else ""
        out(progress_line(rec, finished, total, pre, rec.time_to_verdict_s or None))
        vd = (rec.run and rec.run.value_diagnosis) or (rec.compile and rec.compile.value_diagnosis)
        if vd:
            out(f"      diagnosis: row {vd.get('row')} ({vd.get('pattern')}): {vd.get('summary')}")

    for rec in kept:
        if rec.invalid:
            save(rec)
        progress(rec)

    # Every child of this triage carries the scope's tag: the final sweep finds leftovers.
    scope = lifeline.scope()
    tag = scope.__enter__()
    interrupted = False
    from cutedebug.engine.lanes import Lanes, NoHealthyGpu, processes_by_gpu

    # Workers fork from a process that imported torch and cutlass once (seconds per run):
    # one per GPU lane, bound to its GPU; GPU work goes to whichever lane is free. Compiles
    # fork from the first lane's server (they do not touch the GPU). Overlap: J run workers
    # at once (at least 2 per GPU), the one holding its GPU's token launches.
    overlap = opts.overlap and bool(gpu["present"])
    slots = max(2, -(-opts.jobs // len(opts.gpus or [None]))) if overlap else 1
    # the matrix's libraries (FA-4, quack: seconds each) imported once per server, up front
    libraries = preloads.modules_of_scenarios(p.sc for p in plans)
    lanes = Lanes(opts.gpus or [None], opts.out, slots=slots, preload=libraries)
    fs = lanes.lanes[0].forkserver
    for lane in lanes.lanes if libraries else []:
        if said := getattr(lane.forkserver, "preloaded", None):
            out(f"fork server {lane.name}: {preloads.summary(said)}")
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
            # overlapping, a run compiles for itself: no compile-only child first where it runs
            if p.work[0] == "compile" and not (overlap and not not_run_reason(gpu, p.sc.archs)):
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
                        call.gpu = res.evidence["gpu_lane"]
                except NoHealthyGpu as e:  # every GPU failed its health check
                    finalize(p.rec, None, f"not run: no healthy GPU — {e}")
                    save(p.rec)
                    progress(p.rec)
                    continue
                except S.ScenarioError as e:  # the kernel could not be loaded
                    rec = invalid_record(p.sc.id, p.sc.source, str(e))
                    rec.digest = p.rec.digest
                    save(rec)
                    progress(rec)
                    continue
                except Exception as e:  # noqa: BLE001  (a bug of ours: HARNESS_ERROR)
                    call = _harness_call(mode, e)
                setattr(p.rec, mode, call)
                if mode == "compile":
                    p.rec.status = "compiled"
                    if not call.compiled or call.verdict in COMPILE_FINAL:
                        finalize(p.rec, call, None)
                    else:
                        submit_run(p)
                        continue
                else:
                    if (
                        call.verdict is V.Verdict.UNSUPPORTED
                        and p.rec.expected.verdict != V.Verdict.UNSUPPORTED
                    ):
                        finalize(p.rec, None, f"not run: unsupported — {call.reason}")
                    else:
                        finalize(p.rec, call, None)
                        if opts.bisect and needs_bisect(p.rec):
                            p.rec.status = "bisecting"
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
    many = len(lanes.lanes) > 1
    facts = Facts(
        harness_errors=sum(r.harness_errors or 0 for r in recs),
        processes_left=left,
        gpu_health=health,
        overhead_s=overhead_summary(recs),
        total_s=round(time.monotonic() - t_start, 3),
        interrupted=bool(interrupted),
        gpus=lanes.summary() if many else None,
        processes_left_by_gpu=left_by_gpu if many and left_by_gpu else None,
    )
    m = build_matrix(recs, dir_=str(opts.dir), command=opts.command, env=env, facts=facts)
    write_matrix(opts.out, m)
    rt = m.rates
    out("")
    for key in RATE_KEYS:
        out(f"{key.replace('_', ' '):>15}: {rate_text(rt.rate(key))}")
    for why, n in rt.counts.not_run_reasons.items():
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


def exit_status(recs: list[TriageRecord], left: list[int], health: dict[str, Any] | None) -> int:
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
        help="run workers (2+ per GPU) or compile-only children at once (default %(default)s)",
    )
    t.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run workers compile at once while one per GPU launches (default); "
        "--no-overlap: a compile-only child per scenario first, then the runs one at a time",
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
        "every hang localized from the GPU state before the kill (cuda-gdb attached to the "
        "worker; the driver's core with CUTEDEBUG_COREDUMP_READ=dump)",
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
    from cutedebug.commands import perturb_args  # --perturb N: the "exposed by" column

    perturb_args.add_arguments(t)
    t.set_defaults(func=cmd_triage)


def cmd_triage(args: argparse.Namespace) -> int:
    from cutedebug.engine import gpus
    from cutedebug.engine import shards as shard
    from cutedebug.reporting.report import command_line

    try:
        chosen = gpus.parse_gpus(args.gpus, gpus.visible_gpus()) if args.gpus else None
        which = shard.parse_shard(args.shard) if args.shard else None
        if args.durations and not which:
            raise shard.ShardError("--durations needs --shard")
        durations = shard.durations_from(args.durations) if args.durations else None
    except (gpus.GpuSpecError, shard.ShardError) as e:
        raise TriageInputError(str(e)) from None
    from cutedebug.commands import perturb_args

    opts = Options(
        perturb=perturb_args.request_field(args),
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
        overlap=args.overlap,
    )
    return triage(opts)
