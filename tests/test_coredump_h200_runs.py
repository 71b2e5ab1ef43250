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
