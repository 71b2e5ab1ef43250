"""The fault registry: named, parameterized bugs injected while a kernel is traced.

A ``patch`` fault replaces functions of ``cutlass.pipeline`` / ``cutlass.cute.arch`` inside a
context manager, so ANY kernel traced by ``cute.compile`` inside the context gets the bug,
with no edit of its source. Everything is restored on exit, exceptions included.
A ``switch`` fault cannot be a patch (e.g. dropping a tile-edge predicate): the kernel declares
it in ``SWITCHES`` and reads a bool param of the same name (see ``switch_params``).

This module imports neither cutlass nor torch at import time: the harness parent validates
scenario fault specs with it. cutlass is imported inside the patch functions only.

Usage (in the worker, around the compile)::

    args = validate(name, args)                      # FaultSpecError on a bad spec
    with inject(name, args) as applied:
        compiled = cute.compile(kernel, *fake_args)
    applied.sites   # [{"fault", "op", "file", "line", "function", "detail", ...}, ...]
    applied.count   # 0: the fault never triggered on this kernel (applied.require() raises)

A switch fault is applied by the kernel's params, not by ``inject``: build the kernel with
``params | switch_params(name, kernel_cls)`` (FaultSpecError when the kernel does not declare
it); ``inject(name, args, kernel=kernel_cls)`` then records the switch as its one site.

"at_iteration" semantics: a loop body is traced once, so an iteration cannot be picked at
trace time. Release faults emit a run-time test on the consumer state's ``count`` (the
number of ``advance`` calls before this release, i.e. the 0-based k-tile of the release when
the kernel releases before advancing, or uses the handle API). A kernel that resets the
count per work tile gets the fault in every tile. A state with no ``count`` falls back to the
trace order of the release call sites (noted in the site's detail).

"pipeline" (pipeline faults): which pipeline of the kernel the fault hits, numbered in the
order the kernel traces ``create()`` of a cutlass.pipeline class with mbarriers (0 = first);
-1 (the default, left out of the normalized args and the compile key) = every pipeline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from typing import Any

from cutedebug.instrument import frames

VERDICTS = ("PASS", "MISMATCH", "HANG", "CRASH", "RACE", "MEMORY_ERROR", "SYNC_ERROR", "UNINIT",
            "COMPILE_ERROR")
DEPENDS = "depends"


class FaultSpecError(ValueError):
    """A fault spec is invalid; the message names the field, the bad value and what is allowed."""


class FaultApplyError(RuntimeError):
    """A fault cannot be applied to this kernel as asked (e.g. a negative tx byte count)."""


class FaultNotTriggered(RuntimeError):
    """The fault was injected but no patched site was traced: the kernel is unaffected."""


@dataclasses.dataclass(frozen=True)
class Param:
    type: type
    default: Any
    description: str
    choices: tuple[Any, ...] | None = None
    minimum: int | None = None
    nonzero: bool = False
    omit_default: bool = False  # the default is left out of the normalized args (compile key)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type.__name__, "default": self.default,
                               "description": self.description}
        if self.choices is not None:
            out["choices"] = list(self.choices)
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.nonzero:
            out["nonzero"] = True
        return out


@dataclasses.dataclass(frozen=True)
class Fault:
    name: str
    description: str
    params: dict[str, Param]
    expected: str  # a verdict of VERDICTS, or DEPENDS (then expected_note says on what)
    kind: str = "patch"  # "patch" | "switch"
    expected_note: str = ""
    patches: tuple[str, ...] = ()  # what the patch replaces, for reports and `cutedebug faults`
    apply: Callable[[_Patcher, dict[str, Any], Applied], None] | None = None
    refine: Callable[[dict[str, Any]], tuple[str, str]] | None = None  # args -> verdict, note

    def expected_for(self, args: dict[str, Any]) -> tuple[str, str]:
        if self.refine is not None:
            return self.refine(args)
        return self.expected, self.expected_note


@dataclasses.dataclass
class Applied:
    """What an injection changed: one site per traced call that the fault altered."""

    fault: str | None
    args: dict[str, Any]
    kind: str = "patch"
    sites: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    patched: list[str] = dataclasses.field(default_factory=list)  # "module.attr" replaced

    @property
    def count(self) -> int:
        return len(self.sites)

    def looked_for(self) -> str:
        """What the fault looked for in the kernel, for a fault that applied at 0 sites."""
        fault = FAULTS.get(self.fault or "")
        what = ", ".join(fault.patches) if fault and fault.patches else \
            ", ".join(dict.fromkeys(self.patched)) or "its patched functions"
        return what + "".join(f"; {n}" for n in self.notes)

    def not_applied(self) -> str | None:
        """None when the fault changed the kernel; else one line saying what was looked for."""
        if self.fault is None or self.count:
            return None
        return (f"fault {self.fault}{_fmt_args(self.args)} NOT APPLIED: 0 sites while tracing "
                f"(looked for: {self.looked_for()}); the kernel ran unmodified")

    def require(self) -> None:
        if self.fault is not None and self.count == 0:
            raise FaultNotTriggered(
                f"fault {self.fault}{_fmt_args(self.args)} never triggered while tracing: "
                f"none of {self.patched or ['its patched functions']} was called by the kernel")

    def add_site(self, op: str, detail: str, **extra: Any) -> dict[str, Any]:
        where = frames.kernel_frame()
        site = {"fault": self.fault, "op": op, "file": where[0], "line": where[1],
                "function": where[2], "detail": detail, **extra}
        self.sites.append(site)
        return site


# ---- validation ------------------------------------------------------------------------------

def _fmt_args(args: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k}={args[k]!r}" for k in sorted(args)) + ")"


def validate(name: str | None, args: dict[str, Any] | None) -> dict[str, Any]:
    """Normalized args (defaults filled in) of fault ``name``; FaultSpecError when invalid."""
    args = {} if args is None else args
    if name is None:
        if args:
            raise FaultSpecError(f"fault.args = {args!r}: arguments given but no fault name")
        return {}
    if not isinstance(name, str) or name not in FAULTS:
        raise FaultSpecError(f"fault.name = {name!r}: unknown fault; allowed: {sorted(FAULTS)}")
    if not isinstance(args, dict):
        raise FaultSpecError(f"fault.args = {args!r}: expected a table of argument values")
    fault = FAULTS[name]
    out = {}
    for key in args:
        if key not in fault.params:
            raise FaultSpecError(f"fault.args.{key} = {args[key]!r}: unknown argument of {name}; "
                                 f"allowed: {sorted(fault.params) or 'none'}")
    for key, param in fault.params.items():
        value = args.get(key, param.default)
        ok = isinstance(value, param.type) and not (
            param.type is int and isinstance(value, bool))
        if not ok:
            raise FaultSpecError(f"fault.args.{key} = {value!r}: expected {param.type.__name__}"
                                 f" (argument of {name})")
        if param.choices is not None and value not in param.choices:
            raise FaultSpecError(f"fault.args.{key} = {value!r}: allowed values "
                                 f"{list(param.choices)} (argument of {name})")
        if param.minimum is not None and value < param.minimum:
            raise FaultSpecError(f"fault.args.{key} = {value!r}: must be >= {param.minimum} "
                                 f"(argument of {name})")
        if param.nonzero and value == 0:
            raise FaultSpecError(f"fault.args.{key} = 0: must be nonzero (argument of {name})")
        if param.omit_default and value == param.default:
            continue
        out[key] = value
    return out


def spec_key(name: str | None, args: dict[str, Any] | None) -> str:
    """Stable string for the compile key: equal for equal normalized specs."""
    if name is None:
        return "none"
    return name + _fmt_args(validate(name, args))


def expected_verdict(name: str | None, args: dict[str, Any] | None) -> tuple[str, str]:
    """(verdict or DEPENDS, note) the fault is expected to cause with these args."""
    if name is None:
        return "PASS", ""
    return FAULTS[name].expected_for(validate(name, args))


def describe_all() -> list[dict[str, Any]]:
    out = []
    for fault in FAULTS.values():
        out.append({
            "name": fault.name, "kind": fault.kind, "description": fault.description,
            "params": {k: p.describe() for k, p in fault.params.items() if not p.omit_default},
            # absent from validate()'s normalized args while they keep their default
            "optional_params": {k: p.describe() for k, p in fault.params.items()
                                if p.omit_default},
            "expected": fault.expected, "expected_note": fault.expected_note,
            "patches": list(fault.patches),
        })
    return out


def switch_params(name: str, kernel: Any) -> dict[str, bool]:
    """Kernel params that turn switch fault ``name`` on; FaultSpecError if the kernel lacks it."""
    fault = FAULTS.get(name)
    if fault is None or fault.kind != "switch":
        raise FaultSpecError(f"fault.name = {name!r}: not a switch fault; switches: "
                             f"{sorted(n for n, f in FAULTS.items() if f.kind == 'switch')}")
    declared = getattr(kernel, "SWITCHES", {}) or {}
    if name not in declared:
        kname = getattr(kernel, "__name__", type(kernel).__name__)
        raise FaultSpecError(f"fault.name = {name!r}: kernel {kname} does not declare this "
                             f"switch; its SWITCHES: {sorted(declared) or 'none'}")
    return {name: True}


# ---- injection -------------------------------------------------------------------------------

def inject(name: str | None, args: dict[str, Any] | None = None, *, kernel: Any = None,
           strict: bool = False) -> contextlib.AbstractContextManager[Applied]:
    """Context manager: fault ``name`` is active inside; yields an ``Applied`` record.

    ``kernel`` (class or instance) is checked for a switch fault's declaration. With
    ``strict``, a clean exit with no triggered site raises FaultNotTriggered (after restoring).
    """
    if name is None:
        validate(None, args)
        return contextlib.nullcontext(Applied(None, {}))
    return _inject(name, validate(name, args), kernel, strict)


@contextlib.contextmanager
def _inject(name: str, args: dict[str, Any], kernel: Any, strict: bool) -> Iterator[Applied]:
    fault = FAULTS[name]
    applied = Applied(name, args, kind=fault.kind)
    if fault.kind == "switch":
        if kernel is not None:
            switch_params(name, kernel)
            applied.sites.append({"fault": name, "op": "switch", "file": None, "line": None,
                                  "function": None, "detail": f"kernel param {name}=True"})
        else:
            applied.notes.append("switch: set the kernel param through switch_params()")
        yield applied
        return
    patcher = _Patcher(applied)
    try:
        assert fault.apply is not None
        fault.apply(patcher, args, applied)
        yield applied
    finally:
        patcher.restore()
    if strict:
        applied.require()


class _Patcher:
    """Replaces attributes and remembers how to put every one of them back."""

    def __init__(self, applied: Applied):
        self.applied = applied
        self._undo: list[tuple[Any, str, bool, Any]] = []
        self._swaps: list[tuple[Any, Any]] = []

    def set_attr(self, owner: Any, attr: str, value: Any) -> None:
        had = attr in vars(owner)
        self._undo.append((owner, attr, had, vars(owner).get(attr)))
        setattr(owner, attr, value)
        self.applied.patched.append(f"{getattr(owner, '__name__', owner)}.{attr}")

    def replace_everywhere(self, original: Any, replacement: Any) -> int:
        """Rebind every module global that holds ``original`` (names imported with `from`)."""
        n = 0
        for module in list(sys.modules.values()):
            for attr, value in _module_items(module):
                if value is original:
                    self.set_attr(module, attr, replacement)
                    n += 1
        self._swaps.append((replacement, original))
        return n

    def restore(self) -> None:
        while self._undo:
            owner, attr, had, old = self._undo.pop()
            if had:
                setattr(owner, attr, old)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(owner, attr)
        # A module imported inside the context may have bound a replacement by name.
        for replacement, original in reversed(self._swaps):
            for module in list(sys.modules.values()):
                for attr, value in _module_items(module):
                    if value is replacement:
                        setattr(module, attr, original)
        self._swaps.clear()


def _module_items(module: Any) -> list[tuple[str, Any]]:
    try:
        return list(vars(module).items())
    except TypeError:
        return []


# ---- kernel call sites -----------------------------------------------------------------------

def _called_from(names: frozenset[str]) -> bool:
    """True when a cutlass.pipeline frame named in ``names`` is on the stack (library internals)."""
    frame = sys._getframe(1)
    while frame is not None:
        if (frame.f_code.co_name in names
                and frame.f_globals.get("__name__", "").startswith("cutlass.pipeline")):
            return True
        frame = frame.f_back
    return False


def _pipeline_classes(attr: str, exclude: tuple[str, ...] = ()) -> list[type]:
    """PipelineAsync and all its subclasses (library or user) that define ``attr`` themselves."""
    from cutlass.pipeline import PipelineAsync

    seen: list[type] = []
    todo = [PipelineAsync]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in seen if attr in vars(c) and c.__name__ not in exclude]


def _user_op(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap like the library's ops, so `loc` points at the kernel line, not at this file."""
    from cutlass.cutlass_dsl import dsl_user_op

    return dsl_user_op(fn)


