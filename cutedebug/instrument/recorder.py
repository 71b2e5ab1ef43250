"""The lint recorder: the barrier protocol of a kernel, recorded while it is traced.

``record()`` registers with the instrumentation layer (observer "recorder": inside faults, so
it sees what a fault makes the kernel do) for the duration of one trace and fills a
``Protocol``: each pipeline (keyed by the layer's identity: creation order, class, the kernel's
create() line; class, stages, declared tx bytes and groups, the arrive counts actually written
by mbarrier.init, cluster and multicast shape), the launch shape, every pipeline op per role in
trace order with the kernel's file:line (and whether it sits in a dynamic loop), each TMA copy
and the full barrier it completes on with its byte count, expect_tx bytes, named barriers,
mbarrier init / init fence / syncs. ``analyses/lint.check(protocol)`` turns it into findings.

    with record() as proto, faults.inject(name, args):
        compiled = cute.compile(kernel, *args)

A loop body is traced once, so the protocol describes one iteration of each loop: the copies
traced between two producer_acquire calls of a pipeline are one stage's copies.

This module imports cutlass only inside ``record()``.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from cutedebug.instrument import frames, layer
from cutedebug.instrument.layer import Call, PipelineInfo, is_pipeline_code
from cutedebug.instrument.protocol import (  # noqa: F401  (part of this interface)
    Event,
    PipelineRecord,
    Protocol,
    _prod,
    _static,
    _static_tuple,
)

PIPELINE_OPS = (
    "producer_acquire",
    "producer_commit",
    "consumer_wait",
    "consumer_release",
    "producer_tail",
    "producer_get_barrier",
)
# Functions the DSL preprocessor synthesizes for dynamic loop bodies.
_LOOP = re.compile(r"^(loop_body|while_region)_\d+$")


def _group(g: Any) -> tuple[str, Any] | None:
    if g is None:
        return None
    agent = getattr(getattr(g, "agent", None), "name", None)
    return (agent, _static(getattr(g, "size", None)))


def pipeline_key(info: PipelineInfo) -> str:
    """``Class#index@file:line``: one key per created pipeline (three pipelines created
    through one wrapper line are three keys)."""
    return f"{info.cls}#{info.index}@{os.path.basename(info.file or '?')}:{info.line}"


def _in_loop() -> bool:
    """A dynamic loop body of kernel code is on the stack."""
    f = sys._getframe(2)
    while f is not None:
        if _LOOP.match(f.f_code.co_name) and frames.is_user_frame(f):
            return True
        f = f.f_back
    return False


# ---- recorder --------------------------------------------------------------------------------


class _Recorder:
    def __init__(self) -> None:
        self.proto = Protocol()
        self.stack: list[Event] = []  # open pipeline ops (outermost first)
        self.conds: list[str] = []  # open non-library if_generate conditions
        self.ptr_tags: dict[int, str] = {}
        self.tma_multicast: dict[int, int] = {}  # id(TMA op) -> num_multicast
        self.keep: list[Any] = []  # objects whose id() is a key above
        self.keys: dict[int, str] = {}  # pipeline index -> its key (fixed at first sight)

    # events
    def add(
        self, kind: str, pipeline: str | None = None, call: Call | None = None, **detail: Any
    ) -> Event:
        via = None
        if call is not None:
            where = call.site
            file, line, func, via = where.file, where.line, where.function, where.via
        else:
            file, line, func = frames.kernel_frame()
        ev = Event(
            len(self.proto.events),
            kind,
            pipeline,
            file,
            line,
            func,
            tuple(self.conds),
            detail,
            _in_loop(),
            via,
        )
        current = layer.current()
        dead = call.dead if call is not None else bool(current and current.dead)
        if not dead:  # a branch a static `if` never takes never runs: not the protocol
            self.proto.events.append(ev)
        return ev

    def open_op(self, kinds: tuple[str, ...]) -> Event | None:
        for ev in reversed(self.stack):
            if ev.kind in kinds:
                return ev
        return None

    # pipelines
    def record_of(self, info: PipelineInfo) -> PipelineRecord:
        key = self.keys.setdefault(info.index, pipeline_key(info))
        rec = self.proto.pipelines.get(key)
        if rec is None:
            kw = info.kwargs
            layout = kw.get("cta_layout_vmnk")
            rec = PipelineRecord(
                key,
                info.cls,
                info.file,
                info.line,
                stages=_static(kw.get("num_stages")),
                tx_count=_static(kw.get("tx_count")),
                producer_group=_group(kw.get("producer_group")),
                consumer_group=_group(kw.get("consumer_group")),
                cluster_shape=_static_tuple(getattr(layout, "shape", None))
                if layout is not None
                else None,
                mcast_mode_mn=tuple(kw.get("mcast_mode_mn") or (1, 1)),
                multicast_signaling=bool(kw.get("enable_multicast_signaling", False)),
                defer_sync=bool(kw.get("defer_sync", False)),
                index=info.index,
                via=info.via,
            )
            self.proto.pipelines[key] = rec
        return rec

    def pipeline_of(self, call: Call, pipe: Any) -> str | None:
        info = call.layer.pipeline_of(pipe)
        if info is None:
            return None
        rec = self.record_of(info)
        rec.cls = info.cls  # known once create() returned
        rec.noop_ops = dict(info.noop_ops)
        return rec.key

    def on_array_init(self, call: Call) -> Any:
        array, tag = call.self_obj, call.extra.get("array_tag")
        out = call.proceed()
        count = _static(getattr(array, "arrive_count", None))
        op = getattr(getattr(array, "op_type", None), "name", None)
        if tag is None or tag.pipeline is None:
            self.add("mbarrier_array_init", call=call, count=count, stages=array.num_stages)
            return out
        rec = self.record_of(tag.pipeline)
        if rec.stages is None:  # a subclass's create() with its own signature
            rec.stages = _static(getattr(array, "num_stages", None))
        group = _group(getattr(array, "cg", None))
        if tag.side == "full" and rec.producer_group is None:
            rec.producer_group = group
        elif tag.side == "empty" and rec.consumer_group is None:
            rec.consumer_group = group
        if tag.side == "full":
            rec.full_init, rec.full_op = count, op
        else:
            rec.empty_init, rec.empty_op = count, op
        self.add(
            "mbarrier_array_init",
            rec.key,
            call=call,
            barrier=tag.side or "empty",
            count=count,
            stages=array.num_stages,
        )
        return out

    def on_state(self, state: Any, role: str, call: Call) -> None:
        cls = type(state)
        name = f"{cls.__module__}.{cls.__qualname__}"
        lineage = call.layer.lineage_of(state)
        key = f"{name}[{role}]"
        if key in self.proto.state_types:
            return
        stages = _static(getattr(state, "_stages", None))
        start = 1 if role == "producer" else 0
        where = call.site
        info: dict[str, Any] = {
            "role": role,
            "stages": stages,
            "flips": None,
            "file": where.file,
            "line": where.line,
            "class": name,
            "lineage": lineage.id if lineage is not None else None,
        }
        if stages and stages > 1:
            try:  # a Python-int shadow: advance(stages) is plain arithmetic, emits no IR
                shadow = cls(stages, 0, 0, start)
                shadow_lineage = call.layer.lineage_of(shadow)
                if shadow_lineage is not None:
                    shadow_lineage.notes["shadow"] = True
                # as the kernel's own advance would run: a fault that removes the flip of
                # this role's states removes it here too
                call.layer.call_as_kernel(shadow.advance, stages)
                phase = _static(getattr(shadow, "_phase", None))
                index = _static(getattr(shadow, "_index", None))
                if phase is not None and index is not None:
                    info.update(flips=phase != start, after=[index, phase], start=start)
            except Exception as e:  # a subclass with another constructor: say so
                info["error"] = f"{type(e).__name__}: {e}"
        self.proto.state_types[key] = info


def _ops(rec: _Recorder) -> dict[str, Callable[[Call], Any]]:
    def pipeline_op(call: Call) -> Any:
        op = call.name
        if rec.stack and rec.stack[-1].kind == op:  # a subclass's super()
            return call.proceed()
        key = rec.pipeline_of(call, call.self_obj)
        if op == "producer_get_barrier":
            ptr = call.proceed()
            rec.ptr_tags[id(ptr)] = key
            if key in rec.proto.pipelines:
                rec.proto.pipelines[key].barrier_pointers += 1
            rec.keep.append(ptr)
            return ptr
        state = call.state()
        if state is not None and op in ("producer_acquire", "consumer_wait"):
            rec.on_state(state, "producer" if op == "producer_acquire" else "consumer", call)
        ev = rec.add(
            op,
            key,
            call=call,
            arrives=0,
            conditional_arrives=[],
            copies=[],
            expect_tx=[],
            waits=0,
            syncs_before=[],
            method=f"{type(call.self_obj).__name__}.{op}",
            owner=type(call.self_obj).__module__,  # cutlass's own class, or a library's
            # the stage when the kernel names it statically (FA-4's *_w_index(stage) in an
            # unrolled loop over stages): releases of two stages are not one stage twice
            stage=_static(getattr(state, "index", None)) if state is not None else None,
        )
        rec.stack.append(ev)
        try:
            return call.proceed()
        finally:
            rec.stack.pop()

    def arrive(call: Call) -> Any:
        tag = call.layer.array_tag(call.self_obj)
        side = tag.side if tag is not None else None
        if side == "full":
            commit = rec.open_op(("producer_commit",))
            if commit is not None:
                commit.detail["arrives"] += 1
        release = rec.open_op(("consumer_release",))
        if release is not None and side != "full":
            release.detail["arrives"] += 1
            extra = [c for c in rec.conds if c not in release.conds]
            if extra:
                release.detail["conditional_arrives"].append(extra)
        return call.proceed()

    return {
        **{op: pipeline_op for op in PIPELINE_OPS},
        "array.arrive": arrive,
        "array.__init__": rec.on_array_init,
    }


def _arch(rec: _Recorder) -> dict[str, Callable[[Call], Any]]:
    def in_create(call: Call) -> bool:
        return any(o.op == "create" for o in call.layer.open)

    def observe(before: Callable[[Call], None]) -> Callable[[Call], Any]:
        def handler(call: Call) -> Any:
            before(call)
            return call.proceed()

        return handler

    def init(call: Call) -> None:
        if not rec.open_op(PIPELINE_OPS) and not in_create(call):
            rec.add("mbarrier_init", call=call, count=_static(call.arg(1, "cnt")))

    def fence(call: Call) -> None:
        rec.add("init_fence", call=call)

    def expect_tx(call: Call) -> None:
        nbytes = _static(call.arg(1, "bytes"))
        op = rec.open_op(("producer_acquire",))
        if op is not None:
            op.detail["expect_tx"].append(nbytes)
        else:
            rec.add(
                "expect_tx",
                rec.ptr_tags.get(id(call.arg(0, "mbar_ptr"))),
                call=call,
                bytes=nbytes,
                arrives=call.name == "mbarrier_arrive_and_expect_tx",  # the fused arrive
            )

    def raw(kind: str) -> Callable[[Call], None]:
        def before(call: Call) -> None:
            if not rec.stack and not in_create(call):
                # an arrive on a peer CTA's barrier (a cluster handshake, e.g. 2-CTA TMEM dealloc)
                peer = (
                    call.arg(1, "peer_cta_rank_in_cluster") if kind == "mbarrier_arrive" else None
                )
                rec.add(kind, call=call, **({"remote": True} if peer is not None else {}))

        return before

    def sync(kind: str, **detail: Any) -> Callable[[Call], None]:
        def before(call: Call) -> None:
            rec.add(kind, call=call, **detail)
            # a sync inside a release / commit before its arrive (a library's elected-lane
            # release syncs the warp first: the other lanes' accesses come before the arrive)
            op = rec.open_op(("consumer_release", "producer_commit"))
            if op is not None and not op.detail.get("arrives"):
                op.detail.setdefault("syncs_before", []).append(kind)

        return before

    def named(kind: str) -> Callable[[Call], None]:
        def before(call: Call) -> None:
            bid, n = call.kwargs.get("barrier_id"), call.kwargs.get("number_of_threads")
            rec.add(
                kind,
                call=call,
                barrier_id=_static(bid) if bid is not None else 0,
                threads=_static(n),
                all_threads=n is None,
            )

        return before

    table = {
        "mbarrier_init": init,
        "mbarrier_init_fence": fence,
        "mbarrier_arrive_and_expect_tx": expect_tx,
        "mbarrier_expect_tx": expect_tx,
        "mbarrier_arrive": raw("mbarrier_arrive"),
        "mbarrier_wait": raw("mbarrier_wait"),
        "mbarrier_try_wait": raw("mbarrier_wait"),
        "sync_threads": sync("sync_threads"),
        "sync_warp": sync("sync_warp"),
        "cluster_arrive": sync("cluster_arrive"),
        "cluster_arrive_relaxed": sync("cluster_arrive", relaxed=True),
        "cluster_wait": sync("cluster_wait"),
        "barrier": named("named_barrier_sync"),
        "barrier_arrive": named("named_barrier_arrive"),
        "fence_view_async_shared": sync("fence_async_shared"),
        "wait_group": sync("warpgroup_wait"),
    }
    return {name: observe(before) for name, before in table.items()}


_COPY_ARG = re.compile(r"copy\(\s*([A-Za-z_][\w.]*)")


def _copies(rec: _Recorder) -> dict[str, Callable[[Call], Any]]:
    def make_tiled_tma_atom(call: Call) -> Any:
        out = call.proceed()
        op = call.arg(0, "op")
        rec.tma_multicast[id(op)] = _static(call.arg(4, "num_multicast", 1)) or 1
        rec.keep.append(op)
        return out

    def copy(call: Call) -> Any:
        atom, dst = call.arg(0, "atom"), call.arg(2, "dst")
        op = getattr(atom, "op", None)
        name = type(op).__name__
        # a TMA tensor copy, or a plain bulk copy (CopyBulkG2SOp: cp.async.bulk of a
        # contiguous span, e.g. a row statistic beside a TMA tile) completing on an mbarrier
        if "G2S" in name and (
            "Tma" in name
            or "Bulk" in name
            or "tma_bar_ptr" in call.kwargs
            or "mbar_ptr" in call.kwargs
        ):
            _on_tma_copy(rec, call, op, name, dst, call.kwargs)
        return call.proceed()

    return {"make_tiled_tma_atom": make_tiled_tma_atom, "copy": copy}


def _on_tma_copy(
    rec: _Recorder, call: Call, op: Any, name: str, dst: Any, kw: dict[str, Any]
) -> None:
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
    ptr = kw.get("tma_bar_ptr", kw.get("mbar_ptr"))
    key = rec.ptr_tags.get(id(ptr)) if ptr is not None else None
    acquire = None
    for ev in reversed(rec.proto.events):
        if ev.kind == "producer_acquire" and (key is None or ev.pipeline == key):
            acquire = ev
            break
    where = call.site
    file, line = where.file, where.line
    text = linecache.getline(file, line) if file else ""
    m = _COPY_ARG.search(text)
    label = m.group(1).rpartition(".")[2] if m else f"copy@{line}"
    label = label.removeprefix("tma_atom_").removeprefix("tma_") or label
    copy = {
        "label": label,
        "op": name,
        "elems": elems,
        "bits": width,
        "issued_bytes": issued,
        "multicast": mcast,
        # The partitioned smem view of a multicast copy spans the whole tile that lands in
        # this CTA (its slice plus the peers'), so its size is already the landing bytes.
        "bytes": issued,
        "file": file,
        "line": line,
        "barrier_known": key is not None,
    }
    if acquire is not None:
        acquire.detail["copies"].append(copy)
    rec.add("tma_copy", key or (acquire.pipeline if acquire else None), call=call, **copy)


def _library_condition() -> tuple[bool, str]:
    """Who called if_generate: the DSL, the stdlib or a pipeline's own code (a library's
    pipeline subclass included) is library; kernel code and a fault's handler are not (a
    fault's condition around a release is the protocol's). The layer's frames are skipped."""
    f = sys._getframe(1)
    own = (
        os.path.abspath(__file__),
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "layer.py"),
    )
    while f is not None and os.path.abspath(f.f_code.co_filename) in own:
        f = f.f_back
    if f is None:
        return True, "?"
    fn = f.f_code.co_filename
    path = os.path.abspath(fn)
    if path.startswith(frames.PACKAGE_DIR):  # a fault's run-time test: named as such, not by
        return False, "injected-fault"  # a line of cutedebug's that the user never wrote
    in_dsl = frames.is_library(fn)
    return (in_dsl or is_pipeline_code(f), f"{os.path.basename(fn)}:{f.f_lineno}")


