"""Warp-specialized persistent GEMM (SM90): C[M, N] = A[M, K] @ B[N, K]^T.

bf16 or fp16 in, fp32 accumulate, output in the input dtype. A and B are both K-major (row-major
[M, K] and [N, K], the layout of ``torch.matmul(a, b.T)``), C is row-major [M, N]. Every output
element depends on a whole row of A and of B, so a stage read before its TMA landed, a stage
overwritten while the tensor cores still read it, or a tile stored to the wrong place all show
up as a MISMATCH against ``(a.double() @ b.double().T).to(dtype)``.

Block = 3 warpgroups (384 threads), one CTA per SM (``min_blocks_per_mp=1`` caps registers at
65536 / 384 = 168 per thread at entry, so ``setmaxnreg`` can move them):
- warpgroup 0, producer: ``setmaxregister_decrease(40)``; warp 0 alone issues the TMA loads of
  A (128 x 64) and B (tile_n x 64, or its 1/cluster_m slice, multicast) into the S-stage ring.
- warpgroups 1 and 2, consumers (cooperative): ``setmaxregister_increase(232)``; each owns 64 of
  the tile's 128 rows and all tile_n columns (64 x tile_n fp32 accumulators = 128 registers per
  thread at tile_n = 256). Per k-tile: wait full[s], four WGMMAs (k = 16 each) from smem, commit,
  ``wgmma.wait_group 1`` (the previous k-tile's WGMMAs are done), release the previous stage.
  232 / 40 is the most the register file allows: 2 * 128 * 232 + 128 * 40 = 64512 <= 65536
  (240 would need 66560).
- epilogue (both consumer warpgroups): per 128 x 32 sub-tile, fp32 -> dtype, ``stmatrix`` into a
  4-deep smem ring, ``fence.proxy.async.shared::cta``, named barrier ``Barrier.EPILOGUE`` (id 1,
  256 threads), warp 4 issues the TMA store (``cp.async.bulk.tensor`` shared -> global) and
  commits a bulk group, waits until at most 3 groups still read smem, the same barrier again. TMA clips rows >= M, cols >= N.

Persistent schedule with grouped (L2-friendly) raster: work units are cluster tiles
(cluster_m x 1 CTA tiles that share one B tile); unit u -> (cluster row, tile column) walks
``group_m`` tile rows down before stepping right, so the concurrently running CTAs share a few
rows of A and columns of B in L2. Cluster c handles units c, c + clusters, ... ; grid =
min(ctas // cluster_m, units) * cluster_m. Both CTAs of a cluster see the same number of units
(a CTA whose tile row lies past M still loads zeros, multicasts its B slice and stores nothing).

Pipeline: ``cutlass.pipeline.PipelineTmaAsync``, S = ``stages`` slots, barriers full[0..S) then
empty[0..S) in smem, initialised by warp 0 (elect_one) inside ``create``, which then fences
(``fence.mbarrier_init``) and syncs the CTA (cluster: relaxed cluster arrive + wait).
- tx bytes per stage = bytes landing in THIS CTA's smem, summed over the stage's TMA loads:
      128 * 64 * 2      (A tile: this CTA's own load)                         = 16384
    + tile_n * 64 * 2   (B tile: whole tile; with multicast this CTA issues 1/cluster_m of it
                         and receives the other slices from its peers)       = 32768 (tile_n 256)
  = 49152 for tile_n = 256 (32768 for tile_n = 128), the same with and without multicast.
  OOB rows/cols/k of a box are zero-filled and still count. Derived, not typed: one stage of
  SharedStorage's A and B rings, checked at trace time against ``cute.size_in_bytes`` of the
  TMA boxes' smem layouts.
- full[s]  arrive count 1: the local producer's elect_one ``mbarrier.arrive.expect_tx`` in
  ``producer_acquire``; the phase completes when that arrive AND all tx bytes have landed.
- empty[s] arrive count = consumer warps * cluster_m = 8 (single CTA) or 16 (cluster 2x1):
  ``consumer_release`` arrives from lane r < cluster_m of every consumer warp on empty[s] of
  cluster rank r (``mbarrier.arrive.shared::cluster`` with mapa for the peer): a peer's producer
  multicasts into this CTA's B slot, so it must hear that this CTA's consumers are done with it.
- Phases: producer state starts at phase 1 (empty slots pass at once), consumers at phase 0;
  ``advance`` past slot S-1 flips the phase. Counts run over the whole kernel (never reset), so
  a release fault ``at_iteration=i`` hits the i-th k-tile this CTA consumes.
- ``producer_tail`` waits on every empty[s] before warp 0 exits: with a cluster this keeps the
  CTA (and its barriers) alive until the peer's last remote release has landed.
- Epilogue store ring: ``PipelineTmaStore`` (bulk groups, no mbarriers); its tail waits until
  every TMA store has read its smem before the CTA exits.

Smem: the ``cute.struct`` SharedStorage (``smem_fields``), its size ``smem_bytes``; for tile_n 256,
S 4: 1024 (2 * S mbarriers, padded to the 1024 B alignment of the 128B-swizzled buffers)
+ 4 * 49152 (A/B ring) + 4 * 8192 (C ring) = 230400 B of the 232448 B a CTA may use.

Ragged shapes: any M, N, K >= 1 with K and N multiples of 8 (TMA needs 16-byte row pitches).
TMA zero-fills out-of-bounds loads (so padded K contributes 0) and clips out-of-bounds stores.

Faults that apply (cutedebug patches them at trace time; none is written here):
- wrong_expect_tx + k: full[s] never completes -> HANG in consumer_wait (full barrier).
- wrong_expect_tx - k: the overhang bytes are charged to the next phase -> HANG (as measured on
  tma_stream) or a stage read early (MISMATCH).
- missing_phase_flip consumer: consumers wait on parity 0 forever -> HANG on the 2nd lap (or
  stale stages read: MISMATCH); producer: HANG in producer_acquire on the 2nd lap.
- skip_producer_tail: single CTA benign (PASS); cluster: a peer's remote release may target an
  exited CTA (PASS expected since both CTAs end with a long epilogue; CRASH possible).
- skip_consumer_release: the producer waits on that empty[s] forever -> HANG.
- extra_consumer_release / wrong_arrive_count -1 on empty: a slot refilled while still read ->
  MISMATCH, or the bookkeeping drifts into a circular wait -> HANG.
- wrong_arrive_count +1: HANG (empty: producer_acquire; full: consumer_wait).
- missing_init_fence: usually PASS (init wins the race).
- drop_sync: the epilogue's named barriers (2 per sub-tile, trace order) -> the TMA store reads
  a half-written smem sub-tile, or a sub-tile is overwritten while being stored -> MISMATCH.
Not here: cta_scope_sync (no cluster-scope fence, release-arrive or .cluster-scoped mbarrier op is
traced: create() uses a relaxed cluster arrive, remote releases carry no scope),
expect_tx_no_2cta_doubling (PipelineTmaUmma only), skip_cluster_tail (there is no trailing
cluster barrier to skip: producer_tail already waits for every remote release, and the peer's
multicast bytes are waited for by this CTA's own consumers).
Kernel-level switches (cluster_m=2 only):
- ``skip_init_cluster_sync``: create(defer_sync=True), then only fence + CTA sync: a peer's first
  multicast complete_tx may reach a full barrier before its init (lost bytes: HANG); usually
  PASS, since init takes far less than the first TMA round trip.
- ``cluster_mismatch``: launched with 1-CTA clusters: the multicast mask and the remote release
  name a CTA rank that does not exist -> CRASH (or HANG: 16 arrivals expected, 8 come).
Wrong-value switches (rows of the failure table; off = the PTX above, byte for byte):
- ``edge_pred_whole_tiles``: the TMA store's view of C is cut to whole tiles (M and N rounded
  down to 128 / tile_n): the TMA bounds are the store predicate, so the partial tiles at the
  M / N edges are never stored (they keep the output's NaN): MISMATCH in the edge tiles only.
- ``stale_smem_store``: sub-tiles e >= 4 of the epilogue skip their ``stmatrix`` (their values
  stay in registers), so the TMA store copies the smem slot as sub-tile e - 4 left it: columns
  128 .. 255 of every tile repeat columns 0 .. 127 (tile_n 256 only), the same every run.

Tiling (``tiling()``, for cutedebug's mismatch map): output tiles 128 x tile_n; each tile's CTA
and its sequence number on that CTA from the grouped raster above; a tile's k-tiles go through
ring slots (seq * k_tiles + kt) % stages.
"""

