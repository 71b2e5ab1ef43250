"""Fault registry: validation, and the PTX effect of every patch fault on real pipeline kernels.

Each patch fault is compiled for sm_90a (CPU only) into two kernels built on cutlass.pipeline:
tests/pipeline_kernels/tma_copy.py and kernels/tma_stream.py. The PTX of the faulted compile is
compared with the clean one on a fixed set of features (expect_tx bytes, mbarrier.init counts,
try_wait loops, plain arrives, bar.sync, phase-flip xor/selp, ...): the fault must change
exactly the features it should, by the amount it should, and nothing else among them. After
every faulted compile every binding a patch may touch is the original again and no observer is
left registered (patches fully restored), and once a kernel's tests are done a clean compile
must still give the clean PTX (what the bindings cannot show: state a leaked patch left behind).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from helpers.ptx import last_operands

from cutedebug.instrument import faults
from cutedebug.instrument.faults import DEPENDS, FAULTS, VERDICTS, FaultSpecError

ROOT = Path(__file__).resolve().parents[1]
KERNELS = {
    "tma_copy": (ROOT / "tests/pipeline_kernels/tma_copy.py", "TmaCopy", {}),
    "tma_stream": (ROOT / "kernels/tma_stream.py", "TmaStream", {"m": 4096, "n": 512, "ctas": 4}),
}


# ---- validation (no cutlass needed) ----------------------------------------------------------


def test_registry_imports_without_cutlass_or_torch():
    code = (
        "import sys, cutedebug.instrument.faults as f; f.validate('wrong_expect_tx', {}); "
        "f.describe_all(); print(sorted(m for m in ('cutlass', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_every_fault_is_described_completely():
    described = {d["name"]: d for d in faults.describe_all()}
    assert set(described) == set(FAULTS)
    for name, d in described.items():
        assert d["description"] and d["kind"] in ("patch", "switch"), name
        assert d["expected"] in VERDICTS or (d["expected"] == DEPENDS and d["expected_note"]), name
        if d["kind"] == "patch":
            assert d["patches"] and FAULTS[name].apply is not None, name
        for pname, p in d["params"].items():
            assert faults.validate(name, {})[pname] == p["default"]


def test_validate_fills_defaults_and_keeps_given_values():
    assert faults.validate("wrong_expect_tx", {}) == {"delta_bytes": 16}
    assert faults.validate("wrong_expect_tx", {"delta_bytes": -32}) == {"delta_bytes": -32}
    assert faults.validate("drop_sync", None) == {"which": 0, "sync": "any"}
    assert faults.validate("skip_producer_tail", {}) == {}
    assert faults.validate(None, None) == {}


@pytest.mark.parametrize(
    ("name", "args", "needles"),
    [
        ("no_such_fault", {}, ["fault.name", "'no_such_fault'", "wrong_expect_tx"]),
        ("wrong_expect_tx", {"bytes": 16}, ["fault.args.bytes", "unknown argument", "delta_bytes"]),
        ("wrong_expect_tx", {"delta_bytes": "16"}, ["fault.args.delta_bytes", "'16'", "int"]),
        ("wrong_expect_tx", {"delta_bytes": True}, ["fault.args.delta_bytes", "True", "int"]),
        ("wrong_expect_tx", {"delta_bytes": 1.5}, ["fault.args.delta_bytes", "1.5", "int"]),
        ("wrong_expect_tx", {"delta_bytes": 0}, ["fault.args.delta_bytes", "nonzero"]),
        (
            "missing_phase_flip",
            {"role": "both"},
            ["fault.args.role", "'both'", "producer", "consumer"],
        ),
        ("wrong_arrive_count", {"barrier": "middle"}, ["fault.args.barrier", "empty", "full"]),
        ("skip_consumer_release", {"at_iteration": -2}, ["fault.args.at_iteration", "-2", ">= -1"]),
        ("drop_sync", {"sync": "grid"}, ["fault.args.sync", "'grid'", "cta", "warp", "any"]),
        ("wrong_expect_tx", [16], ["fault.args", "[16]"]),
        (None, {"delta_bytes": 16}, ["fault.args", "no fault name"]),
        (3, {}, ["fault.name", "3", "unknown fault"]),
    ],
)
def test_validate_rejects_bad_specs_naming_field_value_and_allowed(name, args, needles):
    with pytest.raises(FaultSpecError) as err:
        faults.validate(name, args)
    for needle in needles:
        assert needle in str(err.value)
    with pytest.raises(FaultSpecError):
        faults.inject(name, args)


def test_spec_key_is_stable_and_includes_defaults():
    assert faults.spec_key(None, None) == "none"
    assert (
        faults.spec_key("wrong_expect_tx", {})
        == faults.spec_key("wrong_expect_tx", {"delta_bytes": 16})
        == "wrong_expect_tx(delta_bytes=16)"
    )
    assert faults.spec_key("drop_sync", {"sync": "cta", "which": 1}) == faults.spec_key(
        "drop_sync", {"which": 1, "sync": "cta"}
    )
    keys = {faults.spec_key("wrong_expect_tx", {"delta_bytes": d}) for d in (16, -16, 32)}
    assert len(keys) == 3


def test_expected_verdict_follows_the_sign_of_the_error():
    assert faults.expected_verdict("wrong_expect_tx", {"delta_bytes": 16})[0] == "HANG"
    assert faults.expected_verdict("wrong_expect_tx", {"delta_bytes": -16})[0] == "MISMATCH"
    assert faults.expected_verdict("wrong_arrive_count", {})[0] == "HANG"
    assert faults.expected_verdict("wrong_arrive_count", {"delta": -1})[0] == DEPENDS
    assert faults.expected_verdict("skip_consumer_release", {})[0] == "HANG"
    assert faults.expected_verdict("drop_sync", {})[0] == "RACE"
    assert faults.expected_verdict("oob_store", {})[0] == "MEMORY_ERROR"
    assert faults.expected_verdict(None, None)[0] == "PASS"


def test_inject_none_is_a_null_context():
    with faults.inject(None, {}) as applied:
        assert applied.fault is None and applied.count == 0
        applied.require()  # no fault: nothing to require


# ---- PTX features ----------------------------------------------------------------------------


def ptx_features(ptx: str) -> dict[str, object]:
    return {
        "expect_tx_bytes": sorted(last_operands(ptx, "mbarrier.arrive.expect_tx.shared.b64")),
        "init_counts": Counter(last_operands(ptx, "mbarrier.init.shared.b64")),
        "init_fences": len(re.findall(r"fence\.mbarrier_init", ptx)),
        "try_waits": len(re.findall(r"mbarrier\.try_wait", ptx)),
        "arrives": len(re.findall(r"mbarrier\.arrive\.shared\.b64", ptx)),
        "syncs": Counter(
            re.sub(r"\s+", " ", s) for s in re.findall(r"\bbar\.(?:sync|warp\.sync)[^;]*", ptx)
        ),
        "phase_xors": len(re.findall(r"xor\.b32\s+%r\d+, %r\d+, %r\d+;", ptx)),
        "phase_selps": len(re.findall(r"selp\.b32\s+%r\d+, 1, 0, %p\d+;", ptx)),
        # a run-time test on the state's count adds one compare (LLVM may fold the count into
        # the loop counter, so the immediate is not necessarily at_iteration)
        "compares": len(re.findall(r"^\s*setp\.", ptx, re.MULTILINE)),
        "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
    }


def test_ptx_features_read_a_captured_sample():
    sample = textwrap.dedent("""\
        mov.b32 	%r25, 1;
        mbarrier.init.shared.b64 	[%r1], %r25;
        mbarrier.init.shared.b64 	[%r1+8], %r25;
        mov.b32 	%r27, 4;
        mbarrier.init.shared.b64 	[%r1+24], %r27;
        fence.mbarrier_init.release.cluster;
        bar.sync 	0;
        mov.b32 	%r39, 16384;
        mbarrier.arrive.expect_tx.shared.b64 %rd3, [%r7], %r39;
        mbarrier.try_wait.parity.shared.b64 P1, [%r36], %r188, 10000000;
        selp.b32 	%r47, 1, 0, %p16;
        xor.b32 	%r45, %r188, %r47;
        setp.eq.b32 	%p45, %r192, 5;
        mbarrier.arrive.shared.b64 %rd18, [%r18+24], %r175;
        bar.sync 	1, 128;
        bar.warp.sync 	-1;
        """)
    f = ptx_features(sample)
    assert f["init_counts"] == Counter({1: 2, 4: 1})
    assert f["expect_tx_bytes"] == [16384]
    assert (f["init_fences"], f["try_waits"], f["arrives"]) == (1, 1, 1)
    assert f["syncs"] == Counter({"bar.sync 0": 1, "bar.sync 1, 128": 1, "bar.warp.sync -1": 1})
    assert (f["phase_xors"], f["phase_selps"], f["compares"]) == (1, 1, 1)


# ---- compiling the kernels -------------------------------------------------------------------


@pytest.fixture(scope="module")
def dump_dir(tmp_path_factory):
    # KeepPTX writes .ptx files into the working directory: keep them out of the repo
    return tmp_path_factory.mktemp("ptx")


class Kernel:
    def __init__(self, key: str, dump_dir: Path):
        from cutedebug import kernel_api

        path, entry, params = KERNELS[key]
        if not path.is_file():
            pytest.skip(f"{path} not present yet")
        self.key, self.dump_dir = key, dump_dir
        self.cls = kernel_api.load_entry(path, entry)
        self.params = params
        self.clean = self.ptx()
        self.features = ptx_features(self.clean)
        self.faults_run: list[str] = []

    def ptx(self, **switches) -> str:
        from cutlass import cute

        obj = self.cls(**self.params, **switches)
        with contextlib.chdir(self.dump_dir):
            compiled = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](obj, *obj.fake_args())
        return compiled.__ptx__

    def faulted(self, name: str, args: dict) -> tuple[str, faults.Applied]:
        from cutedebug.instrument import layer

        before = _patchable_state(callables=True)
        with faults.inject(name, args) as applied:
            ptx = self.ptx()
        # restored: every binding back, no observer left (the clean recompile that proves
        # it once more runs when the kernel's tests are done: the fixture's teardown)
        after = _patchable_state(callables=True)
        assert {k: after.get(k) for k in before} == before, f"{name}{args}: patches leaked"
        assert layer.current() is None, f"{name}{args}: an observer stayed registered"
        self.faults_run.append(f"{name}{args}")
        return ptx, applied


@pytest.fixture(scope="module", params=sorted(KERNELS))
def kernel(request, dump_dir):
    k = Kernel(request.param, dump_dir)
    yield k
    # after every fault this kernel's tests injected: a clean compile is still the clean PTX
    assert k.ptx() == k.clean, f"a clean compile after {k.faults_run} differs from the first"


def assert_only(clean: dict, faulted: dict, changed: dict) -> None:
    """Features in ``changed`` equal the given values; every other feature is unchanged."""
    for key, value in clean.items():
        want = changed.get(key, value)
        if callable(want):
            assert want(faulted[key]), f"{key}: {faulted[key]!r} (clean {value!r})"
        else:
            assert faulted[key] == want, f"{key}: {faulted[key]!r}, expected {want!r}"


def sites_in_kernel(applied: faults.Applied, kernel: Kernel) -> None:
    assert applied.count > 0
    path = str(KERNELS[kernel.key][0])
    for site in applied.sites:
        assert site["file"] == path and site["line"] > 0, site
        assert site["fault"] == applied.fault


def test_clean_compile_is_deterministic(kernel):
    assert kernel.ptx() == kernel.clean
    f = kernel.features
    assert f["expect_tx_bytes"] and f["init_fences"] == 1 and f["arrives"] > 0
    assert f["phase_xors"] > 0 and f["syncs"]["bar.sync 0"] == 1


@pytest.mark.parametrize("delta", [16, -16, 4096])
def test_wrong_expect_tx_shifts_every_expect_tx_by_delta(kernel, delta):
    ptx, applied = kernel.faulted("wrong_expect_tx", {"delta_bytes": delta})
    sites_in_kernel(applied, kernel)
    clean = kernel.features["expect_tx_bytes"]
    assert {s["tx_bytes"] for s in applied.sites} == set(clean)
    assert_only(
        kernel.features, ptx_features(ptx), {"expect_tx_bytes": sorted(b + delta for b in clean)}
    )


def test_wrong_expect_tx_below_zero_fails_the_trace_and_restores(kernel):
    with pytest.raises(Exception, match="tx bytes < 0"):
        kernel.faulted("wrong_expect_tx", {"delta_bytes": -(1 << 20)})
    assert kernel.ptx() == kernel.clean


@pytest.mark.parametrize("role", ["producer", "consumer"])
def test_missing_phase_flip_removes_the_flips_of_one_role(kernel, role):
    ptx, applied = kernel.faulted("missing_phase_flip", {"role": role})
    sites_in_kernel(applied, kernel)
    ops = Counter(s["op"] for s in applied.sites)
    # sites: the advances of the role's states that a wait reads (the state's own advance)
    assert set(ops) == {"advance"} and ops["advance"] >= 1
    f = ptx_features(ptx)
    removed = kernel.features["phase_xors"] - f["phase_xors"]
    assert removed > 0
    # the flip is the xor with a selp(1, 0) of the wrap test: both go together
    assert_only(
        kernel.features,
        f,
        {
            "phase_xors": kernel.features["phase_xors"] - removed,
            "phase_selps": kernel.features["phase_selps"] - removed,
        },
    )


def test_missing_phase_flip_roles_partition_the_flips(kernel):
    removed = []
    for role in ("producer", "consumer"):
        ptx, _ = kernel.faulted("missing_phase_flip", {"role": role})
        removed.append(kernel.features["phase_xors"] - ptx_features(ptx)["phase_xors"])
    assert sum(removed) == kernel.features["phase_xors"]


def test_skip_producer_tail_removes_one_wait_per_stage(kernel):
    ptx, applied = kernel.faulted("skip_producer_tail", {})
    sites_in_kernel(applied, kernel)
    (site,) = applied.sites
    stages = site["num_stages"]
    clean = kernel.features
    # the tail's state advances die with it, so its phase flips may go too
    assert_only(
        clean,
        ptx_features(ptx),
        {
            "try_waits": clean["try_waits"] - stages,
            "phase_xors": lambda v: v <= clean["phase_xors"],
            "phase_selps": lambda v: v <= clean["phase_selps"],
            "compares": lambda v: v <= clean["compares"],
        },
    )


def test_skip_consumer_release_every_iteration_removes_the_arrives(kernel):
    ptx, applied = kernel.faulted("skip_consumer_release", {"at_iteration": -1})
    sites_in_kernel(applied, kernel)
    # both kernels arrive plainly (not expect_tx) only in consumer_release
    # the signaling-lane test of the release goes with the arrive
    assert_only(
        kernel.features,
        ptx_features(ptx),
        {"arrives": 0, "compares": lambda v: v < kernel.features["compares"]},
    )


def test_skip_consumer_release_at_iteration_guards_the_arrive_with_the_count(kernel):
    ptx, applied = kernel.faulted("skip_consumer_release", {"at_iteration": 5})
    sites_in_kernel(applied, kernel)
    assert "state.count == 5" in applied.sites[0]["detail"]
    clean = kernel.features
    assert_only(clean, ptx_features(ptx), {"compares": clean["compares"] + 1})


@pytest.mark.parametrize(("at_iteration", "compares"), [(5, 1), (-1, 0)])
def test_extra_consumer_release_doubles_the_arrive(kernel, at_iteration, compares):
    ptx, applied = kernel.faulted("extra_consumer_release", {"at_iteration": at_iteration})
    sites_in_kernel(applied, kernel)
    clean = kernel.features
    assert_only(
        clean,
        ptx_features(ptx),
        {
            # + the count test; the second release may re-test the signaling lane
            "arrives": 2 * clean["arrives"],
            "compares": lambda v: (
                clean["compares"] + compares <= v <= clean["compares"] + compares + 1
            ),
        },
    )


@pytest.mark.parametrize(("delta", "barrier"), [(1, "empty"), (-1, "empty"), (3, "full")])
def test_wrong_arrive_count_shifts_the_init_count_of_one_barrier_array(kernel, delta, barrier):
    ptx, applied = kernel.faulted("wrong_arrive_count", {"delta": delta, "barrier": barrier})
    sites_in_kernel(applied, kernel)
    (site,) = applied.sites
    count, stages = site["arrive_count"], site["num_stages"]
    want = Counter(kernel.features["init_counts"])
    want[count] -= stages
    want[count + delta] += stages
    assert_only(kernel.features, ptx_features(ptx), {"init_counts": +want})


def test_wrong_arrive_count_to_zero_fails_the_trace(kernel):
    # the full barrier's producer group is one thread: 1 - 1 arrivals is no barrier at all
    with pytest.raises(Exception, match="arrive count 1 \\+ -1 < 1"):
        kernel.faulted("wrong_arrive_count", {"delta": -1, "barrier": "full"})
    assert kernel.ptx() == kernel.clean


@pytest.mark.parametrize("drop", ["fence", "sync", "both"])
def test_missing_init_fence_drops_the_fence_and_or_the_cta_sync(kernel, drop):
    ptx, applied = kernel.faulted("missing_init_fence", {"drop": drop})
    sites_in_kernel(applied, kernel)
    clean = kernel.features
    changed: dict[str, object] = {}
    if drop in ("fence", "both"):
        changed["init_fences"] = 0
    if drop in ("sync", "both"):
        changed["syncs"] = clean["syncs"] - Counter({"bar.sync 0": 1})
    assert_only(clean, ptx_features(ptx), changed)


def _sync_key(text: str) -> str:
    """'bar.sync 1, 128' -> 'bar.sync 1'; 'bar.warp.sync -1' -> 'bar.warp.sync'."""
    return "bar.warp.sync" if text.startswith("bar.warp.sync") else text.split(",")[0]


def _site_key(site: dict) -> str:
    return "bar.warp.sync" if site["op"] == "sync_warp" else f"bar.sync {site['barrier_id']}"


@pytest.mark.parametrize("which", [0, -1])
def test_drop_sync_removes_the_traced_sync_calls(kernel, which):
    ptx, applied = kernel.faulted("drop_sync", {"which": which})
    sites_in_kernel(applied, kernel)
    clean = kernel.features
    f = ptx_features(ptx)
    removed = clean["syncs"] - f["syncs"]
    assert sorted(map(_sync_key, removed.elements())) == sorted(map(_site_key, applied.sites))
    # the barrier-init sync inside create() is not a kernel sync: it stays
    assert f["syncs"]["bar.sync 0"] == clean["syncs"]["bar.sync 0"] == 1
    assert_only(clean, f, {"syncs": clean["syncs"] - removed})


def test_a_fault_that_never_triggers_is_visible(kernel):
    # pick a drop_sync kind that the kernel does not use (tma_copy: no sync_warp;
    # tma_stream: no named barrier / sync_threads besides create()'s)
    kind = {"tma_copy": "warp", "tma_stream": "cta"}[kernel.key]
    ptx, applied = kernel.faulted("drop_sync", {"sync": kind})
    assert applied.count == 0 and ptx == kernel.clean
    note = applied.not_applied()
    assert note.startswith(f"fault drop_sync(sync={kind!r}, which=0) NOT APPLIED: 0 sites")
    assert "cute.arch.sync_warp" in note  # what it looked for
    with pytest.raises(faults.FaultNotTriggered, match="never triggered"):
        applied.require()
    with (
        pytest.raises(faults.FaultNotTriggered),
        faults.inject("drop_sync", {"sync": kind}, strict=True),
    ):
        kernel.ptx()
    assert kernel.ptx() == kernel.clean


def test_oob_store_switch_changes_the_kernel_through_its_param(kernel):
    params = faults.switch_params("oob_store", kernel.cls)
    assert params == {"oob_store": True}
    assert kernel.ptx(**params) != kernel.clean
    with faults.inject("oob_store", {}, kernel=kernel.cls) as applied:
        pass
    assert applied.kind == "switch" and applied.count == 1


def test_switch_not_declared_by_the_kernel_is_a_clear_error(kernel):
    with pytest.raises(FaultSpecError, match="does not declare this switch.*oob_store"):
        faults.switch_params("spin_hang", kernel.cls)
    with (
        pytest.raises(FaultSpecError, match="does not declare"),
        faults.inject("spin_hang", {}, kernel=kernel.cls),
    ):
        pass
    with pytest.raises(FaultSpecError, match="not a switch fault"):
        faults.switch_params("drop_sync", kernel.cls)


# ---- restoration -----------------------------------------------------------------------------


def _patchable_state(callables: bool = False) -> dict:
    """Every binding a patch may touch: cutlass module globals and pipeline class dicts.
    ``callables``: module globals that are functions or classes only (what patches replace;
    a trace also fills the DSL's own lazy globals, such as its package roots)."""
    import cutlass.pipeline as pl

    state = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("cutlass") and module is not None:
            for attr, value in list(vars(module).items()):
                if not callables or callable(value):
                    state[(name, attr)] = id(value)
    todo = [pl.PipelineAsync]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        for attr, value in vars(cls).items():
            state[(cls.__qualname__, attr)] = id(value)
    for attr, value in vars(pl.PipelineState).items():
        state[("PipelineState", attr)] = id(value)
    return state


PATCH_SPECS = [(n, {}) for n, f in FAULTS.items() if f.kind == "patch"]


@pytest.mark.parametrize(("name", "args"), PATCH_SPECS)
def test_exception_inside_the_context_restores_everything(name, args):
    import cutlass.pipeline  # noqa: F401  (the patches need it loaded)

    before = _patchable_state()
    with pytest.raises(KeyboardInterrupt), faults.inject(name, args) as applied:
        assert applied.patched, "nothing was patched"
        assert _patchable_state() != before
        raise KeyboardInterrupt
    after = _patchable_state()
    assert {k: after.get(k) for k in before} == before


def test_a_module_imported_inside_the_context_gets_the_original_back(tmp_path, monkeypatch):
    from cutlass import cute

    (tmp_path / "late_kernel_helpers.py").write_text("from cutlass.cute.arch import sync_threads\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    original = cute.arch.sync_threads
    with faults.inject("drop_sync", {}):
        import late_kernel_helpers

        assert late_kernel_helpers.sync_threads is not original
    assert late_kernel_helpers.sync_threads is original
    assert cute.arch.sync_threads is original


def test_nested_injections_restore_in_order(kernel):
    with faults.inject("wrong_expect_tx", {"delta_bytes": 16}):
        with faults.inject("wrong_expect_tx", {"delta_bytes": 32}) as inner:
            ptx = kernel.ptx()
        assert inner.count >= 1
    clean = kernel.features["expect_tx_bytes"]
    assert ptx_features(ptx)["expect_tx_bytes"] == sorted(b + 48 for b in clean)
    assert kernel.ptx() == kernel.clean


def test_a_pass_of_a_fault_at_zero_sites_says_not_applied_on_the_verdict_line():
    from cutedebug.engine.verdict import Outcome, Verdict, classify
    from cutedebug.event import Event

    note = faults.Applied("skip_producer_tail", {}).not_applied()
    assert "NOT APPLIED" in note and "PipelineAsync.producer_tail" in note
    assert faults.Applied(None, {}).not_applied() is None
    o = Outcome()
    for ev in (
        {"event": "compiled", "fault_count": 0, "fault_not_applied": note},
        {"event": "launched"},
        {"event": "synced"},
        {"event": "checked", "ok": True},
        {"event": "done"},
    ):
        o.add(ev)
    got = classify(o)
    assert got.verdict is Verdict.PASS
    assert got.reason == f"{note}; output matches the reference"
    o.events[0] = Event.from_json(
        {"event": "compiled", "fault_count": 2, "fault_not_applied": None}
    )
    assert classify(o).reason == "output matches the reference"
