"""Wrong values that explain themselves: the failure table's correctness rows, diagnosed.

Rows (``ROWS`` below: symptom and what to check): alignment, tile_edges, stale_smem,
register_smem.

Input: a run's evidence (the worker's ``checked`` event with its ``mismatch_map`` from
``cutedebug.engine.valuemap``, a ``compile_error`` or ``cuda_error`` event) and, for repeated
runs, every repeat's map. ``diagnose_*`` functions are pure (dicts in, dict out); ``attach``
adds the diagnosis to a RunResult's evidence (and its line to ``evidence["diagnosis"]``, which
the report's TL;DR shows); ``cutedebug.reporting.mismatch_map`` draws the map in report.md.

Patterns over the tiling (first match wins): edge tiles only -> tile_edges (changing between
runs -> stale_smem); wrong values that are right values one tile away -> misplaced, no row;
the same rows / columns of every tile, or everywhere, reproducible -> register_smem (not
reproducible -> stale_smem); the tiles at one position of every CTA's work order, periodic by
ring slot, some CTAs only, or scattered tiles -> stale_smem. No tiling: no row. Compile
errors: the verifier's copy alignment, or an argument's assumed_align above its pointer's.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from cutedebug.engine import valuemap
from cutedebug.event import Event
from cutedebug.event_kinds import Checked, ProtocolSites

ROWS = {
    "alignment": (
        "copy-alignment verifier error",
        "alignment of the source view (offsets and slices weaken it), assumed_align "
        "truthfulness, cute.assume on dynamic offsets",
    ),
    "tile_edges": (
        "wrong values at tile edges",
        "the predicate's shape must match the copy atom's value modes; build the "
        "predicate from the identity tensor partitioned like the data",
    ),
    "stale_smem": (
        "stale shared-memory reads",
        "a missing wait or sync before the stage is read; a stage reused before its "
        "consumers are done (release/acquire order, phase flip)",
    ),
    "register_smem": (
        "wrong stores after a register update",
        "the authoritative copy is in registers: smem re-read after only the "
        "registers changed (or the reverse)",
    ),
}

ALIGN_RE = re.compile(
    r"'cute\.copy' op (?P<side>[SD]) ptr alignment \((?P<have>\d+) bits\) "
    r"does not\s+meet requirement \((?P<need>\d+) bits\) of atom "
    r"'(?P<atom>[^']+)'"
)

EDGE_SHARE = 0.95  # of the bad elements in partial tiles: "edge tiles only"
EVERY_TILE = 0.9  # of the tiles hit: "every tile"
DENSE = 0.5  # of the elements bad: "everywhere"
BAND_MAX = 0.75  # a band covers at most this share of a tile's rows / columns
BAND_SHARE = 0.95  # of the bad elements of full tiles inside the band
SUBSET_MAX = 0.5  # "some CTAs" / "some positions": at most this share of them
MISPLACED = 0.9  # of the wrong non-NaN values equal to the reference one shift away


# ---- patterns over one map -------------------------------------------------------------------


def _ranges(xs: list[int]) -> str:
    xs = sorted(set(xs))
    out, start = [], None
    for i, x in enumerate(xs):
        start = x if start is None else start
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ",".join(out)


def _band(hist: list[int], share: float = BAND_SHARE) -> tuple[list[int], float] | None:
    """The in-tile positions holding the bad elements, if they are a proper subset."""
    total = sum(hist)
    if not total:
        return None
    hit = [i for i, v in enumerate(hist) if v]
    if len(hit) > BAND_MAX * len(hist):
        return None
    return hit, sum(hist[i] for i in hit) / total if total else 0.0


def patterns(m: dict[str, Any]) -> dict[str, Any]:
    """Facts about where the bad elements are in one map (no interpretation)."""
    f: dict[str, Any] = {"n_bad": m.get("n_bad", 0), "numel": m.get("numel", 0)}
    if m.get("tiling_problem") or "tile_bad" not in m:
        f["tiled"] = False
        f["why_untiled"] = m.get("tiling_problem") or "tile grid too large for a per-tile map"
        return f
    f["tiled"] = True
    tb = m["tile_bad"]
    sizes = valuemap.tile_sizes(m)
    tr, tc = m["tiles"]
    partial_r, partial_c = m.get("partial_rows", 0) > 0, m.get("partial_cols", 0) > 0
    edge = [
        [(partial_r and i == tr - 1) or (partial_c and j == tc - 1) for j in range(tc)]
        for i in range(tr)
    ]
    cells = [(i, j) for i in range(tr) for j in range(tc)]
    hit = [(i, j) for i, j in cells if tb[i][j]]
    f["tiles_total"], f["tiles_hit"] = len(cells), len(hit)
    f["hit_tiles"] = hit[:4096]
    n_bad = max(1, f["n_bad"])
    f["edge_tiles"] = sum(1 for i, j in cells if edge[i][j])
    f["edge_bad"] = sum(tb[i][j] for i, j in cells if edge[i][j])
    f["edge_share"] = f["edge_bad"] / n_bad
    f["edge_tiles_hit"] = sum(1 for i, j in hit if edge[i][j])
    full = [(i, j) for i, j in cells if not edge[i][j]]
    f["full_tiles_hit"] = sum(1 for i, j in full if tb[i][j])
    f["full_tiles"] = len(full)
    f["dense_tiles"] = sum(1 for i, j in hit if tb[i][j] >= DENSE * sizes[i][j])
    f["bad_frac"] = f["n_bad"] / max(1, f["numel"])
    f["row_band"] = _band(m.get("full_tile_in_row_bad") or [])
    f["col_band"] = _band(m.get("full_tile_in_col_bad") or [])
    t = m["tiling"]
    if "tile_seq" in t and "tile_cta" in t:
        seq, cta = t["tile_seq"], t["tile_cta"]
        ran = [(i, j) for i, j in cells if cta[i][j] >= 0]
        f["ctas_total"] = len({cta[i][j] for i, j in ran})
        f["ctas_hit"] = sorted({cta[i][j] for i, j in hit if cta[i][j] >= 0})
        f["positions_total"] = len({seq[i][j] for i, j in ran})
        f["positions_hit"] = sorted({seq[i][j] for i, j in hit if seq[i][j] >= 0})
        # tiles at a hit position that are still right: a position pattern needs them few
        pos_hit = set(f["positions_hit"])
        at_pos = [(i, j) for i, j in ran if seq[i][j] in pos_hit]
        f["position_coverage"] = (
            sum(1 for c in at_pos if tb[c[0]][c[1]]) / len(at_pos) if at_pos else 0.0
        )
        stages = t.get("stages")
        k_tiles = t.get("k_tiles") or 1
        if stages and k_tiles % stages and stages > 1:
            slots = Counter((seq[i][j] * k_tiles) % stages for i, j in hit)
            f["slots_hit"] = sorted(slots)
            f["slots_total"] = stages
    return f


def _where_tiles(f: dict[str, Any], m: dict[str, Any]) -> str:
    tm, tn = m["tiling"]["tile"]
    return f"{f['tiles_hit']} of {f['tiles_total']} tiles of {tm}x{tn}"


def _offset(shift: dict[str, Any]) -> str:
    """Where out[i, j]'s value belongs: ref[i - rows, j - cols], in words."""
    dr, dc = shift["rows"], shift["cols"]
    if dr:
        return f"{abs(dr)} rows {'above' if dr > 0 else 'below'}"
    return f"{abs(dc)} columns to the {'left' if dc > 0 else 'right'}"


