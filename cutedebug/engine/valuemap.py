"""Where the wrong values are: a small map of a mismatching output, laid over the kernel's tiling.

Runs in the worker (torch is there; the parent never imports this module's torch code):
``collect(out, ref, good, tiling)`` turns the comparison's mask into a JSON-able map that the
``checked`` event carries; ``save_mask`` / ``load_mask`` keep the mask itself as a small
compressed file (the recorded fixture the classifier's tests replay). The classifier that names
the failure-table row is ``cutedebug.analyses.mismatch``; it reads only this map.

The tiling comes from the kernel's optional ``tiling()`` (see ``cutedebug/kernel_api.py``):

    {"shape": [R, C],          the output viewed as an R x C matrix (row-major reshape)
     "tile": [tm, tn],         the output tile one CTA computes per work unit
     "stages": S,              ring depth of the main pipeline (optional)
     "k_tiles": K,             ring slots one tile consumes (1 for a streaming kernel)
     "tile_cta": [[...]],      CTA of each tile, tiles_r x tiles_c (optional, -1: none)
     "tile_seq": [[...]]}      the tile's 0-based position in its CTA's work order (optional)

Without a tiling (or when it does not fit the output) the output is one row of tiles of one
element each: the map then only says how much is wrong, not where in the tiling.
"""

from __future__ import annotations

import contextlib
import gzip
import inspect
import json
import math
from pathlib import Path
from typing import Any

MAX_TILES = 65536  # larger tile grids keep counts per tile row/column only
MAP_VERSION = 1


