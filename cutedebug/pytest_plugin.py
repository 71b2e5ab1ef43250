"""pytest plugin: scenario files as hang-proof test items, and a fixture for your own tests.

Registered through the ``pytest11`` entry point, so installing cutedebug enables it.

Scenario files
    Scenario files are collected only where you say so, so that the plugin does nothing in a
    project that does not use cutedebug: below the folders listed in the ini key
    ``cutedebug_scenario_dirs`` (paths relative to the rootdir; this repository lists
    ``scenarios``), a ``*.toml`` file named on the command line, and, below a folder named on
    the command line, the ``*.toml`` files that are scenarios (a table with ``id``,
    ``[kernel]`` and ``[expect]``; other TOML files there are left alone). Each is two items:

    - ``<file>::compile`` compiles the kernel with its fault for the scenario's first arch in a
      watched child (runs everywhere). Passes when it compiled and the fault reached the
      kernel, or, for a scenario that expects COMPILE_ERROR / COMPILER_CRASH, when that is the
      verdict.
    - ``<file>::run`` runs it on the GPU (skipped, with the reason, without a suitable GPU).
      Passes when the verdict and the localization match the scenario's expectation.

    A failure's message is the report's TL;DR and the path of the report. A scenario file that
    does not load is one failing item carrying the loader's message. A HANG verdict shows as
    ``H`` / ``HANG`` in the terminal (``h`` when the scenario expected it).

Options (precedence: marker > command line > environment > ini)
    Each setting NAME is the marker keyword ``@pytest.mark.cutedebug(NAME=...)``, the flag
    ``--cutedebug-NAME`` (underscores as dashes), the variable ``CUTEDEBUG_NAME`` and the ini
    key ``cutedebug_NAME``:

    - ``deadline`` (s): replaces the scenario's ``limits.deadline_s``
    - ``compile_deadline`` (s): replaces ``limits.compile_s``
    - ``probes`` (on/off): bounded waits + beacons; unset keeps the scenario's own setting
    - ``repeat`` (N): run N times; disagreeing runs are NONDETERMINISTIC
    - ``runs_dir``: where run directories and reports go (default ``<rootdir>/runs``)
    - ``timeout_margin`` (s, default 60): added to the outer guard below
    - ``compile_jobs`` (N or auto; no marker: it is session-wide): compile items run N
      compile-only children at once (default: the CPU count, at most 8). With N > 1 every
      compile item runs before the first run item, so GPU runs never share the CPU.
    - ``forkserver`` (on/off, default on; session-wide): workers fork from one server that
      imported torch and cutlass once, instead of paying those imports per item.
    - ``gpus`` (``all`` or a comma list such as ``0,1``; session-wide): the GPUs the session
      runs on, named as in ``CUDA_VISIBLE_DEVICES`` (default: every visible one). Under
      pytest-xdist worker ``gwN`` is bound to the N-th (round robin): its
      ``CUDA_VISIBLE_DEVICES`` is set to that one GPU before it starts any child, and its own
      fork server, workers and health checks run there. Without xdist the first one is used.
    - ``shard`` (``I/N``; session-wide): run only shard I of N, chosen by scenario id (other
      tests by node id) so that every machine agrees; see ``cutedebug.engine.shards``.
    - ``durations`` (a matrix.json of an earlier triage, or its folder; session-wide):
      balance the shards by the seconds it recorded instead.

pytest-xdist
    ``pytest -n <GPUs> --dist worksteal scenarios``: one worker per GPU, one fork server per
    worker, each compile item compiled once in the whole session (by the worker that runs
    it: under xdist the compile items do not prefetch, the workers are the parallelism), no
    state shared between workers, every child of a worker killed at its session end.

Signals and interrupts
    While a cutedebug item (or a test using the fixture) runs, SIGTERM (a CI cancel,
    ``timeout``) is turned into a KeyboardInterrupt, and any interrupt kills every watched
    child at once (compiles running in the background included) instead of waiting for their
    deadlines. Outside those items the session's signal handling is left as it was.

Outer guard
    Each scenario item (and each test using the fixture) gets a pytest-timeout marker set
    above the watchdog's worst case (every phase limit the child may go through, times the
    reruns, plus ``timeout_margin``), unless it already has one: the watchdog decides, and
    pytest-timeout only fires if the watchdog itself failed.

The fixture::

    from cutedebug.pytest_plugin import assert_verdict

    @pytest.mark.cutedebug(deadline=10)
    def test_my_kernel(cutedebug_run):
        res = cutedebug_run(kernel="kernels/my_gemm.py:MyGemm", params={"m": 512})
        assert_verdict(res, "PASS")

    def test_fault_is_caught(cutedebug_run):
        res = cutedebug_run("kernels/tma_stream.py:TmaStream", fault="wrong_expect_tx",
                            fault_args={"delta_bytes": 16}, expect="HANG")
        assert_verdict(res, "HANG", op="consumer_wait", barrier="full")

``cutedebug_run`` runs the kernel in the watched child and returns the
:class:`cutedebug.engine.runner.RunResult`. With ``expect`` it fails the test unless the verdict is
that; without, it fails the test on HANG and HARNESS_ERROR only (so a test that would hang
fails with a HANG verdict instead). Without a suitable GPU a ``mode="run"`` call skips the
test with the reason. Kernel paths are tried relative to the test file, then the rootdir.
"""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cutedebug.commands.pytest_settings import (  # noqa: F401  (P.<name> for callers)
    DEFAULTS,
    HEALTH_CHECK_S,
    OPTIONS,
    Option,
    Settings,
    _jobs,
    _limit,
    _to_bool,
    default_compile_jobs,
    resolve,
    watchdog_budget_s,
)
from cutedebug.engine import scenario as S
from cutedebug.engine.verdict import ALL as VERDICTS
from cutedebug.engine.verdict import Verdict, values

