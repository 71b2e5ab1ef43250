"""Probes, host side: decoding the probe buffer, stall detection, the per-warp picture.

Imports neither cutlass nor torch (the runner decodes with it). The layout, the records and
the sites are in probe_layout.py, the diagnosis in probe_diagnosis.py, the stuck map
in reporting/stuck_map.py; ``probes`` re-exports every public name of this module.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cutedebug import records
from cutedebug.event import Event
from cutedebug.instrument.probe_layout import (
    BLOCK_MASK,
    HEADER_FMT,
    MAGIC,
    RECORD_BYTES,
    RECORD_FMT,
    RECORD_VALID,
    SEQ_MASK,
    STAGE_UNKNOWN,
    VERSION,
    ProbeConfig,
    Site,
    _as_sites,
    beacons_offset,
    buffer_nbytes,
    records_offset,
)

# ---------------------------------------------------------------------------------------------
# Host side: decoding
# ---------------------------------------------------------------------------------------------


@dataclass
class StuckRecord(records.Record):
    """What a bounded wait wrote when its time budget ran out (one per timed-out thread)."""

    site_id: int
    block: tuple[int, int, int]
    block_linear: int
    warp: int
    stage: int  # -1: unknown (raw wait)
    phase: int
    seq: int  # PipelineState.count + 1 at the wait; 0: unknown
    waited_ns: int
    smid: int
    lane: int
    globaltimer: int


@dataclass
class Beacon(records.Record):
    """A warp's last completed wait, as its beacon slot holds it."""

    cta: int  # linear block id of the last writer (mod 2**20)
    warp: int
    site_id: int
    stage: int  # -1: unknown (raw wait)
    phase: int
    seq: int  # PipelineState.count + 1 (mod 2**23), or a globaltimer tick for raw waits
    word: int


@dataclass
class ProbeSnapshot:
    stuck: list[StuckRecord] = field(default_factory=list)
    beacons: list[Beacon] = field(default_factory=list)
    progress_counter_total: int = 0
    n_stuck_reported: int = 0  # may exceed len(stuck) when records overflowed
    header_magic: int = 0
    max_ctas: int = 0  # beacon slots per warp: CTAs beyond it share slots (0: unknown)
    # decoded but left out of a bounded picture (snapshot_to_json), not dropped by the buffer
    stuck_unlisted: int = 0
    beacons_unlisted: int = 0

    @property
    def dropped_records(self) -> int:
        return max(0, self.n_stuck_reported - len(self.stuck) - self.stuck_unlisted)

    @property
    def complete(self) -> bool:
        """Every stuck report fitted and no two CTAs shared a beacon slot: a warp without an
        event then really completed no wait (else its events may be lost)."""
        wrapped = (
            self.max_ctas
            and any(b.cta >= self.max_ctas for b in self.beacons)
            or any(r.block_linear >= self.max_ctas for r in self.stuck if self.max_ctas)
        )
        return (
            not self.dropped_records
            and not self.stuck_unlisted
            and not self.beacons_unlisted
            and not wrapped
        )


