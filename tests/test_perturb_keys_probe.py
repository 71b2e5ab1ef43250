"""tools/perturb_keys_probe.py on CPU: its kernel traces to the positions and launch shape the
GPU check relies on, and its verdict per scope tells literal lane keys, reconverged warps and a
key that selects the wrong threads apart."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))


def test_the_probe_kernel_has_its_positions_and_cluster_shape():
    import perturb_keys_probe as K
    from cutlass import Int64
    from cutlass.cute.runtime import make_fake_tensor

    from cutedebug.instrument import perturb

    y = make_fake_tensor(Int64, (K.CTAS * K.THREADS,), stride=(1,), assumed_align=16)
    compiled, sess = K.compile_kernel(perturb.make_table(False)[1], y)
    assert (sess.positions[K.PROBED].where, sess.positions[K.PROBED].op) == (
        "after",
        "cluster_wait",
    )
    assert "%globaltimer" in compiled.__ptx__ and "%cluster_ctarank" in compiled.__ptx__


def test_each_scope_is_told_exact_whole_warps_or_mismatch():
    import perturb_keys_probe as K

    from cutedebug.instrument import perturb_plan as P

    for scope in K.SCOPES:  # every scope selects someone in the probe's launch
        assert K.selected(P.Rule(K.PROBED, 1, **P.parse_scope(scope))), scope
    rule = P.Rule(K.PROBED, 1, **P.parse_scope("rank=1 lane=nonelected"))
    lanes = K.selected(rule)
    assert {(c, r) for c, r, _, _ in lanes} == {(1, 1), (3, 1)}
    assert {ln for *_, ln in lanes} == set(range(1, 32))
    assert K.compare(lanes, rule) == "exact"
    assert K.compare(K.whole_warps(lanes), rule) == "whole warps"
    wrong_rank = {(c - 1, 0, w, ln) for c, _, w, ln in lanes}
    assert K.compare(wrong_rank, rule).startswith("MISMATCH")
    assert K.compare(set(), rule).startswith("MISMATCH")
