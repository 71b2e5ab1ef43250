"""`cutedebug exec` end to end on CPU-only commands and compile-only kernels.

Each test runs the real command line (`python -m cutedebug exec ...`) on a target script in
tests/exec_targets/ and checks the verdict, the exit status, the report and the process table
against what the script is known to do: hang in Python, exit non-zero, print a CUDA error, die
of a signal, leave a child and a grandchild behind, or compile kernels/tma_stream.py for
sm_90a and print facts read from its PTX (the fault's effect, independently measured).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import recorded_runs
from helpers.exec_results import exec_result

from cutedebug.engine.run_report import ExecReport

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ROOT / "tests" / "exec_targets"


def cutedebug(*args: str, runs: Path, timeout: float = 300) -> tuple[int, str, ExecReport | None]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-m", "cutedebug", "exec", "--runs-dir", str(runs), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(ROOT),
    )
    text = out.stdout + out.stderr
    m = re.search(r"report: (\S+)", out.stdout)
    # the report.json, read as its record (every field checked); None: no report written
    report = (
        ExecReport.from_json(json.loads((Path(m.group(1)).parent / "report.json").read_text()))
        if m
        else None
    )
    return out.returncode, text, report


def line_of(code: str, path: Path = ROOT / "kernels" / "tma_stream.py") -> int:
    """1-based line of the one source line that contains ``code``."""
    hits = [i for i, ln in enumerate(path.read_text().splitlines(), 1) if code in ln]
    assert len(hits) == 1, (code, hits)
    return hits[0]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def target(name: str) -> list[str]:
    return ["--", sys.executable, str(TARGETS / name)]


def test_python_hang_is_killed_at_the_deadline_with_its_stack(tmp_path):
    rc, text, rep = cutedebug("--deadline", "3", *target("hang_python.py"), runs=tmp_path)
    assert rc == 1, text
    assert rep.verdict == "HANG" and rep.killed_by_watchdog == "deadline:3s"
    # faulthandler's dump, taken just before the kill, names the line the loop waits on
    assert "hang_python.py:8 in wait_forever" in rep.reason
    assert 2.9 <= rep.elapsed_s < 8.0  # the watchdog starts its clock at the spawn
    pids = [p.pid for p in rep.processes]
    assert pids and not any(alive(p) for p in pids)
    # no CuTe DSL kernel was traced: nothing to rerun with probes
    assert rep.first_run is None and rep.kernels_traced == 0


def test_nonzero_exit_is_fail_with_the_last_lines(tmp_path):
    rc, text, rep = cutedebug(*target("exits_nonzero.py"), runs=tmp_path)
    assert rc == 1 and rep.verdict == "FAIL" and rep.returncode == 3
    assert "check failed: max abs error 0.25 > 1e-3" in rep.reason
    assert "computing" in rep.evidence["last_lines"]
    assert "check failed: max abs error 0.25" in text  # printed on the terminal too
    rc, _, rep = cutedebug("--expect", "FAIL", *target("exits_nonzero.py"), runs=tmp_path)
    assert rc == 0 and rep.as_expected


def test_cuda_error_in_the_output_is_a_crash_named_like_run(tmp_path):
    rc, text, rep = cutedebug(*target("cuda_error.py"), runs=tmp_path)
    assert rc == 1 and rep.verdict == "CRASH", text
    assert rep.evidence["cuda_error"]["name"] == "cudaErrorIllegalAddress"
    assert "illegal memory access" in rep.reason


def test_death_by_signal_is_a_crash(tmp_path):
    rc, text, rep = cutedebug(
        "--",
        sys.executable,
        "-c",
        "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)",
        runs=tmp_path,
    )
    assert rc == 1 and rep.verdict == "CRASH" and "SIGSEGV" in rep.reason, text


def test_children_and_grandchildren_are_instrumented_and_swept(tmp_path):
    rc, text, rep = cutedebug(*target("forks.py"), runs=tmp_path)
    assert rc == 0 and rep.verdict == "PASS", text
    m = re.search(r"child (\d+) grandchild (\d+)", rep.log_tail)
    child, grandchild = int(m.group(1)), int(m.group(2))
    # the grandchild left the command's process group (its own session): found by the tag
    assert {child, grandchild} <= set(rep.swept_pids)
    assert not alive(child) and not alive(grandchild)
    # every Python interpreter of the tree ran the instrumentation's sitecustomize
    assert {child, grandchild} <= {p.pid for p in rep.processes}


def test_usage_errors_exit_2(tmp_path):
    rc, text, _ = cutedebug(runs=tmp_path)
    assert rc == 2 and "no command given" in text
    rc, text, _ = cutedebug(
        "--fault", "wrong_expect_tx:bytes=3", *target("forks.py"), runs=tmp_path
    )
    assert rc == 2 and "fault.args.bytes" in text and "delta_bytes" in text
    rc, text, _ = cutedebug("--fault", "spin_hang", *target("forks.py"), runs=tmp_path)
    assert rc == 2 and "kernel-level switch" in text
    rc, text, _ = cutedebug("--", "/nonexistent/program", runs=tmp_path)
    assert rc == 2 and "cannot start" in text


@pytest.mark.slow
def test_compiled_kernel_gets_the_fault_and_the_probes(tmp_path):
    """The script compiles tma_stream for sm_90a and prints facts from its PTX; the clean
    kernel's expect_tx is 33024 B per stage (x 32768 + scale 128 + bias 128)."""
    rc, text, clean = cutedebug(*target("compile_ptx_check.py"), runs=tmp_path)
    assert rc == 0 and clean.verdict == "PASS", text
    assert "expect_tx [33024]" in clean.log_tail
    assert "globaltimer reads 0" in clean.log_tail  # no probes: no bounded waits
    rc, text, rep = cutedebug(
        "--fault",
        "wrong_expect_tx:delta_bytes=16",
        "--probes",
        *target("compile_ptx_check.py"),
        runs=tmp_path,
    )
    assert rc == 1 and rep.verdict == "FAIL", text
    assert "expect_tx [33040]" in rep.log_tail  # +16 bytes, seen by the script itself
    assert int(re.search(r"globaltimer reads (\d+)", rep.log_tail).group(1)) > 0
    assert rep.fault_count == 1
    proc = next(p for p in rep.processes if p.probe_sites)
    fault_site = proc.fault_sites[0]
    assert fault_site["kernel"] == "TmaStream.kernel" and fault_site["line"] == line_of(
        "ring.producer_acquire(state)"
    )
    assert "33024 -> 33040" in fault_site["detail"]
    waits = {(s["op"], s["barrier"], s["kernel"]) for s in proc.probe_sites}
    assert waits == {
        ("producer_acquire", "empty", "TmaStream.kernel"),
        ("producer_tail", "empty", "TmaStream.kernel"),
        ("consumer_wait", "full", "TmaStream.kernel"),
    }


