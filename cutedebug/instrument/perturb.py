"""Schedule perturbation at trace time: delay code at protocol positions, driven by a table.

An observer of the instrumentation layer (``layer.observe("perturb", ...)``). While a kernel is
traced inside ``instrument(addr)``, every outermost pipeline op, pipeline ``create`` and raw
barrier op called by kernel code gets a *position* (numbered in trace order,
``perturb_plan.Position``) at the protocol point where a latent bug's window opens:

- ``after producer_acquire``: the producer holds an empty stage before its loads are issued;
- ``after producer_commit``: the stage is published, the producer is late for the next one;
- ``after consumer_wait``: between a wait and the shared-memory reads it guards;
- ``before consumer_release``: the consumer keeps a stage longer before giving it back;
- ``before producer_tail``: the producer on its way out;
- ``before create``: before the barriers are initialised (a warp or a cluster rank that
  initialises late while its peers already use the barriers);
- ``after create``: between mbarrier init (and its fence / sync) and the first use;
- raw barrier ops outside any pipeline (kernels with hand-written mbarriers and cluster
  barriers): ``before mbarrier_init``, ``after mbarrier_wait`` / ``mbarrier_try_wait``,
  ``before mbarrier_arrive`` / ``mbarrier_arrive_and_expect_tx`` / ``store_async_dsmem``
  (a release or a remote send), ``before cluster_arrive`` / ``cluster_arrive_relaxed`` and
  ``after cluster_wait`` (a CTA late into or out of a cluster barrier; the trailing one is the
  CTA's way out).

Each position lowers to: load its row of the rule table (``ROW_WORDS`` int32 in global memory
at ``addr + ROW_BYTES * position``), and when its delay is non-zero and this thread's CTA
(linear block id: window and residue), cluster rank (``%cluster_ctarank``: a bit of the rank
mask), the pipeline state's stage and count (the iteration, i.e. the k-tile), warp (window)
and lane (``%laneid``: a bit of the lane mask) all match the row's keys, spin on
``%globaltimer`` for that many nanoseconds. The delays are data: one compile serves every
seed, replay and shrinking step (``perturb_plan``), and a zero table delays nothing. The
trace's ``launch`` gives the host the shape the random keys are drawn from (CTAs, warps,
cluster size).

Without ``instrument`` nothing is emitted: the PTX is byte-identical to an unperturbed build.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Iterator
from typing import Any

from cutedebug.instrument.perturb_plan import ROW_WORDS, Position

MAX_POSITIONS = 256  # rows in the table the worker allocates before tracing
ROW_BYTES = ROW_WORDS * 4
TABLE_BYTES = MAX_POSITIONS * ROW_BYTES
# op -> (role, where the delay goes)
POSITIONS = {
    "producer_acquire": ("producer", "after"),
    "producer_commit": ("producer", "after"),
    "consumer_wait": ("consumer", "after"),
    "consumer_release": ("consumer", "before"),
    "producer_tail": ("producer", "before"),
}
# raw barrier ops (outside any pipeline op) -> where the delay goes
RAW_POSITIONS = {
    "mbarrier_init": "before",
    "mbarrier_wait": "after",
    "mbarrier_try_wait": "after",
    "mbarrier_arrive": "before",
    "mbarrier_arrive_and_expect_tx": "before",
    "store_async_dsmem": "before",
    "cluster_arrive": "before",
    "cluster_arrive_relaxed": "before",
    "cluster_wait": "after",
}


@dataclasses.dataclass(frozen=True)
class _Plan:
    addr: int  # device address of the rule table (baked into the kernel)


@dataclasses.dataclass
class Session:
    plan: _Plan
    positions: list[Position] = dataclasses.field(default_factory=list)
    dropped: int = 0  # positions past MAX_POSITIONS (traced, not instrumented)
    # the traced launch: ctas, warps (per CTA), cluster (CTAs per cluster); None: not static
    shape: dict[str, int | None] = dataclasses.field(default_factory=dict)

    def add(
        self, role: str, op: str, where: str, pipeline: int | None, site: Any, stateful=True
    ) -> int | None:
        if len(self.positions) >= MAX_POSITIONS:
            self.dropped += 1
            return None
        pos = Position(
            len(self.positions),
            role,
            op,
            where,
            pipeline,
            site.file,
            site.line,
            site.via,
            stateful,
        )
        self.positions.append(pos)
        return pos.id

    def to_json(self) -> dict[str, Any]:
        return {
            "positions": [p.to_json() for p in self.positions],
            "dropped": self.dropped,
            "max_positions": MAX_POSITIONS,
            "shape": dict(self.shape),
        }


@functools.cache
def _device() -> Any:
    """The @cute.jit delay helper (cutlass is imported only here)."""
    import cutlass
    from cutlass import Int32, Int64, cute

    from cutedebug.instrument.probes import device_ids

    ids = device_ids()
    gmem = cute.AddressSpace.gmem

    @cute.jit
    def maybe_delay(stage, count, pos: cutlass.Constexpr, plan: cutlass.Constexpr):
        """Spin ``row.delay_ns`` on %globaltimer when this thread matches the row's keys."""
        row = cute.make_ptr(Int32, plan.addr + pos * ROW_BYTES, gmem, assumed_align=16)
        delay = cute.arch.load(row, Int32)
        if delay > Int32(0):
            cta = Int32(ids.linear_block_id())
            warp = Int32(ids.warp_id())
            lane = Int32(cute.arch.lane_idx())
            rank = Int32(cute.arch.block_idx_in_cluster())
            hit = cta >= cute.arch.load(row + 1, Int32) and cta <= cute.arch.load(row + 2, Int32)
            want_stage = cute.arch.load(row + 3, Int32)
            hit = hit and (want_stage < Int32(0) or want_stage == Int32(stage))
            hit = hit and Int32(count) >= cute.arch.load(row + 4, Int32)
            hit = hit and Int32(count) <= cute.arch.load(row + 5, Int32)
            hit = hit and warp >= cute.arch.load(row + 6, Int32)
            hit = hit and warp <= cute.arch.load(row + 7, Int32)
            lanes = cute.arch.load(row + 8, Int32)
            hit = hit and ((lanes >> lane) & Int32(1)) != Int32(0)
            ranks = cute.arch.load(row + 9, Int32)
            hit = hit and ((ranks >> rank) & Int32(1)) != Int32(0)
            hit = hit and cta % cute.arch.load(row + 10, Int32) == cute.arch.load(row + 11, Int32)
            if hit:
                t0 = cute.arch.globaltimer()
                while cute.arch.globaltimer() - t0 < Int64(delay):
                    pass

    return maybe_delay


