"""A stand-in for cutedebug.engine.worker that misbehaves on purpose, for watchdog tests.

usage: python fake_worker.py EVENTS_PATH BEHAVIOUR [PIDFILE]
"""

import json
import os
import signal
import subprocess
import sys
import time

events_path, behaviour = sys.argv[1], sys.argv[2]
pidfile = sys.argv[3] if len(sys.argv) > 3 else None


def emit(name, **kw):
    with open(events_path, "a") as f:
        f.write(json.dumps({"event": name, "t": 0.0, **kw}) + "\n")


def phases(*names):
    for n in names:
        emit(n)


if behaviour == "pass":
    phases("started", "imported", "compiling", "compiled", "launched", "synced")
    emit("checked", ok=True, digest="abc")
    emit("done")
elif behaviour == "sleep_forever":
    phases("started", "imported", "compiling", "compiled", "launched")
    time.sleep(10_000)
elif behaviour == "busy_loop":
    phases("started", "imported", "compiling", "compiled", "launched")
    while True:
        pass
elif behaviour == "ignore_sigterm":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    phases("started", "imported", "compiling", "compiled", "launched")
    while True:
        time.sleep(0.01)
elif behaviour == "grandchildren":
    # Grandchildren that start sessions of their own escape the child's process group.
    kids = [
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(10000)"], start_new_session=True
        )
        for _ in range(3)
    ]
    with open(pidfile, "w") as f:
        f.write(" ".join(str(k.pid) for k in kids))
    phases("started", "imported", "compiling", "compiled", "launched")
    time.sleep(10_000)
elif behaviour == "grandchildren_then_exit":
    kids = [
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(10000)"], start_new_session=True
        )
        for _ in range(2)
    ]
    with open(pidfile, "w") as f:
        f.write(" ".join(str(k.pid) for k in kids))
    phases("started", "imported", "compiling", "compiled", "launched", "synced")
    emit("checked", ok=True, digest="abc")
    emit("done")
elif behaviour == "hostile_tree":
    # The worst a kernel can leave: grandchildren that start sessions of their own and ignore
    # SIGTERM, exec'd ones and a fork without exec (its /proc environ is the parent's block).
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(10000)"
    kids = [
        subprocess.Popen([sys.executable, "-c", code], start_new_session=True).pid for _ in range(2)
    ]
    pid = os.fork()
    if pid == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(10_000)
        os._exit(0)
    kids.append(pid)
    with open(pidfile, "w") as f:
        f.write(" ".join(str(k) for k in kids))
    phases("started", "imported", "compiling", "compiled", "launched")
    time.sleep(10_000)
elif behaviour == "huge_event_line":
    phases("started", "imported", "compiling", "compiled", "launched", "synced")
    emit("noise", text="y" * (10 << 20))
    emit("checked", ok=True, digest="abc")
    emit("done")
elif behaviour == "silent_forever":
    time.sleep(10_000)
elif behaviour == "segfault_compiling":
    phases("started", "imported", "compiling")
    os.kill(os.getpid(), signal.SIGSEGV)
elif behaviour == "segfault_running":
    phases("started", "imported", "compiling", "compiled", "launched")
    os.kill(os.getpid(), signal.SIGSEGV)
elif behaviour == "exit3":
    emit("started")
    sys.exit(3)
elif behaviour == "print_50mb":
    phases("started", "imported", "compiling", "compiled", "launched")
    line = "x" * 1023 + "\n"
    for _ in range(50 * 1024):
        sys.stdout.write(line)
    sys.stdout.flush()
    emit("synced")
    emit("checked", ok=True, digest="abc")
    emit("done")
elif behaviour == "malformed_json":
    emit("started")
    with open(events_path, "a") as f:
        f.write('{"event": "imported", oops\n')
    sys.exit(1)
elif behaviour == "stall":
    phases("started", "imported", "compiling", "compiled", "launched")
    for _ in range(5):
        emit("progress", counter=7)
        time.sleep(0.1)
    time.sleep(10_000)
elif behaviour == "progressing":
    phases("started", "imported", "compiling", "compiled", "launched")
    for i in range(30):
        emit("progress", counter=i)
        time.sleep(0.05)
    emit("synced")
    emit("checked", ok=True, digest="abc")
    emit("done")
elif behaviour == "perturbed_seeds":  # 5 launches of 0.6 s each: 3 s, past a 1 s deadline
    phases("started", "imported", "compiling", "compiled")
    for seed in range(5):
        emit("perturb_seed", seed=seed, tag="seed", rules=[])
        emit("launched")
        time.sleep(0.6)
    emit("synced")
    emit("checked", ok=True, digest="abc")
    emit("done")
elif behaviour == "perturbed_hang":  # the third seed hangs
    phases("started", "imported", "compiling", "compiled")
    for seed in range(3):
        emit("perturb_seed", seed=seed, tag="seed", rules=[{"position": 1, "delay_ns": 1000}])
        emit("launched")
        time.sleep(0.5 if seed < 2 else 10_000)
elif behaviour in ("bounded_hang", "bounded_hang_leaves_a_child"):
    # the recorded probed HANG (tests/data/runs/wrong_expect_tx_plus), then the worker's own GPU
    # check, as a worker on the H200 writes them; exits 0 by itself
    recorded = os.path.join(
        os.path.dirname(__file__), "..", "data", "runs", "wrong_expect_tx_plus", "events.jsonl.gz"
    )
    if behaviour == "bounded_hang_leaves_a_child":  # carries the run's tag: swept after exit
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(10000)"], start_new_session=True
        )
    import gzip

    with gzip.open(recorded, "rt") as f:
        lines = f.read().splitlines()
    with open(events_path, "a") as f:
        f.write("\n".join(lines[:-1]) + "\n")  # up to its done
    emit("gpu_check", healthy=True, device="NVIDIA H200", via="worker", secs=0.003)
    emit("done")
else:
    sys.exit(f"unknown behaviour {behaviour}")
