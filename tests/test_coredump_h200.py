"""read_core and the HANG evidence on real H200 cores, replayed on the CPU.

tests/data/coredump/h200/<scenario>/ holds what cuda-gdb 13.0 printed for a user-triggered core
of that scenario's hung kernel (tools/capture_coredumps.py on the H200, driver 580, probes off):
pass1.txt.gz (`info cuda kernels`, `info cuda warps device 0`, ...), the registers it printed for
the warps it focused, the function's address (<+0> of its `disassemble`), and sass.txt.gz (the
H200's nvdisasm -g -c of the cubin the worker compiled); facts.json also has that compile's
trace-time wait table and the bisection sites of the same commit compiled on the CPU (observe-
only). tests/helpers/replay_gdb.py answers read_core's cuda-gdb calls from those facts. The
expected localization is the scenario file's own.
"""

from __future__ import annotations

import gzip
import json
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from cutedebug.analyses import coredump
from cutedebug.analyses import coredump_evidence as E
from cutedebug.engine import scenario as S
from cutedebug.engine import verdict as V
from cutedebug.instrument import waitsites
from tests.helpers.replay_gdb import ReplayGdb

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "coredump" / "h200"


def replay(name: str, monkeypatch, focus_pc: bool = True):
    d = DATA / name
    facts = json.loads((d / "facts.json").read_text())
    pass1 = gzip.open(d / "pass1.txt.gz", "rt").read()
    base = int(re.match(r"\s*(0x[0-9a-f]+)", facts["function_base_line"]).group(1), 16)
    regs = {tuple(int(x) for x in k.split()): v for k, v in facts["registers"].items()}
    fake = ReplayGdb(pass1, base, regs, focus_pc=focus_pc)
    monkeypatch.setattr(coredump, "gdb_session", fake.session)
    cps = facts["checkpoint_sites"]
    rep = coredump.read_core(
        "core",
        sass_text=gzip.open(d / "sass.txt.gz", "rt").read(),
        wait_sites=waitsites.sites_from_json(facts["wait_sites"]),
        checkpoint_sites=cps,
    )
    sc = S.load(ROOT / "scenarios" / name.split("__")[0] / f"{name.split('__')[1]}.toml")
    return rep, cps, sc, fake


def replay_named(name: str, monkeypatch):
    """replay() for a fixture whose folder name is not a scenario file's."""
    d = DATA / name
    facts = json.loads((d / "facts.json").read_text())
    base = int(re.match(r"\s*(0x[0-9a-f]+)", facts["function_base_line"]).group(1), 16)
    regs = {tuple(int(x) for x in k.split()): v for k, v in facts["registers"].items()}
    fake = ReplayGdb(gzip.open(d / "pass1.txt.gz", "rt").read(), base, regs)
    monkeypatch.setattr(coredump, "gdb_session", fake.session)
    rep = coredump.read_core(
        "core",
        sass_text=gzip.open(d / "sass.txt.gz", "rt").read(),
        wait_sites=waitsites.sites_from_json(facts["wait_sites"]),
        checkpoint_sites=facts["checkpoint_sites"],
    )
    return rep, facts["checkpoint_sites"], None, fake


def summary(rep, cps) -> Counter:
    return Counter(
        (s["role"], s["op"], s["barrier"], s["location"], s["kind"])
        for s in E.stuck_sites(rep, cps)
    )


