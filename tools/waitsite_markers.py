"""How exact is the PC -> wait-site mapping? Checked offline with markers, per scenario.

    python tools/waitsite_markers.py --nvdisasm PATH [--out DIR] SCENARIO.toml ...

Each scenario is compiled twice for sm_90a (CPU only; the worker in compile mode, fault
applied, line info on): plain, as a coredump run sees it, and with a ``nanosleep.u32 0x5A000 +
seq`` marker before every traced wait (cutedebug.instrument.waitsites, markers=True). The
mapping cutedebug.analyses.sass makes from the ORDER of the wait loops (and of the BAR.SYNCs) is
then compared with what the markers say in the marked build: for each wait loop, the nearest
marker before its TRYWAIT names the traced wait it came from. Prints one row per scenario:
wait loops in the SASS / traced, how they were mapped, marker agreement; same for BAR.SYNC.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from cutedebug.analyses import sass
from cutedebug.engine import runner, scenario, worker
from cutedebug.instrument import waitsites

MARKER = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+NANOSLEEP 0x(5a[0-9a-f]{3})\s*;")


def compile_one(sc, d: Path, markers: bool, nvdisasm: str):
    req, events, _ = runner.write_request(
        d,
        sc,
        mode="compile",
        lineinfo=True,
        cubin_path=str(d / "kernel.cubin"),
        wait_sites=True,
        wait_site_markers=markers,
    )
    worker.main([str(req)])
    comp = [json.loads(x) for x in events.read_text().splitlines() if '"compiled"' in x]
    if not comp or not (d / "kernel.cubin").exists():
        return None, None, ""
    text = subprocess.run(
        [nvdisasm, "-g", "-c", str(d / "kernel.cubin")], capture_output=True, text=True, timeout=300
    ).stdout
    return sass.parse(text), waitsites.sites_from_json(comp[0]["wait_sites"]), text


def marker_check(code: sass.Sass, sites, text: str, anchors) -> tuple[int, int]:
    """(agreeing, checked): for each anchor (TRYWAIT / BAR.SYNC) of the marked build, the
    nearest marker before it against the site the order mapping gives."""
    marks = sorted(
        (int(m.group(1), 16), int(m.group(2), 16) - waitsites.MARKER_BASE)
        for m in map(MARKER.match, text.splitlines())
        if m
    )
    agree = checked = 0
    for instr, site in anchors:
        before = [seq for off, seq in marks if off < instr.offset]
        if site is None or not before:
            continue
        checked += 1
        agree += before[-1] == site.seq
    return agree, checked


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvdisasm", required=True)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--keep", help="keep each plain build (events, cubin, SASS) under this folder")
    ap.add_argument("specs", nargs="+")
    args = ap.parse_args(argv)
    rows = []
    print(
        f"{'scenario':52} {'waits':>9} {'mapped':>8} {'markers':>8} | {'BAR':>7} "
        f"{'mapped':>8} {'markers':>8}"
    )
    for path in args.specs:
        sc = scenario.load(path)
        if "sm_90a" not in sc.archs:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            keep = Path(args.keep) / sc.id.replace("/", "__") if args.keep else None
            plain, sites, text = compile_one(sc, keep or Path(tmp) / "plain", False, args.nvdisasm)
            if keep is not None:
                (keep / "sass.txt").write_text(text)
                for f in keep.glob("cutlass___*"):
                    f.unlink()
            marked, msites, mtext = compile_one(sc, Path(tmp) / "marked", True, args.nvdisasm)
        if plain is None or marked is None:
            print(f"{sc.id:52} did not compile")
            continue
        m, mm = sass.map_sites(plain, sites), sass.map_sites(marked, msites)
        nw = len([s for s in sites if s.kind in sass.MBAR_KINDS])
        nb = len([s for s in sites if s.kind in sass.BAR_KINDS])
        wa = marker_check(
            marked, msites, mtext, [(w, mm.waits.get(k)) for k, w in enumerate(marked.waits)]
        )
        ba = marker_check(
            marked, msites, mtext, [(b, mm.bars.get(k)) for k, b in enumerate(marked.bar_syncs)]
        )
        same = len(plain.waits) == len(marked.waits) and len(plain.bar_syncs) == len(
            marked.bar_syncs
        )
        row = {
            "scenario": sc.id,
            "waits_sass": len(plain.waits),
            "waits_traced": nw,
            "waits_mapping": "exact" if m.waits_exact else ("aligned" if m.waits else "none"),
            "waits_markers": wa,
            "bars_sass": len(plain.bar_syncs),
            "bars_traced": nb,
            "bars_mapping": "exact" if m.bars_exact else f"{len(m.bars)} by id",
            "bars_markers": ba,
            "marked_build_same_counts": same,
            "notes": m.notes,
        }
        rows.append(row)
        print(
            f"{sc.id:52} {len(plain.waits):>4}/{nw:<4} {row['waits_mapping']:>8} "
            f"{wa[0]:>3}/{wa[1]:<4} | {len(plain.bar_syncs):>3}/{nb:<3} "
            f"{row['bars_mapping']:>8} {ba[0]:>3}/{ba[1]:<4}{'' if same else ' (marked build differs)'}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