COMPILE_VERDICTS = values(lambda v: v.is_compile_stage)
VERDICT_PROP = "cutedebug_verdict"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cutedebug", "cutedebug scenarios and watchdog")
    for opt in OPTIONS:
        group.addoption(
            opt.flag,
            dest="cutedebug_" + opt.name,
            default=None,
            metavar=opt.name.upper(),
            help=f"{opt.help} [env {opt.env}]",
        )
        parser.addini(opt.ini, f"cutedebug: {opt.help}", default=None)
    parser.addini(
        "cutedebug_scenario_dirs",
        "cutedebug: folders (relative to the rootdir) whose *.toml files are scenarios",
        type="linelist",
        default=[],
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "cutedebug(deadline=S, compile_deadline=S, probes=bool, repeat=N, "
        "runs_dir=DIR, timeout_margin=S): cutedebug settings for this test (they win over "
        "the command line, the environment and the ini file)",
    )
    resolve(config)  # a bad value on the command line, in the env or the ini: fail early
    _bind_gpu(config)


def _sigterm(signum, _frame):
    raise KeyboardInterrupt(f"cutedebug: {signal.Signals(signum).name}")


def _is_ours(item: pytest.Item) -> bool:
    return isinstance(item, _Item) or "cutedebug_run" in getattr(item, "fixturenames", ())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """While a cutedebug item runs: SIGTERM (a CI cancel, `timeout`) unwinds like Ctrl-C
    through the watchdogs, which kill their children; Python's default would die on the spot
    and leave a hung kernel running. Only when nobody else set a handler."""
    previous = None
    if (
        _is_ours(item)
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        return (yield)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def pytest_keyboard_interrupt(excinfo) -> None:
    """Ctrl-C / SIGTERM: kill every watched child now (compiles in the background included)."""
    from cutedebug.engine import watchdog

    watchdog.abort_all()


def pytest_unconfigure(config: pytest.Config) -> None:
    bound = config.stash.get(_BOUND_KEY, None)
    if bound is not None and bound.get("restore", True):
        if bound["previous"] is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = bound["previous"]


# ---- GPUs and pytest-xdist workers ------------------------------------------------------------
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


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: hand every worker the session's GPU list (it binds itself)."""
    node.workerinput["cutedebug_gpus"] = session_gpus(node.config)


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


# ---- GPU (never imports torch: nvidia-smi only) -------------------------------------------
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


def pytest_report_header(config: pytest.Config) -> str | None:
    s = resolve(config)
    bound = config.stash.get(_BOUND_KEY, None)
    if (
        not _scenario_dirs(config)
        and not bound
        and not any(v != "default" for v in s.sources.values())
    ):
        return None  # not configured: say nothing
    return (
        f"cutedebug: runs dir {s.runs_dir}"
        + (f"; bound to GPU {bound['gpu']} ({bound['why']})" if bound else "")
        + (f"; shard {s.shard}" if s.shard else "")
    )


# ---- collection ----------------------------------------------------------------------------
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


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if _is_scenario_path(file_path, parent):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


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

    def timeout_s(self) -> float:
        s = self.settings()
        repeat = 1 if self.mode == "compile" else s.repeat
        return round(
            watchdog_budget_s(s.apply(self.scenario), self.mode, repeat) + s.timeout_margin, 1
        )

    def call_engine(self, s: Settings, forkserver=None):
        """run_scenario + report (thread-safe: touches no pytest state)."""
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
            )
        except S.ScenarioError as e:  # the kernel could not be loaded in the child
            raise ScenarioFailure(f"{sc.id}: {e}") from None
        from cutedebug.analyses import mismatch
        from cutedebug.reporting import mismatch_map

        mismatch.attach(res)  # failure-table diagnosis of wrong values (no-op for other verdicts)
        _, md = report.write(res, mismatch_map.report_sections(res))
        return res, md

    def _run(self, s: Settings):
        res, md = self.call_engine(s, session_forkserver(self.config))
        self.user_properties.append((VERDICT_PROP, res.verdict.value))
        self.user_properties.append(("cutedebug_report", str(md)))
        return res, md


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
        pool = ThreadPoolExecutor(jobs, thread_name_prefix="cutedebug-compile")
        config.stash[_PREFETCH_KEY] = pool
        config.stash[_FUTURES_KEY] = {
            it.nodeid: pool.submit(it.call_engine, it.settings(), session_forkserver(config))
            for it in item.session.items
            if isinstance(it, CompileItem) and not it.scenario.missing_modules()
        }
    return config.stash[_FUTURES_KEY].pop(item.nodeid, None)


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


