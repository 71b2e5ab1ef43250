"""Static protocol checks (cutedebug/lint.py) on real pipeline kernels, CPU only.

Every fault whose effect is static is injected into kernels/tma_stream.py and
tests/pipeline_kernels/tma_copy.py; the lint must report it with the check it belongs to and
the arithmetic of the kernel (tx bytes, arrive counts taken from the kernels' docstrings),
and report nothing at warning/error level on the clean kernels.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.trace_only import trace_only

from cutedebug.analyses import lint
from cutedebug.analyses.lint import Event, Finding, PipelineRecord, Protocol

ROOT = Path(__file__).resolve().parents[1]
STREAM = ("kernels/tma_stream.py", "TmaStream", {"m": 4096, "n": 512, "ctas": 4})
COPY = ("tests/pipeline_kernels/tma_copy.py", "TmaCopy", {})
MINIMAL = ("kernels/minimal.py", "Minimal", {})
KERNELS = {"tma_stream": STREAM, "tma_copy": COPY}
# Per-stage tx bytes and empty arrive counts, from the kernels' docstrings.
TX = {"tma_stream": 32 * 256 * 4 + 32 * 4 + 32 * 4, "tma_copy": 64 * 64 * 4}
EMPTY = {"tma_stream": 4, "tma_copy": 4}


def run(kernel, fault=None, args=None, **params):
    file, entry, base = kernel
    sc = {
        "kernel": {"file": str(ROOT / file), "entry": entry},
        "params": {**base, **params},
        "fault": fault,
        "fault_args": args or {},
        "archs": ["sm_90a"],
    }
    with trace_only():  # protocol and findings are trace facts (helpers/trace_only.py)
        res = lint.compile_and_check(sc)
    return [Finding.from_json(f) for f in res["findings"]], res["protocol"]


def serious(findings):
    return [f for f in findings if f.severity in ("error", "warning")]


def only(findings, check, severity="error"):
    hits = [f for f in findings if f.check == check and f.severity == severity]
    others = [f for f in serious(findings) if f not in hits]
    assert hits, f"no {severity} {check} finding in {findings}"
    assert not others, f"unexpected findings besides {check}: {others}"
    return hits


# ---- clean kernels: nothing at warning/error level --------------------------------------------


@pytest.mark.parametrize(
    "kernel,params",
    [
        (MINIMAL, {}),
        (COPY, {}),
        (STREAM, {"dtype": "fp32", "stages": 2}),
        (STREAM, {"dtype": "fp32", "stages": 4}),
        (STREAM, {"dtype": "bf16", "stages": 2}),
        (STREAM, {"dtype": "bf16", "stages": 4}),
    ],
    ids=[
        "minimal",
        "tma_copy",
        "stream-fp32-s2",
        "stream-fp32-s4",
        "stream-bf16-s2",
        "stream-bf16-s4",
    ],
)
def test_clean_kernels_have_no_findings(kernel, params):
    findings, proto = run(kernel, **params)
    assert serious(findings) == []
    if kernel is STREAM:
        (rec,) = proto["pipelines"].values()
        elem = 4 if params["dtype"] == "fp32" else 2
        assert (rec["cls"], rec["stages"], rec["tx_count"]) == (
            "PipelineTmaAsync",
            params["stages"],
            32 * 256 * elem + 256,
        )
        assert (rec["full_init"], rec["empty_init"]) == (1, 4)
        assert proto["launch"]["block"] == [160, 1, 1]
        copies = [e["detail"] for e in proto["events"] if e["kind"] == "tma_copy"]
        assert [c["bytes"] for c in copies] == [32 * 256 * elem, 128, 128]


def test_protocol_of_tma_copy_records_roles_sites_and_named_barrier():
    findings, proto = run(COPY)
    kinds = [(e["kind"], e["line"]) for e in proto["events"]]
    src = (ROOT / COPY[0]).read_text().splitlines()

    def line_of(text):
        return next(i + 1 for i, s in enumerate(src) if text in s)

    assert ("producer_acquire", line_of("pipe.producer_acquire(state)")) in kinds
    assert ("consumer_wait", line_of("pipe.consumer_wait(state)")) in kinds
    assert ("consumer_release", line_of("pipe.consumer_release(state)")) in kinds
    assert ("producer_tail", line_of("pipe.producer_tail(state)")) in kinds
    (bar,) = [e for e in proto["events"] if e["kind"] == "named_barrier_sync"]
    assert (bar["detail"]["barrier_id"], bar["detail"]["threads"]) == (1, 128)
    # Info only: lane 0 of each warp releases with no __syncwarp after the per-thread reads.
    assert [f.check for f in findings] == ["warp_release"]


# ---- faults with a static effect ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("delta", [16, -16])
def test_wrong_expect_tx_states_the_arithmetic(name, delta):
    findings, _ = run(KERNELS[name], "wrong_expect_tx", {"delta_bytes": delta})
    (f,) = only(findings, "expect_tx")
    tx = TX[name]
    assert f"expect_tx {tx + delta} B per stage, TMA copies deliver {tx} B" in f.message
    assert f"declared tx_count {tx}" in f.arithmetic
    assert ("never completes" in f.message) == (delta > 0)
    assert Path(f.file).name == Path(KERNELS[name][0]).name and f.line


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("barrier,delta", [("empty", 1), ("empty", -1), ("full", 1)])
def test_wrong_arrive_count(name, barrier, delta):
    findings, _ = run(KERNELS[name], "wrong_arrive_count", {"barrier": barrier, "delta": delta})
    hits = [f for f in findings if f.check == "arrive_count" and f.severity == "error"]
    assert len(hits) == 1, findings
    want = EMPTY[name] if barrier == "empty" else 1
    assert hits[0].message.startswith(f"{barrier} barriers of PipelineTmaAsync#0@")
    assert f"mbarrier.init count {want + delta} != " in hits[0].arithmetic
    assert f"= {want}" in hits[0].arithmetic
    # full + 1 also leaves two expect_tx arrivals expected from one acquire site (a warning)
    assert {f.check for f in serious(findings)} == {"arrive_count"}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_skip_producer_tail_is_a_warning_in_a_single_cta(name):
    findings, _ = run(KERNELS[name], "skip_producer_tail")
    (f,) = only(findings, "producer_tail", "warning")
    assert "no producer_tail" in f.message and "cluster size 1" in f.arithmetic


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("at", [0, 2])
def test_skip_consumer_release_at_an_iteration_is_a_conditional_release(name, at):
    findings, _ = run(KERNELS[name], "skip_consumer_release", {"at_iteration": at})
    (f,) = only(findings, "release_pairing")
    assert "under a run-time condition" in f.message and "never released" in f.message
    # the condition is the fault's, named as such: not a line of cutedebug's own fault code
    assert "(if@injected-fault)" in f.message and "fault_patches" not in f.message + f.arithmetic


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_skip_every_consumer_release_leaves_the_wait_unpaired(name):
    findings, _ = run(KERNELS[name], "skip_consumer_release", {"at_iteration": -1})
    (f,) = only(findings, "release_pairing")
    assert "has no consumer_release" in f.message
    assert f.arithmetic == "1 consumer_wait call(s), 0 consumer_release call(s)"


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("at", [0, -1])
def test_extra_consumer_release(name, at):
    findings, _ = run(KERNELS[name], "extra_consumer_release", {"at_iteration": at})
    hits = only(findings, "release_pairing")
    assert any("released twice" in f.message or "performed twice" in f.message for f in hits)


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize(
    "drop,checks",
    [("fence", {"init_fence"}), ("sync", {"init_sync"}), ("both", {"init_fence", "init_sync"})],
)
def test_missing_init_fence(name, drop, checks):
    findings, _ = run(KERNELS[name], "missing_init_fence", {"drop": drop})
    assert {f.check for f in serious(findings)} == checks
    assert all(f.severity == "error" for f in serious(findings))  # TMA: async proxy


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("role", ["producer", "consumer"])
def test_missing_phase_flip_by_a_shadow_advance(name, role):
    findings, _ = run(KERNELS[name], "missing_phase_flip", {"role": role})
    (f,) = only(findings, "phase_flip")
    # the kernel's own PipelineState lost the flip in its advance (the role's states only)
    assert f.message.startswith(f"{role} pipeline state PipelineState does not flip")
    start = 1 if role == "producer" else 0
    assert (
        f"from (index 0, phase {start}) gave (index 0, phase {start}), expected "
        f"(index 0, phase {1 - start})"
    ) in f.arithmetic


def test_drop_sync_before_a_single_lane_release_is_reported_as_info():
    clean, _ = run(STREAM)
    dropped, _ = run(STREAM, "drop_sync", {"which": 0})
    assert [f.check for f in clean] == []
    assert [(f.severity, f.check) for f in dropped] == [("info", "warp_release")]


def test_drop_sync_of_the_init_sync_in_a_raw_mbarrier_kernel():
    findings, _ = run(MINIMAL, "drop_sync", {"which": 0})
    (f,) = only(findings, "init_sync")
    assert "mbarrier.init at minimal.py" in f.message


def test_patches_are_restored():
    import cutlass.cute as cute
    import cutlass.cutlass_dsl as cdsl
    from cutlass import pipeline as pl

    before = (
        cute.copy,
        cute.arch.mbarrier_init,
        cute.arch.sync_threads,
        cdsl.if_generate,
        vars(pl.PipelineTmaAsync)["consumer_release"],
        vars(pl.MbarrierArray)["arrive"],
    )
    with pytest.raises(RuntimeError), lint.record():
        raise RuntimeError("boom")
    after = (
        cute.copy,
        cute.arch.mbarrier_init,
        cute.arch.sync_threads,
        cdsl.if_generate,
        vars(pl.PipelineTmaAsync)["consumer_release"],
        vars(pl.MbarrierArray)["arrive"],
    )
    assert before == after


def test_recording_changes_neither_the_ptx_nor_the_fault_sites(monkeypatch):
    import cutlass.cute as cute

    from cutedebug import kernel_api
    from cutedebug.instrument import faults

    monkeypatch.setenv("CUTE_DSL_LINEINFO", "1")  # locs must not point into lint.py
    kernel = kernel_api.load_entry(str(ROOT / COPY[0]), COPY[1])()

    def ptx():
        return cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](
            kernel, *kernel.fake_args()
        ).__ptx__

    plain = ptx()
    with lint.record():
        recorded = ptx()
    assert recorded == plain
    with trace_only(), lint.record(), faults.inject("wrong_expect_tx", {}) as applied:
        cute.compile[cute.GPUArch("sm_90a")](kernel, *kernel.fake_args())
    assert {(Path(s["file"]).name, s["op"]) for s in applied.sites} == {
        ("tma_copy.py", "mbarrier_arrive_and_expect_tx")
    }


# ---- checks on synthetic protocols (no compile) -------------------------------------------------


def _ev(seq, kind, **detail):
    return Event(seq, kind, None, "/k.py", 10 + seq, "kernel", (), detail)


def test_named_barrier_counts():
    proto = Protocol(launch={"block": (256, 1, 1)})
    proto.events = [
        _ev(0, "named_barrier_sync", barrier_id=1, threads=128, all_threads=False),
        _ev(1, "named_barrier_sync", barrier_id=1, threads=96, all_threads=False),
        _ev(2, "named_barrier_sync", barrier_id=2, threads=320, all_threads=False),
        _ev(3, "named_barrier_arrive", barrier_id=3, threads=40, all_threads=False),
    ]
    found = [f for f in lint.check(proto) if f.check == "named_barrier"]
    msgs = [f.message for f in found]
    # bar.sync alone, 128 then 96 threads on one path: sequential reuse, legal
    (reuse,) = [f for f in found if "id 1 is reused" in f.message]
    assert reuse.severity == "info" and "counts ['128', '96']" in reuse.message
    assert any("waits for 320 threads, the CTA has 256" in m for m in msgs)
    assert any("counts 40 threads" in m for m in msgs)


def test_named_barrier_arrive_whose_count_no_sync_shares_is_an_error():
    proto = Protocol(launch={"block": (384, 1, 1)})
    proto.events = [
        _ev(0, "named_barrier_arrive", barrier_id=4, threads=288, all_threads=False),
        _ev(1, "named_barrier_sync", barrier_id=4, threads=256, all_threads=False),
        # id 5: arrive 128 pairs with a sync of 128; the later sync of 256 is another phase
        _ev(2, "named_barrier_arrive", barrier_id=5, threads=128, all_threads=False),
        _ev(3, "named_barrier_sync", barrier_id=5, threads=128, all_threads=False),
        _ev(4, "named_barrier_sync", barrier_id=5, threads=256, all_threads=False),
    ]
    found = {f.message.split(" at ")[0]: f for f in lint.check(proto) if f.check == "named_barrier"}
    assert found["bar.arrive on named barrier 4"].severity == "error"
    assert (
        "counts 288 threads, but every bar.sync of id 4 counts [256]"
        in found["bar.arrive on named barrier 4"].message
    )
    (five,) = [f for f in found.values() if "id 5" in f.message]
    assert five.severity == "info"


def test_named_barrier_counts_under_different_conditions_warn():
    proto = Protocol(launch={"block": (256, 1, 1)})
    a = _ev(0, "named_barrier_sync", barrier_id=1, threads=128, all_threads=False)
    b = _ev(1, "named_barrier_sync", barrier_id=1, threads=256, all_threads=False)
    b.conds = ("if@k.py:40",)
    proto.events = [a, b]
    (f,) = [f for f in lint.check(proto) if f.check == "named_barrier"]
    assert f.severity == "warning" and "different run-time conditions" in f.message


def test_producer_tail_is_an_error_in_a_cluster():
    key = "PipelineTmaAsync@k.py:1"
    proto = Protocol(launch={"block": (384, 1, 1), "cluster": (2, 1, 1)})
    proto.pipelines[key] = PipelineRecord(
        key, "PipelineTmaAsync", "/k.py", 1, stages=4, cluster_shape=(1, 2, 1, 1)
    )
    proto.events = [
        Event(
            0,
            "producer_acquire",
            key,
            "/k.py",
            5,
            "load",
            (),
            {"copies": [], "expect_tx": [], "arrives": 0, "conditional_arrives": []},
            in_loop=True,
        )
    ]
    (f,) = [f for f in lint.check(proto) if f.check == "producer_tail"]
    assert f.severity == "error" and "remote arrive" in f.message
    # acquired once outside any loop and never released: single-use stages, nothing to drain
    proto.events[0].in_loop = False
    assert [f for f in lint.check(proto) if f.check == "producer_tail"] == []


def test_thread_count_where_warps_are_counted():
    key = "PipelineTmaAsync@k.py:1"
    proto = Protocol(launch={"block": (160, 1, 1)})
    proto.pipelines[key] = PipelineRecord(
        key,
        "PipelineTmaAsync",
        "/k.py",
        1,
        stages=2,
        producer_group=("Thread", 1),
        consumer_group=("Thread", 128),
        cluster_shape=(1, 1, 1, 1),
        full_op="TmaLoad",
        full_init=1,
        empty_init=128,
    )
    (f,) = [f for f in lint.check(proto) if f.check == "arrive_count"]
    assert "128 > 5 warps x 1 multicast CTAs = 5" == f.arithmetic


def test_protocol_and_findings_round_trip_through_json():
    findings, proto = run(STREAM, "wrong_expect_tx", {"delta_bytes": 16})
    again = Protocol.from_json(json.loads(json.dumps(proto)))
    assert [f.to_json() for f in lint.check(again)] == [f.to_json() for f in findings]


# ---- command line (the parent never imports cutlass) -------------------------------------------


@pytest.mark.slow
def test_cli_lint_scenarios_exit_codes():
    code = (
        "import sys, cutedebug.analyses.lint, cutedebug.commands.cli; "
        "print(sorted(m for m in ('cutlass', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "cutedebug",
            "lint",
            "scenarios/tma_stream/wrong_expect_tx_plus.toml",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "expect_tx 33040 B per stage, TMA copies deliver 33024 B" in bad.stdout
    good = subprocess.run(
        [sys.executable, "-m", "cutedebug", "lint", "--json", "kernels/minimal.py:Minimal"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert good.returncode == 0, good.stdout + good.stderr
    assert json.loads(good.stdout)[0]["findings"] == []
