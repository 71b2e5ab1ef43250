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
        ("any", "create", "before", 0),
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
    assert re.search(r"%globaltimer", ptx) and len(sess.positions) == 7


# ---- the keys on the PTX of every family: each position's row guards the delay on the CTA id,
# the cluster rank, the warp and the lane --------------------------------------------------

FAMILIES = {
    "tma_stream": ("kernels/tma_stream.py", "TmaStream", {}),
    # the shapes of the latent scenarios (scenarios/<family>/*.toml)
    "cluster_reduce": (
        "kernels/cluster_reduce.py",
        "ClusterReduce",
        {"m": 48, "n": 16392, "cluster": 4, "clusters": 3, "threads": 128, "unroll": 4},
    ),
    "sm90_gemm": (
        "kernels/sm90_gemm.py",
        "Sm90Gemm",
        {"m": 1000, "n": 1000, "k": 1000, "ctas": 8, "cluster_m": 2},
    ),
    "sm90_attention": (
        "kernels/sm90_attention.py",
        "Sm90Attention",
        {"batch": 1, "heads": 2, "seqlen": 1000, "head_dim": 64},
    ),
    "minimal": ("kernels/minimal.py", "Minimal", {}),
}
_PERTURBED: dict = {}


def _perturbed(family: str):
    if family not in _PERTURBED:
        from cutedebug.instrument import perturb

        path, entry, params = FAMILIES[family]
        with perturb.instrument(ADDR) as sess:
            ptx = _compile(path, entry, params)
        _PERTURBED[family] = (ptx, sess)
    return _PERTURBED[family]


