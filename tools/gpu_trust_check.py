"""The lifeline on a real GPU hang: kill or interrupt `cutedebug run` while the kernel spins.

    python tools/gpu_trust_check.py [--out DIR]

For each attack, `cutedebug run scenarios/minimal/spin_hang.toml --no-probes --deadline 60`
(every thread spins on an mbarrier nobody arrives on; without probes only the watchdog can end
it) is started with a known session tag in its environment (every descendant inherits it);
once the worker reports "launched" (the kernel is running) the harness is attacked:

- sigkill-direct: SIGKILL of the harness (a fresh worker: PDEATHSIG + the keeper)
- sigkill-forked: the same with two scenarios in a row, so the worker is forked from the fork
  server (the server dies with the harness, the worker with the server)
- sigint-direct: Ctrl-C; the harness must end within 2 s

Printed per attack: seconds to the kill / exit, processes still carrying the tag after 0.5,
1, 2 and 5 s (0 expected), and a GPU health check afterwards (the GPU must still be usable).
One JSON line per attack, and a table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cutedebug.engine import lifeline, runner  # noqa: E402

SCEN = ROOT / "scenarios" / "minimal" / "spin_hang.toml"


def launched(runs: Path) -> bool:
    for ev in runs.rglob("events.jsonl"):
        try:
            if '"event": "launched"' in ev.read_text():
                return True
        except OSError:
            pass
    return False


def attack(name: str, out: Path) -> dict:
    runs = out / name
    runs.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex
    env = dict(os.environ, **{lifeline.SESSION_VAR: tag})
    targets = [str(SCEN)] * (2 if name == "sigkill-forked" else 1)
    argv = [
        sys.executable,
        "-m",
        "cutedebug",
        "run",
        *targets,
        "--no-probes",
        "--deadline",
        "60",
        "--runs-dir",
        str(runs),
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    while not launched(runs):
        if proc.poll() is not None or time.monotonic() - t0 > 120:
            return {
                "attack": name,
                "error": "the kernel never launched",
                "output": proc.stdout.read().decode(errors="replace")[-2000:],
            }
        time.sleep(0.05)
    time.sleep(1.0)  # the kernel is spinning now
    before = [p.pid for p in lifeline.processes(tag)]
    t_attack = time.monotonic()
    proc.send_signal(signal.SIGINT if name.startswith("sigint") else signal.SIGKILL)
    proc.wait(timeout=60)
    exit_s = round(time.monotonic() - t_attack, 3)
    left = {}
    for at in (0.5, 1.0, 2.0, 5.0):
        time.sleep(max(0.0, t_attack + at - time.monotonic()))
        left[f"{at:g}s"] = [p.pid for p in lifeline.processes(tag)]
    health = runner.health_check()
    res = {
        "attack": name,
        "processes_before": len(before),
        "harness_exit_s": exit_s,
        "returncode": proc.returncode,
        "left": {k: len(v) for k, v in left.items()},
        "left_pids_5s": left["5s"],
        "gpu_healthy_after": health.get("healthy"),
        "health": health,
        "traceback": b"Traceback" in proc.stdout.read(),
    }
    lifeline.sweep(tag)  # never leave anything on the shared GPU
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/gpu_trust_check")
    ap.add_argument("--attacks", default="sigkill-direct,sigkill-forked,sigint-direct")
    args = ap.parse_args()
    out = Path(args.out)
    rows = []
    for name in args.attacks.split(","):
        r = attack(name, out)
        print(json.dumps(r), flush=True)
        rows.append(r)
    print(
        "\n| attack | processes before | harness exit (s) | left at 0.5/1/2/5 s | GPU healthy after |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['attack']} | error: {r['error']} | | | |")
            continue
        left = "/".join(str(r["left"][k]) for k in ("0.5s", "1s", "2s", "5s"))
        print(
            f"| {r['attack']} | {r['processes_before']} | {r['harness_exit_s']} | {left} | "
            f"{r['gpu_healthy_after']} |"
        )
    bad = [r for r in rows if "error" in r or r["left"]["5s"] or not r["gpu_healthy_after"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
