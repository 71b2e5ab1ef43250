"""The pytest plugin's settings: each option as a marker keyword, a flag, an environment
variable and an ini key, resolved with one precedence (call > marker > command line > env >
ini > default) and checked by the one limit check (engine/limits.py). No pytest hooks here:
those are cutedebug/pytest_plugin.py's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cutedebug.engine import scenario as S

HEALTH_CHECK_S = 60.0  # runner.health_check's own timeout, run after a kill


# ---- options ---------------------------------------------------------------------------
def _to_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "on", "yes"):
        return True
    if low in ("0", "false", "off", "no"):
        return False
    raise ValueError("expected on/off (true/false, 1/0)")


def _limit(name: str):
    """The one limit check (cutedebug.engine.limits.check_limit): finite, positive,
    bounded; NaN or inf would switch the watchdog off."""

    def conv(value: Any):
        try:
            return S.check_limit(name, value)
        except S.LimitError as e:
            raise ValueError(str(e).split(": ", 1)[-1]) from None

    conv.__name__ = name
    return conv


def _jobs(value: Any) -> int:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return default_compile_jobs()
    return _limit("jobs")(value)


PREFETCH_DEFAULT = 2  # run items started ahead of the one running (without xdist)


def _prefetch(value: Any) -> int:
    """on (the default depth), off / 0, or N run items started ahead."""
    if isinstance(value, bool):
        return PREFETCH_DEFAULT if value else 0
    text = str(value).strip().lower()
    if text in ("0", "false", "off", "no"):
        return 0
    if text in ("true", "on", "yes", "auto"):
        return PREFETCH_DEFAULT
    try:
        return _limit("jobs")(value)
    except ValueError:
        raise ValueError("expected on/off or a number of run items started ahead") from None


def default_compile_jobs() -> int:
    return max(1, min(8, os.cpu_count() or 1))


@dataclass(frozen=True)
class Option:
    name: str
    convert: Any
    help: str

    @property
    def flag(self) -> str:
        return "--cutedebug-" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "CUTEDEBUG_" + self.name.upper()

    @property
    def ini(self) -> str:
        return "cutedebug_" + self.name


OPTIONS = (
    Option(
        "deadline",
        _limit("deadline_s"),
        "kernel deadline in seconds (replaces the scenario's limits.deadline_s)",
    ),
    Option(
        "compile_deadline",
        _limit("compile_s"),
        "compile deadline in seconds (replaces limits.compile_s)",
    ),
    Option("probes", _to_bool, "bounded waits + beacons: on|off (default: the scenario's)"),
    Option(
        "repeat",
        _limit("repeat"),
        "run each scenario N times; disagreeing runs are NONDETERMINISTIC (default 1)",
    ),
    Option("runs_dir", str, "where run directories and reports go (default: <rootdir>/runs)"),
    Option(
        "timeout_margin",
        _limit("timeout_margin"),
        "seconds the pytest-timeout outer guard adds to the watchdog's worst case (default 60)",
    ),
    Option(
        "compile_jobs",
        _jobs,
        "compile items: compile-only children at once, session-wide "
        "(default: the CPU count, at most 8; 1: each in its turn)",
    ),
    Option(
        "gpus",
        str,
        "GPUs to run on, session-wide: all or a comma list (0,1); under "
        "pytest-xdist worker gwN gets the N-th (default: all visible)",
    ),
    Option("shard", str, "run only shard I/N of the tests (by scenario id), session-wide"),
    Option(
        "durations",
        str,
        "balance --cutedebug-shard by the seconds an earlier triage's "
        "matrix.json recorded, session-wide",
    ),
    Option(
        "prefetch",
        _prefetch,
        "run items start N items ahead (compile, then wait for their GPU's token) while one "
        "launches, session-wide: on (N=2; xdist: the next item), off, or N (default on)",
    ),
    Option(
        "forkserver",
        _to_bool,
        "fork workers from one server that imported torch and "
        "cutlass once, session-wide: on|off (default on)",
    ),
)
DEFAULTS = {
    "deadline": None,
    "compile_deadline": None,
    "probes": None,
    "repeat": 1,
    "runs_dir": None,
    "timeout_margin": 60.0,
    "compile_jobs": None,
    "forkserver": True,
    "prefetch": PREFETCH_DEFAULT,
    "gpus": None,
    "shard": None,
    "durations": None,
}


@dataclass(frozen=True)
class Settings:
    deadline: float | None
    compile_deadline: float | None
    probes: bool | None
    repeat: int
    runs_dir: Path
    timeout_margin: float
    compile_jobs: int
    forkserver: bool
    prefetch: int  # run items started ahead (0: off, each item runs in its turn)
    gpus: str | None
    shard: str | None
    durations: str | None
    sources: dict[str, str]  # option -> where its value came from

    def apply(self, sc: S.Scenario) -> S.Scenario:
        """The scenario with these settings' limit overrides."""
        over = {
            k: v
            for k, v in (("deadline_s", self.deadline), ("compile_s", self.compile_deadline))
            if v is not None
        }
        if not over:
            return sc
        return sc.with_overrides(limits=S.Limits(**{**vars(sc.limits), **over}))


def resolve(
    config: pytest.Config, node: pytest.Item | None = None, call: dict[str, Any] | None = None
) -> Settings:
    """Settings for one item: call arguments > marker > command line > env > ini > default."""
    marker = node.get_closest_marker("cutedebug") if node is not None else None
    layers = [("call", call or {}), ("marker", marker.kwargs if marker else {})]
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for opt in OPTIONS:
        candidates = [(src, layer.get(opt.name)) for src, layer in layers]
        candidates += [
            (opt.flag, config.getoption("cutedebug_" + opt.name)),
            (opt.env, os.environ.get(opt.env) or None),
            (opt.ini, config.getini(opt.ini) or None),
        ]
        for src, raw in candidates:
            if raw is None:
                continue
            try:
                value = (
                    bool(raw)
                    if opt.convert is _to_bool and not isinstance(raw, str)
                    else opt.convert(raw)
                )
            except (TypeError, ValueError) as e:
                raise pytest.UsageError(f"cutedebug: {src} {opt.name} = {raw!r}: {e}") from None
            values[opt.name], sources[opt.name] = value, src
            break
        else:
            values[opt.name], sources[opt.name] = DEFAULTS[opt.name], "default"
    runs_dir = Path(values["runs_dir"]) if values["runs_dir"] else config.rootpath / "runs"
    if not runs_dir.is_absolute():
        runs_dir = config.rootpath / runs_dir
    values["runs_dir"] = runs_dir
    if values["compile_jobs"] is None:
        values["compile_jobs"] = default_compile_jobs()
    return Settings(**values, sources=sources)


def watchdog_budget_s(sc: S.Scenario, mode: str, repeat: int) -> float:
    """The longest a run_scenario call can legitimately take: the watchdog restarts its clock
    at every phase, so the sum of the limits of each phase the child may go through; a blind
    hang is rerun once with probes; a kill is followed by a health check."""
    from cutedebug.engine.verdict import PHASES
    from cutedebug.engine.watchdog import phase_deadline

    phases = [p for p in PHASES if mode == "run" or p not in ("launched", "synced", "checked")]
    once = sum(phase_deadline(p, sc.limits) for p in phases)
    if mode == "compile":
        return once
    return repeat * (2 * once + HEALTH_CHECK_S)
