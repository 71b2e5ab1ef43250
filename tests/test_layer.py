"""The instrumentation layer on library-style code installed in a venv (CPU, sm_90a).

tests/fieldlib_src/fieldlib is a stand-in for an installed CuTe DSL library (a pipeline
subclass with its own create() and a no-op producer_commit, one helper line that creates every
pipeline, its own pipeline state class and factory with advance_iters, a wrapper class that
waits inside lambdas, a _w_index_phase wrapper; ring.py: quack's exchange pattern, a no-op
producer_commit never called and a raw wait on a phase the kernel reads from its state;
subtiles.py: quack's SM100 GEMM patterns, a release under a static `if` in one of several
subtiles and a producer that arms the full barrier itself; credits.py: FA-4's SM100 forward
idioms, a credit-counter pipeline, a drain written as a final acquire, releases of each stage
in an unrolled loop, CTA-local pipelines in a clustered launch). Each test copies it into ``site-packages`` of a fake venv
whose ``lib/pythonX.Y`` is made the stdlib (as sysconfig reports it in a real venv), so the
frame rule is exercised: the library's files are kernel code, sites land on the kernel's call
lines in them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import sysconfig
from collections import Counter
from pathlib import Path

import pytest

from cutedebug.instrument import faults, frames, layer, probes
from cutedebug.instrument.recorder import record
from tests.helpers.ptx import init_counts

pytest.importorskip("cutlass")

SRC = Path(__file__).resolve().parent / "fieldlib_src" / "fieldlib"


def _lines(path: Path, needle: str) -> list[int]:
    return [i for i, t in enumerate(path.read_text().splitlines(), 1) if needle in t]


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """fieldlib installed in site-packages of a fake venv: as in a real venv, sysconfig's
    platstdlib is the venv's lib/pythonX.Y (which holds site-packages), stdlib the base one."""
    root = tmp_path_factory.mktemp("venv")
    lib = root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site = lib / "site-packages"
    shutil.copytree(SRC, site / "fieldlib")
    paths = dict(sysconfig.get_paths(), platstdlib=str(lib))
    mp = pytest.MonkeyPatch()
    mp.setattr(sysconfig, "get_paths", lambda *a, **k: dict(paths))
    mp.syspath_prepend(str(site))
    frames.library_prefixes.cache_clear()
    frames._classify_cached.cache_clear()
    for name in [m for m in sys.modules if m == "fieldlib" or m.startswith("fieldlib.")]:
        del sys.modules[name]
    try:
        assert str(lib) + os.sep in frames.library_prefixes()
        yield site / "fieldlib"
    finally:
        mp.undo()
        frames.library_prefixes.cache_clear()
        frames._classify_cached.cache_clear()


class Traced:
    """One compile of a fieldlib kernel (Sum3 unless told) under the recorder, a fault and the
    probes."""

    def __init__(
        self,
        pkg: Path,
        fault: str | None = None,
        args: dict | None = None,
        kernel: tuple[str, str] = ("sum3.py", "Sum3"),
        params: dict | None = None,
    ):
        from cutlass import cute

        from cutedebug import kernel_api

        self.kernel_file = pkg / kernel[0]
        self.library_file = pkg / "pipeline.py"
        obj = kernel_api.load_entry(self.kernel_file, kernel[1])(**(params or {}))
        with contextlib.ExitStack() as stack:
            self.proto = stack.enter_context(record())
            self.applied = stack.enter_context(faults.inject(fault, args or {}))
            self.table = stack.enter_context(
                probes.instrument(probes.ProbeConfig(), 0x7F0000000000)
            )
            with contextlib.chdir(pkg.parent):
                compiled = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](
                    obj, *obj.fake_args()
                )
        self.ptx = compiled.__ptx__

    def findings(self):
        from cutedebug.analyses import lint

        return lint.check(self.proto)


@pytest.fixture(scope="module")
def clean(venv):
    return Traced(venv)


def test_library_file_in_site_packages_is_kernel_code(venv):
    assert not frames.is_library(str(venv / "sum3.py"))
    assert not frames.is_library(str(venv / "pipeline.py"))
    assert frames.is_library(os.__file__)


