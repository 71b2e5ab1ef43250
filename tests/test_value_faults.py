"""The wrong-value faults (cutedebug.instrument.value_faults) and the kernels' value switches,
compiled for sm_90a on the CPU: what each changes in the PTX, where its sites point, the DSL's
real alignment verifier error (parsed by the classifier), and the worker's mismatch map."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cutedebug.instrument import faults, value_faults

ROOT = Path(__file__).resolve().parents[1]
STREAM = ROOT / "kernels/tma_stream.py"
STREAM_PARAMS = {"m": 200, "n": 260, "ctas": 4}


def test_value_faults_are_in_the_registry_once():
    for fault in value_faults.entries():
        assert faults.FAULTS[fault.name].description == fault.description
    with pytest.raises(RuntimeError, match="registered twice"):
        value_faults.register(faults.FAULTS)
    assert faults.validate("skip_consumer_wait", {}) == {"at_iteration": 0}
    assert faults.validate("release_before_read", {"pipeline": 1}) == {"pipeline": 1}
    assert faults.expected_verdict("unassumed_align", {})[0] == "COMPILE_ERROR"
    # the verifier error is a compile's; the pointer check needs the real arguments (a run)
    assert not faults.FAULTS["unassumed_align"].error_at_run
    assert faults.FAULTS["overclaimed_align"].error_at_run


# ---- compiles ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cute_mod():
    return pytest.importorskip("cutlass.cute")


def compile_ptx(cute, obj, *args, dump: Path) -> str:
    with contextlib.chdir(dump):
        return cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](obj, *args).__ptx__


@pytest.fixture(scope="module")
def stream(cute_mod, tmp_path_factory):
    from cutedebug import kernel_api

    cls = kernel_api.load_entry(STREAM, "TmaStream")
    dump = tmp_path_factory.mktemp("ptx")

    def build(**switches) -> str:
        obj = cls(**STREAM_PARAMS, **switches)
        return compile_ptx(cute_mod, obj, *obj.fake_args(), dump=dump)

    build.clean = build()
    return build


def line_of(path: Path, text: str, nth: int | None = None) -> int:
    """The line holding ``text``: the only one, or the nth (0-based) of several."""
    lines = path.read_text().splitlines()
    hits = [i + 1 for i, ln in enumerate(lines) if text in ln]
    assert len(hits) == 1 or nth is not None, (text, hits)
    return hits[nth or 0]


def try_waits(ptx: str) -> int:
    return len(re.findall(r"mbarrier\.try_wait", ptx))


def arrives(ptx: str) -> int:
    return len(re.findall(r"mbarrier\.arrive\.shared\.b64", ptx))


def test_skip_consumer_wait_every_iteration_removes_the_consumer_wait(stream):
    with faults.inject("skip_consumer_wait", {"at_iteration": -1}) as applied:
        ptx = stream()
    assert try_waits(ptx) == try_waits(stream.clean) - 1
    assert [(s["file"], s["line"]) for s in applied.sites] == [
        (str(STREAM), line_of(STREAM, "ring.consumer_wait(state)"))
    ]
    assert stream() == stream.clean  # restored


def test_skip_consumer_wait_at_one_count_keeps_the_wait_behind_a_test(stream):
    with faults.inject("skip_consumer_wait", {"at_iteration": 0}) as applied:
        ptx = stream()
    assert try_waits(ptx) == try_waits(stream.clean) and ptx != stream.clean
    assert "run-time test" in applied.sites[0]["detail"]


def test_release_before_read_moves_the_release_without_adding_arrives(stream):
    with faults.inject("release_before_read", {}) as applied:
        ptx = stream()
    assert arrives(ptx) == arrives(stream.clean) and ptx != stream.clean
    assert sorted((s["op"], s["line"]) for s in applied.sites) == sorted(
        [
            ("consumer_wait", line_of(STREAM, "ring.consumer_wait(state)")),
            # the first of the two releases: the second belongs to the stale_smem_store switch
            ("consumer_release", line_of(STREAM, "ring.consumer_release(state)", nth=0)),
        ]
    )


def test_value_switches_change_the_compiled_kernel(stream):
    edge, stale = stream(edge_pred_whole_tiles=True), stream(stale_smem_store=True)
    assert len({edge, stale, stream.clean}) == 3
    # the stale store copies smem -> gmem directly: no fma feeds the stores any more
    assert "fma.rn.f32" in stream.clean and "fma.rn.f32" not in stale


def test_unassumed_align_is_rejected_by_the_dsl_verifier_and_classified(stream):
    from cutedebug.analyses import mismatch

    with value_faults.record_copy_sites() as sites, pytest.raises(Exception) as err:
        stream(unassumed_align=True)
    d = mismatch.diagnose_compile_error({"message": str(err.value), "copy_sites": sites})
    assert d is not None and d["row"] == "alignment"
    assert (d["view"], d["have_bits"], d["need_bits"]) == ("destination", 32, 128)
    assert d["lines"] == [f"{STREAM}:{line_of(STREAM, 'cute.copy(store_atom, ry, dst)')}"]
    assert any("destination view in gmem proves 32 bits" in e for e in d["evidence"])
    # one record per traced call site and alignment, however often an unrolled loop traces it
    assert len(sites) == len(
        {(x["file"], x["line"], x["atom"], x["dst_align_bits"]) for x in sites}
    )


def test_drop_copy_pred_unpredicates_tiled_copies(cute_mod, tmp_path):
    import cutlass
    from cutlass.cute.runtime import make_fake_tensor
    from helpers import pred_copy_kernel

    host = pred_copy_kernel.host
    x = make_fake_tensor(cutlass.Float32, (128,), stride=(1,), assumed_align=16)
    y = make_fake_tensor(cutlass.Float32, (128,), stride=(1,), assumed_align=16)
    clean = compile_ptx(cute_mod, host, x, y, dump=tmp_path)
    with faults.inject("drop_copy_pred", {}) as applied:
        dropped = compile_ptx(cute_mod, host, x, y, dump=tmp_path)
    # predicated: 4 guarded scalar loads and stores; unpredicated: one 128-bit load and store
    assert len(re.findall(r"ld\.global\.b32", clean)) == 4
    assert len(re.findall(r"st\.global\.b32", clean)) == 4
    assert len(re.findall(r"ld\.global\.v4", dropped)) == 1
    assert len(re.findall(r"st\.global\.v4", dropped)) == 1
    src = Path(pred_copy_kernel.__file__)
    assert [(s["file"], s["line"]) for s in applied.sites] == [
        (str(src), line_of(src, "x, (4,), (tid,)), r, pred=pred")),
        (str(src), line_of(src, "r, cute.local_tile(y, (4,), (tid,)), pred=pred")),
    ]
    with faults.inject("drop_copy_pred", {"which": 1}) as one:
        compile_ptx(cute_mod, host, x, y, dump=tmp_path)
    assert [s["copy_index"] for s in one.sites] == [1]


# ---- the worker's map -------------------------------------------------------------------------


class _TiledKernel:
    def tiling(self):
        return {
            "shape": [6, 8],
            "tile": [4, 4],
            "stages": 2,
            "k_tiles": 1,
            "tile_cta": [[0, 1], [0, 1]],
            "tile_seq": [[0, 0], [1, 1]],
        }


def test_worker_maps_a_mismatch_and_keeps_the_mask(tmp_path):
    torch = pytest.importorskip("torch")
    from cutedebug.engine import valuemap

    ref = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    out = ref.clone()
    out[4:, :] = float("nan")  # the partial tile row (rows 4-5)
    fields = valuemap.mismatch_fields(_TiledKernel(), out, ref, 1e-5, 1e-5, str(tmp_path))
    m = fields["mismatch_map"]
    assert m["tile_bad"] == [[0, 0], [8, 8]] and m["partial_rows"] == 2
    assert m["bad_values"]["nan"] == 16
    header, flat = valuemap.load_mask(tmp_path / fields["mismatch_mask"])
    assert header["tiling"]["tile"] == [4, 4] and int(flat.sum()) == 16
    # a kernel without tiling() still gets counts, and a failing tiling() is reported, not fatal
    assert (
        valuemap.mismatch_fields(object(), out, ref, 1e-5, 1e-5, None)["mismatch_map"][
            "tiling_problem"
        ]
        == "the kernel has no tiling()"
    )

    class Broken:
        def tiling(self):
            raise RuntimeError("boom")

    assert (
        "boom"
        in valuemap.mismatch_fields(Broken(), out, ref, 1e-5, 1e-5, None)["mismatch_map_error"]
    )


# ---- end to end on the CPU: the verifier error becomes a diagnosis ----------------------------


def test_run_names_the_alignment_row_and_the_copy(tmp_path, cute_mod):
    scenario = ROOT / "scenarios/tma_stream/unassumed_align.toml"
    out = subprocess.run(
        [sys.executable, "-m", "cutedebug", "run", str(scenario), "--runs-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = line_of(STREAM, "cute.copy(store_atom, ry, dst)")
    assert out.stdout.startswith("COMPILE_ERROR (as expected)"), out.stdout + out.stderr
    assert "failure table row 'copy-alignment verifier error'" in out.stdout
    assert f"tma_stream.py:{line}]" in out.stdout
    report = next(tmp_path.glob("*/report.md")).read_text()
    assert "## Wrong values: failure-table diagnosis" in report
    assert "destination view of a 128-bit copy proves only 32-bit alignment" in report


def test_protocol_sites_point_at_the_kernels_wait_and_release(cute_mod, tmp_path):
    from cutedebug import kernel_api
    from cutedebug.analyses import lint
    from cutedebug.engine import valuemap

    obj = kernel_api.load_entry(STREAM, "TmaStream")(**STREAM_PARAMS)
    with lint.record() as protocol:
        compile_ptx(cute_mod, obj, *obj.fake_args(), dump=tmp_path)
    sites = {(s["op"], s["line"]) for s in valuemap.protocol_sites(protocol)}
    assert ("consumer_wait", line_of(STREAM, "ring.consumer_wait(state)")) in sites
    assert ("consumer_release", line_of(STREAM, "ring.consumer_release(state)", nth=0)) in sites
    assert ("producer_acquire", line_of(STREAM, "ring.producer_acquire(state)")) in sites


def test_copy_recorder_is_an_observer_and_finds_the_stores(stream, cute_mod, tmp_path):
    from cutedebug import kernel_api
    from cutedebug.engine import valuemap

    with value_faults.record_copy_sites() as sites:
        ptx = stream()
    assert ptx == stream.clean
    stores = valuemap.store_sites(sites)
    assert [(s["file"], s["line"]) for s in stores] == [
        (str(STREAM), line_of(STREAM, "cute.autovec_copy(ry, dst)"))
    ]
    gemm = ROOT / "kernels/sm90_gemm.py"
    obj = kernel_api.load_entry(gemm, "Sm90Gemm")(m=256, n=256, k=128, ctas=2, cluster_m=1)
    with value_faults.record_copy_sites() as sites:
        compile_ptx(cute_mod, obj, *obj.fake_args(), dump=tmp_path)
    assert [(s["line"]) for s in valuemap.store_sites(sites)] == [
        line_of(gemm, "cute.copy(tma_c, bsg_sc[(None, buf)]")
    ]


def test_shrink_tma_bounds_cuts_the_store_atoms_tensor_to_whole_tiles(cute_mod, tmp_path):
    from cutedebug import kernel_api

    gemm = ROOT / "kernels/sm90_gemm.py"
    obj = kernel_api.load_entry(gemm, "Sm90Gemm")(m=1000, n=1000, k=128, ctas=2, cluster_m=1)
    with faults.inject("shrink_tma_bounds", {"copies": "store"}) as applied:
        compile_ptx(cute_mod, obj, *obj.fake_args(), dump=tmp_path)
    # one TMA store atom (C, epilogue tile 128 x 32); m is a run-time extent, n = 1000 -> 992
    assert [(s["line"], s["copy"]) for s in applied.sites] == [
        (line_of(gemm, "tma_c, mc = cpasync.make_tiled_tma_atom("), "store")
    ]
    assert "[128, 32]: [None, 1000] -> [None, 992]" in applied.sites[0]["detail"]
    with faults.inject("shrink_tma_bounds", {"copies": "load"}) as loads:
        compile_ptx(cute_mod, obj, *obj.fake_args(), dump=tmp_path)
    assert [s["copy"] for s in loads.sites] == ["load", "load"]  # A and B


def test_overclaimed_align_is_rejected_with_the_real_pointer_and_classified(cute_mod):
    """The DSL checks a tensor argument's pointer against its assumed_align when it converts
    the real arguments (CPU tensors do here what the H200 run did with CUDA ones)."""
    from cutlass.cute.runtime import from_dlpack, make_fake_stream

    from cutedebug import kernel_api
    from cutedebug.analyses import mismatch
    from cutedebug.engine import valuemap

    obj = kernel_api.load_entry(STREAM, "TmaStream")(m=64, n=256, ctas=2, overclaimed_align=True)
    t = obj.make_inputs("cpu")
    args = (
        *(from_dlpack(t[k], assumed_align=16) for k in ("x", "scale", "bias", "out")),
        make_fake_stream(),
    )
    with pytest.raises(Exception, match="not aligned to 16 bytes") as err:
        cute_mod.compile[cute_mod.GPUArch("sm_90a")](obj, *args)
    fields = valuemap.alignment_fields(err.value, [], obj, args)
    assert fields["misaligned_args"] == [
        {"arg": 3, "name": "out", "assumed_align": 16, "pointer_align": 4}
    ]
    claims = [line_of(STREAM, "args = tuple(from_dlpack(tensors[k], assumed_align=16)")]
    assert fields["claim_lines"] == [f"{STREAM}:{n}" for n in claims]
    d = mismatch.diagnose("COMPILE_ERROR", {"compile_error": {"message": str(err.value), **fields}})
    assert (d["row"], d["pattern"], d["view"]) == ("alignment", "assumed_align", "out")
    assert "out (claims 16 bytes, its pointer is 4-byte aligned)" in d["summary"]
