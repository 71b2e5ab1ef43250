"""Checkpoints for printf-bisection of hangs: user checkpoints and trace-time checkpoint sites.

``cutedebug.checkpoint("name")`` is for users to sprinkle in their ``@cute.kernel`` code. It
emits nothing (not one instruction) unless a bisection session traces the kernel and enabled
exactly that checkpoint.

``session(spec)`` is the trace-time side, an observer of the instrumentation layer (outermost:
it marks what the faulted op did). While it is active, every one of these calls made by the
kernel is a *checkpoint site*, numbered in trace order: pipeline ops (producer_acquire /
_commit, consumer_wait / _release, producer_tail of any PipelineAsync subclass); raw mbarrier
ops the kernel calls (init / arrive / arrive_and_expect_tx / expect_tx / wait as ``raw_wait`` /
try_wait); named barriers (``barrier``, ``barrier_arrive``, ``sync_threads``; a pipeline's
create() sync is one site, detail "pipeline init sync"); user checkpoints (op ``checkpoint``).

Ops called from inside another site's op (producer_tail's acquires, MbarrierArray internals,
probes' bounded waits) are not sites. The trace runs the kernel's Python once, in program
order, both arms of every dynamic ``if`` included, so site ids are program order.

Exactly one site is *enabled* (``spec["site"]``). After its op completes, the lowest active
lane of each warp that executes it bumps a per-(CTA, warp) hit counter in host-mapped memory
(``ld.relaxed.sys`` + ``st.relaxed.sys``: the host reads it while the kernel is stuck) and, on
its warp's first hit in CTA 0, prints one ``cutedebug: CHECKPOINT ...`` line (visible only if
the kernel finishes). A thread of the worker streams the counters as ``checkpoint`` events.

Roles: each site gets the warp role of the function it runs in. The user-frame stacks of all
sites share a common prefix (down to the kernel entry); the first frame below it is the role
function (``load``, ``compute``, ``mma_epilogue``). A role function is named by the first
pipeline role it plays (producer_* / consumer_* ops: ``load`` -> producer, a mainloop
consumer that also feeds a TMA-store pipeline -> consumer), else by its function name; two
functions that would share a name keep their function names. A function left with its name
that the kernel calls in a warp branch (a dynamic ``if`` arm of the body) takes the pipeline
role that branch plays first, when no other branch plays it first (checkpoint_branches.py:
quack's GEMM epilogue, called after the mainloop in the consumer warps' branch, is consumer). Sites directly in the common
frame are shared (role ``all``), unless they sit in a dynamic ``if`` arm of it: then they
take the role of the role function called in the same arm (``if warp == MMA:
tmem.wait_for_alloc(); self.mma(...)``), or ``<function>@<line of the if>`` when the arm
calls none. ``checkpoint("name", role=...)`` overrides.

Buffer (little endian, ``buffer_nbytes(cfg)``; zeroed, pinned, its device address baked into
the kernel as a constant like the probes buffer):

    header  64 B   u32 magic "CDCK" | u32 version | i32 enabled site (-1: none) |
                   u32 max_ctas | u32 max_warps (written by the host)
    slots   max_ctas * max_warps u32 hit counters, slot = (linear block % max_ctas) *
                   max_warps + warp % max_warps (CTAs beyond max_ctas share slots)

This module imports neither cutlass nor torch at import time (the parent decodes with it).
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import os
import re
import struct
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cutedebug import records
from cutedebug.instrument import frames
from cutedebug.instrument.checkpoint_branches import names_by_warp_branch
from cutedebug.instrument.probes import device_ids

MAGIC = 0x4B434443  # b"CDCK" read as a little-endian u32
VERSION = 1
HEADER_FMT = "<IIiII"
HEADER_BYTES = 64
SLOT_BYTES = 4
BANNER = "cutedebug: CHECKPOINT"
FAKE_ADDR = 0x7F0000000000  # compile-only: the address only has to be a plausible constant

PIPELINE_OPS = {
    "producer_acquire": ("producer", "empty"),
    "producer_commit": ("producer", "full"),
    "consumer_wait": ("consumer", "full"),
    "consumer_release": ("consumer", "empty"),
    "producer_tail": ("producer", "empty"),
}
MBARRIER_OPS = {
    "mbarrier_init": "mbarrier_init",
    "mbarrier_arrive": "mbarrier_arrive",
    "mbarrier_arrive_and_expect_tx": "mbarrier_arrive_and_expect_tx",
    "mbarrier_expect_tx": "mbarrier_expect_tx",
    "mbarrier_wait": "raw_wait",
    "mbarrier_try_wait": "mbarrier_try_wait",
}
NAMED_BARRIER_OPS = {
    "barrier": "named_barrier",
    "sync_threads": "named_barrier",
    "barrier_arrive": "named_barrier_arrive",
}
_INIT_FUNCTIONS = frozenset({"create", "pipeline_init_wait", "pipeline_init_arrive"})
# Functions the DSL preprocessor synthesizes for loop bodies and if/while arms.
_SYNTH = re.compile(
    r"^(loop_body|while_region|while_before_block|while_after_block|if_region|"
    r"then_block|else_block|elif_region|ifexp_then_block|ifexp_else_block)_\d+$"
)
_LOOP = re.compile(r"^(loop_body|while_region)_\d+$")
_ARM = re.compile(r"^(then_block|else_block|elif_region|ifexp_then_block|ifexp_else_block)_\d+$")


@dataclass
class MarkConfig:
    max_ctas: int = 1024
    max_warps: int = 32


def slots_offset(cfg: MarkConfig) -> int:
    return HEADER_BYTES


def buffer_nbytes(cfg: MarkConfig) -> int:
    return HEADER_BYTES + cfg.max_ctas * cfg.max_warps * SLOT_BYTES


def init_buffer(buf: Any, cfg: MarkConfig, site: int | None) -> None:
    mv = memoryview(buf).cast("B")
    struct.pack_into(
        HEADER_FMT, mv, 0, MAGIC, VERSION, -1 if site is None else site, cfg.max_ctas, cfg.max_warps
    )


def decode(buf: bytes | memoryview, cfg: MarkConfig, limit: int = 64) -> dict[str, Any]:
    """Hit counters of a marks buffer: total hits, warps that hit, the first ``limit`` of them
    as [cta, warp, hits] (cta is the slot's CTA: linear block id mod max_ctas)."""
    mv = memoryview(buf).cast("B")
    if len(mv) < buffer_nbytes(cfg):
        raise ValueError(f"marks buffer has {len(mv)} bytes, layout needs {buffer_nbytes(cfg)}")
    magic, version, site, _, _ = struct.unpack_from(HEADER_FMT, mv, 0)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"marks buffer header {magic:#x} v{version} is not {MAGIC:#x} v{VERSION}")
    n = cfg.max_ctas * cfg.max_warps
    words = struct.unpack_from(f"<{n}I", mv, slots_offset(cfg))
    hit = [(i // cfg.max_warps, i % cfg.max_warps, w) for i, w in enumerate(words) if w]
    return {
        "site": None if site < 0 else site,
        "hits": sum(w for _, _, w in hit),
        "n_warps": len(hit),
        "warps": [list(h) for h in hit[:limit]],
        "ctas": len({c for c, _, _ in hit}),
    }


# ---- Sites ----------------------------------------------------------------------------------


@dataclass
class CheckpointSite(records.Record):
    """One traced call that bisection can enable. ``id`` is its trace (program) order."""

    id: int
    op: str  # pipeline op | raw_wait | mbarrier_* | named_barrier[_arrive] | checkpoint
    kind: str  # pipeline | mbarrier | named_barrier | checkpoint
    barrier: str = ""  # full | empty | named | "" (raw mbarrier, checkpoint)
    role: str = "all"
    name: str = ""  # user checkpoint name
    detail: str = ""
    file: str = ""
    line: int = 0
    function: str = ""
    code: str = ""
    loops: list[list[Any]] = field(default_factory=list)  # enclosing dynamic loops [file, line]
    explicit_role: str | None = None
    frames: list[list[Any]] = records.transient(default_factory=list)  # [file, func], outer first
    arms: list[list[Any]] = records.transient(default_factory=list)  # dynamic if arms, outer first

    @property
    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    def describe(self) -> str:
        what = f"checkpoint {self.name!r}" if self.kind == "checkpoint" else self.op
        bar = f" {self.barrier}" if self.barrier and self.kind == "pipeline" else ""
        return f"#{self.id} {what}{bar} ({self.where})"


def assign_roles(sites: list[CheckpointSite]) -> None:
    """Fill ``role`` of every site (see the module docstring for the rule)."""
    stacks = [[tuple(f) for f in s.frames] for s in sites]
    common = 0
    if stacks:
        shortest = min(len(st) for st in stacks)
        while common < shortest and len({st[common] for st in stacks}) == 1:
            common += 1
    groups = [st[common] if len(st) > common else None for st in stacks]
    pipeline_roles: dict[tuple, list[str]] = {}
    for s, g in zip(sites, groups):
        if g is not None:
            roles = pipeline_roles.setdefault(g, [])
            if s.kind == "pipeline" and PIPELINE_OPS[s.op][0] not in roles:
                roles.append(PIPELINE_OPS[s.op][0])
    # A role function is named by the first pipeline role it plays (a mainloop consumer that
    # also produces into a TMA-store pipeline stays "consumer"); functions that would share a
    # name, or play no pipeline role, are named by their function name.
    names = {g: (roles[0] if roles else g[1]) for g, roles in pipeline_roles.items()}
    taken: dict[str, int] = {}
    for name in names.values():
        taken[name] = taken.get(name, 0) + 1
    names = {g: (g[1] if taken[n] > 1 else n) for g, n in names.items()}
    # Sites written inline in the kernel body inside a dynamic `if` arm (`if warp == MMA:
    # tmem.wait_for_alloc(); self.mma(...)`) belong to the role function called in that arm.
    owner = common - 1

    def body_arms(s: CheckpointSite) -> list[tuple]:
        return [tuple(a[:3]) for a in s.arms if a[3] == owner]

    names = names_by_warp_branch(sites, groups, names, body_arms, lambda op: PIPELINE_OPS[op][0])
    arm_names: dict[tuple, set[str]] = {}
    for s, g in zip(sites, groups):
        if g is not None:
            for a in body_arms(s):
                arm_names.setdefault(a, set()).add(names[g])
    for s, g in zip(sites, groups):
        if s.explicit_role:
            s.role = s.explicit_role
        elif g is not None:
            s.role = names[g]
        else:
            arms = body_arms(s)
            named = [
                next(iter(arm_names[a])) for a in reversed(arms) if len(arm_names.get(a, ())) == 1
            ]
            s.role = named[0] if named else f"{s.function}@{arms[-1][2]}" if arms else "all"


def roles_of(sites: list[CheckpointSite]) -> dict[str, list[int]]:
    """Role -> its site ids in program order (shared ``all`` sites included in every role)."""
    named = list(dict.fromkeys(s.role for s in sites if s.role != "all"))
    if not named:
        return {"all": [s.id for s in sites]} if sites else {}
    return {r: [s.id for s in sites if s.role in (r, "all")] for r in named}


# ---- Frames ---------------------------------------------------------------------------------


def _module_of(frame: Any) -> str:
    return frame.f_globals.get("__name__", "") or ""


_OWN = ("cutedebug.instrument.layer", "cutedebug.instrument.checkpoint", "cutlass._mlir_helpers")


def _caller_kind(skip: int) -> str:
    """Who called the intercepted op: "user" (kernel code, installed libraries included),
    "init" (a pipeline's create / init sync in the DSL) or "pipeline" (other cutlass.pipeline
    code). The layer's and this module's own frames are skipped."""
    f = sys._getframe(skip + 1)
    kind = None
    while f is not None:
        mod = _module_of(f)
        if mod.startswith(_OWN):
            pass
        elif mod.startswith("cutlass.pipeline"):
            if f.f_code.co_name in _INIT_FUNCTIONS:
                return "init"
            kind = kind or "pipeline"
        elif frames.is_user_frame(f):
            return kind or "user"
        f = f.f_back
    return kind or "user"


def _stack_fields(skip: int) -> dict[str, Any]:
    """file/line/function/code of the innermost user frame; role frames, dynamic loops and the
    dynamic ``if`` arms the site is traced in."""
    from cutedebug.instrument.layer import is_pipeline_code

    f = sys._getframe(skip + 1)
    user = []
    while f is not None:  # kernel code; a library's pipeline wrapper is not the site
        if frames.is_user_frame(f) and not is_pipeline_code(f):
            user.append(f)
        f = f.f_back
    if not user:
        return {}
    inner = user[0]
    user.reverse()  # outer -> inner
    fn_frames: list[list[Any]] = []
    loops: list[list[Any]] = []
    arms: list[list[Any]] = []  # [file, arm function, line of its `if`, owner frame index]
    for i, fr in enumerate(user):
        name = fr.f_code.co_name
        if not _SYNTH.match(name):
            fn_frames.append([fr.f_code.co_filename, name])
        elif i > 0:
            parent = [user[i - 1].f_code.co_filename, user[i - 1].f_lineno]
            if _LOOP.match(name):
                loops.append(parent)
            elif _ARM.match(name):
                arms.append([*parent[:1], name, parent[1], len(fn_frames) - 1])
    fn = inner.f_code.co_filename
    return {
        "file": fn,
        "line": inner.f_lineno,
        "function": fn_frames[-1][1] if fn_frames else inner.f_code.co_name,
        "code": linecache.getline(fn, inner.f_lineno).strip(),
        "loops": loops,
        "frames": fn_frames,
        "arms": arms,
    }


def _static(v: Any) -> Any:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


# ---- Device side ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    addr: int
    max_ctas: int
    max_warps: int
    slots_off: int


@functools.cache
def _device() -> Any:
    """Build the @cute.jit mark helper once (cutlass is imported only here)."""
    import cutlass
    from cutlass import Int32, Int64, Uint32, cute

    gmem = cute.AddressSpace.gmem

    ids = device_ids()

    @cute.jit
    def mark(plan: cutlass.Constexpr, banner: cutlass.Constexpr):
        """Lowest active lane: hits = ld.relaxed.sys(slot) + 1; st.relaxed.sys(slot, hits);
        printf on the warp's first hit in CTA 0."""
        if ids.lowest_active_lane():
            bx, by, bz = cute.arch.block_idx()
            warp = ids.warp_id()
            linear = Uint32(ids.linear_block_id())
            slot = ids.warp_slot(linear, warp, plan.max_ctas, plan.max_warps)
            ptr = cute.make_ptr(
                Uint32, Int64(plan.addr + plan.slots_off) + Int64(slot) * 4, gmem, assumed_align=4
            )
            hits = cute.arch.load(ptr, Uint32, sem="relaxed", scope="sys") + Uint32(1)
            cute.arch.store(ptr, hits, sem="relaxed", scope="sys")
            if hits == Uint32(1) and linear == Uint32(0):
                cute.printf(
                    banner + " block=(%d,%d,%d) warp=%d",
                    Int32(bx),
                    Int32(by),
                    Int32(bz),
                    Int32(warp),
                )

    return mark


def _banner(site: CheckpointSite) -> str:
    what = f"{site.op} {site.name!r}" if site.kind == "checkpoint" else site.op
    text = f"{BANNER} site {site.id} {what} at {site.where} reached"
    return text.replace("%", "%%").replace("{", "(").replace("}", ")")


# ---- Trace-time session ---------------------------------------------------------------------


class Session:
    """Numbers the sites of one trace and emits the mark after the enabled one."""

    def __init__(self, enabled: int | None, addr: int, cfg: MarkConfig):
        self.enabled = enabled
        self.cfg = cfg
        self.plan = _Plan(
            addr=int(addr),
            max_ctas=cfg.max_ctas,
            max_warps=cfg.max_warps,
            slots_off=slots_offset(cfg),
        )
        self.sites: list[CheckpointSite] = []
        self.emitted = 0
        self.buffer: Any = None

    def add(
        self,
        op: str,
        kind: str,
        barrier: str = "",
        *,
        detail: str = "",
        name: str = "",
        role: str | None = None,
        skip: int = 1,
    ) -> CheckpointSite:
        fields = _stack_fields(skip + 1)
        site = CheckpointSite(
            id=len(self.sites),
            op=op,
            kind=kind,
            barrier=barrier,
            name=name,
            detail=detail,
            explicit_role=role,
            **fields,
        )
        self.sites.append(site)
        return site

    def after(self, site: CheckpointSite, ip: Any = None) -> None:
        if site.id != self.enabled:
            return
        mark = _device()
        with ip if ip is not None else contextlib.nullcontext():
            mark(self.plan, _banner(site))
        self.emitted += 1

    def table(self) -> list[dict[str, Any]]:
        assign_roles(self.sites)
        return [s.to_json() for s in self.sites]


_ACTIVE: list[Session] = []


def checkpoint(name: str, *, role: str | None = None) -> None:
    """A user checkpoint: call it in ``@cute.kernel`` code. Emits nothing unless a bisection
    session is tracing the kernel and enabled this one. ``role`` overrides the inferred warp
    role (see the module docstring)."""
    if not _ACTIVE:
        return
    sess = _ACTIVE[-1]
    from cutedebug.instrument import layer

    active = layer.current()
    if active is not None and any(o.op != "create" for o in active.open):
        return  # inside a pipeline op: part of it
    site = sess.add("checkpoint", "checkpoint", name=str(name), role=role, skip=1)
    sess.after(site)


class _CallableModule(types.ModuleType):
    # `import cutedebug.checkpoint` binds this module as the package attribute `checkpoint`,
    # shadowing the function of the same name: the module itself must be callable.
    def __call__(self, name: str, *, role: str | None = None) -> None:
        checkpoint(name, role=role)


sys.modules[__name__].__class__ = _CallableModule


def _handlers(sess: Session) -> dict[str, Any]:
    """The layer handlers that number the sites and mark the enabled one."""

    def pipeline_op(call: Any) -> Any:
        if not call.outermost:
            return call.proceed()
        barrier = PIPELINE_OPS[call.name][1]
        pipe = call.self_obj
        site = sess.add(
            call.name,
            "pipeline",
            barrier if type(pipe).__name__ != "PipelineTmaStore" else "",
            detail=type(pipe).__name__,
            skip=1,
        )
        out = call.proceed()
        sess.after(site, call.ip)
        return out

    def arch_op(call: Any, kind: str) -> Any:
        nested = call.parent is not None and call.parent.op != "create"
        who = "nested" if nested else _caller_kind(1)
        if who == "nested" or (kind == "mbarrier" and who != "user"):
            return call.proceed()
        op = MBARRIER_OPS.get(call.name) or NAMED_BARRIER_OPS[call.name]
        if kind == "named_barrier":
            bid = _static(call.kwargs.get("barrier_id"))
            n = _static(call.kwargs.get("number_of_threads"))
            detail = (
                "pipeline init sync (CTA)"
                if who == "init"
                else "sync_threads"
                if call.name == "sync_threads"
                else f"{call.name}(barrier_id={bid}, number_of_threads={n})"
            )
            site = sess.add(op, kind, "named", detail=detail, skip=1)
        else:
            site = sess.add(op, kind, "", detail=call.name, skip=1)
        out = call.proceed()
        sess.after(site, call.ip)
        return out

    def mbarrier(call: Any) -> Any:
        return arch_op(call, "mbarrier")

    def named(call: Any) -> Any:
        return arch_op(call, "named_barrier")

    return {
        **{op: pipeline_op for op in PIPELINE_OPS},
        **{f: mbarrier for f in MBARRIER_OPS},
        **{f: named for f in NAMED_BARRIER_OPS},
    }


def _pinned_buffer(nbytes: int, runnable: bool) -> tuple[Any, Any, int]:
    """(tensor or bytearray, uint8 numpy-like view, device address)."""
    if runnable:
        import torch

        t = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=True)
        return t, t.numpy(), t.data_ptr()
    b = bytearray(nbytes)
    return b, b, FAKE_ADDR


class _Monitor:
    """Streams the enabled site's counters as ``checkpoint`` events while the kernel runs; the
    last one before ``synced`` / ``cuda_error`` is final (the kernel is done by then)."""

    def __init__(self, events: Any, view: Any, cfg: MarkConfig, interval_s: float = 0.02):
        self.events, self.view, self.cfg, self.interval_s = events, view, cfg, interval_s
        self._emit = events.emit
        self._last: tuple | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _poll(self, final: bool = False) -> None:
        with self._lock:
            state = decode(bytes(self.view), self.cfg)
            sig = (state["hits"], state["n_warps"])
            if sig != self._last or final:
                self._last = sig
                self._emit("checkpoint", reached=state["hits"] > 0, final=final, **state)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll()

    def start(self) -> None:
        def emit(event: str, **fields: Any) -> None:
            if event in ("synced", "cuda_error") and not self._stop.is_set():
                self._stop.set()
                self._poll(final=True)
            self._emit(event, **fields)

        self.events.emit = emit  # the worker's Events instance: flush before it reports the end
        self._poll()
        self._thread.start()


@contextlib.contextmanager
def session(
    spec: dict[str, Any] | None = None, events: Any = None, runnable: bool = False
) -> Iterator[Session]:
    """Number checkpoint sites while a kernel is traced inside; enable ``spec["site"]``.

    ``spec``: {"site": int | None, "max_ctas": ..., "max_warps": ...} (the request's
    ``bisect`` field). With ``events`` (the worker's), a ``checkpoint_sites`` event carries the
    site table on exit and, when ``runnable``, a thread then streams ``checkpoint`` events.
    """
    spec = dict(spec or {})
    if _ACTIVE:
        raise RuntimeError("cutedebug checkpoints: session() is already active")
    cfg = MarkConfig(**{k: int(spec[k]) for k in ("max_ctas", "max_warps") if k in spec})
    enabled = spec.get("site")
    holder, view, addr = _pinned_buffer(buffer_nbytes(cfg), runnable)
    init_buffer(view, cfg, enabled)
    sess = Session(None if enabled is None else int(enabled), addr, cfg)
    sess.buffer = holder
    from cutedebug.instrument import layer

    _ACTIVE.append(sess)
    try:
        with layer.observe("checkpoint", _handlers(sess)):
            yield sess
    finally:
        _ACTIVE.clear()
        if events is not None:
            events.emit(
                "checkpoint_sites",
                sites=sess.table(),
                enabled=sess.enabled,
                emitted=sess.emitted,
                roles=roles_of(sess.sites),
            )
            if runnable and sess.enabled is not None:
                _Monitor(events, view, cfg).start()
