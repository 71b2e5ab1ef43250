"""A big grid's core read on the CPU: the work per warp stays small and the report bounded.

minimal/spin_hang on the H200 left 8,448 warps in its core (reports/2026-12-01-h200-s4). The
cores here are H200 captures (tests/data/coredump/h200/) with their grid repeated until it has
as many warps (tests/helpers/big_core.py), read through the replayed cuda-gdb as in
test_coredump_h200.py: every warp still gets its place, the SASS is classified once per place,
not per warp, a grid whose consumer warps exited is analysed in linear time, and the report
keeps at most PICTURE_MAX_ITEMS stuck sites (every kind of place among them) and counts the
rest.
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
from cutedebug.analyses import sass as S
from cutedebug.engine import verdict as V
from cutedebug.instrument.probe_diagnosis import PICTURE_MAX_ITEMS
from cutedebug.reporting import stuck_map as SM
from tests.helpers.big_core import replicate
from tests.helpers.replay_gdb import ReplayGdb

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "coredump" / "h200"


def big_run(name: str, copies: int, run_dir: Path, monkeypatch):
    """A run folder as analyse finds it after the kill, its core the capture's grid x copies."""
    d = DATA / name
    facts = json.loads((d / "facts.json").read_text())
    base = int(re.match(r"\s*(0x[0-9a-f]+)", facts["function_base_line"]).group(1), 16)
    fake = ReplayGdb(replicate(gzip.open(d / "pass1.txt.gz", "rt").read(), copies), base, {})
    monkeypatch.setattr(coredump, "gdb_session", fake.session)
    sass = gzip.open(d / "sass.txt.gz", "rt").read()
    monkeypatch.setattr(coredump, "sass_of_cubin", lambda cubin: sass)
    (run_dir / "coredump.7.nvcudmp").write_bytes(b"\x7fELF" + bytes(60))
    outcome = V.Outcome()
    outcome.add({"event": "launched"})
    outcome.add({"event": "compiled", "wait_sites": facts["wait_sites"]})
    outcome.add({"event": "checkpoint_sites", "sites": facts["checkpoint_sites"]})
    return outcome, fake


def counting_classify(monkeypatch) -> list[int]:
    calls = []
    orig = S.Sass.classify

    def classify(self, offset):
        calls.append(offset)
        return orig(self, offset)

    monkeypatch.setattr(S.Sass, "classify", classify)
    return calls


def test_a_grid_of_8480_warps_is_classified_once_per_place(tmp_path, monkeypatch):
    outcome, fake = big_run("tma_stream__wrong_expect_tx_plus", 106, tmp_path, monkeypatch)
    calls = counting_classify(monkeypatch)
    ev = coredump.analyse(tmp_path, outcome, {})
    assert ev["coredump"]["warps"] == 8480
    pcs = set(fake.pcs.values())
    assert len(pcs) == 2  # the capture's PCs: the big grid's warps sit on the same ones
    # once per place and round (placed before the registers are read, again with the frames)
    assert len(calls) <= 2 * len(pcs)
    # round 2: per PC a focus, x/1i and bt; the registers of at most MAX_WARPS warps
    assert sum(c.startswith("echo @@pc") for c in fake.calls[1]) == 2
    assert sum(c.startswith("echo @@reg") for c in fake.calls[1]) == coredump.MAX_WARPS
    assert {r: (a["op"], a["barrier"], a["warps"]) for r, a in ev["role_answers"].items()} == {
        "consumer": ("consumer_wait", "full", 6784),
        "producer": ("producer_acquire", "empty", 1696),
    }


def test_every_warp_of_a_big_grid_is_placed_as_the_captured_grid_places_it(monkeypatch):
    """Placing once per place gives each warp what placing it alone gives: the big grid's
    warps, copy by copy, carry the original grid's places."""
    d = DATA / "tma_stream__wrong_expect_tx_plus"
    facts = json.loads((d / "facts.json").read_text())
    base = int(re.match(r"\s*(0x[0-9a-f]+)", facts["function_base_line"]).group(1), 16)
    pass1 = gzip.open(d / "pass1.txt.gz", "rt").read()
    from cutedebug.instrument import waitsites

    kw = dict(
        sass_text=gzip.open(d / "sass.txt.gz", "rt").read(),
        wait_sites=waitsites.sites_from_json(facts["wait_sites"]),
        checkpoint_sites=facts["checkpoint_sites"],
    )
    places = []
    for text in (pass1, replicate(pass1, 3)):
        monkeypatch.setattr(coredump, "gdb_session", ReplayGdb(text, base, {}).session)
        rep = coredump.read_core("core", **kw)
        places.append(
            Counter(
                (w.offset, w.role, w.op, w.barrier, w.file, w.line, w.site_exact) for w in rep.warps
            )
        )
    assert places[1] == Counter({k: 3 * n for k, n in places[0].items()})