def test_three_pipelines_through_one_helper_line_are_three(clean, venv):
    """The library's free helper make_pipe creates all three: they are three pipelines (by
    identity), each at the kernel's call of the helper, the helper's create() line as via."""
    table = clean.proto.pipeline_table()
    assert [p["index"] for p in table] == [0, 1, 2]
    assert {p["class"] for p in table} == {"SignalPipeline"}
    (create_line,) = _lines(venv / "pipeline.py", "SignalPipeline.create(")
    (call_line,) = _lines(venv / "sum3.py", "fl.make_pipe(")
    assert {(Path(p["file"]).name, p["line"]) for p in table} == {("sum3.py", call_line)}
    assert {p["via"] for p in table} == {f"pipeline.py:{create_line}"}
    assert len({p["key"] for p in table}) == 3
    assert all(p["stages"] == 2 for p in table)


def test_clean_kernel_has_no_lint_error_and_the_no_op_commit_is_not_paired(clean):
    found = clean.findings()
    assert [f for f in found if f.severity in ("error", "warning")] == []
    noop = [f for f in found if f.check == "commit_pairing"]
    assert len(noop) == 3 and all("no-op" in f.message for f in noop)


def test_probe_sites_are_the_kernel_call_lines_with_the_wrapper_as_via(clean, venv):
    k = venv / "sum3.py"
    waits = {s.line: s for s in clean.table.sites if s.op == "consumer_wait"}
    assert set(waits) == {
        _lines(k, "ra.wait(ca)")[0],
        _lines(k, "rb.wait(cb)")[0],
        _lines(k, "pc.consumer_wait_w_index_phase(")[0],
    }
    reader = _lines(venv / "pipeline.py", "self.pipe.consumer_wait(state)")[0]
    assert waits[_lines(k, "ra.wait(ca)")[0]].via == f"pipeline.py:{reader}"
    assert {s.pipeline_index for s in waits.values()} == {0, 1, 2}
    assert all(s.barrier == "full" and s.role == "consumer" for s in waits.values())
    acquires = [s for s in clean.table.sites if s.op == "producer_acquire"]
    assert sorted(s.line for s in acquires) == _lines(k, ".producer_acquire(")


def test_missing_phase_flip_reaches_the_library_state_class(clean, venv):
    for role, start in (("consumer", 0), ("producer", 1)):
        t = Traced(venv, "missing_phase_flip", {"role": role})
        assert t.applied.count > 0
        assert {Path(s["file"]).name for s in t.applied.sites} == {"sum3.py"}
        assert t.ptx != clean.ptx
        (f,) = [f for f in t.findings() if f.check == "phase_flip"]
        assert f.severity == "error" and "StateWAdvance" in f.message
        assert f"from (index 0, phase {start}) gave (index 0, phase {start})" in f.arithmetic


def test_missing_phase_flip_freezes_a_wait_built_from_a_raw_phase(venv):
    t = Traced(venv, "missing_phase_flip", {"role": "consumer"})
    k = venv / "sum3.py"
    waits = [s for s in t.applied.sites if s["op"] == "consumer_wait"]
    assert [s["line"] for s in waits] == _lines(k, "pc.consumer_wait_w_index_phase(")
    assert "built without a consumer lineage" in waits[0]["detail"]


def test_wrong_arrive_count_whatever_create_passes(clean, venv):
    t = Traced(venv, "wrong_arrive_count", {"barrier": "empty", "delta": 1})
    assert t.applied.count == 3  # the subclass's create() passes no phase argument
    base = Counter(init_counts(clean.ptx))
    got = Counter(init_counts(t.ptx))
    assert base == Counter({32: 12}) and got == Counter({32: 6, 33: 6})
    one = Traced(venv, "wrong_arrive_count", {"barrier": "full", "delta": 1, "pipeline": 1})
    assert one.applied.count == 1 and one.applied.sites[0]["pipeline_index"] == 1
    assert Counter(init_counts(one.ptx)) == Counter({32: 10, 33: 2})


