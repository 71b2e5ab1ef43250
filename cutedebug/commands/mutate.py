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
import html
import json
import os
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutedebug.commands import exec as X
from cutedebug.engine import verdict as V

MATRIX_SCHEMA = 1
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
def _pipeline_mutants(p: dict[str, Any]) -> list[tuple[str, dict[str, Any], str, str]]:
    """(fault, args, variant, why) for one recorded pipeline."""
    ops, cls, i = p.get("ops") or {}, p.get("class", ""), p["index"]
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
    if (
        arch.get("cluster_arrive")
        or arch.get("cluster_arrive_relaxed")
        or arch.get("fence_acq_rel_cluster")
    ):
        out.append(
            ("cta_scope_sync", {"what": "all"}, "cta_scope_sync", "cluster synchronization traced")
        )
    return out


def recorded(clean: dict[str, Any]) -> list[dict[str, Any]]:
    """The traces of the clean run, each with what the recorder saw: its pipelines (numbered
    from 0 in the trace, as a fault's ``pipeline`` argument counts them), their ops and the
    kernel-wide syncs. A trace is its function name and occurrence (the n-th trace of that
    function in its process); the same trace in several processes (pytest-xdist) counts once."""
    out: list[dict[str, Any]] = []
    seen = set()
    for p in clean.get("processes", []):
        for tr in p.get("traces") or []:
            key = (tr.get("function"), tr.get("occurrence", 0))
            if key in seen or not tr.get("protocol") or tr.get("error"):
                continue
            seen.add(key)
            proto = tr["protocol"]
            out.append(
                {
                    "t": len(out),
                    "function": key[0],
                    "occurrence": key[1],
                    "kernels": tr.get("kernels") or [],
                    "kernel": ", ".join(proto.get("kernel_names") or []) or None,
                    "pipelines": proto.get("pipelines") or [],
                    "arch_ops": proto.get("arch_ops") or {},
                    "pid": p.get("pid"),
                }
            )
    return out


def plan(
    traces: list[dict[str, Any]],
    faults_wanted: list[str] | None,
    pipelines_wanted: list[int] | None,
) -> list[Mutant]:
    out: list[Mutant] = []
    for tr in traces:
        trace = {"function": tr["function"], "occurrence": tr["occurrence"]}
        t = f"t{tr['t']}"
        for p in tr["pipelines"]:
            if pipelines_wanted is not None and p["index"] not in pipelines_wanted:
                continue
            target = f"{t}.p{p['index']}"
            for fault, args, variant, why in _pipeline_mutants(p):
                out.append(Mutant(f"{target}.{variant}", fault, args, trace, target, variant, why))
        target = f"{t}.{KERNEL_WIDE}"
        for fault, args, variant, why in _kernel_wide_mutants(
            tr["arch_ops"], bool(tr["pipelines"])
        ):
            out.append(Mutant(f"{target}.{variant}", fault, args, trace, target, variant, why))
    from cutedebug.instrument.faults import FAULTS

    out = [m for m in out if m.fault in FAULTS]  # a registry without one of them: left out
    if faults_wanted is not None:
        out = [m for m in out if m.fault in faults_wanted]
    return out


def _kernel_of(tr: dict[str, Any]) -> str:
    if tr.get("kernel"):
        return tr["kernel"]
    k = (tr.get("kernels") or ["?"])[0]
    return k if len(k) <= 60 else k[:57] + "..."


