"""Schedule perturbation at trace time: delay code at protocol positions, driven by a table.

An observer of the instrumentation layer (``layer.observe("perturb", ...)``). While a kernel is
traced inside ``instrument(addr)``, every outermost pipeline op called by kernel code gets a
*position* (numbered in trace order, ``perturb_plan.Position``) at the protocol point where a
latent bug's window opens:

- ``after producer_acquire``: the producer holds an empty stage before its loads are issued;
- ``after producer_commit``: the stage is published, the producer is late for the next one;
- ``after consumer_wait``: between a wait and the shared-memory reads it guards;
- ``before consumer_release``: the consumer keeps a stage longer before giving it back;
- ``before producer_tail``: a CTA on its way out;
- ``after create``: between mbarrier init (and its fence / sync) and the first use.

Each position lowers to: load its row of the rule table (8 int32 in global memory at
``addr + 32 * position``), and when its delay is non-zero and the block, the pipeline state's
stage and count (the iteration, i.e. the k-tile), and the warp fall in the row's windows, spin
on ``%globaltimer`` for that many nanoseconds. The delays are data: one compile serves every
seed, replay and shrinking step (``perturb_plan``), and a zero table delays nothing.

Without ``instrument`` nothing is emitted: the PTX is byte-identical to an unperturbed build.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
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


@dataclasses.dataclass(frozen=True)
class _Plan:
    addr: int  # device address of the rule table (baked into the kernel)


@dataclasses.dataclass
class Session:
    plan: _Plan
    positions: list[Position] = dataclasses.field(default_factory=list)
    dropped: int = 0  # positions past MAX_POSITIONS (traced, not instrumented)

    def add(self, role: str, op: str, where: str, call: Any) -> int | None:
        if len(self.positions) >= MAX_POSITIONS:
            self.dropped += 1
            return None
        info = call.pipeline
        site = call.site
        pos = Position(
            len(self.positions),
            role,
            op,
            where,
            info.index if info else None,
            site.file,
            site.line,
            site.via,
        )
        self.positions.append(pos)
        return pos.id

    def to_json(self) -> dict[str, Any]:
        return {
            "positions": [p.to_json() for p in self.positions],
            "dropped": self.dropped,
            "max_positions": MAX_POSITIONS,
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
        """Spin ``row.delay_ns`` on %globaltimer when this block/stage/count/warp matches."""
        row = cute.make_ptr(Int32, plan.addr + pos * ROW_BYTES, gmem, assumed_align=16)
        delay = cute.arch.load(row, Int32)
        if delay > Int32(0):
            cta = Int32(ids.linear_block_id())
            warp = Int32(ids.warp_id())
            hit = cta >= cute.arch.load(row + 1, Int32) and cta <= cute.arch.load(row + 2, Int32)
            want_stage = cute.arch.load(row + 3, Int32)
            hit = hit and (want_stage < Int32(0) or want_stage == Int32(stage))
            hit = hit and Int32(count) >= cute.arch.load(row + 4, Int32)
            hit = hit and Int32(count) <= cute.arch.load(row + 5, Int32)
            want_warp = cute.arch.load(row + 6, Int32)
            hit = hit and (want_warp < Int32(0) or want_warp == warp)
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


def _handlers(sess: Session) -> dict[str, Any]:
    delay = _device()

    def emit(pos: int | None, call: Any) -> None:
        if pos is None:
            return
        stage, count = _state_fields(call.state())
        with call.ip if call.ip is not None else contextlib.nullcontext():
            delay(stage, count, pos, sess.plan)

    def pipeline_op(call: Any) -> Any:
        if not call.outermost or call.name not in POSITIONS:
            return call.proceed()
        role, where = POSITIONS[call.name]
        pos = sess.add(role, call.name, where, call)
        if where == "before":
            emit(pos, call)
        out = call.proceed()
        if where == "after":
            emit(pos, call)
        return out

    def create(call: Any) -> Any:
        out = call.proceed()
        if call.outermost:
            # the pipeline now exists (``call.pipeline`` finds it through the returned object)
            info = call.layer.pipeline_of(out)
            site = call.site
            if len(sess.positions) < MAX_POSITIONS:
                pos = Position(
                    len(sess.positions),
                    "any",
                    "create",
                    "after",
                    info.index if info else None,
                    site.file,
                    site.line,
                    site.via,
                )
                sess.positions.append(pos)
                with call.ip if call.ip is not None else contextlib.nullcontext():
                    from cutlass import Int32

                    delay(Int32(0), Int32(0), pos.id, sess.plan)
            else:
                sess.dropped += 1
        return out

    return {**{op: pipeline_op for op in POSITIONS}, "create": create}


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
