"""Compile reuse for the warm pool: the DSL's back end (MLIR passes, PTX, ptxas, cubin) skipped
when the traced IR is one it compiled before.

A run still traces its kernel every time: the trace is where the faults, the probes and the
recorders act and what they report (sites, pipelines, protocol). What is reused is only what
follows from the traced module alone: the lowered module (its cubin inside), the PTX and the
cubin the DSL wrote beside the run. The key is a SHA-256 over

- the traced MLIR module as bytecode (every instruction, constant and source location: a
  changed kernel, parameter, fault, fault argument, probe budget or probe buffer address
  changes it),
- the compile options (arch, line info, ptxas options, ... the dump paths excepted: they
  name the run's folder, not what is compiled), the DSL's pipeline string and target arch,
- the DSL's own cache key (``envar.cache_key_str()``: its compile-affecting variables) and
  every ``CUTE_DSL_*`` / ``CUTLASS_*`` / ``NVVM*`` / ``PTXAS*`` variable of the process,
- the DSL's version and install (its package path and its native library's size and mtime),
  the size and mtime of every library the module links, and this format's version.

A hit loads the lowered module (CRC-checked bytecode) and lets the DSL build the function
through its own cache-hit path (``LegacyCompilerBackend._build_compiled_function`` with
``cache_hit``: the host code JIT only), after writing the cached PTX and cubin where the
compile would have written them, so ``__ptx__`` / ``__cubin__`` are the same bytes. Anything
unreadable, any entry that fails its checks, or any error in the hit path is a miss: the
kernel is compiled as without the cache, never failed by it. Compiles this does not cover
(TVM-FFI, SASS or IR dumps) pass through untouched.

Where entries live: a folder the warm pool's server gives its workers (``CACHE_VAR``), one
per server, removed when the server exits; and, for a fresh worker running a kernel on a GPU
(a cold `cutedebug run`), the user's folder (``user_folder``: ``USER_VAR``, else
``$XDG_CACHE_HOME/cutedebug/compile``, else ``~/.cache/cutedebug/compile``), kept across runs,
so that running a scenario again reuses its compile (a probed run's buffer sits at one fixed
address in every fresh worker for it: instrument/probe_memory.py). At most ``MAX_ENTRIES``
entries and ``MAX_BYTES`` a folder, least recently used first out. Compile-only runs and runs
without a GPU are not cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE_VAR = "CUTEDEBUG_COMPILE_CACHE"  # the folder; set by the pool server in its workers
# the fresh run workers' folder, kept across runs; "off" (or "0"): fresh workers cache nothing
USER_VAR = "CUTEDEBUG_USER_COMPILE_CACHE"
# "1": each stored entry keeps its traced IR as text (traced.mlir), to tell what differed
# between two traces of one scenario that did not share an entry (tools/pool_bench.py)
IR_VAR = "CUTEDEBUG_COMPILE_CACHE_IR"
FORMAT = "cutedebug-compile-cache-1"
MAX_ENTRIES = 64
MAX_BYTES = 512 << 20  # a folder's entries in all (PTX, cubin, lowered module)
ENV_PREFIXES = ("CUTE_DSL_", "CUTLASS_", "NVVM", "PTXAS")


@dataclass
class Reuse:
    """What the cache did for one compile: ``reused`` True (a hit), False (compiled and
    stored), None (not offered or passed through, ``why`` says why)."""

    reused: bool | None = None
    key: str = ""
    why: str = ""
    entries: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reused": self.reused}
        if self.key:
            out["key"] = self.key[:16]
        if self.why:
            out["why"] = self.why
        return out


def reused(compiled: dict[str, Any] | None) -> bool:
    """Whether a run's compiled event (its evidence) says the compile was reused."""
    return bool(((compiled or {}).get("compile_cache") or {}).get("reused"))


def folder_from_env() -> Path | None:
    raw = os.environ.get(CACHE_VAR)
    return Path(raw) if raw else None


def user_folder() -> tuple[Path | None, str]:
    """The fresh run workers' folder (kept across runs), or None and why (turned off)."""
    raw = os.environ.get(USER_VAR, "")
    if raw.strip().lower() in ("off", "0"):
        return None, f"turned off ({USER_VAR}={raw})"
    if raw:
        return Path(raw), ""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError as e:  # no HOME and no passwd entry: nowhere to keep it
            return None, f"no folder to keep it in: {e} (set {USER_VAR})"
    return Path(base) / "cutedebug" / "compile", ""


@contextlib.contextmanager
def reuse(folder: Path | None, why_not: str = "") -> Iterator[Reuse]:
    """Around one ``cute.compile``: its back end reused from ``folder`` when the traced IR is
    an entry's, else run and stored there. ``folder`` None: nothing is done (``why_not``)."""
    outcome = Reuse()
    if folder is None:
        outcome.why = why_not or "no compile cache offered"
        yield outcome
        return
    from cutlass.base_dsl.compile_backend import LegacyCompilerBackend

    original = LegacyCompilerBackend._build_compiled_function

    def build(backend, ctx, arch, cache_state):
        if outcome.key or outcome.why:  # one top-level compile; anything nested passes
            return original(backend, ctx, arch, cache_state)
        return _build(original, backend, ctx, arch, cache_state, Path(folder), outcome)

    LegacyCompilerBackend._build_compiled_function = build
    try:
        yield outcome
    finally:
        LegacyCompilerBackend._build_compiled_function = original


