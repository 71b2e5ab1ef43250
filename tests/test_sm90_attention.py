"""kernels/sm90_attention.py on CPU: it compiles for sm_90a (d 64 / 128, causal or not, ragged
seqlen), its PTX carries what the docstring promises (WGMMA with P from registers, TMA loads of
Q / K / V and the TMA store of O, expect_tx bytes per pipeline, arrive counts, the scheduler and
epilogue named barriers, setmaxnreg), and every applicable fault triggers, on the K pipeline and
on the V pipeline separately, changing only that pipeline's part of the PTX."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.ptx import PtxCache, expect_tx_bytes, init_counts, shrink_smem_field

from cutedebug.kernel_api import load_entry

pytestmark = pytest.mark.slow  # tens of seconds on the 2-core CI machine

ROOT = Path(__file__).resolve().parent.parent
Sm90Attention = load_entry(ROOT / "kernels" / "sm90_attention.py", "Sm90Attention")
SCENARIO = {"batch": 1, "heads": 2, "seqlen": 1000, "head_dim": 64}
K_PIPE, V_PIPE = 0, 1  # create() order, as the docstring says


@pytest.fixture(scope="module")
def compile_ptx(tmp_path_factory):
    """(PTX, fault sites), cached per params and fault (kernel-level switches are params)."""
    cache = PtxCache(Sm90Attention, tmp_path_factory.mktemp("ptx"), base=SCENARIO)

    def run(fault: str | None = None, args: dict | None = None, **params):
        text, applied = cache(fault, args, **params)
        return text, applied.sites

    return run


def named_barriers(text: str) -> list[tuple[str, str, int]]:
    """(op, id or register, thread count) of every counted bar.sync / bar.arrive."""
    return [
        (op, bar, int(n))
        for op, bar, n in re.findall(r"\bbar\.(sync|arrive)\s+(%r\d+|\d+),\s*(\d+);", text)
    ]


TMA_LOAD = "cp.async.bulk.tensor.3d.shared::cta.global.tile.mbarrier::complete_tx::bytes"
TMA_STORE = "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group"


# ---- clean compiles ----------------------------------------------------------------------
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_compiles_with_the_promised_pipeline(compile_ptx, head_dim, causal):
    params = {"head_dim": head_dim} | ({"causal": True} if causal else {})
    text, _ = compile_ptx(**params)
    k = Sm90Attention(**(SCENARIO | params))
    tile = 128 * head_dim * 2
    assert k.q_tx_bytes == k.k_tx_bytes == k.v_tx_bytes == tile
    assert expect_tx_bytes(text) == [tile, tile, tile]
    # K full[S], K empty[S], V full[S], V empty[S], Q full, Q empty: full 1, empty 8 warps
    s = k.stages
    assert init_counts(text) == [1] * s + [8] * s + [1] * s + [8] * s + [1, 8]
    # one fence + CTA sync (Q's create) for the three pipelines
    assert text.count("fence.mbarrier_init.release.cluster") == 1
    # S = QK^T from smem (n = 128), O += PV with P from registers (n = d), 4 / 8 k-steps,
    # peeled first block + loop
    qk = re.findall(
        r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16\s+\{[^}]*\},"
        r"\s*%rd",
        text,
    )
    pv = re.findall(
        rf"wgmma\.mma_async\.sync\.aligned\.m64n{head_dim}k16\.f32\.bf16\.bf16"
        r"\s+\{[^}]*\},\s*\{",
        text,
    )
    assert len(qk) == 2 * head_dim // 16
    assert len(pv) == 2 * 128 // 16
    # TMA: boxes of 64 columns (128B swizzle) per Q / K / V / O tile
    boxes = head_dim // 64
    assert text.count(TMA_LOAD) == 3 * boxes
    assert text.count(TMA_STORE) == boxes
    assert text.count("stmatrix.sync.aligned") > 0
    assert "fence.proxy.async.shared::cta" in text
    # named barriers: scheduler ids 2 / 3 (256 threads), epilogue id 1 (256), CTA sync 0
    bars = named_barriers(text)
    assert ("arrive", "2", 256) in bars and ("arrive", "3", 256) in bars
    assert ("sync", "1", 256) in bars
    assert {n for _, _, n in bars} == {256}
    assert sum(op == "sync" and b.startswith("%r") for op, b, _ in bars) >= 2
    assert ".reqntid 384, 1, 1" in text and ".minnctapersm 1" in text
    assert "setmaxnreg.dec.sync.aligned.u32 	40;" in text
    assert "setmaxnreg.inc.sync.aligned.u32 	232;" in text
    assert "ex2.approx" in text


def test_docstring_arithmetic():
    big = Sm90Attention(head_dim=128, seqlen=4096)
    assert big.k_tx_bytes == big.v_tx_bytes == 32768
    assert big.smem_bytes == 197632
    assert Sm90Attention(head_dim=64).k_tx_bytes == 16384
    assert Sm90Attention(seqlen=1000).m_blocks == 8  # ragged: the last tile has 104 rows
    with pytest.raises(ValueError):
        Sm90Attention(head_dim=96)
    with pytest.raises(ValueError):
        Sm90Attention(head_dim=128, stages=4)  # over the smem limit


def test_shared_storage_is_the_docstring_layout():
    """SharedStorage (the cute.struct smem_bytes is the size of): the K, V and Q mbarriers
    first, then Q, the K ring, the V ring and O, each on a 1024 B boundary."""
    k = Sm90Attention(head_dim=128, stages=2)
    tile = 128 * 128 * 2
    assert k.storage._offsets == {
        "k_barriers": 0,
        "v_barriers": 2 * 2 * 8,
        "q_barriers": 2 * 2 * 2 * 8,
        "q": 1024,
        "k": 1024 + tile,
        "v": 1024 + 3 * tile,
        "o": 1024 + 5 * tile,
    }
    assert k.storage.__alignof__() == 1024 and k.smem_bytes == 1024 + 6 * tile


@pytest.mark.parametrize("what", ["ring", "tx"])
def test_storage_that_disagrees_with_the_layouts_is_refused_at_trace_time(what):
    """__call__ checks the struct against the smem layouts (cute.cosize) and each pipeline's
    tx bytes against cute.size_in_bytes of its TMA box, before the kernel is traced."""
    import cutlass
    from cutlass import cute

    k = Sm90Attention(**SCENARIO)
    if what == "ring":
        shrink_smem_field(k, "v", cutlass.BFloat16)
        match = "SharedStorage.v: 16320 elements for a layout of cosize 16384"
    else:
        k.v_tx_bytes += 16
        match = "v tx bytes 16400: its TMA box is 16384 B"
    with pytest.raises(ValueError, match=match):
        cute.compile[cute.GPUArch("sm_90a")](k, *k.fake_args())


# ---- faults ------------------------------------------------------------------------------
PIPELINE_FAULTS = {  # scenario suffix -> (fault, args); each run on K and on V
    "wrong_expect_tx_plus": ("wrong_expect_tx", {"delta_bytes": 16}),
    "wrong_expect_tx_minus": ("wrong_expect_tx", {"delta_bytes": -16}),
    "missing_phase_flip_consumer": ("missing_phase_flip", {"role": "consumer"}),
    "missing_phase_flip_producer": ("missing_phase_flip", {"role": "producer"}),
    "skip_producer_tail": ("skip_producer_tail", {}),
    "skip_consumer_release": ("skip_consumer_release", {"at_iteration": 0}),
    "extra_consumer_release": ("extra_consumer_release", {"at_iteration": 0}),
    "wrong_arrive_count_empty_plus": ("wrong_arrive_count", {"delta": 1}),
    "wrong_arrive_count_empty_minus": ("wrong_arrive_count", {"delta": -1}),
    "wrong_arrive_count_full_plus": ("wrong_arrive_count", {"delta": 1, "barrier": "full"}),
    "early_exit_consumer": ("early_exit", {"role": "consumer"}),
    "early_exit_producer": ("early_exit", {"role": "producer"}),
}


@pytest.mark.parametrize("case", sorted(PIPELINE_FAULTS))
@pytest.mark.parametrize("pipe", [K_PIPE, V_PIPE])
def test_pipeline_fault_hits_only_the_selected_pipeline(compile_ptx, case, pipe):
    name, args = PIPELINE_FAULTS[case]
    clean, _ = compile_ptx()
    text, sites = compile_ptx(name, args | {"pipeline": pipe})
    assert sites, f"{name}{args} never triggered on pipeline {pipe}"
    assert all(site["pipeline_index"] == pipe for site in sites)
    assert text != clean
    if name == "wrong_expect_tx":
        want = [16384, 16384, 16384]
        want[1 + pipe] += args["delta_bytes"]  # PTX order: Q, K, V
        assert expect_tx_bytes(text) == want
    if name == "wrong_arrive_count":
        counts = init_counts(text)
        s, which = Sm90Attention.PARAMS["stages"], args.get("barrier", "empty")
        base = [1] * s + [8] * s + [1] * s + [8] * s + [1, 8]
        first = 2 * s * pipe + (s if which == "empty" else 0)
        for i in range(first, first + s):
            base[i] += args["delta"]
        assert counts == base


def test_other_pipeline_faults_trigger(compile_ptx):
    clean, _ = compile_ptx()
    for name, args in (("missing_init_fence", {}), ("skip_producer_tail", {})):
        text, sites = compile_ptx(name, args)
        assert sites and text != clean, name


def test_named_barrier_faults(compile_ptx):
    clean, _ = compile_ptx()
    # drop_sync counts bar.sync sites: 0 first turn, 1 loop turn, 2 last turn, 3 epilogue (id 1)
    text, sites = compile_ptx("drop_sync", {"which": 3})
    assert [s["barrier_id"] for s in sites] == [1]
    assert ("sync", "1", 256) not in named_barriers(text)
    text, sites = compile_ptx("drop_sync", {"which": 0})
    assert len(sites) == 1 and text != clean
    # every counted named barrier (scheduler arrives and syncs, epilogue) expects 288 threads
    text, sites = compile_ptx("wrong_barrier_threads", {"delta": 32})
    assert len(sites) == len(named_barriers(clean))
    assert {n for _, _, n in named_barriers(text)} == {288}


def test_switch_skip_rescale(compile_ptx):
    clean, _ = compile_ptx()
    text, _ = compile_ptx("skip_rescale")
    # fewer fp32 multiplies: the 2 rows x d/4 columns of O per thread are not rescaled
    assert text.count("mul.f32") < clean.count("mul.f32")
    assert expect_tx_bytes(text) == expect_tx_bytes(clean)
