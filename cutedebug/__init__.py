"""cutedebug: hang/race debugging harness with fault injection for CuTe DSL kernels."""

__version__ = "0.1.0"