def _build(original, backend, ctx, arch, cache_state, folder: Path, outcome: Reuse):
    dsl = backend._dsl
    why = _passes_through(dsl, cache_state)
    if why:
        outcome.why = why
        return original(backend, ctx, arch, cache_state)
    try:
        outcome.key = key_of(dsl, ctx, arch)
    except Exception as e:  # noqa: BLE001  (an IR the key cannot read: compile as usual)
        outcome.why = f"no key: {type(e).__name__}: {e}"
        return original(backend, ctx, arch, cache_state)
    entry = folder / outcome.key
    paths = _artifact_paths(dsl)
    loaded = None
    try:
        loaded = _load(entry, paths)
    except Exception as e:  # noqa: BLE001  (an unreadable entry is a miss)
        outcome.why = f"entry unreadable, compiled afresh: {type(e).__name__}: {e}"
        shutil.rmtree(entry, ignore_errors=True)  # this compile stores a sound one
    if loaded is not None:
        from cutlass.base_dsl.compile_backend import CompileCacheState

        try:
            fn = original(
                backend,
                ctx,
                arch,
                CompileCacheState(module=loaded, cache_hit=True, load_from_file_cache=True),
            )
            outcome.reused = True
            with contextlib.suppress(OSError):
                os.utime(entry)  # recently used: the last to be pruned
            return fn
        except Exception as e:  # noqa: BLE001  (the DSL refused the entry: compile afresh)
            outcome.why = f"entry not usable, compiled afresh: {type(e).__name__}: {e}"
            shutil.rmtree(entry, ignore_errors=True)
    traced = str(ctx.module) if os.environ.get(IR_VAR) == "1" else None  # before the passes
    fn = original(backend, ctx, arch, cache_state)
    outcome.reused = False
    try:
        outcome.entries = _store(folder, entry, fn, paths, traced)
    except Exception as e:  # noqa: BLE001  (a full disk costs the next run its reuse only)
        outcome.why = f"not stored: {type(e).__name__}: {e}"
    return fn


def _passes_through(dsl: Any, cache_state: Any) -> str:
    """Why this compile is not one the cache covers ('' when it is)."""
    from cutlass.base_dsl.compiler import EnableTVMFFI, KeepSASS

    opts = dsl.compile_options.options
    if getattr(cache_state, "cache_hit", False):
        return "the DSL's own cache answered"
    if EnableTVMFFI in opts and opts[EnableTVMFFI].value:
        return "TVM-FFI compiles are not cached"
    if KeepSASS in opts and opts[KeepSASS].value:
        return "SASS dumps are not cached"
    if getattr(dsl.envar, "keep_ir", False) or getattr(dsl.envar, "keep_ir_clean", False):
        return "IR dumps (CUTE_DSL_KEEP_IR) are not cached"
    return ""


def key_of(dsl: Any, ctx: Any, arch: str) -> str:
    """The entry's name: what decides the back end's output (module docstring)."""
    from cutlass.base_dsl.compiler import BooleanBasedFileDumpOption, DumpDir, LinkLibraries

    h = hashlib.sha256()

    def part(name: str, value: Any) -> None:
        data = value if isinstance(value, bytes) else repr(value).encode()
        h.update(f"{name}:{len(data)}:".encode())
        h.update(data)

    part("format", FORMAT)
    part("dsl", _dsl_identity())
    buf = io.BytesIO()
    ctx.module.operation.write_bytecode(buf)
    part("module", buf.getvalue())
    part("function", ctx.function_name)
    part("pipeline", ctx.pipeline)
    part("arch", arch)
    part("runtime_arch", dsl.envar.arch)
    part("no_jit_engine", bool(ctx.no_jit_engine))
    part("func_type", getattr(ctx.func_type, "__qualname__", str(ctx.func_type)))
    part("num_kernels", dsl.num_kernels)
    options = []
    for opt in dsl.compile_options.options.values():
        if isinstance(opt, DumpDir):
            continue  # the run's folder: where the artifacts go, not what they are
        name = type(opt).__name__
        if isinstance(opt, BooleanBasedFileDumpOption):
            options.append((name, bool(opt.value)))
        else:
            options.append((name, repr(opt.value)))
    part("options", sorted(options))
    links = str(dsl.compile_options.options[LinkLibraries].value or "")
    part("links", [_file_identity(p) for p in links.split(",") if p])
    part("shared_libs", [_file_identity(str(p)) for p in dsl.get_shared_libs() or []])
    part("dsl_env", dsl.envar.cache_key_str())
    part("env", sorted((k, v) for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)))
    return h.hexdigest()