def test_release_faults_hit_every_pipeline_at_the_kernel_line(venv):
    t = Traced(venv, "skip_consumer_release", {"at_iteration": 0})
    k = venv / "sum3.py"
    assert sorted(s["line"] for s in t.applied.sites) == sorted(
        _lines(k, "ra.release(ca)")
        + _lines(k, "rb.release(cb)")
        + _lines(k, "pc.consumer_release(cc)")
    )
    assert any(f.check == "release_pairing" and f.severity == "error" for f in t.findings())


def test_pipeline_selects_one_pipeline_by_creation_order(venv):
    t = Traced(venv, "early_exit", {"role": "producer", "pipeline": 2})
    k = venv / "sum3.py"
    assert [s["line"] for s in t.applied.sites] == _lines(k, "pc.producer_commit(sc)")


def test_a_fault_at_zero_sites_is_reported_not_applied(venv):
    t = Traced(venv, "wrong_expect_tx", {"delta_bytes": 16})  # no expect_tx in this kernel
    assert t.applied.count == 0
    assert "NOT APPLIED" in t.applied.not_applied()


def test_entry_point_table_and_unsupported_message():
    names = {e.name for e in layer.ENTRY_POINTS}
    assert {"consumer_wait", "create", "array.wait", "state.advance", "mbarrier_wait"} <= names
    assert all(e.checked for e in layer.ENTRY_POINTS)
    for e in layer.ENTRY_POINTS:
        layer.resolve(e)  # every entry exists in the installed DSL
    missing = layer.Entry(
        "nope", "cutlass.pipeline", "PipelineAsync.no_such_op", "method", used_by="tests"
    )
    with pytest.raises(
        layer.Unsupported,
        match=r"UNSUPPORTED: cutedebug hooks "
        r"cutlass\.pipeline\.PipelineAsync\.no_such_op .* checked on 4\.8\.1",
    ):
        layer.resolve(missing)


def test_layer_restores_everything(venv):
    import cutlass.pipeline as pl
    from cutlass import cute

    before = (
        pl.PipelineAsync.consumer_wait,
        pl.PipelineState.advance,
        cute.arch.mbarrier_wait,
        pl.MbarrierArray.__init__,
    )
    Traced(venv, "missing_phase_flip", {"role": "producer"})
    assert layer.current() is None
    assert before == (
        pl.PipelineAsync.consumer_wait,
        pl.PipelineState.advance,
        cute.arch.mbarrier_wait,
        pl.MbarrierArray.__init__,
    )


def test_producer_phase_flip_leaves_the_tma_store_ring_alone(tmp_path, monkeypatch):
    """sm90_gemm's epilogue PipelineTmaStore takes no state in producer_acquire/tail."""
    from cutlass import cute

    from cutedebug import kernel_api

    monkeypatch.chdir(tmp_path)
    root = Path(__file__).resolve().parents[1]
    obj = kernel_api.load_entry(root / "kernels" / "sm90_gemm.py", "Sm90Gemm")()
    with faults.inject("missing_phase_flip", {"role": "producer"}) as applied:
        cute.compile[cute.GPUArch("sm_90a")](obj, *obj.fake_args())
    assert applied.count > 0
    assert {Path(s["file"]).name for s in applied.sites} == {"sm90_gemm.py"}


def test_a_missing_optional_entry_is_noted_a_missing_required_one_is_unsupported(monkeypatch):
    """A DSL without an observation-only entry (e.g. an older one without store_async_dsmem)
    is still instrumented; without an entry a fault or probe needs, UNSUPPORTED."""
    import dataclasses

    gone = dataclasses.replace(layer.ENTRIES["store_async_dsmem"], attr="no_such_sender")
    monkeypatch.setitem(layer.ENTRIES, "store_async_dsmem", gone)
    with layer.observe("probes", {"store_async_dsmem": lambda call: call.proceed()}) as active:
        assert "no_such_sender" in active.missing["store_async_dsmem"]
    needed = dataclasses.replace(layer.ENTRIES["array.wait"], attr="MbarrierArray.no_wait")
    monkeypatch.setitem(layer.ENTRIES, "array.wait", needed)
    with pytest.raises(layer.Unsupported, match="MbarrierArray.no_wait"):
        with layer.observe("probes", {"array.wait": lambda call: call.proceed()}):
            pass
    assert layer.current() is None


