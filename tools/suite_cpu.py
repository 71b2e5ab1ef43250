"""Where the test suite's CPU goes: per test item, its wall and the CPU of the whole process tree
of the pytest process that ran it (that process, its fork server and the workers forked from
it, and every subprocess reaped meanwhile), per xdist worker; summed per test file (the .toml
files of a scenario family as one row).

    python tools/suite_cpu.py [--out DIR] [--top N] [--compiles] [-- PYTEST ARGS]
    python tools/suite_cpu.py --report DIR [--top N]       # the tables again

PYTEST ARGS default to ``-n 2 --dist loadfile``: the whole suite in one session. CI runs it
in two (.ci/run): the README's ``-n 2 --dist loadfile -m "not slow"``, then ``-m slow``; pass
those to measure each part.

Runs ``python -m pytest -p suite_cpu PYTEST ARGS`` from the repository root with tools/ on
PYTHONPATH (each xdist worker loads this plugin too; it records only with SUITE_CPU_DIR set),
then prints the run's wall and the CPU of its whole process tree, the load average before and
after (the 2-core machine is shared: wall depends on everyone's load, CPU much less), the CPU
of each worker and when it finished (how well --dist loadfile balanced them), and the files by
CPU. An item's CPU misses only a process that started and ended within it while its parent was
no process of this tree (none here: the fork server reaps its workers, pytest its subprocesses).

``--compiles``: every process of the run also logs each DSL lowering with a hash of its MLIR
(tools/suite_cpu_hook/sitecustomize.py, on PYTHONPATH for this run only; hashing adds a few
percent of CPU), each attributed to the item its worker ran then, and the table says how many
lowerings repeat an earlier MLIR and what they cost: within one file, across files, on more
than one worker (what a compile cache shared by test files or by workers could save at most).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIR_VAR = "SUITE_CPU_DIR"
COMPILES_VAR = "SUITE_CPU_COMPILES"  # read by tools/suite_cpu_hook/sitecustomize.py
COMPILES = "compiles.jsonl"


# ---- the pytest plugin (``-p suite_cpu``) ----------------------------------------------------
def _tree_cpu() -> float:
    """CPU seconds of this process and every live descendant, each with its reaped children."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # ended meanwhile: its parent's children_* has it once reaped
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Around setup, call and teardown, in the process that runs the item (an xdist worker, not
    the controller, whose tree holds the workers)."""
    out = os.environ.get(DIR_VAR)
    t0, cpu0 = time.time(), _tree_cpu() if out else 0.0
    yield
    if not out:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    rec = {
        "id": item.nodeid,
        "worker": worker,
        "t0": t0,
        "t1": time.time(),
        "cpu": _tree_cpu() - cpu0,
    }
    with open(Path(out) / f"{worker}.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")


# ---- the tables ------------------------------------------------------------------------------
def file_of(nodeid: str) -> str:
    """The row an item counts toward: its test file, or its scenario family's folder."""
    path = nodeid.split("::")[0]
    if path.endswith(".toml"):
        return path.rsplit("/", 1)[0] + "/*.toml"
    return path


def read(out: Path) -> list[dict]:
    """The items' records (one file per worker)."""
    return [
        json.loads(line)
        for p in sorted(out.glob("*.jsonl"))
        if p.name != COMPILES
        for line in p.open()
    ]


def read_compiles(out: Path) -> list[dict] | None:
    path = out / COMPILES
    return [json.loads(line) for line in path.open()] if path.exists() else None


def summarize(items: list[dict]) -> dict:
    """Per worker: items, CPU, seconds from the first item's start to its last item's end;
    per file: items, CPU, wall (the sum of its items'), the worker(s) that ran it."""
    start = min(i["t0"] for i in items)
    workers: dict[str, dict] = {}
    files: dict[str, dict] = defaultdict(lambda: {"items": 0, "cpu": 0.0, "wall": 0.0})
    for i in items:
        w = workers.setdefault(i["worker"], {"items": 0, "cpu": 0.0, "end_s": 0.0})
        w["items"] += 1
        w["cpu"] += i["cpu"]
        w["end_s"] = max(w["end_s"], i["t1"] - start)
        f = files[file_of(i["id"])]
        f["items"] += 1
        f["cpu"] += i["cpu"]
        f["wall"] += i["t1"] - i["t0"]
        f.setdefault("workers", set()).add(i["worker"])
    for f in files.values():
        f["workers"] = sorted(f["workers"])
    return {
        "items": len(items),
        "cpu": sum(i["cpu"] for i in items),
        "workers": dict(sorted(workers.items())),
        "files": dict(sorted(files.items(), key=lambda kv: -kv[1]["cpu"])),
    }


