"""The scale-out evidence run on a GPU machine (issues 22-24), every step timed, one summary.

    python3 tools/gpu_scale_run.py --out OUT [--dir scenarios] [--hang SCENARIO] [--skip-single]

Steps (each a fresh process, as a user would type it; wall times by this script's clock):
1. ``cutedebug run HANG`` cold: wall time and the report's seconds by phase (spawn, imports,
   compile, launch, exit, ...).
2. ``cutedebug triage DIR`` on one GPU, one process (the reference matrix), unless
   ``--skip-single``.
3. ``cutedebug triage DIR --gpus all``: one queue per visible GPU.
4. ``pytest -n <GPUs> --dist worksteal DIR --junitxml``: one xdist worker per GPU.
5. Verdicts of 3 and 4 against 2 (tools/compare_verdicts.py: a difference is fine only for a
   timing-dependent scenario whose verdicts are both accepted), the speed-up of 3 and 4 over 2,
   GPU health and processes of ours left after each step.

Exit 0 when every comparison holds and nothing was left behind, 1 otherwise. Without a GPU the
runs are "not run" and the comparison is empty: a dry run of the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import compare_verdicts  # noqa: E402

HANG = "scenarios/tma_stream/wrong_expect_tx_plus.toml"


def ours_left(grace_s: float = 3.0) -> list[str]:
    """cutedebug processes of this checkout still running (other than this script and the
    shells that started it, whose command line may name cutedebug too), each as "PID ARGS",
    after a short grace for the ones exiting right now: the orphan count."""
    import psutil

    mine = {os.getpid()} | {p.pid for p in psutil.Process().parents()}
    deadline = time.monotonic() + grace_s
    while True:
        left = []
        for p in psutil.process_iter(["pid", "cmdline", "cwd"]):
            line = " ".join(p.info["cmdline"] or [])  # whole, whatever the terminal's width
            if "cutedebug" not in line or "gpu_scale_run" in line or p.info["pid"] in mine:
                continue
            if (p.info["cwd"] or "").startswith(str(ROOT)):  # None: gone, or not ours to read
                left.append(f"{p.info['pid']} {line}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def step(name: str, argv: list[str], log: Path, timeout_s: float) -> dict:
    """Run argv from the repository root, output to ``log``; wall time and exit status."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    t0 = time.monotonic()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(
                argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env, timeout=timeout_s
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.monotonic() - t0
    left = ours_left()
    print(f"{name}: exit {rc}, {wall:.1f} s wall, processes of ours left: {len(left)}", flush=True)
    for ln in left[:5]:
        print(f"  left: {ln[:160]}")
    return {"name": name, "rc": rc, "wall_s": round(wall, 2), "left": left}


def visible_gpu_count() -> int:
    from cutedebug.engine import gpus

    return len(gpus.visible_gpus())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--dir", default="scenarios", help="scenario folder (default scenarios)")
    ap.add_argument("--hang", default=HANG, help=f"probed HANG scenario (default {HANG})")
    ap.add_argument(
        "--skip-single",
        action="store_true",
        help="no single-process triage (compare with --reference instead)",
    )
    ap.add_argument("--reference", type=Path, help="an earlier matrix.json to compare with")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per step (s)")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    n = max(1, visible_gpu_count())
    print(f"visible GPUs: {n}; scenarios: {args.dir}", flush=True)
    results = []

    # 1. cold run of a probed hang
    runs = out / "cold-run"
    r = step(
        "cold cutedebug run",
        [py, "-m", "cutedebug", "run", args.hang, "--runs-dir", str(runs)],
        out / "cold-run.log",
        args.timeout,
    )
    reports = sorted(runs.glob("*/report.json"))
    if reports:
        rep = json.loads(reports[0].read_text())
        r["verdict"], r["timings"] = rep["verdict"], rep["timings"]
        print(f"  verdict {rep['verdict']}; seconds by phase: {rep['timings']}")
    results.append(r)

    # 2-4. the matrix three ways
    single = out / "triage-single"
    if not args.skip_single:
        results.append(
            step(
                "triage, one process",
                [py, "-m", "cutedebug", "triage", args.dir, "--out", str(single)],
                out / "triage-single.log",
                args.timeout,
            )
        )
    multi = out / "triage-gpus-all"
    results.append(
        step(
            "triage --gpus all",
            [py, "-m", "cutedebug", "triage", args.dir, "--out", str(multi), "--gpus", "all"],
            out / "triage-gpus-all.log",
            args.timeout,
        )
    )
    junit = out / "pytest-xdist.xml"
    results.append(
        step(
            f"pytest -n {n}",
            [
                py,
                "-m",
                "pytest",
                "-n",
                str(n),
                "--dist",
                "worksteal",
                "-p",
                "no:cacheprovider",
                "-q",
                args.dir,
                f"--junitxml={junit}",
                f"--cutedebug-runs-dir={out / 'pytest-runs'}",
            ],
            out / "pytest-xdist.log",
            args.timeout,
        )
    )

    # 5. comparisons
    reference = args.reference or (None if args.skip_single else single / "matrix.json")
    ok = all(not r["left"] for r in results)
    if reference is not None:
        for other in (multi, junit):
            print(f"verdicts: {reference} vs {other}:", flush=True)
            ok &= compare_verdicts.main([str(reference), str(other)]) == 0
    by = {r["name"]: r for r in results}
    base = by.get("triage, one process")
    if base:
        for name in ("triage --gpus all", f"pytest -n {n}"):
            print(
                f"speed-up of {name} over one process: "
                f"{base['wall_s'] / max(by[name]['wall_s'], 1e-9):.2f}x"
            )
    m = multi / "matrix.json"
    if m.exists():
        facts = json.loads(m.read_text()).get("facts") or {}
        print(
            f"triage --gpus all: GPU health {facts.get('gpu_health')}; per GPU "
            f"{facts.get('gpus')}; left {facts.get('processes_left')}"
        )
        health = facts.get("gpu_health")
        ok &= health is None or bool(health.get("healthy"))
    (out / "summary.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"summary: {out / 'summary.json'}; {'OK' if ok else 'NOT OK'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
