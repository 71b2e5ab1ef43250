"""The field scenarios' perturbation predictions name positions that exist (issue 20).

Each field latent fault predicted exposable (tools/gpu_pending.py PERTURB_CHECKS) names one
schedule in its note: a targeted position or a role, with a scope. The kernels are the
installed libraries' (quack, FlashAttention-4), so a position index is only known after a
trace of the faulted kernel with perturbation on: here each is traced on CPU (sm_90a, the
DSL's dry run: positions are recorded while tracing) and the rules the check's flags give
(``perturb_plan.rules_for``, as a run builds them) must exist, fire in the threads the note
names, and sit at the library line the note names. A library update that renumbers the
positions fails here, not inside a GPU call. Skipped without the field libraries.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from pathlib import Path

import pytest
from helpers.trace_only import trace_only

from cutedebug.engine import scenario as S

pytest.importorskip("cutlass")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import gpu_pending  # noqa: E402
import perturb_table  # noqa: E402

ADDR = 0x7E0000000000
ALL_LANES = 0xFFFFFFFF

# check -> scenario -> what its note says the schedule delays: (op, where, pipeline, the
# library file:line) of each delayed position, and the threads (the rule's keys).
EXPECTED = {
    ("warp0_before_init", "field/quack_gemm_sm90/missing_init_fence"): (
        [("create", "before", 0, "quack/gemm_base.py:1240")],
        {"warp_lo": 0, "warp_hi": 0},
    ),
    ("warp0_before_init", "field/fa4_fwd_sm90/missing_init_fence"): (
        [("create", "before", 0, "flash_attn/cute/flash_fwd_sm90.py:464")],
        {"warp_lo": 0, "warp_hi": 0},
    ),
    ("rank1_consumers_slow", "field/quack_rmsnorm_bwd/skip_producer_tail"): (
        [("consumer_release", "before", 0, "quack/rmsnorm.py:1111")],
        {"ranks": 0b10},
    ),
    ("rank1_wg1_consumers_slow", "field/quack_rmsnorm_bwd/wrong_arrive_count_empty_minus"): (
        [("consumer_release", "before", 0, "quack/rmsnorm.py:1111")],
        {"ranks": 0b10, "warp_lo": 4, "warp_hi": 7},
    ),
    ("wg2_before_epilogue", "field/fa4_fwd_sm90/drop_sync"): (
        [("consumer_release", "before", 2, "flash_attn/cute/flash_fwd_sm90.py:1351")],
        {"warp_lo": 8, "warp_hi": 11},
    ),
}
# the launches the notes describe: CTAs, warps a CTA, CTAs a cluster
SHAPES = {
    "quack_gemm_sm90": {"ctas": 32, "warps": 12, "cluster": 1},
    "fa4_fwd_sm90": {"ctas": 128, "warps": 12, "cluster": 1},
    "quack_rmsnorm_bwd": {"ctas": 1056, "warps": 8, "cluster": 4},
}
FIELD_CHECKS = [
    (name, flags, sid)
    for name, flags, ids in gpu_pending.PERTURB_CHECKS
    for sid in ids
    if sid.startswith("field/")
]


def _missing(sid: str) -> list[str]:
    return S.load(ROOT / "scenarios" / f"{sid}.toml").missing_modules()


def _positions(sid: str):
    """Trace the scenario's kernel, its fault applied, with perturbation on: the session."""
    import cutlass.cute as cute

    from cutedebug import kernel_api
    from cutedebug.instrument import faults, perturb

    sc = S.load(ROOT / "scenarios" / f"{sid}.toml")
    cls = kernel_api.load_entry(sc.kernel_file, sc.kernel_entry)
    k = cls(**kernel_api.resolve_params(cls, dict(sc.params), sc.id))
    with contextlib.ExitStack() as st:
        st.enter_context(faults.inject(sc.fault, sc.fault_args))
        sess = st.enter_context(perturb.instrument(ADDR))
        st.enter_context(trace_only())
        cute.compile[(cute.GPUArch("sm_90a"),)](k, *k.fake_args())
    return sess


def test_every_field_check_has_its_expectation():
    assert {(n, s) for n, _, s in FIELD_CHECKS} == set(EXPECTED)


@pytest.mark.slow
@pytest.mark.parametrize("check", FIELD_CHECKS, ids=lambda c: f"{c[0]}-{c[2]}")
def test_a_field_checks_schedule_delays_the_position_and_threads_its_note_names(check, monkeypatch):
    from cutedebug.instrument import perturb_plan as P

    name, flags, sid = check
    if missing := _missing(sid):
        pytest.skip(f"field libraries not installed: {missing}")
    monkeypatch.setenv("CUTE_DSL_ARCH", os.environ.get("CUTE_DSL_ARCH", "sm_90a"))
    sess = _positions(sid)
    assert sess.dropped == 0
    shape = SHAPES[sid.split("/")[1]]
    assert sess.shape == shape, sid
    args = perturb_table.parser().parse_args([*shlex.split(flags), "x.toml"])
    policy = P.Policy(**perturb_table.policy_of(args))
    rules = P.rules_for(policy, 0, sess.positions, shape["ctas"], None, shape["warps"])
    assert rules == P.rules_for(policy, 1, sess.positions, shape["ctas"], None, shape["warps"])
    by_id = {p.id: p for p in sess.positions}
    where, keys = EXPECTED[(name, sid)]
    got = []
    for r in rules:
        pos = by_id[r.position]
        assert pos.file.endswith("/" + where[0][3].rsplit(":", 1)[0]), pos.file
        got.append((pos.op, pos.where, pos.pipeline, f"{where[0][3].split(':')[0]}:{pos.line}"))
    assert got == where, (sid, [by_id[r.position].label for r in rules])
    for r in rules:
        assert r.delay_ns == int(args.delay_us * 1000)
        row = r.to_json()
        for key, value in keys.items():
            assert row[key] == value, (sid, key, row)
        assert row.get("lanes", ALL_LANES) == ALL_LANES  # whole warps (no lane subset)