class _Depth:
    """Reentrancy guard: a patched method that calls its patched base applies the fault once."""

    def __init__(self) -> None:
        self.level = 0

    @contextlib.contextmanager
    def enter(self) -> Iterator[bool]:
        self.level += 1
        try:
            yield self.level == 1
        finally:
            self.level -= 1


def _static_value(x: Any) -> Any:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


_PIPELINE_TAG = "_cutedebug_pipeline_index"


class _PipelineSelector:
    """Which pipeline a patched call belongs to: pipelines are numbered in create() order.

    With ``wanted`` = -1 nothing is patched and every pipeline is selected. Otherwise each
    library/user pipeline class's ``create`` is wrapped to tag the returned pipeline with its
    index (``PipelineTmaStore`` has no mbarriers and is not counted).
    """

    def __init__(self, p: _Patcher, wanted: int):
        self.wanted = wanted
        self.creating: int | None = None  # index of the pipeline whose create() is running
        if wanted < 0:
            return
        created = [0]
        depth = _Depth()
        for cls in _pipeline_classes("create", exclude=("PipelineTmaStore",)):

            def create(*a, _orig=cls.create, **kw):
                with depth.enter() as outermost:
                    if not outermost:
                        return _orig(*a, **kw)
                    index, created[0] = created[0], created[0] + 1
                    self.creating = index
                    try:
                        pipe = _orig(*a, **kw)
                    finally:
                        self.creating = None
                    with contextlib.suppress(AttributeError, TypeError):
                        object.__setattr__(pipe, _PIPELINE_TAG, index)
                    return pipe

            p.set_attr(cls, "create", staticmethod(create))

    def selects(self, pipe: Any) -> bool:
        return self.wanted < 0 or getattr(pipe, _PIPELINE_TAG, None) == self.wanted

    def selects_creating(self) -> bool:
        return self.wanted < 0 or self.creating == self.wanted

    def selects_caller(self) -> bool:
        """The innermost pipeline method on the stack (e.g. producer_acquire) is selected."""
        if self.wanted < 0:
            return True
        from cutlass.pipeline import PipelineAsync

        frame = sys._getframe(1)
        while frame is not None:
            owner = frame.f_locals.get("self")
            if isinstance(owner, PipelineAsync):
                return self.selects(owner)
            frame = frame.f_back
        return False

    def extra(self) -> dict[str, Any]:
        return {} if self.wanted < 0 else {"pipeline_index": self.wanted}


