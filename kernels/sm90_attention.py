"""Warp-specialized attention forward (SM90), FlashAttention-3 style: O = softmax(Q K^T * scale) V.

q, k, v and o are [batch, seqlen, heads, d] bf16 (contiguous), d = 64 or 128, scale = d**-0.5,
causal (key j visible to query i iff j <= i) or not; lse is [batch, heads, seqlen] fp32, the
natural-log log-sum-exp of each row of scaled scores. Any seqlen >= 1: TMA zero-fills the rows
past seqlen of the last K / V / Q tile, the score columns past seqlen are masked to -inf, and the
TMA store of O (and the lse stores) skip rows past seqlen. Every output row depends on every
visible key, so a stage read early or late, a skipped rescale or a mis-ordered epilogue shows up
as a MISMATCH against the fp32 reference (``output`` = O and lse, flattened, in fp32).

Grid = (ceil(seqlen / 128), heads, batch): one CTA per 128-row Q tile of one (batch, head),
heaviest causal tiles first. Block = 3 warpgroups (384 threads), one CTA per SM
(``min_blocks_per_mp=1``: 168 registers per thread at entry, so ``setmaxnreg`` can move them):
- warpgroup 0, producer: ``setmaxregister_decrease(40)``; warp 0 alone issues the TMA loads:
  the Q tile once, then per key block n (from the last visible block down to 0) K[n] into the K
  ring and V[n] into the V ring.
- warpgroups 1 and 2, consumers: ``setmaxregister_increase(232)``; consumer warpgroup w owns
  Q rows 64w .. 64w+63 of the tile (2 * 128 * 232 + 128 * 40 = 64512 <= 65536 registers).
  Registers per thread: S 64 x 128 fp32 accumulators (64), O 64 x d fp32 (d / 2), P bf16 (32).
  First block: wait K, S = Q K^T (WGMMA, Q and K from smem), release K, mask (causal diagonal
  and seqlen tail: only this block has them), online softmax, P = bf16(S) straight from the
  accumulator registers. Then per further key block n, intra-warpgroup overlap as FA3 does: wait
  K(n) and V(n+1), issue S = Q K(n)^T and O += P V(n+1) (A = P from registers, V^T from smem as
  an MN-major view) as two WGMMA groups, ``wgmma.wait_group 1`` (S has landed, PV may still
  run), release K, online softmax of S (row max over the quad of 4 threads sharing a row, exp2
  with scale * log2(e) folded in, a row max of -inf is taken as 0, running sum per thread)
  while the tensor cores finish PV, ``wgmma.wait_group 0``, release V, O *= exp2((m_old -
  m_new) * scale_log2) (the rescale step), P = bf16(S). Last: O += P V(0), release V.
  O starts at zero and every PV accumulates.
  Epilogue: quad-sum of the running sum, O /= sum, lse = (m * scale_log2 + log2(sum)) * ln 2,
  ``stmatrix`` of bf16 O into smem, ``fence.proxy.async.shared::cta``, epilogue named barrier,
  warp 4 issues one TMA store (128 x d) and waits until it has read smem.

Pipelines: three ``cutlass.pipeline.PipelineTmaAsync``, created in this order (the index the
faults' ``pipeline`` argument selects): 0 = K ring, 1 = V ring (S = ``stages`` slots each),
2 = Q (one slot, used once). Each: barriers full[0..S) then empty[0..S), initialised by warp 0
(elect_one) inside ``create``; K and V defer their fence + CTA sync to Q's ``create``, whose
``fence.mbarrier_init`` + ``bar.sync 0`` covers all three.
- tx bytes per stage (bytes landing in this CTA's smem; OOB rows are zero-filled and count):
      K: tile_n * d * 2 = 128 * d * 2 = 32768 (d 128) / 16384 (d 64)
      V: tile_n * d * 2               = 32768 (d 128) / 16384 (d 64)
      Q: 128 * d * 2                  = 32768 (d 128) / 16384 (d 64)
- full[s] arrive count 1 (the producer's elect_one ``mbarrier.arrive.expect_tx`` in
  ``producer_acquire``); completes when that arrive AND the tx bytes have landed.
- empty[s] arrive count 8 = consumer warps: ``consumer_release`` arrives from lane 0 of each of
  the 8 consumer warps. Q is never released (one tile per CTA), so its empty barrier stays open.
- Phases: producer states start at phase 1, consumers at 0; ``advance`` past slot S-1 flips.
  Made in this order per role by ``make_pipeline_state``: K state, then V state (Q's states are
  built directly, not by ``make_pipeline_state``). Release counts run over the whole CTA, so
  ``at_iteration=i`` hits the i-th key block this CTA consumes.
- ``producer_tail`` of K then V: warp 0 waits on every empty[s] before it exits.

Named barriers (ids, the IntEnum ``Barrier``; 0 is ``sync_threads`` / the pipeline init sync):
- 2 and 3 (``Barrier.SCHEDULER`` + w), warpgroup scheduler (as FA3): id 2 + w is consumer warpgroup w's turn to issue
  WGMMAs, 256 threads = its 128 ``bar.sync`` + the other warpgroup's 128 ``bar.arrive``. A turn
  is "QK^T of this block + PV of the previous one" (the first turn QK^T only, the last PV
  only), so the two warpgroups alternate tensor-core bursts while the other one does softmax.
  Per tile with n key blocks each warpgroup syncs n + 1 times on its own id and arrives on the
  other's id right after issuing each turn's WGMMAs; warpgroup 1 also arrives once on id 2 up
  front (warpgroup 0 has the first turn) and skips the arrive after its own last turn. So
  warpgroup 0 arrives n + 1 times on id 3, warpgroup 1 n + 1 times on id 2: every phase of both
  barriers sees exactly 128 + 128 threads. They order no data (each warpgroup's operands are
  its own), but they are counted: a dropped ``bar.sync`` lets two arrivals complete a phase
  with nobody waiting, and a later sync starves (HANG).
- 1 (``Barrier.EPILOGUE``), epilogue: 256 threads (both consumer warpgroups ``bar.sync``) between the ``stmatrix`` of O
  and the TMA store that reads all 128 rows: the cross-warpgroup data dependency.
Trace order of the counted barrier call sites (``which`` of drop_sync / wrong_barrier_threads):
``bar.arrive`` id 2 (warpgroup 1's first-turn gift), [first turn: ``bar.sync``, ``bar.arrive``],
[loop turn: the same two], [last turn: ``bar.sync``, ``bar.arrive`` id 3 (warpgroup 0)],
epilogue ``bar.sync`` id 1. drop_sync counts only ``bar.sync``: 0 = first turn, 1 = loop turn,
2 = last turn, 3 = epilogue.

Smem: the ``cute.struct`` SharedStorage (``smem_fields``), its size ``smem_bytes``; for d 128,
S 2: 1024 (mbarriers: 2 * (2S + 1) * 8 B, padded to the 1024 B alignment of the 128B-swizzled
buffers) + 32768 (Q) + 2 * 32768 (K) + 2 * 32768 (V) + 32768 (O) = 197632 B. The tx bytes above
are one stage of its Q, K and V buffers, checked at trace time against ``cute.size_in_bytes`` of
the TMA boxes' smem layouts.

Faults that apply (cutedebug patches them at trace time; none is written here), per pipeline
(``pipeline`` = 0 K, 1 V; -1 all three):
- wrong_expect_tx + k: that full barrier never completes -> HANG in consumer_wait.
- wrong_expect_tx - k: the overhang bytes land in the next phase -> HANG (seen on tma_stream) or
  a stage read early (MISMATCH).
- missing_phase_flip consumer: the second lap waits on a completed parity and reads stale K / V
  (MISMATCH), or HANG; producer: producer_acquire on the second lap waits forever -> HANG.
- skip_consumer_release: that slot's empty barrier never completes -> HANG in producer_acquire
  (or producer_tail).
- extra_consumer_release / wrong_arrive_count -1 on empty: a slot refilled while a consumer
  warpgroup still reads it -> MISMATCH (timing-dependent), or the drift ends in a HANG (both
  extra_consumer_release scenarios on the H200); wrong_arrive_count -1 measured PASS (10/10
  on K and on V).
- wrong_arrive_count +1: HANG (empty: producer_acquire; full: consumer_wait).
- skip_producer_tail: single CTA, benign -> PASS.
- early_exit consumer / producer: HANG (producer_acquire / consumer_wait).
- missing_init_fence: usually PASS (one shared init for the three pipelines).
- drop_sync on the epilogue barrier (which=3) -> the TMA store may read a half-written O tile:
  MISMATCH, unless the other warpgroup has already written its rows (the usual case on the
  H200 with the overlap: PASS); on the first scheduler sync (which=0) -> warpgroup 0 meets one
  arrival too few on id 2 before its last turn: HANG.
- wrong_barrier_threads +32 (all sites) -> the first scheduler ``bar.sync`` never completes: HANG
  (not an mbarrier: printf-bisection localizes it).
Kernel-level switch: ``skip_rescale``: O is not multiplied by exp2((m_old - m_new) * scale_log2)
when the row max grows -> the earlier blocks are over-weighted: MISMATCH.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import ClassVar, NamedTuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import cute, pipeline
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.cute.runtime import from_dlpack, make_fake_stream, make_fake_tensor
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

TILE_M = 128  # two consumer warpgroups x 64 query rows
TILE_N = 128  # key block
CONSUMER_WARPGROUPS = 2
CONSUMER_WARPS = 4 * CONSUMER_WARPGROUPS
CONSUMER_THREADS = 128 * CONSUMER_WARPGROUPS
THREADS = 128 * (1 + CONSUMER_WARPGROUPS)
PRODUCER_REGS, CONSUMER_REGS = 40, 232
SMEM_BYTES_MAX = 232448
SWIZZLE_ALIGN = 1024  # a 128B-swizzled buffer starts on a 1024 B boundary
LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


class Barrier(IntEnum):
    """Named barrier ids (16 per CTA; the docstring's "Named barriers" says who counts on them)."""

    SYNC_THREADS = 0  # sync_threads and the pipeline init sync
    EPILOGUE = 1  # both consumer warpgroups between the stmatrix of O and its TMA store
    SCHEDULER = 2  # + w: consumer warpgroup w's turn to issue WGMMAs (ids 2 and 3)


def smem_struct(name: str, **fields) -> cute.struct:
    """``cute.struct`` with ``fields`` in order. (A class body's annotations would be strings
    here: this module keeps ``from __future__ import annotations`` for the DSL's signatures.)"""
    return cute.struct(type(name, (), {"__annotations__": fields}))


class Loads(NamedTuple):
    """The producer's TMA loads: copy atom and TMA view of Q, K and V."""

    tma_q: cute.CopyAtom
    mq: cute.Tensor
    tma_k: cute.CopyAtom
    mk: cute.Tensor
    tma_v: cute.CopyAtom
    mv: cute.Tensor


class Outputs(NamedTuple):
    """The epilogue's outputs: TMA store atom and view of O, and lse (plain stores)."""

    tma_o: cute.CopyAtom
    mo: cute.Tensor
    lse: cute.Tensor


class SmemLayouts(NamedTuple):
    """The smem layouts (swizzle + outer layout): the Q tile, the K / V ring, the O tile."""

    q: cute.ComposedLayout
    kv: cute.ComposedLayout
    o: cute.ComposedLayout


class Tiles(NamedTuple):
    """The CTA's smem tensors: Q, the K and V rings (S stages each), O."""

    sq: cute.Tensor
    sk: cute.Tensor
    sv: cute.Tensor
    so: cute.Tensor


class Pipes(NamedTuple):
    """The three PipelineTmaAsync, in creation order (the faults' ``pipeline`` index)."""

    k: pipeline.PipelineTmaAsync
    v: pipeline.PipelineTmaAsync
    q: pipeline.PipelineTmaAsync


class Work(NamedTuple):
    """This CTA's Q tile (``m_block`` of ``head``, ``batch``) and its key blocks [0, n_end)."""

    m_block: cutlass.Int32
    head: cutlass.Int32
    batch: cutlass.Int32
    n_end: cutlass.Int32


# ---- register-fragment views (no data movement) ------------------------------------------------

def acc_rows_cols(t: cute.Tensor) -> cute.Tensor:
    """WGMMA accumulator ((2, 2, V), M, N) viewed as (rows (2, M), columns (2, V, N)).

    In a WGMMA C fragment mode 0 is (column pair, row +0 / +8, column group of 8): a thread holds
    2 rows per M atom, and its 3 neighbours in the quad hold the other columns of those rows.
    """
    flat = cute.make_layout(t.shape)
    s, d = flat.shape, flat.stride
    rows_cols = cute.make_layout(((s[0][1], s[1]), (s[0][0], s[0][2], s[2])),
                                 stride=((d[0][1], d[1]), (d[0][0], d[0][2], d[2])))
    return cute.make_tensor(t.iterator, cute.composition(t.layout, rows_cols))


def acc_as_operand_a(t: cute.Tensor) -> cute.Tensor:
    """WGMMA accumulator ((2, 2, V), M, N) viewed as an A fragment ((2, 2, 2), M, (V / 2, N)).

    A bf16 A fragment of a k = 16 WGMMA holds, per thread, the same (column pair, row +0 / +8,
    column half) elements as 16 columns of an fp32 C fragment: S feeds the PV WGMMA unchanged.
    """
    s, d = t.layout.shape, t.layout.stride
    layout = cute.make_layout(((s[0][0], s[0][1], 2), s[1], (s[0][2] // 2, s[2])),
                              stride=((d[0][0], d[0][1], d[0][2]), d[1], (2 * d[0][2], d[2])))
    return cute.make_tensor(t.iterator, layout)


def transpose_smem(t: cute.Tensor) -> cute.Tensor:
    """(rows, cols, stages) smem tensor viewed as (cols, rows, stages) (V as the PV B operand)."""
    shape = (t.shape[1], t.shape[0], t.shape[2])
    return cute.composition(t, cute.make_ordered_layout(shape, order=(1, 0, 2)))


@cute.jit
def wgmma(tiled_mma: cute.TiledMma, acc: cute.Tensor, a: cute.Tensor, b: cute.Tensor,
          zero_init: cutlass.Constexpr[bool]):
    """acc (+)= a @ b over all k blocks: wgmma.fence, one wgmma.mma_async per k = 16, commit.

    A fresh atom per call: the accumulate flag is set inside dynamic loops.
    """
    warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for kb in cutlass.range_constexpr(cute.size(a.shape[2])):
        cute.gemm(atom, acc, a[(None, None, kb)], b[(None, None, kb)], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()


class Sm90Attention:
    PARAMS: ClassVar[dict[str, object]] = {
        "batch": 1, "heads": 2, "seqlen": 1000, "head_dim": 64, "causal": False, "stages": 2,
        "seed": 0,
    }
    CHOICES: ClassVar[dict[str, tuple]] = {"head_dim": (64, 128), "stages": (2, 3, 4)}
    SHRINKABLE = ("batch", "heads", "seqlen")
    ARCHS = ("sm_90a",)
    SWITCHES: ClassVar[dict[str, str]] = {
        "skip_rescale": "the running output is not rescaled when a row's max grows",
    }
    TOLERANCE = (1e-2, 1e-2)

    def __init__(self, batch=PARAMS["batch"], heads=PARAMS["heads"], seqlen=PARAMS["seqlen"],
                 head_dim=PARAMS["head_dim"], causal=PARAMS["causal"], stages=PARAMS["stages"],
                 seed=PARAMS["seed"], skip_rescale=False):
        if head_dim not in (64, 128):
            raise ValueError(f"head_dim={head_dim}: allowed 64, 128")
        if min(batch, heads, seqlen) < 1 or stages < 2:
            raise ValueError(f"need batch, heads, seqlen >= 1 and stages >= 2 (batch={batch} "
                             f"heads={heads} seqlen={seqlen} stages={stages})")
        if batch * seqlen * heads * head_dim >= 2**31:
            raise ValueError("element offsets are 32-bit: keep batch*seqlen*heads*d < 2**31")
        self.batch, self.heads, self.seqlen, self.d = batch, heads, seqlen, head_dim
        self.causal, self.stages, self.seed = causal, stages, seed
        self.skip_rescale = skip_rescale
        self.m_blocks = -(-seqlen // TILE_M)
        self.n_blocks = -(-seqlen // TILE_N)
        self.empty_arrivals = CONSUMER_WARPS
        self.scale_log2 = head_dim ** -0.5 * LOG2_E
        fields = self.smem_fields()
        self.storage = smem_struct("SharedStorage", **fields)
        self.smem_bytes = self.storage.size_in_bytes()
        # tx bytes per stage: one stage of each TMA-filled buffer (__call__ checks them against
        # cute.size_in_bytes of the smem layout of each TMA box)
        self.q_tx_bytes = fields["q"].dtype.size_in_bytes
        self.k_tx_bytes = fields["k"].dtype.size_in_bytes // stages
        self.v_tx_bytes = fields["v"].dtype.size_in_bytes // stages
        if self.smem_bytes > SMEM_BYTES_MAX:
            raise ValueError(f"~{self.smem_bytes} B of smem for {stages} stages at d={head_dim}: "
                             f"over {SMEM_BYTES_MAX}")

    def smem_fields(self) -> dict:
        """The CTA's smem, in order: the K, V and Q mbarriers (full[0..S) then empty[0..S)
        each; Q has S = 1), then Q, the K ring, the V ring and O, each 128B-swizzled, so
        1024 B aligned (the mbarriers are padded to 1024 B)."""
        mem, align, bf16, s = cute.struct.MemRange, cute.struct.Align, cutlass.BFloat16, self.stages
        return {
            "k_barriers": mem[cutlass.Int64, 2 * s],
            "v_barriers": mem[cutlass.Int64, 2 * s],
            "q_barriers": mem[cutlass.Int64, 2],
            "q": align[mem[bf16, TILE_M * self.d], SWIZZLE_ALIGN],
            "k": align[mem[bf16, TILE_N * self.d * s], SWIZZLE_ALIGN],
            "v": align[mem[bf16, TILE_N * self.d * s], SWIZZLE_ALIGN],
            "o": align[mem[bf16, TILE_M * self.d], SWIZZLE_ALIGN],
        }

    def check_storage(self, layouts: SmemLayouts, q_box, kv_box):
        """Trace time: SharedStorage holds each smem layout exactly, and each pipeline's
        expect_tx count is the bytes of its TMA box (cute.size_in_bytes)."""
        fields = self.smem_fields()
        for name, layout in (("q", layouts.q), ("k", layouts.kv), ("v", layouts.kv),
                             ("o", layouts.o)):
            if fields[name].dtype.size != cute.cosize(layout.outer):
                raise ValueError(f"SharedStorage.{name}: {fields[name].dtype.size} elements for "
                                 f"a layout of cosize {cute.cosize(layout.outer)}")
        boxes = {"q": (self.q_tx_bytes, q_box), "k": (self.k_tx_bytes, kv_box),
                 "v": (self.v_tx_bytes, kv_box)}
        for name, (tx_bytes, box) in boxes.items():
            if tx_bytes != cute.size_in_bytes(cutlass.BFloat16, box):
                raise ValueError(f"{name} tx bytes {tx_bytes}: its TMA box is "
                                 f"{cute.size_in_bytes(cutlass.BFloat16, box)} B")

    # ---- host side ------------------------------------------------------------------------
    def _bshd(self, t: cute.Tensor) -> cute.Tensor:
        """[b, s, h, d] contiguous viewed as (s, d, h, b): a 2-D tile per (head, batch)."""
        s, h, d = cutlass.Int32(self.seqlen), self.heads, self.d
        return cute.make_tensor(t.iterator, cute.make_layout(
            (s, d, h, self.batch), stride=(h * d, 1, d, s * h * d)))

    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, o: cute.Tensor,
                 lse: cute.Tensor, stream: cuda.CUstream):
        q, k, v, o = self._bshd(q), self._bshd(k), self._bshd(v), self._bshd(o)
        d, dtype = self.d, cutlass.BFloat16
        tiled_mma_qk = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, OperandMajorMode.K, OperandMajorMode.K, cutlass.Float32,
            (CONSUMER_WARPGROUPS, 1, 1), tiler_mn=(64, TILE_N))
        tiled_mma_pv = sm90_utils.make_trivial_tiled_mma(
            dtype, dtype, OperandMajorMode.K, OperandMajorMode.MN, cutlass.Float32,
            (CONSUMER_WARPGROUPS, 1, 1), tiler_mn=(64, d), a_source=warpgroup.OperandSource.RMEM)
        tiler = (TILE_M, TILE_N, d)
        q_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tiler, dtype, 1)
        kv_ring = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tiler, dtype, self.stages)
        o_layout = sm90_utils.make_smem_layout_epi(dtype, LayoutEnum.ROW_MAJOR, (TILE_M, d), 1)
        layouts = SmemLayouts(q_layout, kv_ring, o_layout)
        q_box, kv_box = cute.slice_(q_layout, (None, None, 0)), cute.slice_(kv_ring, (None, None, 0))
        self.check_storage(layouts, q_box, kv_box)
        load = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, mq = cpasync.make_tiled_tma_atom(load, q, q_box, (TILE_M, d))
        tma_k, mk = cpasync.make_tiled_tma_atom(load, k, kv_box, (TILE_N, d))
        tma_v, mv = cpasync.make_tiled_tma_atom(load, v, kv_box, (TILE_N, d))
        tma_o, mo = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), o,
                                                cute.slice_(o_layout, (None, None, 0)),
                                                (TILE_M, d))
        self.kernel(tiled_mma_qk, tiled_mma_pv, Loads(tma_q, mq, tma_k, mk, tma_v, mv),
                    Outputs(tma_o, mo, lse), layouts).launch(
            grid=(self.m_blocks, self.heads, self.batch), block=(THREADS, 1, 1),
            min_blocks_per_mp=1, stream=stream)

    # ---- device side ----------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma, loads: Loads,
               outputs: Outputs, layouts: SmemLayouts):
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        bx, head, batch = cute.arch.block_idx()
        m_block = self.m_blocks - 1 - bx  # heaviest causal tiles first
        n_end = self.n_blocks  # key blocks [0, n_end) are visible to this Q tile
        if cutlass.const_expr(self.causal):
            n_end = cutlass.min(n_end, (m_block * TILE_M + TILE_M + TILE_N - 1) // TILE_N)

        # -- prologue: smem, the three pipelines (Q's create fences + syncs for all) ------------
        storage = SmemAllocator().allocate(self.storage)
        k_barriers = storage.k_barriers.data_ptr()
        v_barriers = storage.v_barriers.data_ptr()
        q_barriers = storage.q_barriers.data_ptr()
        tiles = Tiles(storage.q.get_tensor(layouts.q.outer, swizzle=layouts.q.inner),
                      storage.k.get_tensor(layouts.kv.outer, swizzle=layouts.kv.inner),
                      storage.v.get_tensor(layouts.kv.outer, swizzle=layouts.kv.inner),
                      storage.o.get_tensor(layouts.o.outer, swizzle=layouts.o.inner))
        if warp == 0:
            for atom in (loads.tma_q, loads.tma_k, loads.tma_v, outputs.tma_o):
                cpasync.prefetch_descriptor(atom)
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.empty_arrivals)
        k_pipe = pipeline.PipelineTmaAsync.create(
            num_stages=self.stages, producer_group=producer, consumer_group=consumers,
            tx_count=self.k_tx_bytes, barrier_storage=k_barriers, defer_sync=True)
        v_pipe = pipeline.PipelineTmaAsync.create(
            num_stages=self.stages, producer_group=producer, consumer_group=consumers,
            tx_count=self.v_tx_bytes, barrier_storage=v_barriers, defer_sync=True)
        q_pipe = pipeline.PipelineTmaAsync.create(
            num_stages=1, producer_group=producer, consumer_group=consumers,
            tx_count=self.q_tx_bytes, barrier_storage=q_barriers)

        # -- warp roles: one if/else over warpgroups so setmaxnreg applies -------------------
        pipes, work = Pipes(k_pipe, v_pipe, q_pipe), Work(m_block, head, batch, n_end)
        if warp < 4:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                self.load(pipes, loads, tiles, work)
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            self.attend(pipes, tiled_mma_qk, tiled_mma_pv, outputs, tiles, work)

    @cute.jit
    def load(self, pipes: Pipes, loads: Loads, tiles: Tiles, work: Work):
        """Producer warp: the Q tile once, then K[n] and V[n] for n = n_end-1 .. 0."""
        k_pipe, v_pipe, q_pipe = pipes
        tma_q, mq, tma_k, mk, tma_v, mv = loads
        sq, sk, sv, _ = tiles
        m_block, head, batch, n_end = work
        d = self.d
        one = cute.make_layout(1)
        gq = cute.local_tile(mq[(None, None, head, batch)], (TILE_M, d), (None, 0))
        tsq, tgq = cpasync.tma_partition(tma_q, 0, one, cute.group_modes(sq, 0, 2),
                                         cute.group_modes(gq, 0, 2))
        gk = cute.local_tile(mk[(None, None, head, batch)], (TILE_N, d), (None, 0))
        tsk, tgk = cpasync.tma_partition(tma_k, 0, one, cute.group_modes(sk, 0, 2),
                                         cute.group_modes(gk, 0, 2))
        gv = cute.local_tile(mv[(None, None, head, batch)], (TILE_N, d), (None, 0))
        tsv, tgv = cpasync.tma_partition(tma_v, 0, one, cute.group_modes(sv, 0, 2),
                                         cute.group_modes(gv, 0, 2))

        q_state = pipeline.PipelineState(1, cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(1))
        q_pipe.producer_acquire(q_state)
        cute.copy(tma_q, tgq[(None, m_block)], tsq[(None, 0)],
                  tma_bar_ptr=q_pipe.producer_get_barrier(q_state))
        q_pipe.producer_commit(q_state)

        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        # -- mainloop: key blocks from the last visible one down (the masked one first) ------
        for i in cutlass.range(n_end, unroll=1):
            n = n_end - 1 - i
            k_pipe.producer_acquire(k_state)
            cute.copy(tma_k, tgk[(None, n)], tsk[(None, k_state.index)],
                      tma_bar_ptr=k_pipe.producer_get_barrier(k_state))
            k_pipe.producer_commit(k_state)
            k_state.advance()
            v_pipe.producer_acquire(v_state)
            cute.copy(tma_v, tgv[(None, n)], tsv[(None, v_state.index)],
                      tma_bar_ptr=v_pipe.producer_get_barrier(v_state))
            v_pipe.producer_commit(v_state)
            v_state.advance()
        # -- tail: every slot released before the warp exits ---------------------------------
        k_pipe.producer_tail(k_state)
        v_pipe.producer_tail(v_state)

    @cute.jit
    def attend(self, pipes: Pipes, tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma,
               outputs: Outputs, tiles: Tiles, work: Work):
        """Consumer warpgroups: S = QK^T, online softmax, O += PV per key block; epilogue."""
        k_pipe, v_pipe, q_pipe = pipes
        tma_o, mo, lse = outputs
        sq, sk, sv, so = tiles
        m_block, head, batch, n_end = work
        tid, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        ctid = tid - 128  # thread index among the 256 consumer threads
        wg = cute.arch.make_warp_uniform(ctid // 128)
        d = self.d

        # WGMMA operands: Q rows 64*wg .. 64*wg+63 and K from smem; P from registers, V^T smem
        wg_qk = tiled_mma_qk.get_slice(wg * 128)
        wg_pv = tiled_mma_pv.get_slice(wg * 128)
        t_q = wg_qk.make_fragment_A(wg_qk.partition_A(sq))
        t_k = wg_qk.make_fragment_B(wg_qk.partition_B(sk))
        t_vt = wg_pv.make_fragment_B(wg_pv.partition_B(transpose_smem(sv)))
        acc_s = cute.make_rmem_tensor(wg_qk.partition_shape_C((TILE_M, TILE_N)), cutlass.Float32)
        acc_o = cute.make_rmem_tensor(wg_pv.partition_shape_C((TILE_M, d)), cutlass.Float32)
        p_view = acc_as_operand_a(acc_s)
        p = cute.make_rmem_tensor(p_view.shape, cutlass.BFloat16)
        # (row, column) of each S element inside the tile, for the mask and the lse rows
        coords = acc_rows_cols(tiled_mma_qk.get_slice(ctid).partition_C(
            cute.make_identity_tensor((TILE_M, TILE_N))))
        s_rc = acc_rows_cols(acc_s)
        o_rc = acc_rows_cols(acc_o)
        rows = cute.size(s_rc, mode=[0])
        row_max = cute.make_rmem_tensor(rows, cutlass.Float32)
        row_sum = cute.make_rmem_tensor(rows, cutlass.Float32)
        rescale = cute.make_rmem_tensor(rows, cutlass.Float32)  # O's factor per row, per block
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)

        sched = Barrier.SCHEDULER
        if wg == 1:  # warpgroup 0 takes the first turn
            cute.arch.barrier_arrive(barrier_id=sched, number_of_threads=CONSUMER_THREADS)
        q_state = pipeline.PipelineState(1, cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(0))
        q_pipe.consumer_wait(q_state)
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        t_q0 = t_q[(None, None, None, 0)]
        acc_o.fill(0.0)  # every PV accumulates: the first one runs inside the dynamic loop

        # -- first turn: S = Q K^T of the first (masked) key block, softmax, P ----------------
        k_pipe.consumer_wait(k_state)
        cute.arch.barrier(barrier_id=sched + wg, number_of_threads=CONSUMER_THREADS)
        wgmma(tiled_mma_qk, acc_s, t_q0, t_k[(None, None, None, k_state.index)], True)
        cute.arch.barrier_arrive(barrier_id=sched + 1 - wg, number_of_threads=CONSUMER_THREADS)
        warpgroup.wait_group(0)
        k_pipe.consumer_release(k_state)
        k_state.advance()
        self.mask(s_rc, coords, m_block, n_end - 1)
        self.softmax(s_rc, row_max, row_sum, rescale, first=True)
        p.store(p_view.load().to(cutlass.BFloat16))

        # -- mainloop, one turn per key block: issue S(n) = Q K(n)^T and O += P(n+1) V(n+1),
        # softmax of S(n) while the PV WGMMA runs, then rescale O and convert P(n) ----------
        for _i in cutlass.range(1, n_end, unroll=1):
            k_pipe.consumer_wait(k_state)
            v_pipe.consumer_wait(v_state)
            cute.arch.barrier(barrier_id=sched + wg, number_of_threads=CONSUMER_THREADS)
            wgmma(tiled_mma_qk, acc_s, t_q0, t_k[(None, None, None, k_state.index)], True)
            wgmma(tiled_mma_pv, acc_o, p, t_vt[(None, None, None, v_state.index)], False)
            cute.arch.barrier_arrive(barrier_id=sched + 1 - wg,
                                     number_of_threads=CONSUMER_THREADS)
            warpgroup.wait_group(1)  # S(n) is in registers; PV may still run
            k_pipe.consumer_release(k_state)
            k_state.advance()
            self.softmax(s_rc, row_max, row_sum, rescale, first=False)
            warpgroup.wait_group(0)  # PV done: P and O may be touched again
            v_pipe.consumer_release(v_state)
            v_state.advance()
            if cutlass.const_expr(not self.skip_rescale):
                for r in cutlass.range_constexpr(rows):
                    for c in cutlass.range_constexpr(cute.size(o_rc, mode=[1])):
                        o_rc[r, c] = o_rc[r, c] * rescale[r]
            p.store(p_view.load().to(cutlass.BFloat16))

        # -- last turn: O += P V of the last key block ------------------------------------------
        v_pipe.consumer_wait(v_state)
        cute.arch.barrier(barrier_id=sched + wg, number_of_threads=CONSUMER_THREADS)
        wgmma(tiled_mma_pv, acc_o, p, t_vt[(None, None, None, v_state.index)], False)
        if wg == 0:  # warpgroup 1's last turn
            cute.arch.barrier_arrive(barrier_id=sched + 1, number_of_threads=CONSUMER_THREADS)
        warpgroup.wait_group(0)
        v_pipe.consumer_release(v_state)
        v_state.advance()

        # -- epilogue: normalize, lse, O -> smem -> one TMA store ----------------------------
        for r in cutlass.range_constexpr(rows):
            total = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
            inv = cutlass.Float32(0.0)
            if total > 0.0:
                inv = 1.0 / total
            for c in cutlass.range_constexpr(cute.size(o_rc, mode=[1])):
                o_rc[r, c] = o_rc[r, c] * inv
            row = m_block * TILE_M + coords[r, 0][0]
            if tid % 4 == 0 and row < self.seqlen:
                m = row_max[r]
                if m == -cutlass.Float32.inf:
                    m = cutlass.Float32(0.0)
                lse[batch, head, row] = (m * self.scale_log2 + cute.math.log2(total)) * LN_2
        stmatrix = sm90_utils.get_smem_store_op(LayoutEnum.ROW_MAJOR, cutlass.BFloat16,
                                                cutlass.Float32)
        r2s = cute.make_tiled_copy_C(stmatrix, tiled_mma_pv)
        thr_r2s = r2s.get_slice(ctid)
        o_out = cute.make_rmem_tensor_like(acc_o, cutlass.BFloat16)
        o_out.store(acc_o.load().to(cutlass.BFloat16))
        cute.copy(r2s, thr_r2s.retile(o_out), thr_r2s.partition_D(so)[(None, None, None, 0)])
        # stmatrix writes are generic-proxy; the TMA store reads through the async proxy
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=Barrier.EPILOGUE, number_of_threads=CONSUMER_THREADS)
        if warp == 4:
            go = cute.local_tile(mo[(None, None, head, batch)], (TILE_M, d), (None, 0))
            bsg_so, bsg_go = cpasync.tma_partition(tma_o, 0, cute.make_layout(1),
                                                   cute.group_modes(so, 0, 2),
                                                   cute.group_modes(go, 0, 2))
            cute.copy(tma_o, bsg_so[(None, 0)], bsg_go[(None, m_block)])
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def mask(self, s_rc: cute.Tensor, coords: cute.Tensor, m_block: cutlass.Int32,
             n: cutlass.Int32):
        """-inf for the scores of key block n past seqlen or (causal) above the diagonal.

        Only the first block a tile visits (n = n_end - 1) has either: the blocks run from the
        last visible one down, and with TILE_M == TILE_N the diagonal block is the last one.
        """
        for r in cutlass.range_constexpr(cute.size(s_rc, mode=[0])):
            for c in cutlass.range_constexpr(cute.size(s_rc, mode=[1])):
                row = m_block * TILE_M + coords[r, c][0]
                col = n * TILE_N + coords[r, c][1]
                hidden = col >= self.seqlen
                if cutlass.const_expr(self.causal):
                    hidden = hidden | (col > row)
                if hidden:
                    s_rc[r, c] = -cutlass.Float32.inf

    @cute.jit
    def softmax(self, s_rc: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor,
                rescale: cute.Tensor, first: cutlass.Constexpr[bool]):
        """Online softmax of one block of scores, in place: S -> exp2(S * scale_log2 - m).

        Rows are spread over the 4 threads of a quad. Updates the running max and sum and
        leaves in ``rescale`` the factor exp2((m_old - m_new) * scale_log2) that the caller
        applies to O once the PV WGMMA reading the previous P has finished.
        """
        scale_log2 = self.scale_log2
        for r in cutlass.range_constexpr(cute.size(s_rc, mode=[0])):
            m_old = row_max[r]
            m_new = m_old
            for c in cutlass.range_constexpr(cute.size(s_rc, mode=[1])):
                m_new = cute.arch.fmax(m_new, s_rc[r, c])
            m_new = cute.arch.warp_reduction_max(m_new, threads_in_group=4)
            row_max[r] = m_new
            if m_new == -cutlass.Float32.inf:  # a fully masked row so far: keep P = 0, no NaN
                m_new = cutlass.Float32(0.0)
            base = m_new * scale_log2
            partial = cutlass.Float32(0.0)
            for c in cutlass.range_constexpr(cute.size(s_rc, mode=[1])):
                e = cute.math.exp2(s_rc[r, c] * scale_log2 - base, fastmath=True)
                s_rc[r, c] = e
                partial = partial + e
            if cutlass.const_expr(first):
                row_sum[r] = partial
            else:
                factor = cute.math.exp2(m_old * scale_log2 - base, fastmath=True)
                row_sum[r] = row_sum[r] * factor + partial
                rescale[r] = factor

    # ---- interface ------------------------------------------------------------------------
    def _shape(self):
        return (self.batch, self.seqlen, self.heads, self.d)

    def fake_args(self):
        shape = self._shape()
        stride = (self.seqlen * self.heads * self.d, self.heads * self.d, self.d, 1)
        qkvo = [make_fake_tensor(cutlass.BFloat16, shape, stride=stride, assumed_align=16)
                for _ in range(4)]
        lse = make_fake_tensor(cutlass.Float32, (self.batch, self.heads, self.seqlen),
                               stride=(self.heads * self.seqlen, self.seqlen, 1), assumed_align=16)
        return (*qkvo, lse, make_fake_stream())

    def make_inputs(self, device):
        import torch

        g = torch.Generator(device="cpu").manual_seed(self.seed)
        shape = self._shape()
        # scores with std ~2 after scaling: peaked rows, so a stale block or a missed rescale
        # moves outputs by O(1)
        q = (torch.randn(shape, generator=g) * 2.0).to(torch.bfloat16)
        k = torch.randn(shape, generator=g).to(torch.bfloat16)
        v = torch.randn(shape, generator=g).to(torch.bfloat16)
        o = torch.full(shape, float("nan"), dtype=torch.bfloat16)
        lse = torch.full((self.batch, self.heads, self.seqlen), float("nan"))
        return {k_: t.to(device) for k_, t in
                {"q": q, "k": k, "v": v, "o": o, "lse": lse}.items()}

    def cute_args(self, tensors):
        import torch

        args = tuple(from_dlpack(tensors[n], assumed_align=16) for n in
                     ("q", "k", "v", "o", "lse"))
        return (*args, cuda.CUstream(torch.cuda.current_stream().cuda_stream))

    def reference_parts(self, tensors):
        """(O [b, s, h, d] fp32, lse [b, h, s] fp32) from an fp32 softmax(QK^T * scale) V."""
        import torch

        q, k, v = (tensors[n].float().transpose(1, 2) for n in ("q", "k", "v"))  # [b, h, s, d]
        scores = (q @ k.transpose(-1, -2)) * self.d ** -0.5
        if self.causal:
            visible = torch.ones(self.seqlen, self.seqlen, dtype=torch.bool,
                                 device=scores.device).tril()
            scores = scores.masked_fill(~visible, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.softmax(scores, dim=-1) @ v
        return out.transpose(1, 2), lse

    def reference(self, tensors):
        import torch

        out, lse = self.reference_parts(tensors)
        # the kernel rounds O once to bf16
        return torch.cat([out.to(torch.bfloat16).float().flatten(), lse.flatten()])

    def output(self, tensors):
        import torch

        return torch.cat([tensors["o"].float().flatten(), tensors["lse"].flatten()])
