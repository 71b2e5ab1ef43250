"""kernels/tma_stream.py on CPU: it compiles for sm_90a, its PTX carries the pipeline the
docstring promises (TMA loads, bounded waits, expect_tx bytes, arrive counts), the
``oob_store`` switch changes the stores, and a host model of its tile schedule and thread
mapping reproduces the torch reference on ragged shapes (and a stale stage does not)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from helpers.ptx import expect_tx_bytes, init_counts

from cutedebug.kernel_api import KernelLoadError, load_entry, resolve_params

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "kernels" / "tma_stream.py"
TmaStream = load_entry(KERNEL, "TmaStream")
tile_origin = sys.modules[TmaStream.__module__].tile_origin

_PTX: dict[tuple, str] = {}


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    """Compile (cached per params) and return the PTX text."""
    from cutlass import cute
    from cutlass.base_dsl.compiler import DumpDir

    dump = tmp_path_factory.mktemp("ptx")

    def compile_ptx(**params) -> str:
        key = tuple(sorted(params.items()))
        if key not in _PTX:
            k = TmaStream(**params)
            opts = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX(), DumpDir(str(dump))]
            _PTX[key] = opts(k, *k.fake_args()).__ptx__
        return _PTX[key]

    return compile_ptx


# ---- compile matrix ------------------------------------------------------------------------
RAGGED = [(1000, 1000), (1, 8), (4097, 264)]  # M and N not multiples of the tile


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("shape", RAGGED)
def test_compiles_with_the_promised_pipeline(ptx, dtype, stages, shape):
    m, n = shape
    k = TmaStream(m=m, n=n, dtype=dtype, stages=stages)
    text = ptx(m=m, n=n, dtype=dtype, stages=stages)
    elem = 4 if dtype == "fp32" else 2
    # docstring arithmetic: x tile + scale slice + bias slice, all landing in this CTA's smem
    assert k.tx_bytes == 32 * 256 * elem + 32 * 4 + 32 * 4
    assert expect_tx_bytes(text) == [k.tx_bytes]
    # full[0..S) count 1 (one producer thread), empty[0..S) count 4 (lane 0 of 4 consumer warps)
    assert init_counts(text) == [1] * stages + [4] * stages
    assert "fence.mbarrier_init" in text
    # one 2-D TMA for x and two 1-D TMAs (scale, bias) per stage, each behind elect.sync
    assert text.count("cp.async.bulk.tensor.2d.shared::cta.global.tile.mbarrier") == 1
    assert text.count("cp.async.bulk.tensor.1d.shared::cta.global.tile.mbarrier") == 2
    assert text.count("elect.sync") >= 3 + 2  # 3 copies, expect_tx, mbarrier inits
    # bounded try_wait loops: producer_acquire + consumer_wait + producer_tail (one per stage)
    assert text.count("mbarrier.try_wait.parity.shared.b64") == stages + 2
    assert re.search(r"LAB_WAIT:\s*\n\s*mbarrier\.try_wait", text)
    # consumer release: warp sync, then one arrive on empty[s]; create() syncs the CTA once
    assert re.search(r"bar\.warp\.sync\s+-1;(?:.|\n)*?mbarrier\.arrive\.shared\.b64", text)
    assert text.count("bar.sync") == 1
    assert ".reqntid 160, 1, 1" in text
    # 128-bit smem reads and global writes
    assert "ld.shared.v4.b32" in text and "st.global.v4.b32" in text
    assert "prefetch.tensormap" in text


def test_tx_bytes_for_the_tile_shapes_in_the_docstring():
    assert TmaStream(dtype="fp32", tile_m=32, tile_n=256).tx_bytes == 33024
    assert TmaStream(dtype="bf16", tile_m=32, tile_n=256).tx_bytes == 16640
    assert TmaStream(dtype="bf16", tile_m=64, tile_n=256).tx_bytes == 33280


def test_more_consumer_warps_raise_the_empty_arrive_count(ptx):
    text = ptx(m=4000, n=1000, stages=3, consumer_warps=8, tile_m=16)
    assert init_counts(text) == [1] * 3 + [8] * 3
    assert ".reqntid 288, 1, 1" in text
    assert expect_tx_bytes(text) == [16 * 256 * 4 + 2 * 16 * 4]


def test_persistent_loop_survives_when_tiles_outnumber_ctas(ptx):
    # 4000 x 1000 in 32 x 256 tiles = 500 tiles over 132 CTAs: the mainloops stay loops
    text = ptx(m=4000, n=1000, stages=4)
    assert text.count('.pragma "nounroll"') >= 2
    assert re.search(r"add\.s32\s+%r\d+, %r\d+, 132;", text)  # tile += grid


def test_oob_store_shifts_every_store_by_one_tile_row(ptx):
    clean = ptx(m=1000, n=1000, stages=2)
    shifted = ptx(m=1000, n=1000, stages=2, oob_store=True)
    assert clean != shifted
    shift_bytes = 32 * 1000 * 4
    assert f"+{shift_bytes}]" in shifted and f"+{shift_bytes}]" not in clean
    # the pipeline itself is untouched by the switch
    assert expect_tx_bytes(clean) == expect_tx_bytes(shifted)
    assert init_counts(clean) == init_counts(shifted)


# ---- interface and validation ----------------------------------------------------------------
def test_interface_matches_kernel_api():
    assert TmaStream.ARCHS == ("sm_90a",)
    switches = {
        "oob_store",
        "edge_pred_whole_tiles",
        "stale_smem_store",
        "unassumed_align",
        "overclaimed_align",
    }
    assert set(TmaStream.SWITCHES) == switches
    # each switch is a bool param of the same name, off by default, kept by the kernel
    defaults = resolve_params(TmaStream, {}, "t")
    assert {s: defaults[s] for s in switches} == dict.fromkeys(switches, False)
    for s in switches:
        k = TmaStream(**resolve_params(TmaStream, {s: True}, "t"))
        assert {o: getattr(k, o) for o in switches} == {o: o == s for o in switches}
    with pytest.raises(KernelLoadError, match="expected bool"):
        resolve_params(TmaStream, {"oob_store": 1}, "t")
    params = resolve_params(TmaStream, {"dtype": "bf16", "stages": 2, "oob_store": True}, "t")
    k = TmaStream(**params)
    assert k.oob_store and k.stages == 2 and k.dtype_name == "bf16"
    # the optional tiling(): 2 x 3 tiles over 2 CTAs, persistent order b, b + grid, ...
    t = TmaStream(m=64, n=768, ctas=2, tile_m=32, tile_n=256).tiling()
    assert t == {
        "shape": [64, 768],
        "tile": [32, 256],
        "stages": 4,
        "k_tiles": 1,
        "tile_cta": [[0, 1, 0], [1, 0, 1]],
        "tile_seq": [[0, 0, 1], [1, 2, 2]],
    }
    for name in TmaStream.SHRINKABLE:
        assert isinstance(TmaStream.PARAMS[name], int)
    with pytest.raises(KernelLoadError, match="allowed values"):
        resolve_params(TmaStream, {"dtype": "fp16"}, "t")


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"n": 1002}, "multiple of 16 bytes"),
        ({"n": 1004, "dtype": "bf16"}, "multiple of 16 bytes"),
        ({"stages": 8, "tile_m": 128}, "bytes of smem"),
        ({"tile_m": 8, "tile_n": 64, "consumer_warps": 8}, "multiple of 16 \\(rows"),
        ({"m": 70000, "n": 32768}, "32-bit"),
    ],
)
def test_bad_configurations_are_refused(kw, needle):
    with pytest.raises(ValueError, match=needle):
        TmaStream(**kw)


# ---- host model of the kernel: schedule, zero-fill, thread mapping --------------------------
def emulate(k, x, scale, bias, stale: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, write count per element) of the kernel, by its own schedule and indexing.

    ``stale``: each consumer reads its slot's previous occupant (the tile this CTA loaded
    ``stages`` tiles earlier, zeros on first use): what a read before the TMA landed sees.
    """
    out = torch.full((k.m, k.n), float("nan"), dtype=x.dtype)
    t = torch.arange(k.consumer_threads)
    row0 = t // k.threads_per_row
    col0 = (t % k.threads_per_row) * k.vec
    writes = torch.zeros(k.m, k.n, dtype=torch.int32)
    for cta in range(k.grid):
        slots = [None] * k.stages
        for i, tile in enumerate(range(cta, k.num_tiles, k.grid)):
            m0, n0 = tile_origin(tile, k.tiles_n, k.tile_m, k.tile_n)
            # TMA: full box, out-of-bounds zero-filled
            box = torch.zeros(k.tile_m, k.tile_n, dtype=x.dtype)
            rows = torch.zeros(2, k.tile_m)
            hm, hn = min(k.tile_m, k.m - m0), min(k.tile_n, k.n - n0)
            box[:hm, :hn] = x[m0 : m0 + hm, n0 : n0 + hn]
            rows[0, :hm], rows[1, :hm] = scale[m0 : m0 + hm], bias[m0 : m0 + hm]
            previous = slots[i % k.stages]
            slots[i % k.stages] = (box, rows)
            if stale:
                box, rows = previous or (torch.zeros_like(box), torch.zeros_like(rows))
            for p in range(k.passes):
                r = row0 + p * k.rows_per_pass
                row, col = m0 + r, n0 + col0
                keep = (row < k.m) & (col < k.n)
                for v in range(k.vec):
                    val = box[r, col0 + v].double() * rows[0, r].double() + rows[1, r].double()
                    out[row[keep], col[keep] + v] = val.float().to(x.dtype)[keep]
                    writes[row[keep], col[keep] + v] += 1
    return out, writes


