"""Which scenarios a shard runs (``--shard I/N``): by scenario id, or balanced by the seconds an
earlier matrix recorded. Pure logic (the stdlib and the triage record types), shared by ``cutedebug triage``, the pytest
plugin and ``cutedebug merge`` (commands/shard.py, which also documents the command lines).

- by scenario id alone (default): shard = sha1(id) mod n + 1. A scenario stays on its shard on
  every machine, in every run, whatever else is added or removed; shard sizes vary like a
  fair coin's counts.
- by recorded durations: the scenarios, longest first (ties by id), each go to the shard with
  the least total so far (ties: the lowest shard). Scenarios the durations do not know get the
  median of those they know. Same file and same scenarios: same assignment everywhere.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

from cutedebug import records
from cutedebug.engine.triage_record import TriageMatrix, TriageRecord


class ShardError(ValueError):
    """Bad --shard / --durations / merge input; the message names the file or value."""


# ---- assignment ------------------------------------------------------------------------------
def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> (2, 4); i counts from 1."""
    try:
        i_text, n_text = text.split("/")
        i, n = int(i_text), int(n_text)
    except ValueError:
        raise ShardError(f"--shard {text!r}: expected I/N with 1 <= I <= N, e.g. 1/4") from None
    if n < 1 or not 1 <= i <= n:
        raise ShardError(f"--shard {text!r}: expected I/N with 1 <= I <= N, e.g. 1/4")
    return i, n


def stable_shard(key: str, n: int) -> int:
    """The shard (1..n) of ``key`` by its id alone."""
    return int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:12], 16) % n + 1


def assign(keys: list[str], n: int, durations: dict[str, float] | None = None) -> dict[str, int]:
    """Shard (1..n) of every key: by id alone, or balanced by ``durations`` (see module doc)."""
    if not durations:
        return {k: stable_shard(k, n) for k in keys}
    known = [durations[k] for k in keys if k in durations]
    default = statistics.median(known) if known else 1.0
    load = [0.0] * n
    out: dict[str, int] = {}
    for k in sorted(set(keys), key=lambda k: (-durations.get(k, default), k)):
        s = min(range(n), key=lambda j: (load[j], j))
        load[s] += durations.get(k, default)
        out[k] = s + 1
    return out


def select(
    keys: list[str], shard: tuple[int, int], durations: dict[str, float] | None = None
) -> set[str]:
    """The keys shard ``(i, n)`` runs."""
    i, n = shard
    table = assign(keys, n, durations)
    return {k for k in keys if table[k] == i}


def record_seconds(rec: TriageRecord) -> float | None:
    """Wall seconds a triage record took: its compile, its run and its bisection (without a
    run's wait for the GPU token: other scenarios' time)."""
    parts = [
        c.own_s if c is rec.run else getattr(c, "wall_s", None)
        for c in (rec.compile, rec.run, rec.bisect)
        if c
    ]
    secs = [float(p) for p in parts if isinstance(p, (int, float))]
    return sum(secs) if secs else None


def durations_from(path: Path | str) -> dict[str, float]:
    """Seconds per scenario id from an earlier matrix.json, or a triage output folder (its
    matrix.json). Raises ShardError naming the file when it cannot be read."""
    p = Path(path)
    if p.is_dir():
        p = p / "matrix.json"
    try:
        # a kept report's matrix may be gzipped (reports/*/matrix.json.gz)
        m = TriageMatrix.from_json(json.loads(records.read_text(p)))
    except (OSError, ValueError) as e:  # RecordError is a ValueError naming the field
        raise ShardError(
            f"--durations {path}: {p} is not a readable cutedebug matrix.json "
            f"({type(e).__name__}: {e})"
        ) from None
    out = {}
    for r in m.scenarios:
        secs = record_seconds(r)
        if secs is not None:
            out[r.id] = secs
    return out
