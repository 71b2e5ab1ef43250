"""GPU lanes: one queue of GPU work spread over several GPUs, one fork server per GPU.

A lane is one GPU (a ``CUDA_VISIBLE_DEVICES`` entry, see :mod:`cutedebug.engine.gpus`) with
its own fork server, started with that GPU as the only visible one, so every worker and
health check forked from it runs there. :meth:`Lanes.submit` queues a job; whichever lane is
free takes the next job (work stealing: a slow GPU takes fewer). With several lanes, a job
whose result reports an unhealthy GPU after a kill (``result.health["healthy"] is False``)
retires its lane: the rest of the queue goes to the other GPUs, and when every lane is
retired the remaining jobs fail with :class:`NoHealthyGpu` instead of running on a broken
GPU. (One lane keeps the one-GPU behaviour: it goes on, and the unhealthy check is reported.)

``Lanes([None])`` is the one-GPU case: the process's own visibility, no binding.

``slots`` > 1 overlaps compiles with launches: up to ``slots`` jobs per GPU at once, each
compiling on the CPU, and only the one holding the lane's GPU token (``Lane.token``, a file;
instrument/launch_gpu.py) launching: the worker takes it before its launch, the runner gives it
back after the worker ended and after the health check a kill calls for. A lane retired while
several of its jobs were in flight runs those jobs again on another GPU (they may have launched
on the broken one); with one job per GPU there is never such a job.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutedebug.engine.gpus import VISIBLE_VAR
from cutedebug.instrument.launch_gpu import remove_gpu_token


class NoHealthyGpu(RuntimeError):
    """Every lane was retired by a failed health check; the job was not run."""


class Unserved:
    """A lane whose fork server could not start: every run a fresh process (the runner's
    fallback), still bound to the lane's GPU through ``bind_env``."""

    closed, alive = True, False

    def __init__(self, bind_env: dict[str, str]):
        self.bind_env = bind_env

    def spawn(self, *args: Any, **kwargs: Any):
        from cutedebug.engine.forkserver import ForkServerError

        raise ForkServerError("no fork server for this GPU")

    def close(self, timeout: float = 10.0) -> None:
        pass


@dataclass
class Lane:
    gpu: str | None
    forkserver: Any = None
    jobs: int = 0
    busy_s: float = 0.0
    retired: str | None = None  # why the lane takes no more jobs
    health: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    token: str | None = None  # the GPU token file of this GPU's jobs (slots > 1)
    running: int = 0  # jobs in flight

    @property
    def name(self) -> str:
        return "default" if self.gpu is None else self.gpu

    def env(self) -> dict[str, str]:
        """What a fresh (not forked) process needs in its environment to run on this lane."""
        return {} if self.gpu is None else {VISIBLE_VAR: self.gpu}


