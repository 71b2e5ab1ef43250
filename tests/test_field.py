"""The field kernels (scenarios/field): public CuTe DSL libraries, unmodified, behind adapters.

Without the libraries (`pip install 'cutedebug[field]'` not done) every field scenario still
loads and is skipped with the reason, never run and never failed; the worker says
UNSUPPORTED (never a kernel verdict) when a required module cannot be imported. With them,
each adapter compiles for sm_90a on CPU and the patch faults reach the library's own lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.trace_only import trace_only
from test_pytest_plugin import calls, clean_env, no_gpu, project, scenario_toml  # noqa: F401

from cutedebug.engine import scenario as S

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]
FIELD = REPO / "scenarios" / "field"
ADAPTERS = {
    "quack_gemm_sm90": ("quack_gemm_sm90.py", "QuackGemmSm90", "gemm_sm90.py"),
    "quack_rmsnorm_fwd": ("quack_rmsnorm.py", "QuackRMSNormFwd", "rmsnorm.py"),
    "quack_rmsnorm_bwd": ("quack_rmsnorm.py", "QuackRMSNormBwd", "rmsnorm.py"),
    "fa4_fwd_sm90": ("fa4_fwd_sm90.py", "FA4FwdSm90", "flash_fwd_sm90.py"),
    "quack_softmax": ("quack_softmax.py", "QuackSoftmax", "softmax.py"),
    "fa4_bwd_sm90": ("fa4_bwd_sm90.py", "FA4BwdSm90", "flash_bwd_sm90.py"),
    "quack_gemm_sm100": ("quack_gemm_sm100.py", "QuackGemmSm100", "gemm_sm100.py"),
    "fa4_fwd_sm100": ("fa4_fwd_sm100.py", "FA4FwdSm100", "flash_fwd_sm100.py"),
}
MODULES = {
    "quack_gemm_sm90": ["quack"],
    "quack_rmsnorm_fwd": ["quack"],
    "quack_rmsnorm_bwd": ["quack"],
    "fa4_fwd_sm90": ["flash_attn.cute"],
    "quack_softmax": ["quack"],
    "fa4_bwd_sm90": ["flash_attn.cute"],
    "quack_gemm_sm100": ["quack"],
    "fa4_fwd_sm100": ["flash_attn.cute"],
}
ARCHS = {"quack_gemm_sm100": ("sm_100a",), "fa4_fwd_sm100": ("sm_100a",)}  # others: sm_90a
# tools/field_fault_sites.py surveys these in test_fault_sites_land_on_the_library_lines; the
# kernels added later are checked by their own tests below (a compile each, not a survey)
SURVEYED = ("quack_gemm_sm90", "quack_rmsnorm_fwd", "quack_rmsnorm_bwd", "fa4_fwd_sm90")


def field_scenarios() -> list[Path]:
    return sorted(FIELD.rglob("*.toml"))


def test_every_field_scenario_loads_and_names_its_library():
    files = field_scenarios()
    assert {p.parent.name for p in files} == set(ADAPTERS)
    for path in files:
        sc = S.load(path)
        family = path.parent.name
        file, entry, _ = ADAPTERS[family]
        assert sc.id == f"field/{family}/{path.stem}"
        assert (Path(sc.kernel_file).name, sc.kernel_entry) == (file, entry)
        assert list(sc.modules) == MODULES[family], path
        assert sc.archs == ARCHS.get(family, ("sm_90a",))
    clean = [p for p in files if p.stem == "clean"]
    assert len(clean) == len(ADAPTERS)


def test_requires_modules_is_validated(tmp_path):
    bad = scenario_toml(
        "fam/x",
        "PASS",
        extra='[requires]\nmodules = ["quack-kernels"]\n',
        kernel=str(REPO / "kernels" / "minimal.py"),
    ).replace('"K"', '"Minimal"')
    path = tmp_path / "x.toml"
    path.write_text(bad)
    with pytest.raises(
        S.ScenarioError,
        match=r"requires\.modules: 'quack-kernels' is not a "
        r"Python module name",
    ):
        S.load(path)
    path.write_text(bad.replace("quack-kernels", "quack"))
    assert S.load(path).modules == ("quack",)


def test_missing_modules_found_without_importing():
    sc = S.Scenario(
        id="x",
        kernel_file="",
        kernel_entry="",
        modules=("json", "no_such_module_cutedebug", "os.path", "json.nope"),
    )
    assert sc.missing_modules() == ["no_such_module_cutedebug", "json.nope"]
    assert S.Scenario.from_json(sc.to_json()).modules == sc.modules


def test_worker_says_unsupported_when_a_required_module_is_missing(tmp_path):
    from cutedebug.engine import runner

    sc = S.adhoc(f"{REPO / 'kernels' / 'minimal.py'}:Minimal", {"n": 256}, None, {}, "PASS")
    sc = sc.with_overrides(modules=("no_such_module_cutedebug",))
    res = runner.run_scenario(sc, runs_root=tmp_path, mode="compile")
    assert res.verdict.value == "UNSUPPORTED"
    assert res.reason.startswith(
        "needs the Python module 'no_such_module_cutedebug' "
        "(scenario requires.modules), not importable here: "
        "ModuleNotFoundError"
    )
    assert res.outcome.event("compiled") is None  # nothing was compiled, nothing was run


def test_plugin_skips_scenarios_whose_modules_are_missing(pytester, no_gpu):  # noqa: F811
    needs = '[requires]\nmodules = ["no_such_module_cutedebug"]\n'
    project(
        pytester,
        {
            "lib": scenario_toml("fam/lib", "PASS", extra=needs),
            "plain": scenario_toml("fam/plain", "PASS"),
        },
        {},
    )
    res = pytester.runpytest("-rs", "--cutedebug-compile-jobs=2")
    res.assert_outcomes(passed=1, skipped=3)
    skipped = [ln for ln in res.outlines if ln.startswith("SKIPPED [2]")]
    assert len(skipped) == 1 and skipped[0].endswith(
        "needs the Python module(s) no_such_module_cutedebug (scenario requires.modules); "
        "not installed here"
    )
    # the engine never ran for the skipped scenario, compile prefetch included
    assert [c["id"] for c in calls(pytester)] == ["fam/plain"]


# ---- with the libraries installed --------------------------------------------------------
def _libraries_missing() -> str | None:
    sc = S.Scenario(
        id="x", kernel_file="", kernel_entry="", modules=("quack", "flash_attn.cute", "triton")
    )
    missing = sc.missing_modules()
    return f"field libraries not installed: {missing}" if missing else None


needs_libs = pytest.mark.skipif(_libraries_missing() is not None, reason=_libraries_missing() or "")


def _fault_sites_tool():
    """tools/field_fault_sites.py as a module (tools/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "field_fault_sites", REPO / "tools" / "field_fault_sites.py"
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_fault_sites_command_line_writes_the_survey(tmp_path):
    """The tool's command line (--json, --only, --trace-only) on a project kernel, in a process
    of its own that imports the DSL alone: the wrong_expect_tx variants land on the kernel's
    one expect_tx (its producer_acquire call), and the clean trace has no static error."""
    kernel = REPO / "kernels" / "tma_stream.py"
    out = tmp_path / "sites.json"
    env = dict(
        os.environ,
        CUTE_DSL_ARCH="sm_90a",
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "field_fault_sites.py"),
            "--json",
            str(out),
            "--trace-only",
            "--only=wrong_expect_tx",
            f"{kernel}:TmaStream",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (rec,) = json.loads(out.read_text())
    assert rec["target"] == f"{kernel}:TmaStream" and rec["arch"] == "sm_90a"
    assert [f["fault"] for f in rec["faults"]] == ["wrong_expect_tx", "wrong_expect_tx"]
    assert [f["args"] for f in rec["faults"]] == [{"delta_bytes": 16}, {"delta_bytes": -16}]
    line = next(
        i
        for i, text in enumerate(kernel.read_text().splitlines(), 1)
        if "producer_acquire(" in text
    )
    for f in rec["faults"]:
        assert f["count"] == 1
        assert f["sites"] == {f"mbarrier_arrive_and_expect_tx tma_stream.py:{line}": 1}
    assert [x for x in rec["clean"]["static_findings"] if x["severity"] == "error"] == []
    assert "wrong_expect_tx{'delta_bytes': 16}: 1 site(s)" in proc.stdout


@needs_libs
@pytest.mark.slow  # the longest item of the not-slow part (16.3 s of a worker, 2026-12-03)
def test_fault_sites_land_on_the_library_lines():
    """tools/field_fault_sites.py's survey of each adapter, once per fault (sm_90a, no GPU), in
    this process, which imports the libraries for the tests below anyway (its command line:
    the test above); trace only: the sites and findings asserted here are trace facts, and the
    field scenarios' compile items lower these faults to PTX."""
    tool = _fault_sites_tool()
    only = ("wrong_expect_tx", "skip_consumer_release", "skip_producer_tail")
    with trace_only():
        results = [
            tool.survey(f"{FIELD / ADAPTERS[n][0]}:{ADAPTERS[n][1]}", "sm_90a", only)
            for n in SURVEYED
        ]
    survey = {  # as --json writes it
        Path(r["target"].split(":")[0]).name + ":" + r["target"].split(":")[1]: r
        for r in json.loads(json.dumps(results, default=str))
    }

    def sites(family, fault, **args):
        file, entry, _ = ADAPTERS[family]
        rec = next(
            f
            for f in survey[f"{file}:{entry}"]["faults"]
            if f["fault"] == fault and all(f["args"].get(k) == v for k, v in args.items())
        )
        return rec["sites"]

    # every site is a line of the library's own files, none of the adapter's
    for rec in survey.values():
        for f in rec["faults"]:
            for where in f.get("sites", {}):
                assert not where.split()[1].startswith(("quack_", "fa4_")), (rec["target"], f)
    assert sites("quack_gemm_sm90", "wrong_expect_tx", delta_bytes=16) == {
        "mbarrier_arrive_and_expect_tx gemm_base.py:1026": 1
    }
    assert set(sites("quack_gemm_sm90", "skip_consumer_release")) >= {
        "consumer_release gemm_sm90.py:1659",
        "consumer_release gemm_sm90.py:1672",
    }
    assert sites("quack_rmsnorm_fwd", "wrong_expect_tx", delta_bytes=16) == {
        "mbarrier_arrive_and_expect_tx rmsnorm.py:315": 1
    }
    assert sites("quack_rmsnorm_bwd", "skip_consumer_release") == {
        "consumer_release rmsnorm.py:1111": 1
    }
    assert sites("fa4_fwd_sm90", "skip_producer_tail") == {"producer_tail flash_fwd_sm90.py:919": 1}
    # no static error on the clean kernels (FA-4's sequential reuse of named barrier 1 with
    # 256 and 288 threads is legal; quack's no-op producer_commit of PipelineStasAsync, which
    # the backward never calls, is not paired)
    for family in SURVEYED:
        file, entry, _ = ADAPTERS[family]
        findings = survey[f"{file}:{entry}"]["clean"]["static_findings"]
        errors = [f for f in findings if f["severity"] == "error"]
        assert errors == [], family
    noop = [
        f
        for f in survey["quack_rmsnorm.py:QuackRMSNormBwd"]["clean"]["static_findings"]
        if f["check"] == "commit_pairing"
    ]
    assert [f["severity"] for f in noop] == ["info"]
    assert (
        "producer_commit of PipelineStasAsync is a no-op method (pipeline.py:477)"
        in (noop[0]["message"])
    )


@needs_libs
def test_adapter_references_agree_with_torch_autograd_and_math():
    """The adapters' references (what every run is checked against), on small CPU problems,
    against independent torch computations: autograd through F.rms_norm, explicit softmax."""
    import math

    import torch

    from cutedebug import kernel_api

    def entry(name):
        file, cls, _ = ADAPTERS[name]
        return kernel_api.load_entry(FIELD / file, cls)

    fwd = entry("quack_rmsnorm_fwd")(rows=8, n=1024)
    t = fwd.make_inputs("cpu")
    want = torch.nn.functional.rms_norm(t["x"].float(), (1024,), t["w"].float(), eps=1e-6)
    torch.testing.assert_close(fwd.reference(t), want)

    bwd = entry("quack_rmsnorm_bwd")(rows=8, n=1024, blocks=2)
    t = bwd.make_inputs("cpu")
    x, w = (t[k].float().requires_grad_() for k in ("x", "w"))
    torch.nn.functional.rms_norm(x, (1024,), w, eps=1e-6).backward(t["dout"].float())
    ref = bwd.reference(t)
    torch.testing.assert_close(ref[: 8 * 1024].view(8, 1024), x.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref[8 * 1024 :] * 8, w.grad, atol=1e-4, rtol=1e-5)

    attn = entry("fa4_fwd_sm90")(batch=1, heads=2, seqlen=64, head_dim=64)
    t = attn.make_inputs("cpu")
    q, k, v = (t[n].float().transpose(1, 2) for n in ("q", "k", "v"))
    want = ((q @ k.transpose(-1, -2)) / math.sqrt(64)).softmax(-1) @ v
    torch.testing.assert_close(
        attn.reference(t).float(), want.transpose(1, 2), atol=2e-2, rtol=2e-2
    )

    gemm = entry("quack_gemm_sm90")(m=64, n=32, k=128)
    t = gemm.make_inputs("cpu")
    want = torch.einsum("mk,nk->mn", t["a"].double(), t["b"].double())
    torch.testing.assert_close(gemm.reference(t).double(), want, atol=1e-3, rtol=1e-5)


def _compile(family: str, fault: str | None = None, args: dict | None = None, **params):
    """One in-process compile of an adapter for sm_90a (fake tensors): (PTX, Applied)."""
    import tempfile

    import cutlass.cute as cute
    from cutlass.base_dsl.compiler import DumpDir

    from cutedebug import kernel_api
    from cutedebug.instrument import faults

    file, entry, _ = ADAPTERS[family]
    kernel = kernel_api.load_entry(FIELD / file, entry)(**params)
    with faults.inject(fault, args or {}) as applied:
        compiled = cute.compile[
            cute.GPUArch("sm_90a"), cute.KeepPTX(), DumpDir(tempfile.gettempdir())
        ](kernel, *kernel.fake_args())
    return compiled.__ptx__, applied


def _parities(ptx: str) -> list[str]:
    """The parity operand of every mbarrier try_wait, in PTX order."""
    return [
        line.split(",")[2].strip()
        for line in ptx.splitlines()
        if "mbarrier.try_wait.parity" in line
    ]


@needs_libs
def test_rmsnorm_backward_consumer_phase_flip_freezes_the_raw_wait():
    """quack reads cons_state_reduce.phase itself (rmsnorm.py:1101) for the raw mbarrier wait
    in cluster_reduce: the fault freezes that parity at 0 (it applied at 0 sites before)."""
    clean, _ = _compile("quack_rmsnorm_bwd")
    ptx, applied = _compile("quack_rmsnorm_bwd", "missing_phase_flip", {"role": "consumer"})
    (site,) = applied.sites
    assert (Path(site["file"]).name, site["line"]) == ("rmsnorm.py", 1152)
    assert "its phase read by the kernel at rmsnorm.py:1101" in site["detail"]
    before, after = _parities(clean), _parities(ptx)
    assert len(before) == len(after) == 4
    assert before[1].startswith("%r") and after[1] == "0"  # the reduction's raw wait
    assert [p.startswith("%r") for i, p in enumerate(after) if i != 1] == [True] * 3


@needs_libs
def test_advance_iters_of_quack_pingpong_gemm_loses_the_flip():
    """Pingpong GEMM: each consumer warpgroup skips the other's steps with
    PipelineStateWAdvance.advance_iters (gemm_sm90.py, and the tile scheduler's)."""
    clean, _ = _compile("quack_gemm_sm90", tile_m=64, pingpong=True)
    ptx, applied = _compile(
        "quack_gemm_sm90", "missing_phase_flip", {"role": "consumer"}, tile_m=64, pingpong=True
    )
    where = {(Path(s["file"]).name, s["line"], s.get("via")) for s in applied.sites}
    assert {
        ("gemm_sm90.py", 1261, None),  # ab_read_state.advance_iters(k_tile_cnt_static)
        ("gemm_sm90.py", 1459, None),
        ("gemm_sm90.py", 1460, "tile_scheduler.py:980"),  # advance_to_next_work(advance_count=2)
    } <= where
    assert ptx != clean


# The probe site of every wait of the clean kernels (sm_90a, fake tensors): the library
# kernel's call line, the library helper's line as ``via``. (op, barrier, pipeline, where, via)
WAIT_SITES = {
    "quack_gemm_sm90": [
        ("producer_acquire", "empty", 0, "gemm_base.py:1026", ""),
        ("producer_acquire", "empty", 1, "gemm_sm90.py:1167", "tile_scheduler.py:923"),
        ("consumer_wait", "full", 1, "gemm_sm90.py:1168", "tile_scheduler.py:679"),
        ("producer_tail", "empty", 0, "gemm_sm90.py:1176", ""),
        ("producer_tail", "empty", 1, "gemm_sm90.py:1178", "tile_scheduler.py:1009"),
        ("consumer_wait", "full", 0, "gemm_sm90.py:1632", ""),
        ("consumer_wait", "full", 0, "gemm_sm90.py:1648", ""),
        # gemm_sm90.py:1452 advance_to_next_work(): its producer_acquire is under `if
        # is_scheduler_warp` with the Python False of that call, a dead branch (no site)
        ("consumer_wait", "full", 1, "gemm_sm90.py:1453", "tile_scheduler.py:679"),
    ],
    "fa4_fwd_sm90": [
        ("producer_acquire", "empty", 1, "flash_fwd_sm90.py:791", ""),
        ("producer_acquire", "empty", 0, "flash_fwd_sm90.py:797", "pipeline.py:134"),
        ("producer_acquire", "empty", 1, "flash_fwd_sm90.py:854", ""),
        ("producer_acquire", "empty", 2, "flash_fwd_sm90.py:860", ""),
        ("producer_acquire", "empty", 2, "flash_fwd_sm90.py:872", ""),
        ("producer_tail", "empty", 2, "flash_fwd_sm90.py:919", ""),
        ("consumer_wait", "full", 0, "flash_fwd_sm90.py:1104", "pipeline.py:152"),
        ("consumer_wait", "full", 1, "flash_fwd_sm90.py:1295", ""),
        ("consumer_wait", "full", 1, "flash_fwd_sm90.py:1438", ""),
        ("consumer_wait", "full", 2, "flash_fwd_sm90.py:1445", ""),
        ("consumer_wait", "full", 2, "flash_fwd_sm90.py:1349", ""),
    ],
}


@needs_libs
@pytest.mark.parametrize("family", sorted(WAIT_SITES))
def test_probe_sites_are_the_library_kernel_call_lines(family):
    """quack's tile scheduler waits inside its own get_current_work (tile_scheduler.py:679,
    what exec reported before the layer): the site is the kernel's call of the helper in
    gemm_sm90.py, the helper's line kept as via; FA-4's _w_index_phase wrappers likewise."""
    import tempfile

    import cutlass.cute as cute
    from cutlass.base_dsl.compiler import DumpDir

    from cutedebug import kernel_api
    from cutedebug.instrument import probes

    file, entry, _ = ADAPTERS[family]
    kernel = kernel_api.load_entry(FIELD / file, entry)()

    with (
        trace_only(),
        probes.instrument(
            probes.ProbeConfig(), allocate=probes.pinned_allocator(runnable=False)
        ) as table,
    ):
        cute.compile[cute.GPUArch("sm_90a"), DumpDir(tempfile.gettempdir())](
            kernel, *kernel.fake_args()
        )
    got = [(s.op, s.barrier, s.pipeline_index, s.where, s.via) for s in table.sites]
    assert got == WAIT_SITES[family]


def _traced(family: str, fault: str | None = None, args: dict | None = None, arch="sm_90a"):
    """One in-process trace of an adapter for sm_90a under the lint recorder, a fault and
    the probes (as the worker does; trace only, helpers/trace_only.py: all three are trace
    facts): (static findings, Applied, probe sites)."""
    import tempfile

    import cutlass.cute as cute
    from cutlass.base_dsl.compiler import DumpDir

    from cutedebug import kernel_api
    from cutedebug.analyses import lint
    from cutedebug.instrument import faults, probes

    file, entry, _ = ADAPTERS[family]
    kernel = kernel_api.load_entry(FIELD / file, entry)()

    with (
        trace_only(),
        lint.record() as protocol,
        faults.inject(fault, args or {}) as applied,
        probes.instrument(
            probes.ProbeConfig(), allocate=probes.pinned_allocator(runnable=False)
        ) as table,
    ):
        cute.compile[cute.GPUArch(arch), DumpDir(tempfile.gettempdir())](
            kernel, *kernel.fake_args()
        )
    return lint.static_findings(protocol), applied, table


def _line(module_file: str, needle: str, start: int = 0) -> int:
    """The first line at or after ``start`` of an installed library file holding ``needle``."""
    import importlib.util

    package, _, name = module_file.rpartition("/")
    spec = importlib.util.find_spec(f"{package}.{name.removesuffix('.py')}")
    lines = Path(spec.origin).read_text().splitlines()
    return next(i for i, t in enumerate(lines, 1) if i >= start and needle in t)


@needs_libs
def test_softmax_two_reductions_through_one_helper_are_two_kernel_sites():
    """quack's two-pass softmax makes two cluster round trips through the same helper
    (row_reduce -> cluster_reduce, reduce.py): each raw wait and each expect_tx is the
    kernel's call line in softmax.py (row max, then sum), the helper's line as via. Before,
    both were reduce.py:151 / reduce.py:142: one place for two barriers."""
    findings, applied, table = _traced("quack_softmax", "wrong_expect_tx", {"delta_bytes": 16})
    first = _line("quack/softmax.py", "max_x = row_reduce(")
    second = _line("quack/softmax.py", "denom = row_reduce(", first)
    wait = _line("quack/reduce.py", "cute.arch.mbarrier_wait(mbar_ptr, phase=")
    arm = _line("quack/reduce.py", "cute.arch.mbarrier_arrive_and_expect_tx(mbar_ptr, tx_bytes)")
    raw = [(s.where, s.via, s.role) for s in table.sites if s.op == "raw_wait"]
    assert raw == [
        (f"softmax.py:{first}", f"reduce.py:{wait}", "consumer"),
        (f"softmax.py:{second}", f"reduce.py:{wait}", "consumer"),
    ]
    got = [(Path(s["file"]).name, s["line"], s.get("via")) for s in applied.sites]
    assert got == [
        ("softmax.py", first, f"reduce.py:{arm}"),
        ("softmax.py", second, f"reduce.py:{arm}"),
    ]
    # the raw waits' diagnosis names who arms them: the kernel's two lines, not the helper's
    arms = [(s.where, s.via) for s in table.raw_ops if "expect_tx" in s.op]
    assert arms == [
        (f"softmax.py:{first}", f"reduce.py:{arm}"),
        (f"softmax.py:{second}", f"reduce.py:{arm}"),
    ]
    assert [f for f in findings if f["severity"] == "error"] == []


@needs_libs
def test_fa4_backward_bulk_copies_count_toward_expect_tx():
    """FA-4's SM90 backward loads each query block's LSE (and dPsum) with a plain bulk copy
    (CopyBulkG2SOp, quack's copy_utils) onto the same full barrier as the TMA tile: the clean
    kernel has no expect_tx error (4 false errors before), the faulted one an error per
    producer_acquire whose arithmetic names the 512 B row-statistic copy."""
    clean, _, _ = _traced("fa4_bwd_sm90")
    assert [f["check"] for f in clean if f["severity"] == "error"] == []
    assert sorted(f["check"] for f in clean if f["severity"] == "warning") == [
        "producer_tail",
        "producer_tail",
    ]  # true: FA-4's backward never drains its Q / dO pipelines (single CTA: benign)
    faulted, applied, _ = _traced("fa4_bwd_sm90", "wrong_expect_tx", {"delta_bytes": 16})
    errors = [f for f in faulted if f["severity"] == "error"]
    assert [f["check"] for f in errors] == ["expect_tx"] * 4
    assert {(Path(f["file"]).name, f["line"]) for f in errors} == {
        ("flash_bwd_sm90.py", s["line"]) for s in applied.sites
    }
    assert all("512" in f["arithmetic"] for f in errors)
    assert any(
        "expect_tx 16912 B per stage, TMA copies deliver 16896 B" in f["message"] for f in errors
    )


@needs_libs
def test_quack_sm100_gemm_static_ifs_and_the_clc_armed_scheduler():
    """quack's SM100 GEMM (sm_100a, compiled on the CPU): the epilogue releases the
    accumulator inside a static `if` of its loop over 8 subtiles, and the scheduler warp arms
    its pipeline's full barrier with arrive.expect_tx for the CLC response instead of a
    commit. Before: 8 "performed twice" release errors and a commit_pairing error on the
    clean kernel; skip_consumer_release counted 8 sites at the one release line."""
    findings, _, table = _traced("quack_gemm_sm100", arch="sm_100a")
    assert [f for f in findings if f["severity"] in ("error", "warning")] == []
    # the scheduler's producer path runs in the scheduler warp only: the other warps' copies
    # of it (advance_to_next_work with a static is_scheduler_warp=False) are no probe site
    clc = [s.where for s in table.sites if s.op == "producer_acquire" and s.pipeline_index == 2]
    assert clc == [
        f"gemm_sm100.py:{_line('quack/gemm_sm100.py', 'tile_scheduler.advance_to_next_work(is_scheduler_warp=is_scheduler_warp)')}"
    ]
    (clc,) = [f for f in findings if f["check"] == "commit_pairing"]
    assert clc["severity"] == "info" and "arrive.expect_tx at gemm_sm100.py:" in clc["message"]
    _, applied, _ = _traced("quack_gemm_sm100", "skip_consumer_release", arch="sm_100a")
    release = _line("quack/gemm_sm100.py", "acc_pipeline.consumer_release(acc_consumer_state)")
    lines = [(Path(s["file"]).name, s["line"]) for s in applied.sites]
    assert lines.count(("gemm_sm100.py", release)) == 1
    assert any("never takes: not counted" in n for n in applied.notes)


@needs_libs
def test_fa4_sm100_forward_idioms_are_not_errors():
    """FA-4's SM100 forward (sm_100a, 2-CTA MMA): a statistics pipeline used only as a credit
    counter (never committed nor waited on), drains written as a final producer_acquire
    ("equivalent to producer_tail"), releases of each stage in a loop unrolled over the
    stages, CTA-local pipelines in a clustered launch, and a 2-CTA pipeline kept safe by the
    TMEM-dealloc handshake instead of producer_tail. Before: 11 errors on the clean kernel."""
    findings, _, _ = _traced("fa4_fwd_sm100", arch="sm_100a")
    assert [f for f in findings if f["severity"] == "error"] == []
    by = {(f["check"], f["severity"]): [] for f in findings}
    for f in findings:
        by[(f["check"], f["severity"])].append(f)
    assert any(
        "is used as a credit counter" in f["message"] for f in by[("release_pairing", "info")]
    )
    drains = [f for f in by[("producer_tail", "info")] if "is drained by its final" in f["message"]]
    assert len(drains) == 3  # Q (TMA), softmax statistics, correction -> epilogue
    (handshake,) = [
        f for f in by.get(("producer_tail", "warning"), []) if "cluster handshake" in f["message"]
    ]
    assert "PipelineUmmaAsync" in handshake["pipeline"]
    # no release is "performed twice": the unrolled loops name their stages
    assert not any("performed twice" in f["message"] for f in findings)