def targets(traces: list[dict[str, Any]]) -> dict[str, str]:
    """Target id -> label: each pipeline of each trace, then the trace's kernel-wide row."""
    out = {}
    for tr in traces:
        t = f"t{tr['t']}"
        for p in tr["pipelines"]:
            out[f"{t}.p{p['index']}"] = (
                f"{t}.p{p['index']}: {p['class']} @{os.path.basename(p.get('file') or '?')}:"
                f"{p.get('line')} in {p.get('kernel') or _kernel_of(tr)}"
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


def mutant_record(m: Mutant, res: X.ExecResult, out: Path) -> dict[str, Any]:
    from cutedebug.instrument import faults

    sites = []
    for p in res.processes.values():
        for s in p.get("fault_sites") or []:
            sites.append(
                {k: s.get(k) for k in ("kernel", "file", "line", "function", "op", "detail")}
                | {"pid": p["pid"]}
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
    return {
        **m.to_json(),
        "status": status,
        "verdict": res.verdict.value,
        "reason": reason,
        "where": X.where(res),
        "fault_count": res.fault_count or 0,
        "sites": sites[:20],
        "changes": faults.FAULTS[m.fault].description,
        "registry_expects": expected,
        "registry_note": note,
        "elapsed_s": res.elapsed_s,
        "gpu_wait_s": res.gpu_wait_s,
        "killed_by": res.killed_by,
        "used_gpu": X._used_gpu(res),
        "left_pids": res.left,
        "swept_pids": res.swept,
        "report": os.path.relpath(res.run_dir / "report.md", out),
    }


def run_mutant(m: Mutant, clean: X.Settings, deadline_s: float, out: Path) -> dict[str, Any]:
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
    run_dir = out / "mutants" / m.id.replace("/", "_")
    # The DSL names its dump files (KeepPTX, ...) after the traced function: mutants that run
    # at once must not read each other's.
    s.extra_env = {**s.extra_env, "CUTE_DSL_DUMP_DIR": str(run_dir / "dsl_dump")}
    (run_dir / "dsl_dump").mkdir(parents=True, exist_ok=True)
    res = X.watch_command(s, run_dir)
    if s.gpu_token:  # the mutant and everything it started are gone: the GPU is free
        release_gpu_token(Path(s.gpu_token), res.tag)
    X.write_report(res, "PASS")
    return mutant_record(m, res, out)


def release_gpu_token(path: Path, tag: str) -> None:
    try:
        if path.read_text() == tag:
            path.unlink()
    except FileNotFoundError:
        pass


def load_results(path: Path) -> dict[str, dict[str, Any]]:
    done: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
                done[r["id"]] = r
            except (ValueError, KeyError):
                continue  # a line cut by a kill: that mutant runs again
    return done


# ---- matrix --------------------------------------------------------------------------------------
def score(results: list[dict[str, Any]]) -> dict[str, Any]:
    n = {
        k: sum(r["status"] == k for r in results) for k in (CAUGHT, SURVIVED, NOT_APPLIED, HARNESS)
    }
    scored = n[CAUGHT] + n[SURVIVED]
    by = {v: sum(r["status"] == CAUGHT and r["verdict"] == v for r in results) for v in CAUGHT_BY}
    return {
        "counts": n,
        "caught_by": by,
        "score": round(n[CAUGHT] / scored, 4) if scored else None,
        "scored": scored,
        "mutants": len(results),
    }


def build_matrix(
    clean: dict[str, Any],
    traces: list[dict[str, Any]],
    results: list[dict[str, Any]],
    planned: list[Mutant],
    command: str,
) -> dict[str, Any]:
    order = {m.id: i for i, m in enumerate(planned)}
    results = sorted(results, key=lambda r: order.get(r["id"], len(order)))
    return {
        "schema": MATRIX_SCHEMA,
        "command": command,
        "argv": clean["argv"],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "clean": {
            k: clean.get(k) for k in ("verdict", "reason", "elapsed_s", "run_dir", "kernels_traced")
        },
        "targets": targets(traces),
        "traces": traces,
        "score": score(results),
        "planned": len(planned),
        "mutants": results,
    }


def _cell(r: dict[str, Any]) -> str:
    return r["verdict"] if r["status"] == CAUGHT else r["status"]


def _pivot(m: dict[str, Any]) -> tuple[list[str], list[str], dict[tuple[str, str], dict]]:
    targets = [t for t in m["targets"] if any(r["target"] == t for r in m["mutants"])]
    variants: list[str] = []
    for r in m["mutants"]:
        if r["variant"] not in variants:
            variants.append(r["variant"])
    return targets, variants, {(r["target"], r["variant"]): r for r in m["mutants"]}


def _score_text(sc: dict[str, Any]) -> str:
    c = sc["counts"]
    pct = f"{100 * sc['score']:.0f}%" if sc["score"] is not None else "n/a"
    return (
        f"mutation score {pct} ({c[CAUGHT]} caught of {sc['scored']} applied: "
        + ", ".join(f"{v} {n}" for v, n in sc["caught_by"].items())
        + f"; {c[SURVIVED]} "
        f"survived); {c[NOT_APPLIED]} not applied, {c[HARNESS]} harness error(s)"
    )


def survivors(m: dict[str, Any]) -> list[str]:
    out = []
    for r in m["mutants"]:
        if r["status"] != SURVIVED:
            continue
        sites = "; ".join(
            f"{os.path.basename(s.get('file') or '?')}:{s.get('line')} "
            f"{s.get('op')}: {s.get('detail')}"
            for s in r["sites"][:4]
        )
        out.append(
            f"`{r['id']}` ({r['fault']} {json.dumps(r['args'])}) changes {sites} — "
            f"{r['changes']}; the command still passed"
        )
    return out


def render_markdown(m: dict[str, Any]) -> str:
    targets, variants, cells = _pivot(m)
    lines = [
        f"# cutedebug mutate: `{shlex.join(m['argv'])}`",
        "",
        f"**{_score_text(m['score'])}**",
        "",
        f"Clean run: {m['clean']['verdict']} in {m['clean']['elapsed_s']} s, "
        f"{m['clean']['kernels_traced']} trace(s). Command: `{m['command']}`. {m['date']}.",
        "",
        "## Matrix (target x fault)",
        "",
        "| target | " + " | ".join(variants) + " |",
        "|---|" + "---|" * len(variants),
    ]
    for t in targets:
        lines.append(
            f"| {m['targets'][t]} | "
            + " | ".join(_cell(cells[(t, v)]) if (t, v) in cells else "" for v in variants)
            + " |"
        )
    surv = survivors(m)
    lines += ["", "## Survivors", ""] + ([f"- {s}" for s in surv] or ["none"])
    unapplied = [r for r in m["mutants"] if r["status"] in (NOT_APPLIED, HARNESS)]
    if unapplied:
        lines += ["", "## Not applied / harness errors", ""]
        lines += [f"- `{r['id']}` {r['status']}: {r['reason'][:300]}" for r in unapplied]
    lines += [
        "",
        "## Mutants",
        "",
        "| mutant | status | verdict | fault applied at | where / why | secs | report |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in m["mutants"]:
        sites = ", ".join(
            f"{os.path.basename(s.get('file') or '?')}:{s.get('line')}" for s in r["sites"][:3]
        )
        lines.append(
            f"| `{r['id']}` | {r['status']} | {r['verdict']} | "
            f"{r['fault_count']} site(s) {sites} | {(r['where'] or r['reason'])[:160]}"
            f" | {r['elapsed_s']} | [report]({r['report']}) |"
        )
    lines += ["", f"{m['planned']} mutant(s) planned, {len(m['mutants'])} done."]
    if m.get("facts"):
        lines += ["", "## Run facts", ""] + [f"- {x}" for x in facts_lines(m["facts"])]
    return "\n".join(lines) + "\n"


def render_html(m: dict[str, Any]) -> str:
    from cutedebug.reporting.matrix import CSS

    e = html.escape
    targets, variants, cells = _pivot(m)
    klass = {CAUGHT: "ok", SURVIVED: "miss", NOT_APPLIED: "notrun", HARNESS: "harness"}
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>cutedebug mutate</title><style>{CSS}</style></head><body>",
        f"<h1>cutedebug mutate: <code>{e(shlex.join(m['argv']))}</code></h1>",
        f"<p><b>{e(_score_text(m['score']))}</b></p>",
        f"<p>Clean run {e(str(m['clean']['verdict']))} in {m['clean']['elapsed_s']} s · "
        f"{e(m['date'])} · command <code>{e(m['command'])}</code></p>",
        "<p>"
        + " ".join(f"<span class='{c}'>&nbsp;{s}&nbsp;</span>" for s, c in klass.items())
        + "</p>",
        "<h2>Matrix (target × fault)</h2><table><tr><th>target</th>"
        + "".join(f"<th>{e(v)}</th>" for v in variants)
        + "</tr>",
    ]
    for t in targets:
        out.append(f"<tr><th>{e(m['targets'][t])}</th>")
        for v in variants:
            r = cells.get((t, v))
            if r is None:
                out.append("<td></td>")
                continue
            tip = e((r["where"] or r["reason"])[:400])
            out.append(
                f"<td class='{klass[r['status']]}' title='{tip}'>"
                f"<a href='{e(r['report'])}'>{e(_cell(r))}</a></td>"
            )
        out.append("</tr>")
    out.append("</table><h2>Survivors</h2><ul>")
    out += [f"<li>{e(s)}</li>" for s in survivors(m)] or ["<li>none</li>"]
    out.append("</ul>")
    if m.get("facts"):
        out += ["<h2>Run facts</h2><ul>"] + [f"<li>{e(x)}</li>" for x in facts_lines(m["facts"])]
        out.append("</ul>")
    out.append("</body></html>\n")
    return "\n".join(out)


def run_facts(
    clean: dict[str, Any], results: list[dict[str, Any]], wall_s: float
) -> dict[str, Any]:
    """Leftover processes, GPU health after the kills, each mutant's time against the clean
    run's (interpreter start + compile + run; a mutant may take 2 s more)."""
    from cutedebug.engine import runner

    killed_gpu = [r for r in results if r.get("killed_by") and r.get("used_gpu")]
    limit = clean["elapsed_s"] + 2.0
    # A mutant's own time: what it spent waiting for the GPU token is the others'.
    over = [r["id"] for r in results if r["elapsed_s"] - r.get("gpu_wait_s", 0.0) > limit]
    return {
        "clean_s": clean["elapsed_s"],
        "wall_s": round(wall_s, 1),
        "max_mutant_s": max((r["elapsed_s"] for r in results), default=None),
        "over_clean_plus_2s": over,
        "processes_left": sorted({p for r in results for p in r.get("left_pids") or []}),
        "gpu_health": runner.health_check() if killed_gpu else None,
        "killed_on_gpu": len(killed_gpu),
    }


def facts_lines(f: dict[str, Any]) -> list[str]:
    if not f:
        return []
    health = f["gpu_health"]
    return [
        f"clean run {f['clean_s']} s; slowest mutant {f['max_mutant_s']} s; "
        f"{len(f['over_clean_plus_2s'])} mutant(s) over clean + 2 s"
        + (f" ({', '.join(f['over_clean_plus_2s'][:5])})" if f["over_clean_plus_2s"] else ""),
        f"processes of ours left: {len(f['processes_left'])}"
        + (f" {f['processes_left']}" if f["processes_left"] else ""),
        "GPU health after the kills: "
        + (
            "not checked (no mutant killed on a GPU)"
            if health is None
            else "healthy"
            if health.get("healthy")
            else f"UNHEALTHY {health}"
        ),
        f"mutate wall time {f['wall_s']} s",
    ]


def write_matrix(out: Path, m: dict[str, Any]) -> None:
    from cutedebug.reporting.files import atomic_write

    atomic_write(out / "matrix.json", json.dumps(m, indent=1, default=str))
    atomic_write(out / "matrix.md", render_markdown(m))
    atomic_write(out / "matrix.html", render_html(m))


# ---- command line --------------------------------------------------------------------------------
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
        type=int,
        default=max(1, min(4, (os.cpu_count() or 2) // 4)),
        help="mutants at once (default %(default)s); with a GPU they compile at once and run "
        "their kernels one at a time",
    )
    p.add_argument("--min-score", type=float, help="exit 1 below this mutation score (0-1)")
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
    clean = json.loads(clean_path.read_text()) if args.resume and clean_path.exists() else None
    if clean is not None and clean.get("argv") != argv:
        print(
            f"cutedebug: error: --resume: {clean_path} is for `{shlex.join(clean['argv'])}`",
            file=sys.stderr,
        )
        return X.EXIT_USAGE
    if clean is None:
        print(f"clean run: {shlex.join(argv)}", flush=True)
        res = X.watch_command(clean_s, out / "clean")
        X.write_report(res, "PASS", command)
        clean = X.to_json(res, "PASS", command)
        clean["used_gpu"] = X._used_gpu(res)
        (out / "results.jsonl").unlink(missing_ok=True)
        clean_path.write_text(json.dumps(clean, indent=1, default=str))
    print(
        f"clean run: {clean['verdict']} in {clean['elapsed_s']} s — {clean['reason'][:200]}",
        flush=True,
    )
    traces = recorded(clean)
    planned = plan(traces, wanted, pipes) if clean["verdict"] == "PASS" else []
    results_path = out / "results.jsonl"
    done = load_results(results_path) if args.resume else {}
    if clean["verdict"] != "PASS":
        print(
            "the command does not pass without faults: nothing to score "
            f"(report: {clean['run_dir']}/report.md)"
        )
        write_matrix(out, build_matrix(clean, traces, [], [], command))
        return X.EXIT_MISMATCH
    n_pipes = max((len(tr["pipelines"]) for tr in traces), default=0)
    if pipes is not None and (bad := [i for i in pipes if i >= n_pipes]):
        print(
            f"cutedebug: error: --pipelines {bad}: no trace of the clean run created that "
            f"many pipelines (at most {n_pipes})",
            file=sys.stderr,
        )
        return X.EXIT_USAGE
    labels = targets(traces)
    for tr in traces:
        print(f"  trace t{tr['t']}: {_kernel_of(tr)}, {len(tr['pipelines'])} pipeline(s)")
        for p in tr["pipelines"]:
            label = labels[f"t{tr['t']}.p{p['index']}"]
            print(f"    {label} ops {p['ops']}")
    deadline = args.deadline or max(30.0, 2 * clean["elapsed_s"] + 10.0)
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

    def finished(r: dict[str, Any]) -> None:
        results.append(r)
        with open(results_path, "a") as f:
            f.write(json.dumps(r, default=str) + "\n")
        write_matrix(out, build_matrix(clean, traces, results, planned, command))
        print(
            f"[{len(results):>3}/{len(planned)}] {r['id']}: {r['status']}"
            + (f" ({r['verdict']})" if r["status"] == CAUGHT else "")
            + f" in {r['elapsed_s']} s — {(r['where'] or r['reason'])[:120]}",
            flush=True,
        )

    # Mutants compile at once; the GPU token lets one of them at a time run kernels.
    gpu_token = str(token) if clean.get("used_gpu") and jobs > 1 else None
    clean_run = X.Settings(**{**vars(clean_s), "record": False, "gpu_token": gpu_token})
    if jobs == 1:
        for m in todo:
            finished(run_mutant(m, clean_run, deadline, out))
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run_mutant, m, clean_run, deadline, out) for m in todo]
            for fut in as_completed(futures):
                finished(fut.result())
    m = build_matrix(clean, traces, results, planned, command)
    m["facts"] = run_facts(clean, results, time.monotonic() - t0)
    write_matrix(out, m)
    print(_score_text(m["score"]) + f" ({time.monotonic() - t0:.1f} s)")
    for line in facts_lines(m["facts"]):
        print(f"  {line}")
    for s in survivors(m):
        print(f"  survivor: {s}")
    print(f"matrix: {out / 'matrix.md'} | {out / 'matrix.html'} | {out / 'matrix.json'}")
    health = m["facts"]["gpu_health"]
    bad = m["facts"]["processes_left"] or (health is not None and not health.get("healthy"))
    bad = (
        bad
        or m["score"]["counts"][HARNESS] > 0
        or (args.min_score is not None and (m["score"]["score"] or 0.0) < args.min_score)
    )
    return X.EXIT_MISMATCH if bad else X.EXIT_OK