def classify_map(m: dict[str, Any], *, reproducible: bool | None = None) -> dict[str, Any]:
    """{pattern, row (or None), summary, evidence[]} for one map (or a union of repeats').
    ``reproducible``: True when repeated runs gave the same bits, False when they did not."""
    f = patterns(m)
    ev = [
        f"{f['n_bad']} of {f['numel']} elements wrong ({100.0 * f['n_bad'] / max(1, f['numel']):.3g}%)"
    ]
    if not f["tiled"]:
        return {
            "pattern": "untiled",
            "row": None,
            "facts": f,
            "evidence": ev,
            "summary": f"no tiling to lay the wrong values over ({f['why_untiled']})",
        }
    if f["n_bad"] == 0:
        return {
            "pattern": "none",
            "row": None,
            "facts": f,
            "evidence": ev,
            "summary": "no wrong values in this map",
        }
    tm, tn = m["tiling"]["tile"]
    where = _where_tiles(f, m)
    ev.append(f"wrong values in {where}")
    if reproducible is not None:
        ev.append(
            "repeated runs gave the same output bits"
            if reproducible
            else "repeated runs gave different output bits (same inputs)"
        )
    timing = reproducible is False

    def result(pattern: str, row: str, summary: str, *more: str) -> dict[str, Any]:
        return {
            "pattern": pattern,
            "row": row,
            "facts": f,
            "evidence": ev + list(more),
            "summary": summary,
        }

    if f["edge_tiles"] and f["edge_share"] >= EDGE_SHARE and timing:
        return result(
            "edge_tiles",
            "stale_smem",
            f"wrong values only in the partial tiles at the output's edge ({f['edge_tiles_hit']}"
            f" of {f['edge_tiles']} edge tiles), but different on every run: a predicate is "
            "evaluated the same way each run, a race is not: the last tiles' stages are read "
            "early or refilled while read",
        )
    if f["edge_tiles"] and f["edge_share"] >= EDGE_SHARE:
        sides = [
            s
            for s, p in (
                ("last tile row (M edge)", m.get("partial_rows")),
                ("last tile column (N edge)", m.get("partial_cols")),
            )
            if p
        ]
        return result(
            "edge_tiles",
            "tile_edges",
            f"wrong values only in the partial tiles at the output's edge "
            f"({f['edge_tiles_hit']} of {f['edge_tiles']} edge tiles, "
            f"{100 * f['edge_share']:.1f}% of the wrong elements); every full tile is right",
            f"partial tiles: {' and '.join(sides)} (M={m['tiling']['shape'][0]}, "
            f"N={m['tiling']['shape'][1]} vs tile {tm}x{tn})",
        )
    shift = m.get("displacement") or {}
    if shift.get("of") and shift["matched"] >= MISPLACED * shift["of"]:
        return {
            "pattern": "misplaced",
            "row": None,
            "facts": f,
            "evidence": ev
            + [
                f"{shift['matched']} of {shift['of']} wrong values (not NaN or 0) equal the "
                f"reference {shift['rows']} rows / {shift['cols']} columns away"
            ],
            "summary": f"the wrong values are the right values of the element {_offset(shift)}:"
            " tiles stored at the wrong place (an index or offset error), not a row of the table",
        }
    every = f["full_tiles"] and f["full_tiles_hit"] >= EVERY_TILE * f["full_tiles"]
    for axis, band, size in (("rows", f["row_band"], tm), ("columns", f["col_band"], tn)):
        if every and band and band[1] >= BAND_SHARE and size > 1:
            pos = _ranges(band[0])
            what = (
                f"in-tile {axis} {pos} of {size} in {f['full_tiles_hit']} of "
                f"{f['full_tiles']} full tiles"
            )
            if timing:
                return result(
                    f"tile_{axis}",
                    "stale_smem",
                    f"wrong values in {what}, different on every run: part of a "
                    "stage read before it landed or after it was refilled",
                )
            return result(
                f"tile_{axis}",
                "register_smem",
                f"wrong values in {what}, the same way in every tile: a part of the "
                "tile whose store reads a copy that was not updated",
                f"{100 * band[1]:.1f}% of the full tiles' wrong elements lie in {axis} {pos}",
            )
    if every and f["bad_frac"] >= DENSE and f["dense_tiles"] >= EVERY_TILE * f["tiles_hit"]:
        if timing:
            return result(
                "everywhere",
                "stale_smem",
                "wrong values everywhere, and different on every run: a timing "
                "race on the staged data",
            )
        return result(
            "everywhere",
            "register_smem",
            f"every tile wrong ({100 * f['bad_frac']:.0f}% of the elements)"
            + (", the same bits on every run" if reproducible else "")
            + ": the value path, not the timing: a store that reads a copy the "
            "last update never reached (or a wrong formula: rule it out first)",
            *(
                []
                if reproducible
                else [
                    "not repeated: --repeat 2 tells a race (different bits) from a value-path bug"
                ]
            ),
        )
    if "positions_hit" in f and f["positions_total"] > 1:
        pos = f["positions_hit"]
        if (
            f.get("slots_hit")
            and len(pos) > 1
            and len(f["slots_hit"]) <= SUBSET_MAX * f["slots_total"]
        ):
            return result(
                "periodic_stage",
                "stale_smem",
                f"wrong tiles all use ring slot(s) {_ranges(f['slots_hit'])} of "
                f"{f['slots_total']} (work positions {_ranges(pos)}): periodic by stage",
                f"{len(f['ctas_hit'])} CTAs hit",
            )
        if (
            len(pos) <= SUBSET_MAX * f["positions_total"]
            and len(f["ctas_hit"]) > 1
            and f["position_coverage"] >= 0.5
        ):
            return result(
                "work_position",
                "stale_smem",
                f"wrong tiles sit at position(s) {_ranges(pos)} of each CTA's work order "
                f"({len(f['ctas_hit'])} CTAs, {100 * f['position_coverage']:.0f}% of the tiles "
                "at those positions): the same pipeline step goes wrong in every CTA",
                f"{f['positions_total']} positions per CTA; right tiles fill the others",
            )
        if f["ctas_total"] > 1 and len(f["ctas_hit"]) <= SUBSET_MAX * f["ctas_total"]:
            return result(
                "some_ctas",
                "stale_smem",
                f"wrong tiles come from {len(f['ctas_hit'])} of {f['ctas_total']} CTAs "
                f"({_ranges(f['ctas_hit'])}): a per-CTA timing or a CTA-specific path",
                "a per-CTA race on a staged buffer fits; so does a cluster peer's data",
            )
    return result(
        "scattered_tiles",
        "stale_smem",
        f"wrong values scattered over {where} with no edge, band or position "
        "pattern: a stage read early or overwritten while still read",
        "weak: scattered tiles are what a race looks like, but not only a race",
    )


