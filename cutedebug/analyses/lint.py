"""Static protocol checks: the barrier protocol of a kernel, recorded while it is traced.

``record()`` patches ``cutlass.pipeline`` and ``cute.arch`` for the duration of one trace (every
patch restored on exit, exceptions included) and fills a ``Protocol``: each pipeline (class,
stages, declared tx bytes and groups, the arrive counts actually written by mbarrier.init,
cluster and multicast shape), the launch shape, every pipeline op per role in trace order with
the kernel's file:line, each TMA copy and the full barrier it completes on with its byte count,
expect_tx bytes, named barriers, mbarrier init / init fence / syncs. ``check(protocol)`` turns it
into ``Finding`` records whose message states the arithmetic.

Order with fault injection: enter ``record()`` OUTSIDE ``faults.inject`` (and probes), so a fault
wraps the recorder's patches and the recorder sees what the fault makes the kernel do::

    with lint.record() as proto, faults.inject(name, args):
        compiled = cute.compile(kernel, *args)
    findings = lint.check(proto)

A loop body is traced once, so the protocol describes one iteration of each loop: the copies
traced between two producer_acquire calls of a pipeline are one stage's copies.

This module imports cutlass only inside ``record()``: the parent (``cutedebug lint``) runs the
compile in a child process (``python -m cutedebug.analyses.lint REQUEST.json``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import linecache
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cutedebug.instrument import frames

SEVERITIES = ("error", "warning", "info")
PIPELINE_OPS = ("producer_acquire", "producer_commit", "consumer_wait", "consumer_release",
                "producer_tail", "producer_get_barrier")
# Pipelines whose create() passes the declared groups to mbarrier.init unchanged (unless
# enable_multicast_signaling recomputes the consumer count).
_KNOWN_GROUP_RULES = ("PipelineAsync", "PipelineCpAsync", "PipelineTmaAsync", "PipelineTmaUmma",
                      "PipelineAsyncUmma", "PipelineUmmaAsync")


@dataclasses.dataclass
class Finding:
    severity: str  # error | warning | info
    check: str
    pipeline: str | None
    message: str
    arithmetic: str = ""
    file: str | None = None
    line: int | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Finding:
        return cls(**{f.name: d.get(f.name) for f in dataclasses.fields(cls)})

    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}" if self.file else "-"


@dataclasses.dataclass
class Event:
    seq: int
    kind: str
    pipeline: str | None = None
    file: str | None = None
    line: int | None = None
    function: str | None = None
    conds: tuple[str, ...] = ()  # non-library run-time conditions around the call
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}" if self.file else "?"


@dataclasses.dataclass
class PipelineRecord:
    key: str
    cls: str
    file: str | None
    line: int | None
    stages: int | None = None
    tx_count: int | None = None  # declared in create()
    producer_group: tuple[str, Any] | None = None
    consumer_group: tuple[str, Any] | None = None
    cluster_shape: tuple | None = None  # cta_layout_vmnk shape
    mcast_mode_mn: tuple | None = None
    multicast_signaling: bool = False
    defer_sync: bool = False
    full_op: str | None = None
    empty_op: str | None = None
    full_init: int | None = None  # arrive count written by mbarrier.init
    empty_init: int | None = None
    init_seq: int = 0

    @property
    def cluster_size(self) -> int | None:
        return _prod(self.cluster_shape) if self.cluster_shape else 1

    @property
    def v_size(self) -> int:
        s = self.cluster_shape
        return s[0] if s and isinstance(s[0], int) else 1

    @property
    def mcast_size(self) -> int | None:
        """CTAs a consumer warp signals (PipelineTmaAsync.init_empty_barrier_arrive_signal)."""
        s, mode = self.cluster_shape, self.mcast_mode_mn or (1, 1)
        if not s or len(s) != 4 or not all(isinstance(x, int) for x in s):
            return None
        m = s[2] if mode[0] else 0
        n = s[1] if mode[1] else 0
        return max(m + n - (1 if mode[0] and mode[1] else 0), 1)


@dataclasses.dataclass
class Protocol:
    pipelines: dict[str, PipelineRecord] = dataclasses.field(default_factory=dict)
    events: list[Event] = dataclasses.field(default_factory=list)
    launch: dict[str, Any] = dataclasses.field(default_factory=dict)
    state_types: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)

    def of(self, kind: str, pipeline: str | None = None) -> list[Event]:
        return [e for e in self.events
                if e.kind == kind and (pipeline is None or e.pipeline == pipeline)]

    @property
    def block_threads(self) -> int | None:
        return _prod(self.launch.get("block"))

    def to_json(self) -> dict[str, Any]:
        out = {"pipelines": {k: dataclasses.asdict(p) for k, p in self.pipelines.items()},
               "events": [dataclasses.asdict(e) for e in self.events],
               "launch": self.launch, "state_types": self.state_types, "notes": self.notes}
        return json.loads(json.dumps(out, default=str))  # plain JSON types (lists, not tuples)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Protocol:
        p = cls(launch=d.get("launch", {}), state_types=d.get("state_types", {}),
                notes=d.get("notes", []))
        for k, v in d.get("pipelines", {}).items():
            for f in ("producer_group", "consumer_group", "cluster_shape", "mcast_mode_mn"):
                if v.get(f) is not None:
                    v[f] = tuple(v[f])
            p.pipelines[k] = PipelineRecord(**v)
        for e in d.get("events", []):
            e["conds"] = tuple(e.get("conds", ()))
            p.events.append(Event(**e))
        return p


def _prod(xs: Any) -> int | None:
    if not xs:
        return None
    out = 1
    for x in xs:
        if not isinstance(x, int) or isinstance(x, bool):
            return None
        out *= x
    return out


def _static(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _static_tuple(x: Any) -> tuple | None:
    if x is None:
        return None
    if isinstance(x, int):
        return (x,)
    try:
        items = tuple(x)
    except TypeError:
        return None
    flat: list[Any] = []
    for i in items:
        if isinstance(i, tuple):
            p = _prod(i)
            flat.append(p)
        else:
            flat.append(_static(i))
    return tuple(flat)


# ---- frames ----------------------------------------------------------------------------------

def _caller_is_library(depth: int = 2) -> tuple[bool, str]:
    f = sys._getframe(depth)
    fn = f.f_code.co_filename
    path = os.path.abspath(fn)
    # A fault's wrapper (cutedebug/faults.py) calling a release is the kernel's call as far as
    # the protocol goes; only the DSL, the stdlib and this recorder are library here.
    in_dsl = frames.is_library(fn) and not path.startswith(frames.PACKAGE_DIR)
    return (in_dsl or path == os.path.abspath(__file__),
            f"{os.path.basename(fn)}:{f.f_lineno}")


def _create_frames() -> list[Any]:
    """Frames of pipeline ``create`` calls on the stack, innermost first."""
    out = []
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "create" and "num_stages" in f.f_locals:
            out.append(f)
        f = f.f_back
    return out


def _accepts(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _group(g: Any) -> tuple[str, Any] | None:
    if g is None:
        return None
    agent = getattr(getattr(g, "agent", None), "name", None)
    return (agent, _static(getattr(g, "size", None)))


def _group_threads(g: tuple[str, Any] | None, block_threads: int | None) -> int | None:
    if not g or g[1] is None:
        return None
    agent, size = g
    if agent == "Thread":
        return size
    if agent == "Warp":
        return 32 * size
    if agent == "ThreadBlock" and block_threads:
        return size * block_threads
    return None


# ---- recorder --------------------------------------------------------------------------------

class _Recorder:
    def __init__(self) -> None:
        self.proto = Protocol()
        self.stack: list[Event] = []  # open pipeline ops (outermost first)
        self.conds: list[str] = []  # open non-library if_generate conditions
        self.ptr_tags: dict[int, str] = {}
        self.arrays: dict[int, tuple[str, str]] = {}  # id(MbarrierArray) -> (pipeline, full|empty)
        self.tma_multicast: dict[int, int] = {}  # id(TMA op) -> num_multicast
        self.keep: list[Any] = []  # objects whose id() is a key above

    # events
    def add(self, kind: str, pipeline: str | None = None, **detail: Any) -> Event:
        file, line, func = frames.kernel_frame()
        ev = Event(len(self.proto.events), kind, pipeline, file, line, func, tuple(self.conds),
                   detail)
        self.proto.events.append(ev)
        return ev

    def open_op(self, kinds: tuple[str, ...]) -> Event | None:
        for ev in reversed(self.stack):
            if ev.kind in kinds:
                return ev
        return None

    # pipelines
    def pipeline_of(self, pipe: Any) -> str:
        full = getattr(pipe, "sync_object_full", None)
        tagged = self.arrays.get(id(full))
        if tagged:
            return tagged[0]
        # Rebuilt across a dynamic region: match by class and barrier parameters.
        cls = type(pipe).__name__
        cands = [p for p in self.proto.pipelines.values() if p.cls == cls]
        fp = (_static(getattr(full, "num_stages", None)), _static(getattr(full, "tx_count", None)),
              _static(getattr(full, "arrive_count", None)))
        exact = [p for p in cands if (p.stages, p.tx_count, p.full_init) == fp]
        if exact or cands:
            return (exact or cands)[-1].key
        file, line, _ = frames.kernel_frame()
        key = f"{cls}@{os.path.basename(file or '?')}:{line}"
        self.proto.pipelines.setdefault(key, PipelineRecord(key, cls, file, line,
                                                            stages=fp[0], tx_count=fp[1]))
        return key

    def on_array_init(self, array: Any) -> None:
        create_frames = _create_frames()
        count = _static(getattr(array, "arrive_count", None))
        op = getattr(getattr(array, "op_type", None), "name", None)
        if not create_frames:
            self.add("mbarrier_array_init", count=count, stages=array.num_stages)
            return
        outer = create_frames[-1]
        cls_name = outer.f_code.co_qualname.rpartition(".")[0] or "Pipeline"
        file, line, _ = frames.kernel_frame()
        key = f"{cls_name}@{os.path.basename(file or '?')}:{line}"
        rec = self.proto.pipelines.get(key)
        if rec is None or rec.init_seq != id(outer):
            loc = outer.f_locals
            layout = loc.get("cta_layout_vmnk")
            rec = PipelineRecord(
                key, cls_name, file, line, stages=_static(loc.get("num_stages")),
                tx_count=_static(loc.get("tx_count")),
                producer_group=_group(loc.get("producer_group")),
                consumer_group=_group(loc.get("consumer_group")),
                cluster_shape=_static_tuple(getattr(layout, "shape", None)) if layout is not None
                else None,
                mcast_mode_mn=tuple(loc.get("mcast_mode_mn") or (1, 1)),
                multicast_signaling=bool(loc.get("enable_multicast_signaling", False)),
                defer_sync=bool(loc.get("defer_sync", False)), init_seq=id(outer))
            self.proto.pipelines[key] = rec
            self.keep.append(outer)  # its id() marks this create call
        if "sync_object_full" in create_frames[0].f_locals:  # the library assigns full, then empty
            side = "empty"
        else:
            side = "full" if rec.full_init is None and rec.full_op is None else "empty"
        if side == "full":
            rec.full_init, rec.full_op = count, op
        else:
            rec.empty_init, rec.empty_op = count, op
        self.arrays[id(array)] = (key, side)
        self.keep.append(array)
        self.add("mbarrier_array_init", key, barrier=side, count=count, stages=array.num_stages)

    def on_state(self, state: Any, role: str) -> None:
        cls = type(state)
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name in self.proto.state_types:
            return
        stages = _static(getattr(state, "_stages", None))
        file, line, _ = frames.kernel_frame()
        info: dict[str, Any] = {"role": role, "stages": stages, "flips": None, "file": file,
                                "line": line}
        if stages and stages > 1:
            try:  # a Python-int shadow: advance(stages) is plain arithmetic, emits no IR
                shadow = cls(stages, 0, 0, 0)
                shadow.advance(stages)
                phase = _static(getattr(shadow, "_phase", None))
                index = _static(getattr(shadow, "_index", None))
                if phase is not None and index is not None:
                    info.update(flips=phase == 1, after=[index, phase])
            except Exception as e:  # a subclass with another constructor: say so
                info["error"] = f"{type(e).__name__}: {e}"
        self.proto.state_types[name] = info


@contextlib.contextmanager
def record() -> Iterator[Protocol]:
    """Record the barrier protocol of every kernel traced inside; patches restored on exit."""
    import cutlass.cute as cute
    import cutlass.cutlass_dsl as cdsl
    from cutlass.cute.nvgpu import cpasync
    from cutlass.pipeline import helpers

    from cutedebug.instrument import faults

    rec = _Recorder()
    patcher = faults._Patcher(faults.Applied(fault=None, args={}))
    user_op = faults._user_op
    try:
        # The DSL gives an op without an explicit loc the first frame outside its own modules:
        # the recorder's wrappers must not be that frame, or line info would point in here.
        from cutlass._mlir_helpers import op as op_mod

        op_mod._is_framework_frame(__file__)  # package roots: computed with its own prefixes
        patcher.set_attr(op_mod, "_FRAMEWORK_MODULE_PREFIXES",
                         (*op_mod._FRAMEWORK_MODULE_PREFIXES, __name__))
        _patch_pipelines(rec, patcher, user_op)
        _patch_arrays(rec, patcher, helpers)
        _patch_arch(rec, patcher, user_op, cute)
        _patch_copies(rec, patcher, user_op, cute, cpasync)
        _patch_if_generate(rec, patcher, cdsl)
        _patch_launch(rec, patcher, cdsl)
        yield rec.proto
    finally:
        patcher.restore()


def _call(orig: Any, *a: Any, loc: Any = None, ip: Any = None, **kw: Any) -> Any:
    if _accepts(orig, "loc"):
        kw["loc"], kw["ip"] = loc, ip
    return orig(*a, **kw)


def _patch_pipelines(rec: _Recorder, p: Any, user_op: Callable) -> None:
    from cutedebug.instrument.faults import _pipeline_classes

    for attr in PIPELINE_OPS:
        for cls in _pipeline_classes(attr):
            orig = vars(cls)[attr]
            p.set_attr(cls, attr, user_op(_op_wrapper(rec, attr, orig)))


def _op_wrapper(rec: _Recorder, op: str, orig: Any) -> Callable:
    def wrapper(self, *a, loc=None, ip=None, **kw):
        if rec.open_op((op,)) is not None and rec.stack[-1].kind == op:  # a subclass's super()
            return _call(orig, self, *a, loc=loc, ip=ip, **kw)
        key = rec.pipeline_of(self)
        state = a[0] if a else kw.get("state")
        if op == "producer_get_barrier":
            ptr = _call(orig, self, *a, loc=loc, ip=ip, **kw)
            rec.ptr_tags[id(ptr)] = key
            rec.keep.append(ptr)
            return ptr
        if state is not None and op in ("producer_acquire", "consumer_wait"):
            rec.on_state(state, "producer" if op == "producer_acquire" else "consumer")
        ev = rec.add(op, key, arrives=0, conditional_arrives=[], copies=[], expect_tx=[],
                     waits=0, syncs_before=[])
        rec.stack.append(ev)
        try:
            return _call(orig, self, *a, loc=loc, ip=ip, **kw)
        finally:
            rec.stack.pop()

    wrapper.__name__ = op
    return wrapper


def _patch_arrays(rec: _Recorder, p: Any, helpers: Any) -> None:
    MA = helpers.MbarrierArray
    orig_init, orig_arrive = vars(MA)["mbarrier_init"], vars(MA)["arrive"]

    def mbarrier_init(self, *a, **kw):
        rec.on_array_init(self)
        return orig_init(self, *a, **kw)

    def arrive(self, *a, **kw):
        side = rec.arrays.get(id(self), (None, None))[1]
        release = rec.open_op(("consumer_release",))
        if release is not None and side != "full":
            release.detail["arrives"] += 1
            extra = [c for c in rec.conds if c not in release.conds]
            if extra:
                release.detail["conditional_arrives"].append(extra)
        return orig_arrive(self, *a, **kw)

    p.set_attr(MA, "mbarrier_init", mbarrier_init)
    p.set_attr(MA, "arrive", arrive)


def _patch_arch(rec: _Recorder, p: Any, user_op: Callable, cute: Any) -> None:
    arch = cute.arch

    def wrap(name: str, before: Callable[..., None], module: Any = arch) -> None:
        orig = getattr(module, name, None)
        if orig is None:
            return

        def replacement(*a, loc=None, ip=None, **kw):
            before(*a, **kw)
            return orig(*a, loc=loc, ip=ip, **kw)

        replacement.__name__ = name
        p.replace_everywhere(orig, user_op(replacement))

    def in_create() -> bool:
        return bool(_create_frames())

    def init(ptr, cnt, *a, **kw):
        if not rec.open_op(PIPELINE_OPS) and not in_create():
            rec.add("mbarrier_init", count=_static(cnt))

    def fence(*a, **kw):
        rec.add("init_fence")

    def expect_tx(ptr, nbytes, *a, **kw):
        op = rec.open_op(("producer_acquire",))
        if op is not None:
            op.detail["expect_tx"].append(_static(nbytes))
        else:
            rec.add("expect_tx", rec.ptr_tags.get(id(ptr)), bytes=_static(nbytes))

    def raw(kind: str) -> Callable[..., None]:
        def before(*a, **kw):
            if not rec.stack and not in_create():
                rec.add(kind)
        return before

    def sync(kind: str) -> Callable[..., None]:
        def before(*a, **kw):
            rec.add(kind)
        return before

    def named(kind: str) -> Callable[..., None]:
        def before(*a, barrier_id=None, number_of_threads=None, **kw):
            rec.add(kind, barrier_id=_static(barrier_id) if barrier_id is not None else 0,
                    threads=_static(number_of_threads), all_threads=number_of_threads is None)
        return before

    wrap("mbarrier_init", init)
    wrap("mbarrier_init_fence", fence)
    wrap("mbarrier_arrive_and_expect_tx", expect_tx)
    wrap("mbarrier_expect_tx", expect_tx)
    wrap("mbarrier_arrive", raw("mbarrier_arrive"))
    wrap("mbarrier_wait", raw("mbarrier_wait"))
    wrap("mbarrier_try_wait", raw("mbarrier_wait"))
    wrap("sync_threads", sync("sync_threads"))
    wrap("sync_warp", sync("sync_warp"))
    wrap("cluster_arrive", sync("cluster_arrive"))
    wrap("cluster_arrive_relaxed", sync("cluster_arrive"))
    wrap("cluster_wait", sync("cluster_wait"))
    wrap("barrier", named("named_barrier_sync"))
    wrap("barrier_arrive", named("named_barrier_arrive"))
    wrap("fence_view_async_shared", sync("fence_async_shared"))
    wrap("wait_group", sync("warpgroup_wait"), cute.nvgpu.warpgroup)


_COPY_ARG = re.compile(r"copy\(\s*([A-Za-z_][\w.]*)")


def _patch_copies(rec: _Recorder, p: Any, user_op: Callable, cute: Any, cpasync: Any) -> None:
    orig_copy = cute.copy
    orig_atom = cpasync.make_tiled_tma_atom

    def make_tiled_tma_atom(op, gmem, smem_layout, tiler, num_multicast=1, *a, loc=None,
                            ip=None, **kw):
        out = orig_atom(op, gmem, smem_layout, tiler, num_multicast, *a, loc=loc, ip=ip, **kw)
        rec.tma_multicast[id(op)] = _static(num_multicast) or 1
        rec.keep.append(op)
        return out

    def copy(atom, src, dst, *a, loc=None, ip=None, **kw):
        op = getattr(atom, "op", None)
        name = type(op).__name__
        if "G2S" in name and ("Tma" in name or "BulkTensor" in name or "tma_bar_ptr" in kw):
            _on_tma_copy(rec, op, name, dst, kw)
        return orig_copy(atom, src, dst, *a, loc=loc, ip=ip, **kw)

    p.replace_everywhere(orig_atom, user_op(make_tiled_tma_atom))
    p.replace_everywhere(orig_copy, user_op(copy))


def _on_tma_copy(rec: _Recorder, op: Any, name: str, dst: Any, kw: dict[str, Any]) -> None:
    from cutlass import cute

    d = dst[0] if isinstance(dst, (list, tuple)) else dst
    try:
        elems = _static(cute.size(d))
        width = d.element_type.width
    except Exception:
        elems, width = None, None
    issued = elems * width // 8 if elems is not None and width else None
    mcast = rec.tma_multicast.get(id(op))
    if mcast is None:
        mask = _static(kw.get("mcast_mask"))
        mcast = bin(mask).count("1") if mask else (None if "Multicast" in name else 1)
    ptr = kw.get("tma_bar_ptr")
    key = rec.ptr_tags.get(id(ptr)) if ptr is not None else None
    acquire = None
    for ev in reversed(rec.proto.events):
        if ev.kind == "producer_acquire" and (key is None or ev.pipeline == key):
            acquire = ev
            break
    file, line, _ = frames.kernel_frame()
    text = linecache.getline(file, line) if file else ""
    m = _COPY_ARG.search(text)
    label = m.group(1).rpartition(".")[2] if m else f"copy@{line}"
    label = label.removeprefix("tma_atom_").removeprefix("tma_") or label
    copy = {"label": label, "op": name, "elems": elems, "bits": width, "issued_bytes": issued,
            "multicast": mcast,
            # The partitioned smem view of a multicast copy spans the whole tile that lands in
            # this CTA (its slice plus the peers'), so its size is already the landing bytes.
            "bytes": issued,
            "file": file, "line": line, "barrier_known": key is not None}
    if acquire is not None:
        acquire.detail["copies"].append(copy)
    rec.add("tma_copy", key or (acquire.pipeline if acquire else None), **copy)


def _patch_if_generate(rec: _Recorder, p: Any, cdsl: Any) -> None:
    orig = cdsl.if_generate

    def if_generate(cond, then_body, else_body=None, *a, **kw):
        library, site = _caller_is_library(2)
        if library:
            return orig(cond, then_body, else_body, *a, **kw)

        def guard(body: Callable, label: str) -> Callable:
            def run(*args):
                rec.conds.append(label)
                try:
                    return body(*args)
                finally:
                    rec.conds.pop()
            return run

        then_g = guard(then_body, f"if@{site}")
        else_g = guard(else_body, f"else@{site}") if else_body is not None else None
        return orig(cond, then_g, else_g, *a, **kw)

    p.replace_everywhere(orig, if_generate)


def _patch_launch(rec: _Recorder, p: Any, cdsl: Any) -> None:
    from cutlass.cutlass_dsl.cutlass import KernelLauncher

    orig = vars(KernelLauncher)["launch"]

    def launch(self, *a, **kw):
        entry = {k: _static_tuple(kw.get(k)) for k in ("grid", "block", "cluster")
                 if kw.get(k) is not None}
        file, line, _ = frames.kernel_frame()
        entry.update(kernel=getattr(self.funcBody, "__name__", "?"), file=file, line=line)
        if not rec.proto.launch:
            rec.proto.launch = entry
        else:
            rec.proto.notes.append(f"more than one launch traced; checks use the first: {entry}")
        return orig(self, *a, **kw)

    p.set_attr(KernelLauncher, "launch", launch)


# ---- checks ----------------------------------------------------------------------------------

def check(proto: Protocol) -> list[Finding]:
    """Every invariant over the recorded protocol; the message states the arithmetic."""
    out: list[Finding] = []
    for fn in (_check_expect_tx, _check_arrive_counts, _check_pairing, _check_producer_tail,
               _check_named_barriers, _check_init, _check_phase_flip, _check_warp_release):
        out += fn(proto)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(out, key=lambda f: (order[f.severity], f.check, f.file or "", f.line or 0))


@dataclasses.dataclass
class _Where:
    file: str | None
    line: int | None


def _f(severity: str, check: str, pipe: str | None, message: str, arithmetic: str = "",
       where: Any = None) -> Finding:
    file = getattr(where, "file", None) if where is not None else None
    line = getattr(where, "line", None) if where is not None else None
    return Finding(severity, check, pipe, message, arithmetic, file, line)


HARNESS_CHECK = "harness_error"    # the finding a crashed checker leaves: never "clean"


def static_findings(proto: Protocol) -> list[dict[str, Any]]:
    """check() as JSON for the worker's "compiled" event. A checker that crashes does not fail
    the run but leaves one visible error finding (check "harness_error"), never "clean"."""
    try:
        return [f.to_json() for f in check(proto)]
    except Exception as e:
        import traceback

        tb = traceback.extract_tb(e.__traceback__)[-1]
        return [Finding("error", HARNESS_CHECK, None, f"HARNESS_ERROR: the static checks "
                        f"crashed ({type(e).__name__}: {str(e)[:300]} at "
                        f"{Path(tb.filename).name}:{tb.lineno}); nothing was checked").to_json()]


def _check_expect_tx(proto: Protocol) -> list[Finding]:
    out = []
    for key, rec in proto.pipelines.items():
        if rec.full_op != "TmaLoad":
            continue
        acquires = proto.of("producer_acquire", key)
        for acq in acquires:
            copies, txs = acq.detail["copies"], acq.detail["expect_tx"]
            if not copies:
                if acq is acquires[-1] and not any(a.detail["copies"] for a in acquires):
                    out.append(_f("info", "expect_tx", key, f"no TMA copy traced against the "
                                  f"full barrier of {key}: expect_tx bytes not checked", where=acq))
                continue
            if not txs:
                out.append(_f("error", "expect_tx", key, f"producer_acquire at {acq.where()} "
                              "issues no arrive.expect_tx on the full barrier, but TMA copies "
                              "complete on it", where=acq))
                continue
            if any(t is None for t in txs) or any(c["bytes"] is None for c in copies):
                out.append(_f("info", "expect_tx", key, "expect_tx or a TMA copy size is a "
                              "run-time value: not checked", where=acq))
                continue
            tx = sum(txs)
            parts = " + ".join(f"{c['label']} {c['bytes']}" for c in copies)
            per_cta = sum(c["bytes"] for c in copies)
            factor = rec.v_size if rec.cls in ("PipelineTmaUmma",) else 1
            delivered = per_cta * factor
            mc = [f"{c['label']} multicast to {c['multicast']} CTAs"
                  for c in copies if c["multicast"] and c["multicast"] > 1]
            arith = (f"expect_tx {tx} B per stage; TMA copies deliver {delivered} B "
                     f"({parts}{f'; x {factor} CTAs of the 2-CTA pair' if factor > 1 else ''}"
                     f"{'; ' + ', '.join(mc) if mc else ''}); declared tx_count {rec.tx_count}")
            if tx != delivered:
                verdict = ("the full barrier never completes: consumer_wait hangs" if tx >
                           delivered else "the phase completes before all bytes land: consumers "
                           "may read a partly written stage")
                out.append(_f("error", "expect_tx", key, f"full barrier of pipeline {key}: "
                              f"expect_tx {tx} B per stage, TMA copies deliver {delivered} B "
                              f"({parts}): {verdict}", arith, acq))
            elif any(not c["barrier_known"] for c in copies):
                out.append(_f("info", "expect_tx", key, "a TMA copy's barrier pointer was not "
                              "traced to a pipeline; attributed to the preceding "
                              "producer_acquire", arith, acq))
    return out


def _expected_empty(rec: PipelineRecord, block: int | None) -> tuple[int | None, str]:
    group = _group_threads(rec.consumer_group, block)
    if group is None:
        return None, "consumer group size is a run-time value"
    if rec.multicast_signaling:
        ms = rec.mcast_size
        if ms is None:
            return None, "multicast size unknown"
        return ms * (group // 32), (f"{ms} multicast CTAs x {group // 32} consumer warps "
                                    f"({group} threads / 32)")
    return group, f"consumer group {rec.consumer_group[0]} x {rec.consumer_group[1]}"


def _check_arrive_counts(proto: Protocol) -> list[Finding]:
    out = []
    block = proto.block_threads
    warps = block // 32 if block else None
    for key, rec in proto.pipelines.items():
        where = _Where(rec.file, rec.line)
        known = rec.cls in _KNOWN_GROUP_RULES
        full_want = _group_threads(rec.producer_group, block)
        if known and full_want is not None and rec.full_init is not None and \
                rec.full_init != full_want:
            out.append(_f("error", "arrive_count", key, f"full barriers of {key} are "
                          f"initialised with arrive count {rec.full_init}, the producer group "
                          f"declares {full_want}: " + ("the phase never completes (hang in "
                          "consumer_wait)" if rec.full_init > full_want else "the phase "
                          "completes before every producer arrived"),
                          f"mbarrier.init count {rec.full_init} != producer group "
                          f"{rec.producer_group[0]} x {rec.producer_group[1]} = {full_want}",
                          where))
        empty_want, how = _expected_empty(rec, block)
        if known and empty_want is not None and rec.empty_init is not None and \
                rec.empty_init != empty_want:
            out.append(_f("error", "arrive_count", key, f"empty barriers of {key} are "
                          f"initialised with arrive count {rec.empty_init}, the releasing "
                          f"consumers give {empty_want} arrivals per phase: " + (
                              "the phase never completes (hang in producer_acquire)"
                              if rec.empty_init > empty_want else "the phase completes before "
                              "every consumer released (stage refilled while still read)"),
                          f"mbarrier.init count {rec.empty_init} != {how} = {empty_want}",
                          where))
        if rec.cls == "PipelineTmaAsync" and rec.empty_init and warps:
            ms = rec.mcast_size or 1
            most = warps * ms
            if rec.empty_init > most:
                out.append(_f("error", "arrive_count", key, f"empty barriers of {key} expect "
                              f"{rec.empty_init} arrivals per phase, but consumer_release "
                              f"arrives from one lane per warp and multicast peer: at most "
                              f"{most} in a CTA of {warps} warps (a thread count given where "
                              "PipelineTmaAsync counts warps?)",
                              f"{rec.empty_init} > {warps} warps x {ms} multicast CTAs = {most}",
                              where))
        acquire_sites = {(e.file, e.line) for e in proto.of("producer_acquire", key)}
        if rec.full_op == "TmaLoad" and rec.full_init and acquire_sites and \
                rec.full_init > len(acquire_sites):
            out.append(_f("warning", "arrive_count", key, f"full barriers of {key} wait for "
                          f"{rec.full_init} arrive.expect_tx per phase; each producer_acquire "
                          f"issues one (elected thread) and {len(acquire_sites)} acquire "
                          "call site(s) were traced", f"init {rec.full_init} > "
                          f"{len(acquire_sites)} acquire site(s) x 1", where))
    return out


def _check_pairing(proto: Protocol) -> list[Finding]:
    out = []
    for key, rec in proto.pipelines.items():
        seq = [e for e in proto.events if e.pipeline == key and e.kind in
               ("consumer_wait", "consumer_release", "producer_acquire", "producer_commit")]
        waits = [e for e in seq if e.kind == "consumer_wait"]
        releases = [e for e in seq if e.kind == "consumer_release"]
        if waits and not releases:
            w = waits[0]
            out.append(_f("error", "release_pairing", key, f"consumer_wait at {w.where()} "
                          f"has no consumer_release of {key} on any path: the producer's "
                          "producer_acquire of that stage hangs", f"{len(waits)} consumer_wait "
                          "call(s), 0 consumer_release call(s)", w))
            continue
        if len(releases) < len(waits):
            out.append(_f("error", "release_pairing", key, f"{len(waits)} consumer_wait "
                          f"call(s) but {len(releases)} consumer_release call(s) of {key}",
                          f"waits {len(waits)} != releases {len(releases)}", releases[-1]))
        last_wait: Event | None = None
        prev: Event | None = None
        for e in seq:
            if e.kind == "consumer_wait":
                last_wait, prev = e, None
                continue
            if e.kind != "consumer_release":
                continue
            base = set(last_wait.conds) if last_wait else set()
            extra = [c for c in e.conds if c not in base]
            if extra or e.detail["conditional_arrives"]:
                cond = (extra or e.detail["conditional_arrives"][0])[0]
                twice = prev is not None and (prev.file, prev.line) == (e.file, e.line)
                effect = ("on the path where it holds the stage is released twice (the empty "
                          "barrier runs a phase ahead: the producer overwrites a stage still "
                          "being read)" if twice else "on the path where it fails the stage is "
                          "never released (producer_acquire of that stage hangs)")
                wait_at = f" at {last_wait.where()}" if last_wait else ""
                out.append(_f("error", "release_pairing", key, f"consumer_release at "
                              f"{e.where()} arrives on the empty barrier under a run-time "
                              f"condition ({cond}) that its consumer_wait{wait_at} is not "
                              f"under: {effect}",
                              f"wait under {sorted(base) or 'no condition'}; release under "
                              f"{list(e.conds) + [c for c in e.detail['conditional_arrives']]}"
                              f"{'; 1 unconditional + 1 conditional release' if twice else ''}",
                              e))
            elif prev is not None and (prev.file, prev.line) == (e.file, e.line):
                out.append(_f("error", "release_pairing", key, f"consumer_release at "
                              f"{e.where()} is performed twice for one consumer_wait: the empty "
                              "barrier runs a phase ahead and the producer overwrites a stage "
                              "still being read", "2 releases after 1 wait", e))
            if e.detail["arrives"] == 0 and not extra:
                out.append(_f("error", "release_pairing", key, f"consumer_release at "
                              f"{e.where()} traced no arrive on the empty barrier",
                              "0 arrives in the release", e))
            elif e.detail["arrives"] > 1:
                out.append(_f("error", "release_pairing", key, f"consumer_release at "
                              f"{e.where()} arrives {e.detail['arrives']} times on the empty "
                              "barrier", f"{e.detail['arrives']} arrives in one release", e))
            prev = e
        if len(releases) > len(waits) and waits and not any(
                f.check == "release_pairing" and f.pipeline == key for f in out):
            out.append(_f("warning", "release_pairing", key, f"{len(releases)} "
                          f"consumer_release call(s) but {len(waits)} consumer_wait call(s) "
                          f"of {key}", f"releases {len(releases)} > waits {len(waits)}",
                          releases[-1]))
        if rec.full_op == "AsyncThread":
            acq = [e for e in seq if e.kind == "producer_acquire"]
            com = [e for e in seq if e.kind == "producer_commit"]
            if len(com) < len(acq):
                out.append(_f("error", "commit_pairing", key, f"{len(acq)} producer_acquire "
                              f"call(s) but {len(com)} producer_commit call(s) of {key}: its "
                              "full barrier is arrived on by producer_commit",
                              f"acquires {len(acq)} != commits {len(com)}", acq[-1]))
    return out


def _check_producer_tail(proto: Protocol) -> list[Finding]:
    out = []
    clustered = (_prod(proto.launch.get("cluster")) or 1) > 1
    for key, rec in proto.pipelines.items():
        if rec.cls == "PipelineTmaStore":
            continue
        acq = proto.of("producer_acquire", key)
        if not acq or proto.of("producer_tail", key):
            continue
        multi = clustered or (rec.cluster_size or 1) > 1
        sev = "error" if multi else "warning"
        why = ("a consumer's remote arrive may target a CTA that has already exited"
               if multi else "single CTA: usually benign, but the last empty-barrier arrives "
               "are left pending when the producer exits")
        out.append(_f(sev, "producer_tail", key, f"{key} has producer_acquire at "
                      f"{acq[-1].where()} but no producer_tail: {why}",
                      f"cluster size {rec.cluster_size or 1}"
                      f"{' (launch cluster ' + str(proto.launch.get('cluster')) + ')' if clustered else ''}",
                      acq[-1]))
    return out


def _check_named_barriers(proto: Protocol) -> list[Finding]:
    out = []
    block = proto.block_threads
    uses: dict[int, set[int | None]] = {}
    for e in proto.events:
        if e.kind not in ("named_barrier_sync", "named_barrier_arrive"):
            continue
        bid, n = e.detail["barrier_id"], e.detail["threads"]
        if e.detail["all_threads"]:
            n = block
        if bid is None:
            continue
        uses.setdefault(bid, set()).add(n)
        if n is None:
            continue
        if n % 32:
            out.append(_f("error", "named_barrier", None, f"named barrier {bid} at {e.where()} "
                          f"counts {n} threads: bar.sync needs a multiple of the warp size",
                          f"{n} % 32 = {n % 32}", e))
        if block and n > block:
            out.append(_f("error", "named_barrier", None, f"named barrier {bid} at {e.where()} "
                          f"waits for {n} threads, the CTA has {block}: it never completes",
                          f"{n} > block {block}", e))
        if bid == 0 and block and n != block:
            out.append(_f("warning", "named_barrier", None, f"barrier 0 at {e.where()} with "
                          f"{n} threads: id 0 is sync_threads' barrier ({block} threads)",
                          f"{n} != {block}", e))
    for bid, counts in uses.items():
        if len(counts) > 1:
            out.append(_f("error", "named_barrier", None, f"named barrier id {bid} is used with "
                          f"different thread counts {sorted(c for c in counts if c)}: one of "
                          "the uses completes early or never", f"id {bid}: {sorted(map(str, counts))}"))
    return out


_SYNC_KINDS = ("sync_threads", "cluster_wait")
_USE_KINDS = ("producer_acquire", "consumer_wait", "consumer_release", "producer_tail",
              "tma_copy", "expect_tx", "mbarrier_arrive", "mbarrier_wait", "producer_commit")


def _check_init(proto: Protocol) -> list[Finding]:
    out = []
    ev = proto.events
    inits = [i for i, e in enumerate(ev) if e.kind in ("mbarrier_init", "mbarrier_array_init")]
    if not inits:
        return out
    clustered = (_prod(proto.launch.get("cluster")) or 1) > 1 or any(
        (p.cluster_size or 1) > 1 for p in proto.pipelines.values())
    uses_tma = bool(proto.of("tma_copy"))
    # Each init must be followed by a fence and a sync before the first use after it.
    checked_uses: set[int] = set()
    for i in inits:
        first = next((j for j in range(i + 1, len(ev)) if ev[j].kind in _USE_KINDS), None)
        if first is None or first in checked_uses:
            continue
        checked_uses.add(first)
        last_init = max(k for k in inits if k < first)
        between = [e.kind for e in ev[last_init + 1:first]]
        named_all = any(e.kind == "named_barrier_sync" and (e.detail["all_threads"] or (
            proto.block_threads and e.detail["threads"] == proto.block_threads))
            for e in ev[last_init + 1:first])
        init_ev, use = ev[last_init], ev[first]
        what = f"mbarrier.init at {init_ev.where()}" + (
            f" ({init_ev.pipeline})" if init_ev.pipeline else "")
        if "init_fence" not in between:
            sev = "error" if clustered or uses_tma else "warning"
            out.append(_f(sev, "init_fence", init_ev.pipeline, f"{what} is not followed by "
                          f"fence.mbarrier_init before its first use ({use.kind} at "
                          f"{use.where()}): " + ("the init may not be visible to the "
                          f"{'cluster / ' if clustered else ''}async proxy (TMA complete_tx)"
                          if clustered or uses_tma else "the init is not ordered before "
                          "other threads' barrier operations"),
                          f"events between init and first use: {between or 'none'}", init_ev))
        synced = ("cluster_wait" in between) if clustered else (
            "sync_threads" in between or "cluster_wait" in between or named_all)
        if not synced:
            need = "cluster arrive + wait" if clustered else "CTA sync (bar.sync 0)"
            out.append(_f("error", "init_sync", init_ev.pipeline, f"{what} is not followed by "
                          f"a {need} before its first use ({use.kind} at {use.where()}): other "
                          "warps may use the barrier before it is initialised",
                          f"events between init and first use: {between or 'none'}", init_ev))
    return out


def _check_phase_flip(proto: Protocol) -> list[Finding]:
    out = []
    for name, info in proto.state_types.items():
        if info.get("flips") is False:
            out.append(_f("error", "phase_flip", None, f"{info['role']} pipeline state "
                          f"{name.rpartition('.')[2]} does not flip its phase when its index "
                          "wraps: after one lap the waits test the wrong parity",
                          f"shadow advance({info['stages']}) from (index 0, phase 0) gave "
                          f"(index {info['after'][0]}, phase {info['after'][1]}), expected "
                          "(index 0, phase 1)", _Where(info.get("file"), info.get("line"))))
        elif info.get("error"):
            out.append(_f("info", "phase_flip", None, f"pipeline state {name} could not be "
                          f"shadowed ({info['error']}): phase flip not checked"))
    return out


def _check_warp_release(proto: Protocol) -> list[Finding]:
    """PipelineTmaAsync releases from one lane per warp: the warp's reads must be done first."""
    out = []
    for key, rec in proto.pipelines.items():
        if rec.cls != "PipelineTmaAsync":
            continue
        last_wait = None
        for i, e in enumerate(proto.events):
            if e.pipeline == key and e.kind == "consumer_wait":
                last_wait = i
            elif e.pipeline == key and e.kind == "consumer_release" and last_wait is not None:
                between = {x.kind for x in proto.events[last_wait + 1:i]}
                if not between & {"sync_warp", "sync_threads", "named_barrier_sync",
                                  "warpgroup_wait"}:
                    out.append(_f("info", "warp_release", key, f"consumer_release at "
                                  f"{e.where()} arrives from one lane per warp with no "
                                  "__syncwarp (or barrier) after consumer_wait at "
                                  f"{proto.events[last_wait].where()}: other lanes may still "
                                  "read the stage when the producer refills it",
                                  "no warp-level sync between wait and release", e))
                last_wait = None
    return out