from __future__ import annotations

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

DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}
TILE_M = 128  # two consumer warpgroups x 64 rows
TILE_K = 64  # 128 bytes of bf16/fp16: one 128B-swizzle row
EPI_N = 32  # epilogue sub-tile 128 x 32
EPI_STAGES = 4
CONSUMER_WARPGROUPS = 2
CONSUMER_WARPS = 4 * CONSUMER_WARPGROUPS
THREADS = 128 * (1 + CONSUMER_WARPGROUPS)
PRODUCER_REGS, CONSUMER_REGS = 40, 232
SMEM_BYTES_MAX = 232448  # 227 KiB: the SM90 per-block opt-in limit
SWIZZLE_ALIGN = 1024  # a 128B-swizzled buffer starts on a 1024 B boundary


class Barrier(IntEnum):
    """Named barrier ids (16 per CTA)."""

    SYNC_THREADS = 0  # sync_threads and create()'s CTA sync
    EPILOGUE = 1  # the consumer warpgroups around each TMA store (256 threads)


def smem_struct(name: str, **fields) -> cute.struct:
    """``cute.struct`` with ``fields`` in order. (A class body's annotations would be strings
    here: this module keeps ``from __future__ import annotations`` for the DSL's signatures.)"""
    return cute.struct(type(name, (), {"__annotations__": fields}))


