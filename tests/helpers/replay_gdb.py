"""cuda-gdb replayed from what it printed on the H200, for CPU tests of read_core.

A capture (tools/capture_coredumps.py) keeps, per core, cuda-gdb's real answers: pass 1 (kernels,
every warp), the kernel's disassembly and `info registers` of warps it focused. ``ReplayGdb``
stands in for a ``cutedebug.analyses.cudagdb.GdbSession``: a round with "info cuda kernels"
gets pass 1 as printed; any other list is answered command by command from the same facts
(focus switches, ``x/1i $pc`` with the function offset, ``p/x $Rn`` from the captured
registers; ``bt`` prints nothing, so the SASS line table gives the line).
"""

from __future__ import annotations

import re

from cutedebug.analyses import cudagdb

FOCUS = re.compile(r"cuda device (\d+) sm (\d+) warp (\d+) lane (\d+)")
ECHO = re.compile(r"^echo (.*)$")
PRINT = re.compile(r"^p/x \$(U?R\d+)$")
REG_LINE = re.compile(r"^(U?R\d+|P\d)\s+(0x[0-9a-f]+)\s")
WARP_SECTION = re.compile(r"^=== (?:warp|rep) (\d+) (\d+) (\d+) (\d+)")


def registers_by_warp(text: str) -> dict[tuple[int, int, int], dict[str, int]]:
    """`info registers` blocks of a capture's pass 2/3, keyed by (dev, sm, hw warp)."""
    out: dict[tuple[int, int, int], dict[str, int]] = {}
    cur = None
    for line in text.splitlines():
        m = WARP_SECTION.match(line)
        if m:
            cur = out.setdefault(tuple(int(x) for x in m.groups()[:3]), {})
            continue
        m = REG_LINE.match(line)
        if m and cur is not None:
            cur.setdefault(m.group(1), int(m.group(2), 16))
    return out


def function_base(disassembly: str) -> int:
    m = re.search(r"^\s*(0x[0-9a-f]+)\s+<\+0>:", disassembly, re.M)
    assert m, "no <+0> line in the disassembly"
    return int(m.group(1), 16)


class Session:
    """What read_core needs of cudagdb.GdbSession (send a round, receive its output, run =
    both, close), answered by the subclass's ``answer(commands)``. ``opened`` counts the
    sessions read_core asked for (``session`` stands in for coredump.gdb_session), ``calls``
    the rounds, ``events`` the order of sends and receives."""

    def __init__(self):
        self.calls: list[list[str]] = []
        self.events: list[str] = []
        self.opened = self.closed = 0
        self.started = 1  # cuda-gdb processes, as GdbSession counts them
        self._pending: list[str] = []

    def session(self, core, cuda_gdb=None):
        self.opened += 1
        return self

    def send(self, commands):
        self.events.append("send")
        self._pending = list(commands)

    def receive(self, timeout_s=None):
        self.events.append("receive")
        self.calls.append(self._pending)
        return self.answer(self._pending), 0.0

    def run(self, commands, timeout_s=None):
        self.send(commands)
        return self.receive(timeout_s)

    def close(self, kill=False):
        self.closed += 1


class ReplayGdb(Session):
    def __init__(
        self,
        pass1: str,
        base: int,
        registers: dict[tuple[int, int, int], dict[str, int]],
        focus_pc: bool = True,
    ):
        """``base``: the kernel's address (the <+0> line of cuda-gdb's disassembly).
        ``focus_pc``: answer pass 1's ``x/1i $pc`` (the focused warp's offset) too."""
        super().__init__()
        self.pass1, self.registers, self.base = pass1, registers, base
        self.focus_pc = focus_pc
        self.pcs = {(w.dev, w.sm, w.hw_warp): w.pc for w in cudagdb.parse_warps(pass1)}

    def answer(self, commands):
        if "info cuda kernels" in commands:
            m = re.search(
                r"focus set to CUDA kernel \d+,.*? device (\d+), sm (\d+), "
                r"warp (\d+),",
                self.pass1,
            )
            if not (self.focus_pc and m and "x/1i $pc" in commands):
                return self.pass1
            pc = self.pcs[tuple(int(x) for x in m.groups())]
            return self.pass1 + f"=> {pc:#x} <kernel+{pc - self.base}>:\tINSTR\n"
        out, cur, n = [], None, 0
        for c in commands:
            if m := ECHO.match(c):
                out.append(m.group(1).replace("\\n", "\n").rstrip("\n"))
            elif m := FOCUS.match(c):
                cur = tuple(int(x) for x in m.groups()[:3])
                out.append(
                    f"[Switching focus to CUDA kernel 0, device {cur[0]}, sm {cur[1]}, "
                    f"warp {cur[2]}, lane {m.group(4)}]"
                )
            elif c == "x/1i $pc" and cur in self.pcs:
                pc = self.pcs[cur]
                out.append(f"=> {pc:#x} <kernel+{pc - self.base}>:\tINSTR")
            elif (m := PRINT.match(c)) and cur is not None:
                n += 1
                v = self.registers.get(cur, {}).get(m.group(1))
                out.append(f"${n} = {v:#x}" if v is not None else f"${n} = <unavailable>")
        return "\n".join(out) + "\n"


class PassReplay(Session):
    """cuda-gdb's output of a real run of read_core, returned call by call (the run folder's
    coredump_gdb_pass1.txt, pass2, ...: one per round). A command the recorded run did not give (e.g. a
    register read after a change of the reader) finds no output: its value stays unknown."""

    def __init__(self, outputs: list[str]):
        super().__init__()
        self.outputs = list(outputs)

    def answer(self, commands):
        if len(self.calls) > len(self.outputs):
            raise AssertionError(
                f"read_core asked for cuda-gdb round {len(self.calls)}, the "
                f"recorded run had {len(self.outputs)}"
            )
        return self.outputs[len(self.calls) - 1]
