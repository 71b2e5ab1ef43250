"""Probes: hangs that report where they are stuck.

Trace-time instrumentation, active only inside ``instrument(cfg, buffer_addr)`` around
``cute.compile``; every patch is restored on exit. While active:

- every mbarrier wait (``MbarrierArray.wait`` under cutlass.pipeline, and raw
  ``cute.arch.mbarrier_wait`` wherever that name was imported) becomes a try_wait loop bounded by
  ``cfg.budget_ns`` of ``%globaltimer``. On timeout the lowest timed-out lane of the warp writes a
  stuck record with system-scope stores into a host-mapped buffer, printfs one line, and every
  timed-out thread exits, so the grid finishes, printf flushes and the context stays usable;
- after each completed wait, lane 0 stores one 64-bit beacon (site, stage, phase, sequence) into
  the slot of its (CTA, warp): the host reads the buffer live while the kernel is still stuck.

The fast path (barrier already complete) costs one try_wait and, with beacons on, one
``st.relaxed.sys.b64`` by lane 0; ``%globaltimer`` is read only once a wait has to spin.

Buffer layout (little endian; ``buffer_nbytes(cfg)`` bytes; the worker allocates it zeroed,
pinned, and passes ``data_ptr()``: under UVA a pinned host pointer is a valid device address):

    header   64 B   u32 magic "CDPB" | u32 version | u32 n_stuck (sys-scope atomic counter of
                    stuck reports, may exceed max_records) | u32 max_records | u32 max_ctas |
                    u32 max_warps | u64 budget_ns | reserved. The device writes magic/version with
                    its first stuck record; ``init_buffer`` writes all of it (optional).
    beacons  max_ctas * max_warps * 8 B, slot = (linear_block % max_ctas) * max_warps
                    + warp % max_warps; one u64 each, see ``pack_beacon``:
                    bits 0..22  seq: PipelineState.count + 1 of the completed wait (mod 2**23);
                                for waits without a PipelineState, %globaltimer >> 10 (a tick)
                    bits 23..30 stage (255: unknown, raw wait)   bit 31 phase
                    bits 32..43 site id + 1 (0: slot never written)
                    bits 44..63 linear block id (mod 2**20): CTAs beyond max_ctas share slots, the
                                last writer wins, its block id says who it was.
    records  max_records * 64 B, see ``RECORD_FMT``; a record is complete once its first word
                    holds RECORD_VALID (stored last, with release semantics).

Host side (this module imports no cutlass/torch at module level; the runner imports it to
decode): ``decode`` → ``ProbeSnapshot``; ``StallDetector`` (no beacon moved for ``stall_s``);
``diagnose`` (one line per recognized pattern). The stuck map is drawn from the same snapshot
by ``cutedebug.reporting.stuck_map``.

Limits: waits the probes cannot bound (named barriers, flag spins, TMEM allocation) only show
as a stall of the beacons; a wait executed by lanes that exclude lane 0 leaves no beacon.
"""

from __future__ import annotations

import contextlib
import functools
import json
import linecache
import os
import struct
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Any

from cutedebug.instrument import frames

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
    budget_ns: int = 500_000_000
    beacons: bool = True
    max_ctas: int = 1024
    max_warps: int = 32
    max_records: int = 1024


def beacons_offset(cfg: ProbeConfig) -> int:
    return HEADER_BYTES


def records_offset(cfg: ProbeConfig) -> int:
    return HEADER_BYTES + cfg.max_ctas * cfg.max_warps * BEACON_BYTES


def buffer_nbytes(cfg: ProbeConfig) -> int:
    return records_offset(cfg) + cfg.max_records * RECORD_BYTES


def init_buffer(buf: Any, cfg: ProbeConfig) -> None:
    """Write the header into a writable buffer (bytearray, memoryview, numpy array)."""
    mv = memoryview(buf).cast("B")
    struct.pack_into(HEADER_FMT, mv, 0, MAGIC, VERSION, 0, cfg.max_records, cfg.max_ctas,
                     cfg.max_warps, cfg.budget_ns)