def _conditions(rec: _Recorder) -> dict[str, Callable[[Call], Any]]:
    def if_generate(call: Call) -> Any:
        library, site = _library_condition()
        if library:
            return call.proceed()

        def guard(body: Callable, label: str) -> Callable:
            def run(*args):
                rec.conds.append(label)
                try:
                    return body(*args)
                finally:
                    rec.conds.pop()

            return run

        then_body = call.arg(1, "then_body")
        else_body = call.arg(2, "else_body")
        call.set_arg(1, "then_body", guard(then_body, f"if@{site}"))
        if else_body is not None:
            call.set_arg(2, "else_body", guard(else_body, f"else@{site}"))
        return call.proceed()

    def launch(call: Call) -> Any:
        entry = {
            k: _static_tuple(call.kwargs.get(k))
            for k in ("grid", "block", "cluster")
            if call.kwargs.get(k) is not None
        }
        where = call.layer.kernel_site()
        entry.update(
            kernel=getattr(call.self_obj.funcBody, "__name__", "?"),
            file=where.file,
            line=where.line,
        )
        if not rec.proto.launch:
            rec.proto.launch = entry
        else:
            rec.proto.notes.append(f"more than one launch traced; checks use the first: {entry}")
        return call.proceed()

    return {"if_generate": if_generate, "launch": launch}


@contextlib.contextmanager
def record() -> Iterator[Protocol]:
    """Record the barrier protocol of every kernel traced inside; the layer's patches are
    restored on exit."""
    from cutedebug.instrument import layer

    rec = _Recorder()
    handlers = {**_ops(rec), **_arch(rec), **_copies(rec), **_conditions(rec)}
    with layer.observe("recorder", handlers):
        yield rec.proto