def repeats(items: list[dict], compiles: list[dict]) -> dict:
    """Each lowering attributed to the item its worker was running then (the fork server's
    workers and subprocesses inherit the worker's name). A repeat is a lowering of an MLIR
    lowered before: after one in the same file (a cache per test module would have it),
    after some only in other files (what a cache shared by the files could save), on a
    worker that had not lowered it yet (what only a cache shared by the workers could save).
    Counts and CPU seconds of each."""
    by_worker: dict[str, list[dict]] = defaultdict(list)
    for i in items:
        by_worker[i["worker"]].append(i)

    def owner(c: dict) -> str:
        for i in by_worker.get(c["worker"], ()):
            if i["t0"] <= c["t0"] <= i["t1"]:
                return i["id"]
        return "(outside any item)"

    counts = {k: [0, 0.0] for k in ("all", "same_file", "other_files", "other_worker")}
    files: dict[str, set[str]] = defaultdict(set)
    workers: dict[str, set[str]] = defaultdict(set)
    lowered: dict[str, list[float]] = defaultdict(list)
    for c in sorted(compiles, key=lambda c: c["t0"]):
        h, f, w = c["hash"], file_of(owner(c)), c["worker"]
        if lowered[h]:
            kinds = ["all", "same_file" if f in files[h] else "other_files"]
            kinds += [] if w in workers[h] else ["other_worker"]
            for k in kinds:
                counts[k][0] += 1
                counts[k][1] += c["cpu"]
        files[h].add(f)
        workers[h].add(w)
        lowered[h].append(c["cpu"])
    top = [
        (sum(cpus[1:]), len(cpus), sorted(files[h])) for h, cpus in lowered.items() if len(cpus) > 1
    ]
    return {
        "lowerings": len(compiles),
        "cpu": sum(c["cpu"] for c in compiles),
        "distinct": len(lowered),
        "repeats": {k: (n, cpu) for k, (n, cpu) in counts.items()},
        "top": sorted(top, key=lambda t: -t[0]),
    }


def render_repeats(r: dict, top: int = 10) -> str:
    lines = [
        f"{r['lowerings']} DSL lowerings ({r['cpu']:.1f} s of CPU), {r['distinct']} distinct MLIR"
    ]
    for key, label in (
        ("all", "repeat an earlier MLIR"),
        ("same_file", "... after one in the same file"),
        ("other_files", "... after some in other files only"),
        ("other_worker", "... on a worker that had not lowered it"),
    ):
        n, cpu = r["repeats"][key]
        lines.append(f"  {n:5d} {label} ({cpu:.1f} s)")
    for cpu, count, files in r["top"][:top]:
        lines.append(f"  {cpu:6.2f} s  x{count}  {', '.join(files)}")
    return "\n".join(lines)


def render(s: dict, top: int = 40) -> str:
    lines = [f"{s['items']} items, {s['cpu']:.1f} s of CPU in their process trees"]
    for name, w in s["workers"].items():
        lines.append(
            f"  worker {name}: {w['items']} items, {w['cpu']:.1f} s CPU, last item ended at "
            f"{w['end_s']:.1f} s"
        )
    lines.append(f"{'CPU s':>8} {'wall s':>8} {'items':>6}  file (worker)")
    for name, f in list(s["files"].items())[:top]:
        lines.append(
            f"{f['cpu']:8.1f} {f['wall']:8.1f} {f['items']:6d}  {name} ({','.join(f['workers'])})"
        )
    return "\n".join(lines)


# ---- the command -----------------------------------------------------------------------------
def run(out: Path, pytest_args: list[str], compiles: bool = False) -> tuple[int, float, float]:
    """pytest with the plugin: (exit code, wall seconds, CPU seconds of its reaped tree)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.jsonl"):
        old.unlink()
    env = dict(os.environ, **{DIR_VAR: str(out)})
    env.pop(COMPILES_VAR, None)
    paths = [str(ROOT / "tools"), str(ROOT)]
    if compiles:
        env[COMPILES_VAR] = str(out / COMPILES)
        paths.insert(0, str(ROOT / "tools" / "suite_cpu_hook"))
    env["PYTHONPATH"] = os.pathsep.join(
        paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    before = os.times()
    t0 = time.monotonic()
    rc = subprocess.call(
        [sys.executable, "-m", "pytest", "-p", "suite_cpu", *pytest_args], cwd=ROOT, env=env
    )
    after = os.times()
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return rc, time.monotonic() - t0, cpu


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, pytest_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("suite-cpu"), help="the per-worker records")
    ap.add_argument("--report", type=Path, metavar="DIR", help="print the tables of DIR only")
    ap.add_argument("--top", type=int, default=40, help="files shown (default 40)")
    ap.add_argument(
        "--compiles", action="store_true", help="also log every DSL lowering and count repeats"
    )
    a = ap.parse_args(ours)
    if a.report is not None:
        items = read(a.report)
        if not items:
            print(f"no records in {a.report}", file=sys.stderr)
            return 2
        print(render(summarize(items), a.top))
        if (compiles := read_compiles(a.report)) is not None:
            print(render_repeats(repeats(items, compiles), a.top))
        return 0
    load0 = os.getloadavg()
    out = a.out.resolve()
    rc, wall, cpu = run(out, pytest_args or ["-n", "2", "--dist", "loadfile"], a.compiles)
    load1 = os.getloadavg()
    items = read(out)
    if items:
        print(render(summarize(items), a.top))
        if a.compiles:
            print(render_repeats(repeats(items, read_compiles(out) or []), a.top))
    print(
        f"pytest exit {rc}: {wall:.1f} s wall, {cpu:.1f} s CPU (whole tree); load average "
        f"before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, after {load1[0]:.2f} "
        f"{load1[1]:.2f} {load1[2]:.2f} ({os.cpu_count()} CPUs)"
    )
    return rc


if __name__ == "__main__":
    sys.exit(main())
