"""cutedebug.analyses.sass on real SASS: nvdisasm (CUDA 13) of cubins the worker compiled for
sm_90a from this repository's scenarios (line info on), with the trace-time wait tables recorded
in the same compiles (tests/data/coredump/*.sass.txt.gz, *.wait_sites.json)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from cutedebug.analyses import sass
from cutedebug.instrument import waitsites

DATA = Path(__file__).parent / "data" / "coredump"


def load(name: str) -> tuple[sass.Sass, list[waitsites.WaitSite]]:
    text = gzip.open(DATA / f"{name}.sass.txt.gz", "rt").read()
    sites = waitsites.sites_from_json(json.loads((DATA / f"{name}.wait_sites.json").read_text()))
    return sass.parse(text), sites


def test_inline_wait_loops_map_in_order_to_the_traced_waits():
    code, sites = load("bisect__tma_stream_early_exit_consumer")
    assert [w.offset for w in code.waits] == [0x400, 0x790, 0x870, 0x950, 0xA30, 0xB50]
    m = sass.map_sites(code, sites)
    assert m.waits_exact and m.bars_exact and m.notes == []
    assert [(m.waits[k].op, m.waits[k].barrier, m.waits[k].line) for k in range(6)] == [
        ("producer_acquire", "empty", 238),
        *[("producer_tail", "empty", 246)] * 4,
        ("consumer_wait", "full", 269),
    ]
    # every instruction of a wait loop, its head (the MOV before the TRYWAIT) included
    for pc in (0x3F0, 0x400, 0x410, 0x420, 0x430):
        c = code.classify(pc)
        assert (c.kind, c.index, c.start, c.end) == ("mbarrier_wait", 0, 0x3F0, 0x430)
        assert (c.address_reg, c.address_imm, c.phase_reg) == ("R7", 0x20, "R3")
    c = code.classify(0xB60)
    assert (c.kind, c.index, c.start, c.end, c.address_reg, c.address_imm, c.phase_reg) == (
        "mbarrier_wait",
        5,
        0xB50,
        0xB80,
        "R11",
        0,
        "R9",
    )
    assert m.site_of(c)[0].op == "consumer_wait"
    # the consumer's big main loop is work, not a wait; the pipeline-init sync is BAR 0
    assert code.classify(0x1000).kind == "other"
    bar = code.classify(0x2C0)
    assert (bar.kind, bar.index, bar.barrier_id, bar.threads) == ("named_barrier", 0, 0, None)
    assert m.site_of(bar)[0].kind == "sync_threads"
    # the fault's early exit of the consumers, and the kernel's own
    assert [(c.kind, c.anchor.text) for c in map(code.classify, (0xF20, 0x17D0))] == [
        ("exit", "@!P0 EXIT"),
        ("exit", "EXIT"),
    ]


def test_out_of_line_retry_loop_belongs_to_its_fast_path():
    """cluster_reduce's raw wait: a fast-path TRYWAIT at 0xab0 whose @!P0 BRA enters a retry
    loop placed after the kernel's EXIT (0xd10-0xd60), where a stuck warp sits."""
    code, sites = load("cluster_reduce__wrong_expect_tx_plus")
    assert [w.offset for w in code.waits] == [0xAB0]
    assert code.wait_loops() == [[(0xAB0, 0xAC0), (0xD10, 0xD60)]]
    m = sass.map_sites(code, sites)
    assert m.waits_exact and m.waits[0].op == "raw_wait"
    for pc in (0xD10, 0xD20, 0xD30, 0xD50, 0xD60):
        c = code.classify(pc)
        assert (c.kind, c.index, c.start, c.end) == ("mbarrier_wait", 0, 0xD10, 0xD60)
        assert (c.address_reg, c.phase_reg) == ("R5", "R7")  # the retry loop's own TRYWAIT
    # the retry loop keeps the wait's line (the fast path's is the loop above it)
    assert code.line_at(0xD20)[1] == 305 and code.line_at(0xAB0)[1] == 220
    # cluster_wait = UCGABAR_WAIT + a BAR.SYNC 0: three BAR.SYNC for 2 cluster waits + 1 sync
    assert [m.bars[k].kind for k in range(3)] == ["cluster_wait", "sync_threads", "cluster_wait"]
    assert code.classify(0x1C0).kind == "cluster_barrier"