def test_a_big_grid_whose_consumers_exited_is_analysed_in_linear_time(tmp_path, monkeypatch):
    """8,448 CTAs, each a producer warp waiting on empty and its 4 consumer warps gone: the
    exited role is inferred per CTA (33,792 inferred entries). CTA by CTA over every warp, it
    took ~12 s on this CPU; grouped once, about a second."""
    outcome, _ = big_run("bisect__tma_stream_early_exit_consumer", 528, tmp_path, monkeypatch)
    t0 = time.monotonic()
    ev = coredump.analyse(tmp_path, outcome, {}, {"role": "consumer"}, "bisect")
    assert time.monotonic() - t0 < 6
    assert ev["coredump"]["warps"] == 8448
    assert {r: (a["op"], a["barrier"], a["warps"]) for r, a in ev["role_answers"].items()} == {
        "producer": ("producer_acquire", "empty", 8448),
        "consumer": ("consumer_release", "empty", 4 * 8448),
    }
    assert ev["coredump_grade"]["ok"] is True
    # the report's list is bounded, every kind of place kept, the rest counted
    sites = ev["stuck_sites"]
    assert len(sites) == PICTURE_MAX_ITEMS
    assert ev["stuck_sites_unlisted"] == 8448 + 4 * 8448 - PICTURE_MAX_ITEMS
    assert {(s["role"], s["op"], s["kind"]) for s in sites} == {
        ("producer", "producer_acquire", "mbarrier_wait"),
        ("consumer", "consumer_release", "exited"),
    }


def test_the_stuck_map_of_a_big_grid_says_what_it_leaves_out(tmp_path, monkeypatch):
    from cutedebug.instrument.probe_host import snapshot_from_json

    outcome, _ = big_run("tma_stream__wrong_expect_tx_plus", 106, tmp_path, monkeypatch)
    pic = coredump.analyse(tmp_path, outcome, {})["coredump_picture"]
    assert len(pic["stuck"]) == PICTURE_MAX_ITEMS and pic["n_stuck_reported"] == 8480
    assert pic["stuck_unlisted"] == 8480 - PICTURE_MAX_ITEMS
    m = SM.build(snapshot_from_json(pic), pic["sites"])
    assert m.dropped_records == 0 and m.n_unlisted == 8480 - PICTURE_MAX_ITEMS
    assert m.dropped_note().startswith(f"{8480 - PICTURE_MAX_ITEMS} of 8480 stuck records")


def test_the_report_of_a_big_grid_counts_the_sites_it_does_not_list(tmp_path, monkeypatch):
    from cutedebug.engine import runner
    from cutedebug.engine import scenario as SC
    from cutedebug.reporting import report

    outcome, _ = big_run("tma_stream__wrong_expect_tx_plus", 106, tmp_path, monkeypatch)
    sc = SC.load(ROOT / "scenarios" / "tma_stream" / "wrong_expect_tx_plus.toml")
    ev = coredump.analyse(tmp_path, outcome, {}, sc.expect.localization(), "probes")
    res = runner.RunResult(
        scenario=sc,
        verdict=V.Verdict.HANG,
        reason="",
        run_dir=tmp_path,
        outcome=outcome,
        evidence=ev,
        probes_used=False,
    )
    assert res.localization["ok"] is True
    md = report.to_markdown(res)
    n = 8480 - PICTURE_MAX_ITEMS
    assert (
        f"{n} more stuck warp(s) not listed: the report keeps {PICTURE_MAX_ITEMS}, every kind "
        "of place among them; the diagnosis counts all 8480." in md
    )
    assert "consumer: 6784 warp(s) in mbarrier_wait" in md  # the diagnosis: all of them


@pytest.mark.parametrize("n,limit", [(5, 8), (50, 8)])
def test_bounded_keeps_the_first_of_each_kind_then_the_rest_in_order(n, limit):
    sites = [
        {"role": "r", "op": f"op{i % 3}" if i < 45 else "late", "barrier": None}
        | {"location": "f.py:1", "kind": "k"}
        for i in range(n)
    ]
    kept, left = E.bounded(sites, limit)
    assert len(kept) == min(n, limit) and left == n - len(kept)
    assert {s["op"] for s in kept} == {s["op"] for s in sites}
    assert kept == [s for s in sites if any(s is k for k in kept)]  # in their order
