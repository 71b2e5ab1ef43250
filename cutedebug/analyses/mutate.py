"""Mutation testing of a command's own checks (`cutedebug mutate`): which mutants apply, running
one, what it says, the score.

The clean run's recorder lists, per trace (the function name and occurrence of a top-level
``cute.compile`` / ``@cute.jit`` trace in its process), the pipelines in create() order (what a
fault's ``pipeline=`` selects), the ops traced on each and the kernel-wide syncs. ``plan`` makes
one mutant per applicable fault x pipeline x role (x trace); ``run_mutant`` runs the command
with that one fault in that one trace; ``status_of`` says CAUGHT (HANG / CRASH / FAIL),
SURVIVED (the command passed although the fault changed a traced call), NOT_APPLIED (nothing
changed: not scored) or HARNESS_ERROR (ours: not scored).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cutedebug.analyses.mutate_record import (
    MATRIX_SCHEMA,
    CleanReport,
    CleanRun,
    FaultSite,
    MutantRecord,
    MutationMatrix,
    RunFacts,
    Score,
    Trace,
)
from cutedebug.engine import command as X
from cutedebug.engine import verdict as V
from cutedebug.instrument.launch_gpu import release_gpu_token
from cutedebug.instrument.launch_record import PipelineEntry
from cutedebug.instrument.pytest_only import ONLY_TEST_ENV, ONLY_TEST_PLUGIN

CAUGHT, SURVIVED, NOT_APPLIED, HARNESS = "CAUGHT", "SURVIVED", "NOT_APPLIED", "HARNESS_ERROR"
CAUGHT_BY = ("HANG", "CRASH", "FAIL")
KERNEL_WIDE = "kernel-wide"
TMA_CLASSES = ("PipelineTmaAsync", "PipelineTmaUmma", "PipelineTmaMultiConsumersAsync")


@dataclass(frozen=True)
class Mutant:
    id: str
    fault: str
    args: dict[str, Any]
    trace: dict[str, Any]  # {"function", "occurrence"}: the one trace the fault applies in
    target: str  # "t0.p1" (trace 0, pipeline 1) or "t0.kernel-wide"
    variant: str  # the column: fault kind, role / barrier, delta (also a folder name)
    why: str  # what made it applicable

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "fault": self.fault,
            "args": self.args,
            "trace": self.trace,
            "target": self.target,
            "variant": self.variant,
            "why": self.why,
        }


# ---- which mutants apply -----------------------------------------------------------------------
def _pipeline_mutants(p: PipelineEntry) -> list[tuple[str, dict[str, Any], str, str]]:
    """(fault, args, variant, why) for one recorded pipeline."""
    ops, cls, i = p.ops, p.class_, p.index
    out = []
    if ops.get("producer_acquire") and (cls in TMA_CLASSES or "Tma" in cls):
        out.append(
            (
                "wrong_expect_tx",
                {"delta_bytes": 16},
                "wrong_expect_tx+16",
                f"{cls} is a TMA pipeline with producer_acquire",
            )
        )
    for role, op in (("consumer", "consumer_wait"), ("producer", "producer_acquire")):
        if ops.get(op):
            out.append(
                ("missing_phase_flip", {"role": role}, f"missing_phase_flip.{role}", f"{op} traced")
            )
    if ops.get("producer_tail"):
        out.append(("skip_producer_tail", {}, "skip_producer_tail", "producer_tail traced"))
    if ops.get("consumer_release"):
        out.append(
            ("skip_consumer_release", {}, "skip_consumer_release", "consumer_release traced")
        )
        out.append(
            ("extra_consumer_release", {}, "extra_consumer_release", "consumer_release traced")
        )
    if ops.get("consumer_wait"):
        out.append(("skip_consumer_wait", {}, "skip_consumer_wait", "consumer_wait traced"))
    if ops.get("consumer_release") and ops.get("consumer_wait"):
        out.append(
            (
                "release_before_read",
                {},
                "release_before_read",
                "consumer_wait and consumer_release traced",
            )
        )
    for barrier in ("empty", "full"):
        out.append(
            (
                "wrong_arrive_count",
                {"delta": 1, "barrier": barrier},
                f"wrong_arrive_count.{barrier}+1",
                "barriers initialized by create()",
            )
        )
    for role, op in (("consumer", "consumer_release"), ("producer", "producer_commit")):
        if ops.get(op):
            out.append(("early_exit", {"role": role}, f"early_exit.{role}", f"{op} traced"))
    out = [(f, {**a, "pipeline": i}, v, w) for f, a, v, w in out]
    if cls == "PipelineTmaUmma" and ops.get("producer_acquire"):  # no pipeline argument
        out.append(
            (
                "expect_tx_no_2cta_doubling",
                {},
                "expect_tx_no_2cta_doubling",
                "PipelineTmaUmma traced (changes 2-CTA kernels only)",
            )
        )
    return out


def _kernel_wide_mutants(
    arch: dict[str, int], any_pipeline: bool
) -> list[tuple[str, dict[str, Any], str, str]]:
    out = []
    if arch.get("mbarrier_init_fence") or any_pipeline:
        out.append(
            ("missing_init_fence", {"drop": "both"}, "missing_init_fence", "mbarrier init traced")
        )
    if arch.get("sync_threads") or arch.get("barrier"):
        out.append(
            (
                "drop_sync",
                {"which": -1, "sync": "cta"},
                "drop_sync.cta",
                f"{arch.get('sync_threads', 0)} sync_threads, {arch.get('barrier', 0)} "
                "named barrier call(s) outside pipeline init",
            )
        )
    if arch.get("sync_warp"):
        out.append(
            (
                "drop_sync",
                {"which": -1, "sync": "warp"},
                "drop_sync.warp",
                f"{arch['sync_warp']} sync_warp call(s)",
            )
        )
    if arch.get("barrier") or arch.get("barrier_arrive"):
        out.append(
            (
                "wrong_barrier_threads",
                {"delta": 32},
                "wrong_barrier_threads+32",
                "named barriers traced",
            )
        )
    # what cta_scope_sync patches: a cluster_arrive (a relaxed one has no release to demote:
    # planning on it gave NOT_APPLIED on quack's cluster kernels, the H200's mutate run)
    if arch.get("cluster_arrive") or arch.get("fence_acq_rel_cluster"):
        out.append(
            ("cta_scope_sync", {"what": "all"}, "cta_scope_sync", "cluster synchronization traced")
        )
    return out


def recorded(clean: CleanReport) -> list[Trace]:
    """The traces of the clean run, each with what the recorder saw: its pipelines (numbered
    from 0 in the trace, as a fault's ``pipeline`` argument counts them), their ops and the
    kernel-wide syncs. A trace is its function name and occurrence (the n-th trace of that
    function in its process); the same trace in several processes (pytest-xdist) counts once."""
    out: list[Trace] = []
    seen = set()
    for p in clean.processes:
        for tr in p.traces:
            # under pytest a trace is its test item's n-th trace of the function (the same in
            # every process, whichever tests ran before it), else the process's n-th
            key = (
                (tr.function, tr.test, tr.test_occurrence or 0)
                if tr.test is not None
                else (tr.function, tr.occurrence or 0)
            )
            if key in seen or tr.protocol is None or tr.error:
                continue
            seen.add(key)
            proto = tr.protocol
            out.append(
                Trace(
                    t=len(out),
                    function=tr.function,
                    occurrence=tr.occurrence or 0,
                    **(
                        {"test": tr.test, "test_occurrence": tr.test_occurrence or 0}
                        if tr.test is not None
                        else {}
                    ),
                    kernels=tr.kernels or [],
                    kernel=", ".join(proto.kernel_names) or None,
                    pipelines=proto.pipelines,
                    arch_ops=proto.arch_ops,
                    pid=p.pid,
                )
            )
    return out


def plan(
    traces: list[Trace],
    faults_wanted: list[str] | None,
    pipelines_wanted: list[int] | None,
) -> list[Mutant]:
    out: list[Mutant] = []
    for tr in traces:
        trace = {"function": tr.function, "occurrence": tr.occurrence}
        if isinstance(tr.test, str):
            trace.update(test=tr.test, test_occurrence=tr.test_occurrence)
        t = f"t{tr.t}"
        for p in tr.pipelines:
            if pipelines_wanted is not None and p.index not in pipelines_wanted:
                continue
            target = f"{t}.p{p.index}"
            for fault, args, variant, why in _pipeline_mutants(p):
                out.append(Mutant(f"{target}.{variant}", fault, args, trace, target, variant, why))
        target = f"{t}.{KERNEL_WIDE}"
        for fault, args, variant, why in _kernel_wide_mutants(tr.arch_ops, bool(tr.pipelines)):
            out.append(Mutant(f"{target}.{variant}", fault, args, trace, target, variant, why))
    from cutedebug.instrument.faults import FAULTS

    out = [m for m in out if m.fault in FAULTS]  # a registry without one of them: left out
    if faults_wanted is not None:
        out = [m for m in out if m.fault in faults_wanted]
    return out


def _kernel_of(tr: Trace) -> str:
    if tr.kernel:
        return tr.kernel
    k = (tr.kernels or ["?"])[0]
    return k if len(k) <= 60 else k[:57] + "..."


def targets(traces: list[Trace]) -> dict[str, str]:
    """Target id -> label: each pipeline of each trace, then the trace's kernel-wide row."""
    out = {}
    for tr in traces:
        t = f"t{tr.t}"
        for p in tr.pipelines:
            out[f"{t}.p{p.index}"] = (
                f"{t}.p{p.index}: {p.class_} @{os.path.basename(p.file or '?')}:"
                f"{p.line} in {p.kernel or _kernel_of(tr)}"
            )
        out[f"{t}.{KERNEL_WIDE}"] = f"{t}: kernel-wide in {_kernel_of(tr)}"
    return out


# ---- running -----------------------------------------------------------------------------------
def status_of(res: X.ExecResult) -> str:
    if res.verdict is V.Verdict.HARNESS_ERROR:
        return HARNESS
    if not res.fault_count:
        return NOT_APPLIED
    if res.verdict.value in CAUGHT_BY:
        return CAUGHT
    if res.verdict is V.Verdict.PASS:
        return SURVIVED
    return HARNESS  # a verdict exec does not give: ours to explain


def mutant_record(m: Mutant, res: X.ExecResult, out: Path) -> MutantRecord:
    from cutedebug.instrument import faults

    sites = []
    for p in res.processes.values():
        for s in p.get("fault_sites") or []:
            sites.append(
                FaultSite(
                    **{k: s.get(k) for k in ("kernel", "file", "line", "function", "op", "detail")},
                    pid=p["pid"],
                )
            )
    expected, note = faults.expected_verdict(m.fault, m.args)
    status = status_of(res)
    reason = res.reason.splitlines()[0] if res.reason else ""
    if status == NOT_APPLIED:
        looked = [
            t.get("fault_not_applied")
            for p in res.processes.values()
            for t in p["traces"]
            if t.get("fault_not_applied")
        ]
        traced = [
            t
            for p in res.processes.values()
            for t in p["traces"]
            if t.get("function") == m.trace.get("function")
        ]
        reason = (
            looked[0]
            if looked
            else f"trace {m.target.split('.')[0]} ({m.trace.get('function', '')[:60]}, "
            f"occurrence {m.trace.get('occurrence')}) was "
            + (
                "traced, but the fault changed nothing"
                if traced
                else "not traced in this run: the command traced in another order"
            )
        )
    return MutantRecord(
        **m.to_json(),
        status=status,
        verdict=res.verdict.value,
        reason=reason,
        where=X.where(res),
        fault_count=res.fault_count or 0,
        sites=sites[:20],
        changes=faults.FAULTS[m.fault].description,
        registry_expects=expected,
        registry_note=note,
        elapsed_s=res.elapsed_s,
        gpu_wait_s=res.gpu_wait_s,
        killed_by=res.killed_by,
        used_gpu=X.used_gpu(res),
        left_pids=list(res.left),
        swept_pids=list(res.swept),
        report=os.path.relpath(res.run_dir / "report.md", out),
    )


def only_test_env(test: str, env: dict[str, str]) -> dict[str, str]:
    """The variables that make a pytest command run only ``test`` (the item that traced the
    mutant's kernel): the selection plugin added to the plugins the environment names."""
    plugins = [p for p in env.get("PYTEST_PLUGINS", "").split(",") if p.strip()]
    plugins.append(ONLY_TEST_PLUGIN)
    return {"PYTEST_PLUGINS": ",".join(plugins), ONLY_TEST_ENV: test}


def _folder(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:120]


def _watch(s: X.Settings, run_dir: Path, only_test: str | None) -> X.ExecResult:
    """One run of the command for mutate (a mutant, or a test item alone), in ``run_dir``:
    its own DSL dump folder (the DSL names its dump files (KeepPTX, ...) after the traced
    function: runs at once must not read each other's), under pytest only ``only_test``, and
    the GPU token given back once it and everything it started are gone."""
    s.extra_env = {**s.extra_env, "CUTE_DSL_DUMP_DIR": str(run_dir / "dsl_dump")}
    if only_test is not None:
        s.extra_env.update(only_test_env(only_test, {**os.environ, **s.extra_env}))
    (run_dir / "dsl_dump").mkdir(parents=True, exist_ok=True)
    res = X.watch_command(s, run_dir)
    if s.gpu_token:
        release_gpu_token(Path(s.gpu_token), res.tag)
    return res


def _mutant_dir(out: Path, m: Mutant) -> Path:
    return out / "mutants" / m.id.replace("/", "_")


def run_alone(
    test: str, clean: X.Settings, deadline_s: float, out: Path
) -> tuple[str, X.ExecResult]:
    """One test item of the command alone, without a fault: whether it passes by itself (else
    its mutants run the whole command: a FAIL could be the missing earlier items' doing) and
    its seconds, the baseline of its mutants' times."""
    s = X.Settings(
        **{
            **vars(clean),
            "fault": None,
            "fault_args": {},
            "record": False,
            "deadline_s": deadline_s,
        }
    )
    return test, _watch(s, out / "alone" / _folder(test), test)


def run_mutant(
    m: Mutant, clean: X.Settings, deadline_s: float, out: Path, *, only_test: str | None = None
) -> tuple[MutantRecord, X.ExecResult]:
    """The command with this mutant's fault in its trace; its record and the run (whose report
    the caller writes). ``only_test``: under pytest, the one test item to run (the one that
    traced the kernel: the others cannot catch a fault in a kernel they do not trace)."""
    s = X.Settings(
        **{
            **vars(clean),
            "fault": m.fault,
            "fault_args": m.args,
            "record": False,
            "deadline_s": deadline_s,
            "fault_trace": m.trace,
        }
    )
    res = _watch(s, _mutant_dir(out, m), only_test)
    record = mutant_record(m, res, out)
    if only_test is not None:
        record = replace(record, only_test=only_test)
    return record, res


def harness_record(m: Mutant, tb: str, out: Path, elapsed_s: float) -> MutantRecord:
    """The record of a mutant that a bug of ours stopped before it had one (the traceback in
    its run folder): HARNESS_ERROR, left out of the score."""
    from cutedebug.instrument import faults

    run_dir = _mutant_dir(out, m)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "harness_error.txt").write_text(tb)
    expected, note = faults.expected_verdict(m.fault, m.args)
    return MutantRecord(
        **m.to_json(),
        status=HARNESS,
        verdict=V.Verdict.HARNESS_ERROR.value,
        reason="cutedebug failed running this mutant (a bug of ours, not the program's): "
        + tb.strip().splitlines()[-1][:300],
        where="",
        fault_count=0,
        sites=[],
        changes=faults.FAULTS[m.fault].description,
        registry_expects=expected,
        registry_note=note,
        elapsed_s=round(elapsed_s, 3),
        swept_pids=[],
        report=os.path.relpath(run_dir / "harness_error.txt", out),
    )


