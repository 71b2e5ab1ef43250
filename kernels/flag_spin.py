"""Flag hand-off kernel: y = 2 * x + 1 (fp32), passed from a producer warp to consumer warps
through per-chunk flags in global memory.

The input is cut into chunks of C = 32 * consumer_warps elements; CTA b handles chunks
b, b + grid, ... (grid = min(ctas, chunks)). Block = (consumer_warps + 1) * 32 threads.

- prologue: ``sync_threads`` (every warp).
- warp ``consumer_warps``: producer. Per chunk: tmp[i] = 2 * x[i] into a global workspace,
  ``__syncwarp``, then lane 0 publishes ``st.release.gpu flags[chunk] = 1``. User checkpoints
  "payload written" and "flag published" mark the two steps.
- warps 0 .. consumer_warps-1: consumers. Per chunk: every thread spins on
  ``ld.acquire.gpu flags[chunk]`` until it reads 1: an unbounded hand-written wait with no
  mbarrier, which the bounded-wait probes cannot bound (checkpoint "flag observed" after it).
  Then the chunk goes through shared memory (the ``cute.struct`` SharedStorage: one C-float
  stage): thread t stages tmp[t], named barrier ``Barrier.CONSUMERS`` (id 1) over the consumer
  threads (``bar.sync 1, 32 * consumer_warps``), thread t writes y for the element of
  the neighbouring warp, (t + 32) % C, and a second named barrier protects the stage before
  the next chunk overwrites it.

Kernel-level switch:
- ``never_set``: the producer skips the flag store (it still reaches "flag published"):
  consumers spin forever on their first chunk -> HANG; the first consumer site never reached
  is checkpoint "flag observed".
Faults that apply (patches, see cutedebug/faults.py):
- ``wrong_barrier_threads(delta=+32)``: the consumers' named barriers expect one warp more
  than arrives -> HANG at the first named barrier (after "flag observed").
- ``wrong_barrier_threads(delta=-32)``: the barrier opens when 3 of 4 warps arrived; a warp may
  read a neighbour's stage slot before it is written -> MISMATCH / RACE.
- ``drop_sync``: dropping a named barrier -> RACE on the stage.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import from_dlpack, make_fake_tensor
from cutlass.memory import SmemAllocator

try:
    from cutedebug import checkpoint
except ImportError:  # the kernel also runs without cutedebug installed

    def checkpoint(name, *, role=None):
        return None


class Barrier(IntEnum):
    """Named barrier ids (16 per CTA)."""

    SYNC_THREADS = 0  # the prologue's sync_threads
    CONSUMERS = 1  # the consumer warps around each chunk's smem stage


def smem_struct(name: str, **fields) -> cute.struct:
    """``cute.struct`` with ``fields`` in order. (A class body's annotations would be strings
    here: this module keeps ``from __future__ import annotations`` for the DSL's signatures.)"""
    return cute.struct(type(name, (), {"__annotations__": fields}))


class FlagSpin:
    PARAMS: ClassVar[dict[str, object]] = {"n": 1 << 16, "consumer_warps": 4, "ctas": 8}
    CHOICES: ClassVar[dict[str, tuple]] = {"consumer_warps": (2, 4, 8)}
    SHRINKABLE = ("n", "ctas")
    ARCHS = ("sm_90a", "sm_100a")
    SWITCHES: ClassVar[dict[str, str]] = {
        "never_set": "the producer never stores the chunk flags: consumers spin forever",
    }
    TOLERANCE = (1e-6, 1e-6)

    def __init__(self, n=PARAMS["n"], consumer_warps=PARAMS["consumer_warps"],
                 ctas=PARAMS["ctas"], never_set=False):
        if n < 1 or ctas < 1:
            raise ValueError(f"need n, ctas >= 1 (n={n} ctas={ctas})")
        self.n, self.consumer_warps, self.never_set = n, consumer_warps, never_set
        self.chunk = 32 * consumer_warps
        self.chunks = -(-n // self.chunk)
        self.grid = min(ctas, self.chunks)
        self.threads = self.chunk + 32
        # the consumers' stage: one fp32 per consumer thread, 16 B aligned
        self.storage = smem_struct(
            "SharedStorage",
            stage=cute.struct.Align[cute.struct.MemRange[cutlass.Float32, self.chunk], 16])
        self.smem_bytes = self.storage.size_in_bytes()

    # ---- host side ------------------------------------------------------------------------
    @cute.jit
    def __call__(self, x: cute.Tensor, tmp: cute.Tensor, flags: cute.Tensor, y: cute.Tensor):
        self.kernel(x, tmp, flags, y).launch(grid=(self.grid, 1, 1),
                                             block=(self.threads, 1, 1))

    # ---- device side ----------------------------------------------------------------------
    @cute.kernel
    def kernel(self, x: cute.Tensor, tmp: cute.Tensor, flags: cute.Tensor, y: cute.Tensor):
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tid, _, _ = cute.arch.thread_idx()
        storage = SmemAllocator().allocate(self.storage)
        stage = storage.stage.get_tensor(cute.make_layout((self.chunk,)))
        # -- prologue --------------------------------------------------------------------
        cute.arch.sync_threads()
        if warp == self.consumer_warps:
            self.producer(x, tmp, flags)
        else:
            self.consumer(tmp, flags, y, stage, tid)

    @cute.jit
    def producer(self, x: cute.Tensor, tmp: cute.Tensor, flags: cute.Tensor):
        """One warp: tmp = 2 * x per chunk, then publish the chunk's flag (release)."""
        bid, _, _ = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        for chunk in cutlass.range(bid, self.chunks, self.grid, unroll=1):
            for k in cutlass.range_constexpr(self.consumer_warps):
                i = chunk * self.chunk + k * 32 + lane
                if i < self.n:
                    tmp[i] = x[i] * cutlass.Float32(2.0)
            checkpoint("payload written")
            cute.arch.sync_warp()  # every lane's tmp stores before lane 0's release
            if lane == 0:
                if cutlass.const_expr(not self.never_set):
                    cute.arch.store(flags.iterator + chunk, cutlass.Int32(1), sem="release",
                                    scope="gpu")
            checkpoint("flag published")

    @cute.jit
    def consumer(self, tmp: cute.Tensor, flags: cute.Tensor, y: cute.Tensor,
                 stage: cute.Tensor, tid: cutlass.Int32):
        """Consumer warps: spin on the chunk flag, stage tmp in smem, write a neighbour's y."""
        bid, _, _ = cute.arch.block_idx()
        C = self.chunk
        for chunk in cutlass.range(bid, self.chunks, self.grid, unroll=1):
            # -- the spin: no bound, no backoff, no mbarrier -----------------------------
            seen = cute.arch.load(flags.iterator + chunk, cutlass.Int32, sem="acquire",
                                  scope="gpu")
            while seen != cutlass.Int32(1):
                seen = cute.arch.load(flags.iterator + chunk, cutlass.Int32, sem="acquire",
                                      scope="gpu")
            checkpoint("flag observed")
            i = chunk * C + tid
            stage[tid] = cutlass.Float32(0.0)
            if i < self.n:
                stage[tid] = tmp[i]
            cute.arch.barrier(barrier_id=Barrier.CONSUMERS, number_of_threads=C)
            j = (tid + 32) % C
            g = chunk * C + j
            if g < self.n:
                y[g] = stage[j] + cutlass.Float32(1.0)
            # the next chunk overwrites the stage only after every read of this one
            cute.arch.barrier(barrier_id=Barrier.CONSUMERS, number_of_threads=C)

    # ---- interface ------------------------------------------------------------------------
    def fake_args(self):
        f32 = [make_fake_tensor(cutlass.Float32, (self.n,), stride=(1,), assumed_align=16)
               for _ in range(3)]
        flags = make_fake_tensor(cutlass.Int32, (self.chunks,), stride=(1,), assumed_align=16)
        return (f32[0], f32[1], flags, f32[2])

    def make_inputs(self, device):
        import torch

        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(self.n, generator=g).to(device)
        return {"x": x, "tmp": torch.zeros_like(x),
                "flags": torch.zeros(self.chunks, dtype=torch.int32, device=device),
                "y": torch.full_like(x, float("nan"))}

    def cute_args(self, tensors):
        return tuple(from_dlpack(tensors[k], assumed_align=16)
                     for k in ("x", "tmp", "flags", "y"))

    def reference(self, tensors):
        return tensors["x"] * 2.0 + 1.0

    def output(self, tensors):
        return tensors["y"]
