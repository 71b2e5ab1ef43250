"""The fault registry: named, parameterized bugs injected while a kernel is traced.

A ``patch`` fault registers handlers with the instrumentation layer (``layer.py``) inside a
context manager, so ANY kernel traced by ``cute.compile`` inside the context gets the bug,
with no edit of its source; pipeline subclasses and library helpers included (the layer hooks
every PipelineAsync subclass that defines an op, every PipelineState, every barrier array).
Everything is restored on exit, exceptions included. A ``switch`` fault cannot be a patch
(e.g. dropping a tile-edge predicate): the kernel declares it in ``SWITCHES`` and reads a bool
param of the same name (see ``switch_params``).

This module imports neither cutlass nor torch at import time: the harness parent validates
scenario fault specs with it. The entries are in fault_catalog.py, the handlers in
fault_patches.py (cutlass imported inside them only).

Usage (in the worker, around the compile)::

    args = validate(name, args)                      # FaultSpecError on a bad spec
    with inject(name, args) as applied:
        compiled = cute.compile(kernel, *fake_args)
    applied.sites   # [{"fault", "op", "file", "line", "function", "detail", ...}, ...]
    applied.count   # 0: the fault never triggered on this kernel (applied.require() raises;
                    # applied.not_applied() says what was looked for)

A site's file:line is the kernel's call site (an installed library's file is kernel code);
a library wrapper line in between is kept as ``via``.

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
order the kernel traces its outermost ``create()`` (0 = first; a subclass's create calling its
base's is one pipeline; `cutedebug lint` and `cutedebug run` list them with class and file:line);
-1 (the default, left out of the normalized args and the compile key) = every pipeline.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from cutedebug.instrument import frames

VERDICTS = (
    "PASS",
    "MISMATCH",
    "HANG",
    "CRASH",
    "RACE",
    "MEMORY_ERROR",
    "SYNC_ERROR",
    "UNINIT",
    "COMPILE_ERROR",
)
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
        out: dict[str, Any] = {
            "type": self.type.__name__,
            "default": self.default,
            "description": self.description,
        }
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
    # FaultContext -> {layer entry point: handler} (fault_patches.py)
    apply: Callable[[Any], dict[str, Callable[..., Any]]] | None = None
    refine: Callable[[dict[str, Any]], tuple[str, str]] | None = None  # args -> verdict, note
    finish: Callable[[Any, Any], None] | None = None  # (FaultContext, layer) after the trace
    # its COMPILE_ERROR is raised when the DSL converts the real arguments (a GPU run), not by
    # a compile with fake tensors: a compile-only run of it compiles (pytest compile items)
    error_at_run: bool = False

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
        what = (
            ", ".join(fault.patches)
            if fault and fault.patches
            else ", ".join(dict.fromkeys(self.patched)) or "its patched functions"
        )
        return what + "".join(f"; {n}" for n in self.notes)

    def not_applied(self) -> str | None:
        """None when the fault changed the kernel; else one line saying what was looked for."""
        if self.fault is None or self.count:
            return None
        return (
            f"fault {self.fault}{_fmt_args(self.args)} NOT APPLIED: 0 sites while tracing "
            f"(looked for: {self.looked_for()}); the kernel was compiled unmodified"
        )

    def require(self) -> None:
        if self.fault is not None and self.count == 0:
            raise FaultNotTriggered(
                f"fault {self.fault}{_fmt_args(self.args)} never triggered while tracing: "
                f"none of {self.patched or ['its patched functions']} was called by the kernel"
            )

    def add_site(
        self, op: str, detail: str, where: tuple | None = None, **extra: Any
    ) -> dict[str, Any]:
        """Record one altered call; ``where`` = (file, line, function) of the kernel's call
        (the layer's site rule), else the innermost kernel frame."""
        where = where or frames.kernel_frame()
        site = {
            "fault": self.fault,
            "op": op,
            "file": where[0],
            "line": where[1],
            "function": where[2],
            "detail": detail,
            **extra,
        }
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
            raise FaultSpecError(
                f"fault.args.{key} = {args[key]!r}: unknown argument of {name}; "
                f"allowed: {sorted(fault.params) or 'none'}"
            )
    for key, param in fault.params.items():
        value = args.get(key, param.default)
        ok = isinstance(value, param.type) and not (param.type is int and isinstance(value, bool))
        if not ok:
            raise FaultSpecError(
                f"fault.args.{key} = {value!r}: expected {param.type.__name__} (argument of {name})"
            )
        if param.choices is not None and value not in param.choices:
            raise FaultSpecError(
                f"fault.args.{key} = {value!r}: allowed values "
                f"{list(param.choices)} (argument of {name})"
            )
        if param.minimum is not None and value < param.minimum:
            raise FaultSpecError(
                f"fault.args.{key} = {value!r}: must be >= {param.minimum} (argument of {name})"
            )
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


def register(fault: Fault) -> Fault:
    """Add a fault to the registry (a module of more faults calls this at import)."""
    if fault.name in FAULTS:
        raise ValueError(f"fault {fault.name!r} is registered twice")
    if fault.kind == "patch" and fault.apply is None:
        raise ValueError(f"patch fault {fault.name!r} has no apply function")
    FAULTS[fault.name] = fault
    return fault


FAULTS: dict[str, Fault] = {}


def describe_all() -> list[dict[str, Any]]:
    out = []
    for fault in FAULTS.values():
        out.append(
            {
                "name": fault.name,
                "kind": fault.kind,
                "description": fault.description,
                "params": {k: p.describe() for k, p in fault.params.items() if not p.omit_default},
                # absent from validate()'s normalized args while they keep their default
                "optional_params": {
                    k: p.describe() for k, p in fault.params.items() if p.omit_default
                },
                "expected": fault.expected,
                "expected_note": fault.expected_note,
                "patches": list(fault.patches),
            }
        )
    return out


def switch_params(name: str, kernel: Any) -> dict[str, bool]:
    """Kernel params that turn switch fault ``name`` on; FaultSpecError if the kernel lacks it."""
    fault = FAULTS.get(name)
    if fault is None or fault.kind != "switch":
        raise FaultSpecError(
            f"fault.name = {name!r}: not a switch fault; switches: "
            f"{sorted(n for n, f in FAULTS.items() if f.kind == 'switch')}"
        )
    declared = getattr(kernel, "SWITCHES", {}) or {}
    if name not in declared:
        kname = getattr(kernel, "__name__", type(kernel).__name__)
        raise FaultSpecError(
            f"fault.name = {name!r}: kernel {kname} does not declare this "
            f"switch; its SWITCHES: {sorted(declared) or 'none'}"
        )
    return {name: True}


# ---- injection -------------------------------------------------------------------------------


def inject(
    name: str | None,
    args: dict[str, Any] | None = None,
    *,
    kernel: Any = None,
    strict: bool = False,
) -> contextlib.AbstractContextManager[Applied]:
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
    from cutedebug.instrument import layer
    from cutedebug.instrument.fault_patches import FaultContext

    fault = FAULTS[name]
    applied = Applied(name, args, kind=fault.kind)
    if fault.kind == "switch":
        if kernel is not None:
            switch_params(name, kernel)
            applied.sites.append(
                {
                    "fault": name,
                    "op": "switch",
                    "file": None,
                    "line": None,
                    "function": None,
                    "detail": f"kernel param {name}=True",
                }
            )
        else:
            applied.notes.append("switch: set the kernel param through switch_params()")
        yield applied
        return
    assert fault.apply is not None
    fx = FaultContext(args, applied, FaultApplyError)
    handlers = fault.apply(fx)
    applied.patched.extend(handlers)
    with layer.observe("faults", handlers) as active:
        try:
            yield applied
        finally:
            if fault.finish is not None:
                fault.finish(fx, active)
    if strict:
        applied.require()