def _state_fields(state: Any) -> tuple[Any, Any]:
    """(stage, count) of a pipeline state as DSL values; (0, 0) when the op has none."""
    from cutlass import Int32

    if state is None or not hasattr(state, "index"):
        return Int32(0), Int32(0)
    count = getattr(state, "count", None)
    return state.index, count if count is not None else Int32(0)


def _static_size(value: Any) -> int | None:
    """The product of a launch dimension (an int or a tuple of them); None when not static."""
    from cutedebug.instrument.identity import _static

    dims = value if isinstance(value, (tuple, list)) else [value]
    sizes = [_static(d) for d in dims]
    return math.prod(sizes) if sizes and None not in sizes else None


def _handlers(sess: Session) -> dict[str, Any]:
    delay = _device()

    def emit(pos: int | None, call: Any, state: Any = None) -> None:
        if pos is None:
            return
        stage, count = _state_fields(state)
        with call.ip if call.ip is not None else contextlib.nullcontext():
            delay(stage, count, pos, sess.plan)

    def pipeline_op(call: Any) -> Any:
        if not call.outermost or call.name not in POSITIONS:
            return call.proceed()
        role, where = POSITIONS[call.name]
        info, state = call.pipeline, call.state()
        stateful = state is not None and hasattr(state, "index")  # as _state_fields reads it
        pos = sess.add(role, call.name, where, info.index if info else None, call.site, stateful)
        if where == "before":
            emit(pos, call, state)
        out = call.proceed()
        if where == "after":
            emit(pos, call, state)
        return out

    def create(call: Any) -> Any:
        if not call.outermost:
            return call.proceed()
        # the layer numbered the pipeline before the observers run (none for a TMA store)
        creating = call.layer.creating
        index = creating[-1]["info"].index if creating else None
        emit(sess.add("any", "create", "before", index, call.site), call)
        out = call.proceed()
        info = call.layer.pipeline_of(out)
        index = info.index if info else index
        emit(sess.add("any", "create", "after", index, call.site), call)
        return out

    def raw_op(call: Any) -> Any:
        if not call.outermost or call.dead:
            return call.proceed()
        where = RAW_POSITIONS[call.name]
        pos = sess.add("any", call.name, where, None, call.site)
        if where == "before":
            emit(pos, call)
        out = call.proceed()
        if where == "after":
            emit(pos, call)
        return out

    def launch(call: Any) -> Any:
        if not sess.shape:
            block = _static_size(call.kwargs.get("block"))
            cluster = call.kwargs.get("cluster")
            sess.shape = {
                "ctas": _static_size(call.kwargs.get("grid")),
                "warps": -(-block // 32) if block else None,
                "cluster": _static_size(cluster) if cluster is not None else 1,
            }
        return call.proceed()

    return {
        **{op: pipeline_op for op in POSITIONS},
        **{op: raw_op for op in RAW_POSITIONS},
        "create": create,
        "launch": launch,
    }


def make_table(runnable: bool) -> tuple[Any, int]:
    """(the rule table, its device address): zeros in device memory, read by every position.

    Device memory, not host-mapped: each position loads a row on every pass, which must cost an
    L2 hit, not a PCIe round trip. On a CPU-only machine the address is a plausible constant."""
    if not runnable:
        return None, 0x7E0000000000
    import torch

    table = torch.zeros(TABLE_BYTES, dtype=torch.uint8, device="cuda")
    return table, table.data_ptr()


def write_table(table: Any, raw: bytes) -> None:
    """Copy a rule table (``perturb_plan.table_bytes``) to the device, zero-padded."""
    import torch

    if len(raw) > TABLE_BYTES:
        raise ValueError(f"rule table of {len(raw)} bytes: at most {TABLE_BYTES}")
    host = torch.zeros(TABLE_BYTES, dtype=torch.uint8)
    host[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    table.copy_(host)
    torch.cuda.synchronize()


@contextlib.contextmanager
def instrument(addr: int) -> Iterator[Session]:
    """Emit delay positions into every kernel traced inside; the table lives at ``addr``."""
    from cutedebug.instrument import layer

    sess = Session(_Plan(int(addr)))
    with layer.observe("perturb", _handlers(sess)):
        yield sess
