"""Capture GPU coredumps of hung and crashing scenarios, and what cuda-gdb says about them.

Run on a GPU machine from the repository root (PYTHONPATH=.):

    python tools/capture_coredumps.py --out DIR [--budget-s 200] [SCENARIO.toml[:flags] ...]

For each scenario, probes off and line info on: the worker runs in a fresh process with
user-triggered coredumps enabled (and coredump on exception); once the kernel has been running
``--settle-s`` without finishing, the tool writes the coredump pipe and times how long the core
takes to appear and be complete. A crash writes its core by itself. Then ``cuda-gdb -batch``
reads the core twice: pass 1 lists kernels, SMs, every warp and the thread summary; pass 2
focuses one or two warps per distinct PC (bt, x/i around the PC, lanes, registers) and
disassembles the kernel. The cubin the worker compiled (its SASS via nvdisasm / cuobjdump) and
the trace-time wait-site table (cutedebug.instrument.waitsites, in events.jsonl) are kept beside,
so the PC -> site mapping can be designed and tested offline.

Everything small goes into DIR/capture.tar.gz; the first hang core and the first crash core are
kept xz-compressed inside it. Prints a table: scenario, time to dump, core size, cuda-gdb secs.
A scenario flag ``skip_abort`` adds it to CUDA_COREDUMP_GENERATION_FLAGS.
"""

from __future__ import annotations

import argparse
import glob
import json
import lzma
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cutedebug.engine import runner, scenario

DEFAULT = [
    "scenarios/tma_stream/wrong_expect_tx_plus.toml",
    "scenarios/minimal/oob_store.toml:skip_abort",
    "scenarios/bisect/flag_spin_never_set.toml",
    "scenarios/bisect/flag_spin_barrier_threads_plus.toml",
    "scenarios/bisect/tma_stream_early_exit_consumer.toml",
    "scenarios/bisect/tma_stream_early_exit_producer.toml",
    "scenarios/sm90_gemm/wrong_barrier_threads_plus.toml",
    "scenarios/cluster_reduce/wrong_expect_tx_plus.toml",
    "scenarios/tma_stream/missing_phase_flip_producer.toml:skip_abort",
    "scenarios/sm90_gemm/wrong_expect_tx_plus_cluster.toml",
    "scenarios/tma_stream/wrong_expect_tx_plus.toml:skip_abort",
    "scenarios/minimal/spin_hang.toml",
]
SKIP_FLAGS = "skip_global_memory,skip_shared_memory,skip_local_memory"
GDB_TIMEOUT_S = 60.0


def find_tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    hits = sorted(glob.glob(f"/usr/local/cuda*/bin/{name}"), reverse=True)
    return hits[0] if hits else None


def read_events(path: Path) -> list[dict]:
    out = []
    try:
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    except FileNotFoundError:
        pass
    return out


def no_core_limit() -> None:
    # An abort after the GPU dump must not also write a CPU core of the whole interpreter.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def wait_core(d: Path, pid: int, proc: subprocess.Popen, limit_s: float) -> dict:
    """Wait until the core is complete: the process exited (abort after the dump), or the file
    stopped growing for 0.5 s. Returns timings relative to the call."""
    t0 = time.monotonic()
    first = None
    last_size, stable_since = -1, None
    res: dict = {}
    while time.monotonic() - t0 < limit_s:
        cores = list(d.glob(f"core.{pid}*"))
        now = time.monotonic()
        if cores:
            size = sum(c.stat().st_size for c in cores)
            if first is None:
                first = now
                res["core_first_seen_s"] = round(now - t0, 3)
            if size != last_size:
                last_size, stable_since = size, now
        if proc.poll() is not None:
            res.setdefault("exit_s", round(now - t0, 3))
            res["returncode"] = proc.returncode
            if cores or now - t0 - res["exit_s"] > 2.0:
                break
        if first is not None and last_size > 0 and now - stable_since >= 0.5:
            res["core_stable_s"] = round(stable_since - t0, 3)
            break
        time.sleep(0.02)
    cores = list(d.glob(f"core.{pid}*"))
    res["core_files"] = [c.name for c in cores]
    res["core_bytes"] = sum(c.stat().st_size for c in cores)
    res["waited_s"] = round(time.monotonic() - t0, 3)
    return res