class Loads(NamedTuple):
    """The producer's TMA loads: copy atom and TMA view of A, then of B."""

    tma_a: cute.CopyAtom
    ma: cute.Tensor
    tma_b: cute.CopyAtom
    mb: cute.Tensor


class Store(NamedTuple):
    """The epilogue's TMA store: copy atom and TMA view of C."""

    tma_c: cute.CopyAtom
    mc: cute.Tensor


class Rings(NamedTuple):
    """The staged smem layouts (swizzle + outer layout) of A, B and the C sub-tiles."""

    a: cute.ComposedLayout
    b: cute.ComposedLayout
    c: cute.ComposedLayout


class Tiles(NamedTuple):
    """The CTA's smem tensors: A and B rings (S stages), C sub-tile ring (EPI_STAGES)."""

    sa: cute.Tensor
    sb: cute.Tensor
    sc: cute.Tensor


def grouped_tile(unit, cluster_rows: int, tiles_n: int, group_rows: int, minimum=min):
    """(cluster row, tile column) of work unit ``unit`` in grouped raster order.

    Units walk ``group_rows`` cluster rows down a column before stepping to the next column;
    the last group may be shorter. Plain arithmetic: Python ints on the host (``minimum`` =
    builtins.min), DSL Int32 on the device (``minimum`` = cutlass.min).
    """
    per_group = group_rows * tiles_n
    group = unit // per_group
    first = group * group_rows
    rows = minimum(group_rows, cluster_rows - first)
    within = unit - group * per_group
    return first + within % rows, within // rows