def pack_beacon(site_id: int, stage: int | None, phase: int, seq: int, block: int) -> int:
    """The u64 a warp stores after a completed wait (the device computes the same bits)."""
    st = STAGE_UNKNOWN if stage is None or stage < 0 else stage & 0xFF
    return ((seq & SEQ_MASK) | (st << 23) | ((phase & 1) << 31) | ((site_id + 1) << 32)
            | ((block & BLOCK_MASK) << 44))


# ---------------------------------------------------------------------------------------------
# Sites
# ---------------------------------------------------------------------------------------------


@dataclass
class Site:
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

    @property
    def role(self) -> str:
        if self.op.startswith("producer"):
            return "producer"
        if self.op.startswith("consumer"):
            return "consumer"
        return "waiter"

    @property
    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    @property
    def pipeline_key(self) -> tuple[str, str, int | None]:
        # Pipeline objects are rebuilt across dynamic loops, so group by what is static.
        return (self.pipeline_class, self.pipeline_name, self.stages)

    def describe(self, stage: int | None = None, phase: int | None = None) -> str:
        bar = self.barrier or "mbarrier"
        idx = f"[{stage}]" if stage is not None and stage >= 0 else ""
        ph = f" phase {phase}" if phase is not None else ""
        return f"{self.op} {bar}{idx}{ph} ({self.where})"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Site:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class SiteTable:
    sites: list[Site] = field(default_factory=list)
    _by_key: dict[tuple, int] = field(default_factory=dict, repr=False)

    def add(self, **kw: Any) -> Site:
        key = tuple(kw.get(k) for k in ("kind", "op", "barrier", "pipeline_class",
                                        "pipeline_name", "file", "line", "stages"))
        if key in self._by_key:
            return self.sites[self._by_key[key]]
        if len(self.sites) >= MAX_SITES:
            raise RuntimeError(f"cutedebug probes: more than {MAX_SITES} wait sites")
        site = Site(id=len(self.sites), **kw)
        self._by_key[key] = site.id
        self.sites.append(site)
        return site

    def to_json(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.sites]

    @classmethod
    def from_json(cls, items: list[dict[str, Any]]) -> SiteTable:
        t = cls()
        for d in items:
            s = Site.from_json(d)
            t._by_key[(s.kind, s.op, s.barrier, s.pipeline_class, s.pipeline_name, s.file,
                       s.line, s.stages)] = len(t.sites)
            t.sites.append(s)
        return t


def _as_sites(sites: Any) -> dict[int, Site]:
    if sites is None:
        return {}
    if isinstance(sites, SiteTable):
        sites = sites.sites
    elif isinstance(sites, dict):  # already {id: Site}
        sites = sites.values()
    out = {}
    for s in sites:
        s = s if isinstance(s, Site) else Site.from_json(s)
        out[s.id] = s
    return out


def _static_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


PIPELINE_OPS = ("producer_acquire", "consumer_wait", "producer_tail")


def _locate(skip: int) -> tuple[Any, Any]:
    """(pipeline-method frame or None, first frame outside cutlass/cutedebug).

    The pipeline frame is the innermost frame named like a known op whose ``self`` is a
    pipeline (a fault's wrapper around producer_tail keeps the op right), else the innermost
    frame whose ``self`` is a pipeline."""
    f = sys._getframe(skip + 1)
    nearest = named = None
    while f is not None:
        if named is None and f.f_code.co_name != "<lambda>":
            obj = f.f_locals.get("self")
            if obj is not None and hasattr(obj, "sync_object_full"):
                nearest = nearest or f
                if f.f_code.co_name in PIPELINE_OPS:
                    named = f
        if not frames.is_library(f.f_code.co_filename):
            return named or nearest, f
        f = f.f_back
    return named or nearest, None


def _source_fields(src: Any) -> dict[str, Any]:
    if src is None:
        return {"file": "", "line": 0, "function": "", "code": ""}
    file, line = src.f_code.co_filename, src.f_lineno
    return {"file": file, "line": line, "function": src.f_code.co_name,
            "code": linecache.getline(file, line).strip()}


# ---------------------------------------------------------------------------------------------
# Trace-time instrumentation
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """Everything the device code needs, as compile-time constants."""

    addr: int
    budget_ns: int
    beacons: bool
    max_ctas: int
    max_warps: int
    max_records: int
    beacons_off: int
    records_off: int


