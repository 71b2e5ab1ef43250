"""The pytest plugin's run prefetch: while a scenario item runs, the next run items of this
pytest process start their run workers in the background; they compile at once, and only the
one holding the GPU's token launches (the token of `cutedebug triage`'s lanes:
instrument/launch_gpu.py, taken by the worker right before its launch, given back by the
runner after the worker ended and after the health check a kill calls for). An item whose run
was started ahead only waits for its result; its report, verdict and evidence are those of
the same run_scenario call, its wait for the token is kept apart (``timings.gpu_wait_s``, the
``cutedebug_gpu_wait_s`` property) and stops no clock of its watchdog.

Which items start ahead (``prefetch`` = N, default 2; 0 / off: each item in its turn, no
token): without pytest-xdist the next N run items of the session's order (compile items and
invalid scenario files between them are passed over: they never touch the GPU); under xdist
the ``nextitem`` pytest hands the item's protocol (already taken off the worker's queue: no
other worker can steal it), since the rest of a worker's queue is xdist's own; there a next
compile item starts ahead too (the compile pool of ``compile_jobs`` does not run under xdist),
so a worker's compile items go two at a time. Nothing starts
past a test of another kind (it may use the GPU itself), nor while one runs, nor for an item
marked skip / skipif / xfail(run=False), a scenario whose modules are missing or that cannot
run on this GPU. A run whose item then does not run (skipped or failed in its setup, the
session stopped by ``-x`` or an interrupt) is cancelled: its worker killed with its tree, its
token given back (watchdog.cancellable, runner._attempt).

The token is one file per GPU in a folder of the session (lifeline.make_tempdir: removed by
the keeper even when pytest is SIGKILLed); the xdist controller makes it and hands it to every
worker, so workers bound to one GPU share its token and never launch at once. A test using the
``cutedebug_run`` fixture takes the same token for its runs.
"""

from __future__ import annotations

import math
import os
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from cutedebug.commands.pytest_items import (
    _RUNS_AHEAD_KEY,
    CompileItem,
    InvalidScenarioItem,
    RunItem,
    ScenarioItem,
    bound_gpu,
    gpu_facts,
    gpu_skip_reason,
    import_engine,
    in_xdist_worker,
    session_forkserver,
)
from cutedebug.commands.pytest_settings import resolve

_TOKEN_DIR_KEY = pytest.StashKey[dict]()
WORKERINPUT_KEY = "cutedebug_token_dir"


def token_dir(config: pytest.Config) -> str:
    """The folder of the session's GPU tokens: the xdist controller's (every worker gets it),
    else one made here, removed at the end (and by the keeper if pytest is killed)."""
    if _TOKEN_DIR_KEY not in config.stash:
        from cutedebug.engine import lifeline

        given = getattr(config, "workerinput", {}).get(WORKERINPUT_KEY)
        if given:
            os.makedirs(given, exist_ok=True)  # a worker on another host: its own there
            config.stash[_TOKEN_DIR_KEY] = {"path": given, "own": False}
        else:
            path = lifeline.make_tempdir("cutedebug-gpu-tokens-")
            config.stash[_TOKEN_DIR_KEY] = {"path": path, "own": True}
    return config.stash[_TOKEN_DIR_KEY]["path"]


def remove_token_dir(config: pytest.Config) -> None:
    made = config.stash.get(_TOKEN_DIR_KEY, None)
    if made is not None and made["own"]:
        from cutedebug.engine import lifeline

        lifeline.remove_tempdir(made["path"])


def gpu_token(config: pytest.Config) -> str | None:
    """The token of the GPU this process runs on (None: prefetch off, or no GPU here)."""
    if not resolve(config).prefetch or not gpu_facts(config)["present"]:
        return None
    gpu = bound_gpu(config) or os.environ.get("CUDA_VISIBLE_DEVICES") or "default"
    return os.path.join(token_dir(config), f"gpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', gpu)}.token")


def runs_before(config: pytest.Config) -> int:
    """How many other runs may hold this process's GPU before one of its items gets it: the
    runs it started ahead and those of the other xdist workers bound to the same GPU."""
    depth = resolve(config).prefetch
    if not depth:
        return 0
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return depth
    gpus = workerinput.get("cutedebug_gpus") or [None]
    sharers = math.ceil(int(workerinput.get("workercount") or 1) / len(gpus))
    return 1 + 2 * (sharers - 1)  # its next item's; each other worker's current and next


@dataclass
class _Run:
    future: Future
    cancel: threading.Event