def row_guards(ptx: str, n_positions: int) -> dict[int, dict[int, list[str]]]:
    """For each position, each word of its table row: the instructions that use the register
    the word was loaded into (``ld.global.b32 %r, [%rd]`` with ``%rd`` set to the row's
    address ``ADDR + ROW_BYTES * position + 4 * word``)."""
    from cutedebug.instrument.perturb import ROW_BYTES

    addr_of: dict[str, int] = {}
    word_of: dict[str, tuple[int, int]] = {}
    uses: dict[int, dict[int, list[str]]] = {}
    for line in ptx.splitlines():
        line = line.strip()
        if not line:
            continue
        m = re.fullmatch(r"mov\.b64\s+(%rd\d+), (\d+);", line)
        if m and ADDR <= int(m[2]) < ADDR + ROW_BYTES * n_positions:
            addr_of[m[1]] = int(m[2]) - ADDR
            continue
        m = re.fullmatch(r"ld\.global\.b32\s+(%r\d+), \[(%rd\d+)(?:\+(\d+))?\];", line)
        if m and m[2] in addr_of:
            off = addr_of[m[2]] + int(m[3] or 0)
            word_of[m[1]] = (off // ROW_BYTES, off % ROW_BYTES // 4)
            uses.setdefault(off // ROW_BYTES, {}).setdefault(off % ROW_BYTES // 4, [])
            continue
        for reg in re.findall(r"%r\d+\b", line.split(None, 1)[-1]):
            if reg in word_of and not line.startswith("ld.global"):
                pos, word = word_of[reg]
                uses[pos][word].append(line)
    return uses


def _special(ptx: str, name: str) -> set[str]:
    """Registers read from a special register (``mov.u32 %rN, %laneid;``)."""
    return set(re.findall(rf"mov\.u32\s+(%r\d+), %{name};", ptx))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_position_guards_its_delay_on_cta_rank_warp_and_lane(family):
    ptx, sess = _perturbed(family)
    n = len(sess.positions)
    assert n > 0 and sess.dropped == 0
    assert ptx.count("%globaltimer") == 2 * n  # one spin loop per position
    guards = row_guards(ptx, n)
    assert sorted(guards) == list(range(n)), "every position reads its own row"
    lanes, ranks = _special(ptx, "laneid"), _special(ptx, "cluster_ctarank")
    assert lanes and ranks
    for pos, words in guards.items():
        where = f"{family} position {pos} ({sess.positions[pos].label})"
        # word 0, the delay: nothing is checked unless it is > 0
        assert any(re.match(r"setp\.lt\.s32\s+%p\d+, %r\d+, 1;", u) for u in words[0]), where
        # words 8 / 9: the lane mask shifted by %laneid, the rank mask by %cluster_ctarank
        # (under `if lane == 0` the compiler knows the lane: bit 0 is tested unshifted)
        for word, regs in ((8, lanes), (9, ranks)):
            assert any(
                (re.match(r"shr\.[us]32", u) and u.split()[-1][:-1] in regs)
                or (word == 8 and u.startswith("and.b32"))
                for u in words[word]
            ), f"{where}: word {word} {words[word]}"
        # words 1 / 2 and 10: the CTA window and residue test one register, the linear block id
        (lo,) = [u for u in words[1] if u.startswith("setp.ge.s32")]
        (hi,) = [u for u in words[2] if u.startswith("setp.le.s32")]
        (mod,) = [u for u in words[10] if u.startswith("rem.s32")]
        cta = lo.split(",")[1].strip()
        assert hi.split(",")[1].strip() == cta and mod.split(",")[1].strip() == cta, where
        assert re.search(rf"mad\.lo\.s32\s+{re.escape(cta)}, .*;", ptx), "bx + gx * (...)"
        assert words[11] and words[11][0].startswith("setp.ne.b32"), where  # residue compare
        # words 6 / 7: the warp window on one register (or, where the position sits under
        # `if tid == 0`, on the warp the compiler knows: 0, i.e. lo < 1 and hi > -1)
        wlo = [u for u in words[6] if u.startswith("setp.")]
        whi = [u for u in words[7] if u.startswith("setp.")]
        assert len(wlo) == len(whi) == 1, where
        if not wlo[0].startswith("setp.lt.s32") or not wlo[0].endswith(", 1;"):
            assert wlo[0].startswith("setp.ge.s32") and whi[0].startswith("setp.le.s32"), where
            assert wlo[0].split(",")[1] == whi[0].split(",")[1], where
        else:
            assert whi[0].startswith("setp.gt.s32") and whi[0].endswith(", -1;"), where


def test_cluster_reduce_has_raw_barrier_positions_where_its_protocol_turns():
    _, sess = _perturbed("cluster_reduce")
    src = (ROOT / "kernels/cluster_reduce.py").read_text().splitlines()
    got = [(p.where, p.op) for p in sess.positions]
    assert got == [
        ("before", "mbarrier_init"),  # slot 0 (thread 0, before any peer may send)
        ("before", "mbarrier_init"),  # slot 1
        ("before", "cluster_arrive_relaxed"),
        ("after", "cluster_wait"),
        ("before", "mbarrier_arrive_and_expect_tx"),  # the arm (warp 0 lane 0)
        ("before", "store_async_dsmem"),  # the partial to every peer
        ("after", "mbarrier_wait"),  # between the wait and the partials it guards
        ("before", "cluster_arrive"),  # the trailing barrier: the CTA's way out
        ("after", "cluster_wait"),
    ]
    for p in sess.positions:  # each on the kernel's own line of that op
        assert p.op.split("_")[0] in src[p.line - 1] and p.pipeline is None
    assert sess.shape == {"ctas": 12, "warps": 4, "cluster": 4}


def test_gemm_and_attention_positions_before_their_barrier_init():
    for family, creates in (("sm90_gemm", [0, None]), ("sm90_attention", [0, 1, 2])):
        _, sess = _perturbed(family)
        before = [p.pipeline for p in sess.positions if (p.where, p.op) == ("before", "create")]
        after = [p.pipeline for p in sess.positions if (p.where, p.op) == ("after", "create")]
        assert before == after == creates, family
        first = sess.positions[0]
        assert (first.where, first.op, first.pipeline) == ("before", "create", 0)
    assert _perturbed("sm90_gemm")[1].shape == {"ctas": 8, "warps": 12, "cluster": 2}
    assert _perturbed("sm90_attention")[1].shape["warps"] == 12


def test_ops_without_a_pipeline_state_draw_no_iteration_or_stage_keys():
    """sm90_gemm's TMA store ops (the epilogue's producer_acquire / commit, no pipeline state:
    the delay sees count 0) are not iterating positions, so the random policy gives them no
    iteration window (one that could never fire) and a stage/iter scope leaves them out; the
    mainloop's ops keep theirs."""
    from cutedebug.instrument import perturb_plan as P

    _, sess = _perturbed("sm90_gemm")
    store = [p for p in sess.positions if p.op in P.STATE_OPS and p.pipeline is None]
    loop = [p for p in sess.positions if p.op in P.STATE_OPS and p.pipeline is not None]
    assert store and loop
    assert not any(p.iterates for p in store) and all(p.iterates for p in loop)
    assert P.Position.from_json({**store[0].to_json()}).iterates is False
    older = {k: v for k, v in loop[0].to_json().items() if k != "stateful"}
    assert P.Position.from_json(older).iterates  # a report written before the field
    windows = [
        r.position
        for seed in range(64)
        for r in P.rules_for(P.Policy(), seed, sess.positions, ctas=8, iterations=8)
        if (r.it_lo, r.it_hi) != (0, P.MAX_INT)
    ]
    assert windows and not {w for w in windows} & {p.id for p in store}


def test_perturbation_off_leaves_every_familys_ptx_byte_identical():
    for family in ("cluster_reduce", "minimal"):
        path, entry, params = FAMILIES[family]
        before = _compile(path, entry, params)
        _perturbed(family)
        assert _compile(path, entry, params) == before, family