# ---- patch faults ----------------------------------------------------------------------------

def _apply_wrong_expect_tx(p: _Patcher, args: dict[str, Any], applied: Applied) -> None:
    from cutlass import cute

    delta = args["delta_bytes"]
    select = _PipelineSelector(p, args.get("pipeline", -1))
    for fname in ("mbarrier_arrive_and_expect_tx", "mbarrier_expect_tx"):
        original = getattr(cute.arch, fname)

        def replacement(mbar_ptr, tx_bytes, *rest, _orig=original, _op=fname, loc=None,
                        ip=None, **kw):
            if not select.selects_caller():
                return _orig(mbar_ptr, tx_bytes, *rest, loc=loc, ip=ip, **kw)
            static = _static_value(tx_bytes)
            if static is not None and static + delta < 0:
                raise FaultApplyError(f"wrong_expect_tx: {static} + {delta} tx bytes < 0")
            change = f"{static} -> {static + delta}" if static is not None else f"+ {delta}"
            applied.add_site(_op, f"tx bytes {change}", tx_bytes=static, **select.extra())
            return _orig(mbar_ptr, tx_bytes + delta, *rest, loc=loc, ip=ip, **kw)

        p.replace_everywhere(original, _user_op(replacement))


_NO_FLIP_STATE: type | None = None


def _no_flip_state_class() -> type:
    """A PipelineState whose advance never flips the phase (made once, on first use)."""
    global _NO_FLIP_STATE
    if _NO_FLIP_STATE is not None:
        return _NO_FLIP_STATE
    from cutlass.cutlass_dsl import Int32, dsl_user_op, if_generate
    from cutlass.pipeline import PipelineState

    class NoPhaseFlipState(PipelineState):
        """Injected by cutedebug (missing_phase_flip): index wraps, phase stays."""

        _on_advance: Callable[[], None] | None = None

        def _like(self, count, index, phase):
            new = NoPhaseFlipState(self._stages, count, index, phase)
            new._on_advance = self._on_advance
            return new

        def clone(self, *, loc=None, ip=None):
            return self._like(self._count, self._index, self._phase)

        @dsl_user_op
        def advance(self, count=1, *, loc=None, ip=None):
            if isinstance(count, int) and count < 1:
                raise ValueError("count must be >= 1")
            if self._on_advance is not None:
                self._on_advance()
            if not isinstance(count, int) or count > 1:
                self._count = self._count + count
                self._index = (self._index + count) % self._stages
                return
            self._index = self._index + 1
            self._count = self._count + 1
            self._index = if_generate(
                self._index == self._stages,
                lambda index: Int32(0),
                lambda index: index,
                [self._index], [Int32], loc=loc, ip=ip)

        def __new_from_mlir_values__(self, values):
            return self._like(Int32(values[0]), Int32(values[1]), Int32(values[2]))

    _NO_FLIP_STATE = NoPhaseFlipState
    return NoPhaseFlipState


