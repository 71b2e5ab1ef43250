"""The dynamic shared memory each kernel's launch asks for, per scenario configuration (CPU).

    python tools/smem_totals.py sm90_gemm tma_stream ...   # kernel file stems

The launch takes its dynamic smem size from the DSL's allocation pass (cute.kernel_smem_size,
host code: not in the PTX). To read it on a CPU, each distinct configuration of the kernel's
scenarios (params + kernel-level switch; patch faults do not allocate) is compiled once with a
printf of ``SmemAllocator.calculate_total_usage()`` placed before the first call that follows
the kernel's allocations (a pipeline's create(), mbarrier_init_fence or sync_threads): the DSL
folds it to a constant, an immediate of the PTX. One line per configuration: the stem, the
params, the total, and the kernel's ``smem_bytes``. A refactor of a kernel's smem (separate
allocations -> one struct) keeps the launch identical when the totals match before and after.
Measured on a 4.8.1 compile: the total is the end of the last allocation, not rounded up.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MAGIC = 0x5EED0000  # added to the total so its immediate is easy to find


def instrument():
    """Patch the post-allocation calls; returns a function that re-arms the one printf."""
    import cutlass
    from cutlass import cute, pipeline
    from cutlass.memory import SmemAllocator

    armed = {"on": True}

    def emit():
        if armed["on"]:
            armed["on"] = False
            total = cutlass.Int32(SmemAllocator().calculate_total_usage())
            cute.printf("SMEM_TOTAL=%d\n", total + cutlass.Int32(MAGIC))

    def before(fn):
        def wrapper(*a, **k):
            emit()
            return fn(*a, **k)

        return wrapper

    for cls in (pipeline.PipelineTmaAsync, pipeline.PipelineTmaUmma):
        cls.create = staticmethod(before(cls.create))
    for name in ("mbarrier_init_fence", "sync_threads"):
        setattr(cute.arch, name, before(getattr(cute.arch, name)))
    return lambda: armed.update(on=True)


def main(stems: list[str]) -> int:
    from cutlass import cute

    from cutedebug.engine import scenario as S
    from cutedebug.kernel_api import load_entry

    rearm = instrument()
    seen = set()
    for f in sorted((ROOT / "scenarios").rglob("*.toml")):
        sc = S.load(f)
        stem = Path(sc.kernel_file).stem
        if stem not in stems:
            continue
        cls = load_entry(sc.kernel_file, sc.kernel_entry)
        params = dict(sc.params)
        if sc.fault in getattr(cls, "SWITCHES", {}):
            params[sc.fault] = True
        key = (stem, json.dumps(params, sort_keys=True))
        if key in seen:
            continue
        seen.add(key)
        k = cls(**params)
        rearm()
        try:
            ptx = cute.compile[cute.GPUArch(sc.archs[0]), cute.KeepPTX()](k, *k.fake_args())
            found = {int(v) - MAGIC for v in re.findall(r"\d{9,}", ptx.__ptx__)}
            total = ",".join(str(v) for v in sorted(v for v in found if 0 <= v < 1 << 20))
        except Exception as e:  # a configuration the DSL rejects (the align switches)
            total = f"({type(e).__name__})"
        print(f"{stem} {key[1]} total={total} smem_bytes={getattr(k, 'smem_bytes', '-')}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    sys.exit(main(sys.argv[1:]))
