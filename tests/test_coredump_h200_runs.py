"""The integrated path's own cuda-gdb output, replayed: `tools/gpu_coredump_table.py` ran
`run_scenario(core=Localizer())` on the H200 (request core-3: probes off, the watchdog's dump
before the kill, cuda-gdb 13.0 in two runs) and kept, per scenario, what cuda-gdb printed for
read_core's commands, the worker's wait table and bisection sites, and the nvdisasm SASS of its
cubin (tests/data/coredump/h200-runs/*.json.gz). read_core is fed those outputs call by call;
each hang is graded against the scenario file's own expectation."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from cutedebug.analyses import coredump
from cutedebug.analyses import coredump_evidence as E
from cutedebug.engine import scenario as S
from cutedebug.instrument import waitsites
from tests.helpers.replay_gdb import PassReplay

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "coredump" / "h200-runs"

ANSWERS = {
    "bisect__flag_spin_barrier_threads_plus": {"consumer": ("named_barrier", "named")},
    "bisect__flag_spin_never_set": {"consumer": ("checkpoint", None)},
    "bisect__tma_stream_early_exit_consumer": {
        "producer": ("producer_acquire", "empty"),
        "consumer": ("consumer_release", "empty"),
    },
    "bisect__tma_stream_early_exit_producer": {
        "consumer": ("consumer_wait", "full"),
        "producer": ("producer_commit", "full"),
    },
    "cluster_reduce__wrong_expect_tx_plus": {"gather": ("raw_wait", None)},
    "sm90_attention__drop_sync_scheduler": {
        "producer": ("producer_tail", "empty"),
        "consumer": ("named_barrier", "named"),
    },
    "sm90_attention__wrong_barrier_threads_plus": {
        "producer": ("producer_acquire", "empty"),
        "consumer": ("named_barrier", "named"),
    },
    "sm90_gemm__wrong_barrier_threads_plus": {
        "producer": ("producer_acquire", "empty"),
        "consumer": ("named_barrier", "named"),
    },
    "tma_stream__wrong_expect_tx_plus": {
        "consumer": ("consumer_wait", "full"),
        "producer": ("producer_acquire", "empty"),
    },
}


def load(name: str, monkeypatch):
    doc = json.loads(gzip.open(DATA / f"{name}.json.gz", "rt").read())
    fake = PassReplay(doc["passes"])
    monkeypatch.setattr(coredump, "gdb_session", fake.session)
    cps = doc["checkpoint_sites"]
    rep = coredump.read_core(
        "core",
        sass_text=doc["sass"],
        wait_sites=waitsites.sites_from_json(doc["wait_sites"]),
        checkpoint_sites=cps,
    )
    fam, case = name.split("__", 1)
    return rep, cps, S.load(ROOT / "scenarios" / fam / f"{case}.toml"), fake


def test_every_recorded_run_is_here():
    assert sorted(p.name.removesuffix(".json.gz") for p in DATA.glob("*.json.gz")) == sorted(
        ANSWERS
    )


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_localized_from_the_core_as_the_scenario_expects(name, monkeypatch):
    rep, cps, sc, fake = load(name, monkeypatch)
    assert len(fake.calls) == 2 and rep.site_map_notes == []
    got = {r: (a["op"], a["barrier"]) for r, a in E.role_answers(rep, cps).items()}
    assert got == ANSWERS[name]
    g = E.grade(sc.expect.localization(), rep, cps, by=sc.expect.localized_by)
    assert g["ok"] is True, g


def test_a_deferred_barrier_holds_warps_several_instructions_past_it(monkeypatch):
    """sm90_attention: BAR.SYNC.DEFER_BLOCKING R8, 0x120 at +0xc90 (a register id), its 128
    consumer warps at +0xd00, six ALU instructions later."""
    rep, cps, _, _ = load("sm90_attention__wrong_barrier_threads_plus", monkeypatch)
    held = [w for w in rep.warps if w.construct.kind == "named_barrier"]
    assert len(held) == 128 and {w.offset for w in held} == {0xD00}
    assert {(w.construct.anchor.offset, w.construct.anchor.text) for w in held} == {
        (0xC90, "BAR.SYNC.DEFER_BLOCKING R8, 0x120")
    }
    assert {w.construct.threads for w in held} == {288}


def _renamed(name: str, monkeypatch, roles: dict[str, str], drop_row: str | None = None):
    """A recorded run read with its bisection roles renamed as a library's kernel names them
    (bisection names a role function by its function when two functions play the same pipeline
    role: quack 0.6.5's SM90 GEMM gives "load_tma" for its producer and "epilogue_split_k" for
    its TMA-store epilogue, its RMSNorm backward "all" for its producer_acquire: the roles of
    tools/coredump_coverage's field scenarios, compiled on the CPU this session); ``drop_row``:
    one warp row taken out of cuda-gdb's warp list (a warp that exited)."""
    doc = json.loads(gzip.open(DATA / f"{name}.json.gz", "rt").read())
    passes = list(doc["passes"])
    if drop_row is not None:
        assert passes[0].count(drop_row) == 1
        passes[0] = passes[0].replace(drop_row, "")
    monkeypatch.setattr(coredump, "gdb_session", PassReplay(passes).session)
    cps = [{**c, "role": roles.get(c["role"], c["role"])} for c in doc["checkpoint_sites"]]
    rep = coredump.read_core(
        "core",
        sass_text=doc["sass"],
        wait_sites=waitsites.sites_from_json(doc["wait_sites"]),
        checkpoint_sites=cps,
    )
    return rep, cps


def test_a_producer_function_bisection_names_otherwise_is_still_the_probes_producer(monkeypatch):
    """Graded by the probes' expectation (role producer: the side of producer_acquire), a
    producer whose bisection role is its function's name still matches; the per-role answers
    keep bisection's names."""
    rep, cps = _renamed("tma_stream__wrong_expect_tx_plus", monkeypatch, {"producer": "load_tma"})
    g = E.grade({"role": "producer", "op": "producer_acquire", "barrier": "empty"}, rep, cps)
    assert g["ok"] is True and g["matched"]["role"] == "load_tma"
    sites = E.stuck_sites(rep, cps)
    prod = [s for s in sites if s["op"] == "producer_acquire"]
    assert prod and {(s["role"], s["pipeline_role"]) for s in prod} == {("load_tma", "producer")}
    assert set(E.role_answers(rep, cps)) == {"load_tma", "consumer"}
    # a wrong expectation still fails
    assert E.grade({"role": "consumer", "op": "producer_acquire"}, rep, cps)["ok"] is False


def test_no_exit_inferred_for_a_live_producer_named_by_its_function(monkeypatch):
    """CTA 8 with one consumer warp gone (its row taken out): the consumers wait on full, the
    producer (bisection: "load_tma") is alive, waiting on empty. Nothing says the producer
    exited before producer_commit; read by bisection's names alone, "producer" was not among
    the live roles and the gone warp was reported as the producer's exit."""
    row = "   1        0xffffffff           0x00000000 0x00007f02d77a0a70      0  (8,0,0)   "
    row += "            (32,0,0) \n"
    rep, cps = _renamed(
        "tma_stream__wrong_expect_tx_plus", monkeypatch, {"producer": "load_tma"}, drop_row=row
    )
    assert E.missing_warps(rep) == {8: [1]}
    assert E.inferred_sites(rep, cps) == []
    assert "producer_commit" not in {a["op"] for a in E.role_answers(rep, cps).values()}
