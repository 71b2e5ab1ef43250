"""The DSL entry points the instrumentation layer hooks (layer.py), one table.

Each entry says where it lives, how it is hooked, which DSL versions it was checked on and who
uses it; ``resolve`` finds it in the installed DSL or raises ``Unsupported`` with a message
that names the entry, the version found and the versions checked. ``cutedebug`` imports no
cutlass here until ``resolve``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

CHECKED_ON = ("4.8.1",)
PIPELINE_OPS = (
    "producer_acquire",
    "producer_try_acquire",
    "producer_commit",
    "consumer_wait",
    "consumer_try_wait",
    "consumer_release",
    "producer_tail",
    "producer_get_barrier",
)
WAIT_OPS = {"full": "consumer_wait", "empty": "producer_acquire"}


class Unsupported(RuntimeError):
    """An entry point cutedebug hooks is missing from the installed DSL."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One hooked DSL entry point."""

    name: str  # how observers name it
    module: str  # where it is defined
    attr: str  # "Class.method" or "function"
    # pipeline_method | method | function | module_function | property (a property's getter,
    # on the class and every subclass that redefines it) | subclass_method (a method that
    # libraries add to their subclasses of the DSL class: hooked where a subclass defines it)
    kind: str
    user_op: bool = True  # takes loc= / ip= (wrapped like the DSL's own ops)
    always: bool = False  # observed even when called by instrumentation code
    checked: tuple[str, ...] = CHECKED_ON
    used_by: str = ""
    # observation only (a recorder's detail): a DSL without it is still supported, the
    # observers just see nothing there (the layer notes it in ``missing``)
    optional: bool = False
    # subclass_method: the libraries whose subclasses define it, as checked ("pkg version")
    libraries: tuple[str, ...] = ()
    # subclass_method: the parameters its definitions must start with (else not hooked,
    # noted in the layer's ``missing``)
    params: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "where": f"{self.module}.{self.attr}",
            "kind": self.kind,
            "checked_on": list(self.checked),
            "libraries": list(self.libraries),
            "used_by": self.used_by,
        }


def _pm(op: str, used_by: str, user_op: bool = True) -> Entry:
    return Entry(
        op, "cutlass.pipeline", f"PipelineAsync.{op}", "pipeline_method", user_op, used_by=used_by
    )


def _arch(name: str, used_by: str, module: str = "cutlass.cute.arch") -> Entry:
    return Entry(name, module, name, "function", used_by=used_by)


# Every DSL entry point cutedebug hooks. pipeline_method: PipelineAsync and every subclass that
# defines the method itself (library or user). function: every module global bound to it
# (names imported with `from`) is rebound. module_function: only the DSL's own modules' names.
ENTRY_POINTS: tuple[Entry, ...] = (
    *(_pm(op, "faults, checkpoint, recorder") for op in PIPELINE_OPS),
    Entry(
        "create",
        "cutlass.pipeline",
        "PipelineAsync.create",
        "pipeline_method",
        False,
        used_by="layer (pipeline identity), faults, recorder",
    ),
    Entry(
        "_make_sync_object",
        "cutlass.pipeline",
        "PipelineAsync._make_sync_object",
        "pipeline_method",
        False,
        used_by="layer (full/empty side of a barrier array)",
    ),
    Entry(
        "array.__init__",
        "cutlass.pipeline.helpers",
        "MbarrierArray.__init__",
        "method",
        used_by="layer, faults (arrive count), recorder",
    ),
    Entry(
        "array.wait", "cutlass.pipeline.helpers", "MbarrierArray.wait", "method", used_by="probes"
    ),
    Entry(
        "array.arrive",
        "cutlass.pipeline.helpers",
        "MbarrierArray.arrive",
        "method",
        used_by="recorder",
    ),
    Entry(
        "array.__new_from_mlir_values__",
        "cutlass.pipeline.helpers",
        "MbarrierArray.__new_from_mlir_values__",
        "method",
        False,
        True,
        used_by="layer (identity of rebuilt arrays)",
    ),
    Entry(
        "array.recast_to_new_op_type",
        "cutlass.pipeline.helpers",
        "MbarrierArray.recast_to_new_op_type",
        "method",
        False,
        True,
        used_by="layer (identity of recast arrays)",
    ),
    Entry(
        "state.__init__",
        "cutlass.pipeline.helpers",
        "PipelineState.__init__",
        "method",
        False,
        True,
        used_by="layer (state lineage)",
    ),
    Entry(
        "state.clone",
        "cutlass.pipeline.helpers",
        "PipelineState.clone",
        "method",
        used_by="layer (state lineage)",
    ),
    Entry(
        "state.__new_from_mlir_values__",
        "cutlass.pipeline.helpers",
        "PipelineState.__new_from_mlir_values__",
        "method",
        False,
        True,
        used_by="layer (state lineage)",
    ),
    Entry(
        "state.advance",
        "cutlass.pipeline.helpers",
        "PipelineState.advance",
        "method",
        used_by="faults (missing_phase_flip)",
    ),
    Entry(
        "state.advance_iters",
        "cutlass.pipeline.helpers",
        "PipelineState.advance_iters",
        "subclass_method",
        used_by="faults (missing_phase_flip)",
        libraries=("quack-kernels 0.6.5 (PipelineStateWAdvance)",),
        params=("self", "num_iterations"),
    ),
    Entry(
        "state.phase",
        "cutlass.pipeline.helpers",
        "PipelineState.phase",
        "property",
        False,
        used_by="faults (missing_phase_flip: a state's phase read by kernel code for a raw wait)",
    ),
    Entry(
        "agent_sync",
        "cutlass.pipeline.helpers",
        "agent_sync",
        "module_function",
        used_by="faults (missing_init_fence)",
    ),
    *(
        _arch(n, "faults, checkpoint, recorder, probes")
        for n in (
            "mbarrier_init",
            "mbarrier_init_fence",
            "mbarrier_arrive",
            "mbarrier_arrive_and_expect_tx",
            "mbarrier_expect_tx",
            "mbarrier_wait",
            "mbarrier_try_wait",
            "sync_threads",
            "sync_warp",
            "barrier",
            "barrier_arrive",
            "cluster_arrive",
            "cluster_arrive_relaxed",
            "cluster_wait",
            "fence_view_async_shared",
            "fence_acq_rel_cluster",
        )
    ),
    dataclasses.replace(_arch("store_async_dsmem", "probes (raw barrier senders)"), optional=True),
    dataclasses.replace(
        _arch("wait_group", "recorder", "cutlass.cute.nvgpu.warpgroup"), optional=True
    ),
    _arch("copy", "recorder, value faults", "cutlass.cute"),
    dataclasses.replace(
        _arch("autovec_copy", "value faults (copy sites)", "cutlass.cute"), optional=True
    ),
    _arch("make_tiled_tma_atom", "recorder, value faults", "cutlass.cute.nvgpu.cpasync"),
    Entry(
        "if_generate",
        "cutlass.cutlass_dsl",
        "if_generate",
        "function",
        False,
        True,
        used_by="recorder (run-time conditions)",
    ),
    Entry(
        "if_execute",
        "cutlass.base_dsl.ast_helpers",
        "Executor.if_execute",
        "method",
        False,  # not `always`: an `if` of instrumentation code (a probe's bounded wait) is
        # not kernel code, its body runs unobserved
        used_by="layer (a kernel `if` on a static value: the branch it never takes is dead)",
        optional=True,
    ),
    Entry(
        "launch",
        "cutlass.cutlass_dsl.cutlass",
        "KernelLauncher.launch",
        "method",
        False,
        used_by="recorder (launch shape)",
    ),
)
ENTRIES = {e.name: e for e in ENTRY_POINTS}
# Installed for every observer: pipeline identity and the open-op stack (the semantic op).
_IDENTITY = (
    "if_execute",
    "create",
    "_make_sync_object",
    "array.__init__",
    "array.__new_from_mlir_values__",
    "array.recast_to_new_op_type",
    *PIPELINE_OPS,
)
_LINEAGE = ("state.__init__", "state.clone", "state.__new_from_mlir_values__")