def test_stuck_records_of_a_recorded_h200_hang_make_a_localized_hang(tmp_path):
    """The events of tma_stream/wrong_expect_tx_plus recorded on the H200 (the worker's compiled
    event with the probe sites, its live pictures and final probe report), read as the events of
    one process of an exec'd command."""
    from cutedebug.commands import exec as X
    from cutedebug.engine import verdict as V

    tree = X._Tree()
    for line in recorded_runs.lines("wrong_expect_tx_plus"):
        tree.add({**json.loads(line), "pid": 4242})
    res = X.ExecResult(
        settings=X.Settings(argv=["python", "repro.py"]),
        verdict=V.Verdict.PASS,
        reason="",
        run_dir=tmp_path,
        returncode=-9,
        killed_by="stuck records",
        elapsed_s=1.0,
        processes=tree.procs,
    )
    X.classify(res)
    assert res.verdict is V.Verdict.HANG and "80 stuck record(s)" in res.reason
    assert res.evidence["pid"] == 4242
    consumers = {
        (s["op"], s["barrier"], s["stage"], s["location"])
        for s in res.evidence["stuck_sites"]
        if s["role"] == "consumer"
    }
    assert consumers == {("consumer_wait", "full", 0, "tma_stream.py:269")}
    assert any("expect_tx larger than the bytes delivered" in d for d in res.evidence["diagnosis"])
    md = X.write_report(res).read_text()
    assert "| 0-15 | 0-3 | consumer | consumer_wait | full[0] | 0 |" in md
    assert (tmp_path / "stuck_map.svg").read_text().startswith("<svg")
    assert "## Stuck map" in md


class FakeEvent:
    """A CUDA event whose completion the test decides."""

    def __init__(self):
        self.done = False

    def record(self):
        pass

    def query(self):
        return self.done