def _apply_missing_phase_flip(p: _Patcher, args: dict[str, Any], applied: Applied) -> None:
    import cutlass.pipeline as pl

    role = args["role"]
    if args.get("pipeline", -1) >= 0:
        _phase_frozen_on_one_pipeline(p, role, args["pipeline"], applied)
        return
    wanted = {"producer": (pl.PipelineUserType.Producer, pl.PipelineUserType.ProducerConsumer),
              "consumer": (pl.PipelineUserType.Consumer, pl.PipelineUserType.ProducerConsumer)}
    no_flip = _no_flip_state_class()
    original = pl.make_pipeline_state

    def make_pipeline_state(type, stages, *, loc=None, ip=None):
        state = original(type, stages, loc=loc, ip=ip)
        if type not in wanted[role]:
            return state
        applied.add_site("make_pipeline_state", f"{role} state: phase never flips on wrap",
                         stages=stages)
        faulty = no_flip(state._stages, state._count, state._index, state._phase)
        faulty._on_advance = lambda: applied.add_site(
            "advance", f"{role} state advanced without phase flip", stages=stages)
        return faulty

    p.replace_everywhere(original, _user_op(make_pipeline_state))


# Without a flip the phase a role waits on never leaves its initial value (make_pipeline_state:
# consumer 0, producer 1). On one pipeline this is patched where that pipeline reads a state.
_PHASE_READERS = {"consumer": ("consumer_wait", "consumer_try_wait"),
                  "producer": ("producer_acquire", "producer_try_acquire", "producer_tail")}
_INITIAL_PHASE = {"consumer": 0, "producer": 1}


def _phase_frozen_on_one_pipeline(p: _Patcher, role: str, index: int, applied: Applied) -> None:
    from cutlass.cutlass_dsl import Int32

    select = _PipelineSelector(p, index)
    no_flip = _no_flip_state_class()
    depth = _Depth()
    for op in _PHASE_READERS[role]:
        for cls in _pipeline_classes(op, exclude=("PipelineTmaStore",)):

            def patched(self, state, *rest, _orig=vars(cls)[op], _op=op, loc=None, ip=None,
                        **kw):
                with depth.enter() as outermost:
                    if outermost and select.selects(self):
                        state = no_flip(state.stages, state.count, state.index,
                                        Int32(_INITIAL_PHASE[role]))
                        applied.add_site(_op, f"{role} state of pipeline {index}: phase never "
                                         "flips on wrap", pipeline=type(self).__name__,
                                         pipeline_index=index)
                    return _orig(self, state, *rest, loc=loc, ip=ip, **kw)

            p.set_attr(cls, op, _user_op(patched))


def _apply_skip_producer_tail(p: _Patcher, args: dict[str, Any], applied: Applied) -> None:
    select = _PipelineSelector(p, args.get("pipeline", -1))
    # PipelineTmaStore's tail is a bulk-group wait, not a drain of empty barriers.
    for cls in _pipeline_classes("producer_tail", exclude=("PipelineTmaStore",)):

        def producer_tail(self, *rest, _orig=vars(cls)["producer_tail"], loc=None, ip=None,
                          **kw):
            if not select.selects(self):
                return _orig(self, *rest, loc=loc, ip=ip, **kw)
            applied.add_site("producer_tail", f"{type(self).__name__}.producer_tail skipped "
                             f"({self.num_stages} empty-barrier waits removed)",
                             pipeline=type(self).__name__, num_stages=self.num_stages,
                             **select.extra())

        p.set_attr(cls, "producer_tail", _user_op(producer_tail))


def _release_patch(p: _Patcher, args: dict[str, Any], applied: Applied, extra: bool) -> None:
    from cutlass.cutlass_dsl import if_generate

    k = args["at_iteration"]
    select = _PipelineSelector(p, args.get("pipeline", -1))
    depth = _Depth()
    traced = [0]
    fault = "extra" if extra else "skip"
    for cls in _pipeline_classes("consumer_release", exclude=("PipelineTmaStore",)):
        original = vars(cls)["consumer_release"]

        def consumer_release(self, state, *rest, _orig=original, loc=None, ip=None, **kw):
            with depth.enter() as outermost:
                if not outermost or not select.selects(self):
                    return _orig(self, state, *rest, loc=loc, ip=ip, **kw)

                def release(inner_ip=ip):
                    _orig(self, state, *rest, loc=loc, ip=inner_ip, **kw)

                pname = type(self).__name__
                count = getattr(state, "count", None)
                if k == -1:
                    when = "every iteration"
                    if extra:
                        release()
                        release()
                    applied.add_site("consumer_release", f"{fault} release, {when}",
                                     pipeline=pname, at_iteration=k,
                                     **select.extra())
                    return None
                if count is None:  # no run-time count: the k-th traced call site
                    index, traced[0] = traced[0], traced[0] + 1
                    hit = index == k
                    if extra or not hit:
                        release()
                    if hit:
                        if extra:
                            release()
                        applied.add_site("consumer_release",
                                         f"{fault} release at traced call site {k} (the "
                                         "state has no count)", pipeline=pname, at_iteration=k,
                                     **select.extra())
                    return None
                static = _static_value(count)
                if static is not None:  # a compile-time count: decide now
                    if extra or static != k:
                        release()
                    if static == k:
                        if extra:
                            release()
                        applied.add_site("consumer_release", f"{fault} release at count {k}",
                                         pipeline=pname, at_iteration=k,
                                     **select.extra())
                    return None
                if extra:
                    release()
                    if_generate(count == k, lambda: release(None), loc=loc, ip=ip)
                else:
                    if_generate(count != k, lambda: release(None), loc=loc, ip=ip)
                applied.add_site("consumer_release",
                                 f"{fault} release when state.count == {k} (run-time test)",
                                 pipeline=pname, at_iteration=k,
                                     **select.extra())
                return None

        p.set_attr(cls, "consumer_release", _user_op(consumer_release))


