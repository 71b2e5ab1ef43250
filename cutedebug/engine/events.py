"""The worker's event channel: one JSON object per line, appended and flushed as it happens.

The runner reads it live (engine/watchdog.py: EventReader, lines up to 1 MiB). Every string
field is capped with a visible mark and every line kept under that limit, so that a 10 MB
exception message still leaves its event (and its verdict) instead of a dropped line.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from cutedebug.event import Event

MAX_FIELD_CHARS = 16_000  # one string field of an event (messages, tracebacks)
MAX_LINE_CHARS = 900_000  # one event line (the runner reads lines up to 1 MiB)


def cap_text(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    """``text`` cut to ``limit`` characters with a visible mark saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f" ...[cut by cutedebug: {len(text) - limit} more characters]"


def _capped(value: Any) -> Any:
    if isinstance(value, str):
        return cap_text(value)
    if isinstance(value, dict):
        return {k: _capped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_capped(v) for v in value]
    return value


class Events:
    """The event channel: one JSON object per line, every string field capped, every line
    under the runner's limit (a 10 MB exception message still leaves its event)."""

    def __init__(self, path: str):
        self._f = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()
        self.t0 = time.monotonic()

    def emit(self, event: str, **fields: Any) -> None:
        t = round(time.monotonic() - self.t0, 6)
        rec = Event.of(event, t, **_capped(fields)).to_json()  # the kind's record
        line = json.dumps(rec, default=str)
        if len(line) > MAX_LINE_CHARS:
            keep = {
                k: v
                for k, v in rec.items()
                if isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) < 2000)
            }
            keep["cut_by_cutedebug"] = f"event of {len(line)} characters cut to its scalars"
            line = json.dumps(keep, default=str)
        with self._lock:
            self._f.write(line + "\n")
            self._f.flush()
