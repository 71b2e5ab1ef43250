"""kernels/cluster_reduce.py on CPU: it compiles for sm_90a over the cluster / dtype / op /
ragged matrix; its PTX carries the DSMEM protocol the docstring promises (st.async with
complete_tx, mapa, cluster barriers, expect_tx = 4 * cluster bytes); each cluster fault and
switch changes the PTX as predicted; a host model of the slices reproduces the torch sum; a
model of the mbarrier tx accounting backs the scenarios' predicted verdicts."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from cutlass import cute
from helpers.ptx import expect_tx_bytes

from cutedebug.engine import scenario as S
from cutedebug.instrument import faults, probes
from cutedebug.kernel_api import load_entry, resolve_params

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "kernels" / "cluster_reduce.py"
ClusterReduce = load_entry(KERNEL, "ClusterReduce")
MOD = sys.modules[ClusterReduce.__module__]

SMALL = {"m": 9, "n": 4100, "cluster": 4, "clusters": 3, "threads": 128, "unroll": 4}
_PTX: dict[tuple, str] = {}


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    """Compile (cached per params and fault) and return the PTX text."""
    from cutlass import cute
    from cutlass.base_dsl.compiler import DumpDir

    dump = tmp_path_factory.mktemp("ptx")

    def compile_ptx(fault: str | None = None, fault_args: dict | None = None, **params) -> str:
        key = (fault, tuple(sorted((fault_args or {}).items())), tuple(sorted(params.items())))
        if key not in _PTX:
            if fault is not None and faults.FAULTS[fault].kind == "switch":
                params = params | faults.switch_params(fault, ClusterReduce)
            k = ClusterReduce(**params)
            opts = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX(), DumpDir(str(dump))]
            with faults.inject(fault, fault_args, kernel=ClusterReduce, strict=True):
                _PTX[key] = opts(k, *k.fake_args()).__ptx__
        return _PTX[key]

    return compile_ptx


def count(ptx_text: str, pattern: str) -> int:
    return len(re.findall(pattern, ptx_text))


CLUSTER_ARRIVE_RELEASE = r"barrier\.cluster\.arrive(?:\.aligned)?;"
CLUSTER_ARRIVE_RELAXED = r"barrier\.cluster\.arrive\.relaxed(?:\.aligned)?;"
CLUSTER_WAIT = r"barrier\.cluster\.wait(?:\.aligned)?;"
ST_ASYNC = r"st\.async\.shared::cluster\.mbarrier::complete_tx::bytes\.b32"


# ---- the compile matrix and the protocol in the PTX ------------------------------------------

MATRIX = [
    # ragged: last slice shorter (16-byte rows), odd N (scalar loads), slices that run out
    {"m": 37, "n": 40968, "cluster": 2, "dtype": "fp32", "op": "sum", "clusters": 5},
    {"m": 37, "n": 40968, "cluster": 4, "dtype": "bf16", "op": "sum"},
    {"m": 19, "n": 12347, "cluster": 8, "dtype": "fp32", "op": "sum", "clusters": 2},
    {"m": 19, "n": 12347, "cluster": 2, "dtype": "bf16", "op": "rmsnorm", "clusters": 4},
    {"m": 37, "n": 40968, "cluster": 4, "dtype": "fp32", "op": "rmsnorm", "clusters": 5},
    {"m": 3, "n": 7, "cluster": 8, "dtype": "bf16", "op": "rmsnorm"},
]


@pytest.mark.parametrize("params", MATRIX, ids=lambda p: "-".join(map(str, p.values())))
def test_protocol_in_ptx(ptx, params):
    text = ptx(**params)
    c = params["cluster"]
    assert expect_tx_bytes(text) == [4 * c]  # C partials x 4 bytes, one arm per row
    assert count(text, ST_ASYNC) == 1  # lanes 0..C-1 each push to one peer
    assert count(text, r"mapa\.shared::cluster") == 2  # partial slot + barrier of the peer
    assert count(text, r"mbarrier\.init\.shared\.b64") == 2  # two slots
    assert count(text, r"fence\.mbarrier_init\.release\.cluster;") == 1
    assert count(text, CLUSTER_ARRIVE_RELAXED) == 1  # after init
    assert count(text, CLUSTER_ARRIVE_RELEASE) == 1  # trailing
    assert count(text, CLUSTER_WAIT) == 2
    assert count(text, r"fence\.acq_rel\.cluster;") == 1
    assert count(text, r"mbarrier\.try_wait\.parity") == 1
    elem = 4 if params["dtype"] == "fp32" else 2
    vectorized = params["n"] % (16 // elem) == 0
    assert (count(text, r"ld\.global(?:\.nc)?\.v4\.b32") > 0) == vectorized
    if params["op"] == "rmsnorm" and vectorized:
        assert count(text, r"st\.global\.v4\.b32") >= 1


def test_unrolled_loads_in_flight(ptx):
    """U = unroll 128-bit loads back to back per thread before the first add."""
    text = ptx(m=64, n=65536, cluster=2, threads=256, unroll=8)
    body = text.split("ld.global.v4.b32", 1)[1]
    first_add = body.index("add.f32")
    assert body[:first_add].count("ld.global.v4.b32") == 7  # + the one split off = 8


def test_probes_bound_the_partials_wait(tmp_path):
    from cutlass import cute
    from cutlass.base_dsl.compiler import DumpDir

    k = ClusterReduce(**SMALL)
    with probes.instrument(probes.ProbeConfig(), 0x10000) as table:
        opts = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX(), DumpDir(str(tmp_path))]
        text = opts(k, *k.fake_args()).__ptx__
    sites = table.to_json()
    # since the instrumentation layer the table also lists the raw mbarrier ops the kernel
    # traced (kind raw_op, after the waits, no device code); the one bounded wait is the
    # partials wait of the gather
    waits = [s for s in sites if s["kind"] != "raw_op"]
    assert [(s["op"], s["function"]) for s in waits] == [("raw_wait", "gather")]
    assert waits[0]["id"] == 0 and waits[0]["code"] == "cute.arch.mbarrier_wait(bar, phase)"
    assert "globaltimer" in text and "exit;" in text


# ---- faults and switches change the PTX as predicted -----------------------------------------


@pytest.mark.parametrize("delta", [4, -4, 8])
def test_wrong_expect_tx_applies(ptx, delta):
    assert expect_tx_bytes(ptx(**SMALL)) == [16]
    assert expect_tx_bytes(ptx("wrong_expect_tx", {"delta_bytes": delta}, **SMALL)) == [16 + delta]


def test_wrong_expect_tx_below_zero_is_refused(ptx):
    with pytest.raises(faults.FaultApplyError):
        ptx("wrong_expect_tx", {"delta_bytes": -20}, **SMALL)


def test_missing_init_fence(ptx):
    text = ptx("missing_init_fence", {"drop": "fence"}, **SMALL)
    assert count(text, r"fence\.mbarrier_init") == 0
    assert count(text, CLUSTER_ARRIVE_RELAXED) == 1 and count(text, CLUSTER_WAIT) == 2


@pytest.mark.parametrize(
    "what,fence_cta,relaxed", [("all", 1, 2), ("fence", 1, 1), ("cluster_arrive", 0, 2)]
)
def test_cta_scope_sync(ptx, what, fence_cta, relaxed):
    text = ptx("cta_scope_sync", {"what": what}, **SMALL)
    assert count(text, r"fence\.acq_rel\.cta;") == fence_cta
    assert count(text, r"fence\.acq_rel\.cluster;") == 1 - fence_cta
    assert count(text, CLUSTER_ARRIVE_RELAXED) == relaxed
    assert count(text, CLUSTER_ARRIVE_RELEASE) == 2 - relaxed


def test_cta_scope_sync_mbarrier_scope():
    """A remote expect_tx defaults to .cluster scope; the fault demotes it to .cta."""

    @cute.kernel
    def remote_expect(bars: cute.Pointer):
        cute.arch.mbarrier_expect_tx(bars, 64, 1)

    @cute.jit
    def host(bars: cute.Pointer):
        remote_expect(bars).launch(grid=(2, 1, 1), block=(32, 1, 1), cluster=(2, 1, 1))

    ptr = cute.runtime.make_ptr(cute.Int64, 0, cute.AddressSpace.smem, assumed_align=8)
    opts = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()]
    clean = opts(host, ptr).__ptx__
    with faults.inject("cta_scope_sync", {"what": "mbarrier_arrive"}, strict=True) as applied:
        faulty = opts(host, ptr).__ptx__
    assert re.search(r"mbarrier\.expect_tx\.relaxed\.cluster", clean)
    assert re.search(r"mbarrier\.expect_tx\.relaxed\.cta", faulty)
    assert [s["op"] for s in applied.sites] == ["mbarrier_expect_tx"]


def test_skip_init_cluster_sync(ptx):
    text = ptx("skip_init_cluster_sync", **SMALL)
    assert count(text, CLUSTER_ARRIVE_RELAXED) == 0
    assert count(text, CLUSTER_ARRIVE_RELEASE) == 1 and count(text, CLUSTER_WAIT) == 1
    assert count(text, r"bar\.sync") == count(ptx(**SMALL), r"bar\.sync") + 1
    assert count(text, r"fence\.mbarrier_init") == 1


def test_skip_cluster_tail(ptx):
    text = ptx("skip_cluster_tail", **SMALL)
    assert count(text, CLUSTER_ARRIVE_RELEASE) == 0
    assert count(text, CLUSTER_ARRIVE_RELAXED) == 1 and count(text, CLUSTER_WAIT) == 1


@pytest.mark.parametrize("cluster,launched", [(2, 4), (4, 8), (8, 4)])
def test_cluster_mismatch(ptx, cluster, launched):
    """Only the launch changes: the kernel still reduces over (and expects bytes from) C."""
    params = dict(SMALL, cluster=cluster, clusters=4)
    assert ClusterReduce(**params, cluster_mismatch=True).launch_cluster == launched
    assert ClusterReduce(**params).launch_cluster == cluster
    assert ClusterReduce(**params, cluster_mismatch=True).grid % launched == 0
    text = ptx("cluster_mismatch", **params)
    assert text == ptx(**params).replace(*_kernel_names(ptx(**params), text))
    assert expect_tx_bytes(text) == [4 * cluster]


def _kernel_names(a: str, b: str) -> tuple[str, str]:
    name = re.compile(r"\.entry\s+(\S+)\(")
    return name.search(a).group(1), name.search(b).group(1)


def test_switches_declared_and_registered():
    for name in ClusterReduce.SWITCHES:
        assert faults.FAULTS[name].kind == "switch"
        assert faults.switch_params(name, ClusterReduce) == {name: True}
    resolved = resolve_params(ClusterReduce, {"skip_cluster_tail": True}, "test")
    assert resolved["skip_cluster_tail"] is True and resolved["cluster_mismatch"] is False


# ---- host models -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n,dtype,cluster", [(40968, "fp32", 4), (12347, "bf16", 8), (7, "fp32", 8), (65536, "bf16", 2)]
)
def test_slices_reproduce_the_row_sum(n, dtype, cluster):
    """The C slices tile [0, N / V) exactly; the rank-order sum of slice sums is the row sum."""
    k = ClusterReduce(m=3, n=n, dtype=dtype, op="sum", cluster=cluster)
    bounds = [MOD.slice_bounds(r, k.nv, cluster) for r in range(cluster)]
    assert bounds[0][0] == 0 and bounds[-1][1] == k.nv
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert k.full_iters * k.chunk <= bounds[-1][1] - bounds[-1][0]  # unpredicated part fits
    t = k.make_inputs("cpu")
    x = t["x"].float().reshape(k.m, k.nv, k.vec)
    total = sum(x[:, s:e].sum(dim=(1, 2)) for s, e in bounds)
    torch.testing.assert_close(total, k.reference(t), atol=k.TOLERANCE[0], rtol=k.TOLERANCE[1])
    # a missing partial (rank 0's slice is never empty) cannot pass the tolerance
    without_first = total - x[:, bounds[0][0] : bounds[0][1]].sum(dim=(1, 2))
    assert not torch.allclose(
        without_first, k.reference(t), atol=k.TOLERANCE[0], rtol=k.TOLERANCE[1]
    )


def first_stuck_use(expect: int, cluster: int, uses: int, early: int) -> int | None:
    """mbarrier model of one slot: per use, ``early`` partials land before the arm, the rest
    after. A phase completes when no arrival is pending and the tx count is 0. Returns the first
    use whose phase never completes, or None."""
    pending, tx, completed = 1, 0, 0

    def land():
        nonlocal pending, tx, completed
        if pending == 0 and tx == 0:
            pending, tx, completed = 1, 0, completed + 1

    for use in range(uses):
        for _ in range(early):
            tx -= 4
            land()
        pending, tx = pending - 1, tx + expect
        land()
        for _ in range(cluster - early):
            tx -= 4
            land()
        if completed <= use:
            return use
    return None


@pytest.mark.parametrize("cluster", [2, 4, 8])
def test_tx_model_backs_the_predictions(cluster):
    exact = 4 * cluster
    for early in range(cluster + 1):
        assert first_stuck_use(exact, cluster, 16, early) is None
        assert first_stuck_use(exact + 4, cluster, 16, early) == 0
        stuck = first_stuck_use(exact - 4, cluster, 16, early)
        assert stuck is not None and stuck <= cluster  # within C + 1 uses of a slot


def test_scenarios_load_and_match_the_faults():
    files = S.discover(ROOT / "scenarios" / "cluster_reduce")
    assert len(files) >= 10
    faults_seen = set()
    for f in files:
        sc = S.load(f)
        assert sc.kernel_file == str(KERNEL)
        faults_seen.add(sc.fault)
        if sc.expect.verdict == "HANG":
            assert sc.probes, f"{sc.id}: hang candidates run with probes"
        k = ClusterReduce(**resolve_params(ClusterReduce, sc.params, sc.id))
        if sc.fault == "wrong_expect_tx" and sc.fault_args["delta_bytes"] < 0:
            uses_per_slot = -(-k.m // k.groups) // 2
            assert uses_per_slot > k.cluster  # enough uses for the model's hang
    assert {
        "wrong_expect_tx",
        "cta_scope_sync",
        "skip_init_cluster_sync",
        "skip_cluster_tail",
        "cluster_mismatch",
        "missing_init_fence",
        None,
    } <= faults_seen


def test_shared_storage_is_the_docstring_layout():
    """bar[0..2), partials[2][C] and warp_sums[2][W] (fp32, 16 B aligned); the tx bytes of a
    phase are one slot of partials (C x 4 B)."""
    k = ClusterReduce(**SMALL)  # C = 4, W = 4
    assert k.storage._offsets == {"bars": 0, "partials": 16, "warp_sums": 16 + 2 * 4 * 4}
    assert k.smem_bytes == 16 + 2 * 4 * 4 + 2 * 4 * 4 and k.tx_bytes == 4 * 4


def test_tx_bytes_that_disagree_with_the_partials_are_refused_at_trace_time():
    """__call__ checks tx_bytes against cute.size_in_bytes of one slot of partials."""
    from cutlass import cute

    k = ClusterReduce(**SMALL)
    k.tx_bytes += 4
    with pytest.raises(ValueError, match="tx bytes 20: a slot of partials is 16 B"):
        cute.compile[cute.GPUArch("sm_90a")](k, *k.fake_args())