def _apply_skip_consumer_release(p: _Patcher, args: dict[str, Any], applied: Applied) -> None:
    _release_patch(p, args, applied, extra=False)


def _apply_extra_consumer_release(p: _Patcher, args: dict[str, Any], applied: Applied) -> None:
    _release_patch(p, args, applied, extra=True)


def _apply_wrong_arrive_count(p: _Patcher, args: dict[str, Any], applied: Applied) -> None:
    from cutlass.pipeline import Agent, CooperativeGroup
    from cutlass.pipeline.helpers import _get_thread_arrive_count

    delta, which = args["delta"], args["barrier"]
    select = _PipelineSelector(p, args.get("pipeline", -1))
    depth = _Depth()
    for cls in _pipeline_classes("_make_sync_object"):
        original = cls._make_sync_object  # plain function or unwrapped staticmethod

        def make_sync_object(*a, _orig=original, _cls=cls, **kw):
            with depth.enter() as outermost:
                a = list(a)
                agent = kw["agent"] if "agent" in kw else a[2]
                if outermost and kw.get("phase", "") == which and select.selects_creating():
                    op, group = agent
                    count = _get_thread_arrive_count(group)
                    static = _static_value(count)
                    if static is not None and static + delta < 1:
                        raise FaultApplyError(f"wrong_arrive_count: {which} barrier arrive count "
                                              f"{static} + {delta} < 1")
                    agent = (op, CooperativeGroup(Agent.Thread, count + delta))
                    stages = kw["num_stages"] if "num_stages" in kw else a[1]
                    change = f"{static} -> {static + delta}" if static is not None \
                        else f"+ {delta}"
                    applied.add_site("mbarrier_init", f"{which} barriers: arrive count {change}",
                                     pipeline=_cls.__name__,
                                     arrive_count=static, num_stages=_static_value(stages),
                                     **select.extra())
                    if "agent" in kw:
                        kw["agent"] = agent
                    else:
                        a[2] = agent
                return _orig(*a, **kw)

        p.set_attr(cls, "_make_sync_object", staticmethod(make_sync_object))


_INIT_FUNCTIONS = frozenset({"create", "pipeline_init_wait", "pipeline_init_arrive"})


def _apply_missing_init_fence(p: _Patcher, args: dict[str, Any], applied: Applied) -> None:
    import cutlass.pipeline as pl
    from cutlass import cute

    drop = args["drop"]
    if drop in ("fence", "both"):
        original_fence = cute.arch.mbarrier_init_fence

        def mbarrier_init_fence(*, loc=None, ip=None):
            applied.add_site("mbarrier_init_fence", "fence.mbarrier_init dropped")

        p.replace_everywhere(original_fence, _user_op(mbarrier_init_fence))
    if drop in ("sync", "both"):
        original_sync = pl.agent_sync

        def agent_sync(group, *rest, loc=None, ip=None, **kw):
            if group in (pl.Agent.ThreadBlock, pl.Agent.ThreadBlockCluster):
                applied.add_site("agent_sync", f"post-init {group.name} sync dropped")
                return None
            return original_sync(group, *rest, loc=loc, ip=ip, **kw)

        # Only the library's own uses (create / pipeline_init_wait), not a kernel's direct calls.
        replacement = _user_op(agent_sync)
        for name, module in list(sys.modules.items()):
            if name.startswith("cutlass.pipeline.") and getattr(module, "agent_sync", None) \
                    is original_sync:
                p.set_attr(module, "agent_sync", replacement)


_SYNC_KINDS = {"cta": ("sync_threads", "barrier"), "warp": ("sync_warp",),
               "any": ("sync_threads", "barrier", "sync_warp")}


def _apply_drop_sync(p: _Patcher, args: dict[str, Any], applied: Applied) -> None:
    from cutlass import cute

    which = args["which"]
    traced = [0]  # shared by all patched kinds: one trace-order sequence of call sites
    for fname in _SYNC_KINDS[args["sync"]]:
        original = getattr(cute.arch, fname)

        def replacement(*a, _orig=original, _op=fname, loc=None, ip=None, **kw):
            # Barrier-init syncs inside pipeline create() belong to missing_init_fence.
            if _called_from(_INIT_FUNCTIONS):
                return _orig(*a, loc=loc, ip=ip, **kw)
            index, traced[0] = traced[0], traced[0] + 1
            if which in (-1, index):
                bar = kw.get("barrier_id", 0) if _op != "sync_warp" else None
                what = "warp sync" if bar is None else f"barrier id {bar}"
                applied.add_site(_op, f"sync call site #{index} dropped ({what})",
                                 sync_index=index, barrier_id=_static_value(bar))
                return None
            return _orig(*a, loc=loc, ip=ip, **kw)

        p.replace_everywhere(original, _user_op(replacement))