def load_results(path: Path) -> dict[str, MutantRecord]:
    """The mutants OUT/results.jsonl holds (earlier versions' records included), by id."""
    done: dict[str, MutantRecord] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                r = MutantRecord.from_json(json.loads(line))
            except ValueError:
                continue  # a line cut by a kill (or not a mutant record): that mutant runs again
            done[r.id] = r
    return done


def load_clean(path: Path) -> CleanReport:
    """OUT/clean.json (earlier versions' included); RecordError names a field that does not
    fit."""
    return CleanReport.from_json(json.loads(path.read_text()))


def clean_text(clean: CleanReport) -> str:
    """OUT/clean.json's text."""
    return json.dumps(clean.to_json(), indent=1, default=str)


def result_line(r: MutantRecord) -> str:
    """The mutant's line in OUT/results.jsonl."""
    return json.dumps(r.to_json(), default=str)


# ---- matrix --------------------------------------------------------------------------------------
def score(results: list[MutantRecord]) -> Score:
    n = {k: sum(r.status == k for r in results) for k in (CAUGHT, SURVIVED, NOT_APPLIED, HARNESS)}
    scored = n[CAUGHT] + n[SURVIVED]
    by = {v: sum(r.status == CAUGHT and r.verdict == v for r in results) for v in CAUGHT_BY}
    return Score(
        counts=n,
        caught_by=by,
        score=round(n[CAUGHT] / scored, 4) if scored else None,
        scored=scored,
        mutants=len(results),
    )