def test_in_flight_and_stall_clock():
    from cutedebug.instrument.launch import InFlight, stalled

    made = []
    flight = InFlight(lambda: made.append(FakeEvent()) or made[-1])
    assert flight.running_since(10.0) is None
    assert flight.around(lambda: "launched") == "launched"
    before, after = made
    # queued behind other work: not running yet, so no stall however long it waits
    assert flight.running_since(11.0) is None
    assert not stalled(15.0, flight.running_since(15.0), last_change=0.0, stall_s=1.0)
    before.done = True
    assert flight.running_since(16.0) == 16.0  # started when first seen past its first event
    assert not stalled(16.5, 16.0, last_change=0.0, stall_s=1.0)
    assert stalled(17.0, 16.0, last_change=0.0, stall_s=1.0)
    assert not stalled(17.0, 16.0, last_change=16.5, stall_s=1.0)  # a beacon moved at 16.5
    assert not stalled(17.0, 16.0, last_change=0.0, stall_s=None)  # no stall window asked
    after.done = True
    assert flight.running_since(18.0) is None


def test_a_stall_event_makes_a_hang_from_the_last_picture(tmp_path):
    """A process whose monitor saw an instrumented kernel in flight with no beacon moving: the
    probe sites and the live picture (no stuck record) of the recorded H200 run."""
    from cutedebug.commands import exec as X
    from cutedebug.engine import verdict as V

    tree = X._Tree()
    for line in recorded_runs.lines("wrong_expect_tx_plus"):
        ev = json.loads(line)
        if ev["event"] == "compiled":
            tree.add({**ev, "pid": 7})
        elif ev["event"] == "progress" and ev.get("picture"):
            tree.add({"event": "stall", "pid": 7, "still_s": 1.02, "picture": ev["picture"]})
    res = X.ExecResult(
        settings=X.Settings(argv=["python", "repro.py"], probes={"budget_ns": 1}),
        verdict=V.Verdict.PASS,
        reason="",
        run_dir=tmp_path,
        returncode=-9,
        killed_by="stall",
        elapsed_s=3.0,
        processes=tree.procs,
    )
    X.classify(res)
    assert res.verdict is V.Verdict.HANG and "moved for 1.02 s" in res.reason
    assert res.evidence["probe_source"] == "last live picture before the kill"
    assert res.evidence["stuck_sites"] == [] and len(res.evidence["warps"]) == 16
    assert "## Stuck map" in X.write_report(res).read_text()


def test_launches_of_instrumented_compiled_functions_are_bracketed():
    from types import SimpleNamespace

    from cutedebug.instrument import launch

    class Compiled:  # stands for a JitCompiledFunction subclass
        def __call__(self, x):
            return x + 1

    class Derived(Compiled):  # inherits __call__
        pass

    events = []
    flight = launch.InFlight(lambda: events.append(FakeEvent()) or events[-1])
    state = SimpleNamespace(monitor=SimpleNamespace(launches=flight), cfg={"stall_s": 1.0})
    with_waits, without = Derived(), Derived()
    launch._tag_compiled(state, with_waits, 3)
    assert with_waits(1) == 2 and len(events) == 2 and len(flight.queue) == 1
    assert without(1) == 2 and len(events) == 2  # its trace added no wait site: not tracked
    assert Compiled()(5) == 6 and len(events) == 2  # the base class is left alone
    launch._tag_compiled(state, Compiled(), 0)  # no sites: nothing changes
    assert "_cutedebug_tracked" not in vars(Compiled)
    state.cfg["stall_s"] = None
    other = type("Other", (Compiled,), {})()
    launch._tag_compiled(state, other, 2)  # no stall window asked: launches not bracketed
    assert "_cutedebug_tracked" not in vars(type(other))


def test_gpu_token_is_shared_by_a_command_and_waited_for_by_others(tmp_path):
    import threading

    from cutedebug.instrument.launch import acquire_gpu_token

    token, seen = tmp_path / "gpu.token", []
    assert acquire_gpu_token(str(token), "A", lambda *a, **k: seen.append(a)) < 0.1
    assert acquire_gpu_token(str(token), "A") < 0.1  # another process of the same command
    assert token.read_text() == "A" and seen == []
    threading.Timer(0.4, token.unlink).start()  # the parent releases A's token
    waited = acquire_gpu_token(str(token), "B", lambda *a, **k: seen.append(a))
    assert waited >= 0.35 and token.read_text() == "B"
    assert [s[0] for s in seen] == ["gpu_wait", "gpu_acquired"]


