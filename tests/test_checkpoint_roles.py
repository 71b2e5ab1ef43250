"""Warp roles by warp branch (cutedebug/instrument/checkpoint_branches.py): a role function
left with its function name takes the pipeline role its kernel-body branch plays first.

The H200 graded quack GEMM's two named-barrier hangs from the core as `epilogue_split_k`
(reports/2026-12-02-h200-s2/call4/coredump_rest), not the consumer the scenarios expect: quack
calls its epilogue in the consumer warps' branch after the mainloop, and its name was kept
because the epilogue's TMA-store producer ops collided with `load_tma`'s producer name."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from cutedebug.instrument.checkpoint_branches import names_by_warp_branch

REPO = Path(__file__).resolve().parents[1]
ROLE = {"producer_acquire": "producer", "consumer_wait": "consumer"}


def _site(i, kind, op, arm):
    return SimpleNamespace(id=i, kind=kind, op=op, arm=arm)


def _names(sites, groups, names):
    return names_by_warp_branch(sites, groups, names, lambda s: [s.arm] if s.arm else [], ROLE.get)


def test_a_function_in_the_consumer_branch_is_the_consumer():
    load, mma, epi = ("k", "load_tma"), ("k", "mma"), ("k", "epilogue_split_k")
    sites = [
        _site(0, "pipeline", "producer_acquire", "A"),
        _site(1, "pipeline", "consumer_wait", "B"),
        _site(2, "named_barrier", "named_barrier", "B"),
    ]
    names = {load: "load_tma", mma: "consumer", epi: "epilogue_split_k"}
    out = _names(sites, [load, mma, epi], names)
    assert out == {load: "producer", mma: "consumer", epi: "consumer"}


def test_a_function_alone_in_its_branch_or_in_a_branch_of_a_shared_role_keeps_its_name():
    load, store, mma = ("k", "load"), ("k", "dQaccum_store"), ("k", "mma")
    # FA-4 backward: the dQ store warp has a branch of its own (no pipeline op in it)
    sites = [
        _site(0, "pipeline", "producer_acquire", "A"),
        _site(1, "named_barrier", "named_barrier", "S"),
        _site(2, "pipeline", "consumer_wait", "B"),
    ]
    names = {load: "producer", store: "dQaccum_store", mma: "consumer"}
    assert _names(sites, [load, store, mma], names)[store] == "dQaccum_store"
    # two branches that both begin as producers: neither names a third function
    a, b, c = ("k", "load_a"), ("k", "load_b"), ("k", "helper")
    sites = [
        _site(0, "pipeline", "producer_acquire", "A"),
        _site(1, "pipeline", "producer_acquire", "B"),
        _site(2, "named_barrier", "named_barrier", "B"),
    ]
    out = _names(sites, [a, b, c], {a: "load_a", b: "load_b", c: "helper"})
    assert out[c] == "helper"


@pytest.mark.slow
def test_quack_gemm_sites_are_producer_and_consumer(tmp_path):
    from cutedebug.engine import runner
    from cutedebug.engine import scenario as S
    from cutedebug.event_kinds import CheckpointSites

    sc = S.load(
        REPO / "scenarios" / "field" / "quack_gemm_sm90" / "wrong_barrier_threads_plus.toml"
    )
    if sc.missing_modules():
        pytest.skip(f"field libraries not installed: {sc.missing_modules()}")
    _, outcome, _ = runner.run_once(
        sc, tmp_path, mode="compile", request_extra={"bisect": {"site": -1}}
    )
    sites = outcome.last(CheckpointSites).sites
    roles = Counter(s["role"] for s in sites)
    assert set(roles) == {"producer", "consumer", "all"}, roles
    barriers = {
        s["role"] for s in sites if s["op"] == "named_barrier" and s["function"] == "epilogue"
    }
    assert barriers == {"consumer"}