def build_matrix(
    clean: CleanReport,
    traces: list[Trace],
    results: list[MutantRecord],
    planned: list[Mutant],
    command: str,
) -> MutationMatrix:
    order = {m.id: i for i, m in enumerate(planned)}
    results = sorted(results, key=lambda r: order.get(r.id, len(order)))
    return MutationMatrix(
        schema=MATRIX_SCHEMA,
        command=command,
        argv=clean.argv,
        date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        clean=CleanRun(
            verdict=clean.verdict.value,
            reason=clean.reason,
            elapsed_s=clean.elapsed_s,
            run_dir=clean.run_dir,
            kernels_traced=clean.kernels_traced,
        ),
        targets=targets(traces),
        traces=traces,
        score=score(results),
        planned=len(planned),
        mutants=results,
    )


def run_facts(
    clean: CleanReport,
    results: list[MutantRecord],
    wall_s: float,
    alone_s: dict[str, float | None] | None = None,
    alone_wait_s: dict[str, float] | None = None,
) -> RunFacts:
    """Leftover processes, GPU health after the kills, each mutant's time against the clean
    run of what it ran (interpreter start + compile + run; a mutant may take 2 s more): its one
    test item alone (``alone_s``) or the whole command."""
    from cutedebug.engine import runner

    killed_gpu = [r for r in results if r.killed_by and r.used_gpu]

    def limit(r: MutantRecord) -> float:
        alone = (alone_s or {}).get(r.only_test) if isinstance(r.only_test, str) else None
        return (alone if alone is not None else clean.elapsed_s) + 2.0

    # A mutant's own time: what it spent waiting for the GPU token is the others'.
    own = {r.id: round(r.elapsed_s - r.gpu_wait_s, 3) for r in results}
    over = [r.id for r in results if own[r.id] > limit(r)]
    own_s = sorted(own.values())
    summary = (
        {
            "median": own_s[len(own_s) // 2],
            "max": own_s[-1],
            "wall_per_mutant": round(wall_s / len(own_s), 3),
        }
        if own_s
        else None
    )
    return RunFacts(
        clean_s=clean.elapsed_s,
        wall_s=round(wall_s, 1),
        max_mutant_s=max((r.elapsed_s for r in results), default=None),
        over_clean_plus_2s=over,
        processes_left=sorted({p for r in results for p in r.left_pids}),
        gpu_health=runner.health_check() if killed_gpu else None,
        killed_on_gpu=len(killed_gpu),
        **({"alone_s": alone_s} if alone_s is not None else {}),
        **({"alone_wait_s": alone_wait_s} if alone_wait_s else {}),
        **({"mutant_own_s": summary} if summary else {}),
    )