WAITS_FOR_TOKEN = """
import os
from cutedebug.instrument import launch
waited = launch.acquire_gpu_token(os.environ["TOKEN"], os.environ["CUTEDEBUG_RUN_TAG"],
                                  launch._STATE.events.emit)
print(f"got the GPU after {waited:.1f} s", flush=True)
"""


def test_the_deadline_clock_stops_while_the_command_waits_for_the_gpu(tmp_path):
    """A command that waits 4 s for a token another command holds, under a 2 s deadline: not
    killed, and the wait is reported apart."""
    import threading

    from cutedebug.commands import exec as X

    token = tmp_path / "gpu.token"
    token.write_text("another command")

    def release_4_s_after_the_wait_began() -> None:
        # from the child's gpu_wait event, not from now: a loaded machine can take a second
        # or more to start the child, which a timer from now would take off the wait
        end = time.monotonic() + 120
        while time.monotonic() < end and not any(
            '"gpu_wait"' in p.read_text(errors="replace")
            for p in (tmp_path / "run").rglob("*.jsonl")
        ):
            time.sleep(0.02)
        time.sleep(4.0)
        token.unlink()

    threading.Thread(target=release_4_s_after_the_wait_began, daemon=True).start()
    s = X.Settings(
        argv=[sys.executable, "-c", WAITS_FOR_TOKEN],
        deadline_s=2.0,
        extra_env={"TOKEN": str(token)},
    )
    res = X.watch_command(s, tmp_path / "run")
    assert res.verdict.value == "PASS" and res.killed_by is None, res.reason
    assert "got the GPU after" in res.log_tail
    assert 3.5 <= res.gpu_wait_s <= res.elapsed_s


@pytest.mark.slow  # pytest in a subprocess, twice (~10 s)
def test_a_pytest_command_fails_on_the_test_that_sees_the_fault(tmp_path):
    """`python -m pytest` as the command: the fault changes the barrier init count, so exactly
    the test that checks init counts fails; clean, every test passes and pytest prints no
    warning caused by the instrumentation."""
    pytest_cmd = [
        "--",
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        str(TARGETS / "ptx_checks.py"),
    ]
    rc, text, rep = cutedebug(*pytest_cmd, runs=tmp_path)
    assert rc == 0 and rep.verdict == "PASS", text
    assert "2 passed" in rep.log_tail and "Warning" not in rep.log_tail
    rc, text, rep = cutedebug("--fault", "wrong_arrive_count:delta=1", *pytest_cmd, runs=tmp_path)
    assert rc == 1 and rep.verdict == "FAIL", text
    assert "FAILED" in rep.evidence["last_lines"]
    assert "test_barrier_init_counts" in rep.evidence["last_lines"]
    assert "1 failed, 1 passed" in rep.reason and rep.fault_count == 1


def test_a_fault_with_nothing_to_act_on_is_said_first(tmp_path):
    """A command that never imports cutlass: the fault asked for cannot apply; the PASS says
    so in front, never as a plain PASS."""
    rc, text, rep = cutedebug(
        "--fault",
        "skip_consumer_release",
        "--",
        sys.executable,
        "-c",
        "print('no kernels here')",
        runs=tmp_path,
    )
    assert rep.verdict == "PASS" and rep.fault_count == 0
    assert rep.reason.startswith(
        "nothing was instrumented: no Python process of the command imported cutlass"
    )
    assert rep.tldr.startswith("PASS (as expected)") and "nothing was instrumented" in text


def test_a_fault_that_found_no_compiled_kernel_says_so_not_that_kernels_ran(tmp_path):
    """The command imports cutlass (instrumented) and ends before any kernel compiled (on the
    H200, s4: FA-4 still compiling at a 14 s deadline was reported as 'the kernels ran
    unmodified'): the reason says no kernel finished compiling, never that kernels ran."""
    rc, text, rep = cutedebug(
        "--fault",
        "skip_consumer_release",
        "--",
        sys.executable,
        "-c",
        "import cutlass.cute; print('imported, nothing compiled')",
        runs=tmp_path,
    )
    assert rep.verdict == "PASS" and rep.fault_count == 0, text
    assert "NOT APPLIED: no kernel finished compiling before the command ended" in rep.reason
    assert "ran unmodified" not in rep.reason
    assert "NOT applied (no kernel finished compiling" in text


