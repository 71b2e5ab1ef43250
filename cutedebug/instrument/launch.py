"""The instrumentation inside a command that `cutedebug exec` / `cutedebug mutate` watches.

The parent puts ``cutedebug/instrument/site`` first on the command's PYTHONPATH and its
settings in ``CUTEDEBUG_EXEC`` (``child_env``). Every Python interpreter of the command's
process tree (``python repro.py``, ``python -m pytest``, pytest-xdist workers, a script's own
subprocesses) then imports that folder's ``sitecustomize``, which calls ``activate()``:

- an import hook waits for ``import cutlass`` (nothing is imported before the program does), then
  allocates the probe buffer (pinned, host-mapped; one per process) with its monitor thread, and
  wraps the DSL's top-level trace (``BaseDSL.generate_mlir``: every ``cute.compile`` and the
  first call of a ``@cute.jit`` function, in the program or in an installed library);
- around each trace, the recorder of pipelines and ops (mutate's clean run), the fault
  (``faults.inject``; every trace, or only the one named by ``fault_trace``: its function name
  and occurrence) and the probes (``probes.instrument`` into the one buffer, site ids going on
  across traces) are entered and left again, so pipeline subclasses a library defines after
  cutlass was imported are patched too, and a fault's ``pipeline`` counts in that trace;
- after each trace one ``compiled`` event: its index, function name and occurrence, the kernels
  of the module, the probe sites so far (each with the Python kernel it belongs to), the
  fault's sites in this trace, and with the recorder on, its pipelines and ops;
- a monitor thread streams the probe buffer (stuck records, beacons) as ``progress`` events
  while the program runs, and a final ``probe_report`` at exit;
- SIGUSR1 dumps every thread's Python stack (faulthandler) to ``stacks/PID.txt``: the parent
  sends it before it kills a command it found stuck.

Compile caches: the DSL's own cache is keyed by the traced IR (tracing always re-runs, and
instrumented IR differs), so it cannot hand back an uninstrumented kernel; the libraries'
persistent caches (quack's ``.o`` cache keyed by arguments, FA-4's optional one) would skip
tracing altogether and are switched off in ``child_env``; their in-memory caches start empty
in a new process, after the instrumentation is active.

Events go to one JSON-lines file shared by the whole process tree (appends of one line each);
every event carries the writing process's pid. This module imports neither torch nor cutlass at
import time: the parent imports it for ``child_env``.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import importlib.abc
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from cutedebug import devices
from cutedebug.devices import GPU_DEVICE_NODES  # noqa: F401  (part of this interface)
from cutedebug.errors import gpu_error_name
from cutedebug.event import Event
from cutedebug.instrument import launch_context
from cutedebug.instrument.launch_gpu import (  # noqa: F401  (part of this interface)
    _WAITS_ATTR,
    InFlight,
    _guard_launches,
    _tag_compiled,
    acquire_gpu_token,
    stalled,
)
from cutedebug.instrument.launch_record import (  # noqa: F401  (part of this interface)
    _enter_recorder,
    current_kernel,
    recorded_summary,
)

ENV_CONFIG = "CUTEDEBUG_EXEC"
SITE_DIR = Path(__file__).resolve().parent / "site"
# Library compile caches that would hand back a kernel compiled without the instrumentation.
CACHE_ENV = {
    "QUACK_CACHE_ENABLED": "0",  # quack.cache.jit_cache: .o files keyed by the arguments only
    "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "0",  # FA-4 cache_utils (off by default too)
}
FAKE_PROBE_ADDR = 0x7F0000000000  # no GPU: the address only has to be a plausible constant


def child_env(config: dict[str, Any], env: dict[str, str]) -> dict[str, str]:
    """The watched command's environment: our sitecustomize first on PYTHONPATH, the settings
    in CUTEDEBUG_EXEC, the libraries' persistent compile caches off."""
    out = dict(env)
    out[ENV_CONFIG] = json.dumps(config)
    rest = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SITE_DIR)]
    out["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *rest])
    out.update(CACHE_ENV)
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out


class _Emitter:
    """Appends one JSON line per event; O_APPEND keeps lines of several processes whole."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.pid = os.getpid()

    def emit(self, event: str, **fields: Any) -> None:
        rec = Event.of(
            event,
            round(time.monotonic() - self.t0, 6),
            pid=self.pid,
            wall=round(time.time(), 3),
            **fields,
        ).to_json()
        data = (json.dumps(rec, default=str) + "\n").encode()
        with self.lock:
            os.write(self.fd, data)


class _State:
    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.events = _Emitter(cfg["events"])
        self.stack = contextlib.ExitStack()
        self.sites = None  # probes.SiteTable of the latest trace (every site so far)
        self.probe_addr = 0
        self.probe_cfg = None
        self.probe_buf = None
        self.kernel_of: dict[int, dict[str, Any]] = {}  # probe site id -> its kernel
        self.traces = 0  # top-level traces (cute.compile / first call of a @cute.jit)
        self.seen: dict[str, int] = {}  # traced function name -> times traced
        self.seen_in_test: dict[tuple[str, str], int] = {}  # (test, function) -> times traced
        self.current: dict[str, Any] | None = None  # the trace under way
        self.fault_count = 0  # sites the fault changed, over every trace
        self.monitor: _Monitor | None = None
        self.gpu_granted = False  # this process holds the GPU token (cfg["gpu_token"])
        # CuTe DSL launches: the CUDA context is read for a sticky error when the process ends
        self.launches = launch_context.Launches(self.events.emit, self.events.pid)
        self.active = False


_STATE: _State | None = None


def activate() -> None:
    """Called by sitecustomize in every interpreter of the watched command."""
    global _STATE
    raw = os.environ.get(ENV_CONFIG)
    if not raw or _STATE is not None:
        return
    cfg = json.loads(raw)
    state = _STATE = _State(cfg)
    state.events.emit("process", ppid=os.getppid(), argv=_argv())
    stacks = cfg.get("stacks_dir")
    if stacks:
        os.makedirs(stacks, exist_ok=True)
        f = open(os.path.join(stacks, f"{os.getpid()}.txt"), "w")  # noqa: SIM115 (process-long)
        faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=False)
    atexit.register(_at_exit)
    launch_context.fake_launch(state.launches)  # tests only (CUTEDEBUG_FAKE_CUDA_CONTEXT)
    if "cutlass" in sys.modules:
        _on_cutlass()
    else:
        sys.meta_path.insert(0, _CutlassFinder())


def _argv() -> list[str]:
    # sys.argv is not set yet while site runs; the kernel's record of the command line is.
    try:
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return list(getattr(sys, "argv", []))


class _CutlassFinder(importlib.abc.MetaPathFinder):
    """Finds ``cutlass`` with the other finders and runs ``_on_cutlass`` once it has executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "cutlass":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _AfterLoader(spec.loader, self)
                return spec
        return None


class _AfterLoader(importlib.abc.Loader):
    def __init__(self, loader, finder):
        self.loader, self.finder = loader, finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self.finder)
        _on_cutlass()


