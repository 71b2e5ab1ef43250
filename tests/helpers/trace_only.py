"""Trace-only compiles for tests that assert what the DSL trace decides, never the PTX.

A fault's sites, the lint recorder's protocol and findings, and the probe sites are all
recorded while the kernel is traced; the MLIR lowering after the trace (most of a compile's
CPU) changes none of them. ``with trace_only(): cute.compile[...](...)`` stops after the IR
is generated (the DSL's own dry run, ``CUTE_DSL_DRYRUN``): same trace, same hooks, no PTX,
and ``cute.compile`` returns None. The full compile of the same kernels and faults is what
the scenario compile items (scenarios/**.toml::compile) and the PTX tests check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def trace_only() -> Iterator[None]:
    from cutlass.cutlass_dsl import CuTeDSL

    envar = CuTeDSL._get_dsl().envar
    before = envar.dryrun
    envar.dryrun = True
    try:
        yield
    finally:
        envar.dryrun = before