@functools.cache
def device_ids() -> Any:
    """The @cute.jit helpers that say who is running, shared with checkpoint.py's marks.

    - ``lowest_active_lane()``: true in one lane of the active ones (the writer of a record);
    - ``warp_id()``: linear thread index // 32, without make_warp_uniform's shfl.sync: these
      run in one lane;
    - ``linear_block_id()``: bx + gx * (by + gy * bz);
    - ``warp_slot(linear, warp, max_ctas, max_warps)``: the (CTA, warp) slot of a per-warp
      table of max_ctas x max_warps entries (wrapping).
    """
    import cutlass
    from cutlass import Uint32, cute

    @cute.jit
    def lowest_active_lane():
        active = cute.arch.inline_ptx("activemask.b32 {$w0};", write_only_types=[Uint32])
        return (active & cute.arch.lanemask_lt()) == Uint32(0)

    @cute.jit
    def warp_id():
        tx, ty, tz = cute.arch.thread_idx()
        nx, ny, _ = cute.arch.block_dim()
        return Uint32(tx + nx * (ty + ny * tz)) >> Uint32(5)

    @cute.jit
    def linear_block_id():
        bx, by, bz = cute.arch.block_idx()
        gx, gy, _ = cute.arch.grid_dim()
        return bx + gx * (by + gy * bz)

    @cute.jit
    def warp_slot(linear, warp, max_ctas: cutlass.Constexpr, max_warps: cutlass.Constexpr):
        return (linear % Uint32(max_ctas)) * Uint32(max_warps) + warp % Uint32(max_warps)

    return SimpleNamespace(lowest_active_lane=lowest_active_lane, warp_id=warp_id,
                           linear_block_id=linear_block_id, warp_slot=warp_slot)