def _apply_expect_tx_no_2cta_doubling(p: _Patcher, args: dict[str, Any],
                                      applied: Applied) -> None:
    from cutlass import cute
    from cutlass.pipeline import PipelineTmaUmma

    original_create = PipelineTmaUmma.create
    original_acquire = PipelineTmaUmma.producer_acquire

    def create(*, tx_count, cta_layout_vmnk=None, loc=None, ip=None, **kw):
        pair = cta_layout_vmnk is not None and cute.size(cta_layout_vmnk, mode=[0]) == 2
        if pair:
            static = _static_value(tx_count)
            change = f"{static} -> {static // 2}" if static is not None else "halved"
            applied.add_site("PipelineTmaUmma.create", f"tx_count {change}: only this CTA's "
                             "bytes, not the pair's", tx_bytes=static)
            tx_count = tx_count // 2
        return original_create(tx_count=tx_count, cta_layout_vmnk=cta_layout_vmnk, loc=loc,
                               ip=ip, **kw)

    def producer_acquire(self, state, try_acquire_token=None, *, expected_tx=None, loc=None,
                         ip=None):
        if expected_tx is not None and self.cta_group == cute.nvgpu.tcgen05.CtaGroup.TWO:
            applied.add_site("producer_acquire", "expected_tx override halved")
            expected_tx = expected_tx // 2
        return original_acquire(self, state, try_acquire_token, expected_tx=expected_tx,
                                loc=loc, ip=ip)

    p.set_attr(PipelineTmaUmma, "create", staticmethod(create))
    p.set_attr(PipelineTmaUmma, "producer_acquire", producer_acquire)



_SCOPE_WHAT = ("fence", "cluster_arrive", "mbarrier_arrive", "all")


def _apply_cta_scope_sync(p: _Patcher, args: dict[str, Any], applied: Applied) -> None:
    from cutlass import cute
    from cutlass._mlir.dialects import nvvm

    what = args["what"]
    cluster, cta = nvvm.MemScopeKind.CLUSTER, nvvm.MemScopeKind.CTA
    if what in ("fence", "all"):
        fence_cta = cute.arch.fence_acq_rel_cta

        def fence_acq_rel_cluster(*, loc=None, ip=None):
            applied.add_site("fence_acq_rel_cluster", "fence.acq_rel.cluster -> fence.acq_rel.cta")
            return fence_cta(loc=loc, ip=ip)

        p.replace_everywhere(cute.arch.fence_acq_rel_cluster, _user_op(fence_acq_rel_cluster))
    if what in ("cluster_arrive", "all"):
        arrive_relaxed = cute.arch.cluster_arrive_relaxed

        def cluster_arrive(*, aligned=None, loc=None, ip=None):
            applied.add_site("cluster_arrive", "barrier.cluster.arrive (release) -> "
                             "barrier.cluster.arrive.relaxed")
            return arrive_relaxed(aligned=aligned, loc=loc, ip=ip)

        p.replace_everywhere(cute.arch.cluster_arrive, _user_op(cluster_arrive))
    if what in ("mbarrier_arrive", "all"):
        for fname in ("mbarrier_arrive", "mbarrier_arrive_and_expect_tx", "mbarrier_expect_tx"):
            original = getattr(cute.arch, fname)

            def replacement(*a, _orig=original, _op=fname, scope=None, loc=None, ip=None, **kw):
                # mbarrier_expect_tx defaults to cluster scope for a remote (peer) barrier
                remote = kw.get("peer_cta_rank_in_cluster", a[2] if len(a) > 2 else None)
                implied = _op == "mbarrier_expect_tx" and scope is None and remote is not None
                if scope == cluster or implied:
                    applied.add_site(_op, f"{_op}: .cluster scope -> .cta")
                    scope = cta
                if scope is None:
                    return _orig(*a, loc=loc, ip=ip, **kw)
                return _orig(*a, scope=scope, loc=loc, ip=ip, **kw)

            p.replace_everywhere(original, _user_op(replacement))

def _apply_wrong_barrier_threads(p: _Patcher, args: dict[str, Any], applied: Applied) -> None:
    from cutlass import cute

    delta, which = args["delta"], args["which"]
    if delta % 32:
        raise FaultApplyError(f"wrong_barrier_threads: delta {delta} is not a multiple of 32 "
                              "(bar.sync counts whole warps)")
    traced = [0]  # one trace-order sequence over barrier and barrier_arrive
    for fname in ("barrier", "barrier_arrive"):
        original = getattr(cute.arch, fname)

        def replacement(*a, _orig=original, _op=fname, loc=None, ip=None, **kw):
            count = kw.get("number_of_threads")
            # A whole-CTA barrier has no count to get wrong; init syncs belong to other faults.
            if count is None or _called_from(_INIT_FUNCTIONS):
                return _orig(*a, loc=loc, ip=ip, **kw)
            index, traced[0] = traced[0], traced[0] + 1
            if which not in (-1, index):
                return _orig(*a, loc=loc, ip=ip, **kw)
            static = _static_value(count)
            if static is not None and static + delta < 32:
                raise FaultApplyError(f"wrong_barrier_threads: {static} + {delta} threads < 32")
            change = f"{static} -> {static + delta}" if static is not None else f"+ {delta}"
            bar = _static_value(kw.get("barrier_id"))
            applied.add_site(_op, f"barrier id {bar}: number_of_threads {change}",
                             barrier_id=bar, number_of_threads=static, sync_index=index)
            kw["number_of_threads"] = count + delta
            return _orig(*a, loc=loc, ip=ip, **kw)

        p.replace_everywhere(original, _user_op(replacement))


_EXIT_AT = {"consumer": "consumer_release", "producer": "producer_commit"}


def _apply_early_exit(p: _Patcher, args: dict[str, Any], applied: Applied) -> None:
    from cutlass import cute
    from cutlass.cutlass_dsl import if_generate

    role, k = args["role"], args["at_iteration"]
    op = _EXIT_AT[role]
    select = _PipelineSelector(p, args.get("pipeline", -1))
    depth = _Depth()
    for cls in _pipeline_classes(op, exclude=("PipelineTmaStore",)):

        def patched(self, state, *rest, _orig=vars(cls)[op], loc=None, ip=None, **kw):
            with depth.enter() as outermost:
                if outermost and select.selects(self):
                    count = getattr(state, "count", None)
                    static = _static_value(count)
                    pname = type(self).__name__
                    if count is None or static is not None:
                        if count is None or static == k:  # no run-time count: leave here
                            cute.arch.inline_ptx("exit;")
                            applied.add_site(op, f"{role} warps exit before {op} (the state "
                                             f"has {'no' if count is None else 'a static'} "
                                             "count)", pipeline=pname, at_iteration=k,
                                             **select.extra())
                    else:
                        if_generate(count == k, lambda: cute.arch.inline_ptx("exit;"),
                                    loc=loc, ip=ip)
                        applied.add_site(op, f"{role} warps exit before {op} when state.count "
                                         f"== {k} (run-time test)", pipeline=pname,
                                         at_iteration=k, **select.extra())
                return _orig(self, state, *rest, loc=loc, ip=ip, **kw)

        p.set_attr(cls, op, _user_op(patched))


