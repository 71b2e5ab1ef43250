"""kernels/sm100_gemm.py on CPU (no Blackwell GPU needed): it compiles for sm_100a in both
CTA-group variants, its PTX carries the pipeline its docstring promises (tcgen05.mma / commit /
alloc / dealloc, the expect_tx bytes of the barrier arithmetic, doubled for 2-CTA, the arrive
counts), every fault that applies changes the PTX as it should, the Blackwell scenarios load,
and on a non-Blackwell GPU the worker compiles them for sm_100a and reports UNSUPPORTED."""

from __future__ import annotations

import contextlib
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers.ptx import last_operands

from cutedebug import kernel_api
from cutedebug.engine import runner, scenario
from cutedebug.engine.verdict import Verdict
from cutedebug.instrument import faults

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "kernels" / "sm100_gemm.py"
SCENARIOS = ROOT / "scenarios" / "sm100_gemm"
Sm100Gemm = kernel_api.load_entry(KERNEL, "Sm100Gemm")

# ragged in M, N and K: partial tiles in every dimension; 16 CTAs (8 pairs) loop over tiles
SMALL = {"m": 1000, "n": 1032, "k": 520, "ctas": 16}
STAGES, ACC_STAGES, K_BLOCKS = 4, 2, 64 // 16  # defaults: tile_k 64 = 4 bf16 MMAs of k 16
LEADER_MASK = -16777224  # 0xFEFFFFF8: clears the peer bit of a shared::cluster address


# ---- the barrier arithmetic, without compiling ------------------------------------------------


def test_barrier_arithmetic_is_the_docstring_s():
    one, two = Sm100Gemm(cta_group=1), Sm100Gemm(cta_group=2)
    assert (one.a_bytes, one.b_bytes, one.tx_bytes) == (16384, 32768, 49152)
    # each CTA of the pair loads half of B, and the leader expects both CTAs' bytes
    assert (two.a_bytes, two.b_bytes, two.tx_bytes) == (16384, 16384, 65536)
    assert (one.acc_empty_arrivals, two.acc_empty_arrivals) == (4, 8)
    assert Sm100Gemm(tile_n=128, cta_group=2).tx_bytes == 2 * (128 * 64 * 2 + 64 * 64 * 2)
    doc = sys.modules[Sm100Gemm.__module__].__doc__
    assert "16384 + 32768 = 49152" in doc and "2 * (16384 + 16384) = 65536" in doc


def test_tmem_columns_and_the_two_ctas_per_sm_configuration():
    shared = Sm100Gemm(tile_n=128, stages=2, acc_stages=4)
    assert shared.tmem_cols == 512  # all of TMEM: co-resident CTAs serialise
    assert 2 * (shared.smem_bytes + 1024) <= 228 * 1024  # two CTAs fit one SM's smem
    assert Sm100Gemm(tile_n=64, acc_stages=1).tmem_cols == 64
    with pytest.raises(ValueError, match="TMEM columns"):
        Sm100Gemm(tile_n=256, acc_stages=4)


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"n": 1030}, "16-byte row pitches"),
        ({"k": 4}, "k >= 8"),
        ({"cta_group": 3}, "1 or 2"),
        ({"cta_group": 2, "ctas": 1}, "ctas >= cta_group"),
        ({"stages": 8}, "smem"),
    ],
)
def test_bad_configurations_are_refused_with_the_reason(params, needle):
    with pytest.raises(ValueError, match=needle):
        Sm100Gemm(**params)


@pytest.mark.parametrize("cta_group", [1, 2])
def test_persistent_schedule_covers_every_output_element_once(cta_group):
    g = Sm100Gemm(**SMALL, cta_group=cta_group)
    origin = sys.modules[Sm100Gemm.__module__].tile_origin
    seen = Counter()
    for cluster in range(g.clusters):
        for tile in range(cluster, g.num_tiles, g.clusters):
            for v in range(cta_group):  # CTA v of the pair owns rows [128 v, 128 v + 128)
                r0, c0 = origin(tile, g.tiles_n, g.mma_m, g.tile_n)
                seen[(r0 + 128 * v, c0)] += 1
    rows = range(0, g.tiles_m * g.mma_m, 128)
    want = {(r, c) for r in rows for c in range(0, g.n, g.tile_n)}
    assert set(seen) == want and set(seen.values()) == {1}
    # the tiles reach past the ragged edges (TMA clips the stores there), but by less than one
    assert g.tiles_m * g.mma_m - g.mma_m < g.m <= g.tiles_m * g.mma_m
    assert g.grid == g.clusters * cta_group <= SMALL["ctas"]