def test_expect_tx_too_large_consumers_on_full_producer_on_empty(monkeypatch):
    rep, cps, sc, fake = replay("tma_stream__wrong_expect_tx_plus", monkeypatch)
    assert [k.grid + k.block for k in rep.kernels] == [(16, 1, 1, 160, 1, 1)]
    assert len(rep.warps) == 80 and all(w.offset is not None for w in rep.warps)
    assert rep.site_map_notes == []  # every wait loop mapped exactly
    assert summary(rep, cps) == Counter(
        {
            ("consumer", "consumer_wait", "full", "tma_stream.py:269", "mbarrier_wait"): 64,
            ("producer", "producer_acquire", "empty", "tma_stream.py:238", "mbarrier_wait"): 16,
        }
    )
    # registers read for the waiting warps: the barrier and the parity waited for
    sites = E.stuck_sites(rep, cps)
    read = [s for s in sites if s["phase"] is not None]
    assert read and {(s["op"], s["smem_offset"], s["phase"]) for s in read} == {
        ("consumer_wait", "0x400", 0),
        ("producer_acquire", "0x420", 0),
    }
    assert E.grade(sc.expect.localization(), rep, cps)["ok"] is True
    # two cuda-gdb runs: every warp + the kernel's address; per-PC frames + registers
    assert len(fake.calls) == 2
    # the 12 CTAs whose registers the capture printed: the producer is a lap ahead
    assert E.patterns(rep) == [
        "12 CTA(s): consumers wait on full with parity 0 (first lap) while the producer waits "
        "on empty with parity 0 (its second lap: it filled every stage): the full barrier never "
        "completed -> expect_tx larger than the bytes delivered, a TMA load missing, or full's "
        "arrive count too large? (tma_stream.py:269)"
    ]


@pytest.mark.parametrize(
    "name,answers",
    [
        ("bisect__flag_spin_never_set", {"consumer": ("checkpoint", None)}),
        ("bisect__flag_spin_barrier_threads_plus", {"consumer": ("named_barrier", "named")}),
        (
            "bisect__tma_stream_early_exit_consumer",
            {"producer": ("producer_acquire", "empty"), "consumer": ("consumer_release", "empty")},
        ),
        (
            "bisect__tma_stream_early_exit_producer",
            {"consumer": ("consumer_wait", "full"), "producer": ("producer_commit", "full")},
        ),
        (
            "sm90_gemm__wrong_barrier_threads_plus",
            {"producer": ("producer_acquire", "empty"), "consumer": ("named_barrier", "named")},
        ),
    ],
)
def test_bisection_only_hangs_graded_from_the_core(name, answers, monkeypatch):
    rep, cps, sc, _ = replay(name, monkeypatch)
    got = {r: (a["op"], a["barrier"]) for r, a in E.role_answers(rep, cps).items()}
    assert got == answers
    assert sc.expect.localized_by == "bisect"
    g = E.grade(sc.expect.localization(), rep, cps, by="bisect")
    assert g["ok"] is True, g


def test_a_spin_on_a_global_flag_is_named_by_the_checkpoint_after_it(monkeypatch):
    rep, cps, _, _ = replay("bisect__flag_spin_never_set", monkeypatch)
    assert summary(rep, cps) == Counter(
        {("consumer", "spin_load", None, "flag_spin.py:120", "spin_load"): 32}
    )
    a = E.role_answers(rep, cps)["consumer"]
    assert a["how"].startswith("spins on a global load at flag_spin.py:120: never reaches")
    assert "'flag observed' (flag_spin.py:123)" in a["how"]
    # the flags the consumers spin on: one per chunk, 4-byte apart, in global memory
    addrs = {s["address"] for s in E.stuck_sites(rep, cps) if s["address"]}
    assert len(addrs) > 1 and all(int(a, 16) > 1 << 32 for a in addrs)


def test_warps_blocked_at_a_named_barrier(monkeypatch):
    rep, cps, _, _ = replay("sm90_gemm__wrong_barrier_threads_plus", monkeypatch)
    named = [w for w in rep.warps if w.construct.kind == "named_barrier"]
    assert len(named) == 64 and {w.role for w in named} == {"consumer"}
    # bar.sync 1, 288: the fault's +32 threads, read from the SASS at the warps' PCs
    assert {(w.construct.barrier_id, w.construct.threads) for w in named} == {(1, 288)}
    assert {w.construct.anchor.text for w in named} == {"BAR.SYNC.DEFER_BLOCKING 0x1, 0x120"}
    # 7 wait loops for 7 traced waits (the mainloop's wait sits at the top of the loop whose
    # back-edge is a predicated branch after a later TRYWAIT: not a retry block)
    assert rep.site_map_notes == []
    assert {w.op for w in rep.warps if w.construct.kind == "mbarrier_wait"} == {"producer_acquire"}


