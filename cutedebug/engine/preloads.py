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

Some libraries ask the GPU at import: quack's rmsnorm builds its autotune configs at module
level (``rmsnorm_config._detect_arch_major``: ``torch.cuda.get_device_capability()`` unless
``QUACK_ARCH`` names the arch), and FA-4's ``flash_attn.cute`` imports it. On the H200 that
initialized CUDA in the server, which then restarted without preloads: every field worker
imported FA-4 or quack itself, 4.0-9.2 s of each run (reports/2026-12-02-h200-s7, calls 3-4).
So the imports run with :func:`import_env` set (restored after): ``QUACK_ARCH`` from
nvidia-smi when every GPU it lists has one compute capability (the value a worker's own import
would find, cached by quack where the worker inherits it), and torch's NVML-based
``is_available`` (no driver call). And since an import may reach the driver some other way,
after any fresh import the server forks one child that runs the driver's health check (a
context, a kernel, its output compared: :func:`fork_probe`); when that child cannot, preloading
stops exactly as for an import that initialized CUDA.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import os
import select
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from cutedebug.engine import gpus

# Set while the server imports a run's libraries, where the environment does not set them:
# quack's arch (its import asks the GPU otherwise) and torch's driver-free is_available
ARCH_VAR = "QUACK_ARCH"
NVML_VAR = "PYTORCH_NVML_BASED_CUDA_CHECK"
PROBE_TIMEOUT_S = 30.0


def modules_for(request_path: str | Path) -> list[str]:
    """The library modules of a run's request: its scenario's ``requires.modules`` and the
    top-level imports of its kernel file from those packages; [] when it declares none."""
    try:
        sc = json.loads(Path(request_path).read_text())["scenario"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return modules_of(sc)


def modules_of(scenario: dict[str, Any]) -> list[str]:
    """:func:`modules_for` of a scenario as its JSON form (``Scenario.to_json()``)."""
    try:
        declared = [m for m in scenario.get("modules") or [] if isinstance(m, str)]
        kernel_file = scenario["kernel"]["file"]
    except (AttributeError, KeyError, TypeError):
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


def modules_of_scenarios(scenarios: Iterable[Any]) -> list[str]:
    """Every module a fork server could preload for these scenarios (each one's
    :func:`modules_of`), once each, in order. Nothing is looked up here (finding a module
    imports its parent package: the caller may be a harness that imports no library); one the
    server cannot import is reported in its log, and the worker says why."""
    found: list[str] = []
    for sc in scenarios:
        found += modules_of(sc.to_json())
    return list(dict.fromkeys(found))


def summary(answer: dict[str, Any]) -> str:
    """One line for a server's answer to a preload request (forkserver.preloaded)."""
    if answer.get("preload") != "on":
        return f"preloading {answer.get('preload') or 'off'}"
    names = answer.get("preloaded") or []
    line = f"{len(names)} library module(s) preloaded in {answer.get('preload_s', 0):.2f} s" + (
        f" ({', '.join(names)})" if names else ""
    )
    failed = answer.get("failed") or {}
    return line + "".join(f"; {n} not importable ({why})" for n, why in failed.items())


class Preloader:
    """Imports each request's library modules once; ``cuda_error`` says why preloading
    stopped (an import initialized CUDA), after which the server must not fork."""

    def __init__(self) -> None:
        self.done: set[str] = set()
        self.failed: dict[str, str] = {}  # a module whose import raised: why
        self.cuda_error: str | None = None

    def __call__(self, req: dict[str, Any]) -> str | None:
        """Before a request: a worker's modules (job "worker"), or the ``modules`` a client
        asks for ahead of its runs (job "preload"); nothing for other jobs."""
        job = req.get("job", "worker")
        if job == "worker":
            return self.load(modules_for(req.get("request", "")))
        if job == "preload":  # a list of names; anything else in it (or no list) is ignored
            asked = req.get("modules")
            return self.load(
                [m for m in asked if isinstance(m, str)] if isinstance(asked, list) else []
            )
        return self.cuda_error

    def load(self, names: list[str]) -> str | None:
        """Import the modules not imported yet; why preloading stopped, or None."""
        if self.cuda_error:
            return self.cuda_error
        fresh = False
        for name in names:
            if name in self.done:
                continue
            self.done.add(name)
            fresh = True
            try:
                with _stdout_to_stderr(), _env(import_env()):
                    importlib.import_module(name)
            except Exception as e:  # noqa: BLE001  (the worker imports it again and says why)
                self.failed[name] = f"{type(e).__name__}: {e}"
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
        if fresh and not self.cuda_error and (why := fork_probe()):
            self.cuda_error = why
            print(f"fork server: {why}; preloading stops", file=sys.stderr, flush=True)
        if fresh and not self.cuda_error:  # what they loaded, as the server's own imports
            freeze()
        return self.cuda_error


_CC: list[str | None] = []  # nvidia-smi asked once per server


def uniform_cc() -> str | None:
    """The compute capability every GPU nvidia-smi lists shares, as quack writes it ("90" for
    9.0, "100" for 10.0); None without nvidia-smi, without a GPU, or when they differ (a
    worker may run on any of them: its own import then asks its GPU)."""
    if not _CC:
        _CC.append(None)
        # a plain child, not lifeline.run_tool: that starts the calling process's keeper, and
        # in the fork server it would live beside the workers as long as the server
        rows, _ = gpus.smi_rows("compute_cap", 20.0, tied=False)
        ccs = {r[0] for r in rows}
        if len(ccs) == 1:
            major, _, minor = ccs.pop().partition(".")
            if major.isdigit() and minor.isdigit():
                _CC[0] = major + minor
    return _CC[0]


def import_env() -> dict[str, str]:
    """What the environment holds while the server imports a run's libraries, for the
    variables it does not set itself (:data:`ARCH_VAR` only where :func:`uniform_cc` knows)."""
    want = {NVML_VAR: "1"}
    if os.environ.get(ARCH_VAR) is None and (cc := uniform_cc()):
        want[ARCH_VAR] = cc
    return {k: v for k, v in want.items() if k not in os.environ}


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    os.environ.update(values)
    try:
        yield
    finally:
        for k in values:
            os.environ.pop(k, None)


def fork_probe(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Can a worker forked now use the GPU? A forked child runs the driver's health check (a
    context, a kernel of ours, its output compared: health.driver_check). None when it can, or
    where this machine has no GPU device node or no driver (nothing a fork could break); why
    not otherwise, a child past ``timeout_s`` included (killed)."""
    from cutedebug import devices

    if devices.gpu_device_node() is None:
        return None
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: one line on the pipe, then out without the parent's handlers
        os.close(r)
        try:
            from cutedebug.engine import health

            try:
                got = health.driver_check()
                msg = "" if got.get("healthy") else f"health check: {got}"
            except OSError:
                msg = ""  # no libcuda: nothing to break
        except BaseException as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {e}"
        os.write(w, msg[:500].encode() + b"\n")
        os._exit(0)
    os.close(w)
    deadline = time.monotonic() + timeout_s
    data = b""
    try:
        while b"\n" not in data and (left := deadline - time.monotonic()) > 0:
            if select.select([r], [], [], left)[0]:
                if not (chunk := os.read(r, 4096)):
                    break  # the child ended without its line
                data += chunk
    finally:
        os.close(r)
        if b"\n" not in data:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os.waitpid(pid, 0)
    if b"\n" not in data:
        return f"a child forked after preloading gave no answer within {timeout_s:.0f} s"
    msg = data.decode(errors="replace").strip()
    return f"a child forked after preloading could not use the GPU ({msg})" if msg else None


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
