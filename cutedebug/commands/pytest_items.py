"""The pytest plugin's machinery: scenario files and their items, the session's fork
server and compile pool, GPU facts and the xdist GPU binding, shard selection. No pytest
hooks here: those (and the fixture) are cutedebug/pytest_plugin.py's, which uses these.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cutedebug.commands.pytest_settings import Settings, resolve, watchdog_budget_s
from cutedebug.engine import scenario as S
from cutedebug.engine.verdict import Verdict, values
from cutedebug.event_kinds import Compiled

COMPILE_VERDICTS = values(lambda v: v.is_compile_stage)


VERDICT_PROP = "cutedebug_verdict"
GPU_WAIT_PROP = "cutedebug_gpu_wait_s"  # run prefetch: seconds waited for the GPU token


_GPUS_KEY = pytest.StashKey[list]()


_BOUND_KEY = pytest.StashKey[dict]()


def session_gpus(config: pytest.Config) -> list[str]:
    """The GPUs of this session (--cutedebug-gpus, checked against the visible ones)."""
    if _GPUS_KEY not in config.stash:
        from cutedebug.engine import gpus

        visible = gpus.visible_gpus()
        spec = resolve(config).gpus
        try:
            config.stash[_GPUS_KEY] = gpus.parse_gpus(spec, visible) if spec else visible
        except gpus.GpuSpecError as e:
            raise pytest.UsageError(f"cutedebug: {e}") from None
    return config.stash[_GPUS_KEY]


def _bind_gpu(config: pytest.Config) -> None:
    """Bind this process to its GPU before any child or fork server starts: an xdist worker
    to the GPU its id picks from the controller's list; a plain session given
    --cutedebug-gpus to the first one. Children inherit CUDA_VISIBLE_DEVICES."""
    from cutedebug.engine import gpus

    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        chosen = workerinput.get("cutedebug_gpus") or []
        index = gpus.worker_index(workerinput.get("workerid"))
        if not chosen or index is None:
            return
        gpu, why = gpus.gpu_for_worker(index, chosen), f"xdist worker {workerinput['workerid']}"
    else:
        if not resolve(config).gpus:
            return
        chosen = session_gpus(config)
        if not chosen:
            return
        gpu, why = chosen[0], "--cutedebug-gpus"
    config.stash[_BOUND_KEY] = {
        "gpu": gpu,
        "why": why,
        "previous": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "restore": workerinput is None,
    }
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu


def bound_gpu(config: pytest.Config) -> str | None:
    """The GPU this process was bound to (None: not bound)."""
    bound = config.stash.get(_BOUND_KEY, None)
    return bound["gpu"] if bound else None


def in_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


_GPU_KEY = pytest.StashKey[dict]()


def gpu_facts(config: pytest.Config) -> dict[str, Any]:
    if _GPU_KEY not in config.stash:
        from cutedebug.engine.health import detect_gpu

        config.stash[_GPU_KEY] = detect_gpu()
    return config.stash[_GPU_KEY]


def gpu_skip_reason(config: pytest.Config, archs: tuple[str, ...]) -> str | None:
    gpu = gpu_facts(config)
    if not gpu["present"]:
        return gpu["reason"]
    if gpu["arch"] not in archs:
        return f"needs {' or '.join(archs)}; this GPU is {gpu['arch']} ({gpu['name']})"
    return None


def _scenario_dirs(config: pytest.Config) -> list[Path]:
    base = config.inipath.parent if config.inipath else config.rootpath
    return [(base / d).resolve() for d in config.getini("cutedebug_scenario_dirs")]


def scenario_keys(path: Path) -> set[str] | None:
    """Which of ``id``, ``kernel``, ``expect`` the TOML file has (None: it does not parse)."""
    import tomllib

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    return {"id", "kernel", "expect"} & set(data) if isinstance(data, dict) else set()


def _is_scenario_path(path: Path, parent: pytest.Collector) -> bool:
    """A file named on the command line: itself. Below a configured folder: a TOML file that
    does not parse or has any of id/kernel/expect (a broken scenario is a failing item; other
    TOML files are left alone). Below a folder named on the command line: scenarios only."""
    if path.suffix != ".toml":
        return False
    if parent.session.isinitpath(path):
        return True
    resolved = path.resolve()
    if any(resolved.is_relative_to(d) for d in _scenario_dirs(parent.config)):
        keys = scenario_keys(path)
        return keys is None or bool(keys)
    named = [Path(a.split("::")[0]).resolve() for a in parent.config.args]
    return any(resolved.is_relative_to(d) for d in named if d.is_dir()) and scenario_keys(path) == {
        "id",
        "kernel",
        "expect",
    }


class ScenarioFile(pytest.File):
    def collect(self):
        try:
            sc = S.load(self.path)
        except S.ScenarioError as e:
            yield InvalidScenarioItem.from_parent(self, name="load", message=str(e))
            return
        except Exception as e:  # noqa: BLE001  (a loader bug must not end the session)
            yield InvalidScenarioItem.from_parent(
                self, name="load", message=f"loading failed ({type(e).__name__}): {e}"
            )
            return
        yield CompileItem.from_parent(self, name="compile", scenario=sc)
        yield RunItem.from_parent(self, name="run", scenario=sc)


class ScenarioFailure(Exception):
    """An item's verdict did not match; the message is the report's TL;DR and path."""


class _Item(pytest.Item):
    def repr_failure(self, excinfo, style=None):
        if excinfo.errisinstance((ScenarioFailure, S.ScenarioError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)


class InvalidScenarioItem(_Item):
    def __init__(self, *, message: str, **kw):
        super().__init__(**kw)
        self.message = message

    def runtest(self) -> None:
        raise ScenarioFailure(f"invalid scenario: {self.message}")

    def reportinfo(self):
        return self.path, None, f"{self.path.name}: invalid scenario"


class ScenarioItem(_Item):
    mode = "run"

    def __init__(self, *, scenario: S.Scenario, **kw):
        super().__init__(**kw)
        self.scenario = scenario
        self.user_properties.append(("cutedebug_scenario", scenario.id))

    def reportinfo(self):
        return self.path, None, f"{self.scenario.id}::{self.name}"

    def settings(self) -> Settings:
        return resolve(self.config, self)

    def skip_if_modules_missing(self) -> None:
        """An optional extra not installed: skipped, the reason says which (no worker runs)."""
        if missing := self.scenario.missing_modules():
            pytest.skip(
                f"needs the Python module(s) {', '.join(missing)} (scenario "
                "requires.modules); not installed here"
            )

    def timeout_s(self, runs_before: int = 0) -> float:
        """The outer guard: the watchdog's worst case (times ``1 + runs_before`` for a run
        that may wait for the GPU's token behind as many others) plus the margin."""
        s = self.settings()
        repeat = 1 if self.mode == "compile" else s.repeat
        budget = watchdog_budget_s(s.apply(self.scenario), self.mode, repeat)
        if self.mode == "run":
            budget *= 1 + runs_before
        return round(budget + s.timeout_margin, 1)

    def call_engine(self, s: Settings, forkserver=None, gpu_token: str | None = None):
        """run_scenario + report (thread-safe: touches no pytest state). ``gpu_token``: the
        worker takes it before its launch (run items under the run prefetch)."""
        from cutedebug.analyses import lint
        from cutedebug.engine import runner
        from cutedebug.reporting import report

        sc = s.apply(self.scenario)
        try:
            res = runner.run_scenario(
                sc,
                runs_root=s.runs_dir,
                mode=self.mode,
                probes=s.probes,
                repeat=1 if self.mode == "compile" else s.repeat,
                forkserver=forkserver,
                compile_checks=[lint.static_findings],
                **({"gpu_token": gpu_token} if gpu_token else {}),
            )
        except S.ScenarioError as e:  # the kernel could not be loaded in the child
            raise ScenarioFailure(f"{sc.id}: {e}") from None
        from cutedebug.analyses import mismatch
        from cutedebug.reporting import mismatch_map

        mismatch.attach(res)  # failure-table diagnosis of wrong values (no-op for other verdicts)
        _, md = report.write(res, mismatch_map.report_sections(res))
        return res, md

    def _run(self, s: Settings):
        """The item's run_scenario call, or the result of the one the run prefetch started
        ahead for it; under the prefetch a run item's worker takes the GPU token."""
        ahead = runs_ahead(self.config) if self.mode == "run" else None
        future = ahead.take(self) if ahead is not None else None
        if future is not None:
            res, md = future.result()
        else:
            token = ahead.token if ahead is not None else None
            res, md = self.call_engine(s, session_forkserver(self.config), token)
        self.user_properties.append((VERDICT_PROP, res.verdict.value))
        self.user_properties.append(("cutedebug_report", str(md)))
        if ahead is not None:  # waiting for other runs' kernels: not this item's own time
            self.user_properties.append((GPU_WAIT_PROP, res.timings.get("gpu_wait_s")))
        return res, md


