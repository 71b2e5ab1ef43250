"""Probes: the buffer layout, the config and the site table (shared by the device code, the
trace-time instrumenter and the host side; no cutlass, no torch). See probes.py."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field, replace
from typing import Any

from cutedebug import records

MAGIC = 0x42504443  # b"CDPB" read as a little-endian u32
VERSION = 1
HEADER_FMT = "<IIIIIIQ"
HEADER_BYTES = 64
BEACON_BYTES = 8
RECORD_VALID = 0x4B435453  # b"STCK"
# valid, site, block x/y/z, warp, stage, phase, waited_ns, globaltimer, smid, lane, seq, linear
RECORD_FMT = "<IIIIIIiIQQIIII"
RECORD_BYTES = 64
assert struct.calcsize(RECORD_FMT) == RECORD_BYTES

SEQ_BITS = 23
SEQ_MASK = (1 << SEQ_BITS) - 1
STAGE_UNKNOWN = 0xFF
SITE_BITS = 12
MAX_SITES = (1 << SITE_BITS) - 1
BLOCK_MASK = (1 << 20) - 1


@dataclass
class ProbeConfig:
    """Probe settings. With ``size_from_grid`` (and an ``allocate`` callback to
    ``instrument``), the beacon table and the record area are sized at trace time from the
    kernel's launch: one slot per (CTA, warp) and one record per warp of the grid, so no stuck
    report is ever dropped (up to MAX_AUTO_RECORDS); the fixed sizes below are used when the
    grid is a run-time value, or when a buffer address is given instead."""

    budget_ns: int = 500_000_000
    beacons: bool = True
    max_ctas: int = 1024
    max_warps: int = 32
    max_records: int = 1024
    size_from_grid: bool = True


MAX_AUTO_RECORDS = 1 << 18  # 16 MiB of records: 16384 CTAs of 16 warps
MAX_AUTO_CTAS = 1 << 16
# A grid known only at run time (a library's dynamic shapes): room for this many CTAs.
RUNTIME_GRID_CTAS = 1 << 13


def sized_for_grid(cfg: ProbeConfig, grid: Any, block: Any) -> ProbeConfig:
    """The config for a launch of ``grid`` CTAs of ``block`` threads: one beacon slot per
    (CTA, warp) and one record per warp, so no stuck report is dropped. A grid that is a
    run-time value gets room for RUNTIME_GRID_CTAS CTAs (more share beacon slots and may drop
    records: the diagnosis then says their state is unknown); ``cfg`` unchanged when the block
    is a run-time value or sizing is off."""
    threads = _prod(block)
    if not cfg.size_from_grid or not threads:
        return cfg
    ctas = _prod(grid) or RUNTIME_GRID_CTAS
    warps = -(-threads // 32)
    ctas = min(ctas, MAX_AUTO_CTAS)
    return ProbeConfig(
        budget_ns=cfg.budget_ns,
        beacons=cfg.beacons,
        max_ctas=ctas,
        max_warps=warps,
        max_records=min(ctas * warps, MAX_AUTO_RECORDS),
        size_from_grid=cfg.size_from_grid,
    )


def _prod(xs: Any) -> int | None:
    try:
        items = tuple(xs)
    except TypeError:
        return None
    out = 1
    for x in items:
        # a DSL numeric known at trace time (Int32(132)) holds a Python int
        x = _static_int(x) if _static_int(x) is not None else _static_int(getattr(x, "value", None))
        if x is None:
            return None
        out *= x
    return out


def beacons_offset(cfg: ProbeConfig) -> int:
    return HEADER_BYTES


def records_offset(cfg: ProbeConfig) -> int:
    return HEADER_BYTES + cfg.max_ctas * cfg.max_warps * BEACON_BYTES


def buffer_nbytes(cfg: ProbeConfig) -> int:
    return records_offset(cfg) + cfg.max_records * RECORD_BYTES


def init_buffer(buf: Any, cfg: ProbeConfig) -> None:
    """Write the header into a writable buffer (bytearray, memoryview, numpy array)."""
    mv = memoryview(buf).cast("B")
    struct.pack_into(
        HEADER_FMT,
        mv,
        0,
        MAGIC,
        VERSION,
        0,
        cfg.max_records,
        cfg.max_ctas,
        cfg.max_warps,
        cfg.budget_ns,
    )


def pack_beacon(site_id: int, stage: int | None, phase: int, seq: int, block: int) -> int:
    """The u64 a warp stores after a completed wait (the device computes the same bits)."""
    st = STAGE_UNKNOWN if stage is None or stage < 0 else stage & 0xFF
    return (
        (seq & SEQ_MASK)
        | (st << 23)
        | ((phase & 1) << 31)
        | ((site_id + 1) << 32)
        | ((block & BLOCK_MASK) << 44)
    )


# ---------------------------------------------------------------------------------------------
# Sites
# ---------------------------------------------------------------------------------------------


@dataclass
class Site(records.Record):
    """One instrumented wait in the kernel source, numbered at trace time."""

    id: int
    kind: str  # "pipeline" (MbarrierArray.wait) | "raw" (cute.arch.mbarrier_wait)
    op: str  # producer_acquire | consumer_wait | producer_tail | raw_wait | ...
    barrier: str  # "full" | "empty" | "" (raw)
    pipeline_class: str = ""
    pipeline_name: str = ""
    file: str = ""
    line: int = 0
    function: str = ""
    code: str = ""
    stages: int | None = None
    arrive_count: int | None = None
    tx_count: int | None = None
    # added after the first recorded runs (tests/data/runs): an older file reads the default
    pipeline_index: int | None = records.later(None)  # the layer's pipeline (create() order)
    via: str = records.later("")  # the library wrapper line between the kernel's call and wait
    tx_bytes: int | None = records.later(None)  # raw_op sites: the expect_tx bytes (static)
    # `cutedebug exec` (instrument/launch.py): the @cute.kernel the site was traced in
    kernel: str | None = records.optional(None)
    symbol: str | None = records.optional(None)
    absent: frozenset[str] = records.absent_keys()

    @property
    def role(self) -> str:
        if self.op.startswith("producer"):
            return "producer"
        if self.op.startswith("consumer") or self.op == "raw_wait":
            # a raw wait consumes what other threads arrive / expect_tx / complete_tx on it
            return "consumer"
        if self.kind == "raw_op":
            return "producer"
        return "waiter"

    @property
    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    @property
    def pipeline_key(self) -> tuple:
        # The layer's identity when known (rebuilt pipeline objects keep it through their
        # barrier arrays), else what is static.
        if self.pipeline_index is not None:
            return ("pipeline", self.pipeline_index)
        return (self.pipeline_class, self.pipeline_name, self.stages)

    def describe(self, stage: int | None = None, phase: int | None = None) -> str:
        bar = self.barrier or "mbarrier"
        idx = f"[{stage}]" if stage is not None and stage >= 0 else ""
        ph = f" phase {phase}" if phase is not None else ""
        return f"{self.op} {bar}{idx}{ph} ({self.where})"


_KEY = (
    "kind",
    "op",
    "barrier",
    "pipeline_class",
    "pipeline_name",
    "file",
    "line",
    "stages",
    "pipeline_index",
)


@dataclass
class SiteTable:
    """The instrumented waits (``sites``, ids baked into the device code) and the raw mbarrier
    operations the kernel traced besides them (``raw_ops``: arrive, expect_tx, complete_tx
    senders, init; no device code, numbered after the waits in JSON)."""

    sites: list[Site] = field(default_factory=list)
    raw_ops: list[Site] = field(default_factory=list)
    config: ProbeConfig | None = None  # the layout the device code was built for
    buffer: Any = None  # what the allocate callback returned
    _by_key: dict[tuple, int] = field(default_factory=dict, repr=False)

    def add(self, **kw: Any) -> Site:
        key = tuple(kw.get(k) for k in _KEY)
        if key in self._by_key:
            return self.sites[self._by_key[key]]
        if len(self.sites) >= MAX_SITES:
            raise RuntimeError(f"cutedebug probes: more than {MAX_SITES} wait sites")
        site = Site(id=len(self.sites), **kw)
        self._by_key[key] = site.id
        self.sites.append(site)
        return site

    def add_raw_op(self, **kw: Any) -> None:
        key = tuple(kw.get(k) for k in _KEY)
        if all(tuple(getattr(o, k) for k in _KEY) != key for o in self.raw_ops):
            self.raw_ops.append(Site(id=-1, kind="raw_op", **kw))

    def to_json(self) -> list[dict[str, Any]]:
        n = len(self.sites)
        return [s.to_json() for s in self.sites] + [
            {**o.to_json(), "id": n + i} for i, o in enumerate(self.raw_ops)
        ]

    @classmethod
    def from_json(cls, items: list[dict[str, Any]]) -> SiteTable:
        t = cls()
        for d in items:
            s = Site.from_json(d)
            if s.kind == "raw_op":
                t.raw_ops.append(s)
                continue
            t._by_key[tuple(getattr(s, k) for k in _KEY)] = len(t.sites)
            t.sites.append(s)
        return t


def _as_sites(sites: Any) -> dict[int, Site]:
    if sites is None:
        return {}
    if isinstance(sites, dict):  # already {id: Site}
        sites = sites.values()
    if isinstance(sites, SiteTable):  # raw ops numbered after the waits, as in its JSON
        n = len(sites.sites)
        sites = [
            *sites.sites,
            *(replace(o, id=n + i) for i, o in enumerate(sites.raw_ops)),
        ]
    out = {}
    for s in sites:
        s = s if isinstance(s, Site) else Site.from_json(s)
        out[s.id] = s
    return out


def _static_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


WAIT_OPS = ("producer_acquire", "consumer_wait", "producer_tail")
RAW_OPS = (
    "mbarrier_init",
    "mbarrier_arrive",
    "mbarrier_arrive_and_expect_tx",
    "mbarrier_expect_tx",
    "store_async_dsmem",
)
