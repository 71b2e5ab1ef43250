"""kernels/sm90_gemm.py on CPU: it compiles for sm_90a (single CTA and 2-CTA cluster, bf16 and
fp16, ragged shapes), its PTX carries the pipeline the docstring promises (WGMMA, TMA loads with
multicast in the cluster variant, TMA stores, expect_tx bytes, arrive counts, setmaxnreg), its
grouped tile order covers every tile once, and every applicable fault of the registry triggers
on it and changes the PTX the way the fault says."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers.ptx import PtxCache, expect_tx_bytes, init_counts, shrink_smem_field
from helpers.trace_only import trace_only

from cutedebug.instrument import faults, value_faults
from cutedebug.kernel_api import load_entry, resolve_params

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "kernels" / "sm90_gemm.py"
Sm90Gemm = load_entry(KERNEL, "Sm90Gemm")
grouped_tile = sys.modules[Sm90Gemm.__module__].grouped_tile

SCENARIO_SIZE = {"m": 1000, "n": 1000, "k": 1000, "ctas": 8}


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    """Compile (cached per params and fault) and return the PTX text."""
    cache = PtxCache(Sm90Gemm, tmp_path_factory.mktemp("ptx"))

    def compile_ptx(fault: tuple | None = None, **params) -> str:
        if fault is None:
            return cache(**params)[0]
        name, args = fault[0], dict(fault[1])
        text, applied = cache(name, args, **params)
        assert applied.count > 0, f"{name}{args} never triggered on sm90_gemm"
        return text

    return compile_ptx


TMA_LOAD = "cp.async.bulk.tensor.2d.shared::cta.global.tile.mbarrier::complete_tx::bytes"
TMA_LOAD_MCAST = (
    "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::"
    "bytes.multicast::cluster"
)
TMA_STORE = "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group"
TRY_WAIT = "mbarrier.try_wait.parity.shared.b64"


# ---- compile matrix ------------------------------------------------------------------------
CASES = [  # (dtype, cluster_m, (m, n, k), tile_n, stages, ctas); the first two = SCENARIO_SIZE
    ("bf16", 1, (1000, 1000, 1000), 256, 4, 8),
    ("bf16", 2, (1000, 1000, 1000), 256, 4, 8),
    ("fp16", 1, (4097, 264, 72), 256, 4, 132),
    ("fp16", 2, (1, 8, 8), 256, 4, 132),
    ("bf16", 2, (300, 1000, 520), 128, 6, 132),
]


@pytest.mark.parametrize("dtype,cluster_m,shape,tile_n,stages,ctas", CASES)
def test_compiles_with_the_promised_pipeline(ptx, dtype, cluster_m, shape, tile_n, stages, ctas):
    m, n, k_ = shape
    params = dict(m=m, n=n, k=k_, cluster_m=cluster_m, ctas=ctas)
    # defaults spelled out only when they differ, so the fault tests reuse these compiles
    params.update(
        {
            k: v
            for k, v in dict(dtype=dtype, tile_n=tile_n, stages=stages).items()
            if v != Sm90Gemm.PARAMS[k]
        }
    )
    k = Sm90Gemm(**params)
    text = ptx(**params)
    # docstring arithmetic: A tile + the whole B tile land in this CTA, multicast or not
    assert k.tx_bytes == 128 * 64 * 2 + tile_n * 64 * 2
    assert expect_tx_bytes(text) == [k.tx_bytes]
    # full[0..S) count 1 (producer's expect_tx arrive); empty[0..S) one per consumer warp per
    # CTA of the cluster
    assert init_counts(text) == [1] * stages + [8 * cluster_m] * stages
    assert "fence.mbarrier_init.release.cluster" in text
    # producer: one TMA of A per k-tile, one of B (multicast slice in a cluster)
    assert text.count(TMA_LOAD) == (2 if cluster_m == 1 else 1)
    assert text.count(TMA_LOAD_MCAST) == (0 if cluster_m == 1 else 1)
    # consumers: 4 WGMMAs (k = 16) per k-tile, peeled first k-tile + loop (gone when k <= 64)
    sites = 2 if k.k_tiles > 1 else 1
    ptx_type = {"bf16": "bf16", "fp16": "f16"}[dtype]
    wgmma = f"wgmma.mma_async.sync.aligned.m64n{tile_n}k16.f32.{ptx_type}.{ptx_type}"
    assert text.count(wgmma) == 4 * sites
    assert text.count("wgmma.wait_group.sync.aligned") == sites
    # waits: producer_acquire + producer_tail (one per stage) + consumer_wait (peeled + loop)
    assert text.count(TRY_WAIT) == 1 + stages + sites
    # releases: loop + after the last k-tile; remote (mapa + shared::cluster) in a cluster
    if cluster_m == 1:
        assert text.count("mbarrier.arrive.shared.b64") == sites
        assert "multicast" not in text and "barrier.cluster" not in text
    else:
        assert text.count("mbarrier.arrive.shared::cluster.b64") == sites
        assert text.count("mapa.shared::cluster") == sites
        assert "barrier.cluster.arrive.relaxed" in text and "barrier.cluster.wait" in text
    # epilogue: per 128 x 32 sub-tile 2 stmatrix.x4, 2 named barriers, 1 TMA store
    subtiles = tile_n // 32
    assert text.count(TMA_STORE) == subtiles
    assert text.count("stmatrix.sync.aligned.m8n8.x4.shared.b16") == 2 * subtiles
    assert text.count("bar.sync 	1, 256") == 2 * subtiles
    assert text.count("fence.proxy.async.shared::cta") == subtiles
    # register rebalancing behind a 168-register entry cap (384 threads, 1 CTA per SM)
    assert ".reqntid 384, 1, 1" in text and ".minnctapersm 1" in text
    assert "setmaxnreg.dec.sync.aligned.u32 	40;" in text
    assert "setmaxnreg.inc.sync.aligned.u32 	232;" in text
    assert text.count("prefetch.tensormap") == 3


def test_tx_bytes_and_smem_of_the_docstring():
    assert Sm90Gemm(tile_n=256).tx_bytes == 49152
    assert Sm90Gemm(tile_n=128).tx_bytes == 32768
    assert Sm90Gemm(tile_n=256, stages=4).smem_bytes == 230400 <= 232448
    with pytest.raises(ValueError, match="over 232448"):
        Sm90Gemm(tile_n=256, stages=5)
    assert Sm90Gemm(cluster_m=2).empty_arrivals == 16
    assert Sm90Gemm(cluster_m=1).empty_arrivals == 8


def test_shared_storage_is_the_docstring_layout():
    """SharedStorage (the cute.struct smem_bytes is the size of) puts 2 * S mbarriers at 0 and
    each 128B-swizzled ring on a 1024 B boundary: A, B (S stages each), then the C ring."""
    k = Sm90Gemm(tile_n=256, stages=4)
    assert k.storage.__alignof__() == 1024
    ring = 4 * (128 * 64 * 2)  # A: S stages of 128 x 64 bf16
    assert k.storage._offsets == {
        "barriers": 0,
        "a": 1024,
        "b": 1024 + ring,
        "c": 1024 + ring + 4 * 256 * 64 * 2,
    }
    assert k.smem_bytes == k.storage._offsets["c"] + 4 * 128 * 32 * 2


@pytest.mark.parametrize("what", ["ring", "tx"])
def test_storage_that_disagrees_with_the_layouts_is_refused_at_trace_time(what):
    """__call__ checks the struct against the staged layouts it builds (cute.cosize) and the
    tx bytes against cute.size_in_bytes of the TMA boxes, before the kernel is traced."""
    from cutlass import cute

    k = Sm90Gemm(**SCENARIO_SIZE)
    if what == "ring":
        shrink_smem_field(k, "b", k.dtype)
        match = "SharedStorage.b: 65472 elements for a ring of cosize 65536"
    else:
        k.tx_bytes += 16
        match = "tx bytes 49168: one stage of TMA boxes is 49152 B"
    with pytest.raises(ValueError, match=match):
        cute.compile[cute.GPUArch("sm_90a")](k, *k.fake_args())


def test_defaults_are_the_fast_configuration():
    p = resolve_params(Sm90Gemm, {}, "test")
    assert (p["tile_n"], p["stages"], p["cluster_m"]) == (256, 4, 2)
    k = Sm90Gemm()
    assert k.grid == 132 and k.clusters == 66


@pytest.mark.parametrize("bad", [dict(n=1001), dict(k=12), dict(group_m=3), dict(m=0)])
def test_rejects_shapes_tma_cannot_describe(bad):
    with pytest.raises(ValueError):
        Sm90Gemm(**{**dict(m=64, n=64, k=64, cluster_m=2), **bad})


# ---- tile schedule (host model of grouped_tile and the persistent loop) ------------------
@pytest.mark.parametrize(
    "m,n,cluster_m,group_m,ctas",
    [
        (8192, 8192, 2, 16, 132),
        (1000, 1000, 1, 8, 8),
        (1000, 1000, 2, 4, 8),
        (4097, 264, 2, 16, 132),
        (300, 5000, 1, 3, 7),
        (128 * 37, 256 * 5, 1, 8, 132),
    ],
)
def test_every_tile_is_computed_exactly_once(m, n, cluster_m, group_m, ctas):
    k = Sm90Gemm(m=m, n=n, k=64, cluster_m=cluster_m, group_m=group_m, ctas=ctas)
    seen: dict[tuple[int, int], int] = {}
    for bid in range(k.grid):
        rank, cluster = bid % cluster_m, bid // cluster_m
        for unit in range(cluster, k.units, k.clusters):
            row, tn = grouped_tile(unit, k.cluster_rows, k.tiles_n, k.group_rows)
            assert 0 <= row < k.cluster_rows and 0 <= tn < k.tiles_n
            tm = row * cluster_m + rank
            seen[(tm, tn)] = seen.get((tm, tn), 0) + 1
    inside = {t: c for t, c in seen.items() if t[0] < k.tiles_m}
    assert set(inside) == {(i, j) for i in range(k.tiles_m) for j in range(k.tiles_n)}
    assert set(inside.values()) == {1}
    # tiles past M only pad the last cluster row of an odd tile-row count
    assert len(seen) - len(inside) == (k.cluster_rows * cluster_m - k.tiles_m) * k.tiles_n


def test_grouped_order_walks_down_a_column_group_first():
    k = Sm90Gemm(m=128 * 20, n=256 * 6, k=64, cluster_m=1, group_m=8)
    order = [grouped_tile(u, k.cluster_rows, k.tiles_n, k.group_rows) for u in range(k.units)]
    assert order[:9] == [(r, 0) for r in range(8)] + [(0, 1)]
    # last group has 20 - 16 = 4 rows
    assert order[16 * 6 : 16 * 6 + 5] == [(16, 0), (17, 0), (18, 0), (19, 0), (16, 1)]


# ---- faults ----------------------------------------------------------------------------------
# every patch fault of the registry that applies to this kernel, as the scenarios use them
APPLICABLE = {
    "wrong_expect_tx_plus": ("wrong_expect_tx", {"delta_bytes": 16}),
    "wrong_expect_tx_minus": ("wrong_expect_tx", {"delta_bytes": -16}),
    "missing_phase_flip_producer": ("missing_phase_flip", {"role": "producer"}),
    "missing_phase_flip_consumer": ("missing_phase_flip", {"role": "consumer"}),
    "skip_producer_tail": ("skip_producer_tail", {}),
    "skip_consumer_release": ("skip_consumer_release", {"at_iteration": 0}),
    "extra_consumer_release": ("extra_consumer_release", {"at_iteration": 0}),
    "wrong_arrive_count_empty_plus": ("wrong_arrive_count", {"delta": 1, "barrier": "empty"}),
    "wrong_arrive_count_empty_minus": ("wrong_arrive_count", {"delta": -1, "barrier": "empty"}),
    "wrong_arrive_count_full_plus": ("wrong_arrive_count", {"delta": 1, "barrier": "full"}),
    "missing_init_fence": ("missing_init_fence", {"drop": "both"}),
    "drop_sync": ("drop_sync", {"which": -1, "sync": "cta"}),
    "wrong_barrier_threads_plus": ("wrong_barrier_threads", {"delta": 32}),
    "wrong_barrier_threads_minus": ("wrong_barrier_threads", {"delta": -32}),
    "early_exit_consumer": ("early_exit", {"role": "consumer", "at_iteration": 0}),
    "early_exit_producer": ("early_exit", {"role": "producer", "at_iteration": 0}),
    # wrong-value faults (value_faults.py): 2 / 4 / 1 sites on a CPU compile (shrink_tma_bounds
    # cuts C's TMA store bounds: the descriptor changes, the PTX does not)
    "skip_consumer_wait": ("skip_consumer_wait", {"at_iteration": 0}),
    "release_before_read": ("release_before_read", {}),
    "shrink_tma_bounds": ("shrink_tma_bounds", {"copies": "store"}),
}


# patch faults whose patched functions this kernel never calls (see the module docstring)
NOT_HERE = {
    "expect_tx_no_2cta_doubling": "PipelineTmaUmma (sm_100) only",
    "cta_scope_sync": "no cluster-scope fence / release arrive / .cluster mbarrier op",
    "drop_copy_pred": "no cute.copy with pred= (TMA copies, bounded by their atoms: 0 sites)",
}
CLUSTER_SWITCHES = {"skip_init_cluster_sync", "cluster_mismatch"}
SWITCHES = CLUSTER_SWITCHES | {"edge_pred_whole_tiles", "stale_smem_store"}
# switches of the wrong-value table (value_faults.py) this kernel does not declare
SWITCHES_NOT_HERE = {
    "unassumed_align": "no 128-bit copy atom on a view with an unassumed run-time offset "
    "(A, B, C move by TMA)",
    "overclaimed_align": "its arguments are whole tensors (no offset view passed as aligned)",
}


def test_the_applicable_list_covers_the_registry():
    patch_faults = {n for n, f in faults.FAULTS.items() if f.kind == "patch"}
    assert {f for f, _ in APPLICABLE.values()} | set(NOT_HERE) == patch_faults
    assert set(Sm90Gemm.SWITCHES) == SWITCHES
    assert all(faults.FAULTS[s].kind == "switch" for s in SWITCHES | set(SWITCHES_NOT_HERE))
    value_switches = {f.name for f in value_faults.entries() if f.kind == "switch"}
    assert value_switches <= SWITCHES | set(SWITCHES_NOT_HERE)
    assert not SWITCHES & set(SWITCHES_NOT_HERE)


def _spec(name: str) -> tuple:
    fault, args = APPLICABLE[name]
    return fault, tuple(sorted(args.items()))


# the 2-CTA cluster's twin of each fault compiles in CI's slow part (~30 s of the loop's CPU:
# the loop keeps the single-CTA kernel, the cluster's faults run as scenarios there too)
@pytest.mark.parametrize("cluster_m", [1, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", sorted(APPLICABLE))
def test_fault_triggers_and_changes_the_ptx(ptx, name, cluster_m):
    params = dict(SCENARIO_SIZE, cluster_m=cluster_m)
    clean = ptx(**params)
    text = ptx(fault=_spec(name), **params)  # asserts Applied.count > 0
    fault, args = APPLICABLE[name]
    if fault == "shrink_tma_bounds":
        # the cut bounds live in C's TMA descriptor, built by the host code: same device code
        assert text == clean
        return
    assert text != clean
    S, empty = 4, 8 * cluster_m
    if fault == "wrong_expect_tx":
        assert expect_tx_bytes(text) == [49152 + args["delta_bytes"]]
    elif fault == "wrong_arrive_count":
        full_n, empty_n = 1, empty
        if args["barrier"] == "full":
            full_n += args["delta"]
        else:
            empty_n += args["delta"]
        assert init_counts(text) == [full_n] * S + [empty_n] * S
    elif fault == "skip_producer_tail":
        assert text.count(TRY_WAIT) == clean.count(TRY_WAIT) - S
    elif fault in ("skip_consumer_release", "extra_consumer_release"):
        # a run-time test on state.count guards the arrive (skip) or a second arrive (extra);
        # the release after the k-loop never sees count 0 (k_tiles > 1) and folds away
        arrive = (
            "mbarrier.arrive.shared.b64"
            if cluster_m == 1
            else "mbarrier.arrive.shared::cluster.b64"
        )
        assert text.count("setp.") > clean.count("setp.")
        if fault == "extra_consumer_release":
            assert text.count(arrive) == clean.count(arrive) + 1
    elif fault == "missing_init_fence":
        assert "fence.mbarrier_init" not in text
        if cluster_m == 1:
            assert "bar.sync 	0;" in clean and "bar.sync 	0;" not in text
        else:
            assert "barrier.cluster.wait" in clean and "barrier.cluster.wait" not in text
    elif fault == "drop_sync":
        assert clean.count("bar.sync 	1, 256") == 16 and "bar.sync 	1, 256" not in text
    elif fault == "wrong_barrier_threads":
        assert f"bar.sync 	1, {256 + args['delta']}" in text
        assert "bar.sync 	1, 256" not in text
    elif fault == "early_exit":
        assert text.count("exit;") > clean.count("exit;")
    elif fault == "missing_phase_flip":
        # the wrapped index no longer toggles the phase: fewer xor-with-1 flips
        assert text.count("xor.b32") < clean.count("xor.b32")


@pytest.mark.parametrize("name", sorted(NOT_HERE))
def test_faults_that_do_not_apply_do_not_trigger(tmp_path, name):
    """A fault's sites are counted while the kernel is traced: trace only (the lowering of
    this kernel is the compile matrix's)."""
    from cutlass import cute
    from cutlass.base_dsl.compiler import DumpDir

    from cutedebug.analyses import lint

    k = Sm90Gemm(**SCENARIO_SIZE, cluster_m=2)
    with trace_only(), lint.record() as protocol, faults.inject(name, {}) as applied:
        cute.compile[cute.GPUArch("sm_90a"), DumpDir(str(tmp_path))](k, *k.fake_args())
    assert applied.patched and applied.count == 0
    # the kernel was traced (its TMA pipeline recorded): 0 sites is a fact, not a skipped trace
    assert [p.cls for p in protocol.pipelines.values()] == ["PipelineTmaAsync"] and protocol.events