def _on_cutlass() -> None:
    """cutlass is imported: enter the instrumentation for the rest of the process."""
    state = _STATE
    if state is None or state.active:
        return
    state.active = True
    cfg = state.cfg
    try:
        if cfg.get("probes"):
            _enter_probes(state)
        _wrap_traces(state)
    except Exception as e:
        state.events.emit(
            "instrument_error",
            type=type(e).__name__,
            message=str(e),
            traceback=traceback.format_exc()[-3000:],
        )
        raise
    state.events.emit(
        "instrumented",
        fault=cfg.get("fault"),
        fault_args=cfg.get("fault_args"),
        probes=cfg.get("probes"),
        record=bool(cfg.get("record")),
        fault_trace=cfg.get("fault_trace"),
        cutlass=getattr(sys.modules.get("cutlass"), "__version__", None),
    )


def _gpu_present() -> bool | None:
    """Whether this process sees a GPU, when torch is already imported (None: not asked)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return None


def _enter_probes(state: _State) -> None:
    """The probe buffer (pinned, host-mapped; one for the whole process) and its monitor. The
    probes themselves are entered around each trace (``_probe_trace``)."""
    from cutedebug.instrument import probes

    pcfg = probes.ProbeConfig(**state.cfg["probes"])
    nbytes = probes.buffer_nbytes(pcfg)
    if "torch" not in sys.modules and devices.gpu_device_node() is None:
        # no GPU here and the program has not imported torch: it never reads the buffer, and
        # importing torch for it would cost a program that compiles only 1.7 s of CPU
        host = bytearray(nbytes)
        probes.init_buffer(host, pcfg)
        state.probe_addr, state.probe_cfg, state.probe_buf = FAKE_PROBE_ADDR, pcfg, host
        return
    import torch

    on_gpu = torch.cuda.is_available()
    buf = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=on_gpu)
    probes.init_buffer(buf.numpy(), pcfg)
    state.probe_addr = buf.data_ptr() if on_gpu else FAKE_PROBE_ADDR
    state.probe_cfg, state.probe_buf = pcfg, buf
    if on_gpu:
        state.monitor = _Monitor(state)
        state.monitor.start()


def _probe_trace(state: _State, stack: contextlib.ExitStack) -> None:
    """Bounded waits for one trace, into the process's one buffer. Entered per trace (so wait
    methods a library defines after cutlass was imported are patched too), with the sites of
    the earlier traces preloaded: ids go on across traces, the buffer's records stay
    unambiguous, and the last table describes every site."""
    from cutedebug.instrument import probes

    table = stack.enter_context(probes.instrument(state.probe_cfg, state.probe_addr))
    if state.sites is not None:
        table.sites.extend(state.sites.sites)
        table._by_key.update(state.sites._by_key)
    add = table.add

    def add_with_kernel(**kw):
        site = add(**kw)
        state.kernel_of.setdefault(site.id, current_kernel())
        return site

    table.add = add_with_kernel
    state.sites = table


def _attribute_fault_sites(applied: Any) -> None:
    add_site = applied.add_site

    def add_site_with_kernel(op, detail, **extra):
        site = add_site(op, detail, **extra)
        site.setdefault("kernel", current_kernel().get("kernel"))
        return site

    applied.add_site = add_site_with_kernel


def _module_kernels(module: Any) -> list[str]:
    """Symbol names of the GPU kernels in a traced MLIR module."""
    names: list[str] = []
    try:
        for op in module.body.operations:
            if op.operation.name != "gpu.module":
                continue
            for region in op.operation.regions:
                for block in region.blocks:
                    for inner in block.operations:
                        attrs = inner.operation.attributes
                        if "sym_name" in attrs:
                            names.append(str(attrs["sym_name"]).strip('"'))
    except Exception as e:  # the IR API differs: say so rather than guess
        names.append(f"<unreadable module: {type(e).__name__}>")
    return names


def _wrap_traces(state: _State) -> None:
    """Around every top-level trace (``BaseDSL.generate_mlir``: cute.compile, or the first
    call of a @cute.jit function), enter the recorder and the fault for that trace only, so
    that pipeline classes a library defines after cutlass was imported are patched too, and
    report the trace when it ends. Nested @cute.jit calls are inlined into the trace."""
    from cutlass.base_dsl.dsl import BaseDSL
    from cutlass.cutlass_dsl import CuTeDSL

    dsl = CuTeDSL._get_dsl()
    if not hasattr(dsl, "register_trace_finalize_hook"):
        raise RuntimeError(
            "this CuTe DSL has no register_trace_finalize_hook: exec needs it to "
            "report what was traced (nvidia-cutlass-dsl 4.8.1 has it)"
        )

    def on_finalize(owner, module, function_name):
        if state.current is not None:
            state.current["kernels"] += _module_kernels(module)

    dsl.register_trace_finalize_hook(on_finalize)
    _name_kernels(state, type(dsl))
    original = BaseDSL.generate_mlir

    def generate_mlir(self, funcBody, function_name, *a, **kw):
        if state.current is not None:
            return original(self, funcBody, function_name, *a, **kw)
        occurrence = state.seen.get(function_name, 0)
        state.seen[function_name] = occurrence + 1
        cur = state.current = {
            "index": state.traces,
            "function": function_name,
            "occurrence": occurrence,
            "kernels": [],
        }
        test = current_test()
        if test is not None:  # under pytest: the test item that traced it, and how often
            n = state.seen_in_test.get((test, function_name), 0)
            state.seen_in_test[(test, function_name)] = n + 1
            cur["test"], cur["test_occurrence"] = test, n
        state.traces += 1
        error = None
        sites_before = len(state.sites.sites) if state.sites is not None else 0
        cur["sites_before"] = sites_before
        try:
            with _trace_scope(state, cur):
                result = original(self, funcBody, function_name, *a, **kw)
            launch_context.tag(result, cur.get("kernel_names") or cur["kernels"])
            if state.sites is not None:
                _tag_compiled(state, result, len(state.sites.sites) - sites_before)
            _guard_launches(state)
            return result
        except BaseException as e:
            error = f"{type(e).__name__}: {str(e)[:500]}"
            raise
        finally:
            state.current = None
            try:
                _emit_compiled(state, cur, error)
            except Exception as e:  # never break the user's compile; the parent sees it
                state.events.emit(
                    "instrument_error",
                    type=type(e).__name__,
                    message=str(e),
                    traceback=traceback.format_exc()[-3000:],
                )

    generate_mlir.__wrapped__ = original
    BaseDSL.generate_mlir = generate_mlir
    _guard_launches(state)  # now too: a @cute.jit function called directly launches in its trace


def _name_kernels(state: _State, dsl_class: type) -> None:
    """The Python name of each @cute.kernel a trace launches (``GemmSm90.kernel``), into the
    trace's ``kernel_names``: what a CUDA error found later is blamed on (launch_context)."""
    original = getattr(dsl_class, "_kernel_helper", None)
    if original is None or getattr(original, "_cutedebug_names", False):
        return

    def _kernel_helper(self, funcBody, *a, **kw):
        cur = state.current
        if cur is not None:
            name = getattr(funcBody, "__qualname__", None) or str(funcBody)
            names = cur.setdefault("kernel_names", [])
            if name not in names:
                names.append(name)
        return original(self, funcBody, *a, **kw)

    _kernel_helper._cutedebug_names = True  # type: ignore[attr-defined]
    dsl_class._kernel_helper = _kernel_helper


