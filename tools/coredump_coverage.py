"""Issue #25's targets against what the H200 measured: one row per HANG scenario of the sm_90 matrix.

    python tools/coredump_coverage.py [--json FILE] [--pending] [--add LABEL=ROWS.json ...]

Reads only committed files: the scenario files (``scenarios/``, through the project's own
loader: every scenario whose expected verdicts include HANG and that runs on sm_90a) and the
rows ``tools/gpu_coredump_table.py`` wrote on the H200 (:data:`RUNS`, probes off, localized
from the core alone). Per scenario, the newest run that executed it: the verdict, the
localization as that run graded it (role, op and barrier against the scenario's expectation:
probes' for ``localized_by = "probes"``, bisection's for ``"bisect"``), what the core said per
role, the seconds added between the kill decision and the verdict (dump + reading the core),
the wall seconds from spawn to verdict, the GPU health after the dump and the processes left.
Then the targets: bisection-only scenarios in <= 10 s, <= 5 s added, 0 orphans and a healthy
GPU after every dump, and the one crash core against memcheck's line. ``--pending`` prints only
the HANG scenarios no run has localized from its core (the work a GPU step still owes).
``--add`` reads a newer run's rows (e.g. gpu_pending's coredump_rest: its rows.json) after
:data:`RUNS`, before they are committed and listed there.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutedebug.analyses import cudagdb  # noqa: E402
from cutedebug.engine import scenario as S  # noqa: E402

ARCH = "sm_90a"
# The H200 runs of tools/gpu_coredump_table.py, oldest first (a newer run of a scenario wins).
# (label, rows file, dump flags): "default" = coredump.SKIP_FLAGS, "light" = + skip_
# nonrelocated_elf_images, skip_constbank_memory (CUTEDEBUG_COREDUMP_FLAGS).
RUNS = [
    ("s4/call3", "reports/2026-12-01-h200-s4/call3/coredump/rows.json.gz", "default"),
    ("12-02/call5", "reports/2026-12-02-h200/call5/coredump_lite/rows.json", "default"),
    ("12-02/call5 light", "reports/2026-12-02-h200/call5/coredump_lite/rows_light.json", "light"),
    ("s2/call2", "reports/2026-12-02-h200-s2/call2/coredump/rows.json.gz", "default"),
    ("s2/call2 light", "reports/2026-12-02-h200-s2/call2/coredump/rows_light.json", "light"),
    ("s2/call4", "reports/2026-12-02-h200-s2/call4/coredump_rest/rows.json.gz", "default"),
    ("s3/call3", "reports/2026-12-02-h200-s3/call3/coredump_rest/rows.json.gz", "default"),
    ("12-02 s4/call1", "reports/2026-12-02-h200-s4/call1/coredump_rest/rows.json.gz", "default"),
    ("12-02 s5/call2", "reports/2026-12-02-h200-s5/call2/coredump_field/rows.json.gz", "default"),
    (
        "12-02 s5/call3",
        "reports/2026-12-02-h200-s5/call3/coredump_field_gemm/rows.json.gz",
        "default",
    ),
    ("12-02 s6/call1", "reports/2026-12-02-h200-s6/call1/coredump_field/rows.json", "default"),
    # the plain side of coredump_ahead (its ahead side read CRASH: a dump ends the kernel)
    (
        "12-02 s6/call3",
        "reports/2026-12-02-h200-s6/call3/coredump_ahead/plain.json.gz",
        "default",
    ),
    # the driver's dump against cuda-gdb attached to the live worker, the same four hangs
    (
        "12-02 s7/call1 dump",
        "reports/2026-12-02-h200-s7/call1/coredump_attach/dump.json.gz",
        "default",
    ),
    (
        "12-02 s7/call1 attach",
        "reports/2026-12-02-h200-s7/call1/coredump_attach/attach.json.gz",
        "default",
    ),
    # the whole sm_90 HANG matrix with --coredump as it is now (cuda-gdb attached, the default)
    (
        "12-02 s7/call2",
        "reports/2026-12-02-h200-s7/call2/coredump_own_attach/rows.json.gz",
        "default",
    ),
    (
        "12-02 s7/call3",
        "reports/2026-12-02-h200-s7/call3/coredump_field_attach/rows.json.gz",
        "default",
    ),
    (
        "12-02 s7/call4",
        "reports/2026-12-02-h200-s7/call4/coredump_gemm_attach/rows.json.gz",
        "default",
    ),
    # the field's bisection-only hangs with the library imported once in the fork server
    # (engine/preloads.py) and its bytecode compiled as pip leaves it. (s8/call1 ran the same
    # six first; each row counted 1 process left, the keeper preloads.uniform_cc started in
    # the fork server, which ended with it: fixed in d2c21d8, then call3. Not counted here.)
    (
        "12-02 s8/call3",
        "reports/2026-12-02-h200-s8/call3/field_preload_rows.json.gz",
        "default",
    ),
    # the same six with the fork server importing the scenarios' libraries at its start
    # (runner.start_forkserver(preload=...)): no row's wall counts a library's import
    (
        "12-03 s9/call1",
        "reports/2026-12-03-h200-s9/call1/field_preload_rows.json.gz",
        "default",
    ),
]
# printf-bisection of the same scenarios on the H200 (reports/2026-11-30-h200-s3): wall seconds
BISECT_TABLE = "reports/2026-11-30-h200-s3/bisect-table.txt"
# `cutedebug bisect` against `cutedebug run --coredump`, each a fresh command, alternated
# (tools/core_vs_bisect.py, reports/2026-12-02-h200-s8/call3): the bisection side's walls
BISECT_VS_CORE = "reports/2026-12-02-h200-s8/call3/core_vs_bisect_rows.json.gz"
# The one real crash core (minimal/oob_store, request core-1: the driver's core on the GPU
# exception) as cuda-gdb printed it, and memcheck's finding for the same kernel file.
CRASH_CORE = "tests/data/coredump/h200/minimal__oob_store/pass1.txt.gz"
CRASH_MEMCHECK = "reports/2026-11-30-h200-s2/sanitize-table-minimal.txt"
BISECT_TARGET_S = 10.0
ADDED_TARGET_S = 5.0
BIG_GRID_WARPS = 1000


def read_by(r: dict[str, Any]) -> str:
    """How a row's hung worker was read: "attach" (cuda-gdb attached before the kill, the
    default since 2026-12-02 s7), "dump" (the driver's core: asked, an older run, or after a
    failed attach), "-" (nothing read: no hang, skipped)."""
    if (r.get("attach") or {}).get("attach_s") is not None and not r["attach"].get("error"):
        return "attach"
    return "dump" if r.get("dump_s") is not None else "-"


def _load(path: Path) -> Any:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def hang_scenarios(root: Path = ROOT / "scenarios") -> list[S.Scenario]:
    """The matrix's HANG scenarios that run on sm_90a (HANG among the expected verdicts)."""
    out = []
    for f in S.discover(root):
        sc = S.load(f)
        if ARCH in sc.archs and "HANG" in sc.expect.verdicts:
            out.append(sc)
    return out