def test_exited_consumers_inferred_from_the_producer_waiting_on_empty(monkeypatch):
    rep, cps, _, _ = replay("bisect__tma_stream_early_exit_consumer", monkeypatch)
    assert len(rep.warps) == 16  # one producer warp per CTA left
    assert E.missing_warps(rep) == {c: [0, 1, 2, 3] for c in range(16)}
    inferred = [s for s in E.stuck_sites(rep, cps) if s.get("inferred")]
    assert len(inferred) == 64
    assert {(s["role"], s["op"], s["barrier"], s["location"]) for s in inferred} == {
        ("consumer", "consumer_release", "empty", "tma_stream.py:279")
    }


def test_raw_wait_in_an_out_of_line_retry_loop(monkeypatch):
    """The role is bisection's: the function the wait runs in ("gather"), which plays no
    pipeline role."""
    rep, cps, sc, _ = replay("cluster_reduce__wrong_expect_tx_plus", monkeypatch)
    assert summary(rep, cps) == Counter(
        {("gather", "raw_wait", None, "cluster_reduce.py:302", "mbarrier_wait"): 48}
    )
    assert E.grade(sc.expect.localization(), rep, cps)["ok"] is True


def test_picture_draws_the_stuck_map(monkeypatch):
    from cutedebug.instrument.probes import snapshot_from_json
    from cutedebug.reporting import stuck_map as SM

    rep, cps, _, _ = replay("tma_stream__wrong_expect_tx_plus", monkeypatch)
    pic = E.picture(rep)
    m = SM.build(snapshot_from_json(pic), pic["sites"])
    text = SM.render_text(m)
    assert "wait f" in text and "acq e" in text


def core_run_folder(
    name: str, run_dir: Path, core: str, monkeypatch
) -> tuple[S.Scenario, V.Outcome]:
    """What coredump.analyse reads after a kill, from capture ``name``: the scenario (cuda-gdb
    replayed), a core file ``core`` in ``run_dir`` (the replay reads none of it), the cubin's
    SASS, and the worker's outcome with its trace-time wait and checkpoint sites."""
    d = DATA / name
    facts = json.loads((d / "facts.json").read_text())
    _, _, sc, _ = replay(name, monkeypatch)
    monkeypatch.setattr(
        coredump, "sass_of_cubin", lambda cubin: gzip.open(d / "sass.txt.gz", "rt").read()
    )
    (run_dir / core).write_bytes(b"\x7fELF" + bytes(60))
    outcome = V.Outcome()
    for ev in (
        {"event": "launched"},
        {"event": "compiled", "wait_sites": facts["wait_sites"]},
        {"event": "checkpoint_sites", "sites": facts["checkpoint_sites"]},
    ):
        outcome.add(ev)
    return sc, outcome


def hang_result(sc, outcome, ev, run_dir, probes_used=None):
    """The RunResult of a HANG run of ``sc`` with ``ev`` as its evidence (what grades it)."""
    from cutedebug.engine import runner

    return runner.RunResult(
        scenario=sc,
        verdict=V.Verdict.HANG,
        reason="",
        run_dir=run_dir,
        outcome=outcome,
        evidence=ev,
        probes_used=probes_used,
    )


def test_analyse_a_run_folder_into_evidence_and_the_runs_grade(tmp_path, monkeypatch):
    """coredump.analyse as run_scenario(core=...) calls it after the kill: the core in the
    run folder, the worker's events, the cubin's SASS; then RunResult grades a bisection-only
    scenario by the core's answer."""

    name = "bisect__flag_spin_barrier_threads_plus"
    sc, outcome = core_run_folder(name, tmp_path, "coredump.4242.nvcudmp", monkeypatch)
    kill = {"before_kill": [{"coredump": {"dump_s": 0.22, "core_bytes": 64}}]}
    ev = coredump.analyse(tmp_path, outcome, kill, sc.expect.localization(), sc.expect.localized_by)
    assert ev["coredump"]["warps"] == 32 and ev["coredump"]["dump"]["dump_s"] == 0.22
    assert ev["coredump"]["site_map"] == [
        "every wait loop and BAR.SYNC mapped to its traced site (counts agree)"
    ]
    assert (tmp_path / "coredump_gdb_pass1.txt").exists()
    assert ev["coredump_grade"]["ok"] is True
    assert ev["diagnosis"] == [
        "8 CTA(s): bar.sync 1, 160 expects 5 warps; 4 wait there and no other warp of the CTA "
        "is alive to arrive: the thread count is larger than the warps that arrive (or some "
        "exited first) (flag_spin.py:128)",
        "consumer: 32 warp(s) in named_barrier at flag_spin.py:128 "
        "(named_barrier named; 32 warp(s) over 8 CTA(s) in the core)",
    ]
    assert {s["op"] for s in ev["stuck_sites"]} == {"named_barrier"}
    res = hang_result(sc, outcome, ev, tmp_path)
    assert res.localization["ok"] is True and res.localization["by"] == "coredump"
    assert res.expected