def current_test() -> str | None:
    """The pytest item under way in this process (its node id, from the variable pytest sets
    for each test's setup, call and teardown), or None outside pytest."""
    raw = os.environ.get("PYTEST_CURRENT_TEST")
    if not raw:
        return None
    return raw.rsplit(" (", 1)[0] if raw.endswith(")") else raw


def is_trace(target: dict[str, Any], cur: dict[str, Any]) -> bool:
    """Whether the trace under way is the one a mutant names: by the test item that traced it
    and its occurrence in that test when the target has one (the same trace however many of
    the command's tests run), else by its occurrence in the process."""
    if target.get("function") != cur["function"]:
        return False
    if target.get("test") is not None:
        return target["test"] == cur.get("test") and target.get("test_occurrence", 0) == cur.get(
            "test_occurrence"
        )
    return target.get("occurrence", 0) == cur["occurrence"]


@contextlib.contextmanager
def _trace_scope(state: _State, cur: dict[str, Any]):
    cfg = state.cfg
    from cutedebug.instrument import layer

    active = layer.current()
    if active is not None:  # the probes keep the layer for the process: pipelines of this
        active.new_trace()  # trace are numbered from 0, as `pipeline=N` counts them
    with contextlib.ExitStack() as stack:
        if cfg.get("record"):
            cur["protocol"] = _enter_recorder(stack)
        target = cfg.get("fault_trace")
        if cfg.get("fault") and (target is None or is_trace(target, cur)):
            from cutedebug.instrument import faults

            applied = stack.enter_context(faults.inject(cfg["fault"], cfg.get("fault_args") or {}))
            _attribute_fault_sites(applied)
            cur["applied"] = applied
        if state.probe_cfg is not None:
            _probe_trace(state, stack)
        yield