def check_tiling(tiling: Any, numel: int) -> tuple[dict[str, Any] | None, str | None]:
    """(normalized tiling, None) or (None, why it cannot be used for this output)."""
    if tiling is None:
        return None, "the kernel has no tiling()"
    if not isinstance(tiling, dict):
        return None, f"tiling() returned {type(tiling).__name__}, not a dict"
    try:
        rows, cols = (int(x) for x in tiling["shape"])
        tm, tn = (int(x) for x in tiling["tile"])
    except (KeyError, TypeError, ValueError) as e:
        return None, f"tiling() needs shape [R, C] and tile [tm, tn] ({type(e).__name__}: {e})"
    if rows * cols != numel or min(rows, cols, tm, tn) < 1:
        return None, (
            f"tiling() shape {rows}x{cols} / tile {tm}x{tn} does not fit an output "
            f"of {numel} elements"
        )
    out: dict[str, Any] = {
        "shape": [rows, cols],
        "tile": [tm, tn],
        "stages": int(tiling.get("stages") or 0) or None,
        "k_tiles": int(tiling.get("k_tiles") or 1),
    }
    tr, tc = -(-rows // tm), -(-cols // tn)
    for key in ("tile_cta", "tile_seq"):
        grid = tiling.get(key)
        if grid is None:
            continue
        if len(grid) != tr or any(len(r) != tc for r in grid):
            return None, f"tiling() {key} must be {tr} x {tc} (one entry per tile)"
        out[key] = [[int(v) for v in r] for r in grid]
    return out, None


def collect(out, ref, good, tiling: Any, atol: float = 1e-5, rtol: float = 1e-5) -> dict[str, Any]:
    """The map of ``~good`` (a bool tensor shaped like the output) over the tiling. With the
    values (``out``, ``ref``), also what the wrong values are (NaN, zero) and whether they are
    the right values of another place (``displacement``; atol / rtol as the comparison's)."""
    import torch

    bad = (~good).reshape(-1)
    numel = bad.numel()
    t, why = check_tiling(tiling, numel)
    if t is None:
        t = {"shape": [1, numel], "tile": [1, 1], "stages": None, "k_tiles": 1}
    rows, cols = t["shape"]
    tm, tn = t["tile"]
    tr, tc = -(-rows // tm), -(-cols // tn)
    grid = torch.zeros(tr * tm, tc * tn, dtype=torch.uint8)
    grid[:rows, :cols] = bad.reshape(rows, cols)
    blocks = grid.view(tr, tm, tc, tn)
    # two passes over the mask; every count below is a sum of these small partials
    by_row = blocks.sum(dim=3, dtype=torch.int32)  # (tile row, in-tile row, tile column)
    by_col = blocks.sum(dim=1, dtype=torch.int32)  # (tile row, tile column, in-tile column)
    fr, fc = rows // tm, cols // tn  # the tiles that lie wholly inside the output
    m: dict[str, Any] = {
        "version": MAP_VERSION,
        "tiling": t,
        "tiling_problem": why,
        "tiles": [tr, tc],
        "n_bad": int(by_row.sum()),
        "numel": numel,
        "partial_rows": rows % tm,
        "partial_cols": cols % tn,
        "in_tile_row_bad": by_row.sum(dim=(0, 2)).tolist(),
        "in_tile_col_bad": by_col.sum(dim=(0, 1)).tolist(),
        "tile_row_bad": by_row.sum(dim=(1, 2)).tolist(),
        "tile_col_bad": by_col.sum(dim=(0, 2)).tolist(),
        "full_tile_in_row_bad": by_row[:fr, :, :fc].sum(dim=(0, 2)).tolist() if fr and fc else [],
        "full_tile_in_col_bad": by_col[:fr, :fc].sum(dim=(0, 1)).tolist() if fr and fc else [],
    }
    if tr * tc <= MAX_TILES:
        m["tile_bad"] = by_row.sum(dim=1).tolist()
    if out is not None and ref is not None and m["n_bad"]:
        m.update(value_facts(out, ref, good, rows, cols, tm, tn, atol, rtol, tiled=why is None))
    return m


def value_facts(
    out,
    ref,
    good,
    rows: int,
    cols: int,
    tm: int,
    tn: int,
    atol: float,
    rtol: float,
    *,
    tiled: bool,
    budget: int = 1 << 22,
) -> dict[str, Any]:
    """What the wrong values are (NaN, zero, inf, mean error) and whether they are the right
    values of another place (``displacement``), on every k-th row so that at most ``budget``
    elements are read (k = 1 for outputs up to 4M elements; ``sampled_rows_every`` says k)."""
    import torch

    every = max(1, -(-rows * cols // budget))
    o = out.detach().float().reshape(rows, cols)[::every]
    r = ref.detach().float().reshape(rows, cols)[::every]
    bad = ~good.reshape(rows, cols)[::every]
    ob, rb = o[bad], r[bad]
    facts: dict[str, Any] = {
        "bad_values": {
            "nan": int(torch.isnan(ob).sum()),
            "zero": int((ob == 0).sum()),
            "inf": int(torch.isinf(ob).sum()),
            "mean_abs_err": _finite(float((ob - rb).abs().nanmean())) if ob.numel() else None,
            "sampled_rows_every": every,
        }
    }
    if tiled:
        shift = displacement(
            o, ref.detach().float().reshape(rows, cols), bad, every, tm, tn, atol, rtol
        )
        if shift is not None:
            facts["displacement"] = shift
    return facts


def displacement(
    o, ref, bad, every: int, tm: int, tn: int, atol: float, rtol: float, sample: int = 1 << 20
) -> dict[str, Any] | None:
    """The shift (whole tiles: 1-2 tile rows or 1 tile column, either way) whose reference
    value the wrong outputs equal most often: {"rows", "cols", "matched", "of"}; None when no
    wrong output is a candidate. ``o`` / ``bad``: every ``every``-th row of the output and its
    mask; ``ref``: the whole reference. At most ``sample`` wrong elements are compared."""
    import torch

    rows, cols = ref.shape
    # NaN and zero are what unwritten or zero-filled outputs hold: they prove no displacement
    li, j = (bad & ~torch.isnan(o) & (o != 0)).nonzero(as_tuple=True)
    if not li.numel():
        return None
    if li.numel() > sample:
        pick = torch.linspace(0, li.numel() - 1, sample).long()
        li, j = li[pick], j[pick]
    i, vals = li * every, o[li, j]
    best = None
    for dr, dc in ((tm, 0), (-tm, 0), (2 * tm, 0), (-2 * tm, 0), (0, tn), (0, -tn)):
        si, sj = i - dr, j - dc  # out[i, j] is ref[i - dr, j - dc] when displaced by (dr, dc)
        inside = (si >= 0) & (si < rows) & (sj >= 0) & (sj < cols)
        src = ref[si.clamp(0, rows - 1), sj.clamp(0, cols - 1)]
        hits = int((torch.isclose(vals, src, atol=atol, rtol=rtol) & inside).sum())
        if best is None or hits > best["matched"]:
            best = {"rows": dr, "cols": dc, "matched": hits, "of": int(li.numel())}
    return best


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def save_mask(path: Path | str, good, tiling: Any, extra: dict[str, Any] | None = None) -> None:
    """The mismatch mask as a gzip file: one JSON header line, then the mask bit-packed (MSB
    first, row-major). Small for structured masks (a few KB for a 2000 x 2052 output)."""
    import torch

    bad = (~good).reshape(-1).to(torch.uint8)
    pad = (-bad.numel()) % 8
    if pad:
        bad = torch.cat([bad, torch.zeros(pad, dtype=torch.uint8)])
    weights = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)
    packed = (bad.view(-1, 8) * weights).sum(dim=1).to(torch.uint8)
    header = {
        "version": MAP_VERSION,
        "numel": int(good.numel()),
        "shape": list(good.shape),
        "tiling": tiling,
        **(extra or {}),
    }
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(json.dumps(header).encode() + b"\n")
        f.write(packed.numpy().tobytes())


def load_mask(path: Path | str):
    """(header, bool tensor of the bad elements, flat) from a ``save_mask`` file."""
    import torch

    with gzip.open(path, "rb") as f:
        header = json.loads(f.readline())
        data = f.read()
    packed = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    bits = ((packed[:, None] >> torch.arange(7, -1, -1, dtype=torch.uint8)) & 1).reshape(-1)
    return header, bits[: header["numel"]].bool()


PROTOCOL_OPS = (
    "consumer_wait",
    "consumer_release",
    "producer_acquire",
    "producer_commit",
    "tma_copy",
)


def protocol_sites(protocol: Any) -> list[dict[str, Any]]:
    """The kernel lines of its pipeline ops, from the lint recorder's protocol (duck-typed:
    ``.events`` with kind / pipeline / file / line), one entry per distinct line: what a
    diagnosis can point at (the wait, the release, the copy)."""
    seen, out = set(), []
    for ev in getattr(protocol, "events", []) or []:
        via = getattr(ev, "via", None)  # a helper's own line (the sanitizer's ordering reads it)
        key = (ev.kind, ev.file, ev.line, via)
        if ev.kind in PROTOCOL_OPS and ev.file and key not in seen:
            seen.add(key)
            site = {"op": ev.kind, "pipeline": ev.pipeline, "file": ev.file, "line": ev.line}
            if via:
                site["via"] = via
            if ev.kind in ("consumer_release", "producer_commit"):
                # how it arrives (the sanitizer's ordering credits only a release / commit
                # whose arrive covers every thread that called it)
                d = ev.detail or {}
                site["arrives"] = d.get("arrives", 0)
                site["conditional"] = bool(d.get("conditional_arrives"))
                site["syncs_before"] = list(d.get("syncs_before") or [])
                site["method"] = d.get("method")
                site["owner"] = d.get("owner")
            out.append(site)
    return out[:64]


def raw_wait_sites(protocol: Any) -> list[dict[str, Any]]:
    """The kernel lines of its raw mbarrier waits (``cute.arch.mbarrier_wait`` / try_wait
    outside any pipeline op), one entry per line: shared memory the kernel orders by mbarriers
    without cutlass.pipeline (what the sanitizer's mbarrier caveat looks for)."""
    seen, out = set(), []
    for ev in getattr(protocol, "events", []) or []:
        if ev.kind == "mbarrier_wait" and ev.file and (ev.file, ev.line) not in seen:
            seen.add((ev.file, ev.line))
            out.append({"op": ev.kind, "pipeline": None, "file": ev.file, "line": ev.line})
    return out[:32]


def store_sites(copy_sites: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The copies that write global memory (a gmem destination, or a TMA store), one per line:
    where the kernel stores its output (instrument.value_faults.record_copy_sites records)."""
    seen, out = set(), []
    for s in copy_sites or []:
        atom = str(s.get("atom", "")).lower()
        if (s.get("dst_space") == "gmem" or "tma_store" in atom) and s.get("file"):
            key = (s["file"], s["line"])
            if key not in seen:
                seen.add(key)
                out.append(
                    {"op": "store", "file": s["file"], "line": s["line"], "atom": s.get("atom")}
                )
    return out[:32]


def mismatch_fields(
    kernel, out, ref, atol: float, rtol: float, dump_dir: str | None, digest: str | None = None
) -> dict[str, Any]:
    """The worker's ``checked`` fields for a mismatch: the map over the kernel's tiling and the
    mask itself as mismatch_mask.gz in the run directory. Never raises: a failure is reported
    as ``mismatch_map_error`` (the map is extra evidence, the verdict stands without it)."""
    try:
        import torch

        o, r = out.detach().float().cpu(), ref.detach().float().cpu()
        good = torch.isclose(o, r, atol=atol, rtol=rtol)
        tiling = kernel.tiling() if callable(getattr(kernel, "tiling", None)) else None
        fields: dict[str, Any] = {"mismatch_map": collect(o, r, good, tiling, atol, rtol)}
        if dump_dir:
            path = Path(dump_dir) / "mismatch_mask.gz"
            save_mask(path, good, tiling, {"digest": digest})
            fields["mismatch_mask"] = path.name
        return fields
    except Exception as e:
        return {"mismatch_map_error": f"{type(e).__name__}: {e}"[:500]}


def alignment_fields(
    error: Exception, copy_sites: list[dict[str, Any]], kernel: Any = None, args: tuple = ()
) -> dict[str, Any]:
    """Evidence for the two alignment errors the DSL raises while compiling ({} for others):
    - the verifier's "'cute.copy' op ... ptr alignment (32 bits) does not meet requirement
      (128 bits)", which carries no source line: the cute.copy calls traced before it (file:line,
      atom, provable alignment), so the diagnosis can point at the copy;
    - "Tensor data pointer is not aligned to 16 bytes" (an argument's assumed_align is larger
      than its pointer's alignment): which arguments, their names in the kernel's __call__,
      the alignment each pointer really has, and the lines of the kernel's cute_args that make
      the claim (from_dlpack / make_ptr)."""
    text = " ".join(str(error).split())  # the DSL wraps its message over lines
    if "alignment" in text and "does not meet requirement" in text:
        return {"copy_sites": [s for s in copy_sites if s.get("atom") != "autovec"][:64]}
    if "pointer is not aligned to" not in text:
        return {}
    names: list[str] = []
    with contextlib.suppress(TypeError, ValueError):
        names = [n for n in inspect.signature(type(kernel).__call__).parameters if n != "self"]
    bad = []
    for i, a in enumerate(args):
        claim, ptr = getattr(a, "_assumed_align", None), getattr(a, "data_ptr", None)
        if isinstance(claim, int) and isinstance(ptr, int) and claim > 1 and ptr % claim:
            bad.append(
                {
                    "arg": i,
                    "name": names[i] if i < len(names) else None,
                    "assumed_align": claim,
                    "pointer_align": ptr & -ptr,
                }
            )
    claims = []
    with contextlib.suppress(OSError, TypeError):
        src, first = inspect.getsourcelines(type(kernel).cute_args)
        path = inspect.getsourcefile(type(kernel).cute_args)
        claims = [
            f"{path}:{first + k}"
            for k, ln in enumerate(src)
            if "from_dlpack" in ln or "make_ptr" in ln or "assumed_align" in ln
        ]
    return {"misaligned_args": bad, "claim_lines": claims[:8]}


def tile_sizes(m: dict[str, Any]) -> list[list[int]]:
    """Elements of each tile of a map that lie inside the output."""
    rows, cols = m["tiling"]["shape"]
    tm, tn = m["tiling"]["tile"]
    tr, tc = m["tiles"]
    return [[min(tm, rows - i * tm) * min(tn, cols - j * tn) for j in range(tc)] for i in range(tr)]