def _file_identity(path: str) -> tuple[str, int, int]:
    try:
        st = os.stat(path)
        return (path, st.st_size, st.st_mtime_ns)
    except OSError:
        return (path, -1, -1)


_DSL_ID: tuple | None = None


def _dsl_identity() -> tuple:
    """The installed DSL: its version, where it is, and its native library's size and mtime
    (a reinstall of the same version changes the last)."""
    global _DSL_ID
    if _DSL_ID is None:
        cutlass = sys.modules.get("cutlass")
        where = os.path.dirname(getattr(cutlass, "__file__", "") or "")
        native = []
        libs = os.path.join(where, "_mlir", "_mlir_libs")
        with contextlib.suppress(OSError):
            native = [
                _file_identity(os.path.join(libs, n))
                for n in sorted(os.listdir(libs))
                if n.endswith(".so")
            ]
        _DSL_ID = (getattr(cutlass, "__version__", None), where, tuple(native))
    return _DSL_ID


@dataclass(frozen=True)
class _Paths:
    ptx: str | None
    cubin: str | None


def _artifact_paths(dsl: Any) -> _Paths:
    opts = dsl.compile_options
    return _Paths(opts.full_ptx_path or None, opts.full_cubin_path or None)


def _load(entry: Path, paths: _Paths) -> Any | None:
    """The entry's lowered module (in the current MLIR context), its PTX and cubin written
    where this compile would write them; None when there is no entry or it lacks what this
    compile keeps (a PTX or cubin it did not store). Raises on a corrupt entry."""
    meta_path = entry / "meta.json"
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"format {meta.get('format')!r}")
    blobs: dict[str, bytes] = {}
    for name, wanted in (("ptx", paths.ptx), ("cubin", paths.cubin)):
        if not wanted:
            continue
        if name not in meta:
            return None  # stored by a compile that did not keep it
        data = (entry / name).read_bytes()
        if hashlib.sha256(data).hexdigest() != meta[name]:
            raise ValueError(f"{name} does not match its checksum")
        blobs[name] = data
    raw = (entry / "module.mlirbc").read_bytes()
    body, crc = raw[:-4], raw[-4:]
    if len(raw) < 4 or int.from_bytes(crc, "little") != zlib.crc32(body):
        raise ValueError("module bytecode fails its CRC32")
    from cutlass._mlir import ir

    module = ir.Module.parse(body)
    for name, data in blobs.items():
        target = paths.ptx if name == "ptx" else paths.cubin
        Path(target).write_bytes(data)
    return module


def _store(folder: Path, entry: Path, fn: Any, paths: _Paths, traced: str | None = None) -> int:
    """Write the entry (a temporary folder renamed into place: readers see all of it or
    none); returns the entries left after pruning."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".tmp-{os.getpid()}-{entry.name[:16]}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        meta: dict[str, Any] = {"format": FORMAT, "stored": time.time()}
        for name, path in (("ptx", paths.ptx), ("cubin", paths.cubin)):
            if path and os.path.isfile(path):
                data = Path(path).read_bytes()
                (tmp / name).write_bytes(data)
                meta[name] = hashlib.sha256(data).hexdigest()
        buf = io.BytesIO()
        fn.ir_module.operation.write_bytecode(buf)
        body = buf.getvalue()
        (tmp / "module.mlirbc").write_bytes(body + zlib.crc32(body).to_bytes(4, "little"))
        if traced is not None:
            (tmp / "traced.mlir").write_text(traced)
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            os.rename(tmp, entry)
        except OSError:  # another worker stored the same key first: theirs is as good
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return prune(folder)


def prune(folder: Path, keep: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> int:
    """Remove the least recently used entries beyond ``keep`` or beyond ``max_bytes`` in all
    (the most recent entry always stays), and the half-written entries of processes no longer
    running (killed while storing); returns how many are left."""
    try:
        names = list(folder.iterdir())
    except OSError:
        return 0
    for p in names:
        if p.name.startswith(".tmp-") and not _writer_running(p.name.split("-")[1]):
            shutil.rmtree(p, ignore_errors=True)
    entries = [p for p in names if not p.name.startswith(".")]

    def used(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0

    entries.sort(key=used, reverse=True)  # the most recently used first
    kept, total = 0, 0
    for entry in entries:
        total += _size(entry)
        if kept and (kept >= keep or total > max_bytes):
            shutil.rmtree(entry, ignore_errors=True)
        else:
            kept += 1
    return kept


def _size(entry: Path) -> int:
    try:
        return sum(f.stat().st_size for f in entry.iterdir())
    except OSError:
        return 0


def _writer_running(pid: str) -> bool:
    """Whether the process of a .tmp- folder's name still runs (a name that is not a pid: left
    alone, as if it did)."""
    import psutil

    return not pid.isdigit() or psutil.pid_exists(int(pid))