# ---- verdict refinements ---------------------------------------------------------------------

def _refine_expect_tx(args: dict[str, Any]) -> tuple[str, str]:
    if args["delta_bytes"] > 0:
        return "HANG", "the full barrier's tx count never reaches zero: consumer_wait never returns"
    return "MISMATCH", ("the full barrier completes before all bytes land: the consumer may read "
                        "a partly written stage (timing-dependent; may PASS)")


def _refine_arrive_count(args: dict[str, Any]) -> tuple[str, str]:
    side = "producer_acquire" if args["barrier"] == "empty" else "consumer_wait"
    if args["delta"] > 0:
        return "HANG", f"the {args['barrier']} barrier never completes: {side} never returns"
    return DEPENDS, (f"the {args['barrier']} barrier completes before every arrive: {side} "
                     "returns early; MISMATCH or RACE when the stage is overwritten/read early")


def _refine_barrier_threads(args: dict[str, Any]) -> tuple[str, str]:
    if args["delta"] > 0:
        return "HANG", ("the named barrier waits for threads that never arrive (no mbarrier: "
                        "probes cannot bound it, printf-bisection localizes it)")
    return DEPENDS, ("the named barrier opens before every participant arrived: MISMATCH / "
                     "RACE; leftover arrivals may leave a later barrier incomplete (HANG)")


# ---- the registry ----------------------------------------------------------------------------

_AT_ITERATION = Param(int, 0, "consumer state count at which it happens (run-time test); "
                      "-1 = every iteration", minimum=-1)

_PIPELINE = Param(int, -1, "which pipeline, in create() order while tracing (0 = first); -1 = "
                  "all", minimum=-1, omit_default=True)

FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault(
        "wrong_expect_tx", "expect_tx byte count off by delta_bytes on every arrive.expect_tx",
        {"delta_bytes": Param(int, 16, "bytes added to each expect_tx (negative: fewer)",
                              nonzero=True),
         "pipeline": _PIPELINE},
        DEPENDS, expected_note="delta > 0: HANG (full barrier never completes); delta < 0: "
        "MISMATCH (phase completes before the data lands)",
        patches=("cute.arch.mbarrier_arrive_and_expect_tx", "cute.arch.mbarrier_expect_tx"),
        apply=_apply_wrong_expect_tx, refine=_refine_expect_tx),
    Fault(
        "missing_phase_flip", "the PipelineState of one role wraps its index without flipping "
        "the phase bit",
        {"role": Param(str, "consumer", "whose states (make_pipeline_state) lose the flip",
                       choices=("producer", "consumer")),
         "pipeline": _PIPELINE},
        DEPENDS, expected_note="consumer: MISMATCH (waits on an already-completed parity, reads "
        "stale stages); producer: MISMATCH/RACE (overwrites stages still being read), HANG if "
        "a full barrier is lapped",
        patches=("cutlass.pipeline.make_pipeline_state (state subclass without phase flip)",),
        apply=_apply_missing_phase_flip),
    Fault(
        "skip_producer_tail", "producer_tail (drain of every empty barrier before exit) is a "
        "no-op", {"pipeline": _PIPELINE},
        DEPENDS, expected_note="PASS in a single CTA; in a cluster a consumer's remote arrive "
        "may target an exited CTA (CRASH or HANG)",
        patches=("PipelineAsync.producer_tail and overrides",),
        apply=_apply_skip_producer_tail),
    Fault(
        "skip_consumer_release", "one consumer_release is not performed (run-time test on the "
        "state's count)", {"at_iteration": _AT_ITERATION, "pipeline": _PIPELINE},
        "HANG", expected_note="the empty barrier of that stage never completes: the producer "
        "(producer_acquire or producer_tail) waits forever; PASS only if at_iteration is never "
        "reached", patches=("PipelineAsync.consumer_release and overrides",),
        apply=_apply_skip_consumer_release),
    Fault(
        "extra_consumer_release", "one consumer_release is performed twice (run-time test on "
        "the state's count)", {"at_iteration": _AT_ITERATION, "pipeline": _PIPELINE},
        "MISMATCH", expected_note="the empty barrier runs one phase ahead: the producer "
        "overwrites a stage still being read (RACE under racecheck; timing-dependent)",
        patches=("PipelineAsync.consumer_release and overrides",),
        apply=_apply_extra_consumer_release),
    Fault(
        "wrong_arrive_count", "the pipeline's barriers are initialised with an arrive count "
        "off by delta",
        {"delta": Param(int, 1, "arrivals added to the init count (negative: fewer)",
                        nonzero=True),
         "barrier": Param(str, "empty", "which barriers of each pipeline",
                          choices=("empty", "full")),
         "pipeline": _PIPELINE},
        DEPENDS, expected_note="delta > 0: HANG; delta < 0: MISMATCH/RACE (phase completes "
        "before every agent arrived)",
        patches=("PipelineAsync._make_sync_object and overrides (agent group)",),
        apply=_apply_wrong_arrive_count, refine=_refine_arrive_count),
    Fault(
        "missing_init_fence", "barrier init is not fenced and/or not synced before first use",
        {"drop": Param(str, "both", "what to drop after mbarrier.init",
                       choices=("fence", "sync", "both"))},
        DEPENDS, expected_note="usually PASS at run time (init wins the race); a warp that "
        "uses an uninitialised barrier may HANG or pass a wait early (MISMATCH); synccheck/"
        "racecheck may report",
        patches=("cute.arch.mbarrier_init_fence", ("agent_sync inside cutlass.pipeline "
                 "(create / pipeline_init_wait)")),
        apply=_apply_missing_init_fence),
    Fault(
        "drop_sync", "a sync_threads / named-barrier / sync_warp call of the kernel is dropped",
        {"which": Param(int, 0, "which call site in trace order (0 = first); -1 = all",
                        minimum=-1),
         "sync": Param(str, "any", "which calls count: cta = sync_threads and named barriers, "
                       "warp = sync_warp", choices=tuple(_SYNC_KINDS))},
        "RACE", expected_note="shared-memory hazard (racecheck RAW/WAR); MISMATCH when the race "
        "is lost at run time. Pipeline-init syncs are not counted (see missing_init_fence)",
        patches=("cute.arch.sync_threads", "cute.arch.barrier", "cute.arch.sync_warp"),
        apply=_apply_drop_sync),
    Fault(
        "oob_store", "kernel switch: the output store is shifted past the allocation", {},
        "MEMORY_ERROR", kind="switch", expected_note="memcheck reports an invalid global write "
        "(needs the torch caching allocator off); without a sanitizer usually PASS or CRASH"),
    Fault(
        "spin_hang", "kernel switch: nobody arrives on a barrier that every thread waits on", {},
        "HANG", kind="switch"),
    Fault(
        "expect_tx_no_2cta_doubling", "2-CTA (cta_group::2) PipelineTmaUmma expects only this "
        "CTA's TMA bytes, not the pair's (tx_count / 2)", {},
        "HANG", expected_note="the leader's full barrier completes when half the pair's bytes "
        "landed (the MMA may read a partial stage); the other half lands on the next phase, "
        "whose tx count then never returns to zero: consumer_wait hangs. Not triggered by "
        "1-CTA kernels (same PTX as wrong_expect_tx with delta_bytes = -tx/2)",
        patches=("PipelineTmaUmma.create (tx_count)",
                 "PipelineTmaUmma.producer_acquire (expected_tx)"),
        apply=_apply_expect_tx_no_2cta_doubling),
    Fault(
        "cta_scope_sync", "cluster-scope synchronization demoted to CTA scope: "
        "fence.acq_rel.cluster -> .cta, barrier.cluster.arrive loses its release, mbarrier "
        "arrive / expect_tx at .cluster scope -> .cta",
        {"what": Param(str, "all", "which operations are demoted", choices=_SCOPE_WHAT)},
        "PASS", expected_note="formally a data race on cross-CTA (DSMEM) data; current "
        "hardware orders it anyway, so runs PASS: visible in the PTX only",
        patches=("cute.arch.fence_acq_rel_cluster", "cute.arch.cluster_arrive",
                 "cute.arch.mbarrier_arrive / mbarrier_arrive_and_expect_tx / "
                 "mbarrier_expect_tx (scope)"),
        apply=_apply_cta_scope_sync),
    Fault(
        "skip_init_cluster_sync", "kernel switch: no cluster barrier between mbarrier init and "
        "the first remote (DSMEM) arrive / complete_tx; the CTA syncs only itself", {},
        DEPENDS, kind="switch", expected_note="usually PASS (peers send only after their own "
        "work); a remote complete_tx that reaches a barrier before its init is lost: HANG"),
    Fault(
        "skip_cluster_tail", "kernel switch: no trailing cluster barrier: a CTA may exit while "
        "a peer still reads or writes its shared memory", {},
        DEPENDS, kind="switch", expected_note="PASS when every CTA waits for all its incoming "
        "DSMEM traffic before exiting; CRASH or corrupted smem of the next CTA on that SM when "
        "it does not"),
    Fault(
        "cluster_mismatch", "kernel switch: launch cluster dims differ from the cluster size "
        "the kernel's DSMEM protocol assumes", {},
        "HANG", kind="switch", expected_note="CTAs that the protocol expects partials from are "
        "absent (or extra CTAs send to the wrong peers): some barrier's tx count never "
        "reaches zero; CRASH if a remote address names a CTA outside the cluster"),
    Fault(
        "wrong_barrier_threads", "named barriers with a thread count (bar.sync / bar.arrive "
        "id, count) expect delta threads more than the kernel passes",
        {"delta": Param(int, 32, "threads added to number_of_threads (a multiple of 32; "
                        "negative: fewer)", nonzero=True),
         "which": Param(int, -1, "which counted barrier call site in trace order (0 = first); "
                        "-1 = all", minimum=-1)},
        DEPENDS, expected_note="delta > 0: HANG at the barrier; delta < 0: MISMATCH/RACE (opens "
        "early) or HANG (leftover arrivals). Count-less barriers (sync_threads) and pipeline-init "
        "syncs are not counted",
        patches=("cute.arch.barrier", "cute.arch.barrier_arrive"),
        apply=_apply_wrong_barrier_threads, refine=_refine_barrier_threads),
    Fault(
        "early_exit", "the warps of one role exit (PTX exit) where they should arrive: before "
        "consumer_release (consumer) or producer_commit (producer), when the state's count == "
        "at_iteration (an early `return` in a role's loop)",
        {"role": Param(str, "consumer", "whose warps leave", choices=("producer", "consumer")),
         "at_iteration": Param(int, 0, "state count at which they leave (run-time test)",
                               minimum=0),
         "pipeline": _PIPELINE},
        "HANG", expected_note="consumer: the empty barrier misses their releases -> producer_acquire "
        "(next lap) or producer_tail waits forever; producer: no later stage is filled -> "
        "consumer_wait waits forever (PipelineTmaAsync's commit is a no-op: the stage being "
        "filled still lands)",
        patches=("PipelineAsync.consumer_release / producer_commit and overrides",),
        apply=_apply_early_exit),
    Fault(
        "never_set", "kernel switch: waiters spin on a flag in global memory that is never "
        "stored", {},
        "HANG", kind="switch", expected_note="an unbounded spin without mbarrier: probes see no "
        "stuck wait, only a stall; printf-bisection localizes it"),
)}