def _emit_compiled(state: _State, cur: dict[str, Any], error: str | None) -> None:
    fields: dict[str, Any] = {
        "index": cur["index"],
        "function": cur["function"][:300],
        "occurrence": cur["occurrence"],
        **{k: cur[k] for k in ("test", "test_occurrence") if k in cur},
        "kernels": cur["kernels"],
        "error": error,
        "gpu": _gpu_present(),
    }
    if state.sites is not None:
        sites = state.sites.to_json()
        for s in sites:
            s.update(
                {
                    k: v
                    for k, v in state.kernel_of.get(s["id"], {}).items()
                    if k in ("kernel", "symbol")
                }
            )
        fields["probe_sites"] = sites
    applied = cur.get("applied")
    if applied is not None:
        state.fault_count += applied.count
        fields["fault_applied"] = applied.count
        fields["fault_sites"] = applied.sites[:200]
        if not applied.count and hasattr(applied, "not_applied"):
            fields["fault_not_applied"] = applied.not_applied()
    if state.cfg.get("fault"):
        fields["fault_count"] = state.fault_count
    if "protocol" in cur:
        summary = recorded_summary(cur["protocol"])
        if not summary.kernel_names:  # the layer's recorder: names from this trace's sites
            names = []
            for site in (fields.get("probe_sites") or [])[cur.get("sites_before", 0) :]:
                if site.get("kernel") and site["kernel"] not in names:
                    names.append(site["kernel"])
            if not names:  # no new sites (a kernel traced again, or no waits): the kernels
                names = list(cur.get("kernel_names") or [])  # the trace generated (_name_kernels)
            summary = summary.with_kernel_names(names)
        fields["protocol"] = summary.to_json()
    state.events.emit("compiled", **fields)