def test_a_probes_graded_hang_localized_from_the_core_is_graded_without_its_stage(
    tmp_path, monkeypatch
):
    """A scenario the probes grade, stage included (sm90_gemm/early_exit_producer expects
    full[1]), run without probes and localized from its core: graded on role, op and barrier,
    what a core says (the H200, 2026-12-01 s4: 'consumer: consumer_wait/full' was graded False
    for want of the stage); with probes on, the stuck records still grade the stage."""
    from dataclasses import replace

    name = "tma_stream__wrong_expect_tx_plus"
    sc, outcome = core_run_folder(name, tmp_path, "coredump.4242.nvcudmp", monkeypatch)
    sc = replace(sc, expect=replace(sc.expect, stage=1))
    ev = coredump.analyse(
        tmp_path,
        outcome,
        {"before_kill": [{"coredump": {"dump_s": 0.2, "core_bytes": 64}}]},
        sc.expect.localization(),
        sc.expect.localized_by,
    )
    assert {s.get("stage") for s in ev["stuck_sites"]} == {None}

    loc = hang_result(sc, outcome, ev, tmp_path, probes_used=False).localization
    assert loc["ok"] is True and loc["by"] == "coredump" and "stage" not in loc["expected"]
    assert loc["matched"]["op"] == "consumer_wait" and loc["matched"]["barrier"] == "full"
    probed = hang_result(sc, outcome, ev, tmp_path, probes_used=True)
    assert probed.localization["ok"] is False  # probe records must name stage 1


def test_without_the_focus_offset_a_third_run_reads_the_registers(monkeypatch):
    rep2, cps, _, fake2 = replay("tma_stream__wrong_expect_tx_plus", monkeypatch)
    rep3, _, _, fake3 = replay("tma_stream__wrong_expect_tx_plus", monkeypatch, focus_pc=False)
    assert (len(fake2.calls), len(fake3.calls)) == (2, 3)
    assert E.stuck_sites(rep2, cps) == E.stuck_sites(rep3, cps)


def test_report_of_a_run_localized_from_its_core(tmp_path, monkeypatch):
    from cutedebug.reporting import report

    name = "tma_stream__wrong_expect_tx_plus"
    sc, outcome = core_run_folder(name, tmp_path, "coredump.77.nvcudmp", monkeypatch)
    ev = coredump.analyse(tmp_path, outcome, {}, sc.expect.localization(), "probes")
    res = hang_result(sc, outcome, ev, tmp_path)
    assert res.localization["ok"] is True  # graded like probes, from the core's stuck sites
    md = report.to_markdown(res)
    assert "- GPU coredump: coredump.77.nvcudmp (64 bytes" in md
    assert "80 warps read by cuda-gdb in 0.0 s (2 round(s) of commands in 1 process(es)" in md
    assert (
        "## Stuck sites" in md and "| 0-15 | 4 | producer | producer_acquire | empty | 0 |" in md
    )  # no stage from a core: the barrier alone
    assert "## Stuck map" in md and "Source: coredump (cuda-gdb on the GPU core" in md
    # the footnote says what a core knows (no wait time, no item number)
    assert (
        "  CTAs 0-15 warp 4: producer_acquire empty, parity 0, smem 0x420 (tma_stream.py:238)"
        ", 16 warp(s) in the core"
        in md
        and "waiting for item" not in md
    )


