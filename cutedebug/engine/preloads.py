"""A fork server's library imports: the third-party modules a run's kernel file needs, imported
once in the server so each forked worker finds them imported.

A scenario over a public library declares it (``requires.modules``, e.g. ``flash_attn.cute`` or
``quack``); importing such a library costs seconds in every fresh worker (FA-4 1.9 s of CPU
after torch and cutlass, quack and its GEMM modules 3.0 s, measured on the CPU machine).
:class:`Preloader` imports, in the fork server and before it forks the run's worker, the
declared modules and the modules of those packages that the kernel file imports at its top
level. The kernel file itself is never imported there: it is the user's code, imported fresh
by each worker as before. A worker's order is unchanged: its kernel's libraries are imported
before any fault or probe is entered (the instrumentation patches at trace time).

A fork server must never initialize CUDA (a context does not survive a fork): when an import
did (``torch.cuda.is_initialized()``), the server stops preloading and says so, and its
client restarts it without preloads (:class:`cutedebug.engine.forkserver.ForkServer`).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def modules_for(request_path: str | Path) -> list[str]:
    """The library modules of a run's request: its scenario's ``requires.modules`` and the
    top-level imports of its kernel file from those packages; [] when it declares none."""
    try:
        sc = json.loads(Path(request_path).read_text())["scenario"]
        declared = [m for m in sc.get("modules") or [] if isinstance(m, str)]
        kernel_file = sc["kernel"]["file"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if not declared:
        return []
    packages = {m.split(".")[0] for m in declared}
    found = list(declared)
    try:
        tree = ast.parse(Path(kernel_file).read_text())
    except (OSError, SyntaxError, ValueError):
        return found
    for node in tree.body:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [n for n in names if n.split(".")[0] in packages]
    return list(dict.fromkeys(found))


class Preloader:
    """Imports each request's library modules once; ``cuda_error`` says why preloading
    stopped (an import initialized CUDA), after which the server must not fork."""

    def __init__(self) -> None:
        self.done: set[str] = set()
        self.cuda_error: str | None = None

    def __call__(self, req: dict[str, Any]) -> str | None:
        if self.cuda_error or req.get("job", "worker") != "worker":
            return self.cuda_error
        fresh = False
        for name in modules_for(req.get("request", "")):
            if name in self.done:
                continue
            self.done.add(name)
            fresh = True
            try:
                with _stdout_to_stderr():
                    importlib.import_module(name)
            except Exception as e:  # noqa: BLE001  (the worker imports it again and says why)
                print(
                    f"fork server: preloading {name} failed ({type(e).__name__}: {e}); "
                    "the worker imports it itself",
                    file=sys.stderr,
                    flush=True,
                )
            if _cuda_initialized():
                self.cuda_error = f"importing {name} initialized CUDA in the fork server"
                print(f"fork server: {self.cuda_error}; preloading stops", file=sys.stderr)
                break
        if fresh and not self.cuda_error:  # what they loaded, as the server's own imports
            freeze()
        return self.cuda_error


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """The fork server answers on its stdout: what an import prints (``print`` or a write to
    fd 1 from C) goes to stderr, the server's log, instead."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001  (a torch without CUDA support: nothing initialized)
        return False


def freeze() -> None:
    """After a server's imports, before it forks: the modules loaded so far that hold no
    hooked DSL function are skipped by a worker's patcher (instrument/patching.freeze), and
    every object the server holds is out of the garbage collector's reach (gc.freeze): a
    forked worker's collections then never walk the server's ~300k objects (torch and
    cutlass loaded), which costs copy-on-write faults and up to ~0.2 s of a compile
    (reports/2026-12-02-cpu-warm2/freeze_ab.txt)."""
    import gc

    from cutedebug.instrument import entry_points, patching

    patching.freeze(entry_points.rebound_everywhere())
    gc.freeze()
