"""The one instrumentation layer: every trace-time hook into the DSL goes through here.

Faults, probes, checkpoints and the lint recorder are *observers*. None of them patches the DSL
itself: each registers handlers for entry points of ``ENTRY_POINTS`` with ``observe(name,
handlers)``; the layer installs one patch per entry point (restored when the last observer
leaves) and runs the handlers of a call in the fixed ``ORDER``, outermost first::

    checkpoint -> perturb -> faults -> recorder -> waitsites -> probes -> the DSL's own function

so the checkpoint marks what the (faulted) op did, a fault changes what the recorder and the
wait table see, and the probes replace the waits last. Several observers of one kind (nested
faults) stack, the one registered last outermost. A new kind of observer takes its place in
ORDER. A handler is ``handler(call) -> result``; it calls
``call.proceed()`` (any number of times, or not at all) to run the rest of the chain, after
changing ``call.args`` / ``call.kwargs`` if it wants to. A DSL call made by handler code itself
(outside ``proceed``) goes straight to the DSL: instrumentation never observes itself.

The layer owns the four rules every observer used to re-implement:

- **the kernel's frame** (``frames.is_library``): installed libraries are kernel code; only the
  DSL, the stdlib proper and cutedebug are not;
- **the semantic op** of a call: the innermost *open* pipeline op (a subclass method, a mixin
  wrapper such as ``consumer_wait_w_index_phase``, or a lambda inside them is still that
  pipeline's op), else, for a wait on a pipeline's barrier array, the barrier's side (full ->
  consumer_wait, empty -> producer_acquire);
- **the site**: the kernel's call site of the outermost open pipeline op: the first frame up
  the stack that is neither library code nor pipeline code (a method whose ``self`` is a
  pipeline / barrier array / pipeline state, or a function nested in one), lifted out of
  helpers to the kernel's own line (``frames.kernel_own_frame``: the @cute.kernel body, its
  nested regions, or a method of the kernel object; a free helper such as quack's
  ``cluster_reduce`` or another object's method is its caller's line); the innermost line in
  between (a pipeline wrapper's, else the helper's) is kept as ``via``;
- **pipeline identity**: pipelines are numbered in the order the kernel traces their outermost
  ``create()`` (``PipelineInfo.index``, what ``pipeline=N`` selects), found again from any
  rebuilt copy through the barrier arrays (their tag follows ``__new_from_mlir_values__``).
  Pipeline states carry a *lineage* (role from the phase they start with: 1 producer, 0
  consumer) that follows clones and rebuilt copies the same way.

Entry points missing from the installed DSL raise ``Unsupported`` naming the entry, the DSL
version found and the versions it was checked on. This module imports cutlass only inside
``observe()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from typing import Any

from cutedebug.instrument import branches, frames

# The entry-point table and the identity records have their own modules; their names are
# part of this module's interface.
from cutedebug.instrument.entry_points import (  # noqa: F401
    _IDENTITY,
    _LINEAGE,
    CHECKED_ON,
    ENTRIES,
    ENTRY_POINTS,
    PER_CLASS,
    PIPELINE_OPS,
    WAIT_OPS,
    Entry,
    Unsupported,
    class_targets,
    describe_entry_points,
    dsl_version,
    resolve,
)
from cutedebug.instrument.frames import (  # noqa: F401  (part of this interface)
    _subclasses_defining,
    is_pipeline_code,
)
from cutedebug.instrument.identity import (  # noqa: F401
    ArrayTag,
    Lineage,
    PipelineInfo,
    Site,
    _static,
    noop_ops,
)

ORDER = ("checkpoint", "perturb", "faults", "recorder", "waitsites", "probes")  # outermost first
_TAG = "_cutedebug_identity"  # attribute on pipelines / arrays / states (object.__setattr__)


@dataclasses.dataclass
class OpenOp:
    """A pipeline op (or create) being traced: what nested calls belong to."""

    op: str
    pipe: Any
    call: Call


# ---- the call --------------------------------------------------------------------------------


class Call:
    """One intercepted call, handed down the observers' chain."""

    def __init__(
        self,
        layer: _Layer,
        entry: Entry,
        original: Callable,
        args: list[Any],
        kwargs: dict[str, Any],
        owner_cls: Any,
    ):
        self.layer, self.entry, self.original = layer, entry, original
        self.args, self.kwargs = args, kwargs
        self.owner_cls = owner_cls  # the class whose attribute was called (methods)
        self.parent: OpenOp | None = layer.open[-1] if layer.open else None
        # inside a branch a static `if` never takes: traced, but it never runs
        self.dead = layer.dead > 0
        self._site: Site | None = None
        self._handlers: list[Callable[[Call], Any]] = []
        self.extra: dict[str, Any] = {}  # what observers pass down the chain

    # what it is
    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def self_obj(self) -> Any:
        return self.args[0] if self.args else None

    @property
    def loc(self) -> Any:
        return self.kwargs.get("loc")

    @property
    def ip(self) -> Any:
        return self.kwargs.get("ip")

    @property
    def outermost(self) -> bool:
        """Called by kernel code, not from inside another pipeline op."""
        return self.parent is None

    @property
    def pipe(self) -> Any:
        """The pipeline object of this call (its own ``self``, else the open op's)."""
        if self.entry.kind == "pipeline_method" and self.name not in (
            "create",
            "_make_sync_object",
        ):
            return self.self_obj
        return self.parent.pipe if self.parent else None

    @property
    def pipeline(self) -> PipelineInfo | None:
        return self.layer.pipeline_of(self.pipe)

    @property
    def op(self) -> str:
        """The semantic op: this pipeline op, or the innermost open one, or the entry's name."""
        if self.entry.kind == "pipeline_method":
            return self.name
        return self.parent.op if self.parent else self.name

    @property
    def site(self) -> Site:
        """The kernel's call site (of the outermost open pipeline op, when one is open)."""
        if self._site is None:
            outer = self.layer.open[0].call if self.layer.open else None
            self._site = (
                outer.site if outer is not None and outer is not self else self.layer.kernel_site()
            )
        return self._site

    def state(self) -> Any:
        """The PipelineState argument of a pipeline op (``state`` or the first argument)."""
        if "state" in self.kwargs:
            return self.kwargs["state"]
        return self.args[1] if len(self.args) > 1 else None

    def arg(self, index: int, name: str, default: Any = None) -> Any:
        if name in self.kwargs:
            return self.kwargs[name]
        return self.args[index] if len(self.args) > index else default

    def set_arg(self, index: int, name: str, value: Any) -> None:
        if name in self.kwargs or len(self.args) <= index:
            self.kwargs[name] = value
        else:
            self.args[index] = value

    # running the rest of the chain
    def proceed(self, **overrides: Any) -> Any:
        """Run the observers below this one, then the DSL's function; ``overrides`` replace
        keyword arguments (e.g. ``ip=None`` inside an if_generate body)."""
        depth = self.extra.get("_depth", 0)
        kwargs = {**self.kwargs, **{k: v for k, v in overrides.items() if k in self.kwargs}}
        saved = (self.kwargs, depth)
        self.kwargs = kwargs
        try:
            if depth < len(self._handlers):
                self.extra["_depth"] = depth + 1
                return self._handlers[depth](self)
            return self.layer.run_original(self)
        finally:
            self.kwargs, self.extra["_depth"] = saved[0], saved[1]


