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

ROWS = ("alignment", "tile_edges", "stale_smem", "register_smem")


# ---- patch faults (handlers registered with the instrumentation layer) ---------------------


def _apply_skip_consumer_wait(fx: Any) -> dict[str, Any]:
    """consumer_wait is not performed when the state's count == at_iteration (-1: never)."""
    from cutlass.cutlass_dsl import if_generate

    k = fx.args["at_iteration"]

    def consumer_wait(call: Any) -> Any:
        pipe = call.self_obj
        if not call.outermost or not _has_empty(pipe) or not fx.selects(call):
            return call.proceed()
        pname = type(pipe).__name__
        count = getattr(call.state(), "count", None)
        static = _static_value(count)
        if k == -1 or count is None or static is not None:
            if k == -1 or count is None or static == k:
                fx.site(
                    call,
                    "consumer_wait",
                    "consumer_wait skipped"
                    + (
                        " at every iteration"
                        if k == -1
                        else f" (the state has {'no' if count is None else 'a static'} count)"
                    ),
                    pipeline=pname,
                    at_iteration=k,
                    **fx.extra(),
                )
                return None
            return call.proceed()
        if_generate(count != k, lambda: call.proceed(ip=None), loc=call.loc, ip=call.ip)
        fx.site(
            call,
            "consumer_wait",
            f"consumer_wait skipped when state.count == {k} (run-time test)",
            pipeline=pname,
            at_iteration=k,
            **fx.extra(),
        )
        return None

    return {"consumer_wait": consumer_wait}


def _apply_release_before_read(fx: Any) -> dict[str, Any]:
    """Each consumer_release happens right after the consumer_wait of the same stage (before
    the consumers read it); the kernel's own release call sites do nothing. The arrive count
    per stage is unchanged, only its position moves."""
    moving = [False]  # the release this fault makes: not removed by its own handler

    def consumer_wait(call: Any) -> Any:
        out = call.proceed()
        pipe = call.self_obj
        if call.outermost and _has_empty(pipe) and fx.selects(call):
            moving[0] = True
            try:  # as the kernel would call it: the observers below see the release
                call.layer.call_as_kernel(
                    pipe.consumer_release, call.state(), loc=call.loc, ip=call.ip
                )
            finally:
                moving[0] = False
            fx.site(
                call,
                "consumer_wait",
                "consumer_release moved to right after this wait: the producer may refill "
                "the stage while it is read",
                pipeline=type(pipe).__name__,
                **fx.extra(),
            )
        return out

    def consumer_release(call: Any) -> Any:
        pipe = call.self_obj
        if moving[0] or not call.outermost or not _has_empty(pipe) or not fx.selects(call):
            return call.proceed()
        fx.site(
            call,
            "consumer_release",
            "release removed here (done after the wait instead)",
            pipeline=type(pipe).__name__,
            **fx.extra(),
        )
        return None

    return {"consumer_wait": consumer_wait, "consumer_release": consumer_release}


def _apply_drop_copy_pred(fx: Any) -> dict[str, Any]:
    """``cute.copy(atom, src, dst, pred=...)``: the predicate is dropped (every element is
    copied, in bounds or not) at the ``which``-th predicated call site (-1: all)."""
    which = fx.args["which"]
    traced = [0]

    def copy(call: Any) -> Any:
        if call.kwargs.get("pred") is not None:
            index, traced[0] = traced[0], traced[0] + 1
            if which in (-1, index):
                fx.site(
                    call,
                    "copy",
                    f"pred= dropped at predicated copy {index}: "
                    "out-of-bounds elements of edge tiles are copied",
                    copy_index=index,
                )
                call.kwargs["pred"] = None
        return call.proceed()

    return {"copy": copy}


def _has_empty(pipe: Any) -> bool:
    return getattr(pipe, "sync_object_empty", None) is not None


def _static_value(x: Any) -> Any:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _apply_shrink_tma_bounds(fx: Any) -> dict[str, Any]:
    """A TMA copy's bounds are its predicate: the global tensor a TMA atom is made from gets
    each tiled mode rounded down to a whole number of tiles (``copies``: stores, loads or
    both), so the partial tiles at the edges are clipped away (stores) or zero-filled (loads)."""
    from cutlass import cute

    which = fx.args["copies"]

    def make_tiled_tma_atom(call: Any) -> Any:
        op, gmem_tensor, cta_tiler = (
            call.arg(0, "op"),
            call.arg(1, "gmem_tensor"),
            call.arg(3, "cta_tiler"),
        )
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
                    static = _static_value(extent)
                    if static is not None and static < tile:
                        raise fx.error(f"shrink_tma_bounds: mode {k} extent {static} < tile {tile}")
                    new.append(extent // tile * tile)
                before = [_static_value(x) for x in shape]
                after = [_static_value(x) for x in new]
                call.set_arg(
                    1,
                    "gmem_tensor",
                    cute.make_tensor(
                        gmem_tensor.iterator,
                        cute.make_layout(tuple(new), stride=gmem_tensor.stride),
                    ),
                )
                fx.site(
                    call,
                    "make_tiled_tma_atom",
                    f"{'store' if store else 'load'} bounds rounded down to whole tiles "
                    f"{list(tiler)}: {before} -> {after} (None: run-time extent)",
                    copy="store" if store else "load",
                )
        return call.proceed()

    return {"make_tiled_tma_atom": make_tiled_tma_atom}


# ---- the registry entries --------------------------------------------------------------------


def entries() -> list[F.Fault]:
    at_iteration = F.Param(
        int,
        0,
        "consumer state count at which the wait is skipped (run-time test); -1 = every iteration",
        minimum=-1,
    )
    from cutedebug.instrument.fault_catalog import _PIPELINE as pipeline

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
            error_at_run=True,
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
    what the DSL can prove about the view; atom "autovec" for autovec_copy). A "recorder"
    observer of the instrumentation layer: the traced code is the same with and without it."""
    from cutedebug.instrument import layer

    sites: list[dict[str, Any]] = []

    def note(call: Any, atom: Any, src: Any, dst: Any) -> None:
        where = call.site
        with contextlib.suppress(Exception):  # recording never changes what is traced
            site = {
                "file": where.file,
                "line": where.line,
                "function": where.function,
                "atom": atom if isinstance(atom, str) else str(getattr(atom, "type", atom))[:200],
                "src_align_bits": _alignment_bits(src),
                "dst_align_bits": _alignment_bits(dst),
                "src_space": _space(src),
                "dst_space": _space(dst),
            }
            if site not in sites:  # unrolled loops trace one call many times
                sites.append(site)

    def copy(call: Any) -> Any:
        note(call, call.arg(0, "atom"), call.arg(1, "src"), call.arg(2, "dst"))
        return call.proceed()

    def autovec_copy(call: Any) -> Any:
        note(call, "autovec", call.arg(0, "src"), call.arg(1, "dst"))
        return call.proceed()

    with layer.observe("recorder", {"copy": copy, "autovec_copy": autovec_copy}):
        yield sites