@functools.cache
def _device() -> Any:
    """Build the @cute.jit device helpers once (cutlass is imported only here)."""
    import cutlass
    from cutlass import Int32, Int64, Uint32, Uint64, cute

    gmem = cute.AddressSpace.gmem

    ids = device_ids()
    warp_id, linear_block_id = ids.warp_id, ids.linear_block_id

    @cute.jit
    def report_stuck(phase, stage, seq, waited, site: cutlass.Constexpr, plan: cutlass.Constexpr,
                     banner: cutlass.Constexpr):
        """Lowest timed-out lane: claim a record slot, fill it, publish it, printf one line."""
        if ids.lowest_active_lane():
            now = cute.arch.globaltimer()
            bx, by, bz = cute.arch.block_idx()
            warp = warp_id()
            smid = cute.arch.smid()
            lane = cute.arch.lane_idx()
            linear = linear_block_id()
            hdr = cute.make_ptr(Uint32, plan.addr, gmem, assumed_align=8)
            cute.arch.store(hdr, Uint32(MAGIC), sem="relaxed", scope="sys")
            cute.arch.store(hdr + 1, Uint32(VERSION), sem="relaxed", scope="sys")
            slot = cute.arch.atomic_add(hdr + 2, Uint32(1), sem="relaxed", scope="sys")
            if slot < Uint32(plan.max_records):
                base = Int64(plan.addr + plan.records_off) + Int64(slot) * RECORD_BYTES
                rec = cute.make_ptr(Uint32, base, gmem, assumed_align=8)
                rec64 = cute.make_ptr(Uint64, base, gmem, assumed_align=8)
                cute.arch.store(rec + 1, Uint32(site), sem="relaxed", scope="sys")
                cute.arch.store(rec + 2, Uint32(bx), sem="relaxed", scope="sys")
                cute.arch.store(rec + 3, Uint32(by), sem="relaxed", scope="sys")
                cute.arch.store(rec + 4, Uint32(bz), sem="relaxed", scope="sys")
                cute.arch.store(rec + 5, Uint32(warp), sem="relaxed", scope="sys")
                cute.arch.store(rec + 6, Uint32(stage), sem="relaxed", scope="sys")
                cute.arch.store(rec + 7, Uint32(phase), sem="relaxed", scope="sys")
                cute.arch.store(rec64 + 4, Uint64(waited), sem="relaxed", scope="sys")
                cute.arch.store(rec64 + 5, Uint64(now), sem="relaxed", scope="sys")
                cute.arch.store(rec + 12, Uint32(smid), sem="relaxed", scope="sys")
                cute.arch.store(rec + 13, Uint32(lane), sem="relaxed", scope="sys")
                cute.arch.store(rec + 14, Uint32(seq), sem="relaxed", scope="sys")
                cute.arch.store(rec + 15, Uint32(linear), sem="relaxed", scope="sys")
                cute.arch.store(rec, Uint32(RECORD_VALID), sem="release", scope="sys")
            cute.printf(banner + " block=(%d,%d,%d) warp=%d stage=%d phase=%d seq=%d "
                        "waited_ns=%lld smid=%d", Int32(bx), Int32(by), Int32(bz), Int32(warp),
                        Int32(stage), Int32(phase), Int32(seq), Int64(waited), Int32(smid))

    @cute.jit
    def write_beacon(phase, stage, seq, site: cutlass.Constexpr, plan: cutlass.Constexpr):
        linear = Uint32(linear_block_id())
        slot = ids.warp_slot(linear, warp_id(), plan.max_ctas, plan.max_warps)
        word = (
            (Uint64(seq) & Uint64(SEQ_MASK))
            | ((Uint64(stage) & Uint64(0xFF)) << Uint64(23))
            | ((Uint64(phase) & Uint64(1)) << Uint64(31))
            | Uint64((site + 1) << 32)
            | ((Uint64(linear) & Uint64(BLOCK_MASK)) << Uint64(44))
        )
        ptr = cute.make_ptr(Uint64, Int64(plan.addr + plan.beacons_off) + Int64(slot) * 8, gmem,
                            assumed_align=8)
        cute.arch.store(ptr, word, sem="relaxed", scope="sys")

    @cute.jit
    def bounded_wait(mbar_ptr, phase, stage, seq, site: cutlass.Constexpr,
                     plan: cutlass.Constexpr, banner: cutlass.Constexpr,
                     timed_seq: cutlass.Constexpr):
        done = cute.arch.mbarrier_try_wait(mbar_ptr, phase)
        if not done:
            t0 = cute.arch.globaltimer()
            waited = Int64(0)
            while not done and waited < plan.budget_ns:
                done = cute.arch.mbarrier_try_wait(mbar_ptr, phase)
                waited = cute.arch.globaltimer() - t0
            if not done:
                report_stuck(phase, stage, seq, waited, site, plan, banner)
                cute.arch.inline_ptx("exit;")
        if cutlass.const_expr(plan.beacons):  # noqa: SIM102  (static test, then a staged one)
            if cute.arch.lane_idx() == 0:
                if cutlass.const_expr(timed_seq):
                    write_beacon(phase, stage, Int32(cute.arch.globaltimer() >> 10), site, plan)
                else:
                    write_beacon(phase, stage, seq, site, plan)

    return SimpleNamespace(bounded_wait=bounded_wait, Int32=Int32)


def _banner(site: Site) -> str:
    text = f"cutedebug: STUCK site {site.id} {site.op} {site.barrier or 'mbarrier'} at {site.where}"
    return text.replace("%", "%%").replace("{", "(").replace("}", ")")


class _Instrumenter:
    def __init__(self, cfg: ProbeConfig, buffer_addr: int):
        if cfg.budget_ns <= 0 or cfg.max_ctas <= 0 or cfg.max_warps <= 0 or cfg.max_records <= 0:
            raise ValueError(f"invalid ProbeConfig: {cfg}")
        self.plan = _Plan(addr=int(buffer_addr), budget_ns=int(cfg.budget_ns),
                          beacons=bool(cfg.beacons), max_ctas=int(cfg.max_ctas),
                          max_warps=int(cfg.max_warps), max_records=int(cfg.max_records),
                          beacons_off=beacons_offset(cfg), records_off=records_offset(cfg))
        self.table = SiteTable()

    def _emit(self, mbar_ptr: Any, phase: Any, stage: Any, state: Any, site: Site) -> None:
        dev = _device()
        count = getattr(state, "_count", None) if state is not None else None
        seq = dev.Int32(count) + 1 if count is not None else dev.Int32(0)
        dev.bounded_wait(mbar_ptr, dev.Int32(phase), dev.Int32(stage), seq, site.id, self.plan,
                         _banner(site), count is None)

    def pipeline_wait(self, mbar_array: Any, index: Any, phase: Any, loc: Any, ip: Any) -> None:
        fields = pipeline_wait_fields(mbar_array, skip=1)
        state = fields.pop("state")
        site = self.table.add(kind="pipeline", **fields)
        ptr = mbar_array.get_barrier(index, loc=loc, ip=ip)
        self._emit(ptr, phase, index, state, site)

    def raw_wait(self, mbar_ptr: Any, phase: Any) -> None:
        fields = raw_wait_fields(skip=1)
        state = fields.pop("state")
        site = self.table.add(kind="raw", **fields)
        self._emit(mbar_ptr, phase, -1, state, site)