# kinds hooked per class (the class and its subclasses that define the attribute themselves)
PER_CLASS = ("pipeline_method", "method", "property", "subclass_method")


def class_targets(entry: Entry, owner: Any, attr: str, missing: dict[str, str]) -> list[type]:
    """The classes whose own ``attr`` the layer wraps for a per-class entry: PipelineAsync and
    every subclass defining a pipeline method; a state entry's class and its subclasses; a
    subclass_method where a library's subclass defines it with the checked parameters (else
    noted in ``missing``)."""
    from cutedebug.instrument.frames import _subclasses_defining

    if entry.kind == "pipeline_method":
        from cutlass.pipeline import PipelineAsync

        classes = _subclasses_defining(PipelineAsync, attr)
    elif entry.kind == "method" and not entry.name.startswith("state."):
        classes = [owner]
    else:
        classes = _subclasses_defining(owner, attr)
    out = []
    for cls in classes:
        raw = vars(cls)[attr]
        if entry.kind == "property" and not isinstance(raw, property):
            continue
        if entry.kind == "subclass_method" and not _starts_with(raw, entry.params):
            missing[f"{entry.name} ({cls.__module__}.{cls.__qualname__})"] = (
                f"{cls.__qualname__}.{attr} does not take ({', '.join(entry.params)}, ...) as "
                f"checked on {', '.join(entry.libraries)}: not hooked"
            )
            continue
        out.append(cls)
    return out


def _starts_with(fn: Any, params: tuple[str, ...]) -> bool:
    import inspect

    try:
        names = list(inspect.signature(inspect.unwrap(fn)).parameters)
    except (TypeError, ValueError):
        return False
    return names[: len(params)] == list(params)


def dsl_version() -> str:
    try:
        from importlib.metadata import version

        return version("nvidia-cutlass-dsl")
    except Exception:
        return "unknown"


def resolve(entry: Entry) -> tuple[Any, str, Any]:
    """(owner, attribute, original) of an entry point; Unsupported when the DSL lacks it."""
    import importlib

    try:
        owner: Any = importlib.import_module(entry.module)
        *path, attr = entry.attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        # a subclass_method lives on libraries' subclasses: the DSL class is what must exist
        original = getattr(owner, attr, None) if entry.kind == "subclass_method" else None
        if entry.kind != "subclass_method":
            original = getattr(owner, attr)
    except (ImportError, AttributeError) as e:
        raise Unsupported(
            f"UNSUPPORTED: cutedebug hooks {entry.module}.{entry.attr} ({entry.used_by}), which "
            f"nvidia-cutlass-dsl {dsl_version()} does not have ({type(e).__name__}: {e}); "
            f"checked on {', '.join(entry.checked)}"
        ) from e
    return owner, attr, original


def rebound_everywhere() -> list[Any]:
    """The functions the layer rebinds in every module that holds them (entries hooked
    neither per class nor per module): what a fork server freezes its modules against
    (patching.freeze). Entries this DSL lacks are left out."""
    out = []
    for entry in ENTRY_POINTS:
        if entry.kind in PER_CLASS or entry.kind == "module_function":
            continue
        try:
            out.append(resolve(entry)[2])
        except Unsupported:
            continue
    return out


def describe_entry_points() -> list[dict[str, Any]]:
    return [e.describe() for e in ENTRY_POINTS]
