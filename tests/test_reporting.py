"""cutedebug.reporting: the stuck map (grouping, legend, dropped records, hover details), the
triage matrix page, escaping of user text in HTML / SVG / Markdown, file permissions; and the
pictures as Chromium draws them (skipped without chromium)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cutedebug.engine import runner, triage_record
from cutedebug.instrument import probes
from cutedebug.instrument.probes import ProbeConfig, ProbeSnapshot
from cutedebug.reporting import escape, files, matrix, report
from cutedebug.reporting import stuck_map as SM
from tests.helpers.report_samples import SITES, hang_1024_ctas, wide_matrix, wide_record

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "tests" / "data" / "runs"
NS = {"s": "http://www.w3.org/2000/svg"}
HOSTILE = "<script>alert(1)</script> [x](javascript:alert(1)) ![i](data:x) `code` | *b* _u_"


def _snapshot(
    cta_states: dict[int, list[tuple]], cfg=ProbeConfig(max_ctas=8, max_warps=8, max_records=64)
):
    """Through the device's buffer layout: {cta: [(warp, 'stuck'|'beacon', site, stage,
    phase, seq), ...]} -> decoded ProbeSnapshot."""
    import struct

    buf = bytearray(probes.buffer_nbytes(cfg))
    n = 0
    for cta, items in cta_states.items():
        for warp, kind, site, stage, phase, seq in items:
            if kind == "beacon":
                slot = (cta % cfg.max_ctas) * cfg.max_warps + warp
                struct.pack_into(
                    "<Q",
                    buf,
                    probes.beacons_offset(cfg) + 8 * slot,
                    probes.pack_beacon(site, stage, phase, seq, cta),
                )
                continue
            struct.pack_into("<II", buf, 0, probes.MAGIC, probes.VERSION)
            struct.pack_into(
                probes.RECORD_FMT,
                buf,
                probes.records_offset(cfg) + n * probes.RECORD_BYTES,
                probes.RECORD_VALID,
                site,
                cta,
                0,
                0,
                warp,
                stage,
                phase,
                500_000_000 + n,
                10**12 + n,
                3,
                0,
                seq,
                cta,
            )
            n += 1
    struct.pack_into("<I", buf, 8, n)
    return probes.decode(bytes(buf), cfg, SITES)


def expect_tx_hang(ctas=(0, 1)) -> ProbeSnapshot:
    """Consumers (warps 0-3) stuck on full[0] for item 1; the producer (warp 4) acquired items
    1-4 and is stuck on empty[0] for item 5."""
    return _snapshot(
        {
            c: [(4, "beacon", 0, 3, 1, 4), (4, "stuck", 0, 0, 0, 5)]
            + [(w, "stuck", 1, 0, 0, 1) for w in range(4)]
            for c in ctas
        }
    )


# ---- the stuck map model and its text ---------------------------------------------------------
def test_identical_ctas_are_one_row_and_labels_are_whole():
    m = SM.build(expect_tx_hang(ctas=(0, 1, 2, 5)), SITES)
    assert [r.ctas for r in m.rows] == [[0, 1, 2, 5]]
    assert [c.label for c in m.rows[0].cells] == ["X wait full[0] p0"] * 4 + ["X acq empty[0] p0"]
    text = SM.render_text(m)
    rows = {
        ln.split("|")[0].strip(): [c.strip() for c in ln.split("|")[1:]]
        for ln in text.splitlines()
        if "|" in ln
    }
    assert rows["CTAs"] == ["w0", "w1", "w2", "w3", "w4"]
    assert rows["CTAs 0-2,5 (4)"] == ["X wait full[0] p0"] * 4 + ["X acq empty[0] p0"]
    assert "4 CTA(s) × 5 warp(s) in 1 row(s)" in text and "dropped" not in text
    assert SM.render_text(SM.build(ProbeSnapshot(), SITES)) == "(no probe events)\n"


def test_ctas_in_different_states_get_their_own_rows_stuck_first():
    snap = _snapshot(
        {
            0: [(0, "beacon", 1, 2, 1, 7)],
            1: [(0, "stuck", 1, 0, 0, 1)],
            2: [(0, "beacon", 1, 2, 1, 9)],
            3: [(1, "beacon", 1, 0, 0, 1)],
        }
    )
    m = SM.build(snap, SITES)
    # CTA 0 and 2 completed the same wait (items 7 and 9: the item is a detail, not a state)
    assert [r.ctas for r in m.rows] == [[1], [0, 2], [3]]
    assert [c.state for c in m.rows[0].cells] == ["stuck_full", "idle"]
    assert [c.state for c in m.rows[2].cells] == ["idle", "progressed"]
    detail = SM.cell_detail(m.rows[1], 0)
    assert detail.startswith("CTAs 0,2 (2) warp 0: last completed consumer_wait full[2] phase 1")
    assert "item #7" in detail and "item #9" in detail


def test_dropped_records_are_said_and_unknown_warps_are_not_idle():
    snap, sites = hang_1024_ctas()
    m = SM.build(snap, sites)
    assert m.dropped_records == 4096 and m.n_ctas == 1024
    assert [(r.ctas[0], r.ctas[-1], len(r.ctas)) for r in m.rows] == [
        (0, 203, 204),
        (204, 204, 1),
        (205, 1023, 819),
    ]
    assert [c.state for c in m.rows[2].cells] == ["unknown"] * 4 + ["progressed"]
    text = SM.render_text(m, records=SM.record_lines(snap, sites))
    assert "WARNING: 4096 of 5120 stuck records were dropped (the buffer holds 1024)" in text
    assert len(text.splitlines()) < 20  # 1,024 CTAs, three rows
    assert (
        "CTAs 0-204 warps 0-3: consumer_wait full[0] phase 0 (tma_stream.py:269), waiting "
        "for item #1"
    ) in text


# ---- SVG --------------------------------------------------------------------------------------
def _cells(svg: str) -> dict[str, tuple[str, str, ET.Element]]:
    root = ET.fromstring(svg)
    out = {}
    for g in root.findall("s:g", NS):
        if g.get("class") in SM.STATES:
            out[g.find("s:title", NS).text] = (
                g.get("class"),
                g.find("s:text", NS).text,
                g.find("s:rect", NS),
            )
    return out


def test_svg_has_legend_hover_details_and_room_for_every_label():
    snap, sites = hang_1024_ctas()
    svg = SM.render_svg(SM.build(snap, sites), title="t")
    root = ET.fromstring(svg)
    cells = _cells(svg)
    assert len(cells) == 3 * 5
    first = next(t for t in cells if t.startswith("CTAs 0-203 (204) warp 0:"))
    assert cells[first][:2] == ("stuck_full", "X wait full[0] p0")
    assert "STUCK in consumer_wait full[0] phase 0 (tma_stream.py:269)" in first
    legend = [g.find("s:text", NS).text for g in root.findall("s:g[@class='legend']", NS)]
    assert legend == [SM.LEGEND[s] for s in SM.STATES]  # "unknown" too: records were dropped
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert any(t.startswith("WARNING: 4096 of 5120 stuck records were dropped") for t in texts)
    for _, label, rect in cells.values():
        assert len(label) * SM.CHAR_PX + 2 * SM.PAD <= float(rect.get("width")) + 2
    width = int(root.get("width"))
    assert all(len(t) * SM.CHAR_PX <= width for t in texts)
    no_drop = SM.render_svg(SM.build(expect_tx_hang(), SITES))
    assert "unknown" not in no_drop and "WARNING" not in no_drop


def test_svg_and_markdown_escape_user_text():
    svg = SM.render_svg(SM.build(expect_tx_hang(), SITES), title=HOSTILE)
    ET.fromstring(svg)  # still well-formed XML
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    res = runner.replay(RUNS / "wrong_expect_tx_plus")
    res.scenario = dataclasses.replace(res.scenario, id="t/" + HOSTILE, description=HOSTILE)
    res.outcome.log_tail = "```\n<img src=x onerror=alert(1)>\n```"
    md = report.to_markdown(res)
    import re

    assert not re.search(r"(?<!\\)\]\((javascript|data):", md)  # no link: the ] is escaped
    assert "<script>" not in md
    # the log keeps its text verbatim, inert inside a fence longer than its own backtick runs
    assert "````\n```\n<img src=x onerror=alert(1)>\n```\n````" in md
    outside = re.sub(r"````\n.*?\n````", "", md, flags=re.S)
    assert "<img" not in outside


def test_report_write_puts_the_svg_beside_report_md(tmp_path):
    res = runner.replay(RUNS / "wrong_expect_tx_plus")
    res.run_dir = tmp_path
    jp, mp = report.write(res)
    svg = (tmp_path / "stuck_map.svg").read_text()
    assert _cells(svg) and "Picture: [stuck_map.svg](<stuck_map.svg>)" in mp.read_text()
    import json

    sm = json.loads(jp.read_text())["stuck_map"]
    assert (
        sm["rows"]
        == [
            {
                "ctas": "0-15",
                "n_ctas": 16,
                "cells": ["X wait full[0] p0"] * 4 + ["X acq empty[0] p0"],
            }
        ]
        and sm["dropped_records"] == 0
    )


# ---- escaping ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "href",
    [
        "javascript:alert(1)",
        " JavaScript:alert(1)",
        "data:text/html,x",
        "vbscript:x",
        "file:///etc/passwd",
        "//evil.example/x",
        "java\tscript:x",
        "\x01javascript:x",
        "runs\\..\\x",
    ],
)
def test_unsafe_links_are_refused(href):
    assert escape.safe_href(href) is None
    assert "href" not in escape.html_link(href, "r") and "](" not in escape.md_link(href, "r")


def test_safe_links_are_encoded():
    assert escape.safe_href("runs/a b/report.md") == "runs/a%20b/report.md"
    assert escape.safe_href("runs/x?y#z'.md") == "runs/x%3Fy%23z%27.md"
    assert escape.safe_href("a:b/report.md") is None  # reads as the scheme "a"
    assert escape.safe_href("runs/a:b.md") == "runs/a%3Ab.md"
    assert escape.safe_href("https://example.org/a?b=1") == "https://example.org/a?b=1"


def test_markdown_text_and_code():
    assert escape.md_text("consumer_wait | a*b* <b>") == "consumer_wait \\| a\\*b\\* &lt;b&gt;"
    assert escape.md_text("a\nb\r\nc") == "a b  c"
    assert escape.md_code("a`b|c") == "``a`b\\|c``"
    assert escape.md_block("x\n````\ny") == ["`````", "x\n````\ny", "`````"]
    assert escape.xml_text("a\x00b<") == "ab&lt;"


def test_matrix_escapes_ids_and_refuses_script_links():
    rec = wide_record("k", "wrong_expect_tx", 0)
    rec.id = "k/<img src=x onerror=alert(1)>"
    rec.run.report = "javascript:alert(document.cookie)"
    rec.run.reason = "HANG '><script>x</script>"
    m = wide_matrix(kernels=2)
    m.scenarios.append(rec)
    page, md = matrix.render_html(m), matrix.render_markdown(m)
    assert "href='javascript" not in page and "<img" not in page and "<script>x" not in page
    assert "](javascript" not in md and "<img" not in md and "<script>" not in md
    assert "<a href='runs/run/report.md'>kernel_family_00/clean</a>" in page


# ---- files ------------------------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_files_get_the_mode_open_would_give(tmp_path, umask):
    old = os.umask(umask)
    try:
        files.write_text(tmp_path / "r.md", "x")
        (tmp_path / "plain").write_text("x")
    finally:
        os.umask(old)
    mode = (tmp_path / "r.md").stat().st_mode & 0o777
    assert mode == (tmp_path / "plain").stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] != [] and not list(tmp_path.glob(".*.tmp"))


# ---- rendered by Chromium ---------------------------------------------------------------------
def _screenshot_tool():
    spec = importlib.util.spec_from_file_location("screenshot", ROOT / "tools" / "screenshot.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


shot = _screenshot_tool()
needs_chromium = pytest.mark.skipif(
    shot.find_chromium() is None, reason="no chromium on PATH (apt-get install chromium)"
)


def _rgb(color: str) -> tuple[int, int, int]:
    return tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))


@needs_chromium
def test_rendered_stuck_map_keeps_every_label_inside_its_cell(tmp_path):
    snap, sites = hang_1024_ctas()
    svg = SM.render_svg(SM.build(snap, sites), title="1,024 CTAs")
    src = tmp_path / "map.svg"
    src.write_text(svg)
    img = shot.read_png(shot.screenshot(src, tmp_path / "map.png"))[..., :3].astype(int)
    assert img.shape[:2] == tuple(reversed(shot.svg_size(svg)))
    for _, (state, label, rect) in _cells(svg).items():
        x, y = int(float(rect.get("x"))), int(float(rect.get("y")))
        w, h = int(float(rect.get("width"))), int(float(rect.get("height")))
        inside = img[y + 2 : y + h - 2, x + 2 : x + w - 2]
        fill = _rgb(SM.COLORS[state])
        ink = abs(inside - fill).sum(axis=2) > 60
        cols = ink.any(axis=0).nonzero()[0]
        assert cols.size, f"no text drawn for {label!r}"
        # the label's ink ends before the cell's right padding: nothing is clipped
        assert cols.max() < w - 4 - SM.PAD // 2, (label, cols.max(), w)


@needs_chromium
def test_rendered_wide_matrix_scrolls_in_its_box_not_the_page(tmp_path):
    src = tmp_path / "matrix.html"
    src.write_text(matrix.render_html(wide_matrix(kernels=24)))
    img = shot.read_png(shot.screenshot(src, tmp_path / "m.png", width=1000, height=900))
    img = img[..., :3].astype(int)
    # the body's right margin stays white from top to bottom: the 24-kernel grid scrolls
    # inside its box instead of running off the page
    assert (img[:, -12:] == 255).all()
    # and the grid's state colors are drawn
    for cls in ("ok", "miss", "harness"):
        color = {"ok": "#c8f0c8", "miss": "#f6b8b8", "harness": "#f9d29b"}[cls]
        assert (abs(img - _rgb(color)).sum(axis=2) == 0).sum() > 1000, cls


def test_the_record_interface_matches_what_triage_writes():
    # a finished record writes every field its type declares (bar the bisection's), and
    # nothing else
    rec = wide_record("k", "wrong_expect_tx", 0).to_json()

    def names(cls):
        return {f.name for f in dataclasses.fields(cls)}

    assert set(rec) == names(matrix.TriageRecord) - {"bisect", "core_vs_bisect"}
    assert set(rec["expected"]) == names(triage_record.Expected)
    assert set(rec["run"]) <= names(matrix.CallRecord)


def _pinned_band(page: str, tmp_path: Path, name: str) -> float:
    """Share of the grid rows' left band (x 25-200) that is header grey, with the grid box
    scrolled right to kernel 20 (a URL fragment scrolls the box, no script needed)."""
    src = tmp_path / f"{name}.html"
    src.write_text(page)
    png = tmp_path / f"{name}.png"
    exe = shot.find_chromium()
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                exe,
                *shot.FLAGS,
                f"--user-data-dir={profile}",
                "--window-size=1000,900",
                f"--screenshot={png}",
                src.as_uri() + "#kernel-20",
            ],
            capture_output=True,
            timeout=60,
            start_new_session=True,
        )
    img = shot.read_png(png)[..., :3].astype(int)
    colored = [
        (abs(img[:, 250:] - _rgb(c)).sum(axis=2) == 0).any(axis=1) for c in ("#c8f0c8", "#f6b8b8")
    ]
    rows = (colored[0] | colored[1]).nonzero()[0]  # the grid's rows (and the table below)
    band = img[rows[0] : rows[0] + 200, 25:200]
    return float((abs(band - _rgb("#eeeeee")).sum(axis=2) == 0).mean())


@needs_chromium
def test_rendered_wide_matrix_keeps_the_fault_column_when_scrolled(tmp_path):
    page = matrix.render_html(wide_matrix(kernels=24))
    pinned = _pinned_band(page, tmp_path, "sticky")
    unpinned = _pinned_band(page.replace("position:sticky", "position:static"), tmp_path, "off")
    # the fault names stay at the left while the grid shows kernel 20; without the sticky
    # column that band shows the scrolled cells instead
    assert pinned > 0.5 > unpinned, (pinned, unpinned)


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list("<>&'\"`[]()|*_~#\\:/ \n\tjavascript!x\x00")), max_size=40
    )
)
@example("//[")  # urlsplit raises ValueError (an unclosed IPv6 host): no link, no traceback
@example("http://[")
def test_escaping_never_lets_markup_through(s):
    import re

    for out in (escape.xml_text(s), escape.xml_attr(s), escape.md_text(s)):
        assert "<" not in out and ">" not in out and "\x00" not in out
    assert "'" not in escape.xml_attr(s) and '"' not in escape.xml_attr(s)
    md = escape.md_text(s)
    assert not re.search(r"(?<!\\)[\[\]`|*]", md.replace("\\\\", ""))  # all escaped
    assert "\n" not in md and "\n" not in escape.md_code(s)
    href = escape.safe_href(s)
    assert href is None or not re.match(r"\s*[a-z]+:", href, re.I) or href.startswith("http")