def test_switch_skip_init_cluster_sync_syncs_only_the_cta(ptx):
    clean = ptx(**SCENARIO_SIZE, cluster_m=2)
    text = ptx(**SCENARIO_SIZE, cluster_m=2, skip_init_cluster_sync=True)
    assert "barrier.cluster.wait" in clean and "bar.sync 	0;" not in clean
    assert "barrier.cluster" not in text and "bar.sync 	0;" in text
    assert "fence.mbarrier_init.release.cluster" in text


def test_switch_cluster_mismatch_changes_only_the_launch(ptx):
    # same device code; the launch drops the cluster dims (checked on the instance)
    k = Sm90Gemm(**SCENARIO_SIZE, cluster_m=2, cluster_mismatch=True)
    assert ptx(**SCENARIO_SIZE, cluster_m=2, cluster_mismatch=True) == ptx(
        **SCENARIO_SIZE, cluster_m=2
    )
    assert k.cluster_mismatch and k.grid % 2 == 0


@pytest.mark.parametrize("switch", sorted(CLUSTER_SWITCHES))
def test_cluster_switches_need_a_cluster(switch):
    with pytest.raises(ValueError, match="cluster_m=2"):
        Sm90Gemm(**SCENARIO_SIZE, cluster_m=1, **{switch: True})
    assert faults.switch_params(switch, Sm90Gemm) == {switch: True}