def run_worker(spec: str, out: Path, settle_s: float) -> dict:
    path, _, flags = spec.partition(":")
    sc = scenario.load(path)
    name = sc.id.replace("/", "__") + (f"__{flags}" if flags else "")
    d = (out / name).resolve()
    if d.exists():
        shutil.rmtree(d)
    req, events_path, log_path = runner.write_request(
        d, sc, lineinfo=True, cubin_path=str(d / "kernel.cubin"), wait_sites=True
    )
    gen_flags = SKIP_FLAGS + ("," + flags if flags else "")
    tag = os.urandom(8).hex()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(runner.REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.update(
        {
            runner.TAG_VAR: tag,
            "PYTHONUNBUFFERED": "1",
            "CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1",
            "CUDA_ENABLE_COREDUMP_ON_EXCEPTION": "1",
            "CUDA_ENABLE_CPU_COREDUMP_ON_EXCEPTION": "0",
            "CUDA_COREDUMP_SHOW_PROGRESS": "1",
            "CUDA_COREDUMP_PIPE": str(d / "pipe.%p"),
            "CUDA_COREDUMP_FILE": str(d / "core.%p.nvcudmp"),
            "CUDA_COREDUMP_GENERATION_FLAGS": gen_flags,
        }
    )
    rec: dict = {
        "scenario": sc.id,
        "spec": spec,
        "dir": name,
        "flags": gen_flags,
        "expect": sc.expect.verdict,
    }
    t_start = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            runner.worker_argv(req),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            cwd=str(runner.REPO_ROOT),
        )
    rec["pid"] = proc.pid
    try:
        launched_t = None
        while time.monotonic() - t_start < 180:
            evs = {e["event"]: e for e in read_events(events_path)}
            if launched_t is None and "launched" in evs:
                launched_t = time.monotonic()
                rec["launch_after_s"] = round(launched_t - t_start, 3)
            ended = proc.poll() is not None or any(
                k in evs
                for k in (
                    "synced",
                    "cuda_error",
                    "done",
                    "harness_error",
                    "compile_error",
                    "unsupported",
                )
            )
            if ended or list(d.glob(f"core.{proc.pid}*")):
                rec["mode"] = "ended_by_itself"
                rec["ended_after_launch_s"] = (
                    round(time.monotonic() - launched_t, 3) if launched_t else None
                )
                rec["dump"] = wait_core(d, proc.pid, proc, 60.0)
                break
            if launched_t is not None and time.monotonic() - launched_t >= settle_s:
                rec["mode"] = "user_trigger"
                pipe = d / f"pipe.{proc.pid}"
                t0 = time.monotonic()
                try:
                    fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
                    os.write(fd, b"1")
                    os.close(fd)
                    rec["pipe_write_s"] = round(time.monotonic() - t0, 4)
                except OSError as e:
                    rec["pipe_error"] = f"{type(e).__name__}: {e}"
                    rec["pipe_exists"] = pipe.exists()
                rec["dump"] = wait_core(d, proc.pid, proc, 2.0 if "pipe_error" in rec else 20.0)
                break
            time.sleep(0.02)
        else:
            rec["mode"] = "no_launch_in_180s"
    finally:
        for kill in (os.killpg, os.kill):
            try:
                kill(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        rec["swept"] = runner.sweep(tag)
        rec["returncode_final"] = proc.returncode
    evs = read_events(events_path)
    rec["events"] = [e["event"] for e in evs]
    for e in evs:
        if e["event"] in ("cuda_error", "harness_error", "compile_error", "unsupported"):
            rec[e["event"]] = {k: v for k, v in e.items() if k not in ("traceback",)}
    rec["total_s"] = round(time.monotonic() - t_start, 3)
    return rec


def gdb(cuda_gdb: str, core: Path, commands: list[str], out: Path) -> dict:
    argv = [
        cuda_gdb,
        "-nx",
        "-q",
        "-batch",
        "-ex",
        "set pagination off",
        "-ex",
        "set width 0",
        "-ex",
        "set confirm off",
        "-ex",
        f"target cudacore {core}",
    ]
    for c in commands:
        argv += ["-ex", c]
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=GDB_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        text, rc = p.stdout + "\n=== stderr ===\n" + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = f"TIMEOUT after {GDB_TIMEOUT_S}s\n{e.stdout or ''}", None
    secs = round(time.monotonic() - t0, 3)
    out.write_text("$ " + " ".join(repr(a) for a in argv) + f"\n# rc={rc} secs={secs}\n" + text)
    return {"secs": secs, "rc": rc, "bytes": len(text)}


WARP_ROW = re.compile(
    r"^\s*\*?\s*(\d+)\s+(0x[0-9a-f]{8})\s+(0x[0-9a-f]{8})\s+(0x[0-9a-f]+)\s+"
    r"(\d+)\s+\((\d+),(\d+),(\d+)\)\s+\((\d+),(\d+),(\d+)\)"
)
SM_HEADER = re.compile(r"^\s*Device (\d+) SM (\d+)\s*$")


def representatives(text: str, per_pc: int = 2) -> list[tuple[int, int, int, int, str]]:
    """(dev, sm, warp, first active lane, pc) of up to ``per_pc`` warps per distinct PC."""
    dev = sm = None
    by_pc: dict[str, list] = {}
    for line in text.splitlines():
        m = SM_HEADER.match(line)
        if m:
            dev, sm = int(m.group(1)), int(m.group(2))
            continue
        m = WARP_ROW.match(line)
        if m and dev is not None:
            mask = int(m.group(2), 16)
            lane = (mask & -mask).bit_length() - 1 if mask else 0
            by_pc.setdefault(m.group(4), []).append((dev, sm, int(m.group(1)), lane, m.group(4)))
    reps = []
    for _pc, ws in sorted(by_pc.items()):
        if per_pc > 2:
            reps += ws[:per_pc]
        else:
            reps += ws[:1] + (ws[-1:] if per_pc > 1 and len(ws) > 1 else [])
    return reps


def analyse(rec: dict, out: Path, tools: dict) -> dict:
    d = out / rec["dir"]
    cores = sorted(d.glob("core.*"))
    res: dict = {}
    cubin = d / "kernel.cubin"
    if cubin.exists():
        if tools.get("nvdisasm"):
            t0 = time.monotonic()
            p = subprocess.run(
                [tools["nvdisasm"], "-g", "-c", str(cubin)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            (d / "sass_nvdisasm.txt").write_text(p.stdout + p.stderr)
            res["nvdisasm_s"] = round(time.monotonic() - t0, 3)
        if tools.get("cuobjdump"):
            p = subprocess.run(
                [tools["cuobjdump"], "-sass", str(cubin)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            (d / "sass_cuobjdump.txt").write_text(p.stdout + p.stderr)
    if not cores or not tools.get("cuda-gdb"):
        res["gdb"] = "no core" if not cores else "no cuda-gdb"
        return res
    core = cores[0]
    res["pass1"] = gdb(
        tools["cuda-gdb"],
        core,
        [
            "info cuda devices",
            "info cuda kernels",
            "info cuda sms",
            "info cuda warps device 0",
            "info cuda warps sm all",
            "info cuda threads",
            "echo \\n=== python\\n",
            "python print('PYOK', gdb.VERSION)",
        ],
        d / "gdb_pass1.txt",
    )
    reps = representatives((d / "gdb_pass1.txt").read_text())
    res["representatives"] = len(reps)
    cmds: list[str] = []
    for i, (dev, sm, wp, ln, _pc) in enumerate(reps[:24]):
        cmds += [
            f"echo \\n=== rep {dev} {sm} {wp} {ln}\\n",
            f"cuda device {dev} sm {sm} warp {wp} lane {ln}",
            "cuda kernel block thread",
            "info cuda lanes",
            "bt",
            "x/16i $pc-0x80",
            "info registers",
            "p/x $R0",
            "p/x $UR4",
            "p $pc",
        ]
        if i == 0:
            cmds += ["echo \\n=== disassemble\\n", "disassemble"]
    if not cmds:  # the warps table did not parse: at least the default focus
        cmds = [
            "cuda kernel block thread",
            "info cuda lanes",
            "bt",
            "x/16i $pc-0x80",
            "info registers",
            "disassemble",
        ]
    if cmds:
        res["pass2"] = gdb(tools["cuda-gdb"], core, cmds, d / "gdb_pass2.txt")
    # Pass 3: the cost of visiting every warp (focus, the instruction, its registers).
    everyone = representatives((d / "gdb_pass1.txt").read_text(), per_pc=10**6)[:64]
    cmds = []
    for dev, sm, wp, ln, _pc in everyone:
        cmds += [
            f"echo \\n=== warp {dev} {sm} {wp} {ln}\\n",
            f"cuda device {dev} sm {sm} warp {wp} lane {ln}",
            "x/1i $pc",
            "info registers",
        ]
    if cmds:
        res["pass3"] = gdb(tools["cuda-gdb"], core, cmds, d / "gdb_pass3.txt")
        res["pass3_warps"] = len(everyone)
    return res


def _small(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    # The DSL's own dump of the PTX/cubin duplicates kernel.ptx / kernel.cubin.
    return None if os.path.basename(info.name).startswith("cutlass___") else info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--settle-s", type=float, default=1.5)
    ap.add_argument(
        "--analysis-s",
        type=float,
        default=45.0,
        help="how long past the budget to wait for cuda-gdb",
    )
    ap.add_argument("specs", nargs="*")
    args = ap.parse_args(argv)
    no_core_limit()  # inherited by every worker
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t_begin = time.monotonic()
    tools = {n: find_tool(n) for n in ("cuda-gdb", "nvdisasm", "cuobjdump")}
    versions = {}
    for n, p in tools.items():
        if p:
            v = subprocess.run([p, "--version"], capture_output=True, text=True, timeout=60)
            versions[n] = (p, (v.stdout or v.stderr).strip().splitlines()[-1:])
    print("tools:", json.dumps(versions), flush=True)
    records, futures = [], []
    pool = ThreadPoolExecutor(max_workers=4)
    for spec in args.specs or DEFAULT:
        if time.monotonic() - t_begin > args.budget_s:
            records.append({"spec": spec, "skipped": "budget"})
            continue
        rec = run_worker(spec, out, args.settle_s)
        records.append(rec)
        futures.append((rec, pool.submit(analyse, rec, out, tools)))
        dump = rec.get("dump", {})
        print(
            f"{rec['scenario']} {rec.get('mode')} core={dump.get('core_bytes')} "
            f"dump={dump} total={rec['total_s']}s",
            flush=True,
        )
    hard_deadline = t_begin + args.budget_s + args.analysis_s
    for rec, fut in futures:
        try:
            rec["analysis"] = fut.result(timeout=max(0.1, hard_deadline - time.monotonic()))
        except Exception as e:  # one bad or slow capture must not lose the others
            rec["analysis"] = {"error": f"{type(e).__name__}: {e}"}
    pool.shutdown(wait=False, cancel_futures=True)
    health = runner.health_check()
    kept: dict[str, str] = {}
    for rec in records:
        if "dir" not in rec:
            continue
        d = out / rec["dir"]
        for core in sorted(d.glob("core.*")):
            kind = "crash" if rec.get("mode") == "ended_by_itself" else "hang"
            if kind not in kept and core.stat().st_size < 8 << 20:
                with open(core, "rb") as f, lzma.open(d / (core.name + ".xz"), "wb", preset=9) as g:
                    shutil.copyfileobj(f, g)
                kept[kind] = str(d / (core.name + ".xz"))
            core.unlink()
        for p in d.glob("pipe.*"):
            p.unlink()
    summary = {
        "tools": versions,
        "health": health,
        "records": records,
        "kept_cores": kept,
        "wall_s": round(time.monotonic() - t_begin, 3),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    with tarfile.open(out / "capture.tar.gz", "w:gz") as tar:
        for rec in records:
            if "dir" in rec:
                tar.add(out / rec["dir"], arcname=rec["dir"], filter=_small)
        tar.add(out / "summary.json", arcname="summary.json")
    print(f"\n{'scenario':58} {'mode':16} {'dump s':>7} {'core KB':>8} {'gdb1 s':>7} {'gdb2 s':>7}")
    for rec in records:
        if "dir" not in rec:
            print(f"{rec['spec']:58} skipped ({rec.get('skipped')})")
            continue
        dump, an = rec.get("dump", {}), rec.get("analysis", {})
        t_dump = (
            dump.get("exit_s")
            if rec.get("mode") == "user_trigger" and "exit_s" in dump
            else dump.get("core_stable_s", dump.get("exit_s"))
        )
        print(
            f"{rec['dir'][:58]:58} {str(rec.get('mode'))[:16]:16} {str(t_dump):>7} "
            f"{dump.get('core_bytes', 0) / 1024:8.0f} "
            f"{str(an.get('pass1', {}).get('secs')):>7} "
            f"{str(an.get('pass2', {}).get('secs')):>7}"
        )
    print(f"health after all dumps: {health}")
    print(
        f"archive: {out / 'capture.tar.gz'} "
        f"({(out / 'capture.tar.gz').stat().st_size / 1024:.0f} KB); kept cores: {kept}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
