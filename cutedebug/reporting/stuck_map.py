"""The stuck map: one picture of where every warp of a hung (or crashed) kernel is.

Built from a probe snapshot (stuck records + beacons, ``cutedebug.instrument.probes``) and the
kernel's wait sites, as one model (``StuckMap``) with two renderers:

- ``render_text``: a fixed-width table for report.md and the terminal;
- ``render_svg``: a standalone SVG (stuck_map.svg beside report.md) with a legend, labels sized
  to their text (never clipped), one ``<title>`` per cell for hover details.

CTAs whose warps are in identical states (same site, op, barrier, stage and phase per warp) are
one row ("CTAs 0-1023, 1024 CTAs"): a grid of 1,024 stuck CTAs is one or two rows, not 1,024.
When the device dropped stuck records (more reports than the buffer holds), the map says so, and
a warp without a record is drawn as "no record" (unknown) instead of as idle.

Nothing here imports torch or cutlass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cutedebug.instrument.probes import ProbeSnapshot, Site, WarpView, warp_views
from cutedebug.reporting.escape import xml_attr, xml_text

# Cell states, in the order the legend lists them.
STATES = ("stuck_full", "stuck_empty", "stuck_raw", "progressed", "idle", "unknown")
COLORS = {
    "stuck_full": "#d62728",
    "stuck_empty": "#ff7f0e",
    "stuck_raw": "#9467bd",
    "progressed": "#2ca02c",
    "idle": "#dddddd",
    "unknown": "#ffffff",
}
# Text drawn on each fill: dark on light fills, white on the saturated ones.
INK = {
    "stuck_full": "#ffffff",
    "stuck_empty": "#000000",
    "stuck_raw": "#ffffff",
    "progressed": "#ffffff",
    "idle": "#333333",
    "unknown": "#555555",
}
LEGEND = {
    "stuck_full": "X: stuck on a full barrier (bounded wait timed out)",
    "stuck_empty": "X: stuck on an empty barrier",
    "stuck_raw": "X: stuck on a raw mbarrier wait",
    "progressed": "no stuck record: its last completed wait",
    "idle": "no wait completed, no stuck record",
    "unknown": "no record: its stuck record may have been dropped",
}
OPS = {
    "producer_acquire": "acq",
    "consumer_wait": "wait",
    "producer_tail": "tail",
    "raw_wait": "raw",
}
LABEL_KEY = (
    "acq = producer_acquire, wait = consumer_wait, tail = producer_tail, raw = raw "
    "mbarrier wait; full[s] / empty[s] = barrier of stage s; p = phase"
)
MAX_ROWS = 64  # rows (groups of CTAs) drawn; the rest are counted


@dataclass(frozen=True)
class Cell:
    """One warp's state. ``key`` is what grouping compares: what the label shows (state,
    site, stage, phase), not the item number, the time waited or the SM, which the hover
    details list per CTA."""

    state: str
    label: str
    key: tuple
    detail: str = ""


@dataclass
class Row:
    """CTAs whose warps are all in the same states."""

    ctas: list[int]
    cells: list[Cell]
    details: list[list[str]] = field(default_factory=list)  # per warp: one line per CTA

    @property
    def title(self) -> str:
        return (
            f"CTA {self.ctas[0]}"
            if len(self.ctas) == 1
            else f"CTAs {cta_ranges(self.ctas, limit=4)} ({len(self.ctas)})"
        )

    @property
    def any_stuck(self) -> bool:
        return any(c.state.startswith("stuck") for c in self.cells)


@dataclass
class StuckMap:
    warps: list[int]
    rows: list[Row]
    hidden_rows: list[Row]
    n_stuck_records: int  # decoded
    n_stuck_reported: int  # counted on the device (may exceed the buffer)
    n_beacons: int
    n_unlisted: int = 0  # decoded, left out of a bounded live picture (probes.snapshot_to_json)

    @property
    def dropped_records(self) -> int:
        return max(0, self.n_stuck_reported - self.n_stuck_records - self.n_unlisted)

    @property
    def n_ctas(self) -> int:
        return sum(len(r.ctas) for r in self.rows + self.hidden_rows)

    def summary(self) -> str:
        s = (
            f"{self.n_ctas} CTA(s) × {len(self.warps)} warp(s) in {len(self.rows)} row(s) of "
            f"identical states; {self.n_stuck_records} stuck record(s), {self.n_beacons} "
            "beacon(s)"
        )
        if self.hidden_rows:
            s += (
                f"; {len(self.hidden_rows)} more row(s) "
                f"({sum(len(r.ctas) for r in self.hidden_rows)} CTAs) not drawn"
            )
        return s

    def dropped_note(self) -> str:
        if self.n_unlisted and not self.dropped_records:
            return (
                f"{self.n_unlisted} of {self.n_stuck_reported} stuck records are not in this "
                f"picture (it lists {self.n_stuck_records}; the diagnosis counts them all): a "
                "warp drawn as 'no record' may be stuck too"
            )
        if not self.dropped_records:
            return ""
        return (
            f"{self.dropped_records} of {self.n_stuck_reported} stuck records were dropped "
            f"(the buffer holds {self.n_stuck_records}): a warp drawn as 'no record' may be "
            "stuck too, and CTAs with no record and no beacon are missing"
        )


def cta_ranges(xs: Iterable[int], limit: int = 8) -> str:
    """``0-15,32,40-47``; after ``limit`` ranges, ``,…``."""
    xs, parts, i = sorted(set(xs)), [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts[:limit]) + (",…" if len(parts) > limit else "")


def _sites(sites: Any) -> dict[int, Site]:
    """Sites by id, from a SiteTable, a list of Site or of their JSON, or {id: Site}."""
    if sites is None:
        return {}
    items = getattr(sites, "sites", sites)
    if isinstance(items, Mapping):
        items = items.values()
    out = {}
    for s in items:
        s = s if isinstance(s, Site) else Site.from_json(s)
        out[s.id] = s
    return out


def _cell(v: WarpView | None, by_id: dict[int, Site], dropped: bool) -> Cell:
    if v is None:
        if dropped:
            return Cell(
                "unknown",
                "? no record",
                ("unknown",),
                "no beacon and no stuck record; records were dropped (or left out of a bounded "
                "picture), so it may be stuck",
            )
        return Cell("idle", "-", ("idle",), "no wait completed, no stuck record")
    if v.stuck is not None:
        r = v.stuck
        site = by_id.get(r.site_id)
        bar = site.barrier if site else ""
        state = "stuck_full" if bar == "full" else "stuck_empty" if bar == "empty" else "stuck_raw"
        op = OPS.get(site.op, site.op) if site else "?"
        idx = f"[{r.stage}]" if r.stage >= 0 else ""
        label = f"X {op} {bar or 'mbar'}{idx} p{r.phase}"
        desc = site.describe(r.stage, r.phase) if site else f"site {r.site_id}"
        detail = (
            f"STUCK in {desc}; waited {r.waited_ns / 1e6:.1f} ms for item #{r.seq}, SM {r.smid}"
        )
        return Cell(state, label, (state, r.site_id, r.stage, r.phase), detail)
    b = v.last
    site = by_id.get(b.site_id)
    bar = site.barrier if site else ""
    idx = f"[{b.stage}]" if b.stage >= 0 else ""
    op = OPS.get(site.op, site.op) if site else "?"
    desc = site.describe(b.stage, b.phase) if site else f"site {b.site_id}"
    seq = b.seq if site is None or site.kind == "pipeline" else None
    return Cell(
        "progressed",
        f"{op} {bar or 'mbar'}{idx} p{b.phase}",
        ("progressed", b.site_id, b.stage, b.phase),
        f"last completed {desc}" + (f", item #{b.seq}" if seq is not None else ""),
    )


def build(snapshot: ProbeSnapshot, sites: Any = None, *, max_rows: int = MAX_ROWS) -> StuckMap:
    """Group the snapshot's CTAs by their warps' states; stuck rows first, then by CTA."""
    by_id = _sites(sites)
    views = warp_views(snapshot)
    dropped = snapshot.dropped_records > 0 or snapshot.stuck_unlisted > 0
    warps = list(range(max((w for _, w in views), default=-1) + 1))
    groups: dict[tuple, Row] = {}
    for cta in sorted({c for c, _ in views}):
        cells = [_cell(views.get((cta, w)), by_id, dropped) for w in warps]
        key = tuple(c.key for c in cells)
        row = groups.get(key)
        if row is None:
            row = groups[key] = Row(ctas=[], cells=cells, details=[[] for _ in warps])
        row.ctas.append(cta)
        for i, c in enumerate(cells):
            row.details[i].append(c.detail)
    rows = sorted(groups.values(), key=lambda r: (not r.any_stuck, r.ctas[0]))
    return StuckMap(
        warps=warps,
        rows=rows[:max_rows],
        hidden_rows=rows[max_rows:],
        n_stuck_records=len(snapshot.stuck),
        n_stuck_reported=max(snapshot.n_stuck_reported, len(snapshot.stuck)),
        n_beacons=len(snapshot.beacons),
        n_unlisted=snapshot.stuck_unlisted,
    )


def cell_detail(row: Row, warp_index: int) -> str:
    """Hover text of one cell: which CTAs and warp, and what each distinct detail says."""
    head = f"{row.title} warp {warp_index}"
    lines = row.details[warp_index]
    distinct = sorted(set(lines), key=lines.index)
    if len(distinct) <= 3:
        return head + ": " + " | ".join(distinct)
    return head + f": {distinct[0]} | … ({len(distinct)} distinct details over the CTAs)"


# ---- text --------------------------------------------------------------------------------


def render_text(m: StuckMap, *, records: Iterable[str] = ()) -> str:
    """A fixed-width table: one row per group of CTAs, one column per warp."""
    if not m.rows:
        return "(no probe events)\n"
    heads = [r.title for r in m.rows]
    first = max(len("CTAs"), *(len(h) for h in heads))
    width = max([len(c.label) for r in m.rows for c in r.cells] + [4])
    head = "CTAs".ljust(first) + " | " + " | ".join(f"w{w}".ljust(width) for w in m.warps)
    lines = [head.rstrip(), "-" * len(head)]
    for h, r in zip(heads, m.rows):
        line = h.ljust(first) + " | " + " | ".join(c.label.ljust(width) for c in r.cells)
        lines.append(line.rstrip())
    lines.append(m.summary())
    if m.dropped_note():
        lines.append("WARNING: " + m.dropped_note())
    lines.append(
        "X = stuck (bounded wait timed out); "
        + LABEL_KEY
        + "; - = no wait completed; ? = no record"
    )
    lines += list(records)
    return "\n".join(lines) + "\n"


def record_lines(snapshot: ProbeSnapshot, sites: Any = None, limit: int = 16) -> list[str]:
    """The stuck records, identical ones (same site, stage, phase, item) on one line with
    their CTAs and warps (the text map's footnote)."""
    by_id = _sites(sites)
    groups: dict[tuple, list] = {}
    for r in snapshot.stuck:
        groups.setdefault((r.site_id, r.stage, r.phase, r.seq), []).append(r)
    out = []
    for (sid, stage, phase, seq), rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        site = by_id.get(sid)
        desc = site.describe(stage, phase) if site else f"site {sid}"
        lo, hi = (
            f"{min(r.waited_ns for r in rs) / 1e6:.1f}",
            f"{max(r.waited_ns for r in rs) / 1e6:.1f}",
        )
        span = lo if lo == hi else f"{lo}-{hi}"
        ctas, warps = {r.block_linear for r in rs}, {r.warp for r in rs}
        out.append(
            f"  {'CTA' if len(ctas) == 1 else 'CTAs'} {cta_ranges(ctas)} "
            f"{'warp' if len(warps) == 1 else 'warps'} {cta_ranges(warps)}: {desc}, "
            f"waiting for item #{seq}, waited "
            f"{span} ms ({len(rs)} record(s) on {len({r.smid for r in rs})} SM(s))"
        )
        if len(out) == limit:
            out.append(f"  … {len(groups) - limit} more kinds of stuck record in report.json")
            break
    return out


def stuck_map_text(snapshot: ProbeSnapshot, sites: Any = None) -> str:
    """The text map with the first stuck records under it."""
    return render_text(build(snapshot, sites), records=record_lines(snapshot, sites))


# ---- SVG ---------------------------------------------------------------------------------

FONT_PX = 12
CHAR_PX = 7.3  # advance of one monospace character at FONT_PX, with margin
ROW_PX = 22
PAD = 8


def _text_px(s: str, char_px: float = CHAR_PX) -> int:
    return int(len(s) * char_px + 0.999)


def render_svg(m: StuckMap, *, title: str = "cutedebug stuck map") -> str:
    """A standalone SVG: header, the grid, the legend; widths follow the longest label."""
    esc = xml_text
    col = (
        max([_text_px(c.label) for r in m.rows for c in r.cells] + [_text_px("warp 00"), 40])
        + 2 * PAD
    )
    left = max([_text_px(r.title) for r in m.rows] + [_text_px("CTAs")]) + 2 * PAD
    notes = [m.summary()]
    if m.dropped_note():
        notes.append("WARNING: " + m.dropped_note())
    top = 28 + 18 * len(notes) + 22
    grid_h = max(1, len(m.rows)) * ROW_PX
    legend = [s for s in STATES if s != "unknown" or m.dropped_records or m.n_unlisted]
    legend_y = top + grid_h + 24
    texts = [title] + notes + [LEGEND[s] for s in legend] + [LABEL_KEY]
    width = max(left + max(1, len(m.warps)) * col, *(_text_px(t) + 40 for t in texts)) + PAD
    height = legend_y + 20 * len(legend) + 20 + PAD
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans Mono, monospace" '
        f'font-size="{FONT_PX}">',
        f"<title>{esc(title)}</title>",
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{PAD}" y="20" font-size="14" font-weight="bold">{esc(title)}</text>',
    ]
    for k, note in enumerate(notes):
        color = ' fill="#b00000"' if note.startswith("WARNING") else ""
        out.append(f'<text x="{PAD}" y="{40 + 18 * k}"{color}>{esc(note)}</text>')
    out.append(f'<text x="{PAD}" y="{top - 6}" font-weight="bold">CTAs</text>')
    for i, w in enumerate(m.warps):
        out.append(
            f'<text x="{left + i * col + PAD}" y="{top - 6}" font-weight="bold">warp {w}</text>'
        )
    for j, row in enumerate(m.rows):
        y = top + j * ROW_PX
        out.append(
            f'<g class="row"><title>{esc(", ".join(map(str, row.ctas[:256])))}'
            f"{' …' if len(row.ctas) > 256 else ''}</title>"
            f'<text x="{PAD}" y="{y + 15}">{esc(row.title)}</text></g>'
        )
        for i, c in enumerate(row.cells):
            x = left + i * col
            out.append(
                f'<g class="{xml_attr(c.state)}"><title>{esc(cell_detail(row, i))}'
                f'</title><rect x="{x}" y="{y}" width="{col - 2}" height="{ROW_PX - 2}" '
                f'fill="{COLORS[c.state]}" stroke="#999999" stroke-width="0.5"/>'
                f'<text x="{x + PAD}" y="{y + 15}" fill="{INK[c.state]}">'
                f"{esc(c.label)}</text></g>"
            )
    for k, s in enumerate(legend):
        y = legend_y + 20 * k
        out.append(
            f'<g class="legend"><rect x="{PAD}" y="{y}" width="14" height="14" '
            f'fill="{COLORS[s]}" stroke="#999999"/>'
            f'<text x="{PAD + 22}" y="{y + 11}">{esc(LEGEND[s])}</text></g>'
        )
    out.append(f'<text x="{PAD}" y="{legend_y + 20 * len(legend) + 11}">{esc(LABEL_KEY)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def stuck_map_svg(snapshot: ProbeSnapshot, sites: Any = None) -> str:
    return render_svg(build(snapshot, sites))
