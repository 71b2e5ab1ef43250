"""Render cutedebug's pictures and pages in headless Chromium, to look at them as people do.

    python tools/screenshot.py FILE.svg|FILE.html [...] [--out DIR] [--width 1280]
    python tools/screenshot.py --samples DIR     # write sample pictures and screenshot them

Each FILE gives DIR/FILE.png. An SVG's window is its own width x height; an HTML page's is
``--width`` x ``--height``. ``--samples`` draws the stuck maps of the two runs recorded on the
H200 (tests/data/runs), a synthetic 1,024-CTA hang with dropped records, and a triage matrix
with 24 kernels (a wide one), then screenshots them.

Chromium: the Debian package (``apt-get install chromium``); the binary is looked up as
chromium, chromium-browser, google-chrome (or $CHROMIUM). Exit 3 when there is none.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
]


def find_chromium() -> str | None:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and (path := shutil.which(name)):
            return path
    return None


def svg_size(text: str) -> tuple[int, int]:
    head = text[: text.index(">")]
    w, h = (re.search(rf'\b{k}="(\d+)', head) for k in ("width", "height"))
    return int(w.group(1)), int(h.group(1))


def screenshot(
    src: Path, png: Path, *, width: int = 1280, height: int = 900, timeout_s: float = 60.0
) -> Path:
    """``src`` rendered to ``png`` by headless Chromium (a fresh profile, removed after)."""
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("no chromium on PATH (apt-get install chromium)")
    src = Path(src).resolve()
    if src.suffix == ".svg":
        width, height = svg_size(src.read_text(encoding="utf-8"))
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cutedebug-chromium-") as profile:
        cmd = [
            exe,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            f"--screenshot={png}",
            src.as_uri(),
        ]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, start_new_session=True
        )
    if proc.returncode != 0 or not png.exists():
        raise RuntimeError(f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}")
    return png


def read_png(path: Path):
    """A PNG (8-bit RGB or RGBA, not interlaced, as Chromium writes them) as a numpy array of
    shape (height, width, channels)."""
    import struct
    import zlib

    import numpy as np

    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG")
    pos, idat, header = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
        pos += 12 + n
    width, height, depth, color, _, _, interlace = header
    if depth != 8 or color not in (2, 6) or interlace:
        raise ValueError(f"{path}: PNG depth {depth} color type {color} not supported")
    bpp = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8)
    raw = raw.reshape(height, 1 + width * bpp)
    out = np.zeros((height, width * bpp), dtype=np.int32)
    prev = np.zeros(width * bpp, dtype=np.int32)
    for y in range(height):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) & 0xFF
        else:  # Sub (1), Average (3), Paeth (4) depend on the pixel to the left
            cur = np.zeros_like(line)
            for x in range(width * bpp):
                a = cur[x - bpp] if x >= bpp else 0
                b = prev[x]
                if f == 1:
                    pred = a
                elif f == 3:
                    pred = (a + b) // 2
                else:
                    c = prev[x - bpp] if x >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                cur[x] = (line[x] + pred) & 0xFF
        out[y] = prev = cur
    return out.reshape(height, width, bpp).astype(np.uint8)


def samples(out: Path) -> list[Path]:
    """Sample pictures (see the module docstring) written to ``out``; their paths."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.report_samples import hang_1024_ctas, wide_matrix

    from cutedebug.engine import runner
    from cutedebug.reporting import matrix, report, stuck_map

    out.mkdir(parents=True, exist_ok=True)
    files = []
    for name in ("wrong_expect_tx_plus", "missing_phase_flip_producer"):
        res = runner.replay(ROOT / "tests" / "data" / "runs" / name)
        m, _ = report.stuck_map(res)
        files.append(out / f"stuck_map_{name}.svg")
        files[-1].write_text(stuck_map.render_svg(m, title=f"cutedebug stuck map: {name}"))
    snap, sites = hang_1024_ctas()
    files.append(out / "stuck_map_1024_ctas.svg")
    files[-1].write_text(
        stuck_map.render_svg(stuck_map.build(snap, sites), title="cutedebug stuck map: 1,024 CTAs")
    )
    files.append(out / "matrix_wide.html")
    files[-1].write_text(matrix.render_html(wide_matrix(kernels=24)))
    return files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--out", type=Path, help="folder for the PNGs (default: beside each file)")
    p.add_argument("--samples", type=Path, metavar="DIR", help="write samples, screenshot them")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=900)
    args = p.parse_args(argv)
    if find_chromium() is None:
        print("screenshot: no chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 3
    files = list(args.files) + (samples(args.samples) if args.samples else [])
    if not files:
        p.error("give files or --samples DIR")
    for f in files:
        png = (args.out or f.parent) / (f.name + ".png")
        screenshot(f, png, width=args.width, height=args.height)
        print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
