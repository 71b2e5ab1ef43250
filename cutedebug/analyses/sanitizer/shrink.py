"""Shrinking the problem size while the same finding persists."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cutedebug import records
from cutedebug.analyses.sanitizer.findings import Finding
from cutedebug.analyses.sanitizer.triage import filter_noise, group

Signature = tuple[str, tuple[tuple[str | None, int | None], ...]]


@dataclass
class ShrinkResult(records.Record):
    original: dict[str, Any]
    shrunk: dict[str, Any]
    signature: Signature
    original_seconds: float | None
    shrunk_seconds: float | None
    runs: list[dict[str, Any]] = field(default_factory=list)  # every candidate, once


def shrink(
    params: Mapping[str, Any],
    shrinkable: Sequence[str],
    run: Callable[[dict[str, Any]], Sequence[Finding]],
    *,
    target: Signature | None = None,
    minimum: int = 1,
    max_runs: int = 48,
    clock: Callable[[], float] = time.monotonic,
    original: tuple[Sequence[Finding], float | None] | None = None,
) -> ShrinkResult:
    """Smallest ``shrinkable`` int params for which ``run`` still shows the same finding.

    "Same" = same kind and source lines (``Finding.signature``); ``target`` defaults to the
    first group of the original run's kept findings. Each parameter is shrunk in turn by an
    exponential probe downward (v/2, v/4, ...) and a binary search between the last value
    that reproduced and the first that did not, repeated until nothing shrinks. A candidate
    is never run twice (memoized); a run that raises counts as "does not reproduce".
    ``original`` = (findings, seconds) of a run of ``params`` already made: it is not rerun.
    """
    memo: dict[tuple, bool] = {}
    runs: list[dict[str, Any]] = []
    seconds: dict[tuple, float] = {}

    def key(p: Mapping[str, Any]) -> tuple:
        return tuple(sorted(p.items()))

    def attempt(p: dict[str, Any]) -> bool:
        k = key(p)
        if k in memo:
            return memo[k]
        if len(runs) >= max_runs:
            return False
        error = None
        if original is not None and k == key(params):
            found, dt = list(original[0]), original[1] or 0.0
        else:
            t0 = clock()
            # A broken candidate (e.g. a size the kernel rejects) does not reproduce.
            try:
                found = list(run(dict(p)))
            except Exception as exc:  # noqa: BLE001
                found, error = [], f"{type(exc).__name__}: {exc}"
            dt = clock() - t0
        kept, _ = filter_noise(found)
        nonlocal target
        if target is None:
            groups = group(kept)
            target = (groups[0].kind, groups[0].lines) if groups else None
            ok = target is not None
        else:
            ok = any(f.signature == target for f in kept)
        memo[k], seconds[k] = ok, dt
        runs.append(
            {
                "params": dict(p),
                "reproduced": ok,
                "seconds": dt,
                **({"error": error} if error else {}),
            }
        )
        return ok

    current = dict(params)
    if not attempt(current):
        raise ValueError("the original parameters do not reproduce the finding to shrink")
    assert target is not None
    changed = True
    while changed and len(runs) < max_runs:
        changed = False
        for name in shrinkable:
            value = current.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= minimum:
                continue
            if memo.get(key({**current, name: value - 1})) is False:
                continue  # already minimal for the other params as they stand
            best = _shrink_one(current, name, value, minimum, attempt)
            if best < value:
                current[name] = best
                changed = True
    return ShrinkResult(
        original=dict(params),
        shrunk=current,
        signature=target,
        original_seconds=seconds.get(key(params)),
        shrunk_seconds=seconds.get(key(current)),
        runs=runs,
    )


def _shrink_one(
    current: dict[str, Any],
    name: str,
    value: int,
    minimum: int,
    attempt: Callable[[dict[str, Any]], bool],
) -> int:
    def ok(v: int) -> bool:
        return attempt({**current, name: v})

    good = value
    bad = None
    probe = max(minimum, value // 2)
    while probe < good:  # exponential probe: halve until it stops reproducing
        if ok(probe):
            good = probe
            probe = max(minimum, probe // 2)
        else:
            bad = probe
            break
    if bad is None:
        return good
    while good - bad > 1:  # binary search in (bad, good]
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good