RING = ("ring.py", "Ring")


@pytest.fixture(scope="module")
def ring(venv):
    return Traced(venv, kernel=RING)


def test_a_no_op_commit_the_kernel_never_calls_is_not_paired(ring, venv):
    """quack's PipelineStasAsync: producer_commit does nothing and the kernel never calls it
    (the data path arrives on the full barrier): no commit_pairing error."""
    found = ring.findings()
    assert [f for f in found if f.severity in ("error", "warning")] == []
    (noop,) = [f for f in found if f.check == "commit_pairing"]
    (line,) = _lines(
        venv / "pipeline.py", "def producer_commit(self, state, *, loc=None, ip=None):"
    )[1:]
    assert noop.severity == "info"
    assert f"producer_commit of ExchangePipeline is a no-op method (pipeline.py:{line})" in (
        noop.message
    )
    # lane 0 arrives through producer_get_barrier's pointer, which the layer does not trace:
    # the finding says so rather than vouch for the barrier
    assert "not traced" in noop.message and "consumer_wait hangs" in noop.message
    (rec,) = ring.proto.pipelines.values()
    assert rec.noop_ops == {"producer_commit": f"pipeline.py:{line}"}


def test_a_raw_wait_in_a_library_helper_is_sited_at_the_kernel_call(ring, venv):
    """fl.exchange_wait is a free helper of the library (quack's cluster_reduce): its raw
    mbarrier wait is the kernel's call line in ring.py, the helper's wait line as via (it
    was the helper's line, shared by every call of the helper)."""
    (call_line,) = _lines(venv / "ring.py", "fl.exchange_wait(full, cs.phase)")
    (wait_line,) = _lines(venv / "pipeline.py", "cute.arch.mbarrier_wait(mbar, phase=phase)")
    (raw,) = [s for s in ring.table.sites if s.op == "raw_wait"]
    assert (raw.where, raw.via, raw.role) == (
        f"ring.py:{call_line}",
        f"pipeline.py:{wait_line}",
        "consumer",
    )


def test_no_op_methods_are_found_by_their_body():
    from cutlass.pipeline import PipelineAsync, PipelineTmaAsync

    from cutedebug.instrument.identity import is_noop_function

    def documented(self, state, *, loc=None, ip=None):
        """Nothing to do."""

    def ellipsis(self): ...

    def stores(self):
        x = 1  # noqa: F841

    assert is_noop_function(documented) and is_noop_function(ellipsis)
    assert not is_noop_function(stores) and not is_noop_function(lambda: 1)
    assert is_noop_function(vars(PipelineTmaAsync)["producer_commit"])  # the TMA's no-op
    assert not is_noop_function(vars(PipelineAsync)["producer_commit"])  # arrives


def test_missing_phase_flip_reaches_a_phase_the_kernel_reads_for_a_raw_wait(ring, venv):
    """The consumer state's phase is read by the kernel and handed to a raw mbarrier wait
    (quack's RMSNorm backward); it advances with advance() here: the fault must freeze it."""
    k = venv / "ring.py"
    plain = Traced(venv, kernel=RING, params={"iters": False})
    t = Traced(
        venv, "missing_phase_flip", {"role": "consumer"}, kernel=RING, params={"iters": False}
    )
    (site,) = t.applied.sites
    assert (Path(site["file"]).name, site["line"]) == ("ring.py", _lines(k, "cs.advance()")[0])
    (read,) = _lines(k, "fl.exchange_wait(full, cs.phase)")
    assert f"its phase read by the kernel at ring.py:{read}" in site["detail"]
    assert t.ptx != plain.ptx


def test_missing_phase_flip_patches_a_library_advance_iters(ring, venv):
    """StateWAdvance.advance_iters (quack's PipelineStateWAdvance) advances without the flip
    through the entry point table's subclass_method entry."""
    k = venv / "ring.py"
    t = Traced(venv, "missing_phase_flip", {"role": "consumer"}, kernel=RING)
    assert t.applied.count > 0
    assert [(Path(s["file"]).name, s["line"]) for s in t.applied.sites] == [
        ("ring.py", _lines(k, "cs.advance_iters(1)")[0])
    ]
    assert t.ptx != ring.ptx
    entry = layer.ENTRIES["state.advance_iters"]
    assert entry.kind == "subclass_method" and entry.libraries == (
        "quack-kernels 0.6.5 (PipelineStateWAdvance)",
    )