def inputs(k):
    t = k.make_inputs("cpu")
    return t, k.reference(t)


@pytest.mark.parametrize(
    "kw",
    [
        {"m": 77, "n": 264, "ctas": 2, "stages": 2},  # ring wraps ~10 times per CTA
        {"m": 100, "n": 600, "ctas": 3, "stages": 3, "dtype": "bf16"},
        {"m": 33, "n": 520, "ctas": 132, "stages": 4, "tile_m": 16, "tile_n": 128},
        {"m": 50, "n": 72, "ctas": 1, "stages": 2, "consumer_warps": 8, "tile_m": 16, "tile_n": 64},
    ],
)
def test_schedule_and_mapping_reproduce_the_reference(kw):
    k = TmaStream(**kw)
    t, ref = inputs(k)
    assert k.tiles_m > 1 and k.tiles_n > 1  # tiles with non-zero row and column origins
    out, writes = emulate(k, t["x"], t["scale"], t["bias"])
    assert torch.equal(writes, torch.ones_like(writes))  # every element written exactly once
    atol, rtol = k.TOLERANCE
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


def test_a_stale_stage_is_a_visible_mismatch():
    k = TmaStream(m=200, n=520, ctas=2, stages=2)
    t, ref = inputs(k)
    out, _ = emulate(k, t["x"], t["scale"], t["bias"], stale=True)
    atol, rtol = k.TOLERANCE
    bad = ~torch.isclose(out, ref, atol=atol, rtol=rtol)
    assert bad.float().mean() > 0.9


