"""cutedebug: hang/race debugging harness with fault injection for CuTe DSL kernels.

PYTEST_DONT_REWRITE: `cutedebug exec -- pytest ...` imports this package (its sitecustomize)
before pytest loads the cutedebug plugin; this line keeps pytest from warning that it could not
rewrite the package (it holds no asserts; the plugin module itself is still rewritten).
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy: the parent process imports this package and must not pay for (or need) cutlass.
    if name == "checkpoint":
        import importlib

        return importlib.import_module("cutedebug.instrument.checkpoint")  # a callable module
    raise AttributeError(f"module 'cutedebug' has no attribute {name!r}")