def test_a_property_hook_leaves_the_ptx_alone(ring, venv):
    """Observing PipelineState.phase (installed only while missing_phase_flip is active)
    changes nothing in what the kernel compiles to."""
    from cutlass import cute

    from cutedebug import kernel_api

    obj = kernel_api.load_entry(venv / "ring.py", "Ring")()

    def build():
        with contextlib.chdir(venv.parent):
            return cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](
                obj, *obj.fake_args()
            ).__ptx__

    plain = build()
    reads = []
    with layer.observe("faults", {"state.phase": lambda c: reads.append(1) or c.proceed()}):
        observed = build()
    assert reads and observed == plain


SUBTILES = ("subtiles.py", "Subtiles")


def test_a_release_under_a_static_if_counts_once_and_a_self_armed_full_is_paired(venv):
    """quack's SM100 GEMM: the epilogue releases the accumulator inside `if epi_coord[1] ==
    acc_release_idx` (Python ints) in a static loop over subtiles, and the scheduler's
    producer arms the full barrier with arrive.expect_tx itself (a CLC query). The DSL traces
    the body of a static `if` even where it is False: before, one release per subtile was
    recorded ("performed twice" x3) and the missing commits were an error."""
    t = Traced(venv, kernel=SUBTILES)
    found = t.findings()
    assert [f for f in found if f.severity in ("error", "warning")] == []
    (arm,) = [f for f in found if f.check == "commit_pairing"]
    (line,) = _lines(venv / "subtiles.py", "cute.arch.mbarrier_arrive_and_expect_tx(full, 0)")
    assert arm.severity == "info"
    assert f"arrives on the full barrier itself with arrive.expect_tx at subtiles.py:{line}" in (
        arm.message
    )
    releases = [e for e in t.proto.events if e.kind == "consumer_release"]
    assert len(releases) == 1
    # two subtiles that really release: the double release is still an error
    twice = Traced(venv, kernel=SUBTILES, params={"release_at": (2, 3)})
    errors = [f for f in twice.findings() if f.severity == "error"]
    assert [f.check for f in errors] == ["release_pairing"]
    assert "performed twice for one consumer_wait" in errors[0].message


CREDITS = ("credits.py", "Credits")


def test_fa4_sm100_idioms_are_not_lint_errors(venv):
    """A credit-counter pipeline (never committed nor waited on), a drain written as one more
    producer_acquire after the loop, a release of each stage named in an unrolled loop, and
    CTA-local pipelines in a 2-CTA launch: before, commit_pairing, release_pairing
    ("performed twice"), producer_tail and init_sync errors on a correct kernel."""
    k = venv / "credits.py"
    t = Traced(venv, kernel=CREDITS)
    found = t.findings()
    assert [f for f in found if f.severity == "error"] == []
    keys = {p["index"]: p["key"] for p in t.proto.pipeline_table()}
    (credit,) = [f for f in found if "is used as a credit counter" in f.message]
    assert (credit.severity, credit.pipeline) == ("info", keys[1])
    (drain,) = [f for f in found if "is drained by its final producer_acquire" in f.message]
    (line,) = _lines(k, "                data.producer_acquire(ps)")[1:]
    assert (drain.severity, drain.pipeline, drain.line) == ("info", keys[0], line)
    assert not any("performed twice" in f.message for f in found)
    # the credit pipeline has no drain: a warning (CTA-local, even in a 2-CTA launch)
    tails = [(f.severity, f.pipeline) for f in found if f.check == "producer_tail"]
    assert ("warning", keys[1]) in tails
    # without the drain the data pipeline is not drained either: a warning, not clean
    undrained = Traced(venv, kernel=CREDITS, params={"drain": False}).findings()
    assert ("warning", keys[0]) in [
        (f.severity, f.pipeline) for f in undrained if f.check == "producer_tail"
    ]
