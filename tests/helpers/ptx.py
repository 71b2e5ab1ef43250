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
