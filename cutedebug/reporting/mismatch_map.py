"""The wrong-value map in report.md: the failure-table diagnosis of a MISMATCH (made by
``cutedebug.analyses.mismatch``) and a text picture of where the wrong values are, per tile,
with the partial edge tiles set apart and the in-tile row / column profiles."""

from __future__ import annotations

from typing import Any

from cutedebug.engine import valuemap
from cutedebug.reporting.escape import md_block, md_text

SHADES = " .:-=+*#%@"


def picture(m: dict[str, Any] | None, max_cols: int = 64, max_rows: int = 40) -> str | None:
    """A text map of the bad fraction per tile (rows = tile rows), the edge tiles framed by
    '|' / '-', plus the in-tile row and column profiles."""
    if not m or "tile_bad" not in m or m.get("tiling_problem"):
        return None
    tb = m["tile_bad"]
    sizes = valuemap.tile_sizes(m)
    tr, tc = m["tiles"]
    sr, sc = -(-tr // max_rows), -(-tc // max_cols)
    lines = [
        f"wrong elements per tile ({tr} x {tc} tiles of "
        f"{m['tiling']['tile'][0]}x{m['tiling']['tile'][1]}"
        + (f", {sr}x{sc} tiles per character" if sr * sc > 1 else "")
        + "; ' ' none, '@' all"
        + ("; right of '|': the partial tile column" if m.get("partial_cols") else "")
        + ")"
    ]
    for i0 in range(0, tr, sr):
        row = []
        for j0 in range(0, tc, sc):
            bad = sum(
                tb[i][j] for i in range(i0, min(tr, i0 + sr)) for j in range(j0, min(tc, j0 + sc))
            )
            size = sum(
                sizes[i][j]
                for i in range(i0, min(tr, i0 + sr))
                for j in range(j0, min(tc, j0 + sc))
            )
            frac = bad / size if size else 0.0
            row.append(" " if bad == 0 else SHADES[max(1, min(9, round(frac * 9)))])
        if m.get("partial_rows") and i0 + sr >= tr and tr > 1:
            lines.append(
                "  "
                + "-" * (len(row) + (1 if m.get("partial_cols") else 0))
                + "  (below: the partial tile row)"
            )
        edge_c = "|" if m.get("partial_cols") and len(row) > 1 else ""
        lines.append("  " + "".join(row[:-1]) + edge_c + row[-1])
    for name, key in (("in-tile rows", "in_tile_row_bad"), ("in-tile columns", "in_tile_col_bad")):
        hist = m.get(key) or []
        if len(hist) > 1:
            top = max(hist) or 1
            step = -(-len(hist) // 64)
            cells = [max(hist[k : k + step]) for k in range(0, len(hist), step)]
            lines.append(
                f"{name:16s}"
                + "".join(" " if v == 0 else SHADES[max(1, round(9 * v / top))] for v in cells)
                + (f"  ({step} per character)" if step > 1 else "")
            )
    return "\n".join(lines)


def report_sections(result) -> list[str]:
    """report.md sections for a run that has a value diagnosis (analyses.mismatch.attach
    first): the row, the evidence, the kernel lines, the picture."""
    d = result.evidence.get("value_diagnosis")
    if not d:
        return []
    lines = ["## Wrong values: failure-table diagnosis", ""]
    if d.get("row"):
        lines += [
            f"- row: **{md_text(d['row_title'])}** ({md_text(d['row'])}), pattern "
            f"{md_text(d['pattern'])}",
            f"- {md_text(d['summary'])}",
            f"- what to check: {md_text(d['check'])}",
        ]
    else:
        lines += [f"- no row: {md_text(d['summary'])}"]
    lines += [f"- evidence: {md_text(e)}" for e in d.get("evidence", [])]
    if d.get("lines"):
        lines.append("- kernel line(s): " + md_text("; ".join(d["lines"][:6])))
    if d.get("injected_fault_lines"):
        lines.append(
            "- injected fault's site(s) (this scenario's fault, not part of the "
            "diagnosis): " + md_text("; ".join(d["injected_fault_lines"][:4]))
        )
    pic = picture(d.get("map"))
    if pic:
        lines += ["", *md_block(pic)]
    return ["\n".join(lines)]