class Sm90Gemm:
    PARAMS: ClassVar[dict[str, object]] = {
        "m": 8192, "n": 8192, "k": 8192, "dtype": "bf16", "tile_n": 256, "stages": 4,
        "cluster_m": 2, "group_m": 16, "ctas": 132, "seed": 0,
    }
    CHOICES: ClassVar[dict[str, tuple]] = {
        "dtype": ("bf16", "fp16"),
        "tile_n": (128, 256),
        "stages": (2, 3, 4, 5, 6),
        "cluster_m": (1, 2),
    }
    SHRINKABLE = ("m", "n", "k", "ctas")
    ARCHS = ("sm_90a",)
    SWITCHES: ClassVar[dict[str, str]] = {
        "skip_init_cluster_sync": "cluster_m=2: after mbarrier init each CTA syncs only itself, "
                                  "not the cluster",
        "cluster_mismatch": "cluster_m=2 protocol launched without clusters (1-CTA clusters)",
        "edge_pred_whole_tiles": "TMA store view of C cut to whole tiles: edge tiles unstored",
        "stale_smem_store": "epilogue sub-tiles 4..7 skip stmatrix: the TMA store copies stale "
                            "smem (tile_n 256)",
    }
    TOLERANCE = (1e-2, 1e-2)

    def __init__(self, m=PARAMS["m"], n=PARAMS["n"], k=PARAMS["k"], dtype=PARAMS["dtype"],
                 tile_n=PARAMS["tile_n"], stages=PARAMS["stages"],
                 cluster_m=PARAMS["cluster_m"], group_m=PARAMS["group_m"], ctas=PARAMS["ctas"],
                 seed=PARAMS["seed"], skip_init_cluster_sync=False, cluster_mismatch=False,
                 edge_pred_whole_tiles=False, stale_smem_store=False):
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: allowed {list(DTYPES)}")
        if min(m, n, k) < 1 or stages < 2 or ctas < cluster_m:
            raise ValueError(f"need m, n, k >= 1, stages >= 2, ctas >= cluster_m (m={m} n={n} "
                             f"k={k} stages={stages} ctas={ctas})")
        if n % 8 or k % 8:
            raise ValueError(f"n={n}, k={k}: TMA needs 16-byte row pitches (multiples of 8)")
        if tile_n not in (128, 256) or cluster_m not in (1, 2):
            raise ValueError(f"tile_n={tile_n} (128|256), cluster_m={cluster_m} (1|2)")
        if group_m < cluster_m or group_m % cluster_m:
            raise ValueError(f"group_m={group_m}: a positive multiple of cluster_m={cluster_m}")
        if (skip_init_cluster_sync or cluster_mismatch) and cluster_m == 1:
            raise ValueError("skip_init_cluster_sync / cluster_mismatch need cluster_m=2")
        if max(m, n) * k >= 2**31 or m * n >= 2**31:
            raise ValueError("element offsets are 32-bit: keep m*k, n*k, m*n < 2**31")
        self.m, self.n, self.k, self.dtype_name, self.seed = m, n, k, dtype, seed
        self.dtype = DTYPES[dtype]
        self.tile_n, self.stages, self.cluster_m, self.ctas = tile_n, stages, cluster_m, ctas
        self.skip_init_cluster_sync, self.cluster_mismatch = skip_init_cluster_sync, cluster_mismatch
        self.edge_pred_whole_tiles, self.stale_smem_store = edge_pred_whole_tiles, stale_smem_store
        if edge_pred_whole_tiles and (m < TILE_M or n < tile_n):
            raise ValueError("edge_pred_whole_tiles needs m >= 128 and n >= tile_n")
        self.tiles_m, self.tiles_n = -(-m // TILE_M), -(-n // tile_n)
        self.k_tiles = -(-k // TILE_K)
        self.cluster_rows = -(-self.tiles_m // cluster_m)
        self.group_rows = group_m // cluster_m
        self.units = self.cluster_rows * self.tiles_n
        self.clusters = min(ctas // cluster_m, self.units)
        self.grid = self.clusters * cluster_m
        self.empty_arrivals = CONSUMER_WARPS * cluster_m
        self.epi_tiles = tile_n // EPI_N
        fields = self.smem_fields()
        self.storage = smem_struct("SharedStorage", **fields)
        self.smem_bytes = self.storage.size_in_bytes()
        # tx bytes per stage: one stage of each TMA-filled ring (__call__ checks them against
        # cute.size_in_bytes of the smem layout of each TMA box)
        self.a_stage_bytes = fields["a"].dtype.size_in_bytes // stages
        self.b_stage_bytes = fields["b"].dtype.size_in_bytes // stages
        self.tx_bytes = self.a_stage_bytes + self.b_stage_bytes
        if self.smem_bytes > SMEM_BYTES_MAX:
            raise ValueError(f"~{self.smem_bytes} B of smem for {stages} stages of 128 x "
                             f"{tile_n} x 64: over {SMEM_BYTES_MAX}")

    def smem_fields(self) -> dict:
        """The CTA's smem, in order: 2 * S mbarriers (full[0..S), empty[0..S)), then the A and
        B rings (S stages of 128 x 64 and tile_n x 64) and the C sub-tile ring (4 x 128 x 32),
        each 128B-swizzled, so 1024 B aligned (the mbarriers are padded to 1024 B)."""
        mem, align = cute.struct.MemRange, cute.struct.Align
        return {
            "barriers": mem[cutlass.Int64, 2 * self.stages],
            "a": align[mem[self.dtype, TILE_M * TILE_K * self.stages], SWIZZLE_ALIGN],
            "b": align[mem[self.dtype, self.tile_n * TILE_K * self.stages], SWIZZLE_ALIGN],
            "c": align[mem[self.dtype, TILE_M * EPI_N * EPI_STAGES], SWIZZLE_ALIGN],
        }

    # ---- host side ------------------------------------------------------------------------
    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream):
        # Dynamic row counts: a static size-1 mode (m == 1) would be folded out of the box.
        m, n = cutlass.Int32(self.m), cutlass.Int32(self.n)
        a = cute.make_tensor(a.iterator, cute.make_layout((m, self.k), stride=(self.k, 1)))
        b = cute.make_tensor(b.iterator, cute.make_layout((n, self.k), stride=(self.k, 1)))
        c = cute.make_tensor(c.iterator, cute.make_layout((m, self.n), stride=(self.n, 1)))
        if cutlass.const_expr(self.edge_pred_whole_tiles):
            # fault: C's bounds (the TMA store's predicate) rounded down to whole tiles
            whole_m = cutlass.Int32(self.m // TILE_M * TILE_M)
            c = cute.make_tensor(c.iterator, cute.make_layout(
                (whole_m, self.n // self.tile_n * self.tile_n), stride=(self.n, 1)))
        tiler = (TILE_M, self.tile_n, TILE_K)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K, cutlass.Float32,
            (CONSUMER_WARPGROUPS, 1, 1), tiler_mn=(64, self.tile_n))
        a_ring = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tiler, self.dtype,
                                               self.stages)
        b_ring = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tiler, self.dtype,
                                               self.stages)
        c_ring = sm90_utils.make_smem_layout_epi(self.dtype, LayoutEnum.ROW_MAJOR,
                                                 (TILE_M, EPI_N), EPI_STAGES)
        rings = Rings(a_ring, b_ring, c_ring)
        a_box, b_box = cute.slice_(a_ring, (None, None, 0)), cute.slice_(b_ring, (None, None, 0))
        self.check_storage(rings, cute.size_in_bytes(self.dtype, a_box)
                           + cute.size_in_bytes(self.dtype, b_box))
        tma_a, ma = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), a, a_box, (TILE_M, TILE_K))
        b_op = (cpasync.CopyBulkTensorTileG2SMulticastOp() if self.cluster_m > 1
                else cpasync.CopyBulkTensorTileG2SOp())
        tma_b, mb = cpasync.make_tiled_tma_atom(
            b_op, b, b_box, (self.tile_n, TILE_K), num_multicast=self.cluster_m)
        tma_c, mc = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), c, cute.slice_(c_ring, (None, None, 0)),
            (TILE_M, EPI_N))
        self.kernel(tiled_mma, Loads(tma_a, ma, tma_b, mb), Store(tma_c, mc), rings).launch(
            grid=(self.grid, 1, 1), block=(THREADS, 1, 1),
            # fault cluster_mismatch: 1-CTA clusters under a 2-CTA protocol
            cluster=(self.cluster_m, 1, 1) if self.cluster_m > 1 and not self.cluster_mismatch
            else None,
            min_blocks_per_mp=1, stream=stream)

    def check_storage(self, rings: Rings, tma_bytes: int):
        """Trace time: SharedStorage holds each staged layout exactly, and the expect_tx count
        is the bytes of one stage's TMA boxes (``tma_bytes``, from cute.size_in_bytes)."""
        fields = self.smem_fields()
        for name, ring in rings._asdict().items():
            if fields[name].dtype.size != cute.cosize(ring.outer):
                raise ValueError(f"SharedStorage.{name}: {fields[name].dtype.size} elements for "
                                 f"a ring of cosize {cute.cosize(ring.outer)}")
        if tma_bytes != self.tx_bytes:
            raise ValueError(f"tx bytes {self.tx_bytes}: one stage of TMA boxes is {tma_bytes} B")

    # ---- device side ----------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tiled_mma: cute.TiledMma, loads: Loads, store: Store, rings: Rings):
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())

        # -- prologue: smem, barriers (create() inits them and syncs the CTA / cluster) ------
        storage = SmemAllocator().allocate(self.storage)
        barriers = storage.barriers.data_ptr()
        tiles = Tiles(storage.a.get_tensor(rings.a.outer, swizzle=rings.a.inner),
                      storage.b.get_tensor(rings.b.outer, swizzle=rings.b.inner),
                      storage.c.get_tensor(rings.c.outer, swizzle=rings.c.inner))
        if warp == 0:
            cpasync.prefetch_descriptor(loads.tma_a)
            cpasync.prefetch_descriptor(loads.tma_b)
            cpasync.prefetch_descriptor(store.tma_c)
        ring = pipeline.PipelineTmaAsync.create(
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     self.empty_arrivals),
            tx_count=self.tx_bytes,
            barrier_storage=barriers,
            cta_layout_vmnk=cute.make_layout((1, self.cluster_m, 1, 1)),
            defer_sync=self.skip_init_cluster_sync,
        )
        if cutlass.const_expr(self.skip_init_cluster_sync):
            # fault: the peer may multicast / arrive into this CTA before its barriers exist
            cute.arch.mbarrier_init_fence()
            cute.arch.sync_threads()

        # -- warp roles: one if/else over warpgroups so setmaxnreg applies -------------------
        if warp < 4:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                self.load(ring, loads, tiles)
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            self.mma_epilogue(ring, tiled_mma, store, tiles)

    @cute.jit
    def work_tile(self, unit: cutlass.Int32, rank: cutlass.Int32):
        """(tile row, tile column) of this CTA in work unit ``unit``."""
        cluster_row, tn = grouped_tile(unit, self.cluster_rows, self.tiles_n, self.group_rows,
                                       minimum=cutlass.min)
        return cluster_row * self.cluster_m + rank, tn

    @cute.jit
    def load(self, ring: pipeline.PipelineTmaAsync, loads: Loads, tiles: Tiles):
        """Producer warp: per k-tile, acquire a slot, TMA A and (a slice of, multicast) B."""
        tma_a, ma, tma_b, mb = loads
        sa, sb, _ = tiles
        bid, _, _ = cute.arch.block_idx()
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        # (TMA, S) smem views, (TMA, tiles, k_tiles) gmem views; B split across the cluster
        ga = cute.local_tile(ma, (TILE_M, TILE_K), (None, None))
        tsa, tga = cpasync.tma_partition(tma_a, 0, cute.make_layout(1),
                                         cute.group_modes(sa, 0, 2), cute.group_modes(ga, 0, 2))
        gb = cute.local_tile(mb, (self.tile_n, TILE_K), (None, None))
        tsb, tgb = cpasync.tma_partition(tma_b, rank, cute.make_layout(self.cluster_m),
                                         cute.group_modes(sb, 0, 2), cute.group_modes(gb, 0, 2))
        everyone = cutlass.Int16((1 << self.cluster_m) - 1)  # the cluster shares the B tile

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        # -- mainloop ------------------------------------------------------------------------
        for unit in cutlass.range(bid // self.cluster_m, self.units, self.clusters, unroll=1):
            tm, tn = self.work_tile(unit, rank)
            for kt in cutlass.range(self.k_tiles, unroll=1):
                ring.producer_acquire(state)
                full = ring.producer_get_barrier(state)
                cute.copy(tma_a, tga[(None, tm, kt)], tsa[(None, state.index)],
                          tma_bar_ptr=full)
                if cutlass.const_expr(self.cluster_m > 1):
                    cute.copy(tma_b, tgb[(None, tn, kt)], tsb[(None, state.index)],
                              tma_bar_ptr=full, mcast_mask=everyone)
                else:
                    cute.copy(tma_b, tgb[(None, tn, kt)], tsb[(None, state.index)],
                              tma_bar_ptr=full)
                ring.producer_commit(state)
                state.advance()
        # -- tail: every slot released (locally and by the peer) before the warp exits ------
        ring.producer_tail(state)

    @cute.jit
    def mma_epilogue(self, ring: pipeline.PipelineTmaAsync, tiled_mma: cute.TiledMma,
                     store: Store, tiles: Tiles):
        """Consumer warpgroups: WGMMA mainloop per tile, then the TMA-store epilogue."""
        tma_c, mc = store
        sa, sb, sc = tiles
        bid, _, _ = cute.arch.block_idx()
        tid, _, _ = cute.arch.thread_idx()
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        ctid = tid - 128  # thread index among the 256 consumer threads
        wg = cute.arch.make_warp_uniform(ctid // 128)

        # WGMMA operands: smem descriptors per warpgroup (rows 64*wg .. 64*wg+63 of A)
        thr_mma = tiled_mma.get_slice(wg * 128)
        tcra = tiled_mma.make_fragment_A(thr_mma.partition_A(sa))
        tcrb = tiled_mma.make_fragment_B(thr_mma.partition_B(sb))
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_M, self.tile_n)),
                                    cutlass.Float32)
        k_blocks = cute.size(tcra, mode=[2])

        # Epilogue: accumulators -> stmatrix -> smem sub-tile ring -> TMA store
        stmatrix = sm90_utils.get_smem_store_op(LayoutEnum.ROW_MAJOR, self.dtype,
                                                cutlass.Float32)
        r2s = cute.make_tiled_copy_S(stmatrix, cute.make_tiled_copy_C_atom(stmatrix, tiled_mma))
        thr_r2s = r2s.get_slice(ctid)
        trs_sc = thr_r2s.partition_D(sc)  # (R2S, R2S_M, R2S_N, EPI_STAGES)
        trs_acc = r2s.retile(acc)
        sub_shape = cute.shape(thr_r2s.partition_S(sc))[:3]
        sub_f32 = cute.make_rmem_tensor(sub_shape, cutlass.Float32)
        sub_out = cute.make_rmem_tensor(sub_shape, self.dtype)
        sub_size = cute.size(sub_f32)
        gc = cute.local_tile(mc, (TILE_M, self.tile_n), (None, None))
        epilogue_sync = pipeline.NamedBarrier(barrier_id=Barrier.EPILOGUE,
                                              num_threads=128 * CONSUMER_WARPGROUPS)
        store_ring = pipeline.PipelineTmaStore.create(
            num_stages=EPI_STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     128 * CONSUMER_WARPGROUPS))

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        for unit in cutlass.range(bid // self.cluster_m, self.units, self.clusters, unroll=1):
            tm, tn = self.work_tile(unit, rank)
            # -- mainloop: one WGMMA batch in flight; release a stage once it has retired -----
            acc.fill(0.0)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            ring.consumer_wait(read)
            warpgroup.fence()  # order the accumulator writes above before the WGMMAs
            for kb in cutlass.range_constexpr(k_blocks):
                cute.gemm(tiled_mma, acc, tcra[(None, None, kb, read.index)],
                          tcrb[(None, None, kb, read.index)], acc)
            warpgroup.commit_group()
            read.advance()
            for _kt in cutlass.range(1, self.k_tiles, unroll=1):
                ring.consumer_wait(read)
                warpgroup.fence()
                for kb in cutlass.range_constexpr(k_blocks):
                    cute.gemm(tiled_mma, acc, tcra[(None, None, kb, read.index)],
                              tcrb[(None, None, kb, read.index)], acc)
                warpgroup.commit_group()
                warpgroup.wait_group(1)
                ring.consumer_release(release)
                release.advance()
                read.advance()
            warpgroup.wait_group(0)
            ring.consumer_release(release)
            release.advance()

            # -- epilogue: 128 x 32 sub-tiles through the smem ring, stored by warp 4 ----------
            gc_sub = cute.zipped_divide(gc[(None, None, tm, tn)], (TILE_M, EPI_N))
            bsg_sc, bsg_gc = cpasync.tma_partition(tma_c, 0, cute.make_layout(1),
                                                   cute.group_modes(sc, 0, 2), gc_sub)
            for e in cutlass.range_constexpr(self.epi_tiles):
                buf = e % EPI_STAGES  # epi_tiles is a multiple of EPI_STAGES: static slot
                for v in cutlass.range_constexpr(sub_size):
                    sub_f32[v] = trs_acc[e * sub_size + v]
                sub_out.store(sub_f32.load().to(self.dtype))
                if cutlass.const_expr(not (self.stale_smem_store and e >= EPI_STAGES)):
                    # (fault stale_smem_store: sub-tiles e >= 4 stay in registers only)
                    cute.copy(r2s, sub_out, trs_sc[(None, None, None, buf)])
                # stmatrix writes are generic-proxy; the TMA store reads through the async proxy
                cute.arch.fence_view_async_shared()
                epilogue_sync.arrive_and_wait()
                if warp == 4:
                    cute.copy(tma_c, bsg_sc[(None, buf)], bsg_gc[(None, (0, e))])
                    store_ring.producer_commit()
                    store_ring.producer_acquire()
                epilogue_sync.arrive_and_wait()
        # -- tail: every TMA store has read its smem before the CTA may exit -------------------
        if warp == 4:
            store_ring.producer_tail()

    # ---- interface ------------------------------------------------------------------------
    def tiling(self):
        """Output tiles 128 x tile_n, each tile's CTA and its position in that CTA's work order
        (host-side mirror of the grouped persistent schedule; -1: a tile nobody computes)."""
        cta = [[-1] * self.tiles_n for _ in range(self.tiles_m)]
        seq = [[-1] * self.tiles_n for _ in range(self.tiles_m)]
        for unit in range(self.units):
            cluster, position = unit % self.clusters, unit // self.clusters
            cluster_row, tn = grouped_tile(unit, self.cluster_rows, self.tiles_n,
                                           self.group_rows)
            for rank in range(self.cluster_m):
                tm = cluster_row * self.cluster_m + rank
                if tm < self.tiles_m:
                    cta[tm][tn] = cluster * self.cluster_m + rank
                    seq[tm][tn] = position
        return {"shape": [self.m, self.n], "tile": [TILE_M, self.tile_n],
                "stages": self.stages, "k_tiles": self.k_tiles, "tile_cta": cta,
                "tile_seq": seq}

    def fake_args(self):
        a = make_fake_tensor(self.dtype, (self.m, self.k), stride=(self.k, 1), assumed_align=16)
        b = make_fake_tensor(self.dtype, (self.n, self.k), stride=(self.k, 1), assumed_align=16)
        c = make_fake_tensor(self.dtype, (self.m, self.n), stride=(self.n, 1), assumed_align=16)
        return (a, b, c, make_fake_stream())

    def make_inputs(self, device):
        import torch

        g = torch.Generator(device="cpu").manual_seed(self.seed)
        tdtype = torch.bfloat16 if self.dtype_name == "bf16" else torch.float16
        # unit-variance outputs: a zero-filled or stale stage moves them by O(1 / sqrt(k_tiles))
        a = torch.randn(self.m, self.k, generator=g).to(tdtype)
        b = (torch.randn(self.n, self.k, generator=g) * self.k ** -0.5).to(tdtype)
        c = torch.full((self.m, self.n), float("nan"), dtype=tdtype)
        return {"a": a.to(device), "b": b.to(device), "c": c.to(device)}

    def cute_args(self, tensors):
        import torch

        args = tuple(from_dlpack(tensors[k], assumed_align=16) for k in ("a", "b", "c"))
        stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        return (*args, stream)

    def reference(self, tensors):
        # float64 accumulation, one rounding to the output dtype (the kernel: fp32, one rounding)
        ref = tensors["a"].double() @ tensors["b"].double().T
        return ref.to(tensors["a"].dtype)

    def output(self, tensors):
        return tensors["c"]
