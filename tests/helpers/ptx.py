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


class PtxCache:
    """The PTX of a kernel class compiled on its fake arguments for ``arch`` with a fault in,
    cached per parameters and fault (one compile each per test module): ``cache(fault, args,
    **params) -> (ptx, Applied)``. A switch the kernel declares (its SWITCHES) is set as a
    parameter; a registry fault is injected around the compile."""

    def __init__(self, cls: type, dump: object, arch: str = "sm_90a", base: dict | None = None):
        self.cls, self.dump, self.arch, self.base = cls, dump, arch, dict(base or {})
        self._done: dict[tuple, tuple[str, object]] = {}

    def __call__(self, fault: str | None = None, args: dict | None = None, **params):
        key = (fault, tuple(sorted((args or {}).items())), tuple(sorted(params.items())))
        if key not in self._done:
            from cutlass import cute
            from cutlass.base_dsl.compiler import DumpDir

            from cutedebug.instrument import faults

            switch = fault in getattr(self.cls, "SWITCHES", {})
            k = self.cls(**(self.base | params | ({fault: True} if switch else {})))
            opts = cute.compile[cute.GPUArch(self.arch), cute.KeepPTX(), DumpDir(str(self.dump))]
            with faults.inject(None if switch else fault, None if switch else args) as applied:
                text = opts(k, *k.fake_args()).__ptx__
            self._done[key] = (text, applied)
        return self._done[key]


def shrink_smem_field(k: object, name: str, dtype: object, elements: int = 64) -> None:
    """``k``'s SharedStorage field ``name`` made ``elements`` shorter (1024-B aligned): a struct
    that disagrees with the kernel's layouts, which its ``__call__`` must refuse."""
    from cutlass import cute

    fields = k.smem_fields()
    mem, align = cute.struct.MemRange, cute.struct.Align
    fields[name] = align[mem[dtype, fields[name].dtype.size - elements], 1024]
    k.smem_fields = lambda: fields
