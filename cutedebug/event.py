"""One event of a child's event channel (events.jsonl): ``{"event": NAME, "t": SECONDS, ...}``.

Written by the worker (engine/events.py: ``Events.emit``) and by an instrumented process under
``cutedebug exec`` (instrument/launch.py), read by the watchdog (engine/watchdog.py:
``EventReader``) and kept in the run's ``Outcome``. The envelope is typed (``name``: the
event's kind, ``t``: seconds since the writer started; under ``cutedebug exec`` also ``pid``
and ``wall``, the writing process and its clock); the payload is the event's own
fields, an open object each event kind fills its way (``compiled``: the PTX facts and probe
sites, ``progress``: the live probe picture, ...). An ``Event`` reads like its JSON object
(``ev["event"]``, ``ev.get("secs")``, ``{**ev}``) and compares equal to it.

Serialised only through ``to_json`` / ``from_json`` (the envelope through cutedebug/records.py:
a line without a string ``event`` or with a non-numeric ``t`` is refused, naming the field).
Imports no other cutedebug module but records (every layer may use it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from cutedebug import records

ENVELOPE = ("event", "t", "pid", "wall")


@dataclass(frozen=True, slots=True, kw_only=True)
class EventEnvelope:
    event: str
    t: float | None = records.optional(None)  # absent only on events the parent makes up
    pid: int | None = records.optional(None)  # `cutedebug exec`: the process that wrote it
    wall: float | None = records.optional(None)  # `cutedebug exec`: time.time() at writing


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Event(Mapping[str, Any]):
    """One line of the event channel."""

    name: str  # the "event" key: started, compiled, progress, probe_report, done, ...
    t: float | None = None  # seconds since the writer's start
    pid: int | None = None  # the writing process, on the channel every exec'd process shares
    wall: float | None = None
    fields: dict[str, Any] = field(default_factory=dict)  # every other key, in line order

    def _envelope(self) -> dict[str, Any]:
        env = EventEnvelope(event=self.name, t=self.t, pid=self.pid, wall=self.wall)
        return records.to_json(env)

    def to_json(self) -> dict[str, Any]:
        return {**self._envelope(), **records.to_json_value(self.fields)}

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> Event:
        if not isinstance(data, dict):
            raise records.RecordError(
                f"{where or 'event'}: expected a JSON object, got {type(data).__name__}"
            )
        env = records.from_json(EventEnvelope, {k: data[k] for k in ENVELOPE if k in data}, where)
        if not env.event:
            raise records.RecordError(f"field {records.join(where, 'event')!r}: empty")
        return cls(
            name=env.event,
            t=env.t,
            pid=env.pid,
            wall=env.wall,
            fields={k: v for k, v in data.items() if k not in ENVELOPE},
        )

    # ---- read like the JSON object ----
    def __getitem__(self, key: str) -> Any:
        if key in ENVELOPE:
            value = self.name if key == "event" else getattr(self, key)
            if value is None:
                raise KeyError(key)
            return value
        return self.fields[key]

    def __iter__(self) -> Iterator[str]:
        yield from self._envelope()
        yield from self.fields

    def __len__(self) -> int:
        return len(self._envelope()) + len(self.fields)