def test_crash_core_names_the_faulting_instruction_and_its_line(monkeypatch):
    """A core written on a GPU exception opens with the lines the cuda-gdb manual shows
    ("CUDA Exception: ...", "The exception was triggered at PC ...", the focus on the faulting
    thread). Here they are put in front of a real pass 1 (tma_stream's core), the PC being a
    real STG of its SASS: the record names that instruction and its line."""
    d = DATA / "tma_stream__wrong_expect_tx_plus"
    facts = json.loads((d / "facts.json").read_text())
    base = int(re.match(r"\s*(0x[0-9a-f]+)", facts["function_base_line"]).group(1), 16)
    sass_text = gzip.open(d / "sass.txt.gz", "rt").read()
    from cutedebug.analyses import sass as SA

    stg = next(i for i in SA.parse(sass_text).instrs if i.opcode.startswith("STG"))
    pass1 = gzip.open(d / "pass1.txt.gz", "rt").read()
    header = (
        f"CUDA Exception: Warp Illegal Address\n"
        f"The exception was triggered at PC {base + stg.offset:#x}\n\n"
        f"Thread 1 received signal CUDA_EXCEPTION_14, Warp Illegal Address.\n"
        f"[Current focus set to CUDA kernel 0, grid 1, block (8,0,0), thread (0,0,0), "
        f"device 0, sm 0, warp 0, lane 0]\n"
    )
    regs = {tuple(int(x) for x in k.split()): v for k, v in facts["registers"].items()}
    monkeypatch.setattr(coredump, "gdb_session", ReplayGdb(header + pass1, base, regs).session)
    rep = coredump.read_core(
        "core", sass_text=sass_text, wait_sites=waitsites.sites_from_json(facts["wait_sites"])
    )
    crash = E.crash_evidence(rep)
    assert crash["exception"] == "Warp Illegal Address"
    assert (crash["block"], crash["sm"], crash["hw_warp"], crash["lane"]) == ((8, 0, 0), 0, 0, 0)
    assert crash["fault_offset"] == f"{stg.offset:#x}" and crash["instruction"] == stg.text
    assert crash["where"] == f"tma_stream.py:{stg.line}" and (crash["cta"], crash["warp"]) == (8, 0)


def test_warps_of_another_kernel_are_not_placed_in_this_kernels_sass(monkeypatch):
    """The SASS is the run's own kernel's: a core whose kernel is another one (a library's
    kernel in flight, say) keeps its warps unplaced and says so."""
    d = DATA / "tma_stream__wrong_expect_tx_plus"
    facts = json.loads((d / "facts.json").read_text())
    base = int(re.match(r"\s*(0x[0-9a-f]+)", facts["function_base_line"]).group(1), 16)
    sass_text = (
        gzip.open(d / "sass.txt.gz", "rt")
        .read()
        .replace(
            ".text.kernel_cutlass_kernel_cutedebug_kernel_tma_stream", ".text.some_other_kernel"
        )
    )
    regs = {tuple(int(x) for x in k.split()): v for k, v in facts["registers"].items()}
    fake = ReplayGdb(gzip.open(d / "pass1.txt.gz", "rt").read(), base, regs)
    monkeypatch.setattr(coredump, "gdb_session", fake.session)
    rep = coredump.read_core(
        "core", sass_text=sass_text, wait_sites=waitsites.sites_from_json(facts["wait_sites"])
    )
    assert all(w.construct is None for w in rep.warps) and E.stuck_sites(rep, []) == []
    assert rep.site_map_notes[-1].startswith("80 warp(s) of other kernels (kernel_cutlass_")


