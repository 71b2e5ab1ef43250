"""Measurement only (``python tools/suite_cpu.py --compiles``): every process started with this
folder on PYTHONPATH logs each DSL lowering (CuTe DSL's ``CompilerBackend.compile``, what runs
after the trace) to $SUITE_CPU_COMPILES: the SHA-1 of the MLIR bytecode with the target arch,
its CPU and wall seconds, the process and the xdist worker. The hook is installed when the DSL
module is first imported; nothing else is imported here."""

import os
import sys

_LOG = os.environ.get("SUITE_CPU_COMPILES")
_MODULE = "cutlass.base_dsl.compile_backend"


def _wrap(module) -> None:
    import hashlib
    import io
    import json
    import time

    backend = module.CompilerBackend
    original = backend.compile

    def compile(self, ctx):
        try:
            buf = io.BytesIO()
            ctx.module.operation.write_bytecode(buf)
            arch = self._resolve_compile_gpu_arch()
            key = hashlib.sha1(buf.getvalue() + arch.encode()).hexdigest()[:16]
        except Exception as e:  # a DSL without these: counted, unhashed
            key = f"unhashed:{type(e).__name__}"
        t0, cpu0 = time.time(), time.process_time()
        try:
            return original(self, ctx)
        finally:
            rec = {
                "hash": key,
                "function": ctx.function_name[:120],
                "t0": t0,
                "wall": time.time() - t0,
                "cpu": time.process_time() - cpu0,
                "pid": os.getpid(),
                "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            }
            with open(_LOG, "a") as f:
                f.write(json.dumps(rec) + "\n")

    backend.compile = compile


if _LOG:
    import importlib.abc
    import importlib.machinery

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != _MODULE:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_wrap(module):
                exec_module(module)
                _wrap(module)

            spec.loader.exec_module = exec_and_wrap
            return spec

    sys.meta_path.insert(0, _Finder())
