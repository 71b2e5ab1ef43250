"""racecheck sample: shared memory handed between threads by mbarriers only (no CTA barrier).

One CTA of 128 threads: warp 0 is the producer, warps 1-3 the consumers, a ring of ``STAGES``
slots of 4 ints in shared memory with a full and an empty mbarrier per slot (the shape of a
``PipelineAsync`` with thread producers, e.g. quack's GEMM tile scheduler):

- the producer's lane 0 waits on empty[s], writes the slot with plain ``st.shared``
  (HANDOFF_WRITE) and arrives on full[s] (arrive count 1);
- each consumer warp waits on full[s], every lane reads the slot (HANDOFF_READ), then
  ``__syncwarp`` and lane 0 arrives on empty[s] (arrive count 3: one per consumer warp).

Correct under the PTX memory model (the mbarrier arrive releases, the wait acquires; the warp
sync orders the lanes' reads before lane 0's arrive). If racecheck reports a hazard between
the two marked lines, it does not credit mbarrier ordering between generic shared-memory
accesses of different threads: a finding of the tool on a correct idiom. ``--mode sync``
orders the same accesses by ``sync_threads`` instead (the control racecheck must call clean);
``--mode none`` drops the consumers' wait (a real RAW hazard, racecheck must report it).
``--mode nowait`` is that real race in a kernel that still orders its slots by mbarriers: the
producer waits on empty[s] before reusing a slot and the consumers arrive on it after reading,
but they never wait on full[s] (the race the sanitizer's referee must confirm).

    python tools/sanitizer_samples/mbarrier_handoff.py [--mode mbarrier|sync|none|nowait] [--compile-only]

``MbarrierHandoff`` (below) offers the kernel to cutedebug as a scenario kernel
(mbarrier_handoff_clean.toml: --mode mbarrier; mbarrier_handoff_nowait.toml).
"""

from __future__ import annotations

import argparse
import os

import cutlass
from cutlass import cute
from cutlass.memory import SmemAllocator

THREADS = 128
STAGES = 2
ROUNDS = 8
CONSUMER_WARPS = 3
MODES = ("mbarrier", "sync", "none", "nowait")


@cute.kernel
def handoff_kernel(y: cute.Tensor, mode: cutlass.Constexpr):
    tid, _, _ = cute.arch.thread_idx()
    warp = tid // 32
    lane = tid % 32
    smem = SmemAllocator()
    slots = smem.allocate_tensor(cutlass.Int32, cute.make_layout((4, STAGES)), byte_alignment=16)
    full = smem.allocate_array(cutlass.Int64, STAGES, byte_alignment=8)
    empty = smem.allocate_array(cutlass.Int64, STAGES, byte_alignment=8)
    if tid == 0:
        for s in cutlass.range_constexpr(STAGES):
            cute.arch.mbarrier_init(full + s, 1)
            cute.arch.mbarrier_init(empty + s, CONSUMER_WARPS)
    cute.arch.mbarrier_init_fence()
    cute.arch.sync_threads()
    acc = cutlass.Int32(0)
    for r in cutlass.range_constexpr(ROUNDS):
        s = r % STAGES
        phase = (r // STAGES) % 2
        if warp == 0:
            if lane == 0:
                if cutlass.const_expr(mode in ("mbarrier", "nowait") and r >= STAGES):
                    cute.arch.mbarrier_wait(empty + s, 1 - phase)
                for i in cutlass.range_constexpr(4):
                    slots[i, s] = cutlass.Int32(r * 4 + i)  # HANDOFF_WRITE
                if cutlass.const_expr(mode != "sync"):
                    cute.arch.mbarrier_arrive(full + s)
        if cutlass.const_expr(mode == "sync"):
            cute.arch.sync_threads()
        if warp > 0:
            if cutlass.const_expr(mode == "mbarrier"):
                cute.arch.mbarrier_wait(full + s, phase)
            acc = acc + slots[lane % 4, s]  # HANDOFF_READ
            if cutlass.const_expr(mode in ("mbarrier", "nowait")):
                cute.arch.sync_warp()
                if lane == 0:
                    cute.arch.mbarrier_arrive(empty + s)
        if cutlass.const_expr(mode == "sync"):
            cute.arch.sync_threads()
    y[tid] = acc


@cute.jit
def handoff_host(y: cute.Tensor, mode: cutlass.Constexpr):
    handoff_kernel(y, mode).launch(grid=(1, 1, 1), block=(THREADS, 1, 1))


def expected() -> list[int]:
    """Each consumer lane's sum of slot element lane % 4 over the rounds; 0 for warp 0."""
    per = [sum(r * 4 + i for r in range(ROUNDS)) for i in range(4)]
    return [0] * 32 + [per[t % 4] for t in range(32, THREADS)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=MODES, default="mbarrier")
    ap.add_argument("--compile-only", action="store_true", help="compile for sm_90a, no GPU")
    args = ap.parse_args()
    if args.compile_only:
        from cutlass.cute.runtime import make_fake_tensor

        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        fake = make_fake_tensor(cutlass.Int32, (THREADS,), stride=(1,), assumed_align=16)
        cute.compile(handoff_host, fake, args.mode)
        print("compiled")
        return
    import torch
    from cutlass.cute.runtime import from_dlpack

    y = torch.zeros(THREADS, dtype=torch.int32, device="cuda")
    handoff_host(from_dlpack(y, assumed_align=16), args.mode)
    torch.cuda.synchronize()
    same = y.cpu().tolist() == expected()
    print(f"mbarrier_handoff --mode {args.mode}: output", "matches" if same else "differs")


class MbarrierHandoff:
    """The sample as a scenario kernel (cutedebug/kernel_api.py): y as in ``expected()``."""

    PARAMS = {"mode": "mbarrier"}
    CHOICES = {"mode": MODES}
    ARCHS = ("sm_90a", "sm_100a")
    TOLERANCE = (0.0, 0.0)
    DETERMINISTIC = True

    def __init__(self, mode=PARAMS["mode"]):
        self.mode = mode

    @cute.jit
    def __call__(self, y: cute.Tensor):
        handoff_kernel(y, self.mode).launch(grid=(1, 1, 1), block=(THREADS, 1, 1))

    def fake_args(self):
        from cutlass.cute.runtime import make_fake_tensor

        return (make_fake_tensor(cutlass.Int32, (THREADS,), stride=(1,), assumed_align=16),)

    def make_inputs(self, device):
        import torch

        return {"y": torch.zeros(THREADS, dtype=torch.int32, device=device)}

    def cute_args(self, tensors):
        from cutlass.cute.runtime import from_dlpack

        return (from_dlpack(tensors["y"], assumed_align=16),)

    def reference(self, tensors):
        import torch

        return torch.tensor(expected(), dtype=torch.int32, device=tensors["y"].device)

    def output(self, tensors):
        return tensors["y"]


if __name__ == "__main__":
    main()