def test_a_real_crash_core_names_the_faulting_store_as_memcheck_does(monkeypatch):
    """minimal/oob_store on the H200 (core-1): the driver wrote a core on the GPU exception
    (8,448 warps, 128 MB, 4.2 s). cuda-gdb: "CUDA Exception: Warp Illegal Address", "The
    exception was triggered at PC 0x7f72d77a1130 <kernel> (minimal.py:64)", focus on block
    (272,0,0) thread (96,0,0). The PC is the kernel's STG.E at +0x230, line 64 — the line
    memcheck gave for the same kernel file (INVALID_GLOBAL_WRITE@minimal.py:64 x1000,
    reports/2026-11-30-h200-s2; kernels/minimal.py unchanged since). The pass 1 kept here is
    cut to the warps of SMs 0-1."""
    rep, _, _, _ = replay_named("minimal__oob_store", monkeypatch)
    crash = E.crash_evidence(rep)
    assert crash["exception"] == "Warp Illegal Address"
    assert crash["where"] == "minimal.py:64" and crash["sass_line"] == 64
    assert (crash["fault_offset"], crash["instruction"]) == ("0x230", "STG.E desc[UR4][R4.64], R7")
    assert (crash["block"], crash["thread"], crash["cta"], crash["warp"], crash["lane"]) == (
        (272, 0, 0),
        (96, 0, 0),
        272,
        3,
        0,
    )


def test_a_hang_verdict_with_an_exception_core_becomes_the_crash(tmp_path, monkeypatch):
    """The watchdog killed the worker at its deadline while the driver was still writing the
    exception's core (a big grid's takes seconds): the core says CRASH, and so does the run."""
    from cutedebug.engine import runner

    sc = S.load(ROOT / "scenarios" / "minimal" / "oob_store.toml")
    outcome = V.Outcome()
    outcome.add({"event": "launched"})
    crash = {"exception": "Warp Illegal Address", "where": "minimal.py:64"}
    monkeypatch.setattr(
        runner,
        "run_once",
        lambda *a, **k: (V.Classified(V.Verdict.HANG, "killed at the deadline"), outcome, {}),
    )
    monkeypatch.setattr(runner, "after_run_health", lambda *a, **k: None)

    class Core:
        def request_fields(self, run_dir):
            return {}

        def evidence(self, run_dir, outcome, facts, scenario):
            return {"crash": crash, "coredump": {"core": "coredump.1.nvcudmp"}}

    res = runner.run_scenario(sc, run_dir=tmp_path, probes=False, core=Core())
    assert res.verdict is V.Verdict.CRASH and res.expected
    assert res.reason.startswith("GPU exception in the core: Warp Illegal Address at minimal.py:64")
    assert res.evidence["crash"] == crash and not res.evidence.get("rerun_with_probes")


def test_nvdisasm_starts_at_the_kill_decision_and_analyse_takes_its_sass(tmp_path, monkeypatch):
    """The before-kill hooks start nvdisasm on the worker's cubin (prefetch_sass, a thread)
    before the dump; analyse, after the kill and the health check, takes that SASS instead of
    running nvdisasm then: the reading no longer waits for it."""
    import threading

    name = "tma_stream__wrong_expect_tx_plus"
    sc, outcome = core_run_folder(name, tmp_path, "coredump.4242.nvcudmp", monkeypatch)
    text = gzip.open(DATA / name / "sass.txt.gz", "rt").read()
    calls = []

    def slow_nvdisasm(cubin):
        calls.append((Path(cubin).name, threading.current_thread().name))
        time.sleep(0.4)
        return text

    monkeypatch.setattr(coredump, "sass_of_cubin", slow_nvdisasm)
    (tmp_path / "kernel.cubin").write_bytes(b"\x7fELF")
    (tmp_path / "coredump.pipe.4242").write_text("")  # the driver's pipe: a coredump run
    ctx = {"phase": "launched", "events_path": str(tmp_path / "events.jsonl"), "pid": 4242}
    assert coredump.prefetch_sass(ctx) is None  # nothing for the facts: it only starts
    time.sleep(0.6)  # the dump, the kill, the health check
    ev = coredump.analyse(tmp_path, outcome, {}, sc.expect.localization(), "probes")
    assert calls == [("kernel.cubin", "cutedebug-nvdisasm")]
    info = ev["coredump"]
    assert info["nvdisasm_s"] >= 0.4 and info["nvdisasm_wait_s"] < 0.2
    assert info["sass"] == "nvdisasm of the worker's cubin" and ev["coredump_grade"]["ok"]
    # a run folder without the pipe (no coredump settings) or a worker not launched: nothing
    assert coredump.prefetch_sass({**ctx, "pid": 1}) is None
    assert coredump.prefetch_sass({**ctx, "phase": "compiling"}) is None
    assert coredump._SASS == {} and len(calls) == 1