def pipeline_wait_fields(mbar_array: Any, skip: int = 0) -> dict[str, Any]:
    """A pipeline wait's site fields (op, full/empty, pipeline, kernel file:line) and its
    PipelineState (key "state"), from the frames above the caller (``skip`` more frames up)."""
    pipe_frame, src = _locate(skip + 2)
    pipe = pipe_frame.f_locals["self"] if pipe_frame is not None else None
    state = pipe_frame.f_locals.get("state") if pipe_frame is not None else None
    if pipe is not None and getattr(pipe, "sync_object_full", None) is mbar_array:
        barrier = "full"
    elif pipe is not None and getattr(pipe, "sync_object_empty", None) is mbar_array:
        barrier = "empty"
    else:
        barrier = (getattr(mbar_array, "name", "") or "").rpartition(".")[2]
    name = getattr(mbar_array, "name", "") or ""
    return dict(op=pipe_frame.f_code.co_name if pipe_frame else "wait",
                barrier=barrier, pipeline_class=type(pipe).__name__ if pipe is not None else "",
                pipeline_name=name.rpartition(".")[0] if "." in name else name,
                stages=_static_int(getattr(mbar_array, "num_stages", None)),
                arrive_count=_static_int(getattr(mbar_array, "arrive_count", None)),
                tx_count=_static_int(getattr(mbar_array, "tx_count", None)) or None,
                state=state, **_source_fields(src))


def raw_wait_fields(skip: int = 0) -> dict[str, Any]:
    """A raw mbarrier wait's site fields and PipelineState (key "state"), as above."""
    pipe_frame, src = _locate(skip + 2)
    op, cls_name, barrier, state = "raw_wait", "", "", None
    if pipe_frame is not None:  # e.g. PipelineOrder.wait calls cute.arch.mbarrier_wait
        cls_name = type(pipe_frame.f_locals["self"]).__name__
        op = f"{cls_name.removeprefix('Pipeline').lower()}_{pipe_frame.f_code.co_name}"
        barrier, state = "full", pipe_frame.f_locals.get("state")
    return dict(op=op, barrier=barrier, pipeline_class=cls_name, pipeline_name="", stages=None,
                arrive_count=None, tx_count=None, state=state, **_source_fields(src))


_ACTIVE: list[_Instrumenter] = []


@contextlib.contextmanager
def instrument(cfg: ProbeConfig, buffer_addr: int) -> Iterator[SiteTable]:
    """Bound every mbarrier wait traced inside this context; yields the SiteTable it fills."""
    if _ACTIVE:
        raise RuntimeError("cutedebug probes: instrument() is already active")
    import cutlass.cute.arch.mbar as mbar_mod
    from cutlass.pipeline import helpers

    inst = _Instrumenter(cfg, buffer_addr)
    orig_wait = mbar_mod.mbarrier_wait
    orig_array_wait = helpers.MbarrierArray.__dict__["wait"]

    def mbarrier_wait(mbar_ptr, phase, *, loc=None, ip=None):
        inst.raw_wait(mbar_ptr, phase)

    def wait(self, index, phase, *, loc=None, ip=None):
        with self._mbar_scope("wait"):
            inst.pipeline_wait(self, index, phase, loc, ip)

    mbarrier_wait.__doc__ = "cutedebug: bounded " + (orig_wait.__doc__ or "")
    # The name was imported into many namespaces (cute.arch, kernels' `from ... import`).
    patched: list[tuple[dict, str]] = []
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for name, val in list(d.items()):
            if val is orig_wait:
                d[name] = mbarrier_wait
                patched.append((d, name))
    helpers.MbarrierArray.wait = wait
    _ACTIVE.append(inst)
    try:
        yield inst.table
    finally:
        _ACTIVE.clear()
        helpers.MbarrierArray.wait = orig_array_wait
        for d, name in patched:
            if d.get(name) is mbarrier_wait:
                d[name] = orig_wait


