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
      verdict (except for a fault declared ``error_at_run``, whose COMPILE_ERROR the DSL raises
      only when it converts the real arguments of a GPU run: there it passes when it compiled
      and the fault reached the kernel, and the run item expects the COMPILE_ERROR).
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
    - ``prefetch`` (on, off or N; default on = 2; session-wide): while a scenario item runs,
      the next N run items start their workers in the background (under pytest-xdist: the
      ``nextitem`` pytest hands the running item); they compile at once and only the one
      holding the GPU's token launches, so one kernel at a time runs per GPU while the next
      ones compile. Each item then only waits for its own result: same verdict, report and
      evidence, its wait for the GPU apart (``timings.gpu_wait_s`` in report.json, the
      ``cutedebug_gpu_wait_s`` property; no watchdog clock runs meanwhile). A run whose item
      does not run after all (skipped in its setup, ``-x``, Ctrl-C) is killed and gives its
      token back. ``off``: every run item in its turn, no token (the order before).
      Details: cutedebug/commands/pytest_prefetch.py.
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
    it: under xdist the compile pool does not run, the workers are the parallelism; with a
    GPU and the run prefetch each worker starts its next item ahead, compile or run), no
    state shared between workers but the GPU tokens of the run prefetch (workers bound to one
    GPU take its one token: ``pytest -n 4`` on one GPU never runs two kernels at once), every
    child of a worker killed at its session end. A
    worker dies with the pytest process that started it (SIGKILL included: its first
    cutedebug item ties it, ``lifeline.tie_to_parent``), and its keeper then kills its fork
    server, workers and their descendants.

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
from pathlib import Path
from typing import Any

import pytest

from cutedebug.commands import pytest_prefetch
from cutedebug.commands.pytest_items import (  # noqa: F401  (P.<name> for callers)
    _BOUND_KEY,
    _FORKSERVER_KEY,
    _FUTURES_KEY,
    _GPU_KEY,
    _GPUS_KEY,
    _PREFETCH_KEY,
    COMPILE_VERDICTS,
    VERDICT_PROP,
    CompileItem,
    InvalidScenarioItem,
    RunItem,
    ScenarioFailure,
    ScenarioFile,
    ScenarioItem,
    _bind_gpu,
    _is_scenario_path,
    _Item,
    _prefetch,
    _scenario_dirs,
    _select_shard,
    bound_gpu,
    compile_outcome,
    gpu_facts,
    gpu_skip_reason,
    in_xdist_worker,
    scenario_keys,
    serious_findings,
    session_forkserver,
    session_gpus,
    shard_key,
)
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
from cutedebug.engine.verdict import Verdict


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
    if _is_ours(item) and in_xdist_worker(item.config):
        # an xdist worker dies with the pytest process that started it (SIGKILL included),
        # and its keeper then sweeps the fork server, the workers and their descendants
        from cutedebug.engine import lifeline

        lifeline.tie_to_parent()
    if (
        _is_ours(item)
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        previous = signal.signal(signal.SIGTERM, _sigterm)
    ahead = pytest_prefetch.prefetcher(item.config) if _is_ours(item) else None
    try:
        if ahead is not None:  # the next run items start their workers (compile, then wait)
            ahead.ahead(item, nextitem)
        return (yield)
    finally:
        if ahead is not None:  # this item's own run, if it never took it, is killed
            ahead.settle(item)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def pytest_keyboard_interrupt(excinfo) -> None:
    """Ctrl-C / SIGTERM: kill every watched child now (compiles in the background included)."""
    from cutedebug.engine import watchdog

    watchdog.abort_all()


def pytest_unconfigure(config: pytest.Config) -> None:
    bound = config.stash.get(_BOUND_KEY, None)
    pytest_prefetch.remove_token_dir(config)
    if bound is not None and bound.get("restore", True):
        if bound["previous"] is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = bound["previous"]


# ---- GPUs and pytest-xdist workers ------------------------------------------------------------


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: hand every worker the session's GPU list (it binds itself) and the
    folder of the GPU tokens (workers bound to one GPU share its token)."""
    node.workerinput["cutedebug_gpus"] = session_gpus(node.config)
    if resolve(node.config).prefetch:
        node.workerinput[pytest_prefetch.WORKERINPUT_KEY] = pytest_prefetch.token_dir(node.config)


# ---- GPU (never imports torch: nvidia-smi only) -------------------------------------------


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


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if _is_scenario_path(file_path, parent):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    pool = session.config.stash.get(_PREFETCH_KEY, None)
    if pool is not None:
        if interrupted:
            from cutedebug.engine import watchdog

            watchdog.abort_all()  # the background compiles end now, not at their deadline
        pool.shutdown(wait=True, cancel_futures=True)
    # runs started ahead whose items did not run (-x, an interrupt): killed, tokens given back
    pytest_prefetch.close(session.config)
    server = session.config.stash.get(_FORKSERVER_KEY, None)
    if server is not None:
        server.close(**({"timeout": 1.0} if interrupted else {}))
        session.config.stash[_FORKSERVER_KEY] = None
    if interrupted:
        from cutedebug.engine import watchdog

        watchdog.reset_abort()


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
    before = pytest_prefetch.runs_before(config)
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        if isinstance(item, ScenarioItem):
            item.add_marker(pytest.mark.timeout(item.timeout_s(before)))
        elif "cutedebug_run" in getattr(item, "fixturenames", ()):
            s = resolve(config, item)
            budget = watchdog_budget_s(s.apply(_DEFAULT_SCENARIO), "run", s.repeat)
            budget *= 1 + before  # its runs may wait for the GPU behind others'
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
    from cutedebug.analyses import lint
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
        # under the run prefetch its runs take the GPU's token too (one kernel at a time)
        ahead = pytest_prefetch.prefetcher(request.config) if mode == "run" else None
        try:
            res = runner.run_scenario(
                s.apply(sc),
                runs_root=s.runs_dir,
                mode=mode,
                probes=s.probes,
                repeat=s.repeat,
                forkserver=session_forkserver(request.config),
                compile_checks=[lint.static_findings],
                **({"gpu_token": ahead.token} if ahead is not None else {}),
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
