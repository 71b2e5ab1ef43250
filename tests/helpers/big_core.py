"""A big grid's cuda-gdb answer made from a real one: an H200 capture's first pass (kernels,
every warp) with its grid repeated ``copies`` times, for CPU tests of how the reader scales.

Copy r of CTA b is CTA ``r * grid_x + b`` with the same warps, lanes and PCs; the warps fill
the SMs in order (64 slots each, as on the H200), the focus line names the original focused
warp's new place, and the kernels table the grown grid. Everything else (the kernel's name,
the PCs, the SASS they point into) is the capture's.
"""

from __future__ import annotations

import re

from cutedebug.analyses import cudagdb

FOCUS = re.compile(r"(device \d+, sm )(\d+)(, warp )(\d+)(, lane \d+\])")
SLOTS = 64


def replicate(pass1: str, copies: int) -> str:
    warps = cudagdb.parse_warps(pass1)
    kernels = cudagdb.parse_kernels(pass1)
    assert len(kernels) == 1 and warps, "one kernel's capture"
    gx = kernels[0].grid[0]
    m = FOCUS.search(pass1)
    focus = (int(m.group(2)), int(m.group(4))) if m else None
    head = pass1[: pass1.index("  Wp Active Lanes Mask")]
    rest = pass1[pass1.index("  Wp Active Lanes Mask") :].splitlines()
    table = [rest[0]]
    tail = [x for x in rest[1:] if not (cudagdb.WARP_ROW.match(x) or cudagdb.SM_HEADER.match(x))]
    g, new_focus, sm_now = 0, None, -1
    for r in range(copies):
        for w in warps:
            sm, slot = divmod(g, SLOTS)
            if sm != sm_now:
                table.append(f"Device 0 SM {sm}")
                sm_now = sm
            if r == 0 and (w.sm, w.hw_warp) == focus:
                new_focus = (sm, slot)
            b = (r * gx + w.block[0], w.block[1], w.block[2])
            table.append(
                f"  {slot:2d}        {w.active:#010x}           {w.divergent:#010x} "
                f"{w.pc:#018x}      {w.kernel}  ({b[0]},{b[1]},{b[2]})                "
                f"({w.thread[0]},{w.thread[1]},{w.thread[2]}) "
            )
            g += 1
    head = head.replace(f"({gx},{kernels[0].grid[1]},{kernels[0].grid[2]})", f"({gx * copies},1,1)")
    if new_focus is not None:
        head = FOCUS.sub(
            lambda m: f"{m.group(1)}{new_focus[0]}{m.group(3)}{new_focus[1]}{m.group(5)}", head
        )
    return head + "\n".join(table + tail) + "\n"
