"""Faults for the correctness rows of the kernel-engineering failure table (wrong values).

| row            | symptom                              | faults here                               |
|----------------|--------------------------------------|-------------------------------------------|
| alignment      | copy-alignment verifier error        | switches ``unassumed_align``,             |
|                | (or a misaligned address at run time)| ``overclaimed_align``                     |
| tile_edges     | wrong values at tile edges           | patches ``drop_copy_pred``,               |
|                |                                      | ``shrink_tma_bounds``, switch             |
|                |                                      | ``edge_pred_whole_tiles``                 |
| stale_smem     | stale shared-memory reads            | patches ``skip_consumer_wait``,           |
|                |                                      | ``release_before_read``                   |
| register_smem  | wrong stores after a register update | switch ``stale_smem_store``               |

They join ``faults.FAULTS`` through ``register()``, called once from the package's
``__init__`` (the one hook); this module imports ``faults``, never the other way round.
Patch faults act at trace time like every other registry fault; a switch is a bool param the
kernel declares in ``SWITCHES`` (default off, PTX unchanged when off).

Also here: ``record_copy_sites()``, a trace-time recorder of ``cute.copy`` calls with an explicit
copy atom (file:line, atom, the source and destination alignment the DSL can prove), used to
point a copy-alignment verifier error (which carries no source line) at the copy it came from.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cutedebug.instrument import faults as F
from cutedebug.instrument import frames

ROWS = ("alignment", "tile_edges", "stale_smem", "register_smem")


# ---- patch faults ----------------------------------------------------------------------------


def _apply_skip_consumer_wait(p: F._Patcher, args: dict[str, Any], applied: F.Applied) -> None:
    """consumer_wait is not performed when the state's count == at_iteration (-1: never)."""
    from cutlass.cutlass_dsl import if_generate

    k = args["at_iteration"]
    select = F._PipelineSelector(p, args.get("pipeline", -1))
    depth = F._Depth()
    for cls in F._pipeline_classes("consumer_wait", exclude=("PipelineTmaStore",)):

        def consumer_wait(
            self, state, *rest, _orig=vars(cls)["consumer_wait"], loc=None, ip=None, **kw
        ):
            with depth.enter() as outermost:
                if not outermost or not select.selects(self):
                    return _orig(self, state, *rest, loc=loc, ip=ip, **kw)
                pname = type(self).__name__
                count = getattr(state, "count", None)
                static = F._static_value(count)
                if k == -1 or count is None or static is not None:
                    if k == -1 or count is None or static == k:
                        applied.add_site(
                            "consumer_wait",
                            "consumer_wait skipped"
                            + (
                                " at every iteration"
                                if k == -1
                                else f" (the state has {'no' if count is None else 'a static'}"
                                " count)"
                            ),
                            pipeline=pname,
                            at_iteration=k,
                            **select.extra(),
                        )
                        return None
                    return _orig(self, state, *rest, loc=loc, ip=ip, **kw)
                if_generate(
                    count != k,
                    lambda: _orig(self, state, *rest, loc=loc, ip=None, **kw),
                    loc=loc,
                    ip=ip,
                )
                applied.add_site(
                    "consumer_wait",
                    f"consumer_wait skipped when state.count == {k}"
                    " (run-time test): the stage is read before its data landed",
                    pipeline=pname,
                    at_iteration=k,
                    **select.extra(),
                )
                return None

        p.set_attr(cls, "consumer_wait", F._user_op(consumer_wait))