# ---- the child: compile one scenario under record() ------------------------------------------

def compile_and_check(sc: dict[str, Any], dump_dir: str | None = None) -> dict[str, Any]:
    """Compile the scenario's kernel (fake args) inside record(); protocol + findings as JSON."""
    import cutlass.cute as cute
    from cutlass.base_dsl.compiler import DumpDir

    from cutedebug import kernel_api
    from cutedebug.instrument import faults

    where = f"{sc['kernel']['file']}:{sc['kernel']['entry']}"
    cls = kernel_api.load_entry(sc["kernel"]["file"], sc["kernel"]["entry"])
    given = dict(sc.get("params") or {})
    fault, fault_args = sc.get("fault"), sc.get("fault_args") or {}
    patch_fault = fault
    if fault and (fault not in faults.FAULTS or faults.FAULTS[fault].kind == "switch"):
        given[fault] = True
        patch_fault = None
    params = kernel_api.resolve_params(cls, given, where)
    kernel = cls(**params)
    archs = getattr(cls, "ARCHS", None) if sc.get("arch_from_kernel") else None
    target = (archs or sc.get("archs") or ["sm_90a"])[0]
    with record() as proto, (faults.inject(patch_fault, fault_args) if patch_fault
                             else contextlib.nullcontext()):
        cute.compile[cute.GPUArch(target), DumpDir(dump_dir or tempfile.gettempdir())](
            kernel, *kernel.fake_args())
    return {"protocol": proto.to_json(),
            "findings": static_findings(proto), "arch": target, "params": params}


def _child(argv: list[str]) -> int:
    req = json.loads(Path(argv[0]).read_text())
    try:
        out = compile_and_check(req["scenario"], req.get("dump_dir"))
    except Exception as e:
        import traceback

        out = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    Path(req["out"]).write_text(json.dumps(out, default=str))
    return 0


def render(findings: list[Finding], title: str = "") -> str:
    lines = [title] if title else []
    if not findings:
        lines.append("  no findings")
        return "\n".join(lines)
    rows = [(f.severity, f.check, f.where(), f.pipeline or "-", f.message) for f in findings]
    head = ("severity", "check", "where", "pipeline")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(4)]
    lines.append("  " + "  ".join(h.ljust(w) for h, w in zip(head, widths)) + "  message")
    for f, r in zip(findings, rows):
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
        if f.arithmetic:
            lines.append("  " + " " * (sum(widths) + 8) + "  = " + f.arithmetic)
    return "\n".join(lines)


if __name__ == "__main__":
    from cutedebug.analyses import (
        lint as _module,  # record() must run as cutedebug.analyses.lint, not __main__
    )

    sys.exit(_module._child(sys.argv[1:]))
