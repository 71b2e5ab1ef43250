"""Reading facts out of PTX text in tests: immediates, expect_tx bytes, mbarrier init counts."""

import re

_MOV = re.compile(r"mov\.b32\s+(%r\d+),\s*(\d+);")
_EXPECT_TX = re.compile(r"mbarrier\.arrive\.expect_tx\.shared\.b64\s+\S+,\s*\[[^\]]+\],\s*(\S+);")
_INIT = re.compile(r"mbarrier\.init\.shared\.b64\s+\[[^\]]+\],\s*(\S+);")


def immediates(ptx_text: str) -> dict[str, int]:
    """Register -> value for every ``mov.b32 %rN, IMM;`` in the PTX."""
    return {r: int(v) for r, v in _MOV.findall(ptx_text)}


def _operands(pattern: re.Pattern, ptx_text: str) -> list[int]:
    regs = immediates(ptx_text)
    return [regs[r] if r in regs else int(r) for r in pattern.findall(ptx_text)]


def expect_tx_bytes(ptx_text: str) -> list[int]:
    """The byte count of every ``mbarrier.arrive.expect_tx`` in PTX order."""
    return _operands(_EXPECT_TX, ptx_text)


def init_counts(ptx_text: str) -> list[int]:
    """The arrive count of every ``mbarrier.init`` in PTX order."""
    return _operands(_INIT, ptx_text)


_MOV_ANY = re.compile(r"mov\.(?:b32|u32|s32)\s+(%r\d+),\s*(-?\d+);")


def last_operands(ptx_text: str, instr: str) -> list[int | str]:
    """The last operand of every ``instr`` line, a register resolved to the immediate of the
    latest ``mov`` into it before that line (left as the register name when there is none)."""
    values: dict[str, str] = {}
    out: list[int | str] = []
    pattern = re.compile(r"^\s*" + re.escape(instr) + r"\b[^;]*,\s*(%r\d+|\d+)\s*;")
    for line in ptx_text.splitlines():
        if m := _MOV_ANY.search(line):
            values[m.group(1)] = m.group(2)
        if m := pattern.search(line):
            value = values.get(m.group(1), m.group(1))
            out.append(int(value) if value.lstrip("-").isdigit() else value)
    return out
