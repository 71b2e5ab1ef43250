"""Schedule perturbation on the PTX (CPU compile): positions, their keys, the delay code, and
byte-identical PTX when perturbation is off."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytest.importorskip("cutlass")

ROOT = Path(__file__).resolve().parents[1]
ADDR = 0x7E0000000000


def _compile(path: str, entry: str, params: dict, ctx=None) -> str:
    import cutlass.cute as cute

    from cutedebug import kernel_api

    cls = kernel_api.load_entry(str(ROOT / path), entry)
    k = cls(**kernel_api.resolve_params(cls, params, entry))
    args = k.fake_args()
    opts = (cute.GPUArch("sm_90a"), cute.KeepPTX())
    if ctx is None:
        return cute.compile[opts](k, *args).__ptx__
    with ctx:
        return cute.compile[opts](k, *args).__ptx__


@pytest.fixture(scope="module")
def tma_stream():
    from cutedebug.instrument import perturb

    plain = _compile("kernels/tma_stream.py", "TmaStream", {})
    ctx = perturb.instrument(ADDR)
    sess = ctx.__enter__()
    try:
        import cutlass.cute as cute

        from cutedebug import kernel_api

        cls = kernel_api.load_entry(str(ROOT / "kernels/tma_stream.py"), "TmaStream")
        k = cls(**kernel_api.resolve_params(cls, {}, "TmaStream"))
        pert = cute.compile[(cute.GPUArch("sm_90a"), cute.KeepPTX())](k, *k.fake_args()).__ptx__
    finally:
        ctx.__exit__(None, None, None)
    again = _compile("kernels/tma_stream.py", "TmaStream", {})
    return plain, pert, again, sess


def test_positions_are_keyed_by_role_op_pipeline_and_the_kernels_line(tma_stream):
    _, _, _, sess = tma_stream
    src = (ROOT / "kernels/tma_stream.py").read_text().splitlines()
    got = [(p.role, p.op, p.where, p.pipeline) for p in sess.positions]
    assert got == [
        ("any", "create", "after", 0),
        ("producer", "producer_acquire", "after", 0),
        ("producer", "producer_commit", "after", 0),
        ("producer", "producer_tail", "before", 0),
        ("consumer", "consumer_wait", "after", 0),
        ("consumer", "consumer_release", "before", 0),
    ]
    for p in sess.positions:  # each position's line is the kernel's own call of that op
        assert os.path.basename(p.file) == "tma_stream.py"
        assert p.op in src[p.line - 1] or (p.op == "create" and "create(" in src[p.line - 1])
    assert sess.dropped == 0


def test_each_position_reads_its_table_row_and_spins_on_globaltimer(tma_stream):
    plain, pert, _, sess = tma_stream
    assert "globaltimer" not in plain
    # one spin loop per position: a start read and a loop read of %globaltimer
    assert pert.count("%globaltimer") == 2 * len(sess.positions)
    assert str(ADDR) in pert or hex(ADDR)[2:] in pert.lower()


def test_perturbation_off_leaves_the_ptx_byte_identical(tma_stream):
    plain, _, again, _ = tma_stream
    assert plain == again


def test_a_faulted_build_keeps_its_fault_and_gains_the_positions():
    from cutedebug.instrument import faults, perturb

    faulted = faults.inject("wrong_expect_tx", {"delta_bytes": 16})
    both = perturb.instrument(ADDR)
    import contextlib

    with contextlib.ExitStack() as st:
        st.enter_context(faulted)
        sess = st.enter_context(both)
        ptx = _compile("kernels/tma_stream.py", "TmaStream", {})
    assert "33040" in ptx  # the fault's expect_tx (33024 + 16)
    assert re.search(r"%globaltimer", ptx) and len(sess.positions) == 6