def test_named_barriers_and_a_spin_on_a_global_flag():
    code, sites = load("bisect__flag_spin_never_set")
    assert code.waits == []
    m = sass.map_sites(code, sites)
    assert [(b.offset, b.text) for b in code.bar_syncs] == [
        (0x50, "BAR.SYNC.DEFER_BLOCKING 0x0"),
        (0x4E0, "BAR.SYNC.DEFER_BLOCKING 0x1, 0x80"),
        (0x520, "BAR.SYNC.DEFER_BLOCKING 0x1, 0x80"),
    ]
    assert m.bars_exact
    assert [(m.bars[k].kind, m.bars[k].line) for k in range(3)] == [
        ("sync_threads", 86),
        ("named_barrier_sync", 128),
        ("named_barrier_sync", 134),
    ]
    c = code.classify(0x4E0)
    assert (c.kind, c.barrier_id, c.threads) == ("named_barrier", 1, 128)
    for pc in (0x430, 0x440, 0x450, 0x460):
        c = code.classify(pc)
        assert (c.kind, c.start, c.end, c.address_reg) == ("spin_load", 0x430, 0x460, "R4")
        assert c.anchor.text == "LDG.E.STRONG.GPU R9, desc[UR6][R4.64]"
    assert code.line_at(0x430) == (code.instrs[0].file, 120)


def test_waits_removed_as_dead_code_are_aligned_by_line_not_exact():
    """early_exit(consumer) on sm90_attention: the consumer exits after its first two waits,
    the compiler drops the three after; 9 wait loops for 12 traced waits."""
    code, sites = load("sm90_attention__early_exit_consumer_k")
    m = sass.map_sites(code, sites)
    assert not m.waits_exact and len(code.waits) == 9
    assert "not exact" in m.notes[0]
    assert [(m.waits[k].op, m.waits[k].line) for k in range(9)] == [
        ("producer_acquire", 327),
        ("producer_acquire", 337),
        ("producer_acquire", 342),
        ("producer_tail", 348),
        ("producer_tail", 348),
        ("producer_tail", 349),
        ("producer_tail", 349),
        ("consumer_wait", 391),
        ("consumer_wait", 398),
    ]
    # BAR.SYNC R0, 0x100 (id in a register): the traced barrier on its own line
    bar = code.classify(0xBA0)
    assert (bar.kind, bar.barrier_id, bar.threads, bar.address_reg) == (
        "named_barrier",
        None,
        256,
        "R0",
    )
    site, exact = m.site_of(bar)
    assert (site.line, site.threads, exact) == (399, 256, False)


def test_gdb_disassembly_parses_like_nvdisasm():
    """cuda-gdb's `disassemble` form (absolute addresses, <+offset>) gives the same model."""
    lines = [
        "Dump of assembler code for function k:",
        "   0x00007fffd3a7e3f0 <+1008>:\tIMAD.U32 R7, RZ, RZ, UR9",
        "   0x00007fffd3a7e400 <+1024>:\tSYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R7+URZ+0x20], R3",
        "=> 0x00007fffd3a7e410 <+1040>:\t@!P0 NANOSLEEP.SYNCS 0x989680",
        "   0x00007fffd3a7e420 <+1056>:\t@!P0 SYNCS.PHASECHK.TRANS64 P0, [R7+URZ+0x20], R3",
        "   0x00007fffd3a7e430 <+1072>:\t@!P0 BRA 0x7fffd3a7e3f0",
        "End of assembler dump.",
    ]
    code = sass.parse("\n".join(lines))
    assert [i.offset for i in code.instrs] == [0x3F0, 0x400, 0x410, 0x420, 0x430]
    assert code.instrs[-1].target == 0x3F0 and code.instrs[2].pred == "@!P0"
    c = code.classify(0x410)
    assert (c.kind, c.index, c.start, c.end, c.address_reg, c.address_imm) == (
        "mbarrier_wait",
        0,
        0x3F0,
        0x430,
        "R7",
        0x20,
    )


@pytest.mark.parametrize(
    "operands,expected",
    [
        ("P0, [R7+URZ+0x20], R3", ("R7", 0x20)),
        ("P1, [UR14+0x48], R0", ("UR14", 0x48)),
        ("R9, desc[UR6][R4.64]", ("R4", 0)),
        ("P0, [R5+URZ], R7", ("R5", 0)),
    ],
)
def test_memory_operand(operands, expected):
    assert sass._mem_reg(operands) == expected
