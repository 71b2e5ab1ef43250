"""Persistent Blackwell GEMM (SM100): C = A @ B^T, bf16 in, fp32 accumulate in TMEM, bf16 out.

A is [M, K] and B is [N, K], both K-major (row-major); C is [M, N] row-major. Every output
element is a K-long dot product of its own row of A and column of B^T, so a stage consumed
before its TMA landed (zero or stale data), a stage overwritten while the MMA still reads it,
or an accumulator read before the MMA finished (or after another tile reused it) all show up as
a MISMATCH against ``A.float() @ B.float().T``.

Warp roles (block = 6 warps = 192 threads, one CTA per SM unless smem/TMEM allow two):
- warps 0-3: epilogue. Warp 0 allocates TMEM (tcgen05.alloc) and frees it at the end
  (tcgen05.dealloc). Per tile: wait acc_full; per epilogue subtile: TMEM -> registers
  (tcgen05.ld, then tcgen05.wait::ld), fp32 -> bf16, registers -> smem, TMA store
  (cp.async.bulk.tensor shared -> global); then release acc_empty.
- warp 4: MMA. Per tile: acquire acc_empty, then per k-tile wait ab_full, issue tcgen05.mma
  (one per 16-wide k block), release ab_empty with tcgen05.commit; after the last k-tile,
  commit acc_full (tcgen05.commit arrives when every MMA issued before it has completed).
- warp 5: TMA producer. Per k-tile: acquire ab_empty (+ arrive.expect_tx), TMA A and B.

cta_group = 1: one CTA computes a 128 x tile_n tile. cta_group = 2 (tcgen05 cta_group::2, a
cluster of 2 CTAs): the pair computes a 256 x tile_n tile; CTA v in {0, 1} loads rows
[128 v, 128 v + 128) of the A tile and rows [tile_n/2 v, tile_n/2 (v + 1)) of the B tile, and
holds rows [128 v, 128 v + 128) of the accumulator in its own TMEM. Only the leader CTA (v = 0)
issues MMAs and commits; its commits multicast to both CTAs' barriers.

Persistent schedule: MMA tiles are numbered row-major over (ceil(M / (128 cta_group)),
ceil(N / tile_n)); cluster c (= blockIdx.x // cta_group) of G clusters handles tiles c, c + G,
... Every role walks the same sequence, so the pipelines stay in lock step.

Pipelines and barrier arithmetic (barriers full[0..S) then empty[0..S) per pipeline, in smem,
initialised by warp 0 inside ``create``, which ends with a CTA sync, or a cluster sync when
cta_group = 2):

ab = PipelineTmaUmma (S = ``stages``), TMA warp -> MMA warp:
- full[s]  arrive count 1: the leader's elect_one ``mbarrier.arrive.expect_tx`` in
  producer_acquire (the peer CTA skips the arrive: ``is_leader_cta`` is false there).
- empty[s] arrive count 1: ``consumer_release`` is one ``tcgen05.commit`` from the leader's MMA
  warp; with cta_group = 2 it is multicast (mask 0b11) to the empty[s] of both CTAs, so each
  CTA's producer sees exactly one arrival per phase.
- tx bytes. Per CTA and stage the TMA lands
      a_bytes = 128 * tile_k * 2            (A rows of this CTA, bf16)
      b_bytes = tile_n / cta_group * tile_k * 2
  With cta_group = 2 both CTAs' loads complete_tx on the LEADER's full[s] (the 2-SM TMA
  addresses the leader's barrier), and only the leader expects bytes, so
      tx_bytes = cta_group * (a_bytes + b_bytes)
  e.g. tile_n = 256, tile_k = 64: cta_group 1: 16384 + 32768 = 49152;
  cta_group 2: 2 * (16384 + 16384) = 65536. Forgetting the doubling (expecting 32768) lets
  full[s] complete when half the stage has landed. That bug is the registry fault
  ``expect_tx_no_2cta_doubling`` (tx_count / 2 in ``PipelineTmaUmma.create``); it produces
  the same PTX as ``wrong_expect_tx`` with delta_bytes = -tx_bytes / 2.
  Out-of-bounds boxes (ragged M, N, K) are zero-filled by TMA and still count in full.

acc = PipelineUmmaAsync (A = ``acc_stages`` accumulators in TMEM), MMA warp -> epilogue:
- full[a]  arrive count 1: ``producer_commit`` = tcgen05.commit (multicast to both CTAs when
  cta_group = 2: each CTA's epilogue waits on its own full[a]).
- empty[a] arrive count 4 * cta_group: one elected lane per epilogue warp arrives; with
  cta_group = 2 the peer's 4 warps arrive remotely on the leader's empty[a].
Phases (both pipelines): producers start at phase 1, consumers at phase 0; ``advance`` past
the last slot flips the phase. ``producer_tail`` drains every empty barrier before the TMA warp
(ab) and the MMA warp (acc) exit.

Other synchronisation (named barrier ids: the IntEnum ``Barrier``): named barrier 1
(``TMEM_ALLOC``, MMA + epilogue warps, 160 threads) publishes the TMEM address written by
tcgen05.alloc; named barrier 2 (``EPILOGUE``, epilogue warps, 128 threads) orders the
smem writes of a subtile before its TMA store and the store's smem reads before the buffer is
rewritten (bulk-group wait). With cta_group = 2, tcgen05.dealloc is preceded by an mbarrier
handshake with the peer (TmemAllocator.free).

TMEM: acc_stages * tile_n fp32 columns (128 lanes), rounded up to a power of two, <= 512.
When one CTA takes all 512 columns, a second CTA on the same SM blocks in tcgen05.alloc until
the first deallocates: the serialisation the ``tmem_dealloc_early`` switch breaks.

Ragged shapes: M is arbitrary; N and K must be multiples of 8 (16-byte TMA row pitch). TMA
loads zero-fill out-of-bounds rows/columns (zeros add nothing to the dot products) and TMA
stores clip to the tensor, so partial tiles need no predicates.

Faults that apply (cutedebug patches them at trace time; none is written here) and what each
should cause on Blackwell (not yet observed on hardware: no Blackwell GPU was available):
- wrong_expect_tx +k: ab full[s] never completes -> HANG in the MMA warp's consumer_wait.
- wrong_expect_tx -k / expect_tx_no_2cta_doubling: full[s] completes before the stage landed;
  the surplus bytes land on the next phase, whose tx count then never returns to zero ->
  HANG in consumer_wait (the tma_stream analogue measured HANG on an H200), MISMATCH if the
  count happens to cross zero.
- skip_consumer_release (k): patches both pipelines' releases (the ab tcgen05.commit and the
  epilogue's acc arrive); the stage / accumulator released at count k never frees -> HANG in
  producer_acquire (empty barrier) of the TMA warp and of the MMA warp.
- extra_consumer_release (k): a doubled tcgen05.commit (ab) / acc arrive: the empty barrier
  runs one phase ahead, the producer refills a slot before its previous fill was consumed and
  laps the full barrier -> producer and consumer wait on each other: HANG (as measured on
  tma_stream, H200); MISMATCH if the run ends first (a stage / accumulator overwritten in use).
- skip_producer_tail: both tails removed. PASS expected: every remote arrive targets a CTA that
  is still running its epilogue (and, with cta_group = 2, the TMEM dealloc handshake).
- missing_phase_flip consumer: waits on an already completed parity -> MMA reads stale stages,
  epilogue reads unfinished accumulators -> MISMATCH (HANG if a producer laps the barrier
  first). producer: on its second lap it waits on empty parity 1 again, now the parity of the
  phase in progress, which needs a release of data not loaded yet -> HANG in producer_acquire.
- wrong_arrive_count empty +1: HANG in producer_acquire.
Kernel-level switch:
- ``tmem_dealloc_early``: warp 0 deallocates TMEM as soon as the address is published (before
  the epilogue's first tcgen05.ld, racing ahead of the first MMA, which waits for a TMA stage)
  and does not free it again at the end. With one CTA per SM the columns stay
  untouched -> PASS; with two CTAs per SM and 512 columns each, the second CTA's tcgen05.alloc
  succeeds at once and both accumulate into the same columns -> MISMATCH.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar, NamedTuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass import cute, pipeline
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, tcgen05
from cutlass.cute.runtime import from_dlpack, make_fake_stream, make_fake_tensor
from cutlass.memory import SmemAllocator, TmemAllocator
from cutlass.tensor_utils import LayoutEnum

ELEM_BYTES = 2  # bf16
CTA_M = 128  # accumulator rows per CTA (TMEM lanes)
MMA_K = 16  # k extent of one bf16 tcgen05.mma
SMEM_BYTES_MAX = 227 * 1024
TMEM_COLS_MAX = 512
EPI_WARPS = (0, 1, 2, 3)
MMA_WARP = 4
TMA_WARP = 5
C_STAGES = 2  # epilogue smem buffers
SMEM_ALIGN = 128  # each smem buffer (the allocations this kernel always made) starts 128 B aligned


class Barrier(IntEnum):
    """Named barrier ids (16 per CTA)."""

    SYNC_THREADS = 0  # sync_threads and create()'s CTA sync
    TMEM_ALLOC = 1  # MMA + epilogue warps (160 threads): the TMEM address hand-off
    EPILOGUE = 2  # epilogue warps (128 threads): smem subtile -> TMA store


def smem_struct(name: str, **fields) -> cute.struct:
    """``cute.struct`` with ``fields`` in order. (A class body's annotations would be strings
    here: this module keeps ``from __future__ import annotations`` for the DSL's signatures.)"""
    return cute.struct(type(name, (), {"__annotations__": fields}))


class Loads(NamedTuple):
    """The TMA warp's loads: copy atom and TMA view of A, then of B."""

    tma_a: cute.CopyAtom
    ga: cute.Tensor
    tma_b: cute.CopyAtom
    gb: cute.Tensor


class Store(NamedTuple):
    """The epilogue's TMA store: copy atom and TMA view of C, and its subtile."""

    tma_c: cute.CopyAtom
    gc: cute.Tensor
    epi_tile: cute.Tile


class SmemLayouts(NamedTuple):
    """The staged smem layouts (swizzle + outer layout) of A, B and the C subtiles."""

    a: cute.ComposedLayout
    b: cute.ComposedLayout
    c: cute.ComposedLayout


def tile_origin(tile, tiles_n: int, tile_m: int, tile_n: int):
    """(row, col) of the first element of linear MMA tile ``tile`` (row-major tile order)."""
    return (tile // tiles_n) * tile_m, (tile % tiles_n) * tile_n


class Sm100Gemm:
    PARAMS: ClassVar[dict[str, object]] = {
        "m": 2048, "n": 2048, "k": 2048, "cta_group": 1, "tile_n": 256, "tile_k": 64,
        "stages": 4, "acc_stages": 2, "ctas": 148, "seed": 0,
    }
    CHOICES: ClassVar[dict[str, tuple]] = {
        "cta_group": (1, 2),
        "tile_n": (64, 128, 256),
        "tile_k": (64,),
        "stages": (2, 3, 4, 5, 6, 8),
        "acc_stages": (1, 2, 4),
    }
    SHRINKABLE = ("m", "n", "k", "ctas")
    ARCHS = ("sm_100a",)
    SWITCHES: ClassVar[dict[str, str]] = {
        "tmem_dealloc_early": "TMEM deallocated as soon as it is allocated, while the MMAs "
                              "and the epilogue still use it",
    }
    # fp32 accumulation of K products, one bf16 rounding of the result: a few bf16 ulps
    TOLERANCE = (2e-2, 2e-2)

    def __init__(self, m=PARAMS["m"], n=PARAMS["n"], k=PARAMS["k"],
                 cta_group=PARAMS["cta_group"], tile_n=PARAMS["tile_n"],
                 tile_k=PARAMS["tile_k"], stages=PARAMS["stages"],
                 acc_stages=PARAMS["acc_stages"], ctas=PARAMS["ctas"], seed=PARAMS["seed"],
                 tmem_dealloc_early=False):
        if cta_group not in (1, 2):
            raise ValueError(f"cta_group={cta_group}: allowed 1 or 2")
        if m < 1 or n < 8 or k < 8 or stages < 2 or ctas < cta_group:
            raise ValueError(f"need m >= 1, n >= 8, k >= 8, stages >= 2, ctas >= cta_group "
                             f"(m={m} n={n} k={k} stages={stages} ctas={ctas})")
        if n % 8 or k % 8:
            raise ValueError(f"n={n}, k={k}: TMA needs 16-byte row pitches (multiples of 8)")
        if tile_k % MMA_K:
            raise ValueError(f"tile_k={tile_k}: a multiple of the MMA's k ({MMA_K})")
        if tile_n % (16 * cta_group):
            raise ValueError(f"tile_n={tile_n}: must split into cta_group={cta_group} B halves")
        self.m, self.n, self.k, self.seed = m, n, k, seed
        self.cta_group, self.tile_n, self.tile_k = cta_group, tile_n, tile_k
        self.stages, self.acc_stages = stages, acc_stages
        self.tmem_dealloc_early = tmem_dealloc_early
        self.mma_m = CTA_M * cta_group
        self.tiles_m = -(-m // self.mma_m)
        self.tiles_n = -(-n // tile_n)
        self.num_tiles = self.tiles_m * self.tiles_n
        self.k_tiles = -(-k // tile_k)
        self.clusters = min(ctas // cta_group, self.num_tiles)
        self.grid = self.clusters * cta_group
        # -- barrier arithmetic (see the module docstring) --
        self.acc_empty_arrivals = len(EPI_WARPS) * cta_group
        cols = acc_stages * tile_n
        self.tmem_cols = max(32, 1 << (cols - 1).bit_length())
        if self.tmem_cols > TMEM_COLS_MAX:
            raise ValueError(f"acc_stages * tile_n = {cols} TMEM columns: over {TMEM_COLS_MAX}")
        fields = self.smem_fields()
        self.storage = smem_struct("SharedStorage", **fields)
        self.smem_bytes = self.storage.size_in_bytes()
        # one stage of this CTA's A and B rings (__call__ checks the tx bytes against
        # cute.size_in_bytes of the TMA boxes' smem layouts)
        self.a_bytes = fields["a"].dtype.size_in_bytes // stages
        self.b_bytes = fields["b"].dtype.size_in_bytes // stages
        self.tx_bytes = cta_group * (self.a_bytes + self.b_bytes)
        if self.smem_bytes > SMEM_BYTES_MAX:
            raise ValueError(f"{self.smem_bytes} bytes of smem for {stages} stages: over "
                             f"{SMEM_BYTES_MAX}")
        self.threads = 32 * (len(EPI_WARPS) + 2)

    def smem_fields(self) -> dict:
        """The CTA's smem, in order: the ab and acc mbarriers (full then empty each), the
        peer's TMEM-dealloc mbarrier, the TMEM address (written by tcgen05.alloc), then this
        CTA's A ring (128 x tile_k), B ring (tile_n / cta_group x tile_k) and C subtile ring
        (C_STAGES epilogue subtiles), each 128 B aligned."""
        mem, align, bf16, s = cute.struct.MemRange, cute.struct.Align, cutlass.BFloat16, self.stages
        epi_m, epi_n = sm100_utils.compute_epilogue_tile_size(
            CTA_M, self.tile_n, self.cta_group == 2, bf16.width, None,
            LayoutEnum.ROW_MAJOR.is_m_major_c())
        return {
            "ab_bars": mem[cutlass.Int64, 2 * s],
            "acc_bars": mem[cutlass.Int64, 2 * self.acc_stages],
            "dealloc_bar": mem[cutlass.Int64, 1],
            "tmem_holder": align[mem[cutlass.Int32, 1], 8],
            "a": align[mem[bf16, CTA_M * self.tile_k * s], SMEM_ALIGN],
            "b": align[mem[bf16, self.tile_n // self.cta_group * self.tile_k * s], SMEM_ALIGN],
            "c": align[mem[bf16, epi_m * epi_n * C_STAGES], SMEM_ALIGN],
        }

    def check_storage(self, layouts: SmemLayouts):
        """Trace time: SharedStorage holds each staged layout exactly."""
        fields = self.smem_fields()
        for name, layout in layouts._asdict().items():
            if fields[name].dtype.size != cute.cosize(layout.outer):
                raise ValueError(f"SharedStorage.{name}: {fields[name].dtype.size} elements for "
                                 f"a layout of cosize {cute.cosize(layout.outer)}")

    # ---- host side ------------------------------------------------------------------------
    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream):
        use_2cta = self.cta_group == 2
        group = tcgen05.CtaGroup.TWO if use_2cta else tcgen05.CtaGroup.ONE
        tiled_mma = sm100_utils.make_trivial_tiled_mma(
            cutlass.BFloat16, cutlass.BFloat16, OperandMajorMode.K, OperandMajorMode.K,
            cutlass.Float32, group, (self.mma_m, self.tile_n))
        mma_tiler = (self.mma_m, self.tile_n, self.tile_k)
        cta_tile = (CTA_M, self.tile_n, self.tile_k)
        # (V, M, N, K) cluster layout: V = the CTA pair of one 2-SM MMA
        cluster_vmnk = cute.tiled_divide(cute.make_layout((self.cta_group, 1, 1)),
                                         (tiled_mma.thr_id.shape,))
        a_smem = sm100_utils.make_smem_layout_a(tiled_mma, mma_tiler, cutlass.BFloat16,
                                                self.stages)
        b_smem = sm100_utils.make_smem_layout_b(tiled_mma, mma_tiler, cutlass.BFloat16,
                                                self.stages)
        epi_tile = sm100_utils.compute_epilogue_tile_shape(
            cta_tile, use_2cta, LayoutEnum.ROW_MAJOR, cutlass.BFloat16)
        c_smem = sm100_utils.make_smem_layout_epi(cutlass.BFloat16, LayoutEnum.ROW_MAJOR,
                                                  epi_tile, C_STAGES)

        layouts = SmemLayouts(a_smem, b_smem, c_smem)
        self.check_storage(layouts)
        a_one = cute.slice_(a_smem, (None, None, None, 0))
        b_one = cute.slice_(b_smem, (None, None, None, 0))
        tma_a, ga = cute.nvgpu.make_tiled_tma_atom_A(
            sm100_utils.cluster_shape_to_tma_atom_A((self.cta_group, 1), tiled_mma.thr_id),
            a, a_one, mma_tiler, tiled_mma, cluster_vmnk.shape)
        tma_b, gb = cute.nvgpu.make_tiled_tma_atom_B(
            sm100_utils.cluster_shape_to_tma_atom_B((self.cta_group, 1), tiled_mma.thr_id),
            b, b_one, mma_tiler, tiled_mma, cluster_vmnk.shape)
        tma_c, gc = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), c, cute.select(c_smem, mode=[0, 1]), epi_tile)
        # the docstring's arithmetic must be what the layouts really move
        traced_tx = (cute.size_in_bytes(cutlass.BFloat16, a_one)
                     + cute.size_in_bytes(cutlass.BFloat16, b_one)) * self.cta_group
        if cutlass.const_expr(traced_tx != self.tx_bytes):
            raise ValueError(f"tx bytes: layouts move {traced_tx}, arithmetic says "
                             f"{self.tx_bytes}")

        self.kernel(tiled_mma, Loads(tma_a, ga, tma_b, gb), Store(tma_c, gc, epi_tile),
                    cluster_vmnk, layouts).launch(
            grid=(self.grid, 1, 1), block=(self.threads, 1, 1),
            cluster=(self.cta_group, 1, 1), stream=stream)

    # ---- device side ----------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tiled_mma: cute.TiledMma, loads: Loads, store: Store,
               cluster_vmnk: cute.Layout, layouts: SmemLayouts):
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        use_2cta = self.cta_group == 2

        # -- prologue: smem, TMEM allocator, pipelines (create() inits and syncs) ----------
        storage = SmemAllocator().allocate(self.storage)
        ab_bars = storage.ab_bars.data_ptr()
        acc_bars = storage.acc_bars.data_ptr()
        dealloc_bar = storage.dealloc_bar.data_ptr()
        tmem_holder = storage.tmem_holder.data_ptr()
        sa = storage.a.get_tensor(layouts.a.outer, swizzle=layouts.a.inner)
        sb = storage.b.get_tensor(layouts.b.outer, swizzle=layouts.b.inner)
        sc = storage.c.get_tensor(layouts.c.outer, swizzle=layouts.c.inner)
        if warp == TMA_WARP:
            cpasync.prefetch_descriptor(loads.tma_a)
            cpasync.prefetch_descriptor(loads.tma_b)
            cpasync.prefetch_descriptor(store.tma_c)

        tmem = TmemAllocator(
            tmem_holder,
            barrier_for_retrieve=pipeline.NamedBarrier(
                barrier_id=Barrier.TMEM_ALLOC, num_threads=32 * (len(EPI_WARPS) + 1)),
            allocator_warp_id=EPI_WARPS[0], is_two_cta=use_2cta,
            two_cta_tmem_dealloc_mbar_ptr=dealloc_bar if use_2cta else None)
        ab = pipeline.PipelineTmaUmma.create(
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            tx_count=self.tx_bytes, barrier_storage=ab_bars, cta_layout_vmnk=cluster_vmnk)
        acc = pipeline.PipelineUmmaAsync.create(
            num_stages=self.acc_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     self.acc_empty_arrivals),
            barrier_storage=acc_bars, cta_layout_vmnk=cluster_vmnk)

        # (MMA, MMA_M, MMA_N, ACC_STAGE) accumulator layout; the TMEM address comes later
        acc_shape = tiled_mma.partition_shape_C((self.mma_m, self.tile_n))
        acc_layout = tiled_mma.make_fragment_C(cute.append(acc_shape, self.acc_stages)).layout

        if warp == TMA_WARP:
            self.load(tiled_mma, ab, loads, sa, sb)
        if warp == MMA_WARP:
            tmem.wait_for_alloc()
            tacc = cute.make_tensor(tmem.retrieve_ptr(cutlass.Float32), acc_layout)
            self.mma(tiled_mma, ab, acc, sa, sb, tacc)
        if warp < MMA_WARP:
            tmem.allocate(self.tmem_cols)
            tmem.wait_for_alloc()
            tmem_ptr = tmem.retrieve_ptr(cutlass.Float32)
            if cutlass.const_expr(self.tmem_dealloc_early):
                # fault: the columns go back to the allocator before anyone used them
                tmem.relinquish_alloc_permit()
                tmem.free(tmem_ptr)
            tacc = cute.make_tensor(tmem_ptr, acc_layout)
            self.epilogue(tiled_mma, acc, tacc, store, sc)
            if cutlass.const_expr(not self.tmem_dealloc_early):
                tmem.relinquish_alloc_permit()
                tmem.free(tmem_ptr)

    @cute.jit
    def load(self, tiled_mma: cute.TiledMma, ab: pipeline.PipelineTmaUmma, loads: Loads,
             sa: cute.Tensor, sb: cute.Tensor):
        """TMA warp: per k-tile, acquire a stage and load this CTA's A and B slices into it."""
        tma_a, ga, tma_b, gb = loads
        bid, _, _ = cute.arch.block_idx()
        v = bid % self.cta_group
        thr_mma = tiled_mma.get_slice(v)
        # (MMA, MMA_M/N, MMA_K, tiles_m/n, k_tiles) views of the MMA tiles of A and B
        tcga = thr_mma.partition_A(
            cute.local_tile(ga, (self.mma_m, self.tile_k), (None, None)))
        tcgb = thr_mma.partition_B(
            cute.local_tile(gb, (self.tile_n, self.tile_k), (None, None)))
        one_cta = cute.make_layout(1)  # no multicast: the cluster is just the MMA pair
        tasa, taga = cpasync.tma_partition(
            tma_a, 0, one_cta, cute.group_modes(sa, 0, 3), cute.group_modes(tcga, 0, 3))
        tbsb, tbgb = cpasync.tma_partition(
            tma_b, 0, one_cta, cute.group_modes(sb, 0, 3), cute.group_modes(tcgb, 0, 3))

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        # -- mainloop ------------------------------------------------------------------------
        for tile in cutlass.range(bid // self.cta_group, self.num_tiles, self.clusters,
                                  unroll=1):
            tm = tile // self.tiles_n
            tn = tile % self.tiles_n
            for kt in cutlass.range(self.k_tiles, unroll=1):
                ab.producer_acquire(state)
                full = ab.producer_get_barrier(state)
                cute.copy(tma_a, taga[(None, tm, kt)], tasa[(None, state.index)],
                          tma_bar_ptr=full)
                cute.copy(tma_b, tbgb[(None, tn, kt)], tbsb[(None, state.index)],
                          tma_bar_ptr=full)
                state.advance()
        # -- tail: every stage released before the warp exits -------------------------------
        ab.producer_tail(state)

    @cute.jit
    def mma(self, tiled_mma: cute.TiledMma, ab: pipeline.PipelineTmaUmma,
            acc: pipeline.PipelineUmmaAsync, sa: cute.Tensor, sb: cute.Tensor,
            tacc: cute.Tensor):
        """MMA warp: the leader CTA issues tcgen05.mma into TMEM and commits the barriers."""
        bid, _, _ = cute.arch.block_idx()
        is_leader = bid % self.cta_group == 0
        tcra = tiled_mma.make_fragment_A(sa)  # (MMA, MMA_M, MMA_K, STAGE) smem descriptors
        tcrb = tiled_mma.make_fragment_B(sb)
        k_blocks = cute.size(tcra, mode=[2])

        ab_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                self.stages)
        acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                 self.acc_stages)
        # -- mainloop ------------------------------------------------------------------------
        for _tile in cutlass.range(bid // self.cta_group, self.num_tiles, self.clusters,
                                   unroll=1):
            if is_leader:
                acc.producer_acquire(acc_state)
                tile_acc = tacc[(None, None, None, acc_state.index)]
                tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
                for _kt in cutlass.range(self.k_tiles, unroll=1):
                    ab.consumer_wait(ab_state)
                    for kb in cutlass.range_constexpr(k_blocks):
                        blk = (None, None, kb, ab_state.index)
                        cute.gemm(tiled_mma, tile_acc, tcra[blk], tcrb[blk], tile_acc)
                        tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                    ab.consumer_release(ab_state)  # tcgen05.commit -> empty[s]
                    ab_state.advance()
                acc.producer_commit(acc_state)  # tcgen05.commit -> acc full[a]
            acc_state.advance()
        # -- tail: the epilogue released every accumulator (leader only, inside) -----------
        acc.producer_tail(acc_state)

    @cute.jit
    def epilogue(self, tiled_mma: cute.TiledMma, acc: pipeline.PipelineUmmaAsync,
                 tacc: cute.Tensor, store: Store, sc: cute.Tensor):
        """Epilogue warps: TMEM -> registers -> bf16 -> smem -> TMA store, per subtile."""
        tma_c, gc, epi_tile = store
        bid, _, _ = cute.arch.block_idx()
        tid, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        use_2cta = self.cta_group == 2
        cta_tile = (CTA_M, self.tile_n, self.tile_k)

        # TMEM -> registers: (T2R, T2R_M, T2R_N, EPI_M, EPI_N, ACC_STAGE)
        t2r_atom = sm100_utils.get_tmem_load_op(cta_tile, LayoutEnum.ROW_MAJOR,
                                                cutlass.BFloat16, cutlass.Float32, epi_tile,
                                                use_2cta)
        tacc_epi = cute.flat_divide(tacc[((None, None), 0, 0, None)], epi_tile)
        t2r = tcgen05.make_tmem_copy(t2r_atom, tacc_epi[(None, None, 0, 0, 0)])
        thr_t2r = t2r.get_slice(tid)
        ttr_tacc = thr_t2r.partition_S(tacc_epi)
        # this CTA's [128, tile_n] share of each MMA tile of C, split into epilogue subtiles:
        # (EPI_TILE_M, EPI_TILE_N, EPI_M, EPI_N, TM, TN)
        thr_mma = tiled_mma.get_slice(bid % self.cta_group)
        tcgc = thr_mma.partition_C(cute.local_tile(gc, (self.mma_m, self.tile_n), (None, None)))
        gc_epi = cute.flat_divide(tcgc[((None, None), 0, 0, None, None)], epi_tile)
        ttr_gc = thr_t2r.partition_D(gc_epi)
        racc = cute.make_rmem_tensor(ttr_gc[(None, None, None, 0, 0, 0, 0)].shape,
                                     cutlass.Float32)
        rc = cute.make_rmem_tensor(racc.shape, cutlass.BFloat16)
        # registers -> smem, laid out for the TMA store
        r2s = cute.make_tiled_copy_D(
            sm100_utils.get_smem_store_op(LayoutEnum.ROW_MAJOR, cutlass.BFloat16,
                                          cutlass.Float32, t2r), t2r)
        thr_r2s = r2s.get_slice(tid)
        trs_sc = thr_r2s.partition_D(sc)
        trs_rc = r2s.retile(rc)
        bsg_sc, bsg_gc = cpasync.tma_partition(
            tma_c, 0, cute.make_layout(1), cute.group_modes(sc, 0, 2),
            cute.group_modes(gc_epi, 0, 2))  # ((ATOM, REST), EPI_M, EPI_N, TM, TN)

        store_ring = pipeline.PipelineTmaStore.create(
            num_stages=C_STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     32 * len(EPI_WARPS)))
        epi_sync = pipeline.NamedBarrier(barrier_id=Barrier.EPILOGUE,
                                         num_threads=32 * len(EPI_WARPS))
        subtiles = cute.size(ttr_tacc, mode=[3]) * cute.size(ttr_tacc, mode=[4])
        subtiles_n = cute.size(ttr_tacc, mode=[4])

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                             self.acc_stages)
        done = cutlass.Int32(0)  # subtiles stored so far: picks the smem buffer
        # -- mainloop ------------------------------------------------------------------------
        for tile in cutlass.range(bid // self.cta_group, self.num_tiles, self.clusters,
                                  unroll=1):
            tm = tile // self.tiles_n
            tn = tile % self.tiles_n
            acc.consumer_wait(state)
            for st in cutlass.range(subtiles, unroll=1):
                em = st // subtiles_n
                en = st % subtiles_n
                cute.copy(t2r, ttr_tacc[(None, None, None, em, en, state.index)], racc)
                cute.arch.fence_view_async_tmem_load()  # tcgen05.wait::ld: registers valid
                rc.store(racc.load().to(cutlass.BFloat16))
                buf = done % C_STAGES
                cute.copy(r2s, trs_rc, trs_sc[(None, None, None, buf)])
                # smem writes visible to the TMA (async proxy) before the store is issued
                cute.arch.fence_proxy("async.shared", space="cta")
                epi_sync.arrive_and_wait()
                if warp == EPI_WARPS[0]:
                    cute.copy(tma_c, bsg_sc[(None, buf)], bsg_gc[(None, em, en, tm, tn)])
                    store_ring.producer_commit()
                    store_ring.producer_acquire()  # the buffer written next is free again
                epi_sync.arrive_and_wait()
                done += 1
            # every tcgen05.ld of this accumulator has completed (wait::ld): give it back
            with cute.arch.elect_one():
                acc.consumer_release(state)
            state.advance()
        # -- tail: the last TMA stores have read smem --------------------------------------
        if warp == EPI_WARPS[0]:
            store_ring.producer_tail()

    # ---- interface ------------------------------------------------------------------------
    def fake_args(self):
        a = make_fake_tensor(cutlass.BFloat16, (self.m, self.k), stride=(self.k, 1),
                             assumed_align=16)
        b = make_fake_tensor(cutlass.BFloat16, (self.n, self.k), stride=(self.k, 1),
                             assumed_align=16)
        c = make_fake_tensor(cutlass.BFloat16, (self.m, self.n), stride=(self.n, 1),
                             assumed_align=16)
        return (a, b, c, make_fake_stream())

    def make_inputs(self, device):
        import torch

        g = torch.Generator(device="cpu").manual_seed(self.seed)
        # entries in [-1, 1): zero-filled or stale stages change the products visibly
        a = (torch.rand(self.m, self.k, generator=g) * 2 - 1).to(torch.bfloat16)
        b = (torch.rand(self.n, self.k, generator=g) * 2 - 1).to(torch.bfloat16)
        c = torch.full((self.m, self.n), float("nan"), dtype=torch.bfloat16)
        return {"a": a.to(device), "b": b.to(device), "c": c.to(device)}

    def cute_args(self, tensors):
        import torch

        args = tuple(from_dlpack(tensors[k], assumed_align=16) for k in ("a", "b", "c"))
        stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        return (*args, stream)

    def reference(self, tensors):
        # fp32 products and sums like the tensor cores; one rounding to bf16 at the end
        return (tensors["a"].float() @ tensors["b"].float().T).to(tensors["c"].dtype)

    def output(self, tensors):
        return tensors["c"]