# ---- the layer -------------------------------------------------------------------------------


class _Layer:
    def __init__(self) -> None:
        from cutedebug.instrument.patching import Patcher

        # (rank in ORDER, -registration number, name, handlers): sorted = outermost first;
        # of two observers of one kind (nested faults), the later one is outer
        self.observers: list[tuple[int, int, str, dict[str, Callable[[Call], Any]]]] = []
        self.registered = 0
        self.patcher = Patcher()
        self.installed: set[str] = set()
        self.hooked: set[tuple[type, str]] = set()  # (class, attribute) patched
        self.originals: dict[tuple[type, str], Any] = {}  # (class, attribute) -> unpatched
        self.missing: dict[str, str] = {}  # optional entries this DSL lacks -> why
        self.open: list[OpenOp] = []
        self.modes: list[str] = []  # "handler" | "dsl" for the calls being dispatched
        self.pipelines: list[PipelineInfo] = []
        self.creating: list[dict[str, Any]] = []  # open create() calls, outermost first
        self.lineages: list[Lineage] = []
        self.keep: list[Any] = []  # objects whose tags must outlive the trace
        self.dead = 0  # depth of branches a static `if` never takes (branches.py)

    # ---- installing ----
    def install(self, names: list[str]) -> None:
        """Hook ``names``; class entries also reach subclasses defined since the last call
        (a library imported after cutlass: `cutedebug exec` keeps the layer for a process)."""
        if not self.installed:
            self._own_frames_are_framework()
        frames.forget_pipeline_classes()  # recomputed with the classes defined by now
        everywhere: list[tuple[Any, Any]] = []  # rebound in one pass over the modules
        try:
            for name in names:
                entry = ENTRIES[name]
                if name in self.installed and entry.kind not in PER_CLASS:
                    continue
                try:
                    owner, attr, original = resolve(entry)
                    if any(original is o for o, _ in everywhere):  # an alias: as if one at a time
                        self.patcher.replace_many_everywhere(everywhere)
                        everywhere = []
                        owner, attr, original = resolve(entry)
                except Unsupported as e:
                    if not entry.optional:
                        raise
                    self.missing[name] = str(e)
                    self.installed.add(name)
                    continue
                if entry.kind in PER_CLASS:
                    for cls in class_targets(entry, owner, attr, self.missing):
                        if (cls, attr) not in self.hooked:
                            self._hook(entry, cls, attr)
                elif entry.kind == "module_function":
                    wrapper = self._wrapper(entry, original, None)
                    for mod_name, module in list(sys.modules.items()):
                        if (
                            mod_name.startswith("cutlass.pipeline")
                            and getattr(module, attr, None) is original
                        ):
                            self.patcher.set_attr(module, attr, wrapper)
                else:
                    everywhere.append((original, self._wrapper(entry, original, None)))
                self.installed.add(name)
        finally:  # what was hooked so far, as if rebound one at a time
            self.patcher.replace_many_everywhere(everywhere)

    def _hook(self, entry: Entry, cls: type, attr: str) -> None:
        raw = vars(cls)[attr]
        if isinstance(raw, property):  # the getter is what the kernel calls
            getter = self._wrapper(entry, raw.fget, cls)
            value: Any = property(getter, raw.fset, raw.fdel, raw.__doc__)
        else:
            static = isinstance(raw, staticmethod)
            orig = raw.__func__ if static else raw
            self.originals[(cls, attr)] = orig
            wrapper = self._wrapper(entry, orig, cls)
            value = staticmethod(wrapper) if static else wrapper
        self.patcher.set_attr(cls, attr, value)
        self.hooked.add((cls, attr))

    def new_trace(self) -> None:
        """Number the pipelines of the next trace from 0 again (a layer that outlives one
        trace: `cutedebug exec`'s process-wide probes)."""
        self.pipelines = []

    def _own_frames_are_framework(self) -> None:
        """The DSL gives an op without an explicit loc the first frame outside its own
        modules: cutedebug's instrumentation must not be that frame, or line info would point
        in here instead of at the kernel."""
        with contextlib.suppress(ImportError, AttributeError):
            from cutlass._mlir_helpers import op as op_mod

            op_mod._is_framework_frame(__file__)  # package roots: computed with its prefixes
            self.patcher.set_attr(
                op_mod,
                "_FRAMEWORK_MODULE_PREFIXES",
                (*op_mod._FRAMEWORK_MODULE_PREFIXES, "cutedebug.instrument"),
            )

    def _wrapper(self, entry: Entry, original: Callable, cls: Any) -> Callable:
        layer = self

        if entry.user_op:
            from cutlass.cutlass_dsl import dsl_user_op

            accepts_loc = _accepts_loc(original)

            def dispatch(*args: Any, loc: Any = None, ip: Any = None, **kwargs: Any) -> Any:
                if accepts_loc:
                    kwargs["loc"], kwargs["ip"] = loc, ip
                return layer.dispatch(entry, original, list(args), kwargs, cls)

            dispatch.__name__ = getattr(original, "__name__", entry.attr)
            dispatch.__doc__ = getattr(original, "__doc__", None)
            return dsl_user_op(dispatch)

        def plain(*args: Any, **kwargs: Any) -> Any:
            return layer.dispatch(entry, original, list(args), kwargs, cls)

        plain.__name__ = getattr(original, "__name__", entry.attr)
        plain.__doc__ = getattr(original, "__doc__", None)
        return plain

    # ---- dispatching ----
    def dispatch(
        self, entry: Entry, original: Callable, args: list[Any], kwargs: dict[str, Any], cls: Any
    ) -> Any:
        instrumentation = bool(self.modes) and self.modes[-1] == "handler"
        if instrumentation and not entry.always:
            return original(*args, **kwargs)
        call = Call(self, entry, original, args, kwargs, cls)
        call._handlers = (
            []
            if instrumentation and entry.name not in ("if_generate",)
            else [h[entry.name] for _, _, _, h in self.observers if entry.name in h]
        )
        self.modes.append("handler")
        try:
            return self._bookkeep(call)
        finally:
            self.modes.pop()

    def call_as_kernel(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Call a DSL function from handler code as if the kernel made the call: the
        observers see it (e.g. the relaxed cluster arrive a fault puts in place of one)."""
        self.modes.append("dsl")
        try:
            return fn(*args, **kwargs)
        finally:
            self.modes.pop()

    def run_original(self, call: Call) -> Any:
        self.modes.append("dsl")
        try:
            return call.original(*call.args, **call.kwargs)
        finally:
            self.modes.pop()

    def _bookkeep(self, call: Call) -> Any:
        """The layer's own work around a call: identity, lineage, open ops."""
        name = call.name
        if name == "create":
            return self._create(call)
        if name == "_make_sync_object" and self.creating:
            phase = call.kwargs.get("phase") or None
            self.creating[-1]["phase"] = phase
            try:
                return call.proceed()
            finally:
                self.creating[-1]["phase"] = None
        if name == "array.__init__":
            tag = self._array_side(call)
            call.extra["array_tag"] = tag
            out = call.proceed()
            self._tag(call.self_obj, tag)
            if tag.pipeline is not None:
                tag.pipeline.arrays.setdefault(
                    tag.side or f"array{len(tag.pipeline.arrays)}", call.self_obj
                )
            return out
        if name in (
            "array.__new_from_mlir_values__",
            "array.recast_to_new_op_type",
            "state.clone",
            "state.__new_from_mlir_values__",
        ):
            out = call.proceed()
            tag = getattr(call.self_obj, _TAG, None)
            if tag is not None and out is not None:
                self._tag(out, tag)
            return out
        if name == "if_execute":
            return branches.if_execute(self, call)
        if name == "state.__init__":
            out = call.proceed()
            self._new_state(call)
            return out
        if call.entry.kind == "pipeline_method":
            if call.parent is None:
                call._site = self.kernel_site()
            self.open.append(OpenOp(name, call.self_obj, call))
            try:
                return call.proceed()
            finally:
                self.open.pop()
        return call.proceed()

    # ---- identity ----
    def _create(self, call: Call) -> Any:
        if self.creating:  # a subclass create() calling its base's: the same pipeline
            self.creating[-1]["kwargs"].update(call.kwargs)
            return call.proceed()
        if _is_tma_store(call.owner_cls):  # bulk groups, no mbarriers: not numbered
            return call.proceed()
        site = call._site = self.kernel_site()
        info = PipelineInfo(
            len(self.pipelines),
            getattr(call.owner_cls, "__name__", "?"),
            site.file,
            site.line,
            site.function,
            site.via,
            kwargs=dict(call.kwargs),
        )
        self.pipelines.append(info)
        self.creating.append({"info": info, "kwargs": info.kwargs, "arrays": 0, "phase": None})
        self.open.append(OpenOp("create", None, call))
        try:
            pipe = call.proceed()
        finally:
            self.open.pop()
            self.creating.pop()
        info.obj = pipe
        info.cls = type(pipe).__name__ if pipe is not None else info.cls
        if pipe is not None:
            info.noop_ops = noop_ops(type(pipe), PIPELINE_OPS, self.unpatched)
        info.stages = _static(info.kwargs.get("num_stages"))
        for side in ("full", "empty"):
            array = getattr(pipe, f"sync_object_{side}", None)
            if array is not None and hasattr(array, "__dict__"):
                tag = getattr(array, _TAG, None)
                if tag is None or tag.pipeline is not info:
                    tag = ArrayTag(info, side)
                    self._tag(array, tag)
                tag.side = side
                info.arrays[side] = array
                if info.stages is None:
                    info.stages = _static(getattr(array, "num_stages", None))
        self._tag(pipe, info)
        return pipe

    def unpatched(self, cls: type, attr: str) -> Any:
        """A class's own attribute as the DSL or the library defined it."""
        return self.originals.get((cls, attr), vars(cls)[attr])

    def _array_side(self, call: Call) -> ArrayTag:
        if not self.creating:
            return ArrayTag(None, None)
        ctx = self.creating[-1]
        ctx["arrays"] += 1
        side = ctx["phase"] or (
            "full" if ctx["arrays"] == 1 else "empty" if ctx["arrays"] == 2 else None
        )
        return ArrayTag(ctx["info"], side)

    def _tag(self, obj: Any, tag: Any) -> None:
        with contextlib.suppress(AttributeError, TypeError):
            object.__setattr__(obj, _TAG, tag)
            self.keep.append(obj)

    def pipeline_of(self, pipe: Any) -> PipelineInfo | None:
        if pipe is None:
            return None
        tag = getattr(pipe, _TAG, None)
        if isinstance(tag, PipelineInfo):
            return tag
        for side in ("full", "empty"):
            atag = getattr(getattr(pipe, f"sync_object_{side}", None), _TAG, None)
            if isinstance(atag, ArrayTag) and atag.pipeline is not None:
                return atag.pipeline
        return None

    def array_tag(self, array: Any) -> ArrayTag | None:
        tag = getattr(array, _TAG, None)
        return tag if isinstance(tag, ArrayTag) else None

    def _new_state(self, call: Call) -> None:
        state = call.self_obj
        if getattr(state, _TAG, None) is not None:
            return
        count, index = call.arg(2, "count"), call.arg(3, "index")
        phase = call.arg(4, "phase")
        if _static(count) != 0 or _static(index) != 0 or _static(phase) not in (0, 1):
            return  # rebuilt from run-time values: its lineage comes from where it was copied
        site = self.kernel_site()
        lineage = Lineage(
            len(self.lineages),
            "producer" if _static(phase) == 1 else "consumer",
            call.arg(1, "stages"),
            site.file,
            site.line,
        )
        self.lineages.append(lineage)
        self._tag(state, lineage)

    def lineage_of(self, state: Any) -> Lineage | None:
        tag = getattr(state, _TAG, None)
        return tag if isinstance(tag, Lineage) else None

    # ---- the frame rule ----
    def kernel_site(self) -> Site:
        """First frame up the stack that is kernel code and not pipeline code, lifted out of
        helpers to the kernel's own line (frames.kernel_own_frame); the innermost line in
        between (a pipeline wrapper's, else the helper's) is kept as ``via``."""
        import os

        f = sys._getframe(1)
        via = None
        while f is not None:
            if not frames.is_library(f.f_code.co_filename):
                if not is_pipeline_code(f):
                    own = frames.kernel_own_frame(f)
                    if own is not f and via is None:
                        via = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"
                    return Site(own.f_code.co_filename, own.f_lineno, own.f_code.co_name, via)
                if via is None:
                    via = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"
            f = f.f_back
        return Site(None, None, None, via)


def _is_tma_store(cls: Any) -> bool:
    from cutlass.pipeline import PipelineTmaStore

    return isinstance(cls, type) and issubclass(cls, PipelineTmaStore)


def _accepts_loc(fn: Callable) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return "loc" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


# ---- observers -------------------------------------------------------------------------------

_LAYER: _Layer | None = None


def current() -> _Layer | None:
    """The active layer (None when no observer is registered)."""
    return _LAYER


@contextlib.contextmanager
def observe(name: str, handlers: dict[str, Callable[[Call], Any]]) -> Iterator[_Layer]:
    """Register observer ``name`` (one of ORDER) with handlers per entry name while the
    kernel is traced inside; the patches go when the last observer leaves."""
    global _LAYER
    if name not in ORDER:
        raise ValueError(f"observer {name!r}: not one of {ORDER}")
    unknown = sorted(set(handlers) - set(ENTRIES))
    if unknown:
        raise ValueError(f"observer {name!r}: unknown entry points {unknown}")
    layer = _LAYER
    fresh = layer is None
    if fresh:
        layer = _Layer()
    try:
        layer.install([*_IDENTITY, *_LINEAGE, *handlers])
    except BaseException:
        if fresh:
            layer.patcher.restore()
        raise
    _LAYER = layer
    layer.registered += 1
    record = (ORDER.index(name), -layer.registered, name, handlers)
    layer.observers.append(record)
    layer.observers.sort(key=lambda r: r[:2])
    try:
        yield layer
    finally:
        layer.observers.remove(record)
        if not layer.observers:
            layer.patcher.restore()
            _LAYER = None