class Lanes:
    """One job queue over ``gpus``; use as a context manager (closes the fork servers)."""

    def __init__(
        self,
        gpus: list[str | None],
        runs_root: Path | str,
        *,
        forkserver: bool = True,
        start=None,
        slots: int = 1,
        tokens: Path | str | None = None,
        preload: list[str] | None = None,
    ):
        """``slots``: jobs per GPU at once; above 1 each lane gets a GPU token file in
        ``tokens`` (default ``runs_root``), removed when the lanes close. ``preload``: library
        modules each lane's fork server imports before the first job
        (runner.preload_forkserver), the lanes' servers side by side: N GPUs do not wait N
        imports of the libraries one after another. The servers themselves start in this
        thread (a process's PR_SET_PDEATHSIG follows the thread that started it: lifeline.py);
        the preloads are asks, made from the lanes' own threads, which live until close."""
        from cutedebug.engine import runner

        start = start or runner.start_forkserver
        self.lanes = [Lane(g) for g in (gpus or [None])]
        self.slots = max(1, slots)
        self._pool = ThreadPoolExecutor(len(self.lanes) * self.slots, thread_name_prefix="gpu")
        root = Path(runs_root)
        for lane in self.lanes:
            if forkserver:
                sub = root if len(self.lanes) == 1 else root / f"gpu-{lane.name}"
                lane.forkserver = start(sub, gpu=lane.gpu)
            if lane.forkserver is None and lane.gpu is not None:
                lane.forkserver = Unserved(lane.env())
            if self.slots > 1:
                lane.token = str(Path(tokens or root) / f".gpu-{lane.name}.token")
                remove_gpu_token(lane.token)  # left by a killed earlier run
        self._cond = threading.Condition()
        served = [x.forkserver for x in self.lanes if forkserver and x.forkserver is not None]
        if preload and served:
            asks = [self._pool.submit(runner.preload_forkserver, s, preload) for s in served]
            for ask in asks:
                ask.result()

    # ---- jobs ----------------------------------------------------------------------------
    def _take(self) -> Lane:
        """The least busy lane with a free slot (work stealing)."""
        with self._cond:
            while True:
                free = [x for x in self.lanes if not x.retired and x.running < self.slots]
                if free:
                    lane = min(free, key=lambda x: x.running)
                    lane.running += 1
                    return lane
                if all(lane.retired for lane in self.lanes):
                    raise NoHealthyGpu(
                        "every GPU failed its health check: "
                        + "; ".join(f"GPU {lane.name}: {lane.retired}" for lane in self.lanes)
                    )
                self._cond.wait(timeout=0.5)

    def _give_back(self, lane: Lane) -> None:
        with self._cond:
            lane.running -= 1
            self._cond.notify_all()

    def submit(self, fn, *args: Any, **kwargs: Any) -> Future:
        """Run ``fn(*args, lane=<Lane>, **kwargs)`` on the next free lane (again on another
        lane when its GPU was retired by another job while this one was in flight)."""

        def job():
            while True:
                lane = self._take()
                t0 = time.monotonic()
                try:
                    try:
                        result = fn(*args, lane=lane, **kwargs)
                    except Exception:
                        # another job retired the lane while this one was in flight: this
                        # failure may be the broken GPU's (a CUDA error while making the
                        # inputs is blamed on the kernel file), so it runs again elsewhere
                        if not lane.retired:
                            raise
                    else:
                        # retired by another job while this one was in flight: this one may
                        # have launched on the broken GPU
                        if self._check_health(lane, result) or not lane.retired:
                            return result
                    lane.extra.setdefault("rerun_elsewhere", 0)
                    lane.extra["rerun_elsewhere"] += 1
                finally:
                    lane.jobs += 1
                    lane.busy_s += time.monotonic() - t0
                    self._give_back(lane)

        return self._pool.submit(job)

    def _check_health(self, lane: Lane, result: Any) -> bool:
        """Retire the lane when the job's result reports its GPU unhealthy after a kill; True
        when this job did."""
        res = result[0] if isinstance(result, tuple) and result else result
        health = getattr(res, "health", None)
        if not (isinstance(health, dict) and health.get("healthy") is False):
            return False
        lane.extra.setdefault("unhealthy_after_kill", []).append(health)
        lane.health = health
        if len(self.lanes) == 1:
            return True
        with self._cond:
            lane.retired = (
                lane.retired or f"unhealthy after a kill: {health.get('error') or health}"
            )
        return True

    # ---- the end -------------------------------------------------------------------------
    def shutdown(self, *, cancel: bool = False) -> None:
        self._pool.shutdown(wait=True, cancel_futures=cancel)

    def final_health(self, run_dir: Path | str) -> dict[str, Any]:
        """A GPU health check on every lane (forked from its server while it still runs), in
        parallel: {"healthy": all healthy, "per_gpu": {gpu: result}}. A GPU that failed a
        check after a kill during the run counts as unhealthy even if it recovered since."""
        from cutedebug.engine import runner

        results: dict[str, Any] = {}

        def check(lane: Lane) -> None:
            d = Path(run_dir) if len(self.lanes) == 1 else Path(run_dir) / f"gpu-{lane.name}"
            # forked from the lane's server (bound to its GPU), else fresh and bound
            results[lane.name] = runner.health_check(forkserver=lane.forkserver, run_dir=d)

        threads = [threading.Thread(target=check, args=(lane,)) for lane in self.lanes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for lane in self.lanes:
            if lane.extra.get("unhealthy_after_kill"):
                results[lane.name] = {
                    **results[lane.name],
                    "healthy": False,
                    "unhealthy_after_kill": lane.extra["unhealthy_after_kill"],
                    "final_check": results[lane.name],
                }
        if len(self.lanes) == 1:
            return results[self.lanes[0].name]
        return {"healthy": all(r.get("healthy") for r in results.values()), "per_gpu": results}

    def summary(self) -> dict[str, Any]:
        """Jobs and busy seconds per GPU (summed over its jobs: with several slots, more than
        the wall), why a retired lane stopped, jobs run again elsewhere after it did."""
        return {
            lane.name: {
                "jobs": lane.jobs,
                "busy_s": round(lane.busy_s, 3),
                **({"retired": lane.retired} if lane.retired else {}),
                **(
                    {"rerun_elsewhere": lane.extra["rerun_elsewhere"]}
                    if lane.extra.get("rerun_elsewhere")
                    else {}
                ),
            }
            for lane in self.lanes
        }

    def close(self, timeout: float = 10.0) -> None:
        for lane in self.lanes:
            if lane.forkserver is not None:
                lane.forkserver.close(timeout=timeout)
                lane.forkserver = None
            if lane.token:
                remove_gpu_token(lane.token)

    def __enter__(self) -> Lanes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(cancel=True)
        self.close()


def processes_by_gpu(pids: list[int]) -> dict[str, list[int]]:
    """Leftover pids grouped by the GPU their environment bound them to ("default": none)."""
    import psutil

    out: dict[str, list[int]] = {}
    for pid in pids:
        try:
            gpu = psutil.Process(pid).environ().get(VISIBLE_VAR) or "default"
        except (psutil.Error, OSError):
            gpu = "unknown"
        out.setdefault(gpu, []).append(pid)
    return out


def bound_env(gpu: str | None, env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default os.environ) bound to ``gpu`` (unchanged for None)."""
    out = dict(os.environ if env is None else env)
    if gpu is not None:
        out[VISIBLE_VAR] = gpu
    return out
