"""The wrong-value classifier (cutedebug.analyses.mismatch) on synthetic error maps, built with
the worker's own map collector (cutedebug.engine.valuemap) from masks whose pattern is known by
construction, and on compile errors with the DSL's real verifier message."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cutedebug.analyses import mismatch  # noqa: E402
from cutedebug.engine import valuemap  # noqa: E402
from cutedebug.reporting import mismatch_map  # noqa: E402

R, C, TM, TN, GRID, STAGES = 200, 260, 32, 64, 6, 4  # 7 x 5 tiles, last row and column partial
TR, TC = -(-R // TM), -(-C // TN)


def stream_tiling(k_tiles: int = 1) -> dict:
    """A persistent row-major schedule like tma_stream's: CTA t % GRID, position t // GRID."""
    tiles = [[i * TC + j for j in range(TC)] for i in range(TR)]
    return {
        "shape": [R, C],
        "tile": [TM, TN],
        "stages": STAGES,
        "k_tiles": k_tiles,
        "tile_cta": [[t % GRID for t in r] for r in tiles],
        "tile_seq": [[t // GRID for t in r] for r in tiles],
    }


def tile_mask(pred) -> torch.Tensor:
    """Bad where pred(tile_row, tile_col, in_row, in_col, cta, seq) holds."""
    t = stream_tiling()
    r = torch.arange(R)[:, None].expand(R, C)
    c = torch.arange(C)[None, :].expand(R, C)
    ti, tj = r // TM, c // TN
    cta = torch.tensor(t["tile_cta"])[ti, tj]
    seq = torch.tensor(t["tile_seq"])[ti, tj]
    return pred(ti, tj, r % TM, c % TN, cta, seq)


def classify(bad: torch.Tensor, tiling=None, **kw) -> dict:
    ref = torch.zeros(R, C)
    out = torch.where(bad, torch.full_like(ref, float("nan")), ref)
    m = valuemap.collect(out, ref, ~bad, stream_tiling() if tiling is None else tiling)
    return mismatch.classify_map(m, **kw)


def test_edge_tiles_only_is_the_tile_edge_row():
    bad = tile_mask(lambda ti, tj, r, c, cta, seq: (ti == TR - 1) | (tj == TC - 1))
    d = classify(bad)
    assert (d["pattern"], d["row"]) == ("edge_tiles", "tile_edges")
    assert "11 of 11 edge tiles" in d["summary"]


def test_one_partial_edge_column_is_still_the_edge_row():
    bad = tile_mask(lambda ti, tj, r, c, cta, seq: (tj == TC - 1) & (c < 2))
    assert classify(bad)["row"] == "tile_edges"


def test_same_columns_of_every_tile_is_register_smem():
    bad = tile_mask(lambda ti, tj, r, c, cta, seq: c >= 32)
    d = classify(bad)
    assert (d["pattern"], d["row"]) == ("tile_columns", "register_smem")
    assert "in-tile columns 32-63 of 64" in d["summary"]


def test_last_rows_of_every_tile_changing_between_runs_is_stale():
    bad = tile_mask(lambda ti, tj, r, c, cta, seq: r >= 24)
    d = classify(bad, reproducible=False)
    assert (d["pattern"], d["row"]) == ("tile_rows", "stale_smem")


def test_everywhere_reproducible_is_register_smem_and_racy_is_stale():
    bad = torch.ones(R, C, dtype=torch.bool)
    assert classify(bad, reproducible=True)["row"] == "register_smem"
    assert classify(bad)["pattern"] == "everywhere"
    assert classify(bad, reproducible=False)["row"] == "stale_smem"


def test_first_tile_of_every_cta_is_a_work_position_of_stale_smem():
    bad = tile_mask(lambda ti, tj, r, c, cta, seq: seq == 0)
    d = classify(bad)
    assert (d["pattern"], d["row"]) == ("work_position", "stale_smem")
    assert "position(s) 0 " in d["summary"]


def test_one_ring_slot_is_periodic_by_stage():
    bad = tile_mask(lambda ti, tj, r, c, cta, seq: seq % STAGES == 1)
    d = classify(bad)
    assert (d["pattern"], d["row"]) == ("periodic_stage", "stale_smem")
    assert "slot(s) 1 of 4" in d["summary"]


def test_some_ctas_only():
    bad = tile_mask(lambda ti, tj, r, c, cta, seq: (cta == 2) & (r == 3))
    d = classify(bad)
    assert (d["pattern"], d["row"]) == ("some_ctas", "stale_smem")
    assert "1 of 6 CTAs (2)" in d["summary"]


def test_no_tiling_gives_no_row():
    bad = torch.zeros(R, C, dtype=torch.bool)
    bad[5, 7] = True
    d = classify(bad, tiling={"shape": [R + 1, C], "tile": [TM, TN]})
    assert d["row"] is None and d["pattern"] == "untiled"
    assert "does not fit" in d["summary"]


def test_union_of_repeats_and_nondeterministic_verdict():
    ref = torch.zeros(R, C)
    maps = []
    for rows in (slice(0, 32), slice(64, 96)):
        bad = torch.zeros(R, C, dtype=torch.bool)
        bad[rows, :64] = True
        maps.append(valuemap.collect(ref, ref, ~bad, stream_tiling()))
    repeats = [{"verdict": "MISMATCH", "digest": "a"}, {"verdict": "MISMATCH", "digest": "b"}]
    d = mismatch.diagnose("NONDETERMINISTIC", {}, repeats, maps)
    assert d["row"] == "stale_smem"
    assert d["map"]["n_bad"] == 2 * 32 * 64
    assert any("different output bits" in e for e in d["evidence"])


def test_mask_file_round_trip(tmp_path):
    bad = tile_mask(lambda ti, tj, r, c, cta, seq: (r * 7 + c) % 5 == 0)
    valuemap.save_mask(tmp_path / "m.gz", ~bad, stream_tiling(), {"digest": "x"})
    header, flat = valuemap.load_mask(tmp_path / "m.gz")
    assert header["shape"] == [R, C] and header["digest"] == "x"
    assert torch.equal(flat.reshape(R, C), bad)


# The DSL's message, verbatim from a CPU compile of tma_stream with unassumed_align (4.8.1),
# wrapped over lines as the DSL prints it.
VERIFIER = (
    "IR verification failed: error: unknown: 'cute.copy' op D ptr alignment (32 bits) "
    "does not\n         meet requirement (128 bits) of atom "
    "'!cute_nvgpu.atom.universal_copy<f32, 128 b>'"
)


def test_alignment_verifier_error_names_the_view_and_the_copy():
    sites = [
        {"file": "k.py", "line": 10, "function": "f", "src_align_bits": 128, "dst_align_bits": 128},
        {
            "file": "k.py",
            "line": 42,
            "function": "compute",
            "src_align_bits": 32,
            "dst_align_bits": 32,
        },
    ]
    d = mismatch.diagnose(
        "COMPILE_ERROR", {"compile_error": {"message": VERIFIER, "copy_sites": sites}}
    )
    assert d["row"] == "alignment" and d["view"] == "destination"
    assert (d["have_bits"], d["need_bits"]) == (32, 128)
    assert d["lines"] == ["k.py:42"]
    assert "cute.assume" in mismatch.one_line(d)


def test_other_compile_errors_and_passes_have_no_row():
    assert mismatch.diagnose("COMPILE_ERROR", {"compile_error": {"message": "syntax"}}) is None
    assert mismatch.diagnose("PASS", {"checked": {"ok": True}}) is None
    assert mismatch.diagnose("HANG", {}) is None


def test_picture_marks_the_wrong_tiles():
    bad = tile_mask(lambda ti, tj, r, c, cta, seq: (ti == 1) & (tj == 2))
    m = valuemap.collect(None, None, ~bad, stream_tiling())
    pic = mismatch_map.picture(m).splitlines()
    assert pic[2] == "    @ | "  # tile row 1: only its third tile, fully wrong
    assert pic[1] == "      | "
    assert pic[TR].startswith("  ------  (below")  # the partial tile row follows
    assert len(pic) == 1 + TR + 1 + 2


def test_a_stale_read_points_at_the_kernels_wait_and_release():
    bad = tile_mask(lambda ti, tj, r, c, cta, seq: seq == 0)
    ref = torch.zeros(R, C)
    m = valuemap.collect(ref, ref, ~bad, stream_tiling())
    protocol = [
        {"op": "producer_acquire", "file": "k.py", "line": 5},
        {"op": "tma_copy", "file": "k.py", "line": 7},
        {"op": "consumer_wait", "file": "k.py", "line": 20},
        {"op": "consumer_release", "file": "k.py", "line": 24},
    ]
    d = mismatch.diagnose("MISMATCH", {"checked": {"mismatch_map": m}}, protocol=protocol)
    assert d["row"] == "stale_smem"
    assert d["lines"] == [
        "producer_acquire at k.py:5",
        "consumer_wait at k.py:20",
        "consumer_release at k.py:24",
    ]


# ---- recorded outputs: the masks of the H200 run diag-1 (reports/2026-12-01-h200/diag) ----------

DATA = Path(__file__).resolve().parent / "data" / "mismatch"

RECORDED = {  # scenario -> (verdict the run gave, row the diagnosis must name)
    "tma_stream__edge_pred_whole_tiles": ("MISMATCH", "tile_edges"),
    "sm90_gemm__edge_pred_whole_tiles": ("MISMATCH", "tile_edges"),
    "tma_stream__stale_smem_store": ("MISMATCH", "register_smem"),
    "sm90_gemm__stale_smem_store": ("MISMATCH", "register_smem"),
    "tma_stream__skip_consumer_wait": ("MISMATCH", "stale_smem"),
    "sm90_gemm__skip_consumer_wait": ("NONDETERMINISTIC", "stale_smem"),
    "sm90_gemm__drop_sync": ("NONDETERMINISTIC", "stale_smem"),
    "sm90_gemm__release_before_read": ("NONDETERMINISTIC", "stale_smem"),
    "sm90_attention__skip_rescale": ("MISMATCH", None),  # no tiling(): no row
    # diag-3 (reports/2026-12-01-h200/diag)
    "tma_stream__release_before_read": ("NONDETERMINISTIC", "stale_smem"),
    "sm90_gemm__shrink_tma_bounds": ("MISMATCH", "tile_edges"),
}


def recorded(name: str) -> tuple[list[dict], list[dict]]:
    """The two repeats' maps rebuilt from their recorded masks, and their digests."""
    maps, repeats = [], []
    for suffix in ("", ".r1"):
        header, flat = valuemap.load_mask(DATA / f"{name}{suffix}.gz")
        maps.append(valuemap.collect(None, None, ~flat, header["tiling"]))
        repeats.append({"verdict": "MISMATCH", "digest": header["digest"]})
    return maps, repeats


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_outputs_name_their_row(name):
    verdict, row = RECORDED[name]
    maps, repeats = recorded(name)
    d = mismatch.diagnose(verdict, {}, repeats, maps)
    assert d["row"] == row, d["summary"]


def test_recorded_patterns_say_where():
    maps, repeats = recorded("sm90_gemm__stale_smem_store")
    d = mismatch.diagnose("MISMATCH", {}, repeats, maps)
    assert d["pattern"] == "tile_columns" and "columns 128-255 of 256" in d["summary"]
    maps, repeats = recorded("tma_stream__skip_consumer_wait")
    d = mismatch.diagnose("MISMATCH", {}, repeats, maps)
    assert d["pattern"] == "work_position" and "position(s) 0 " in d["summary"]
    maps, repeats = recorded("sm90_gemm__release_before_read")
    d = mismatch.diagnose("NONDETERMINISTIC", {}, repeats, maps)
    assert d["pattern"] == "edge_tiles" and "different on every run" in d["summary"]


def test_edge_tiles_that_change_between_runs_are_a_race():
    bad = tile_mask(lambda ti, tj, r, c, cta, seq: (ti == TR - 1) | (tj == TC - 1))
    assert classify(bad, reproducible=False)["row"] == "stale_smem"


def test_tiles_stored_one_tile_row_low_are_misplaced_not_a_row():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(R, C, generator=g)
    out = torch.full_like(ref, float("nan"))
    out[TM:] = ref[:-TM]  # every tile one tile row low, the first tile row never written
    good = torch.isclose(out, ref, atol=1e-5, rtol=1e-5)
    m = valuemap.collect(out, ref, good, stream_tiling())
    assert m["displacement"] == {
        "rows": TM,
        "cols": 0,
        "matched": int((~good[TM:]).sum()),
        "of": int((~good[TM:]).sum()),
    }
    d = mismatch.classify_map(m, reproducible=True)
    assert (d["pattern"], d["row"]) == ("misplaced", None)
    assert f"element {TM} rows above" in d["summary"]


def test_a_misaligned_address_at_run_time_is_the_alignment_row():
    from cutedebug.engine.worker import cuda_error_name

    msg = "CUDA error: misaligned address"  # torch's text for cudaErrorMisalignedAddress
    cu = {"name": cuda_error_name(msg), "message": msg}
    d = mismatch.diagnose("CRASH", {"cuda_error": cu})
    assert (d["row"], d["pattern"]) == ("alignment", "misaligned_address")
    assert mismatch.diagnose("CRASH", {"cuda_error": {"name": "cudaErrorIllegalAddress"}}) is None


def test_value_facts_read_every_kth_row_of_a_large_output():
    ref = torch.randn(4096, 64, generator=torch.Generator().manual_seed(1))
    out = torch.full_like(ref, float("nan"))
    out[32:] = ref[:-32]
    good = torch.isclose(out, ref)
    f = valuemap.value_facts(
        out, ref, good, 4096, 64, 32, 64, 1e-5, 1e-5, tiled=True, budget=4096 * 64 // 8
    )
    assert f["bad_values"]["sampled_rows_every"] == 8
    assert f["bad_values"]["nan"] == 32 * 64 // 8  # rows 0, 8, 16, 24 of the unwritten 32
    assert f["displacement"]["rows"] == 32
    assert f["displacement"]["matched"] == f["displacement"]["of"] == (4096 - 32) * 64 // 8


def test_attach_never_raises(tmp_path):
    class Broken:
        verdict = type("V", (), {"value": "MISMATCH"})()
        evidence = {"checked": {"mismatch_map": 5}}  # not a map: the classifier raises
        repeats, run_dir, outcome = [], tmp_path, None

    r = Broken()
    assert mismatch.attach(r) is None
    assert r.evidence["value_diagnosis_error"]


def test_edge_and_register_rows_point_at_the_stores():
    bad = tile_mask(lambda ti, tj, r, c, cta, seq: (ti == TR - 1) | (tj == TC - 1))
    m = valuemap.collect(None, None, ~bad, stream_tiling())
    protocol = [
        {"op": "consumer_wait", "file": "k.py", "line": 20},
        {"op": "store", "file": "k.py", "line": 31, "atom": "autovec"},
    ]
    d = mismatch.diagnose("MISMATCH", {"checked": {"mismatch_map": m}}, protocol=protocol)
    assert d["row"] == "tile_edges" and d["lines"] == ["store at k.py:31"]


def test_report_section_draws_the_map_that_attach_keeps(tmp_path):
    bad = tile_mask(lambda ti, tj, r, c, cta, seq: seq == 0)
    m = valuemap.collect(None, None, ~bad, stream_tiling())

    class Result:
        verdict = type("V", (), {"value": "MISMATCH"})()
        evidence = {"checked": {"mismatch_map": m}}
        repeats, run_dir, outcome = [], tmp_path, None

    res = Result()
    d = mismatch.attach(res)
    assert d["row"] == "stale_smem" and res.evidence["diagnosis"][0].startswith("failure table")
    kept = res.evidence["value_diagnosis"]["map"]
    assert "tile_cta" not in kept["tiling"] and kept["tile_bad"] == m["tile_bad"]
    (section,) = mismatch_map.report_sections(res)
    assert "**stale shared-memory reads**" in section
    assert mismatch_map.picture(kept) in section


def test_recorded_oob_store_maps_are_misplaced_not_a_row():
    """The two runs' maps as the H200 worker recorded them (diag-3), values check included."""
    import gzip
    import json

    runs = json.loads(gzip.open(DATA / "tma_stream__oob_store.maps.json.gz", "rt").read())
    repeats = [{"verdict": "MISMATCH", "digest": r["digest"]} for r in runs]
    d = mismatch.diagnose("MISMATCH", {}, repeats, [r["mismatch_map"] for r in runs])
    assert (d["pattern"], d["row"]) == ("misplaced", None)
    assert "32 rows above" in d["summary"]