# What call_engine imports (and, through them, most of the engine), imported by the main
# thread before any pool thread calls it: CPython 3.11.7 can fail two threads compiling source
# at once ("AST constructor recursion depth mismatch"), and a failed import is left half-done.
ENGINE_MODULES = (
    "cutedebug.analyses.lint",
    "cutedebug.analyses.mismatch",
    "cutedebug.engine.health",
    "cutedebug.engine.runner",
    "cutedebug.reporting.mismatch_map",
    "cutedebug.reporting.report",
    "cutedebug.reporting.stuck_map",
)


def import_engine() -> None:
    import importlib

    for name in ENGINE_MODULES:
        importlib.import_module(name)


def serious_findings(res) -> list[dict[str, Any]]:
    """The static protocol checks' errors and warnings from the compiled event."""
    found = (res.evidence.get("compiled") or {}).get("static_findings") or []
    return [f for f in found if isinstance(f, dict) and f.get("severity") in ("error", "warning")]


# Compile items of a session run compile_jobs children at once: the first one to run submits
# every compile item of the session to a pool, each then waits for its own result.
_PREFETCH_KEY = pytest.StashKey[ThreadPoolExecutor]()


_FUTURES_KEY = pytest.StashKey[dict]()


def _prefetch(item: CompileItem) -> Future | None:
    config = item.config
    jobs = resolve(config).compile_jobs
    # Under xdist an item list is every worker's: prefetching it would compile each scenario
    # once per worker. The workers are the parallelism; each compiles its own items in turn.
    if jobs <= 1 or in_xdist_worker(config):
        return None
    if _PREFETCH_KEY not in config.stash:
        import_engine()
        pool = ThreadPoolExecutor(jobs, thread_name_prefix="cutedebug-compile")
        config.stash[_PREFETCH_KEY] = pool
        config.stash[_FUTURES_KEY] = {
            it.nodeid: pool.submit(it.call_engine, it.settings(), session_forkserver(config))
            for it in item.session.items
            if isinstance(it, CompileItem) and not it.scenario.missing_modules()
        }
    return config.stash[_FUTURES_KEY].pop(item.nodeid, None)


