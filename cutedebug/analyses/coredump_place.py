"""Where each warp of a core is: its PC's offset in the kernel, what the SASS there is, the
traced wait site and bisection role it belongs to, and the cuda-gdb commands that read the
barrier registers of the waiting warps (cutedebug.analyses.coredump.read_core's helpers)."""

from __future__ import annotations

import re
from typing import Any

from cutedebug.analyses import sass as S
from cutedebug.analyses.coredump_evidence import _next_site
from cutedebug.analyses.cudagdb import CoreReport, WarpRecord, parse_pc_offset, parse_values

MAX_WARPS = 256  # warps whose registers are read (one cuda-gdb focus each)
WAIT_OPS = {
    "named_barrier_sync": "named_barrier",
    "sync_threads": "named_barrier",
    "cluster_wait": "cluster_wait",
}


def _same_function(kernel: str, function: str) -> bool:
    """cuda-gdb's kernel name against the SASS's (either may be cut short)."""
    return bool(kernel and function) and (
        kernel.startswith(function) or function.startswith(kernel)
    )


def _focus_base(text: str, warps: list[WarpRecord]) -> dict[int, int]:
    """The focused warp's kernel address, from pass 1's x/1i after its bt."""
    m = FOCUS_RE.search(text)
    off = parse_pc_offset(text.split("@@focus", 1)[-1].splitlines())
    if not m or off is None:
        return {}
    key = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
    w = next((x for x in warps if (x.dev, x.sm, x.hw_warp) == key), None)
    return {w.kernel: w.pc - off} if w is not None else {}


FOCUS_RE = re.compile(r"focus set to CUDA kernel (\d+),.*? device (\d+), sm (\d+), warp (\d+),")


def _offsets(warps: list[WarpRecord], base: dict[int, int]) -> None:
    for w in warps:
        if w.offset is None and w.kernel in base:
            w.offset = w.pc - base[w.kernel]


def _focus(w: WarpRecord) -> str:
    return f"cuda device {w.dev} sm {w.sm} warp {w.hw_warp} lane {w.first_lane}"


def _one_per_pc(warps: list[WarpRecord]) -> list[WarpRecord]:
    out: dict[tuple[int, int], WarpRecord] = {}
    for w in warps:
        out.setdefault((w.kernel, w.pc), w)
    return list(out.values())


PLACED = ("construct", "file", "line", "site", "site_exact", "op", "barrier", "role")


def _place_all(
    warps: list[WarpRecord], code: S.Sass, smap: S.SiteMap, cp_sites: list[dict[str, Any]]
) -> None:
    """:func:`_place` once per distinct place (function offset and innermost frame), copied to
    every warp there: a big grid's thousands of warps sit on a few PCs."""
    done: dict[tuple, WarpRecord] = {}
    for w in warps:
        if w.offset is None:
            continue
        f = w.frames[0] if w.frames else {}
        key = (w.kernel, w.offset, f.get("file"), f.get("line"))
        first = done.get(key)
        if first is None:  # (the warps of a key were placed alike before: same prior role)
            _place(w, code, smap, cp_sites)
            done[key] = w
        else:
            for k in PLACED:
                setattr(w, k, getattr(first, k))


def _place(w: WarpRecord, code: S.Sass, smap: S.SiteMap, cp_sites: list[dict[str, Any]]) -> None:
    if w.offset is None:
        return  # the PC could not be placed in its function
    c = code.classify(w.offset)
    w.construct = c
    w.file, w.line = code.line_at(w.offset)
    if w.frames:  # cuda-gdb's innermost frame with a line beats the SASS line table
        w.file, w.line = w.frames[0]["file"], w.frames[0]["line"]
    if c.kind == "spin_load" and c.anchor is not None and c.anchor.line:
        w.file, w.line = c.anchor.file, c.anchor.line  # the loop's load, not its branch
    site, exact = smap.site_of(c)
    w.site, w.site_exact = site, exact
    if site is not None:
        w.op = site.op if site.kind in S.MBAR_KINDS else WAIT_OPS.get(site.kind, site.kind)
        w.barrier = site.barrier
        w.file, w.line = site.file or w.file, site.line or w.line
        cp = _checkpoint_site(site, cp_sites)
        w.role = cp["role"] if cp else site.role
    elif c.kind == "named_barrier":
        w.op, w.barrier = "named_barrier", "named"
    elif c.kind in ("spin_load", "nanosleep", "cluster_barrier", "exit"):
        w.op = c.kind
    else:
        w.op = c.kind
    if w.role in ("?", "any") and cp_sites and w.file:
        near = _next_site(w.file, w.line, cp_sites)
        if near is not None:
            w.role = near["role"]


def _checkpoint_site(site: Any, cp_sites: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The bisection site (its role) that a traced wait belongs to: same file and line, and
    the op that contains the wait."""
    want = site.op if site.kind in S.MBAR_KINDS else "named_barrier"
    same = [c for c in cp_sites if c.get("file") == site.file and c.get("line") == site.line]
    for c in same:
        if c.get("op") == want or (want.endswith(c.get("op", "@")) and c.get("op")):
            return c
    return same[0] if same else None


def _register_commands(warps: list[WarpRecord]) -> list[str]:
    """cuda-gdb commands printing the barrier address and parity registers of each waiting
    warp (at most MAX_WARPS), each block marked with the warp and the register names."""
    cmds: list[str] = []
    todo = [
        w
        for w in warps
        if w.construct is not None and (w.construct.address_reg or w.construct.phase_reg)
    ][:MAX_WARPS]
    for w in todo:
        c = w.construct
        regs = [
            r for r in (c.address_reg, c.address_hi, c.phase_reg) if r and r not in ("RZ", "URZ")
        ]
        if regs:
            cmds += [f"echo @@reg {w.dev} {w.sm} {w.hw_warp} {' '.join(regs)}\\n", _focus(w)]
            cmds += [f"p/x ${r}" for r in regs]
    return cmds


def _parse_registers(rep: CoreReport, sec: dict[str, list[str]]) -> None:
    by_key = {(w.dev, w.sm, w.hw_warp): w for w in rep.warps}
    for name, lines in sec.items():
        parts = name.split()
        if parts[0] != "reg" or len(parts) < 5:
            continue
        w = by_key.get((int(parts[1]), int(parts[2]), int(parts[3])))
        if w is not None:
            w.registers.update(zip(parts[4:], parse_values(lines)))