# ---------------------------------------------------------------------------------------------
# Host side: decoding
# ---------------------------------------------------------------------------------------------


@dataclass
class StuckRecord:
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
class Beacon:
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

    @property
    def dropped_records(self) -> int:
        return max(0, self.n_stuck_reported - len(self.stuck))


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
    if any(h and h != c for h, c in ((h_rec, cfg.max_records), (h_ctas, cfg.max_ctas),
                                     (h_warps, cfg.max_warps))):
        raise ValueError("probe buffer header was written for another ProbeConfig")
    snap = ProbeSnapshot(n_stuck_reported=n_stuck, header_magic=magic)
    roff = records_offset(cfg)
    for i in range(min(n_stuck, cfg.max_records)):
        f = struct.unpack_from(RECORD_FMT, mv, roff + i * RECORD_BYTES)
        if f[0] != RECORD_VALID:
            continue  # claimed, not yet published
        stage = f[6]
        snap.stuck.append(StuckRecord(
            site_id=f[1], block=(f[2], f[3], f[4]), warp=f[5], stage=stage if stage >= 0 else -1,
            phase=f[7], waited_ns=f[8], globaltimer=f[9], smid=f[10], lane=f[11], seq=f[12],
            block_linear=f[13]))
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
    return Beacon(cta=(word >> 44) & BLOCK_MASK, warp=warp,
                  site_id=((word >> 32) & 0xFFF) - 1,
                  stage=-1 if stage == STAGE_UNKNOWN else stage, phase=(word >> 31) & 1,
                  seq=word & SEQ_MASK, word=word)


def progress_signature(snapshot: ProbeSnapshot) -> tuple:
    """Changes whenever any warp completes a wait or reports stuck (compare for equality)."""
    return (snapshot.n_stuck_reported, tuple(sorted((b.cta, b.warp, b.word)
                                                    for b in snapshot.beacons)))


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


def snapshot_to_json(snapshot: ProbeSnapshot, sites: Any = None) -> dict[str, Any]:
    by_id = _as_sites(sites)
    return {
        "warps": warp_evidence(snapshot, by_id),
        "stuck": [asdict(r) for r in snapshot.stuck],
        "beacons": [asdict(b) for b in snapshot.beacons],
        "progress_counter_total": snapshot.progress_counter_total,
        "n_stuck_reported": snapshot.n_stuck_reported,
        "header_magic": snapshot.header_magic,
        "diagnosis": diagnose(snapshot, by_id) if by_id or snapshot.stuck else [],
    }


def snapshot_from_json(d: dict[str, Any]) -> ProbeSnapshot:
    stuck = [StuckRecord(**{**r, "block": tuple(r["block"])}) for r in d.get("stuck", [])]
    return ProbeSnapshot(stuck=stuck, beacons=[Beacon(**b) for b in d.get("beacons", [])],
                         progress_counter_total=d.get("progress_counter_total", 0),
                         n_stuck_reported=d.get("n_stuck_reported", len(stuck)),
                         header_magic=d.get("header_magic", 0))


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


def warp_evidence(snapshot: ProbeSnapshot, sites: Any = None,
                  limit: int = 256) -> list[dict[str, Any]]:
    """Per (CTA, warp): role, state, last completed event, stuck site; stuck warps first."""
    by_id = _as_sites(sites)
    rows = []
    views = sorted(warp_views(snapshot).values(), key=lambda v: (v.stuck is None, v.cta, v.warp))
    for v in views[:limit]:
        row: dict[str, Any] = {"cta": v.cta, "block": v.block, "warp": v.warp,
                               "role": v.role(by_id), "state": v.state}
        if v.last:
            site = by_id.get(v.last.site_id)
            row["last"] = {"site": v.last.site_id, "stage": v.last.stage,
                           "phase": v.last.phase, "seq": v.last.seq,
                           "desc": site.describe(v.last.stage, v.last.phase) if site else None}
        if v.stuck:
            r, site = v.stuck, by_id.get(v.stuck.site_id)
            row["stuck"] = {"site": r.site_id, "stage": r.stage, "phase": r.phase, "seq": r.seq,
                            "waited_ms": round(r.waited_ns / 1e6, 3), "smid": r.smid,
                            "op": site.op if site else None,
                            "barrier": site.barrier if site else None,
                            "where": site.where if site else None,
                            "desc": site.describe(r.stage, r.phase) if site else None}
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