# The run prefetch's Prefetcher (commands/pytest_prefetch.py): the runs it started ahead, by
# node id (``take``), and this process's GPU token (``token``); None: prefetch off or no GPU.
_RUNS_AHEAD_KEY = pytest.StashKey[Any]()


def runs_ahead(config: pytest.Config):
    return config.stash.get(_RUNS_AHEAD_KEY, None)


# One fork server per session, started by the first item that needs a worker (main thread).
_FORKSERVER_KEY = pytest.StashKey[Any]()


def session_forkserver(config: pytest.Config):
    """The session's fork server, or None (off, or it could not start: fresh workers then)."""
    if _FORKSERVER_KEY not in config.stash:
        from cutedebug.engine import runner

        s = resolve(config)
        config.stash[_FORKSERVER_KEY] = (
            runner.start_forkserver(s.runs_dir) if s.forkserver else None
        )
    return config.stash[_FORKSERVER_KEY]


def error_at_run(fault: str | None) -> bool:
    """The fault's compile-stage verdict is raised only when the DSL converts the real
    arguments (a GPU run): a compile item checks what a compile can (it compiled, the fault
    reached the kernel) and the run item keeps the expected verdict."""
    from cutedebug.instrument import faults

    f = faults.FAULTS.get(fault or "")
    return f is not None and f.error_at_run


