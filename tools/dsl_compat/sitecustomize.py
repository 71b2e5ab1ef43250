"""nvidia-cutlass-dsl 4.7 aliases for the two 4.8 module paths the repository's kernels import.

tools/dsl_versions.py puts this folder first on the children's PYTHONPATH: on 4.8 it does
nothing; on 4.7 it makes ``cutlass.memory`` (SmemAllocator, TmemAllocator) and
``cutlass.tensor_utils`` (LayoutEnum) the 4.7 objects of ``cutlass.utils``, so the check
reaches what it is for: cutedebug's patches, probes and lint recorder on that version. The
installed cutedebug package needs none of this (kernels/ are examples, not part of it).
"""

import sys
import types

try:
    import cutlass.memory  # noqa: F401
except ImportError:
    import cutlass.utils as _u

    _m = types.ModuleType("cutlass.memory")
    for _n in ("SmemAllocator", "TmemAllocator"):
        if hasattr(_u, _n):
            setattr(_m, _n, getattr(_u, _n))
    sys.modules["cutlass.memory"] = _m
try:
    import cutlass.tensor_utils  # noqa: F401
except ImportError:
    import cutlass.utils as _u

    _t = types.ModuleType("cutlass.tensor_utils")
    _t.LayoutEnum = _u.LayoutEnum
    sys.modules["cutlass.tensor_utils"] = _t