def _progress_on(views: list[WarpView], key: tuple, ops: tuple[str, ...],
                 by_id: dict[int, Site]) -> int:
    """Highest PipelineState seq among completed waits on pipeline ``key`` with an op in ops."""
    best = 0
    for v in views:
        b = v.last
        site = by_id.get(b.site_id) if b else None
        if site and site.pipeline_key == key and site.op in ops and site.kind == "pipeline":
            best = max(best, b.seq)
    return best


def _phase_rule(r: StuckRecord, site: Site) -> str | None:
    if site.kind != "pipeline" or not site.stages or r.seq <= 0 or r.stage < 0:
        return None
    if site.op not in ("producer_acquire", "consumer_wait", "producer_tail"):
        return None
    count = r.seq - 1
    start = 1 if site.role == "producer" else 0
    stage, phase = count % site.stages, start ^ ((count // site.stages) & 1)
    if (stage, phase) == (r.stage, r.phase):
        return None
    return (f"{site.role} waits on {site.barrier}[{r.stage}] phase {r.phase} but its "
            f"PipelineState count {count} implies {site.barrier}[{stage}] phase {phase}: "
            f"stage/phase bookkeeping broken (PipelineState.advance not flipping the phase?) "
            f"at {site.where}")


def _cta_rules(views: list[WarpView], by_id: dict[int, Site]) -> list[str]:
    out: list[str] = []
    stuck = [v for v in views if v.stuck]
    for v in stuck:
        site = by_id.get(v.stuck.site_id)
        if site is not None and (msg := _phase_rule(v.stuck, site)):
            out.append(msg)
    if out:
        return out
    by_site: dict[tuple[int, int, int], list[WarpView]] = defaultdict(list)
    for v in stuck:
        by_site[(v.stuck.site_id, v.stuck.stage, v.stuck.phase)].append(v)
    for (sid, stage, phase), group in by_site.items():
        site = by_id.get(sid)
        if site is None:
            out.append(f"warps wait on unknown site {sid} [{stage}] phase {phase}")
            continue
        what = site.describe(stage, phase)
        others = [v for v in views if v not in group]
        key = site.pipeline_key
        if site.op == "consumer_wait" and site.barrier == "full":
            producers = [v for v in others if v.role(by_id) == "producer"]
            produced = _progress_on(producers, key, ("producer_acquire",), by_id)
            p_stuck = [v for v in producers if v.stuck]
            p_tail = [v for v in p_stuck if (s := by_id.get(v.stuck.site_id)) and
                      s.op == "producer_tail"]
            waiting_for = group[0].stuck.seq
            if p_tail or (waiting_for and produced >= waiting_for) or (
                    producers and not p_stuck):
                past = (f" (producer acquired #{produced}, consumer waits for "
                        f"#{waiting_for})" if waiting_for and produced else "")
                out.append(f"consumers wait on full[{stage}] phase {phase} while the producer "
                           f"is past it{past}: the full barrier never completed → expect_tx "
                           f"larger than the bytes delivered, a TMA load missing, or full's "
                           f"arrive count too large? ({site.where})")
            elif p_stuck:
                ps = p_stuck[0].stuck
                psite = by_id.get(ps.site_id)
                pw = psite.describe(ps.stage, ps.phase) if psite else f"site {ps.site_id}"
                out.append(f"circular wait: consumers wait on full[{stage}] phase {phase} "
                           f"and the producer waits on {pw}: a consumer_release missing or "
                           f"on the wrong stage, or the producer's phase bookkeeping off? "
                           f"({site.where})")
            else:
                out.append(f"consumers wait on full[{stage}] phase {phase} and no producer "
                           f"warp completed any wait: the producer never ran (role dispatch / "
                           f"warp index?) or exited early ({site.where})")
        elif site.op in ("producer_acquire", "producer_tail") and site.barrier == "empty":
            consumers = [v for v in others if v.role(by_id) == "consumer"]
            c_stuck = [v for v in consumers if v.stuck]
            consumed = _progress_on(consumers, key, ("consumer_wait",), by_id)
            if c_stuck:
                continue  # reported from the consumers' side (circular wait)
            done = f" (last consumer_wait #{consumed})" if consumed else ""
            if site.op == "producer_tail":
                out.append(f"producer_tail waits on empty[{stage}] phase {phase} while the "
                           f"consumers are done{done}: fewer consumer releases than stages "
                           f"filled (release skipped at the end?) or empty's arrive count larger "
                           f"than the releases ({site.where})")
            else:
                out.append(f"producer waits on empty[{stage}] phase {phase} while the consumers "
                           f"are done{done}: consumer release missing, or the empty barrier's "
                           f"arrive count larger than the releases ({site.where})")
        elif site.kind == "raw":
            passed = [v for v in others if v.last and v.last.site_id == sid]
            if not passed:
                out.append(f"every waiting warp ({len(group)}) waits on {what} and none passed "
                           f"it: nobody arrived → missing mbarrier_arrive, or the init arrive "
                           f"count larger than the arrivals?")
            else:
                out.append(f"{len(group)} warps wait on {what} that {len(passed)} other warps "
                           f"passed: they wait for a later phase that nobody completes "
                           f"(phase bookkeeping, or arrivals counted once for all?)")
        else:
            out.append(f"{len(group)} warps stuck at {what}")
    return out


def diagnose(snapshot: ProbeSnapshot, sites: Any = None, *, stalled: bool = False) -> list[str]:
    """One line per recognized pattern, aggregated over CTAs (most frequent first)."""
    by_id = _as_sites(sites)
    views = warp_views(snapshot)
    ctas: dict[int, list[WarpView]] = defaultdict(list)
    for v in views.values():
        ctas[v.cta].append(v)
    counts: dict[str, list[int]] = defaultdict(list)
    for cta, vs in sorted(ctas.items()):
        for msg in dict.fromkeys(_cta_rules(vs, by_id)):
            counts[msg].append(cta)
    lines = []
    for msg, cs in sorted(counts.items(), key=lambda kv: (-len(kv[1]), kv[1][0])):
        where = (f"CTA {cs[0]}" if len(cs) == 1 else
                 f"{len(cs)} CTAs ({_ranges(cs)})")
        lines.append(f"{where}: {msg}")
    if snapshot.dropped_records:
        lines.append(f"{snapshot.dropped_records} more stuck reports did not fit the buffer "
                     f"(raise max_records)")
    if not snapshot.stuck:
        if snapshot.beacons and stalled:
            lines.append("no bounded wait timed out yet but no warp completed a wait: the hang "
                         "is outside mbarrier waits (named barrier, spin on a flag, TMEM "
                         "allocation?) → printf-bisection; last events: "
                         + _last_events_summary(views, by_id))
        elif stalled:
            lines.append("no warp ever completed an instrumented wait (or beacons are off): "
                         "the hang is before the first wait or outside mbarrier waits")
    return lines


def _ranges(xs: list[int]) -> str:
    xs, parts, i = sorted(xs), [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts[:8]) + (",…" if len(parts) > 8 else "")


def _last_events_summary(views: dict[tuple[int, int], WarpView], by_id: dict[int, Site]) -> str:
    seen: dict[str, int] = defaultdict(int)
    for v in views.values():
        if v.last:
            site = by_id.get(v.last.site_id)
            desc = site.describe(v.last.stage, v.last.phase) if site else f"site {v.last.site_id}"
            seen[f"{v.role(by_id)} warp {v.warp}: {desc}"] += 1
    return "; ".join(f"{k} ×{n}" for k, n in sorted(seen.items())[:6])


def site_table_text(sites: Any) -> str:
    by_id = _as_sites(sites)
    return "\n".join(f"site {s.id}: {s.describe()} {s.pipeline_class} {s.pipeline_name!r} "
                     f"stages={s.stages} arrive={s.arrive_count} tx={s.tx_count} | {s.code}"
                     for s in by_id.values())


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)