def decode(buf: bytes | memoryview, cfg: ProbeConfig, sites: Any = None) -> ProbeSnapshot:
    """Decode a probe buffer. ``sites`` is accepted for symmetry and may be None."""
    mv = memoryview(buf).cast("B")
    need = buffer_nbytes(cfg)
    if len(mv) < need:
        raise ValueError(f"probe buffer has {len(mv)} bytes, layout needs {need}")
    magic, version, n_stuck, h_rec, h_ctas, h_warps, _ = struct.unpack_from(HEADER_FMT, mv, 0)
    if magic not in (0, MAGIC):
        raise ValueError(f"probe buffer header magic {magic:#x} is not {MAGIC:#x}")
    if magic and version != VERSION:
        raise ValueError(f"probe buffer version {version}, this decoder reads {VERSION}")
    if any(
        h and h != c
        for h, c in ((h_rec, cfg.max_records), (h_ctas, cfg.max_ctas), (h_warps, cfg.max_warps))
    ):
        raise ValueError("probe buffer header was written for another ProbeConfig")
    snap = ProbeSnapshot(n_stuck_reported=n_stuck, header_magic=magic, max_ctas=cfg.max_ctas)
    roff = records_offset(cfg)
    for i in range(min(n_stuck, cfg.max_records)):
        f = struct.unpack_from(RECORD_FMT, mv, roff + i * RECORD_BYTES)
        if f[0] != RECORD_VALID:
            continue  # claimed, not yet published
        stage = f[6]
        snap.stuck.append(
            StuckRecord(
                site_id=f[1],
                block=(f[2], f[3], f[4]),
                warp=f[5],
                stage=stage if stage >= 0 else -1,
                phase=f[7],
                waited_ns=f[8],
                globaltimer=f[9],
                smid=f[10],
                lane=f[11],
                seq=f[12],
                block_linear=f[13],
            )
        )
    nslots = cfg.max_ctas * cfg.max_warps
    words = struct.unpack_from(f"<{nslots}Q", mv, beacons_offset(cfg))
    total = 0
    for slot, w in enumerate(words):
        if not w:
            continue
        snap.beacons.append(unpack_beacon(w, slot % cfg.max_warps))
        total += w & SEQ_MASK
    snap.progress_counter_total = total + n_stuck
    return snap


def unpack_beacon(word: int, warp: int) -> Beacon:
    stage = (word >> 23) & 0xFF
    return Beacon(
        cta=(word >> 44) & BLOCK_MASK,
        warp=warp,
        site_id=((word >> 32) & 0xFFF) - 1,
        stage=-1 if stage == STAGE_UNKNOWN else stage,
        phase=(word >> 31) & 1,
        seq=word & SEQ_MASK,
        word=word,
    )


def progress_signature(snapshot: ProbeSnapshot) -> tuple:
    """Changes whenever any warp completes a wait or reports stuck (compare for equality)."""
    return (
        snapshot.n_stuck_reported,
        tuple(sorted((b.cta, b.warp, b.word) for b in snapshot.beacons)),
    )


class StallDetector:
    """Feed successive snapshots; ``stalled`` once nothing moved for ``stall_s`` seconds.

    "Moved" means any beacon word changed (a wait completed somewhere) or a stuck record
    appeared. A kernel that never completes any wait is stalled from its first snapshot.
    """

    def __init__(self, stall_s: float = 1.0):
        self.stall_s = stall_s
        self._sig: tuple | None = None
        self._since: float | None = None

    def update(self, snapshot: ProbeSnapshot, now: float) -> bool:
        sig = progress_signature(snapshot)
        if sig != self._sig or self._since is None:
            self._sig, self._since = sig, now
        return self.stalled_for(now) >= self.stall_s

    def stalled_for(self, now: float) -> float:
        return 0.0 if self._since is None else now - self._since


def detect_stall(snapshots: list[tuple[float, ProbeSnapshot]], stall_s: float) -> float | None:
    """Time at which the last stall began, if it lasted ``stall_s`` by the last snapshot."""
    det = StallDetector(stall_s)
    stalled = False
    for t, snap in snapshots:
        stalled = det.update(snap, t)
    return det._since if stalled else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbePicture(records.Record):
    """A probe snapshot as it travels: a ``progress`` event's ``picture``, a ``probe_report``
    event's payload (probe_diagnosis.snapshot_to_json), or a GPU core's picture (its own
    ``sites`` and stuck-map ``lines``; analyses/coredump_evidence.py). Keys the older
    recordings or a core's picture lack are records.later: read as the default, not written."""

    warps: list[dict[str, Any]] = records.later(default_factory=list)  # warp_evidence rows
    stuck: list[StuckRecord]
    beacons: list[Beacon]
    stuck_unlisted: int = records.later(0)  # decoded, left out of a bounded picture
    beacons_unlisted: int = records.later(0)
    progress_counter_total: int = records.later(0)
    n_stuck_reported: int  # counted on the device (may exceed the records kept)
    header_magic: int = records.later(0)
    max_ctas: int = records.later(0)
    diagnosis: list[str] = records.later(default_factory=list)
    sites: list[Site] | None = records.optional(None)  # a core's picture: its site table
    lines: list[str] | None = records.optional(None)  # a core's picture: its footnote
    after_cuda_error: bool = records.optional(False)  # probe_report: read after a fault
    absent: frozenset[str] = records.absent_keys()

    def snapshot(self) -> ProbeSnapshot:
        return ProbeSnapshot(
            stuck=list(self.stuck),
            beacons=list(self.beacons),
            progress_counter_total=self.progress_counter_total,
            n_stuck_reported=self.n_stuck_reported,
            header_magic=self.header_magic,
            max_ctas=self.max_ctas,
            stuck_unlisted=self.stuck_unlisted,
            beacons_unlisted=self.beacons_unlisted,
        )


