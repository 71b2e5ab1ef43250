"""The recorded barrier protocol of a kernel (filled by recorder.py, checked by
analyses/lint.py): pipelines, events in trace order, the launch shape. Plain data, JSON
round-trip; no cutlass."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any


@dataclasses.dataclass
class Event:
    seq: int
    kind: str
    pipeline: str | None = None
    file: str | None = None
    line: int | None = None
    function: str | None = None
    conds: tuple[str, ...] = ()  # non-library run-time conditions around the call
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)
    in_loop: bool = False  # traced inside a dynamic loop of kernel code
    via: str | None = None  # a helper's own line the op was called on (basename:line)

    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}" if self.file else "?"


@dataclasses.dataclass
class PipelineRecord:
    key: str
    cls: str
    file: str | None
    line: int | None
    stages: int | None = None
    tx_count: int | None = None  # declared in create()
    producer_group: tuple[str, Any] | None = None
    consumer_group: tuple[str, Any] | None = None
    cluster_shape: tuple | None = None  # cta_layout_vmnk shape
    mcast_mode_mn: tuple | None = None
    multicast_signaling: bool = False
    defer_sync: bool = False
    full_op: str | None = None
    empty_op: str | None = None
    full_init: int | None = None  # arrive count written by mbarrier.init
    empty_init: int | None = None
    init_seq: int = 0
    index: int | None = None  # the layer's identity: creation order (what pipeline=N selects)
    via: str | None = None  # a library wrapper line between the kernel and create()
    # ops whose method in the pipeline's class does nothing: op -> "file:line" (layer.noop_ops)
    noop_ops: dict[str, str] = dataclasses.field(default_factory=dict)
    # producer_get_barrier calls: the kernel arrives / waits on the full barrier itself
    barrier_pointers: int = 0

    @property
    def cluster_size(self) -> int | None:
        return _prod(self.cluster_shape) if self.cluster_shape else 1

    @property
    def v_size(self) -> int:
        s = self.cluster_shape
        return s[0] if s and isinstance(s[0], int) else 1

    @property
    def mcast_size(self) -> int | None:
        """CTAs a consumer warp signals (PipelineTmaAsync.init_empty_barrier_arrive_signal)."""
        s, mode = self.cluster_shape, self.mcast_mode_mn or (1, 1)
        if not s or len(s) != 4 or not all(isinstance(x, int) for x in s):
            return None
        m = s[2] if mode[0] else 0
        n = s[1] if mode[1] else 0
        return max(m + n - (1 if mode[0] and mode[1] else 0), 1)


@dataclasses.dataclass
class Protocol:
    pipelines: dict[str, PipelineRecord] = dataclasses.field(default_factory=dict)
    events: list[Event] = dataclasses.field(default_factory=list)
    launch: dict[str, Any] = dataclasses.field(default_factory=dict)
    state_types: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)

    def of(self, kind: str, pipeline: str | None = None) -> list[Event]:
        return [
            e
            for e in self.events
            if e.kind == kind and (pipeline is None or e.pipeline == pipeline)
        ]

    @property
    def block_threads(self) -> int | None:
        return _prod(self.launch.get("block"))

    def pipeline_table(self) -> list[dict[str, Any]]:
        """The pipelines in creation order: index (``pipeline=N``), class, file:line."""
        rows = sorted(
            (p for p in self.pipelines.values() if p.index is not None), key=lambda p: p.index
        )
        return [
            {
                "index": p.index,
                "class": p.cls,
                "file": p.file,
                "line": p.line,
                "where": f"{os.path.basename(p.file or '?')}:{p.line}",
                "via": p.via,
                "stages": p.stages,
                "key": p.key,
            }
            for p in rows
        ]

    def to_json(self) -> dict[str, Any]:
        out = {
            "pipelines": {k: dataclasses.asdict(p) for k, p in self.pipelines.items()},
            "events": [dataclasses.asdict(e) for e in self.events],
            "launch": self.launch,
            "state_types": self.state_types,
            "notes": self.notes,
        }
        return json.loads(json.dumps(out, default=str))  # plain JSON types (lists, not tuples)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Protocol:
        p = cls(
            launch=d.get("launch", {}),
            state_types=d.get("state_types", {}),
            notes=d.get("notes", []),
        )
        for k, v in d.get("pipelines", {}).items():
            for f in ("producer_group", "consumer_group", "cluster_shape", "mcast_mode_mn"):
                if v.get(f) is not None:
                    v[f] = tuple(v[f])
            p.pipelines[k] = PipelineRecord(**v)
        for e in d.get("events", []):
            e["conds"] = tuple(e.get("conds", ()))
            p.events.append(Event(**e))
        return p


def _prod(xs: Any) -> int | None:
    if not xs:
        return None
    out = 1
    for x in xs:
        if not isinstance(x, int) or isinstance(x, bool):
            return None
        out *= x
    return out


def _static(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _static_tuple(x: Any) -> tuple | None:
    if x is None:
        return None
    if isinstance(x, int):
        return (x,)
    try:
        items = tuple(x)
    except TypeError:
        return None
    return tuple(_prod(i) if isinstance(i, tuple) else _static(i) for i in items)