def _apply_release_before_read(p: F._Patcher, args: dict[str, Any], applied: F.Applied) -> None:
    """Each consumer_release happens right after the consumer_wait of the same stage (before
    the consumers read it); the kernel's own release call sites do nothing. The arrive count
    per stage is unchanged, only its position moves."""
    select = F._PipelineSelector(p, args.get("pipeline", -1))
    wait_depth, release_depth = F._Depth(), F._Depth()
    originals = {}
    for cls in F._pipeline_classes("consumer_release", exclude=("PipelineTmaStore",)):
        originals[cls] = vars(cls)["consumer_release"]

    def original_release(pipe: Any):
        for klass in type(pipe).__mro__:
            if klass in originals:
                return originals[klass]
        return None

    for cls in F._pipeline_classes("consumer_wait", exclude=("PipelineTmaStore",)):

        def consumer_wait(
            self, state, *rest, _orig=vars(cls)["consumer_wait"], loc=None, ip=None, **kw
        ):
            with wait_depth.enter() as outermost:
                out = _orig(self, state, *rest, loc=loc, ip=ip, **kw)
                release = original_release(self)
                if outermost and select.selects(self) and release is not None:
                    release(self, state, loc=loc, ip=ip)
                    applied.add_site(
                        "consumer_wait",
                        "consumer_release moved to right after "
                        "this wait: the producer may refill the stage while it "
                        "is read",
                        pipeline=type(self).__name__,
                        **select.extra(),
                    )
                return out

        p.set_attr(cls, "consumer_wait", F._user_op(consumer_wait))
    for cls, original in originals.items():

        def consumer_release(self, state, *rest, _orig=original, loc=None, ip=None, **kw):
            with release_depth.enter() as outermost:
                if outermost and select.selects(self):
                    applied.add_site(
                        "consumer_release",
                        "release removed here (done after the wait instead)",
                        pipeline=type(self).__name__,
                        **select.extra(),
                    )
                    return None
                return _orig(self, state, *rest, loc=loc, ip=ip, **kw)

        p.set_attr(cls, "consumer_release", F._user_op(consumer_release))


def _apply_drop_copy_pred(p: F._Patcher, args: dict[str, Any], applied: F.Applied) -> None:
    """``cute.copy(atom, src, dst, pred=...)``: the predicate is dropped (every element is
    copied, in bounds or not) at the ``which``-th predicated call site (-1: all)."""
    from cutlass import cute

    which = args["which"]
    traced = [0]
    original = cute.copy

    def copy(atom, src, dst, *rest, pred=None, loc=None, ip=None, **kw):
        if pred is not None:
            index, traced[0] = traced[0], traced[0] + 1
            if which in (-1, index):
                applied.add_site(
                    "copy",
                    f"pred= dropped at predicated copy {index}: "
                    "out-of-bounds elements of edge tiles are copied",
                    copy_index=index,
                )
                pred = None
        return original(atom, src, dst, *rest, pred=pred, loc=loc, ip=ip, **kw)

    p.replace_everywhere(original, copy)