def test_tile_origins():
    assert tile_origin(0, 4, 32, 256) == (0, 0)
    assert tile_origin(5, 4, 32, 256) == (32, 256)
    assert tile_origin(11, 3, 16, 128) == (48, 256)


def test_reference_is_the_fp32_fma_rounded_once():
    k = TmaStream(m=64, n=256)
    t, ref = inputs(k)
    assert ref.dtype == torch.float32 and ref.shape == (64, 256)
    fma = torch.addcmul(t["bias"].double()[:, None], t["x"].double(), t["scale"].double()[:, None])
    assert torch.equal(ref, fma.float())
    assert torch.isnan(k.output(t)).all()  # unwritten output is NaN, so gaps cannot pass
    assert (t["scale"] >= 0.5).all()  # zero-filled or stale data cannot match by accident


def test_pipeline_ops_go_through_cutlass_pipeline(ptx, monkeypatch):
    """Trace-time patches of cutlass.pipeline reach this kernel (how cutedebug injects faults)."""
    from cutlass.pipeline import PipelineTmaAsync
    from cutlass.pipeline.helpers import MbarrierArray

    original = MbarrierArray.arrive_and_expect_tx

    def plus16(self, index, tx_count, *, loc=None, ip=None):
        return original(self, index, tx_count + 16, loc=loc, ip=ip)

    monkeypatch.setattr(MbarrierArray, "arrive_and_expect_tx", plus16)
    monkeypatch.setattr(PipelineTmaAsync, "consumer_release", lambda self, state, **kw: None)
    text = ptx(m=777, n=1000, stages=3, seed=7)  # params unique to this test: fresh compile
    assert expect_tx_bytes(text) == [33024 + 16]
    assert "mbarrier.arrive.shared.b64" not in text


# ---- shared memory: the SharedStorage struct -------------------------------------------------
def test_shared_storage_is_the_docstring_layout():
    """mbarriers, then the x ring and the scale / bias rings, each 128 B aligned; a scale /
    bias stage is row_pad fp32 values apart (the ring's cosize: tile_m + (S - 1) * row_pad)."""
    k = TmaStream(tile_m=32, tile_n=256, dtype="fp32", stages=4)
    x_ring = 4 * 32 * 256 * 4
    rows = (32 + 3 * 32) * 4
    assert k.storage._offsets == {
        "barriers": 0,
        "x": 128,
        "scale": 128 + x_ring,
        "bias": 128 + x_ring + rows,
    }
    assert k.smem_bytes == 128 + x_ring + 2 * rows and k.storage.__alignof__() == 128
    assert k.x_stage_bytes == 32 * 256 * 4


@pytest.mark.parametrize("what", ["ring", "tx"])
def test_storage_that_disagrees_with_the_layouts_is_refused_at_trace_time(what):
    """__call__ checks the struct against the ring layouts (cute.cosize) and tx_bytes against
    cute.size_in_bytes of the three TMA boxes, before the kernel is traced."""
    import cutlass
    from cutlass import cute

    k = TmaStream(m=1000, n=1000, ctas=16)
    if what == "ring":
        fields = k.smem_fields()
        mem, align = cute.struct.MemRange, cute.struct.Align
        fields["bias"] = align[mem[cutlass.Float32, 32], 128]
        k.smem_fields = lambda: fields
        match = "SharedStorage.bias: 32 elements for a ring of cosize 128"
    else:
        k.tx_bytes -= 16
        match = "tx bytes 33008: one stage of TMA boxes is 33024 B"
    with pytest.raises(ValueError, match=match):
        cute.compile[cute.GPUArch("sm_90a")](k, *k.fake_args())