class _Monitor(threading.Thread):
    """Streams the probe buffer: an event whenever the beacons or the stuck count change (a
    per-warp picture at most every ``picture_s``, and at once when a stuck record appears)."""

    def __init__(self, state: _State, interval_s: float = 0.05, picture_s: float = 0.25):
        super().__init__(daemon=True, name="cutedebug-probe-monitor")
        self.state, self.interval_s, self.picture_s = state, interval_s, picture_s
        self.stop = threading.Event()
        import torch

        self.launches = InFlight(torch.cuda.Event)

    def snapshot(self):
        from cutedebug.instrument import probes

        return probes.decode(self.state.probe_buf.numpy().tobytes(), self.state.probe_cfg)

    def run(self) -> None:
        from cutedebug.instrument import probes

        last_sig, last_stuck, last_picture_t = None, 0, 0.0
        last_change, stall_reported = time.monotonic(), False
        stall_s = self.state.cfg.get("stall_s")
        while not self.stop.wait(self.interval_s):
            try:
                snap = self.snapshot()
                running = self.launches.running_since(time.monotonic())
            except Exception as e:
                if (gpu := gpu_error_name(e)) is not None:
                    # a kernel of the program faulted: the context's sticky error answers our
                    # event query first; the program's own next CUDA call will raise it too
                    self.state.events.emit(
                        "cuda_error", name=gpu, message=str(e)[:2000], surfaced="probe monitor"
                    )
                else:
                    self.state.events.emit(
                        "instrument_error", type=type(e).__name__, message=str(e)
                    )
                return
            sig = probes.progress_signature(snap)
            stuck = snap.n_stuck_reported
            now = time.monotonic()
            if sig == last_sig and stuck == last_stuck:
                if not stall_reported and stalled(now, running, last_change, stall_s):
                    stall_reported = True
                    self.state.events.emit(
                        "stall",
                        still_s=round(now - max(running, last_change), 3),
                        picture=probes.snapshot_to_json(snap, self.state.sites),
                    )
                continue
            last_change, stall_reported = now, False
            fields: dict[str, Any] = {"counter": snap.progress_counter_total, "stuck": stuck}
            if stuck != last_stuck or now - last_picture_t >= self.picture_s:
                fields["picture"] = probes.snapshot_to_json(snap, self.state.sites)
                last_picture_t = now
            last_sig, last_stuck = sig, stuck
            self.state.events.emit("progress", **fields)


def _at_exit() -> None:
    state = _STATE
    if state is None:
        return
    if state.monitor is not None:
        state.monitor.stop.set()
        state.monitor.join(timeout=1.0)
        with contextlib.suppress(Exception):
            from cutedebug.instrument import probes

            snap = state.monitor.snapshot()
            if snap.stuck or snap.beacons:
                state.events.emit("probe_report", **probes.snapshot_to_json(snap, state.sites))
    fields: dict[str, Any] = {"traces": state.traces}
    if state.cfg.get("fault"):
        fields["fault_count"] = state.fault_count
    state.events.emit("exit", **fields)
