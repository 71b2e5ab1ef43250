"""SASS of one kernel: what a stuck PC is doing, and which traced wait it belongs to.

Input: the disassembly of the kernel's cubin, as ``nvdisasm -g -c`` prints it (function-relative
offsets ``/*0400*/``, labels ``.L_x_4:``, line markers ``//## File "k.py", line 238``) or as
cuda-gdb's ``disassemble`` prints it (``0x... <+1024>:  INSTR``, absolute branch targets).

What the DSL's waits become on sm_90 (seen in every kernel of this repository, nvdisasm 13):

    .L_x_4:  IMAD.U32 R7, RZ, RZ, UR9                         <- loop head (branch target)
             SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R7+URZ+0x20], R3   <- one per traced wait
        @!P0 NANOSLEEP.SYNCS 0x989680
        @!P0 SYNCS.PHASECHK.TRANS64 P0, [R7+URZ+0x20], R3
        @!P0 BRA `(.L_x_4)                                     <- backward branch

``[R7+URZ+0x20]`` is the barrier's shared-memory address (register + immediate), ``R3`` the
parity waited for (bit 31). A named barrier is ``BAR.SYNC.DEFER_BLOCKING id[, threads]``
(``sync_threads`` is id 0 without a count); a hand-written spin is a backward-branch loop around
a load (``LD``/``LDG``), possibly with ``NANOSLEEP``.

The mapping to the trace-time wait table (cutedebug.instrument.waitsites) is by order: the k-th
``TRYWAIT`` in address order is the k-th traced mbarrier wait, the k-th ``BAR.SYNC`` the k-th
traced barrier. It is called exact only when the counts agree; otherwise the record keeps what
the SASS itself says (the barrier register, the named barrier's id) and says why it is not exact.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Any

NVDISASM_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$")
# cuda-gdb: "   0x00007fecdb7a03a0 <+928>:\tSYNCS.PHASECHK.TRANS64.TRYWAIT P0[R4+URZ+0x20],R5"
# (disassemble) or "=> 0x7fecdb7a03b0 <kernel_name+944>:\t@!P0 NANOSLEEP.SYNCS 0x989680" (x/i)
GDB_LINE = re.compile(r"^\s*(?:=>\s*)?(0x[0-9a-f]+)\s+<[^>+]*\+(\d+)>:\s+(.*?)\s*;?\s*$")
DEST_PRED = re.compile(r"^\s*(U?P[0-9T])\b")
LABEL = re.compile(r"^\s*(\.L_x_\d+|\.L_\w+):\s*$")
LINE_MARK = re.compile(r'//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?')
PRED = re.compile(r"^(@!?U?P[0-9T])\s+")
LABEL_TARGET = re.compile(r"`\((\.L_\w+)\)")
ADDR_TARGET = re.compile(r"\b(0x[0-9a-f]+)\b")
MEM_OPERAND = re.compile(r"\[([^\]]+)\]")
SMALL_LOOP = 24  # instructions: a wait or spin loop is a handful; a working loop is more
DEFER_WINDOW = 24  # instructions a warp may issue past a BAR.SYNC.DEFER_BLOCKING


def b_len(sass: Sass, loop: tuple[int, int]) -> int:
    return len(sass.span(*loop))


@dataclass
class Instr:
    offset: int  # bytes from the function's start
    pred: str  # "@!P0", "" when unpredicated
    opcode: str  # "SYNCS.PHASECHK.TRANS64.TRYWAIT"
    operands: str  # "P0, [R7+URZ+0x20], R3"
    file: str = ""
    line: int = 0
    target: int | None = None  # branch target offset

    @property
    def text(self) -> str:
        return f"{self.pred + ' ' if self.pred else ''}{self.opcode} {self.operands}".strip()

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]


@dataclass
class Construct:
    """What a PC sits in."""

    kind: str  # mbarrier_wait | named_barrier | spin_load | nanosleep | exit | other
    index: int | None = None  # k-th mbarrier wait / k-th BAR.SYNC in address order
    start: int = 0  # loop head (or the instruction) offset
    end: int = 0  # backward branch offset (or the instruction)
    anchor: Instr | None = None  # TRYWAIT / BAR.SYNC / the spinning load
    barrier_id: int | None = None
    threads: int | None = None
    address_reg: str = ""  # register holding the barrier / flag address
    address_imm: int = 0  # immediate added to it
    address_hi: str = ""  # a 64-bit address ([R4.64]): the register of its high half (R5)
    phase_reg: str = ""  # register holding the awaited parity (mbarrier waits)

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in vars(self).items() if k != "anchor"}
        d["instruction"] = self.anchor.text if self.anchor else ""
        d["anchor_offset"] = self.anchor.offset if self.anchor else None
        return d


@dataclass
class Sass:
    instrs: list[Instr] = field(default_factory=list)
    function: str = ""

    def __post_init__(self) -> None:
        self._by_offset = {i.offset: n for n, i in enumerate(self.instrs)}
        self._offsets = [i.offset for i in self.instrs]
        self._memo: dict[Any, Any] = {}

    def _cached(self, key: Any, make: Any) -> Any:
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    # ---- structure -------------------------------------------------------------------
    @property
    def waits(self) -> list[Instr]:
        return self._cached("waits", self._waits)

    def _waits(self) -> list[Instr]:
        """One TRYWAIT per traced wait, in address order: a fast-path TRYWAIT whose
        ``@!P BRA`` enters an out-of-line retry loop owns the TRYWAIT of that loop."""
        return [w for w in self._trywaits() if w.offset not in self._retry_of()]

    def _trywaits(self) -> list[Instr]:
        return [
            i
            for i in self.instrs
            if i.opcode.startswith("SYNCS.PHASECHK") and "TRYWAIT" in i.opcode
        ]

    def _retry_of(self) -> dict[int, int]:
        """offset of a retry-loop TRYWAIT -> offset of the fast-path TRYWAIT that enters it:
        a forward ``@!Pn BRA`` from outside the retry loop to its head, issued after a
        TRYWAIT that set Pn (the scheduler may put other instructions between the two)."""
        return self._cached("retry", self._retry)

    def _retry(self) -> dict[int, int]:
        out: dict[int, int] = {}
        tries = self._trywaits()
        loops = self.loops()
        for u in tries:
            own = next(((h, b) for h, b in loops if h <= u.offset <= b), None)
            if own is None:
                continue
            head, branch = own
            for i in self.instrs:
                if not (
                    i.base == "BRA"
                    and i.pred.startswith("@!")
                    and i.target is not None
                    and head - 0x40 <= i.target <= u.offset
                    and not head - 0x40 <= i.offset <= branch
                    and i.offset < i.target  # forward: a retry block sits after its fast path
                ):
                    continue
                pred = i.pred[2:]
                fast = [t for t in tries if t.offset < i.offset and _dest_pred(t.operands) == pred]
                if fast and fast[-1].offset != u.offset:
                    out[u.offset] = fast[-1].offset
                break
        return out

    @property
    def bar_syncs(self) -> list[Instr]:
        return self._cached("bars", self._bar_syncs)

    def _bar_syncs(self) -> list[Instr]:
        return [i for i in self.instrs if i.opcode.startswith("BAR.SYNC")]

    def loops(self) -> list[tuple[int, int]]:
        return self._cached("loops", self._loops)

    def _loops(self) -> list[tuple[int, int]]:
        """(head, branch) of every backward branch, smallest first."""
        out = [
            (i.target, i.offset)
            for i in self.instrs
            if i.base in ("BRA", "JMP") and i.target is not None and i.target <= i.offset
        ]
        return sorted(out, key=lambda r: r[1] - r[0])

    def index_at(self, offset: int) -> int | None:
        """Index of the instruction at ``offset`` (or the last one before it)."""
        if offset in self._by_offset:
            return self._by_offset[offset]
        n = bisect.bisect_right(self._offsets, offset) - 1
        return n if n >= 0 else None

    def span(self, start: int, end: int) -> list[Instr]:
        lo = bisect.bisect_left(self._offsets, start)
        return self.instrs[lo : bisect.bisect_right(self._offsets, end)]

    # ---- what a PC is doing ------------------------------------------------------------
    def wait_loops(self) -> list[list[tuple[int, int]]]:
        return self._cached("wait_loops", self._wait_loops)

    def _wait_loops(self) -> list[list[tuple[int, int]]]:
        """Per wait (address order, as ``waits``): the ranges a warp stuck in it can sit in,
        its own smallest backward-branch loop (or the TRYWAIT alone) plus the out-of-line retry
        loop it enters, if any."""
        loops = self.loops()
        retry = self._retry_of()

        def own(w: Instr) -> tuple[int, int]:
            lp = next(((h, b) for h, b in loops if h <= w.offset <= b), None)
            if lp and b_len(self, lp) <= SMALL_LOOP:
                return lp
            n = self._by_offset[w.offset]  # a fast path: the TRYWAIT and its branch out
            nxt = self.instrs[n + 1] if n + 1 < len(self.instrs) else w
            return (w.offset, nxt.offset if nxt.base == "BRA" else w.offset)

        out = []
        for w in self.waits:
            ranges = [own(w)]
            for r_off, fast in retry.items():
                if fast == w.offset:
                    h, b = own(self.instrs[self._by_offset[r_off]])
                    n = self._by_offset[b]
                    # the slow path's head (e.g. a MOV before the loop label) and its way back
                    start = min(h, self.instrs[self._by_offset[r_off]].offset)
                    for prev in reversed(self.instrs[: self._by_offset[start]]):
                        if prev.base in ("BRA", "EXIT", "JMP") and not prev.pred:
                            break
                        start = prev.offset
                    end = (
                        self.instrs[n + 1].offset
                        if n + 1 < len(self.instrs) and self.instrs[n + 1].base == "BRA"
                        else b
                    )
                    ranges.append((start, end))
            out.append(ranges)
        return out

    def classify(self, pc_offset: int) -> Construct:
        return self._cached(("classify", pc_offset), lambda: self._classify(pc_offset))

    def _classify(self, pc_offset: int) -> Construct:
        n = self.index_at(pc_offset)
        if n is None:
            return Construct("other", start=pc_offset, end=pc_offset)
        here = self.instrs[n]
        waits = self.waits
        for k, ranges in enumerate(self.wait_loops()):
            for head, branch in ranges:
                if head <= pc_offset <= branch:
                    # the registers are those of the TRYWAIT the warp is looping on
                    here_try = [
                        i for i in self.span(head, branch) if i.opcode.startswith("SYNCS.PHASECHK")
                    ]
                    return _wait_construct(here_try[0] if here_try else waits[k], k, head, branch)
        if (c := self._barrier(here)) is not None:
            return c
        for head, branch in self.loops():
            if not head <= pc_offset <= branch:
                continue
            if b_len(self, (head, branch)) > SMALL_LOOP:
                break  # a big loop: the warp is working, not spinning
            body = self.span(head, branch)
            if any(i.opcode.startswith("SYNCS.PHASECHK") for i in body):
                # An out-of-line retry block: the wait whose forward branch enters it.
                entry = self._entering_wait(head, branch)
                if entry is not None:
                    return _wait_construct(entry, waits.index(entry), head, branch)
            loads = [i for i in body if i.base in ("LD", "LDG")]
            if loads:
                c = Construct("spin_load", start=head, end=branch, anchor=loads[0])
                c.address_reg, c.address_imm = _mem_reg(loads[0].operands)
                if re.search(rf"\b{c.address_reg}\.64\b", loads[0].operands):
                    c.address_hi = f"R{int(c.address_reg[1:]) + 1}"
                return c
            if any(i.base == "NANOSLEEP" for i in body):
                return Construct("nanosleep", start=head, end=branch, anchor=here)
            break
        if here.base == "EXIT":
            return Construct("exit", start=here.offset, end=here.offset, anchor=here)
        if here.base == "NANOSLEEP":
            return Construct("nanosleep", start=here.offset, end=here.offset, anchor=here)
        # A BAR.SYNC.DEFER_BLOCKING lets its warp issue independent instructions before it
        # blocks: the stuck PC can be several instructions past the barrier (H200: sm90_gemm's
        # warps 1 instruction after theirs, sm90_attention's 7). In a hung kernel a warp on
        # plain ALU work is blocked on the last barrier it issued.
        for k in range(n - 1, max(-1, n - DEFER_WINDOW), -1):
            prev = self.instrs[k]
            if (c := self._barrier(prev)) is not None:
                return c
            if (
                prev.base in ("EXIT", "RET", "JMP")
                or (prev.base == "BRA" and not prev.pred)
                or prev.opcode.startswith("SYNCS.PHASECHK")
            ):
                break  # control cannot fall through from above, or a wait came after it
        return Construct("other", start=here.offset, end=here.offset, anchor=here)

    def _barrier(self, i: Instr) -> Construct | None:
        if i.opcode.startswith("BAR.SYNC"):
            return _bar_construct(i, self.bar_syncs.index(i))
        if i.opcode.startswith("UCGABAR_WAIT"):
            return Construct("cluster_barrier", start=i.offset, end=i.offset, anchor=i)
        return None

    def _entering_wait(self, head: int, branch: int) -> Instr | None:
        waits = self.waits
        for i in self.instrs:
            if (
                i.base == "BRA"
                and i.target is not None
                and head <= i.target <= branch
                and not head <= i.offset <= branch
            ):
                before = [w for w in waits if w.offset < i.offset]
                if before and i.offset - before[-1].offset <= 0x40:
                    return before[-1]
        return None

    def line_at(self, pc_offset: int) -> tuple[str, int]:
        n = self.index_at(pc_offset)
        return (self.instrs[n].file, self.instrs[n].line) if n is not None else ("", 0)


def _dest_pred(operands: str) -> str:
    """The predicate a TRYWAIT writes: "P0, [R4+URZ+0x20], R5" (nvdisasm) or
    "P0[R4+URZ+0x20],R5" (cuda-gdb)."""
    m = DEST_PRED.match(operands)
    return m.group(1) if m else ""


def _mem_reg(operands: str) -> tuple[str, int]:
    found = MEM_OPERAND.findall(operands)  # desc[UR6][R4.64]: the address is the last one
    if not found:
        return "", 0
    reg, imm = "", 0
    for part in found[-1].split("+"):
        part = part.strip()
        if part.startswith("0x") or part.startswith("-0x"):
            imm += int(part, 16)
        elif re.fullmatch(r"U?R\d+(\.64)?", part) and not reg:
            reg = part.removesuffix(".64")
    return reg, imm


def _wait_construct(try_wait: Instr, index: int, head: int, branch: int) -> Construct:
    c = Construct("mbarrier_wait", index=index, start=head, end=branch, anchor=try_wait)
    c.address_reg, c.address_imm = _mem_reg(try_wait.operands)
    ops = [o.strip() for o in try_wait.operands.split(",")]
    c.phase_reg = ops[-1] if ops and re.fullmatch(r"U?R\d+", ops[-1]) else ""
    return c


def _bar_construct(bar: Instr, index: int) -> Construct:
    c = Construct("named_barrier", index=index, start=bar.offset, end=bar.offset, anchor=bar)
    ops = [o.strip() for o in bar.operands.split(",") if o.strip()]
    if ops and ops[0].startswith("0x"):
        c.barrier_id = int(ops[0], 16)
    if len(ops) > 1 and ops[1].startswith("0x"):
        c.threads = int(ops[1], 16)
    if ops and not ops[0].startswith("0x"):
        c.address_reg = ops[0]  # id in a register
    return c


# ---- parsing ------------------------------------------------------------------------------
def parse(text: str, function: str | None = None) -> Sass:
    """Parse nvdisasm (-g -c) or cuda-gdb ``disassemble`` output of ONE function (the first
    .text section, or the one whose name contains ``function``)."""
    if any(NVDISASM_LINE.match(raw) for raw in text.splitlines()):
        return _parse_nvdisasm(text, function)
    return _parse_gdb(text)


def _split(body: str) -> tuple[str, str, str]:
    pred = ""
    m = PRED.match(body)
    if m:
        pred, body = m.group(1), body[m.end() :]
    opcode, _, operands = body.partition(" ")
    return pred, opcode.strip(), operands.strip().rstrip(";").strip()


def _parse_nvdisasm(text: str, function: str | None) -> Sass:
    instrs: list[Instr] = []
    labels: dict[str, int] = {}
    pending: list[str] = []
    fname, file, line = "", "", 0
    active = False
    for raw in text.splitlines():
        if raw.startswith("//----") and ".text." in raw:
            name = raw.split(".text.", 1)[1].split()[0]
            if active and instrs:
                break  # one function only
            active = function is None or function in name
            fname = name if active else fname
            continue
        if not active:
            continue
        if raw.lstrip().startswith(".section") and ".text." in raw:
            fname = raw.split(".text.", 1)[1].split(",")[0].strip()  # uncut, unlike the header
            continue
        m = LINE_MARK.search(raw)
        if m:
            file, line = m.group(1), int(m.group(2))
            continue
        m = LABEL.match(raw)
        if m:
            pending.append(m.group(1))
            continue
        m = NVDISASM_LINE.match(raw)
        if not m:
            continue
        offset = int(m.group(1), 16)
        for lab in pending:
            labels[lab] = offset
        pending = []
        pred, opcode, operands = _split(m.group(2))
        instrs.append(Instr(offset, pred, opcode, operands, file, line))
    for i in instrs:
        if i.base in ("BRA", "JMP", "BSSY", "CALL"):
            t = LABEL_TARGET.search(i.operands)
            if t and t.group(1) in labels:
                i.target = labels[t.group(1)]
    return Sass(instrs, fname)


def _parse_gdb(text: str) -> Sass:
    instrs: list[Instr] = []
    base_addr = None
    for raw in text.splitlines():
        m = GDB_LINE.match(raw)
        if not m:
            continue
        addr, off = int(m.group(1), 16), int(m.group(2))
        if base_addr is None:
            base_addr = addr - off
        pred, opcode, operands = _split(m.group(3))
        instrs.append(Instr(off, pred, opcode, operands))
    for i in instrs:
        if i.base in ("BRA", "JMP", "BSSY", "CALL") and base_addr is not None:
            for t in ADDR_TARGET.findall(i.operands):
                v = int(t, 16)
                if v >= base_addr:
                    i.target = v - base_addr
                    break
    return Sass(instrs)


# ---- SASS <-> trace-time wait table -----------------------------------------------------------
MBAR_KINDS = ("mbarrier_wait", "mbarrier_try_wait")
BAR_KINDS = ("named_barrier_sync", "sync_threads", "cluster_wait")  # cluster_wait: + BAR.SYNC 0


@dataclass
class SiteMap:
    """The k-th SASS wait / BAR.SYNC -> its trace-time site (cutedebug.instrument.waitsites)."""

    waits: dict[int, Any] = field(default_factory=dict)  # TRYWAIT index -> WaitSite
    bars: dict[int, Any] = field(default_factory=dict)  # BAR.SYNC index -> WaitSite
    waits_exact: bool = False
    bars_exact: bool = False
    notes: list[str] = field(default_factory=list)

    def site_of(self, c: Construct) -> tuple[Any, bool]:
        """(site or None, exact) for a classified construct."""
        if c.kind == "mbarrier_wait" and c.index is not None:
            return self.waits.get(c.index), self.waits_exact
        if c.kind == "named_barrier" and c.index is not None:
            return self.bars.get(c.index), self.bars_exact
        return None, False


def map_sites(code: Sass, sites: list[Any]) -> SiteMap:
    m = SiteMap()
    traced = [s for s in sites if s.kind in MBAR_KINDS]
    waits = code.waits
    if len(traced) == len(waits):
        m.waits = dict(enumerate(traced))
        m.waits_exact = True
    elif len(waits) < len(traced) and all(s.line for s in traced):
        # Waits the compiler removed (dead code after an early exit): align in order, by the
        # nearest line of the wait's fast path or retry loop.
        lines = [
            [i.line for h, b in ranges for i in code.span(h, b) if i.line] or [0]
            for ranges in code.wait_loops()
        ]
        m.waits = _align(lines, traced)
        m.notes.append(
            f"{len(waits)} mbarrier wait loops in the SASS, {len(traced)} waits "
            "traced (the compiler removed some): each mapped in order to the traced "
            "wait of the nearest line, not exact"
        )
    else:
        m.notes.append(
            f"{len(waits)} mbarrier wait loops in the SASS, {len(traced)} waits "
            "traced: the wait sites are not mapped (the barrier register and the "
            "line table still are)"
        )
    traced_bars = [s for s in sites if s.kind in BAR_KINDS]
    bars = [_bar_construct(b, k) for k, b in enumerate(code.bar_syncs)]
    if len(traced_bars) == len(bars) and all(_bar_agrees(b, s) for b, s in zip(bars, traced_bars)):
        m.bars = dict(enumerate(traced_bars))
        m.bars_exact = True
    else:
        # By (id, thread count) where exactly one traced barrier has them.
        for k, b in enumerate(bars):
            cands = [s for s in traced_bars if _bar_agrees(b, s)]
            if len({(s.file, s.line) for s in cands}) > 1 and b.anchor is not None:
                # a BAR.SYNC keeps its own line in the line table: the candidate on it
                cands = [s for s in cands if s.line == b.anchor.line] or cands
            if len({(s.file, s.line) for s in cands}) == 1:
                m.bars[k] = cands[0]
        m.notes.append(
            f"{len(bars)} BAR.SYNC in the SASS, {len(traced_bars)} barriers traced: "
            f"{len(m.bars)} mapped by barrier id and thread count"
        )
    return m


def _bar_agrees(b: Construct, s: Any) -> bool:
    if b.barrier_id is not None and s.barrier_id is not None and b.barrier_id != s.barrier_id:
        return False
    if b.barrier_id is None and s.barrier_id is not None:
        return True  # id in a register: nothing to compare
    if s.kind == "sync_threads" or s.threads is None:
        return b.threads is None
    return b.threads == s.threads


def _align(sass_lines: list[list[int]], traced: list[Any]) -> dict[int, Any]:
    """Monotone assignment of each SASS wait to a distinct traced wait (some traced waits are
    skipped), minimizing the summed line distance."""
    n, t = len(sass_lines), len(traced)
    inf = float("inf")

    def cost(i: int, j: int) -> float:
        return min(abs(x - traced[j].line) for x in sass_lines[i])

    best = [[inf] * (t + 1) for _ in range(n + 1)]
    best[0] = [0.0] * (t + 1)
    for i in range(1, n + 1):
        for j in range(i, t + 1):
            best[i][j] = min(best[i][j - 1], best[i - 1][j - 1] + cost(i - 1, j - 1))
    out: dict[int, Any] = {}
    i, j = n, t
    while i > 0:
        if j > i and best[i][j] == best[i][j - 1]:
            j -= 1
        else:
            out[i - 1] = traced[j - 1]
            i, j = i - 1, j - 1
    return out