def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    pool = session.config.stash.get(_PREFETCH_KEY, None)
    if pool is not None:
        if interrupted:
            from cutedebug.engine import watchdog

            watchdog.abort_all()  # the background compiles end now, not at their deadline
        pool.shutdown(wait=True, cancel_futures=True)
    server = session.config.stash.get(_FORKSERVER_KEY, None)
    if server is not None:
        server.close(**({"timeout": 1.0} if interrupted else {}))
        session.config.stash[_FORKSERVER_KEY] = None
    if interrupted:
        from cutedebug.engine import watchdog

        watchdog.reset_abort()


def compile_outcome(res) -> tuple[bool, str]:
    """Did a compile-mode run do what the scenario needs from it? (ok, why not)."""
    exp = res.scenario.expect.verdict
    if exp in COMPILE_VERDICTS:
        return res.verdict.value == exp, f"expected {exp}, got {res.verdict.value}"
    if res.outcome.event("compiled") is None:
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
        if future is None:
            res, md = self._run(self.settings())
        else:
            res, md = future.result()
            self.user_properties.append((VERDICT_PROP, res.verdict.value))
            self.user_properties.append(("cutedebug_report", str(md)))
        if res.verdict is Verdict.UNSUPPORTED and res.outcome.event("compiled") is None:
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


@pytest.hookimpl(trylast=True)  # after conftests have added their markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _select_shard(config, items)
    if resolve(config).compile_jobs > 1:
        # every compile before the first GPU run: runs never share the CPU with compiles
        others = [i for i in items if not isinstance(i, ScenarioItem)]
        compiles = [i for i in items if isinstance(i, CompileItem)]
        runs = [i for i in items if isinstance(i, ScenarioItem) and not isinstance(i, CompileItem)]
        items[:] = others + compiles + runs
    if not config.pluginmanager.hasplugin("timeout"):
        return
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        if isinstance(item, ScenarioItem):
            item.add_marker(pytest.mark.timeout(item.timeout_s()))
        elif "cutedebug_run" in getattr(item, "fixturenames", ()):
            s = resolve(config, item)
            budget = watchdog_budget_s(s.apply(_DEFAULT_SCENARIO), "run", s.repeat)
            item.add_marker(pytest.mark.timeout(round(budget + s.timeout_margin, 1)))


_DEFAULT_SCENARIO = S.Scenario(id="limits", kernel_file="", kernel_entry="")


# ---- status letters ----------------------------------------------------------------------------
def _verdicts(report) -> list[str]:
    return [v for k, v in getattr(report, "user_properties", ()) if k == VERDICT_PROP]


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report, config):
    if report.when != "call" or "HANG" not in _verdicts(report):
        return None
    if report.failed:
        return "failed", "H", ("HANG", {"red": True, "bold": True})
    if report.passed:
        return "passed", "h", ("PASSED (HANG as expected)", {"green": True})
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    hangs = [
        r
        for reps in terminalreporter.stats.values()
        for r in reps
        if getattr(r, "when", None) == "call" and "HANG" in _verdicts(r)
    ]
    if hangs:
        bad = [r for r in hangs if r.failed]
        terminalreporter.write_line(
            f"cutedebug: {len(hangs)} HANG verdict(s), {len(bad)} unexpected"
            + "".join(f"\n  HANG {r.nodeid}" for r in bad)
        )