class Prefetcher:
    """The runs started ahead by this pytest process, by node id."""

    def __init__(self, config: pytest.Config, depth: int, token: str):
        self.config = config
        self.depth = depth
        self.token = token  # this process's GPU token: every run item's run takes it
        import_engine()  # here, in the main thread, before any pool thread needs it
        self.pool = ThreadPoolExecutor(depth + 1, thread_name_prefix="cutedebug-prefetch")
        self.runs: dict[str, _Run] = {}
        self.index: dict[str, int] | None = None

    # ---- which items ---------------------------------------------------------------------
    def upcoming(self, item: pytest.Item, nextitem: pytest.Item | None) -> list[pytest.Item]:
        """The run items to have started while ``item`` runs (see the module docstring)."""
        items = item.session.items
        if self.index is None:
            self.index = {it.nodeid: i for i, it in enumerate(items)}
        i = self.index.get(item.nodeid)
        order_known = (
            not in_xdist_worker(self.config)
            and i is not None
            and (items[i + 1] if i + 1 < len(items) else None) is nextitem
        )
        ahead = items[i + 1 :] if order_known else [nextitem]
        out: list[pytest.Item] = []
        for it in ahead:
            if len(out) >= self.depth or not self._passes_over(it):
                break
            if self._startable(it):
                out.append(it)
        return out

    @staticmethod
    def _passes_over(it: pytest.Item | None) -> bool:
        """An item the window goes on past: a scenario item or an invalid scenario file."""
        return isinstance(it, (ScenarioItem, InvalidScenarioItem))

    def _startable(self, it: pytest.Item) -> bool:
        # a compile item too under xdist, where the compile pool does not run (its workers'
        # lists are everyone's), so each worker's next compile overlaps its current item
        xdist_compile = isinstance(it, CompileItem) and in_xdist_worker(self.config)
        if not (isinstance(it, RunItem) or xdist_compile):
            return False
        if it.get_closest_marker("skip") is not None:
            return False
        if it.get_closest_marker("skipif") is not None:
            return False
        xfail = it.get_closest_marker("xfail")
        if xfail is not None and not xfail.kwargs.get("run", True):
            return False
        sc = it.scenario
        if sc.missing_modules():
            return False
        return xdist_compile or gpu_skip_reason(self.config, sc.archs) is None

    # ---- runs ----------------------------------------------------------------------------
    def ahead(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        """Before ``item`` runs: start the upcoming run items not started yet; cancel the
        runs of items that left the window (taken by another xdist worker)."""
        if not self._passes_over(item):
            return  # a test of another kind may use the GPU: nothing starts while it runs
        window = self.upcoming(item, nextitem)
        keep = {item.nodeid} | {it.nodeid for it in window}
        for nodeid in [n for n in self.runs if n not in keep]:
            self.cancel(nodeid)
        for it in window:
            if it.nodeid not in self.runs:
                self.start(it)

    def start(self, it: Any) -> None:
        from cutedebug.engine import watchdog

        s = it.settings()
        server = session_forkserver(self.config)  # made here, in the main thread
        token = self.token if it.mode == "run" else None
        cancel = threading.Event()

        def run():
            with watchdog.cancellable(cancel):
                return it.call_engine(s, server, token)

        self.runs[it.nodeid] = _Run(self.pool.submit(run), cancel)

    def take(self, item: pytest.Item) -> Future | None:
        run = self.runs.pop(item.nodeid, None)
        return run.future if run is not None else None

    def cancel(self, nodeid: str) -> None:
        run = self.runs.pop(nodeid, None)
        if run is not None:
            run.cancel.set()
            run.future.cancel()

    def settle(self, item: pytest.Item) -> None:
        """After ``item``'s protocol: its run, if it never took it (skipped or failed in its
        setup), is cancelled."""
        self.cancel(item.nodeid)

    def close(self) -> None:
        """Cancel every run not taken and wait for their threads (each ends within a poll of
        its watchdog: the worker killed, the token given back)."""
        for nodeid in list(self.runs):
            self.cancel(nodeid)
        self.pool.shutdown(wait=True, cancel_futures=True)


def prefetcher(config: pytest.Config) -> Prefetcher | None:
    """This session's prefetcher (None: prefetch off or no GPU here); the run items find it
    through pytest_items.runs_ahead."""
    if _RUNS_AHEAD_KEY not in config.stash:
        token = gpu_token(config)
        depth = resolve(config).prefetch
        config.stash[_RUNS_AHEAD_KEY] = Prefetcher(config, depth, token) if token else None
    return config.stash[_RUNS_AHEAD_KEY]


def close(config: pytest.Config) -> None:
    p = config.stash.get(_RUNS_AHEAD_KEY, None)
    if p is not None:
        p.close()
        config.stash[_RUNS_AHEAD_KEY] = None