TWO_KERNELS = """
import os, sys, tempfile
os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.gettempdir())
sys.path.insert(0, os.path.join(sys.argv[1], "kernels"))
import cutlass.cute as cute
from minimal import Minimal
from tma_stream import TmaStream
for k in (TmaStream(m=256, n=512), Minimal(n=1024), TmaStream(m=512, n=512)):
    cute.compile[cute.GPUArch("sm_90a")](k, *k.fake_args())
"""


def test_probe_site_ids_go_on_across_traces(tmp_path):
    """Probes are entered per trace into one buffer: a second kernel's waits get new ids (the
    earlier ones preloaded), a wait traced again keeps its id, so a stuck record names one
    site of one kernel."""
    from cutedebug.commands import exec as X

    s = X.Settings(
        argv=[sys.executable, "-c", TWO_KERNELS, str(ROOT)],
        probes={"budget_ns": 500_000_000},
        cwd=str(ROOT),
    )
    res = X.watch_command(s, tmp_path / "run")
    assert res.verdict.value == "PASS", res.reason
    (proc,) = [p for p in res.processes.values() if p["traces"]]
    tables = [e["probe_sites"] for e in proc["events"] if e["event"] == "compiled"]
    # the raw mbarrier ops a table lists after its waits (for the raw waits' diagnosis) have
    # no device code and are never in a stuck record
    waits = [[site for site in t if site["kind"] != "raw_op"] for t in tables]
    assert [[site["id"] for site in t] for t in waits] == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3]]
    assert {site["op"] for site in tables[1] if site["kind"] == "raw_op"} >= {"mbarrier_arrive"}
    by_id = {site["id"]: site for site in tables[-1]}
    assert {by_id[i]["kernel"] for i in (0, 1, 2)} == {"TmaStream.kernel"}
    assert by_id[3]["kernel"] == "Minimal.kernel" and by_id[3]["op"] == "raw_wait"


class AcceleratorError(RuntimeError):
    """Stands for torch's (2.11) class of the same name: how a CUDA error is raised."""


def test_a_cuda_error_seen_by_the_probe_monitor_is_the_programs_crash_not_ours(tmp_path):
    """The H200 mutate run (2026-12-02): a mutant's kernel faulted and the probe monitor's
    event query raised the context's sticky error first; it was reported as 'instrumentation
    failed' (HARNESS_ERROR). It is the program's CRASH, named; a real monitor bug stays ours."""
    from cutedebug.commands import exec as X
    from cutedebug.engine import verdict as V
    from cutedebug.instrument import launch as L

    def monitor_raising(exc):
        state = L._State({"events": str(tmp_path / "e.jsonl"), "stall_s": None})
        mon = L._Monitor.__new__(L._Monitor)
        mon.state, mon.interval_s, mon.picture_s = state, 0.001, 0.25
        mon.stop = __import__("threading").Event()

        def snapshot():
            raise exc

        mon.snapshot = snapshot
        mon.run()
        return [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines()]

    crash = AcceleratorError("CUDA error: unspecified launch failure\nSearch for ...")
    (ev,) = monitor_raising(crash)
    assert ev["event"] == "cuda_error" and ev["name"] == "cudaErrorLaunchFailure"
    (tmp_path / "e.jsonl").unlink()
    (bug,) = monitor_raising(KeyError("site 7"))
    assert bug["event"] == "instrument_error" and bug["type"] == "KeyError"

    def classify(events, rc):
        watched = [{"event": "instrumented", "probes": {"budget_ns": 1}}, *events]
        res = exec_result(tmp_path, [{**e, "pid": 7} for e in watched], rc, probes={"budget_ns": 1})
        X.classify(res)
        return res

    res = classify([ev], 0)  # even when the program swallowed the error and exited 0
    assert res.verdict is V.Verdict.CRASH and res.reason.startswith("cudaErrorLaunchFailure")
    assert "probe monitor" in res.reason and res.evidence["cuda_error"]["name"] == ev["name"]
    # its report.json is written and reads back (the H200's mutate over the field tests,
    # 2026-12-02-h200-s2 call3: "field 'processes[0].cuda_errors' unknown (ExecProcess)")
    rep = X.exec_report(res, "PASS")
    (proc,) = rep.processes
    assert [e["name"] for e in proc.cuda_errors] == ["cudaErrorLaunchFailure"]
    assert type(rep).from_json(rep.to_json()) == rep
    assert classify([bug], 1).verdict is V.Verdict.HARNESS_ERROR
