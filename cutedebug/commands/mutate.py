"""`cutedebug mutate -- CMD`: how many injected pipeline faults does a program's own check catch?

    cutedebug mutate --out OUT [--faults F,...] [--pipelines 0,2] [--resume] -- python -m pytest t.py

1. CMD runs once clean, under `exec`'s watchdog with the recorder and the probes on; it must
   PASS. The recorder lists the pipelines the traced kernels create, numbered in create() order
   as the faults' ``pipeline`` argument numbers them, the ops traced on each, and the
   kernel-wide synchronization calls.
2. One mutant per applicable (fault kind x pipeline x role): CMD again with that one fault in
   every kernel it traces. A mutant is CAUGHT when the command HANGs, CRASHes or FAILs its own
   check, SURVIVED when it passes although the fault changed at least one traced call, and
   NOT_APPLIED when no traced call matched (nothing changed; left out of the score). A
   HARNESS_ERROR is ours, never the program's, and is left out of the score too.
3. OUT/results.jsonl holds one record per finished mutant (``--resume`` skips those), and
   OUT/matrix.json|.md|.html the matrix (target x fault), the score caught / (caught +
   survived) and each survivor with its site (file:line) and what the fault changes there.

``--jobs`` mutants run at once: they import and compile in parallel, and when the command uses
the GPU a token file (OUT/gpu.token, taken before a process's first kernel launch and released
when its mutant ended) lets one mutant at a time run kernels; the time spent waiting for it is
off the deadline clock and reported apart.
At the end: processes of ours left (none, or exit status 1), a GPU health check when a mutant
was killed on a GPU, and each mutant's time against the clean run's.
Exit status: 0 the clean run passed, no mutant met a harness error, nothing was left behind, the
GPU is healthy (and the score reached ``--min-score`` when given); 1 otherwise; 2 usage error.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Any

from cutedebug.analyses import mutate as M
from cutedebug.analyses.mutate import CAUGHT, HARNESS
from cutedebug.commands import exec as X
from cutedebug.engine.command import CANCEL
from cutedebug.engine.limits import limit_arg
from cutedebug.engine.verdict import Verdict
from cutedebug.reporting.mutation_matrix import _score_text, facts_lines, survivors, write_matrix


# ---- command line --------------------------------------------------------------------------------
def run_and_report(
    m: M.Mutant, clean: X.Settings, deadline_s: float, out: Path, only_test: str | None = None
) -> M.MutantRecord:
    """One mutant: run it, write its report.md / report.json, return its record. A bug of
    ours on the way is this mutant's HARNESS_ERROR (traceback kept beside its run), never the
    end of the others."""
    t0 = time.monotonic()
    try:
        record, res = M.run_mutant(m, clean, deadline_s, out, only_test=only_test)
    except Exception:
        return M.harness_record(m, traceback.format_exc(), out, time.monotonic() - t0)
    try:
        X.write_report(res, "PASS")
    except Exception:
        tb = traceback.format_exc()
        (res.run_dir / "harness_error.txt").write_text(tb)
        last = tb.strip().splitlines()[-1]
        return replace(
            record,
            status=HARNESS,
            reason=f"cutedebug could not write this mutant's report (a bug of ours; the "
            f"command said {record.verdict}): {last[:300]}",
        )
    return record


def _list_arg(text: str | None, what: str, convert=str) -> list | None:
    if text is None:
        return None
    try:
        return [convert(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise X.UsageError(f"{what} {text!r}: {e}") from e


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "mutate",
        help="score how many injected faults a command's checks catch",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--out", required=True, help="output directory (results, matrix, runs)")
    p.add_argument(
        "--faults", help="comma-separated fault kinds to try (default: every applicable one)"
    )
    p.add_argument("--pipelines", help="comma-separated pipeline numbers (create() order)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the clean run and the mutants already in OUT/results.jsonl",
    )
    p.add_argument(
        "--jobs",
        type=limit_arg("jobs"),
        default=max(1, min(4, (os.cpu_count() or 2) // 4)),
        help="mutants at once (default %(default)s); with a GPU they compile at once and run "
        "their kernels one at a time",
    )
    p.add_argument(
        "--all-tests",
        action="store_true",
        help="under pytest, run the whole command for each mutant (default: only the test "
        "item that traced the mutant's kernel, as the clean run recorded it)",
    )
    p.add_argument(
        "--min-score", type=limit_arg("min_score"), help="exit 1 below this mutation score (0-1)"
    )
    X.add_common(p, mutate=True)
    p.set_defaults(func=cmd_mutate)


def cmd_mutate(args: argparse.Namespace) -> int:
    from cutedebug.instrument import faults
    from cutedebug.reporting.report import command_line

    try:
        argv = list(args.cmd)[1:] if list(args.cmd)[:1] == ["--"] else list(args.cmd)
        if not argv:
            raise X.UsageError("no command given: cutedebug mutate --out OUT -- CMD ARGS...")
        wanted = _list_arg(args.faults, "--faults")
        for f in wanted or []:
            if f not in faults.FAULTS or faults.FAULTS[f].kind != "patch":
                raise X.UsageError(
                    f"--faults: {f!r} is not a patch fault; allowed: "
                    f"{sorted(n for n, x in faults.FAULTS.items() if x.kind == 'patch')}"
                )
        pipes = _list_arg(args.pipelines, "--pipelines", int)
        if args.jobs < 1:
            raise X.UsageError(f"--jobs {args.jobs}: must be >= 1")
    except X.UsageError as e:
        print(f"cutedebug: error: {e}", file=sys.stderr)
        return X.EXIT_USAGE
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    CANCEL.clear()
    command = command_line()
    budget = args.wait_budget_ms
    probes = None if args.probes is False else X.probe_config(budget)
    clean_s = X.Settings(
        argv=argv,
        probes=probes,
        record=True,
        cwd=os.getcwd(),
        deadline_s=args.deadline or X.DEFAULT_DEADLINE_S,
        stall_s=args.stall,
    )

    clean_path = out / "clean.json"
    try:
        clean = M.load_clean(clean_path) if args.resume and clean_path.exists() else None
    except ValueError as e:  # RecordError: names the field
        print(f"cutedebug: error: --resume: {clean_path}: {e}", file=sys.stderr)
        return X.EXIT_USAGE
    if clean is not None and clean.argv != argv:
        print(
            f"cutedebug: error: --resume: {clean_path} is for `{shlex.join(clean.argv)}`",
            file=sys.stderr,
        )
        return X.EXIT_USAGE
    if clean is None:
        print(f"clean run: {shlex.join(argv)}", flush=True)
        res = X.watch_command(clean_s, out / "clean")
        X.write_report(res, "PASS", command)
        clean = M.CleanReport.of(X.exec_report(res, "PASS", command), X.used_gpu(res))
        (out / "results.jsonl").unlink(missing_ok=True)
        clean_path.write_text(M.clean_text(clean))
    print(
        f"clean run: {clean.verdict.value} in {clean.elapsed_s} s — {clean.reason[:200]}",
        flush=True,
    )
    traces = M.recorded(clean)
    planned = M.plan(traces, wanted, pipes) if clean.verdict is Verdict.PASS else []
    results_path = out / "results.jsonl"
    done = M.load_results(results_path) if args.resume else {}
    if clean.verdict is not Verdict.PASS:
        print(
            "the command does not pass without faults: nothing to score "
            f"(report: {clean.run_dir}/report.md)"
        )
        write_matrix(out, M.build_matrix(clean, traces, [], [], command))
        return X.EXIT_MISMATCH
    n_pipes = max((len(tr.pipelines) for tr in traces), default=0)
    if pipes is not None and (bad := [i for i in pipes if i >= n_pipes]):
        print(
            f"cutedebug: error: --pipelines {bad}: no trace of the clean run created that "
            f"many pipelines (at most {n_pipes})",
            file=sys.stderr,
        )
        return X.EXIT_USAGE
    labels = M.targets(traces)
    for tr in traces:
        print(f"  trace t{tr.t}: {M._kernel_of(tr)}, {len(tr.pipelines)} pipeline(s)")
        for p in tr.pipelines:
            label = labels[f"t{tr.t}.p{p.index}"]
            print(f"    {label} ops {p.ops}")
    deadline = args.deadline or max(30.0, 2 * clean.elapsed_s + 10.0)
    todo = [m for m in planned if m.id not in done]
    jobs = args.jobs
    token = out / "gpu.token"
    token.unlink(missing_ok=True)  # a token left by a killed mutate run
    print(
        f"{len(planned)} mutant(s), {len(planned) - len(todo)} already done; "
        f"{jobs} at a time; deadline {deadline:g} s each",
        flush=True,
    )
    results = [done[m.id] for m in planned if m.id in done]
    t0 = time.monotonic()

    def finished(r: M.MutantRecord) -> None:
        results.append(r)
        with open(results_path, "a") as f:
            f.write(M.result_line(r) + "\n")
        write_matrix(out, M.build_matrix(clean, traces, results, planned, command))
        print(
            f"[{len(results):>3}/{len(planned)}] {r.id}: {r.status}"
            + (f" ({r.verdict})" if r.status == CAUGHT else "")
            + f" in {r.elapsed_s} s — {(r.where or r.reason)[:120]}",
            flush=True,
        )

    # Mutants compile at once; the GPU token lets one of them at a time run kernels.
    gpu_token = str(token) if clean.used_gpu and jobs > 1 else None
    clean_run = X.Settings(**{**vars(clean_s), "record": False, "gpu_token": gpu_token})
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        # Under pytest each test item that traced a kernel runs alone first, without a fault:
        # its mutants run only that item when it passes alone (their times against its time)
        tests = (
            [] if args.all_tests else sorted({m.trace["test"] for m in todo if m.trace.get("test")})
        )
        alone_s: dict[str, float | None] | None = {} if tests else None
        alone_wait: dict[str, float] = {}
        for fut in as_completed(
            [pool.submit(M.run_alone, t, clean_run, deadline, out) for t in tests]
        ):
            test, res = fut.result()
            ok = res.verdict.value == "PASS"
            # its own time, as a mutant's is counted: the items alone run side by side and
            # take the GPU token in turn, and that wait is the others' time
            alone_s[test] = round(res.elapsed_s - res.gpu_wait_s, 3) if ok else None
            alone_wait[test] = res.gpu_wait_s
            print(
                f"alone: {test}: {res.verdict.value} in {res.elapsed_s} s"
                + (f" ({res.gpu_wait_s} s of it waiting for the GPU)" if res.gpu_wait_s else "")
                + ("" if ok else " — its mutants run the whole command"),
                flush=True,
            )

        def only(m: M.Mutant) -> str | None:
            test = m.trace.get("test")
            return test if alone_s and alone_s.get(test) is not None else None

        futures = [pool.submit(run_and_report, m, clean_run, deadline, out, only(m)) for m in todo]
        for fut in as_completed(futures):
            finished(fut.result())
    except BaseException:
        # Ctrl-C / SIGTERM reach this thread only: the mutants under way are killed by their
        # own watchdogs (at their next poll), those not started never start, and none of them
        # is recorded (``--resume`` runs them again)
        CANCEL.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)
    m = replace(
        M.build_matrix(clean, traces, results, planned, command),
        facts=M.run_facts(clean, results, time.monotonic() - t0, alone_s, alone_wait),
    )
    write_matrix(out, m)
    print(_score_text(m.score) + f" ({time.monotonic() - t0:.1f} s)")
    for line in facts_lines(m.facts):
        print(f"  {line}")
    for s in survivors(m):
        print(f"  survivor: {s}")
    print(f"matrix: {out / 'matrix.md'} | {out / 'matrix.html'} | {out / 'matrix.json'}")
    health = m.facts.gpu_health
    bad = m.facts.processes_left or (health is not None and not health.get("healthy"))
    bad = (
        bad
        or m.score.counts[HARNESS] > 0
        or (args.min_score is not None and (m.score.score or 0.0) < args.min_score)
    )
    return X.EXIT_MISMATCH if bad else X.EXIT_OK