# ---- fixture for users' own tests --------------------------------------------------------------
def _kernel_target(target: str, request: pytest.FixtureRequest) -> str:
    if ":" not in target:
        raise S.ScenarioError(f"kernel {target!r}: expected FILE.py:ENTRY")
    file, entry = target.rsplit(":", 1)
    if not Path(file).is_absolute():
        for base in (request.path.parent, request.config.rootpath):
            if (base / file).is_file():
                return f"{(base / file).resolve()}:{entry}"
    return target


def assert_verdict(result, verdict: str, **localization: Any) -> None:
    """Fail unless ``result`` has this verdict (and, given role/op/barrier/stage, a stuck site
    that agrees with them). The message says what came back, where, why, and the report."""
    __tracebackhide__ = True
    from cutedebug.engine import runner
    from cutedebug.reporting import report

    if verdict not in VERDICTS:
        raise ValueError(f"unknown verdict {verdict!r}; one of {list(VERDICTS)}")
    problems = []
    if result.verdict.value != verdict:
        problems.append(f"expected {verdict}, got {result.verdict.value}: {result.reason}")
    if localization:
        loc = runner.grade_localization(localization, result.evidence.get("stuck_sites") or [])
        if not loc["ok"]:
            sites = result.evidence.get("stuck_sites") or []
            problems.append(
                f"localization {localization} not found: {loc['why']}"
                + (f"; first stuck site: {sites[0]}" if sites else "")
            )
    if problems:
        w = report.where(result)
        raise AssertionError(
            f"{result.scenario.id}: "
            + "; ".join(problems)
            + (f"\n  where: {w}" if w else "")
            + f"\n  report: {Path(result.run_dir) / 'report.md'}"
        )


@pytest.fixture
def cutedebug_run(request: pytest.FixtureRequest):
    """Run a kernel in the watchdog: ``cutedebug_run(kernel="file.py:Entry", params={...},
    fault=None, fault_args={}, expect=None, deadline=None, probes=None, repeat=None,
    archs=("sm_90a",), mode="run") -> RunResult``. See the module docstring."""
    from cutedebug.engine import runner
    from cutedebug.reporting import report

    def run(
        kernel: str,
        params: dict[str, Any] | None = None,
        fault: str | None = None,
        fault_args: dict[str, Any] | None = None,
        expect: str | None = None,
        *,
        deadline: float | None = None,
        compile_deadline: float | None = None,
        probes: bool | None = None,
        repeat: int | None = None,
        archs: tuple[str, ...] = ("sm_90a",),
        mode: str = "run",
    ):
        __tracebackhide__ = True
        if mode not in ("run", "compile"):
            raise ValueError(f"mode {mode!r}: 'run' or 'compile'")
        if expect is not None and expect not in VERDICTS:
            raise ValueError(f"expect {expect!r}: one of {list(VERDICTS)}")
        s = resolve(
            request.config,
            request.node,
            {
                "deadline": deadline,
                "compile_deadline": compile_deadline,
                "probes": probes,
                "repeat": repeat,
            },
        )
        problem = None
        try:
            sc = S.adhoc(
                _kernel_target(kernel, request),
                dict(params or {}),
                fault,
                dict(fault_args or {}),
                expect or "PASS",
                tuple(archs),
            )
        except S.ScenarioError as e:
            problem = str(e).removeprefix("command line: ")
        if problem:
            pytest.fail(f"cutedebug_run: {problem}", pytrace=False)
        if mode == "run" and (reason := gpu_skip_reason(request.config, sc.archs)):
            pytest.skip(reason)
        try:
            res = runner.run_scenario(
                s.apply(sc),
                runs_root=s.runs_dir,
                mode=mode,
                probes=s.probes,
                repeat=s.repeat,
                forkserver=session_forkserver(request.config),
            )
        except S.ScenarioError as e:  # the child could not load the kernel
            problem = str(e)
        if problem:
            pytest.fail(f"cutedebug_run: {problem}", pytrace=False)
        _, md = report.write(res)
        request.node.user_properties.append((VERDICT_PROP, res.verdict.value))
        request.node.user_properties.append(("cutedebug_report", str(md)))
        if mode == "run" and res.verdict is Verdict.UNSUPPORTED and expect != "UNSUPPORTED":
            pytest.skip(f"{res.reason} (report: {md})")
        if expect is not None:
            assert_verdict(res, expect)
        elif res.verdict in (Verdict.HANG, Verdict.HARNESS_ERROR):
            assert_verdict(res, "PASS")
        return res

    return run