def snapshot_from_json(d: Any) -> ProbeSnapshot:
    """A probe picture (or a ``probe_report`` event, whose payload is one) as a snapshot, read
    strictly (RecordError naming the field)."""
    if isinstance(d, Mapping) and "event" in d:
        d = Event.from_json(dict(d)).fields
    return ProbePicture.from_json(d).snapshot()


# ---------------------------------------------------------------------------------------------
# Host side: per-warp picture and diagnosis
# ---------------------------------------------------------------------------------------------


@dataclass
class WarpView:
    cta: int
    warp: int
    block: tuple[int, int, int] | None = None
    stuck: StuckRecord | None = None
    last: Beacon | None = None

    def site_of(self, by_id: dict[int, Site]) -> Site | None:
        sid = self.stuck.site_id if self.stuck else self.last.site_id if self.last else None
        return by_id.get(sid) if sid is not None else None

    def role(self, by_id: dict[int, Site]) -> str:
        site = self.site_of(by_id)
        return site.role if site else "?"

    @property
    def state(self) -> str:
        return "stuck" if self.stuck else "progressed" if self.last else "idle"


def warp_evidence(
    snapshot: ProbeSnapshot, sites: Any = None, limit: int = 256
) -> list[dict[str, Any]]:
    """Per (CTA, warp): role, state, last completed event, stuck site; stuck warps first."""
    by_id = _as_sites(sites)
    rows = []
    views = sorted(warp_views(snapshot).values(), key=lambda v: (v.stuck is None, v.cta, v.warp))
    for v in views[:limit]:
        row: dict[str, Any] = {
            "cta": v.cta,
            "block": v.block,
            "warp": v.warp,
            "role": v.role(by_id),
            "state": v.state,
        }
        if v.last:
            site = by_id.get(v.last.site_id)
            row["last"] = {
                "site": v.last.site_id,
                "stage": v.last.stage,
                "phase": v.last.phase,
                "seq": v.last.seq,
                "desc": site.describe(v.last.stage, v.last.phase) if site else None,
            }
        if v.stuck:
            r, site = v.stuck, by_id.get(v.stuck.site_id)
            row["stuck"] = {
                "site": r.site_id,
                "stage": r.stage,
                "phase": r.phase,
                "seq": r.seq,
                "waited_ms": round(r.waited_ns / 1e6, 3),
                "smid": r.smid,
                "op": site.op if site else None,
                "barrier": site.barrier if site else None,
                "where": site.where if site else None,
                "desc": site.describe(r.stage, r.phase) if site else None,
            }
        rows.append(row)
    return rows


def warp_views(snapshot: ProbeSnapshot) -> dict[tuple[int, int], WarpView]:
    views: dict[tuple[int, int], WarpView] = {}
    for b in snapshot.beacons:
        views[(b.cta, b.warp)] = WarpView(cta=b.cta, warp=b.warp, last=b)
    for r in snapshot.stuck:
        key = (r.block_linear & BLOCK_MASK, r.warp)
        v = views.setdefault(key, WarpView(cta=key[0], warp=r.warp))
        v.block = r.block
        if v.stuck is None or r.globaltimer < v.stuck.globaltimer:
            v.stuck = r
    return views


def site_table_text(sites: Any) -> str:
    by_id = _as_sites(sites)
    return "\n".join(
        f"site {s.id}: {s.describe()} {s.pipeline_class} {s.pipeline_name!r} "
        f"stages={s.stages} arrive={s.arrive_count} tx={s.tx_count} | {s.code}"
        for s in by_id.values()
    )


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)