def crash_scenarios(root: Path = ROOT / "scenarios") -> list[S.Scenario]:
    return [
        sc
        for sc in (S.load(f) for f in S.discover(root))
        if ARCH in sc.archs and "CRASH" in sc.expect.verdicts
    ]


def measured_rows(
    root: Path = ROOT, runs: list[tuple[str, str, str]] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Every row that ran (not skipped, not UNSUPPORTED), per scenario, oldest first, each
    with ``source`` = "LABEL#INDEX" (its index in that rows file) and ``flags``."""
    out: dict[str, list[dict[str, Any]]] = {}
    for label, rel, flags in RUNS if runs is None else runs:
        for i, r in enumerate(_load(root / rel)):
            if "skipped" in r or r.get("verdict") in (None, "UNSUPPORTED"):
                continue
            out.setdefault(r["scenario"], []).append(
                {**r, "source": f"{label}#{i}", "rows_file": rel, "flags": flags}
            )
    return out


def _place(d: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (d or {}).items() if k in ("role", "op", "barrier")}


def coverage(
    root: Path = ROOT, runs: list[tuple[str, str, str]] | None = None, read: str | None = None
) -> list[dict[str, Any]]:
    """One row per HANG scenario: the newest default-flags run of it that read the hung
    worker, attached or from its core (or None). A run whose kernel did not hang that time (a
    timing-dependent fault read MISMATCH or CRASH, nothing read) localizes nothing: it is
    named in ``ran_without_core``. ``read`` ("attach" or "dump") keeps only the readings made
    that way: the coverage of one mode of CUTEDEBUG_COREDUMP_READ."""
    rows = measured_rows(root, runs)
    out = []
    for sc in hang_scenarios(root / "scenarios"):
        runs = rows.get(sc.id, [])
        default = [r for r in runs if r["flags"] == "default"]
        dumped = [r for r in default if read_by(r) in ((read,) if read else ("attach", "dump"))]
        best = dumped[-1] if dumped else None
        want = _place(sc.expect.localization())
        row: dict[str, Any] = {
            "scenario": sc.id,
            "field": sc.id.startswith("field/"),
            "verdicts": list(sc.expect.verdicts),
            "localized_by": sc.expect.localized_by,
            "expected_place": want,
            "runs": len(runs),
            "measured": best is not None,
            "ran_without_core": [
                f"{r['verdict']} ({r['source']})" for r in default if r not in dumped
            ],
        }
        if best is not None:
            then = _place(best.get("expected"))
            row.update(
                source=best["source"],
                rows_file=best["rows_file"],
                verdict=best["verdict"],
                verdict_ok=best["verdict_ok"],
                localization_ok=best["localization_ok"],
                # graded against what the scenario expected then; a changed expectation says so
                expectation_changed=bool(then != want),
                core=best.get("core", ""),
                read=read_by(best),
                warps=best.get("warps"),
                dump_s=best.get("dump_s"),
                core_s=best.get("core_s"),
                added_s=best.get("added_s"),
                wall_s=best.get("wall_s"),
                healthy=best.get("healthy"),
                leftovers=best.get("leftovers"),
            )
        out.append(row)
    return out


def bisection_seconds(root: Path = ROOT) -> dict[str, float]:
    """printf-bisection's wall seconds per scenario on the H200 (the JSON lines of the table)."""
    out = {}
    for line in (root / BISECT_TABLE).read_text().splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            out[r["scenario"]] = r["wall_s"]
    for r in _load(root / BISECT_VS_CORE):
        if r["side"] == "bisect":  # its rows name a field scenario without "field/"
            own = (root / "scenarios" / f"{r['scenario']}.toml").is_file()
            out[r["scenario"] if own else f"field/{r['scenario']}"] = r["wall_s"]
    return out


def crash_pair(root: Path = ROOT) -> dict[str, Any]:
    """The crash core's faulting line (cuda-gdb's own words, parsed by the reader's parser)
    and memcheck's line for the same kernel file."""
    text = gzip.open(root / CRASH_CORE, "rt").read()
    ex = cudagdb.parse_exception(text) or {}
    memcheck = None
    for line in (root / CRASH_MEMCHECK).read_text().splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            if r["scenario"] == "minimal/oob_store" and r["tool"] == "memcheck":
                memcheck = r["findings"]
    core_where = f"{ex.get('file')}:{ex.get('line')}" if ex.get("file") else None
    mem_where = memcheck.split("@", 1)[1].split()[0] if memcheck and "@" in memcheck else None
    return {
        "scenario": "minimal/oob_store",
        "core": f"{ex.get('exception')} at {core_where}",
        "core_where": core_where,
        "memcheck": memcheck,
        "memcheck_where": mem_where,
        "same_line": core_where is not None and core_where == mem_where,
        "sources": [CRASH_CORE, CRASH_MEMCHECK],
    }


def summary(
    cov: list[dict[str, Any]], root: Path = ROOT, runs: list[tuple[str, str, str]] | None = None
) -> dict[str, Any]:
    done = [r for r in cov if r["measured"]]
    graded = [r for r in done if r["localization_ok"] is not None]
    bis = bisection_seconds(root)
    bisect_rows = [r for r in cov if r["localized_by"] == "bisect"]
    small = [r["added_s"] for r in done if (r["warps"] or 0) < BIG_GRID_WARPS]
    every = [x for rs in measured_rows(root, runs).values() for x in rs]
    cores = [x for x in every if read_by(x) != "-"]
    big = [x for x in every if (x.get("warps") or 0) >= BIG_GRID_WARPS]
    newest_big = [r for r in done if (r["warps"] or 0) >= BIG_GRID_WARPS]
    return {
        "hang_scenarios": len(cov),
        "own": sum(not r["field"] for r in cov),
        "field": sum(r["field"] for r in cov),
        "measured": len(done),
        "verdict_ok": sum(bool(r["verdict_ok"]) for r in done),
        "localized_ok": sum(bool(r["localization_ok"]) for r in graded),
        "graded": len(graded),
        "no_expected_place": [r["scenario"] for r in done if r["localization_ok"] is None],
        "expectation_changed": [r["scenario"] for r in done if r.get("expectation_changed")],
        "not_measured": [r["scenario"] for r in cov if not r["measured"]],
        "bisect_only": [
            {
                "scenario": r["scenario"],
                "core_wall_s": r.get("wall_s"),
                "localized": r.get("localization_ok"),
                "within_target": r["measured"] and r["wall_s"] <= BISECT_TARGET_S,
                "bisection_wall_s": bis.get(r["scenario"]),
            }
            for r in bisect_rows
        ],
        "added_small": {
            "n": len(small),
            "min": min(small) if small else None,
            "median": round(statistics.median(small), 3) if small else None,
            "max": max(small) if small else None,
            "within_target": sum(x <= ADDED_TARGET_S for x in small),
        },
        "added_big": [
            {k: x.get(k) for k in ("scenario", "source", "flags", "warps", "core_mb")}
            | {k: x.get(k) for k in ("dump_s", "core_s", "added_s")}
            | {"read": read_by(x), "attach_s": (x.get("attach") or {}).get("attach_s")}
            for x in big
        ],
        # the newest reading of each big-grid scenario (what a run does now) against the target
        "added_big_newest": {
            "n": len(newest_big),
            "read": sorted({r["read"] for r in newest_big}),
            "max": max((r["added_s"] for r in newest_big), default=None),
            "within_target": sum(r["added_s"] <= ADDED_TARGET_S for r in newest_big),
        },
        "read": {k: sum(r.get("read") == k for r in done) for k in ("attach", "dump")},
        "ran_without_core": {
            r["scenario"]: r["ran_without_core"] for r in cov if r["ran_without_core"]
        },
        "dumps": sum(read_by(x) == "dump" for x in cores),
        "attached": sum(read_by(x) == "attach" for x in cores),
        "healthy_after_every_dump": all(x.get("healthy") is True for x in cores),
        "leftovers": sum(x.get("leftovers") or 0 for x in every),
        "crash": crash_pair(root),
        "crash_scenarios": (crashes := [sc.id for sc in crash_scenarios(root / "scenarios")]),
        # crash scenarios run through the integrated path (their core's faulting place)
        "crash_rows": [
            {k: x.get(k) for k in ("scenario", "source", "verdict", "core", "healthy")}
            for x in every
            if x["scenario"] in crashes and x["verdict"] == "CRASH"
        ],
    }


def by_read(root: Path = ROOT, runs: list[tuple[str, str, str]] | None = None) -> dict:
    """Per mode of CUTEDEBUG_COREDUMP_READ, each HANG scenario's newest reading made that way:
    how many, localized as expected of those graded, the seconds added (max, within target)."""
    out = {}
    for mode in ("attach", "dump"):
        done = [r for r in coverage(root, runs, read=mode) if r["measured"]]
        graded = [r for r in done if r["localization_ok"] is not None]
        out[mode] = {
            "scenarios": len(done),
            "localized_ok": sum(bool(r["localization_ok"]) for r in graded),
            "graded": len(graded),
            "added_max": max((r["added_s"] for r in done), default=None),
            "within_target": sum(r["added_s"] <= ADDED_TARGET_S for r in done),
        }
    return out


def _f(x: Any, fmt: str = "5.2f") -> str:
    return format(x, fmt) if isinstance(x, (int, float)) else "-"


def print_report(cov: list[dict[str, Any]], s: dict[str, Any]) -> None:
    print(
        f"{'scenario':50} {'by':6} {'source':18} {'verdict':8} {'loc':5} {'read':6} "
        f"{'added':>6} {'wall':>6} {'ok?':4} core says"
    )
    for r in cov:
        if not r["measured"]:
            print(f"{r['scenario'][:50]:50} {r['localized_by']:6} not measured")
            continue
        loc = str(r["localization_ok"]) + ("*" if r["expectation_changed"] else "")
        print(
            f"{r['scenario'][:50]:50} {r['localized_by']:6} {r['source']:18} "
            f"{r['verdict'][:8]:8} {loc[:5]:5} {r['read']:6} {_f(r['added_s'], '6.2f')} "
            f"{_f(r['wall_s'], '6.2f')} {str(r['healthy'])[:4]:4} {r['core'][:80]}"
        )
    print(
        f"\n{s['hang_scenarios']} HANG scenarios run on {ARCH} ({s['own']} own, {s['field']} "
        f"field); localized from the hung worker's GPU state alone (no probes) on the H200: "
        f"{s['measured']} (attached {s['read']['attach']}, from a core {s['read']['dump']}); "
        f"verdict as "
        f"expected {s['verdict_ok']}/{s['measured']}; role/op/barrier as expected "
        f"{s['localized_ok']}/{s['graded']} graded; no expected place "
        f"{len(s['no_expected_place'])}: {', '.join(s['no_expected_place'])}"
    )
    for mode, m in by_read().items():
        print(
            f"  newest reading made by {mode}: {m['scenarios']} scenarios, localized as "
            f"expected {m['localized_ok']}/{m['graded']}, added at most {_f(m['added_max'])} s, "
            f"{m['within_target']} within {ADDED_TARGET_S:g} s"
        )
    if s["expectation_changed"]:
        print(f"  * graded against an expectation changed since: {s['expectation_changed']}")
    print(f"not measured ({len(s['not_measured'])}): {', '.join(s['not_measured'])}")
    for name, verdicts in s["ran_without_core"].items():
        print(f"  ran without a hang, no core: {name}: {', '.join(verdicts)}")
    print(f"\nbisection-only scenarios (target: <= {BISECT_TARGET_S:g} s from spawn to verdict):")
    for b in s["bisect_only"]:
        print(
            f"  {b['scenario']:50} core {_f(b['core_wall_s'])} s localized {b['localized']} "
            f"within target {b['within_target']}; bisection {_f(b['bisection_wall_s'])} s"
        )
    a = s["added_small"]
    print(
        f"\nadded between the kill decision and the verdict (attach or dump + reading; target <= "
        f"{ADDED_TARGET_S:g} s): grids under {BIG_GRID_WARPS} warps: {a['n']} scenarios, "
        f"{_f(a['min'])}-{_f(a['max'])} s, median {_f(a['median'])} s, {a['within_target']} "
        f"within target"
    )
    for b in s["added_big"]:
        how = (
            f"attached {b['attach_s']}"
            if b["read"] == "attach"
            else f"dump {b['dump_s']} + reading {b['core_s']}"
        )
        print(
            f"  {b['scenario']} ({b['source']}, {b['flags']} flags, {b['warps']} warps, "
            f"{b['core_mb']} MB): added {b['added_s']} s = {how}"
        )
    g = s["added_big_newest"]
    print(
        f"grids of {BIG_GRID_WARPS} warps or more, each scenario's newest reading ({g['n']}, "
        f"read {'/'.join(g['read'])}): {g['within_target']} within target, max {_f(g['max'])} s"
    )
    print(
        f"\n{s['dumps']} dumps and {s['attached']} attached readings in these runs: GPU healthy "
        f"after every one {s['healthy_after_every_dump']}, processes left {s['leftovers']}"
    )
    c = s["crash"]
    print(
        f"\ncrash: {c['scenario']}: core {c['core']}; memcheck {c['memcheck']}; same line "
        f"{c['same_line']}"
    )
    print(
        f"crash scenarios on {ARCH} ({len(s['crash_scenarios'])}): "
        f"{', '.join(s['crash_scenarios'])}"
    )
    for x in s["crash_rows"]:
        print(f"  through --coredump: {x['scenario']} ({x['source']}): {x['verdict']}, {x['core']}")
    if not s["crash_rows"]:
        print("  through --coredump on the GPU: none yet")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows and the summary here")
    ap.add_argument("--pending", action="store_true", help="only the scenarios not measured")
    ap.add_argument(
        "--add",
        action="append",
        default=[],
        metavar="LABEL=ROWS.json",
        help="a newer run's rows (gpu_coredump_table --json, default flags) after RUNS",
    )
    args = ap.parse_args(argv)
    runs = list(RUNS)
    for a in args.add:
        label, sep, path = a.partition("=")
        if not sep or not label or not Path(path).is_file():
            print(f"--add {a!r}: expected LABEL=PATH of a rows file", file=sys.stderr)
            return 2
        runs.append((label, str(Path(path).resolve()), "default"))
    cov = coverage(runs=runs)
    if args.pending:
        for r in cov:
            if not r["measured"]:
                print(r["scenario"])
        return 0
    s = summary(cov, runs=runs)
    print_report(cov, s)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": cov, "summary": s}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