# ---- repeats (NONDETERMINISTIC) -------------------------------------------------------------


def union(maps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The maps of repeated runs merged (counts summed; same tiling needed)."""
    maps = [m for m in maps if m]
    if not maps:
        return None
    base = json.loads(json.dumps(maps[0]))
    for m in maps[1:]:
        if m.get("tiling") != base.get("tiling"):
            return base
        base["n_bad"] += m["n_bad"]
        base["numel"] += m["numel"]
        for key in (
            "in_tile_row_bad",
            "in_tile_col_bad",
            "tile_row_bad",
            "tile_col_bad",
            "full_tile_in_row_bad",
            "full_tile_in_col_bad",
        ):
            if key in base and key in m:
                base[key] = [a + b for a, b in zip(base[key], m[key], strict=False)]
        if "tile_bad" in base and "tile_bad" in m:
            base["tile_bad"] = [
                [a + b for a, b in zip(r1, r2, strict=False)]
                for r1, r2 in zip(base["tile_bad"], m["tile_bad"], strict=False)
            ]
    return base


# ---- compile errors and CUDA errors ---------------------------------------------------------


def _space_text(site: dict[str, Any], side: str) -> str:
    space = site.get("src_space" if side == "S" else "dst_space")
    return f" in {space}" if space else ""


def diagnose_compile_error(ce: dict[str, Any]) -> dict[str, Any] | None:
    """An alignment verifier error: the message, the view, the copy's line, what to check."""
    msg = ce.get("message", "") or ""
    mt = ALIGN_RE.search(" ".join(msg.split()))
    if not mt:
        return _diagnose_pointer_claim(ce)
    side = "source" if mt["side"] == "S" else "destination"
    have, need = int(mt["have"]), int(mt["need"])
    key = "src_align_bits" if mt["side"] == "S" else "dst_align_bits"
    sites = ce.get("copy_sites") or []
    cands = [s for s in sites if s.get(key) is not None and s[key] < need]
    exact = [s for s in cands if s[key] == have]
    same_atom = [s for s in exact or cands if s.get("atom") == mt["atom"]]
    best = same_atom or exact or cands
    lines = sorted({f"{s['file']}:{s['line']}" for s in best if s.get("file")})
    ev = [
        f"verifier: 'cute.copy' {side} pointer alignment {have} bits < {need} bits "
        f"required by atom {mt['atom']}"
    ]
    if best:
        s = best[0]
        ev.append(
            f"the copy: {s.get('function')} at {lines[0] if lines else '?'} "
            f"({side} view{_space_text(s, mt['side'])} proves {s.get(key)} bits)"
            + (f"; {len(lines)} such copies" if len(lines) > 1 else "")
        )
    elif sites:
        ev.append(
            f"none of the {len(sites)} recorded cute.copy calls had a {side} view below {need} bits"
        )
    else:
        ev.append("no cute.copy call was recorded (line unknown)")
    return {
        "row": "alignment",
        "pattern": "verifier",
        "evidence": ev,
        "lines": lines,
        "summary": f"the {side} view of a {need}-bit copy proves only {have}-bit "
        "alignment: the DSL's verifier rejects the copy",
        "view": side,
        "have_bits": have,
        "need_bits": need,
        "atom": mt["atom"],
    }


POINTER_RE = re.compile(r"pointer is not aligned to (?P<need>\d+) bytes")


def _diagnose_pointer_claim(ce: dict[str, Any]) -> dict[str, Any] | None:
    """ "Tensor data pointer is not aligned to 16 bytes": an assumed_align larger than the truth,
    caught by the DSL when it converts the launch arguments."""
    mt = POINTER_RE.search(ce.get("message", "") or "")
    if not mt:
        return None
    need = int(mt["need"])
    bad = ce.get("misaligned_args") or []
    what = ", ".join(
        f"{b.get('name') or 'argument ' + str(b.get('arg'))} (claims {b['assumed_align']} bytes, "
        f"its pointer is {b['pointer_align']}-byte aligned)"
        for b in bad
    )
    ev = [f"the DSL: {' '.join(ce['message'].split())}"]
    ev += [f"misaligned: {what}"] if bad else ["which argument: not recorded"]
    return {
        "row": "alignment",
        "pattern": "assumed_align",
        "lines": [f"assumed_align claimed at {c}" for c in ce.get("claim_lines") or []],
        "evidence": ev,
        "summary": f"an argument's assumed_align ({need} bytes) is larger than its data pointer's "
        "alignment (an offset view or slice): the DSL rejects it when it converts the arguments"
        + (f": {what}" if bad else ""),
        "view": (bad[0].get("name") if bad else None),
        "have_bits": 8 * bad[0]["pointer_align"] if bad else None,
        "need_bits": 8 * need,
    }


def diagnose_cuda_error(cu: dict[str, Any]) -> dict[str, Any] | None:
    if cu.get("name") != "cudaErrorMisalignedAddress":
        return None
    return {
        "row": "alignment",
        "pattern": "misaligned_address",
        "lines": [],
        "evidence": [f"CUDA error {cu.get('name')}: {str(cu.get('message', ''))[:200]}"],
        "summary": "a vector access at a misaligned address at run time: an assumed_align "
        "(from_dlpack / make_ptr) larger than the truth, or an offset view",
    }


# ---- one run ---------------------------------------------------------------------------------


def _events(path: Path) -> list[Event]:
    out = []
    try:
        for line in path.read_text().splitlines():
            try:
                out.append(Event.from_json(json.loads(line)))
            except ValueError:  # a cut or malformed line (RecordError is a ValueError)
                continue
    except OSError:
        pass
    return out


def repeat_maps(run_dir: Path | str, n: int) -> list[dict[str, Any] | None]:
    """Each repeat's checked map, from run_dir/events.jsonl and run_dir/repeat{i}/."""
    out = []
    for i in range(n):
        sub = Path(run_dir) if i == 0 else Path(run_dir) / f"repeat{i}"
        checked = [e.payload for e in _events(sub / "events.jsonl") if e.name == "checked"]
        out.append((checked[-1] if checked else Checked()).mismatch_map)
    return out


def _fault_lines(evidence: dict[str, Any]) -> list[str]:
    sites = (evidence.get("compiled") or {}).get("fault_sites") or []
    return sorted({f"{s['file']}:{s['line']}" for s in sites if s.get("file")})


def _protocol_lines(sites: list[dict[str, Any]] | None, ops: tuple[str, ...]) -> list[str]:
    """'op at file:line' of the kernel's pipeline ops (the worker's protocol_sites event)."""
    out: list[str] = []
    for s in sites or []:
        if not isinstance(s, dict) or s.get("op") not in ops or not s.get("file"):
            continue
        text = f"{s['op']} at {s['file']}:{s.get('line')}"
        if text not in out:
            out.append(text)
    return out


def diagnose(
    verdict: str,
    evidence: dict[str, Any],
    repeats: list[dict[str, Any]] | None = None,
    maps: list[dict[str, Any] | None] | None = None,
    protocol: list[dict[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """The failure-table diagnosis of one run, or None when its verdict has no row.
    ``protocol``: the kernel's pipeline-op lines (the worker's ``protocol_sites`` event)."""
    d: dict[str, Any] | None = None
    if verdict == "COMPILE_ERROR" and evidence.get("compile_error"):
        d = diagnose_compile_error(evidence["compile_error"])
    elif verdict == "CRASH" and evidence.get("cuda_error"):
        d = diagnose_cuda_error(evidence["cuda_error"])
    elif verdict in ("MISMATCH", "NONDETERMINISTIC"):
        maps = [m for m in (maps or []) if m]
        single = (evidence.get("checked") or {}).get("mismatch_map")
        if not maps and single:
            maps = [single]
        if not maps:
            why = (evidence.get("checked") or {}).get(
                "mismatch_map_error"
            ) or "no mismatch map was recorded"
            return {"row": None, "pattern": "unmapped", "summary": why, "evidence": [], "lines": []}
        digests = {r.get("digest") for r in repeats or [] if r.get("digest")}
        reproducible = None
        if len(repeats or []) > 1:
            reproducible = len(digests) <= 1 and verdict != "NONDETERMINISTIC"
        merged = union(maps) if len(maps) > 1 else maps[0]
        d = classify_map(merged, reproducible=reproducible)
        d["map"] = merged
        if len(maps) > 1:
            d["evidence"].insert(0, f"union of {len(maps)} runs' maps")
        d["lines"] = []
    if d is None:
        return None
    row = d.get("row")
    if row in ("tile_edges", "register_smem"):
        # the output's stores: the predicate that guards them, the copy they read from
        d["lines"] = d.get("lines") or _protocol_lines(protocol, ("store",))
    if row == "stale_smem":
        # the stage's wait and release, the producer's acquire: where a stale read is ordered
        d["lines"] = d.get("lines") or _protocol_lines(
            protocol, ("consumer_wait", "consumer_release", "producer_acquire")
        )
    if row is not None:
        d["row_title"], d["check"] = ROWS[row]
    fl = _fault_lines(evidence)
    if fl:
        d["injected_fault_lines"] = fl
    return d


def one_line(d: dict[str, Any]) -> str:
    if d.get("row") is None:
        return f"mismatch map: {d['summary']} (no failure-table row)"
    where = f" [{'; '.join(d['lines'][:3])}]" if d.get("lines") else ""
    return f"failure table row '{d['row_title']}': {d['summary']}{where}; check: {d['check']}"


def attach(result) -> dict[str, Any] | None:
    """Diagnose a RunResult and put the diagnosis into its evidence (``value_diagnosis``) and
    its one line into ``evidence['diagnosis']`` (shown in the TL;DR). Returns it."""
    try:
        return _attach(result)
    except Exception as e:  # a bug here must not turn the user's verdict into ours
        result.evidence["value_diagnosis_error"] = f"{type(e).__name__}: {e}"[:500]
        return None


def _attach(result) -> dict[str, Any] | None:
    maps = None
    if result.repeats:
        maps = repeat_maps(result.run_dir, len(result.repeats))
    ps = result.outcome.last(ProtocolSites) if result.outcome is not None else None
    sites = (ps.sites or []) + (ps.stores or []) if ps is not None else []
    d = diagnose(result.verdict.value, result.evidence, result.repeats, maps, sites)
    if d is None:
        return None
    result.evidence["value_diagnosis"] = {k: v for k, v in d.items() if k not in ("map", "facts")}
    result.evidence.setdefault("diagnosis", [])
    result.evidence["diagnosis"] = [one_line(d)] + list(result.evidence["diagnosis"] or [])
    if d.get("map"):  # what reporting/mismatch_map.py draws (the per-tile grids left out)
        t = {k: v for k, v in d["map"]["tiling"].items() if k not in ("tile_cta", "tile_seq")}
        result.evidence["value_diagnosis"]["map"] = {**d["map"], "tiling": t}
    return d