# ---- PTX ----------------------------------------------------------------------------------------


def features(ptx: str) -> dict[str, object]:
    def n(pattern: str) -> int:
        return len(re.findall(pattern, ptx, re.MULTILINE))

    return {
        "mma": Counter(re.findall(r"tcgen05\.mma\.(cta_group::\d)", ptx)),
        "commits": n(r"tcgen05\.commit\."),
        "multicast_commits": n(r"tcgen05\.commit\.[^ \t]*multicast"),
        "alloc": Counter(re.findall(r"tcgen05\.alloc\.(cta_group::\d)", ptx)),
        "dealloc": Counter(re.findall(r"tcgen05\.dealloc\.(cta_group::\d)", ptx)),
        "relinquish": n(r"tcgen05\.relinquish_alloc_permit"),
        "tmem_loads": n(r"tcgen05\.ld\."),
        "tmem_load_waits": n(r"tcgen05\.wait::ld"),
        "expect_tx": sorted(last_operands(ptx, "mbarrier.arrive.expect_tx.shared.b64")),
        "init_counts": Counter(last_operands(ptx, "mbarrier.init.shared.b64")),
        "try_waits": n(r"mbarrier\.try_wait"),
        "local_arrives": n(r"mbarrier\.arrive\.shared\.b64"),
        "remote_arrives": n(r"mbarrier\.arrive\.shared::cluster\.b64"),
        "tma_loads": Counter(
            re.findall(
                r"cp\.async\.bulk\.tensor\.2d\.shared::(cta|cluster)"
                r"\.global[^ ]*?(\.cta_group::2)?\s",
                ptx,
            )
        ),
        "tma_stores": n(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta"),
        "leader_masks": n(rf"and\.b32\s+%r\d+, %r\d+, {LEADER_MASK};"),
        "cluster_waits": n(r"barrier\.cluster\.wait"),
        "named_barriers": Counter(re.findall(r"bar\.sync\s+(\d+)", ptx)),
        "phase_xors": n(r"xor\.b32\s+%r\d+, %r\d+, %r\d+;"),
        "phase_selps": n(r"selp\.b32\s+%r\d+, 1, 0, %p\d+;"),
        "compares": n(r"^\s*setp\."),
    }


_PTX: dict[tuple, str] = {}


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    return tmp_path_factory.mktemp("ptx")


@pytest.fixture(scope="module")
def compile_ptx(dump):
    """PTX for sm_100a of the kernel with ``params`` (cached), optionally under a fault."""
    from cutlass import cute
    from cutlass.base_dsl.compiler import DumpDir

    def run(fault: str | None = None, args: dict | None = None, **params):
        key = (fault, tuple(sorted((args or {}).items())), tuple(sorted(params.items())))
        if key not in _PTX:
            obj = Sm100Gemm(**{**SMALL, **params})
            opts = cute.compile[cute.GPUArch("sm_100a"), cute.KeepPTX(), DumpDir(str(dump))]
            with faults.inject(fault, args or {}) if fault else contextlib.nullcontext() as ap:
                ptx = opts(obj, *obj.fake_args()).__ptx__
            _PTX[key] = ptx
            _APPLIED[key] = ap
        return _PTX[key], _APPLIED[key]

    return run


_APPLIED: dict[tuple, faults.Applied | None] = {}


def clean(compile_ptx, cta_group: int) -> dict:
    return features(compile_ptx(cta_group=cta_group)[0])


def assert_only(base: dict, faulted: dict, changed: dict) -> None:
    """Features named in ``changed`` have the given values; all the others are unchanged."""
    for key, value in base.items():
        want = changed.get(key, value)
        if callable(want):
            assert want(faulted[key]), f"{key}: {faulted[key]!r} (clean {value!r})"
        else:
            assert faulted[key] == want, f"{key}: {faulted[key]!r}, expected {want!r}"


def sites_in_kernel(applied: faults.Applied, n: int) -> None:
    assert applied.count == n, applied.sites
    for site in applied.sites:
        assert site["file"] == str(KERNEL) and site["line"] > 0, site


@pytest.mark.parametrize("cta_group", [1, 2])
def test_clean_ptx_is_the_blackwell_pipeline(compile_ptx, cta_group):
    f = clean(compile_ptx, cta_group)
    group = f"cta_group::{cta_group}"
    assert f["mma"] == Counter({group: K_BLOCKS})  # one tcgen05.mma per k block
    assert f["alloc"] == f["dealloc"] == Counter({group: 1}) and f["relinquish"] == 1
    assert f["commits"] == 2  # ab consumer_release + acc producer_commit
    assert f["tmem_loads"] >= 1 and f["tma_stores"] == 1
    assert f["tmem_load_waits"] >= 1  # registers valid (and TMEM read) before the release
    assert f["expect_tx"] == [Sm100Gemm(cta_group=cta_group).tx_bytes]
    assert f["expect_tx"] == [49152 if cta_group == 1 else 65536]
    # full/empty of ab (1 arrive each, 4 stages), acc full (1 commit), acc empty (warps)
    inits = Counter({1: 2 * STAGES + ACC_STAGES, 4 * cta_group: ACC_STAGES})
    if cta_group == 2:
        inits[32] += 1  # TMEM dealloc handshake barrier: the allocator warp of each CTA
    assert f["init_counts"] == inits
    # barrier 1: TMEM address hand-off (MMA warp and epilogue warps); 2: epilogue subtiles
    assert f["named_barriers"]["1"] == 2 and f["named_barriers"]["2"] >= 2


def test_one_cta_is_local_and_two_ctas_talk_across_the_pair(compile_ptx):
    one, two = clean(compile_ptx, 1), clean(compile_ptx, 2)
    assert one["tma_loads"] == Counter({("cta", ""): 2})
    assert (one["multicast_commits"], one["leader_masks"], one["cluster_waits"]) == (0, 0, 0)
    assert one["remote_arrives"] == 0 and one["local_arrives"] == 1  # epilogue releases acc
    # 2-SM TMA loads, addressed to the leader's full barrier (peer bit masked off)
    assert two["tma_loads"] == Counter({("cluster", ".cta_group::2"): 2})
    assert two["leader_masks"] >= 1
    # both commits multicast to the pair; barrier init is published with a cluster sync
    assert two["multicast_commits"] == 2 and two["cluster_waits"] >= 1
    # epilogue arrives on the leader's acc empty; TMEM dealloc handshake with the peer
    assert two["remote_arrives"] == 2 and two["local_arrives"] == 0


def test_tx_bytes_follow_the_tile_shape(compile_ptx):
    ptx, _ = compile_ptx(cta_group=2, tile_n=128)
    assert features(ptx)["expect_tx"] == [2 * (128 * 64 * 2 + 64 * 64 * 2)] == [49152]


# ---- faults -------------------------------------------------------------------------------------


@pytest.mark.parametrize("delta", [16, -16])
def test_wrong_expect_tx_moves_the_expected_bytes(compile_ptx, delta):
    ptx, applied = compile_ptx("wrong_expect_tx", {"delta_bytes": delta}, cta_group=1)
    sites_in_kernel(applied, 1)
    assert_only(clean(compile_ptx, 1), features(ptx), {"expect_tx": [49152 + delta]})


def test_forgetting_the_2cta_doubling_halves_the_expected_bytes(compile_ptx):
    ptx, applied = compile_ptx("expect_tx_no_2cta_doubling", {}, cta_group=2)
    sites_in_kernel(applied, 1)
    assert "65536 -> 32768" in applied.sites[0]["detail"]
    assert_only(clean(compile_ptx, 2), features(ptx), {"expect_tx": [32768]})
    # the same bug written as a byte delta gives the very same kernel
    same, _ = compile_ptx("wrong_expect_tx", {"delta_bytes": -32768}, cta_group=2)
    assert same == ptx


def test_forgetting_the_doubling_does_not_apply_to_one_cta(compile_ptx):
    ptx, applied = compile_ptx("expect_tx_no_2cta_doubling", {}, cta_group=1)
    assert applied.count == 0 and ptx == compile_ptx(cta_group=1)[0]
    with pytest.raises(faults.FaultNotTriggered):
        applied.require()


@pytest.mark.parametrize("cta_group", [1, 2])
def test_extra_consumer_release_doubles_the_tcgen05_commit_and_the_acc_arrive(
    compile_ptx, cta_group
):
    ptx, applied = compile_ptx("extra_consumer_release", {"at_iteration": -1}, cta_group=cta_group)
    sites_in_kernel(applied, 2)  # PipelineTmaUmma (ab) and PipelineUmmaAsync (acc)
    assert {s["pipeline"] for s in applied.sites} == {"PipelineTmaUmma", "PipelineUmmaAsync"}
    base = clean(compile_ptx, cta_group)
    arrive = "local_arrives" if cta_group == 1 else "remote_arrives"
    changed = {"commits": 3, arrive: base[arrive] + 1}
    if cta_group == 2:
        changed["multicast_commits"] = 3
    assert_only(base, features(ptx), changed)


def test_skip_consumer_release_every_time_removes_the_commit_and_the_arrive(compile_ptx):
    ptx, applied = compile_ptx("skip_consumer_release", {"at_iteration": -1}, cta_group=1)
    sites_in_kernel(applied, 2)
    # left: the acc producer_commit; gone: the ab release commit and the epilogue's arrive
    assert_only(clean(compile_ptx, 1), features(ptx), {"commits": 1, "local_arrives": 0})


def test_skip_consumer_release_once_guards_both_releases_with_the_count(compile_ptx):
    ptx, applied = compile_ptx("skip_consumer_release", {"at_iteration": 0}, cta_group=1)
    sites_in_kernel(applied, 2)
    base = clean(compile_ptx, 1)
    assert_only(base, features(ptx), {"compares": lambda v: v >= base["compares"] + 2})


@pytest.mark.parametrize("cta_group", [1, 2])
def test_skip_producer_tail_removes_the_drains_of_both_pipelines(compile_ptx, cta_group):
    ptx, applied = compile_ptx("skip_producer_tail", {}, cta_group=cta_group)
    sites_in_kernel(applied, 2)
    tails = {s["pipeline"]: s["num_stages"] for s in applied.sites}
    assert tails == {"PipelineTmaUmma": STAGES, "PipelineUmmaAsync": ACC_STAGES}
    base = clean(compile_ptx, cta_group)
    # ab tail: one empty wait per stage; acc tail (PipelineUmmaAsync): one wait, leader only
    assert_only(
        base,
        features(ptx),
        {
            "try_waits": base["try_waits"] - STAGES - 1,
            "phase_xors": lambda v: v <= base["phase_xors"],
            "phase_selps": lambda v: v <= base["phase_selps"],
            "compares": lambda v: v <= base["compares"],
        },
    )


@pytest.mark.parametrize("role", ["consumer", "producer"])
def test_missing_phase_flip_removes_the_flips_of_one_role(compile_ptx, role):
    ptx, applied = compile_ptx("missing_phase_flip", {"role": role}, cta_group=1)
    # since the instrumentation layer the sites are the flip-less advances (in the kernel) of
    # the role's states that a wait reads: the ab and acc states of that role, MMA + epilogue
    # (consumer), TMA + MMA (producer); each site names the line that made its state
    assert {s["op"] for s in applied.sites} == {"advance"}
    assert all(s["file"] == str(KERNEL) and s["line"] > 0 for s in applied.sites)
    made = {re.search(r"state made at (\S+)\)", s["detail"]).group(1) for s in applied.sites}
    assert len(made) == 2, made
    base, f = clean(compile_ptx, 1), features(ptx)
    removed = base["phase_xors"] - f["phase_xors"]
    assert removed > 0
    assert_only(
        base,
        f,
        {"phase_xors": base["phase_xors"] - removed, "phase_selps": base["phase_selps"] - removed},
    )


def test_missing_phase_flip_roles_partition_the_flips(compile_ptx):
    # exactly one role each: the two roles' removed flips are disjoint and cover every flip
    # (a flip is an xor with the selp(1, 0) of the wrap test)
    base = clean(compile_ptx, 1)
    removed = [
        base["phase_selps"]
        - features(compile_ptx("missing_phase_flip", {"role": r}, cta_group=1)[0])["phase_selps"]
        for r in ("consumer", "producer")
    ]
    assert all(n > 0 for n in removed) and sum(removed) == base["phase_selps"]


def test_wrong_arrive_count_raises_both_empty_barrier_arrays(compile_ptx):
    ptx, applied = compile_ptx("wrong_arrive_count", {"delta": 1, "barrier": "empty"}, cta_group=1)
    sites_in_kernel(applied, 2)
    want = Counter({1: STAGES + ACC_STAGES, 2: STAGES, 5: ACC_STAGES})
    assert_only(clean(compile_ptx, 1), features(ptx), {"init_counts": want})


@pytest.mark.parametrize("cta_group", [1, 2])
def test_tmem_dealloc_early_frees_tmem_before_the_epilogue_reads_it(compile_ptx, cta_group):
    good, _ = compile_ptx(cta_group=cta_group)
    bad, _ = compile_ptx(cta_group=cta_group, tmem_dealloc_early=True)

    def order(ptx: str) -> dict[str, int]:
        return {k: ptx.index(k) for k in ("tcgen05.alloc", "tcgen05.dealloc", "tcgen05.ld")}

    # the MMA warp's code precedes the epilogue's in the PTX; within the epilogue (which
    # allocates, loads TMEM and frees), the switch moves the dealloc ahead of every tcgen05.ld
    g, b = order(good), order(bad)
    assert g["tcgen05.alloc"] < g["tcgen05.ld"] < g["tcgen05.dealloc"]
    assert b["tcgen05.alloc"] < b["tcgen05.dealloc"] < b["tcgen05.ld"]
    # still exactly one alloc / relinquish / dealloc: moved, not added
    fg, fb = features(good), features(bad)
    assert (fb["alloc"], fb["dealloc"], fb["relinquish"]) == (
        fg["alloc"],
        fg["dealloc"],
        fg["relinquish"],
    )
    assert fb["mma"] == fg["mma"] and fb["expect_tx"] == fg["expect_tx"]


def test_patches_are_gone_after_the_faulted_compiles(compile_ptx, dump):
    from cutlass import cute
    from cutlass.base_dsl.compiler import DumpDir

    obj = Sm100Gemm(**SMALL, cta_group=2)
    fresh = cute.compile[cute.GPUArch("sm_100a"), cute.KeepPTX(), DumpDir(str(dump))](
        obj, *obj.fake_args()
    )
    assert fresh.__ptx__ == compile_ptx(cta_group=2)[0]


# ---- scenarios and the worker on a machine without Blackwell -------------------------------------

NOT_OBSERVED = "not yet observed on hardware (no Blackwell GPU available)"


def test_scenarios_require_blackwell_and_say_they_are_unobserved():
    files = sorted(SCENARIOS.glob("*.toml"))
    loaded = {f.stem: scenario.load(f) for f in files}
    assert {"clean_1cta", "clean_2cta"} <= set(loaded)
    covered = {sc.fault for sc in loaded.values()}
    assert covered >= {
        None,
        "wrong_expect_tx",
        "expect_tx_no_2cta_doubling",
        "skip_consumer_release",
        "extra_consumer_release",
        "skip_producer_tail",
        "missing_phase_flip",
        "tmem_dealloc_early",
    }
    for name, sc in loaded.items():
        assert sc.archs == ("sm_100a",), name
        assert sc.kernel_file == str(KERNEL) and sc.id == f"sm100_gemm/{name}"
        assert NOT_OBSERVED in sc.expect.note, name
        if sc.fault is None:
            assert sc.expect.verdict == "PASS", name
        if sc.expect.verdict == "HANG":
            assert sc.probes, f"{name}: a hang scenario needs probes to localize it"
        Sm100Gemm(
            **kernel_api.resolve_params(
                Sm100Gemm,
                {**sc.params, **({sc.fault: True} if sc.fault in Sm100Gemm.SWITCHES else {})},
                name,
            )
        )


def test_worker_detects_blackwell_as_sm_100a(monkeypatch):
    import torch

    from cutedebug import devices
    from cutedebug.engine import worker

    # a GPU machine: its device node, then torch's view of the device
    monkeypatch.setattr(devices, "gpu_device_node", lambda: "/dev/nvidia0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA B200")
    for cc, arch in (((10, 0), "sm_100a"), ((9, 0), "sm_90a")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0, cc=cc: cc)
        dev = worker.detect_device()
        assert dev["present"] and dev["arch"] == arch and dev["cc"] == list(cc)
    assert "sm_100a" in Sm100Gemm.ARCHS


@pytest.mark.slow
def test_on_an_h200_a_blackwell_scenario_compiles_for_sm_100a_and_is_unsupported(tmp_path):
    sc = scenario.load(SCENARIOS / "expect_tx_no_2cta_doubling.toml")
    shim = ROOT / "tests" / "helpers" / "fake_gpu_worker.py"

    def on_h200(argv, run_dir):
        return [sys.executable, str(shim), "NVIDIA H200", "9", "0", argv[-1]]

    classified, outcome, _ = runner.run_once(
        sc, tmp_path, mode="run", probes={"budget_ns": 500_000_000}, wrap=on_h200
    )
    assert classified.verdict is Verdict.UNSUPPORTED
    assert classified.reason == (
        "execution skipped: needs sm_100a, this GPU is sm_90a (NVIDIA H200)"
    )
    assert outcome.event("device")["arch"] == "sm_90a"
    compiled = outcome.event("compiled")
    assert compiled["arch"] == "sm_100a" and compiled["fault_count"] == 1
    assert outcome.event("launched") is None and outcome.event("done") is not None
    ptx = (tmp_path / "kernel.ptx").read_text()
    assert features(ptx)["expect_tx"] == [32768]


def test_shared_storage_is_the_docstring_layout():
    """The ab, acc and dealloc mbarriers and the TMEM address first, then this CTA's A ring,
    B ring and C subtile ring (two 128 x 32 bf16 subtiles), each 128 B aligned."""
    one = Sm100Gemm(cta_group=1, tile_n=256, stages=4, acc_stages=2)
    a_ring, b_ring = 4 * 128 * 64 * 2, 4 * 256 * 64 * 2
    assert one.storage._offsets == {
        "ab_bars": 0,
        "acc_bars": 2 * 4 * 8,
        "dealloc_bar": 2 * 4 * 8 + 2 * 2 * 8,
        "tmem_holder": 2 * 4 * 8 + 2 * 2 * 8 + 8,
        "a": 128,
        "b": 128 + a_ring,
        "c": 128 + a_ring + b_ring,
    }
    assert one.smem_bytes == 128 + a_ring + b_ring + 2 * 128 * 32 * 2
    two = Sm100Gemm(cta_group=2, tile_n=256, stages=4)
    assert two.storage._offsets["c"] - two.storage._offsets["b"] == 4 * 128 * 64 * 2  # B half


@pytest.mark.parametrize("what", ["ring", "tx"])
def test_storage_that_disagrees_with_the_layouts_is_refused_at_trace_time(what):
    """__call__ checks the struct against the staged layouts (cute.cosize) and tx_bytes
    against cute.size_in_bytes of the TMA boxes, before the kernel is traced."""
    import cutlass
    from cutlass import cute

    k = Sm100Gemm(m=256, n=256, k=256, ctas=4)
    if what == "ring":
        fields = k.smem_fields()
        mem, align = cute.struct.MemRange, cute.struct.Align
        fields["c"] = align[mem[cutlass.BFloat16, 128 * 32], 128]
        k.smem_fields = lambda: fields
        match = "SharedStorage.c: 4096 elements for a layout of cosize 8192"
    else:
        k.tx_bytes += 16
        match = "tx bytes: layouts move 49152, arithmetic says 49168"
    with pytest.raises(ValueError, match=match):
        cute.compile[cute.GPUArch("sm_100a")](k, *k.fake_args())
