"""One event of a child's event channel (events.jsonl): ``{"event": NAME, "t": SECONDS, ...}``.

Written by the worker (engine/events.py: ``Events.emit``) and by an instrumented process under
``cutedebug exec`` (instrument/launch.py), read by the watchdog (engine/watchdog.py:
``EventReader``) and kept in the run's ``Outcome``. The envelope is typed (``name``: the
event's kind, ``t``: seconds since the writer started; under ``cutedebug exec`` also ``pid``
and ``wall``, the writing process and its clock); the payload is the kind's record
(cutedebug/event_kinds.py: ``compiled``: the PTX facts and probe sites, ``progress``: the live
probe picture, ...), read as ``ev.payload.secs``. An ``Event`` also reads like its JSON object
(``ev["event"]``, ``ev.get("secs")``, ``{**ev}``) and compares equal to it.

Serialised only through ``to_json`` / ``from_json`` (through cutedebug/records.py: a line
without a string ``event``, with a non-numeric ``t``, or whose payload does not fit its kind is
refused, naming the field). Imports no other cutedebug module but records and event_kinds
(every layer may use it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cutedebug import records
from cutedebug.event_kinds import OtherPayload, Payload, payload_of, read_payload

ENVELOPE = ("event", "t", "pid", "wall")
P = TypeVar("P", bound=Payload)


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
    payload: Payload | OtherPayload = field(default_factory=lambda: OtherPayload(fields={}))

    @classmethod
    def of(cls, name: str, t: float | None = None, /, **fields: Any) -> Event:
        """A writer's event: its kind, time and keywords (``pid`` / ``wall`` go to the
        envelope; a keyword the kind lacks is a TypeError)."""
        env = {k: fields.pop(k) for k in ("pid", "wall") if k in fields}
        return cls(name=name, t=t, **env, payload=payload_of(name, fields))

    def _envelope(self) -> dict[str, Any]:
        env = EventEnvelope(event=self.name, t=self.t, pid=self.pid, wall=self.wall)
        return records.to_json(env)

    def to_json(self) -> dict[str, Any]:
        return {**self._envelope(), **self.payload.to_json()}

    @property
    def fields(self) -> dict[str, Any]:
        """The payload as its JSON object."""
        return self.payload.to_json()

    def as_kind(self, cls: type[P]) -> P:
        """The payload as ``cls`` (the kind's record; TypeError when this event is another
        kind's)."""
        if not isinstance(self.payload, cls):
            raise TypeError(f"a {self.name!r} event is not a {cls.__name__}")
        return self.payload

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> Event:
        if not isinstance(data, dict):
            raise records.RecordError(
                f"{where or 'event'}: expected a JSON object, got {type(data).__name__}"
            )
        env = records.from_json(EventEnvelope, {k: data[k] for k in ENVELOPE if k in data}, where)
        if not env.event:
            raise records.RecordError(f"field {records.join(where, 'event')!r}: empty")
        rest = {k: v for k, v in data.items() if k not in ENVELOPE}
        return cls(
            name=env.event,
            t=env.t,
            pid=env.pid,
            wall=env.wall,
            payload=read_payload(env.event, rest, where),
        )

    # ---- read like the JSON object ----
    def __getitem__(self, key: str) -> Any:
        if key in ENVELOPE:
            value = self.name if key == "event" else getattr(self, key)
            if value is None:
                raise KeyError(key)
            return value
        return self.payload.value(key)

    def __iter__(self) -> Iterator[str]:
        yield from self._envelope()
        yield from self.payload.given()

    def __len__(self) -> int:
        return len(self._envelope()) + len(self.payload.given())