def compile_outcome(res) -> tuple[bool, str]:
    """Did a compile-mode run do what the scenario needs from it? (ok, why not)."""
    exp = res.scenario.expect.verdict
    if exp in COMPILE_VERDICTS and not error_at_run(res.scenario.fault):
        return res.verdict.value == exp, f"expected {exp}, got {res.verdict.value}"
    if res.outcome.last(Compiled) is None:
        return False, f"did not compile: {res.verdict.value}"
    if res.verdict is Verdict.HARNESS_ERROR:
        return False, "harness error after compiling"
    compiled = res.evidence.get("compiled") or {}
    if res.scenario.fault and compiled.get("fault_count") == 0:
        return False, (
            f"fault {res.scenario.fault} never triggered while tracing: the "
            "compiled kernel is the clean one"
        )
    return True, ""


class CompileItem(ScenarioItem):
    mode = "compile"

    def runtest(self) -> None:
        from cutedebug.reporting import report

        self.skip_if_modules_missing()
        future = _prefetch(self)
        if future is None and (ahead := runs_ahead(self.config)) is not None:
            future = ahead.take(self)  # under xdist: started while the item before ran
        if future is None:
            res, md = self._run(self.settings())
        else:
            res, md = future.result()
            self.user_properties.append((VERDICT_PROP, res.verdict.value))
            self.user_properties.append(("cutedebug_report", str(md)))
        if res.verdict is Verdict.UNSUPPORTED and res.outcome.last(Compiled) is None:
            pytest.skip(f"not compiled: {res.reason}")
        ok, why = compile_outcome(res)
        findings = serious_findings(res)
        if findings:
            self.add_report_section(
                "call",
                "cutedebug static findings",
                "\n".join(
                    f"- {f.get('severity')} {f.get('check')}: {f.get('message')}"
                    + (f" ({Path(f['file']).name}:{f.get('line')})" if f.get("file") else "")
                    for f in findings
                ),
            )
        if not ok:
            raise ScenarioFailure(f"{why}\n{report.tldr(res)}\nreport: {md}")


class RunItem(ScenarioItem):
    def runtest(self) -> None:
        from cutedebug.reporting import report

        s = self.settings()
        self.skip_if_modules_missing()
        reason = gpu_skip_reason(self.config, self.scenario.archs)
        if reason:
            pytest.skip(reason)
        res, md = self._run(s)
        if res.verdict is Verdict.UNSUPPORTED and self.scenario.expect.verdict != "UNSUPPORTED":
            pytest.skip(f"{res.reason} (report: {md})")
        if not res.expected:
            loc = res.localization
            extra = ""
            if res.verdict_ok and loc["ok"] is False:
                extra = (
                    f"\nlocalization wrong: expected {loc['expected']}, "
                    f"{loc.get('why', 'no stuck site matched')}"
                )
            raise ScenarioFailure(f"{report.tldr(res)}{extra}\nreport: {md}")


def shard_key(item: pytest.Item) -> str:
    """What a shard is chosen by: the scenario id (compile and run items of a scenario go to
    the same shard), else the node id."""
    sc = getattr(item, "scenario", None)
    return sc.id if sc is not None else item.nodeid


def _select_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    from cutedebug.engine import shards as shard

    s = resolve(config)
    if not s.shard:
        if s.durations:
            raise pytest.UsageError("cutedebug: --cutedebug-durations needs --cutedebug-shard")
        return
    try:
        which = shard.parse_shard(s.shard)
        durations = shard.durations_from(s.durations) if s.durations else None
    except shard.ShardError as e:
        raise pytest.UsageError(f"cutedebug: {e}") from None
    keys = [shard_key(i) for i in items]
    mine = shard.select(keys, which, durations)
    keep = [i for i, k in zip(items, keys) if k in mine]
    dropped = [i for i, k in zip(items, keys) if k not in mine]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep
