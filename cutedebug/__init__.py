"""cutedebug: hang/race debugging harness with fault injection for CuTe DSL kernels."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy: the parent process imports this package and must not pay for (or need) cutlass.
    if name == "checkpoint":
        import importlib

        return importlib.import_module("cutedebug.instrument.checkpoint")  # a callable module
    raise AttributeError(f"module 'cutedebug' has no attribute {name!r}")