def _apply_shrink_tma_bounds(p: F._Patcher, args: dict[str, Any], applied: F.Applied) -> None:
    """A TMA copy's bounds are its predicate: the global tensor a TMA atom is made from gets
    each tiled mode rounded down to a whole number of tiles (``copies``: stores, loads or
    both), so the partial tiles at the edges are clipped away (stores) or zero-filled (loads)."""
    from cutlass import cute
    from cutlass.cute.nvgpu import cpasync

    which = args["copies"]
    original = cpasync.make_tiled_tma_atom

    def make_tiled_tma_atom(op, gmem_tensor, smem_layout, cta_tiler, *rest, **kw):
        store = "S2G" in type(op).__name__
        if which == "all" or (which == "store") == store:
            shape, tiler = gmem_tensor.shape, cta_tiler
            if isinstance(shape, tuple) and isinstance(tiler, tuple):
                new = []
                for k, extent in enumerate(shape):
                    tile = tiler[k] if k < len(tiler) else None
                    if not isinstance(tile, int) or isinstance(extent, tuple):
                        new.append(extent)
                        continue
                    static = F._static_value(extent)
                    if static is not None and static < tile:
                        raise F.FaultApplyError(
                            f"shrink_tma_bounds: mode {k} extent {static} < tile {tile}"
                        )
                    new.append(extent // tile * tile)
                before = [F._static_value(x) for x in shape]
                after = [F._static_value(x) for x in new]
                gmem_tensor = cute.make_tensor(
                    gmem_tensor.iterator, cute.make_layout(tuple(new), stride=gmem_tensor.stride)
                )
                applied.add_site(
                    "make_tiled_tma_atom",
                    f"{'store' if store else 'load'} bounds rounded down to whole tiles "
                    f"{list(tiler)}: {before} -> {after} (None: run-time extent)",
                    copy="store" if store else "load",
                )
        return original(op, gmem_tensor, smem_layout, cta_tiler, *rest, **kw)

    p.replace_everywhere(original, make_tiled_tma_atom)


# ---- the registry entries --------------------------------------------------------------------


def entries() -> list[F.Fault]:
    at_iteration = F.Param(
        int,
        0,
        "consumer state count at which the wait is skipped (run-time test); -1 = every iteration",
        minimum=-1,
    )
    pipeline = F._PIPELINE
    return [
        F.Fault(
            "skip_consumer_wait",
            "one consumer_wait is not performed (run-time test on the "
            "state's count): the consumers read the stage without waiting for its data",
            {"at_iteration": at_iteration, "pipeline": pipeline},
            "MISMATCH",
            expected_note="row stale_smem: the stage is read before its TMA "
            "landed (at iteration 0: uninitialised smem; later: the previous occupant's data); "
            "the tiles at that position of every CTA are wrong",
            patches=("PipelineAsync.consumer_wait and overrides",),
            apply=_apply_skip_consumer_wait,
        ),
        F.Fault(
            "release_before_read",
            "consumer_release moved to right after consumer_wait (before "
            "the stage's smem reads); the kernel's release sites do nothing",
            {"pipeline": pipeline},
            "MISMATCH",
            expected_note="row stale_smem: the producer may refill a stage while it "
            "is still read (timing-dependent; PASS when the reads win the race)",
            patches=("PipelineAsync.consumer_wait / consumer_release and overrides",),
            apply=_apply_release_before_read,
        ),
        F.Fault(
            "drop_copy_pred",
            "the pred= of tiled copies (cute.copy(..., pred=...)) is dropped",
            {
                "which": F.Param(
                    int,
                    -1,
                    "which predicated cute.copy call site in trace order (0 = first); -1 = all",
                    minimum=-1,
                )
            },
            F.DEPENDS,
            expected_note="row tile_edges: out-of-bounds elements of edge tiles are "
            "loaded (garbage in edge rows/columns: MISMATCH) or stored (MEMORY_ERROR under "
            "memcheck; neighbouring rows overwritten: MISMATCH). Only kernels that predicate "
            "with pred= (not the `if` predicates of kernels/*.py)",
            patches=("cute.copy (pred=)",),
            apply=_apply_drop_copy_pred,
        ),
        F.Fault(
            "shrink_tma_bounds",
            "the global tensor of each TMA atom has its tiled modes rounded down to whole "
            "tiles (a TMA copy's bounds are its predicate)",
            {"copies": F.Param(str, "store", "which TMA atoms", choices=("store", "load", "all"))},
            F.DEPENDS,
            expected_note="row tile_edges. store: the partial tiles' elements past the last "
            "whole tile are never written (MISMATCH in edge tiles only); load: they are "
            "zero-filled (MISMATCH at the edges, or everywhere when a reduction mode such as "
            "K is cut)",
            patches=("cute.nvgpu.cpasync.make_tiled_tma_atom",),
            apply=_apply_shrink_tma_bounds,
        ),
        F.Fault(
            "edge_pred_whole_tiles",
            "kernel switch: the tile-edge predicate (or the TMA "
            "store's bounds) admits whole tiles only: the partial tiles at the M / N edges are "
            "not stored",
            {},
            "MISMATCH",
            kind="switch",
            expected_note="row tile_edges: wrong values (the output's "
            "initial NaN) in the edge tiles only; needs a shape that is not a multiple of the "
            "tile",
        ),
        F.Fault(
            "stale_smem_store",
            "kernel switch: the store reads a shared-memory copy that was "
            "not updated, while the up-to-date value was computed in registers only",
            {},
            "MISMATCH",
            kind="switch",
            expected_note="row register_smem: the same wrong values "
            "in every tile (deterministic), at the positions the stale copy covers",
        ),
        F.Fault(
            "unassumed_align",
            "kernel switch: a 128-bit copy atom on a view whose offset is "
            "only known at run time and is not promised divisible (no cute.assume)",
            {},
            "COMPILE_ERROR",
            kind="switch",
            expected_note="row alignment: the DSL's verifier "
            "rejects the copy ('ptr alignment (32 bits) does not meet requirement (128 bits)')",
        ),
        F.Fault(
            "overclaimed_align",
            "kernel switch: a tensor argument is an offset view (one element into its buffer) "
            "while from_dlpack(..., assumed_align=16) claims 16-byte alignment",
            {},
            "COMPILE_ERROR",
            kind="switch",
            expected_note="row alignment: the DSL checks each tensor argument's pointer against "
            "its assumed_align when it converts the real arguments ('Tensor data pointer is not "
            "aligned to 16 bytes'; a CPU compile with fake tensors does not see it); host side "
            "only, the kernel's code is unchanged",
        ),
    ]


def register(table: dict[str, F.Fault]) -> None:
    """Add this module's faults to the registry (names must not collide)."""
    for fault in entries():
        if fault.name in table and table[fault.name] is not fault:
            raise RuntimeError(f"fault {fault.name!r} is registered twice")
        table[fault.name] = fault


# ---- copy-site recorder (for alignment verifier errors) -------------------------------------


def _alignment_bits(tensor: Any) -> int | None:
    """The pointer alignment in bits that the DSL can prove for a tensor view, if it has one."""
    it = getattr(tensor, "iterator", None)
    align = getattr(it, "max_alignment", None)
    if align is None:
        align = getattr(it, "alignment", None)
    return int(align) * 8 if isinstance(align, int) else None


def _space(tensor: Any) -> str:
    return str(getattr(getattr(tensor, "iterator", None), "memspace", ""))[:40]


@contextlib.contextmanager
def record_copy_sites() -> Iterator[list[dict[str, Any]]]:
    """While active, every ``cute.copy`` / ``cute.autovec_copy`` call site appends {file, line,
    function, atom, src_align_bits, dst_align_bits, src_space, dst_space} once (alignment:
    what the DSL can prove about the view; atom "autovec" for autovec_copy). An observer: the
    traced code is the same with and without it."""
    from cutlass import cute

    sites: list[dict[str, Any]] = []

    def note(atom: Any, src: Any, dst: Any) -> None:
        where = frames.kernel_frame(2)
        with contextlib.suppress(Exception):  # recording never changes what is traced
            site = {
                "file": where[0],
                "line": where[1],
                "function": where[2],
                "atom": atom if isinstance(atom, str) else str(getattr(atom, "type", atom))[:200],
                "src_align_bits": _alignment_bits(src),
                "dst_align_bits": _alignment_bits(dst),
                "src_space": _space(src),
                "dst_space": _space(dst),
            }
            if site not in sites:  # unrolled loops trace one call many times
                sites.append(site)

    original_copy, original_autovec = cute.copy, cute.autovec_copy

    def copy(atom, src, dst, *rest, **kw):
        note(atom, src, dst)
        return original_copy(atom, src, dst, *rest, **kw)

    def autovec_copy(src, dst, *rest, **kw):
        note("autovec", src, dst)
        return original_autovec(src, dst, *rest, **kw)

    patcher = F._Patcher(F.Applied(None, {}))
    try:
        patcher.replace_everywhere(original_copy, copy)
        patcher.replace_everywhere(original_autovec, autovec_copy)
        yield sites
    finally:
        patcher.restore()
