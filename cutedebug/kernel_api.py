"""The small interface a kernel file offers to cutedebug.

A scenario names a kernel by file path and entry name (``kernels/tma_stream.py:TmaStream``).
The entry is a class; cutedebug never edits the file. The class provides:

    PARAMS: dict[str, object]          name -> default; the default's type is the param's type
    CHOICES: dict[str, tuple] = {}     allowed values for some params (e.g. dtype)
    SHRINKABLE: tuple[str, ...] = ()   int params that `--shrink` may reduce (problem size)
    ARCHS: tuple[str, ...]             targets it compiles for, e.g. ("sm_90a",)
    SWITCHES: dict[str, str] = {}      kernel-level faults: name -> one-line description.
                                       A switch is a bool param of the same name (default False)
                                       that the kernel reads at trace time.

    __init__(self, **params)           static configuration only (no CUDA, no torch)
    fake_args(self) -> tuple           cute arguments for a CPU compile
                                       (cute.runtime.make_fake_tensor, ...)
    make_inputs(self, device) -> dict  torch tensors: seeded random inputs AND output buffers
    cute_args(self, tensors) -> tuple  cute arguments for the real run (from_dlpack, stream, ...)
    @cute.jit __call__(self, *args)    host side; cutedebug compiles ``cute.compile(obj, *args)``
    reference(self, tensors) -> Tensor the expected output, computed with torch
    output(self, tensors) -> Tensor    the kernel's output (same shape as reference)

Optional:
    launch(self, compiled, args)       default: ``compiled(*args)``
    TOLERANCE: tuple[float, float]     (atol, rtol) for the comparison; default (1e-5, 1e-5)
    tiling(self) -> dict               how the output is tiled, so a MISMATCH can be laid over
                                       the tiles (edge tiles, in-tile rows/columns, work order):
        {"shape": [R, C],              output() viewed as an R x C matrix (row-major reshape)
         "tile": [tm, tn],             the output tile one CTA computes per work unit
         "stages": S,                  ring depth of the main pipeline (optional)
         "k_tiles": K,                 ring slots one tile consumes (optional, default 1)
         "tile_cta": [[int]],          per tile (ceil(R/tm) x ceil(C/tn)): its CTA, -1 if none
         "tile_seq": [[int]]}          per tile: its 0-based position in its CTA's work order
                                       (both optional; without them no per-CTA / per-stage
                                       pattern). Plain Python, no CUDA; see kernels/*.py.

The interface is duck-typed: a user's kernel does not import cutedebug.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

REQUIRED_ATTRS = ("PARAMS", "fake_args", "make_inputs", "cute_args", "reference", "output")


class KernelLoadError(Exception):
    """The kernel file or entry cannot be used; the message names file, entry and why."""


def load_module(path: str | Path):
    """Import a kernel file by path under a private module name."""
    path = Path(path).resolve()
    if not path.is_file():
        raise KernelLoadError(f"{path}: kernel file not found")
    name = "cutedebug_kernel_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise KernelLoadError(f"{path}: not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # Imports beside the kernel file (its helpers) must resolve like a script's would.
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def load_entry(path: str | Path, entry: str):
    """Return the entry class of a kernel file, checked against the interface."""
    module = load_module(path)
    cls = getattr(module, entry, None)
    if cls is None:
        names = sorted(
            n for n, v in vars(module).items() if isinstance(v, type) and hasattr(v, "PARAMS")
        )
        raise KernelLoadError(
            f"{path}: no entry {entry!r}; kernel classes in this file: {names or 'none'}"
        )
    check_entry(cls, f"{path}:{entry}")
    return cls


def check_entry(cls: Any, where: str) -> None:
    missing = [a for a in REQUIRED_ATTRS if not hasattr(cls, a)]
    if missing:
        raise KernelLoadError(
            f"{where}: kernel entry lacks {', '.join(missing)} "
            "(see cutedebug/kernel_api.py for the interface)"
        )
    if not isinstance(cls.PARAMS, dict):
        raise KernelLoadError(f"{where}: PARAMS must be a dict of name -> default")


def resolve_params(cls: Any, given: dict[str, Any], where: str) -> dict[str, Any]:
    """Defaults overlaid with ``given``, each checked for name, type and allowed value."""
    params = dict(cls.PARAMS)
    for name in getattr(cls, "SWITCHES", {}):
        params.setdefault(name, False)
    choices = getattr(cls, "CHOICES", {})
    for name, value in given.items():
        if name not in params:
            raise KernelLoadError(
                f"{where}: params.{name}: unknown parameter; allowed: {sorted(params)}"
            )
        default = params[name]
        want = type(default)
        ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise KernelLoadError(f"{where}: params.{name} = {value!r}: expected {want.__name__}")
        if name in choices and value not in choices[name]:
            raise KernelLoadError(
                f"{where}: params.{name} = {value!r}: allowed values {list(choices[name])}"
            )
        params[name] = value
    return params
