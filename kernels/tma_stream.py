"""Persistent TMA streaming kernel (SM90): out[m, n] = x[m, n] * scale[m] + bias[m].

Memory-bound row-wise affine over a row-major [M, N] input (fp32 or bf16; scale and bias fp32,
output in the input's dtype, math in fp32). Every output element depends on its own input
element and on its row, so a stage read before its TMA landed (stale or zero data), a stage
read after the producer overwrote it (the next tile's data), or a tile written to the wrong
place all show up as a MISMATCH against ``x * scale[:, None] + bias[:, None]``.

Warp roles (block = (consumer_warps + 1) * 32 threads, one CTA per SM):
- warps 0 .. consumer_warps-1: consumers. Per tile: wait on full[s], copy the stage from smem
  into registers (128-bit ld.shared per thread per row pass), __syncwarp, release empty[s], then
  compute in fp32 and write 128-bit predicated global stores.
- warp consumer_warps: producer. Per tile: acquire empty[s], issue three TMA loads
  (cp.async.bulk.tensor: the x tile, the scale slice, the bias slice) onto full[s].

Persistent schedule: grid = min(ctas, num_tiles); CTA b handles tiles b, b + grid, ... in
row-major tile order, so with more tiles than CTAs * stages the ring wraps many times and every
stage runs through both mbarrier phases repeatedly.

Pipeline: ``cutlass.pipeline.PipelineTmaAsync`` with S = ``stages`` slots; barriers full[0..S)
then empty[0..S) in smem, initialised by warp 0 (elect_one) inside ``create``:
- full[s]  arrive count 1 (producer group = 1 thread): the producer's elect_one
  ``mbarrier.arrive.expect_tx`` in ``producer_acquire``; the phase completes when that arrive
  AND all tx bytes of the stage have landed.
- empty[s] arrive count = consumer_warps (consumer group = consumer_warps threads): in
  ``consumer_release`` lane 0 of each consumer warp arrives (cluster size 1).
- tx_count = bytes landing in this CTA's smem per stage, summed over the stage's TMA loads:
      tile_m * tile_n * sizeof(dtype)    (x tile; OOB rows/cols are zero-filled and still count)
    + tile_m * 4                         (scale slice, fp32)
    + tile_m * 4                         (bias slice, fp32)
  e.g. fp32, 32 x 256: 32768 + 128 + 128 = 33024; bf16, 32 x 256: 16384 + 256 = 16640.
- Phases: ``make_pipeline_state``: producer starts at phase 1 (empty slots pass at once),
  consumer at phase 0; each ``advance`` past slot S-1 flips the phase.
- ``producer_tail`` waits on every empty[s] before the producer warp exits.

Smem: the ``cute.struct`` SharedStorage (``smem_fields``; ``smem_bytes`` is its size): mbarriers
(2 * S * 8 B), x ring [S][tile_m][tile_n] (128 B aligned), scale and bias rings
[S][pad32(tile_m)] fp32 (each stage 128 B aligned for the TMA destination). The tx bytes above
are one stage of its rings, checked at trace time against ``cute.size_in_bytes`` of the TMA
boxes' smem layouts.

Ragged shapes: M and N need not be multiples of the tile; TMA zero-fills out-of-bounds loads and
the consumers predicate each 128-bit store on (row < M, col < N). TMA needs the row pitch to be a
multiple of 16 bytes, so N must be a multiple of 4 (fp32) / 8 (bf16). The TMA views carry a
dynamic row count (a static size-1 mode would be folded out of the box). Element offsets are
32-bit: (M + tile_m) * N < 2**31. bf16 TOLERANCE allows one bf16 ulp (fp32 fma, one rounding).

Faults that apply (cutedebug patches them at trace time; none is written here), and what each
should cause in this kernel:
- expect_tx bytes + k: full[s] never completes -> HANG in consumer_wait (full barrier).
- expect_tx bytes - k: full[s] may complete before the stage landed -> MISMATCH / undefined.
- empty arrive count + 1, or a skipped consumer_release: the producer's second lap never
  acquires -> HANG in producer_acquire (empty barrier), needs more than S tiles per CTA.
- empty arrive count - 1: a slot is refilled while one warp still reads it -> RACE / MISMATCH.
- no phase flip in PipelineState.advance: consumer side -> reads a stale stage (MISMATCH);
  producer side -> HANG in producer_acquire on the second lap.
- skipped producer_tail: benign for a single CTA (expect PASS).
- dropped CTA sync in create() (agent_sync): threads may use barriers before init -> HANG or
  undefined. The mainloops have no CTA-wide sync; consumers only __syncwarp before releasing.
Kernel-level switch:
- ``oob_store``: the output view starts ``tile_m`` rows late, so the last tile row writes
  ``tile_m * N`` elements past the end of the output (memcheck: invalid global write; a plain
  run: MISMATCH, every tile lands one tile row low).
Wrong-value switches (rows of the failure table; off = the PTX above, byte for byte):
- ``edge_pred_whole_tiles``: the store predicate asks "is the whole tile inside (M, N)?"
  instead of testing each vector's (row, col): the partial tiles at the M / N edges are never
  stored (they keep the output's NaN): MISMATCH in the edge tiles only.
- ``stale_smem_store``: y is computed in registers, but the store copies the stage's x from
  smem (the copy that was never updated; the release moves after the stores): every element
  wrong, the same way every run.
- ``unassumed_align``: the stores go through an explicit 128-bit copy atom into an output view
  whose row pitch is a run-time value with no ``cute.assume(pitch, divby=4)``: the DSL's
  verifier cannot prove 16-byte alignment and rejects the copy (COMPILE_ERROR).
- ``overclaimed_align``: the output is a view one element into its buffer (4 / 2 bytes past a
  16-byte boundary, like ``buf[1:]``) while ``from_dlpack(..., assumed_align=16)`` claims 16:
  the DSL checks the pointer when it converts the real arguments and rejects it
  (COMPILE_ERROR "Tensor data pointer is not aligned to 16 bytes", measured on the H200).
  Host side only: the kernel's code is the clean one's.

Tiling (``tiling()``, for cutedebug's mismatch map): output tiles tile_m x tile_n in row-major
tile order, CTA b takes tiles b, b + grid, ...; a tile's sequence number on its CTA picks its
ring slot (seq % stages).
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import cuda.bindings.driver as cuda
import cutlass
from cutlass import cute, pipeline
from cutlass.cute.nvgpu import cpasync
from cutlass.cute.runtime import from_dlpack, make_fake_stream, make_fake_tensor
from cutlass.memory import SmemAllocator

DTYPES = {"fp32": cutlass.Float32, "bf16": cutlass.BFloat16}
ELEM_BYTES = {"fp32": 4, "bf16": 2}
VECTOR_BYTES = 16  # one 128-bit ld.shared / st.global per thread per row pass
SMEM_BYTES_MAX = 227 * 1024
TMA_ALIGN = 128  # each ring starts 128 B aligned (a TMA destination needs it)


def smem_struct(name: str, **fields) -> cute.struct:
    """``cute.struct`` with ``fields`` in order. (A class body's annotations would be strings
    here: this module keeps ``from __future__ import annotations`` for the DSL's signatures.)"""
    return cute.struct(type(name, (), {"__annotations__": fields}))


class Loads(NamedTuple):
    """The producer's TMA loads: copy atom and TMA view of x, scale and bias."""

    tma_x: cute.CopyAtom
    mx: cute.Tensor
    tma_s: cute.CopyAtom
    ms: cute.Tensor
    tma_b: cute.CopyAtom
    mb: cute.Tensor


class Rings(NamedTuple):
    """The smem rings (S stages): x [tile_m, tile_n, S], scale and bias [tile_m, S] fp32."""

    sx: cute.Tensor
    ss: cute.Tensor
    sb: cute.Tensor


def tile_origin(tile, tiles_n: int, tile_m: int, tile_n: int):
    """(row, col) of the first element of linear tile ``tile`` (row-major tile order).

    Plain arithmetic: works on Python ints (host-side emulation) and on DSL Int32 (device).
    """
    return (tile // tiles_n) * tile_m, (tile % tiles_n) * tile_n


class TmaStream:
    PARAMS: ClassVar[dict[str, object]] = {
        "m": 8192, "n": 8192, "dtype": "fp32", "tile_m": 32, "tile_n": 256, "stages": 4,
        "consumer_warps": 4, "ctas": 132, "seed": 0,
    }
    CHOICES: ClassVar[dict[str, tuple]] = {
        "dtype": ("fp32", "bf16"),
        "tile_m": (8, 16, 32, 64, 128),
        "tile_n": (64, 128, 256),
        "stages": (2, 3, 4, 5, 6, 8),
        "consumer_warps": (4, 8),
    }
    SHRINKABLE = ("m", "n", "ctas")
    ARCHS = ("sm_90a",)
    SWITCHES: ClassVar[dict[str, str]] = {
        "oob_store": "output view shifted tile_m rows: the last tile row writes past the allocation",
        "edge_pred_whole_tiles": "store predicate admits whole tiles only: edge tiles unstored",
        "stale_smem_store": "stores copy the stage's x from smem instead of y from registers",
        "unassumed_align": "128-bit store atom on an output view with an unassumed run-time "
                           "row pitch",
        "overclaimed_align": "output is an offset view (buf[1:]) passed as 16-byte aligned",
    }
    TOLERANCE = (1e-5, 1e-5)

    def __init__(self, m=PARAMS["m"], n=PARAMS["n"], dtype=PARAMS["dtype"],
                 tile_m=PARAMS["tile_m"], tile_n=PARAMS["tile_n"], stages=PARAMS["stages"],
                 consumer_warps=PARAMS["consumer_warps"], ctas=PARAMS["ctas"],
                 seed=PARAMS["seed"], oob_store=False, edge_pred_whole_tiles=False,
                 stale_smem_store=False, unassumed_align=False, overclaimed_align=False):
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: allowed {list(DTYPES)}")
        elem = ELEM_BYTES[dtype]
        if m < 1 or n < 1 or ctas < 1 or stages < 2:
            raise ValueError(f"need m, n, ctas >= 1 and stages >= 2 (m={m} n={n} "
                             f"ctas={ctas} stages={stages})")
        if n * elem % 16:
            raise ValueError(f"n={n}: TMA needs a row pitch that is a multiple of 16 bytes "
                             f"(n multiple of {16 // elem} for {dtype})")
        if (m + tile_m) * n >= 2**31:
            raise ValueError(f"m*n={m * n}: element offsets are 32-bit (keep (m + tile_m) * n "
                             "< 2**31)")
        self.m, self.n, self.dtype_name, self.seed = m, n, dtype, seed
        # bf16 output: fp32 fma then one bf16 rounding; allow one bf16 ulp against torch
        self.TOLERANCE = (1e-5, 1e-5) if dtype == "fp32" else (8e-3, 8e-3)
        self.dtype = DTYPES[dtype]
        self.tile_m, self.tile_n, self.stages = tile_m, tile_n, stages
        self.consumer_warps = consumer_warps
        self.oob_store = oob_store
        self.edge_pred_whole_tiles = edge_pred_whole_tiles
        self.stale_smem_store = stale_smem_store
        self.unassumed_align = unassumed_align
        self.overclaimed_align = overclaimed_align
        self.vec = VECTOR_BYTES // elem
        self.threads_per_row = tile_n // self.vec
        self.consumer_threads = 32 * consumer_warps
        if self.consumer_threads % self.threads_per_row:
            raise ValueError(f"tile_n={tile_n}: {self.threads_per_row} threads per row must "
                             f"divide {self.consumer_threads} consumer threads")
        self.rows_per_pass = self.consumer_threads // self.threads_per_row
        if tile_m % self.rows_per_pass:
            raise ValueError(f"tile_m={tile_m} must be a multiple of {self.rows_per_pass} "
                             f"(rows covered by one pass of {self.consumer_threads} threads)")
        self.passes = tile_m // self.rows_per_pass
        self.row_pad = -(-tile_m // 32) * 32  # per-stage scale/bias stride: 128 B aligned
        self.tiles_m = -(-m // tile_m)
        self.tiles_n = -(-n // tile_n)
        self.num_tiles = self.tiles_m * self.tiles_n
        self.grid = min(ctas, self.num_tiles)
        self.threads = self.consumer_threads + 32
        fields = self.smem_fields()
        self.storage = smem_struct("SharedStorage", **fields)
        self.smem_bytes = self.storage.size_in_bytes()
        # tx bytes per stage: one stage of each TMA-filled ring (__call__ checks them against
        # cute.size_in_bytes of each TMA box's smem layout)
        self.x_stage_bytes = fields["x"].dtype.size_in_bytes // stages
        self.tx_bytes = self.x_stage_bytes + 2 * tile_m * 4
        if self.smem_bytes > SMEM_BYTES_MAX:
            raise ValueError(f"{self.smem_bytes} bytes of smem for {stages} stages of "
                             f"{tile_m}x{tile_n} {dtype}: over {SMEM_BYTES_MAX}")

    def smem_fields(self) -> dict:
        """The CTA's smem, in order: full[0..S) then empty[0..S) mbarriers, the x ring, the
        scale ring and the bias ring (``ring_layouts``), each ring 128 B aligned."""
        mem, align, s = cute.struct.MemRange, cute.struct.Align, self.stages
        row_ring = self.tile_m + (s - 1) * self.row_pad  # cosize of (tile_m, S):(1, row_pad)
        return {
            "barriers": mem[cutlass.Int64, 2 * s],
            "x": align[mem[self.dtype, self.tile_m * self.tile_n * s], TMA_ALIGN],
            "scale": align[mem[cutlass.Float32, row_ring], TMA_ALIGN],
            "bias": align[mem[cutlass.Float32, row_ring], TMA_ALIGN],
        }

    def ring_layouts(self) -> tuple[cute.Layout, cute.Layout]:
        """Trace time: the x ring (tile_m, tile_n, S) and the scale / bias ring (tile_m, S),
        whose stages are row_pad fp32 apart (each stage 128 B aligned)."""
        x_ring = cute.make_layout((self.tile_m, self.tile_n, self.stages),
                                  stride=(self.tile_n, 1, self.tile_m * self.tile_n))
        return x_ring, cute.make_layout((self.tile_m, self.stages), stride=(1, self.row_pad))

    # ---- host side ------------------------------------------------------------------------
    @cute.jit
    def __call__(self, x: cute.Tensor, scale: cute.Tensor, bias: cute.Tensor, out: cute.Tensor,
                 stream: cuda.CUstream):
        # TMA views with a dynamic row count: a static size-1 mode (m == 1) would be folded
        # out of the TMA box, leaving a 1-D copy that lands fewer bytes than tx_count
        rows = cutlass.Int32(self.m)
        x = cute.make_tensor(x.iterator, cute.make_layout((rows, self.n), stride=(self.n, 1)))
        scale = cute.make_tensor(scale.iterator, cute.make_layout((rows,)))
        bias = cute.make_tensor(bias.iterator, cute.make_layout((rows,)))
        x_stage = cute.make_layout((self.tile_m, self.tile_n), stride=(self.tile_n, 1))
        row_stage = cute.make_layout((self.tile_m,))
        self.check_storage(cute.size_in_bytes(self.dtype, x_stage)
                           + 2 * cute.size_in_bytes(cutlass.Float32, row_stage))
        tma_x, mx = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), x, x_stage, (self.tile_m, self.tile_n))
        tma_s, ms = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), scale, row_stage, (self.tile_m,))
        tma_b, mb = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), bias, row_stage, (self.tile_m,))
        self.kernel(tma_x, mx, tma_s, ms, tma_b, mb, out).launch(
            grid=(self.grid, 1, 1), block=(self.threads, 1, 1), stream=stream)

    def check_storage(self, tma_bytes: int):
        """Trace time: SharedStorage holds each ring exactly, and the expect_tx count is the
        bytes of one stage's TMA boxes (``tma_bytes``, from cute.size_in_bytes)."""
        fields = self.smem_fields()
        x_ring, row_ring = self.ring_layouts()
        for name, ring in (("x", x_ring), ("scale", row_ring), ("bias", row_ring)):
            if fields[name].dtype.size != cute.cosize(ring):
                raise ValueError(f"SharedStorage.{name}: {fields[name].dtype.size} elements for "
                                 f"a ring of cosize {cute.cosize(ring)}")
        if tma_bytes != self.tx_bytes:
            raise ValueError(f"tx bytes {self.tx_bytes}: one stage of TMA boxes is {tma_bytes} B")

    # ---- device side ----------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tma_x: cute.CopyAtom, mx: cute.Tensor, tma_s: cute.CopyAtom,
               ms: cute.Tensor, tma_b: cute.CopyAtom, mb: cute.Tensor, out: cute.Tensor):
        # (the launch signature stays flat: the argument reprs make the kernel's symbol name)
        S = self.stages
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tid, _, _ = cute.arch.thread_idx()
        producer_warp = self.consumer_warps

        # -- prologue: smem, barriers (create() inits them and syncs the CTA) --------------
        storage = SmemAllocator().allocate(self.storage)
        barriers = storage.barriers.data_ptr()
        x_ring, row_ring = self.ring_layouts()
        rings = Rings(storage.x.get_tensor(x_ring), storage.scale.get_tensor(row_ring),
                      storage.bias.get_tensor(row_ring))
        if warp == producer_warp:
            cpasync.prefetch_descriptor(tma_x)
            cpasync.prefetch_descriptor(tma_s)
            cpasync.prefetch_descriptor(tma_b)

        ring = pipeline.PipelineTmaAsync.create(
            num_stages=S,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     self.consumer_warps),
            tx_count=self.tx_bytes,
            barrier_storage=barriers,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        )

        if warp == producer_warp:
            self.load(ring, Loads(tma_x, mx, tma_s, ms, tma_b, mb), rings)
        else:
            self.compute(ring, rings, out, tid)

    @cute.jit
    def load(self, ring: pipeline.PipelineTmaAsync, loads: Loads, rings: Rings):
        """Producer warp: one TMA triple per tile into the next ring slot."""
        tma_x, mx, tma_s, ms, tma_b, mb = loads
        sx, ss, sb = rings
        bid, _, _ = cute.arch.block_idx()
        one_cta = cute.make_layout(1)
        # (TMA, S) smem views and (TMA, tiles_m, tiles_n) / (TMA, tiles_m) gmem views
        gx = cute.local_tile(mx, (self.tile_m, self.tile_n), (None, None))
        tsx, tgx = cpasync.tma_partition(
            tma_x, 0, one_cta, cute.group_modes(sx, 0, 2), cute.group_modes(gx, 0, 2))
        gs = cute.local_tile(ms, (self.tile_m,), (None,))
        tss, tgs = cpasync.tma_partition(
            tma_s, 0, one_cta, cute.group_modes(ss, 0, 1), cute.group_modes(gs, 0, 1))
        gb = cute.local_tile(mb, (self.tile_m,), (None,))
        tsb, tgb = cpasync.tma_partition(
            tma_b, 0, one_cta, cute.group_modes(sb, 0, 1), cute.group_modes(gb, 0, 1))

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        # -- mainloop ------------------------------------------------------------------------
        for tile in cutlass.range(bid, self.num_tiles, self.grid, unroll=1):
            tm = tile // self.tiles_n
            tn = tile % self.tiles_n
            ring.producer_acquire(state)
            full = ring.producer_get_barrier(state)
            cute.copy(tma_x, tgx[(None, tm, tn)], tsx[(None, state.index)], tma_bar_ptr=full)
            cute.copy(tma_s, tgs[(None, tm)], tss[(None, state.index)], tma_bar_ptr=full)
            cute.copy(tma_b, tgb[(None, tm)], tsb[(None, state.index)], tma_bar_ptr=full)
            ring.producer_commit(state)
            state.advance()
        # -- tail: every slot released before the warp exits --------------------------------
        ring.producer_tail(state)

    @cute.jit
    def compute(self, ring: pipeline.PipelineTmaAsync, rings: Rings, out: cute.Tensor,
                tid: cutlass.Int32):
        """Consumer warps: stage -> registers, release, fp32 affine, predicated stores."""
        sx, ss, sb = rings
        bid, _, _ = cute.arch.block_idx()
        vec = self.vec
        if cutlass.const_expr(self.oob_store):
            # fault: the view starts tile_m rows late; the predicates still trust (m, n)
            out = cute.make_tensor(out.iterator + self.tile_m * self.n, out.layout)
        store_atom = None
        if cutlass.const_expr(self.unassumed_align):
            # fault: the row pitch is a run-time value nobody promised divisible by 4
            # (no cute.assume): the 128-bit atom needs an alignment the view cannot prove
            pitch = cutlass.Int32(self.n)
            out = cute.make_tensor(out.iterator,
                                   cute.make_layout((self.m, self.n), stride=(pitch, 1)))
            store_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype,
                                             num_bits_per_copy=128)
        # thread t covers row (t // threads_per_row) + rows_per_pass * p and vec columns
        # starting at (t % threads_per_row) * vec, for passes p = 0 .. passes-1
        row0 = tid // self.threads_per_row
        col0 = (tid % self.threads_per_row) * vec
        rx = cute.make_rmem_tensor((vec, self.passes), self.dtype)
        rscale = cute.make_rmem_tensor((self.passes,), cutlass.Float32)
        rbias = cute.make_rmem_tensor((self.passes,), cutlass.Float32)
        ry = cute.make_rmem_tensor((vec,), self.dtype)

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        # -- mainloop ------------------------------------------------------------------------
        for tile in cutlass.range(bid, self.num_tiles, self.grid, unroll=1):
            ring.consumer_wait(state)
            stage_x = sx[(None, None, state.index)]
            for p in cutlass.range_constexpr(self.passes):
                r = row0 + p * self.rows_per_pass
                cute.autovec_copy(cute.local_tile(stage_x[(r, None)], (vec,), (col0 // vec,)),
                                  rx[(None, p)])
                rscale[p] = ss[(r, state.index)]
                rbias[p] = sb[(r, state.index)]
            if cutlass.const_expr(not self.stale_smem_store):
                # lane 0 releases for the whole warp: every lane's smem reads must be done first
                cute.arch.sync_warp()
                ring.consumer_release(state)
                state.advance()

            m0, n0 = tile_origin(tile, self.tiles_n, self.tile_m, self.tile_n)
            col = n0 + col0
            for p in cutlass.range_constexpr(self.passes):
                row = m0 + row0 + p * self.rows_per_pass
                pr, pc = row, col  # the coordinates the store predicate tests
                if cutlass.const_expr(self.edge_pred_whole_tiles):
                    # fault: the tile's last row / column is tested, not this vector's own
                    pr, pc = m0 + (self.tile_m - 1), n0 + (self.tile_n - 1)
                if pr < self.m and pc < self.n:
                    for v in cutlass.range_constexpr(vec):
                        y = rx[(v, p)].to(cutlass.Float32) * rscale[p] + rbias[p]
                        ry[v] = y.to(self.dtype)
                    dst = cute.local_tile(out[(row, None)], (vec,), (col // vec,))
                    if cutlass.const_expr(self.stale_smem_store):
                        # fault: y lives in registers only; the store re-reads the stage
                        r = row0 + p * self.rows_per_pass
                        cute.autovec_copy(
                            cute.local_tile(stage_x[(r, None)], (vec,), (col0 // vec,)), dst)
                    elif cutlass.const_expr(self.unassumed_align):
                        cute.copy(store_atom, ry, dst)
                    else:
                        cute.autovec_copy(ry, dst)
            if cutlass.const_expr(self.stale_smem_store):
                cute.arch.sync_warp()
                ring.consumer_release(state)
                state.advance()

    # ---- interface ------------------------------------------------------------------------
    def tiling(self):
        """Output tiles, their CTA and their position in its work order (host-side mirror of
        the persistent schedule: CTA b takes tiles b, b + grid, ...; one ring slot per tile)."""
        tiles = [[tm * self.tiles_n + tn for tn in range(self.tiles_n)]
                 for tm in range(self.tiles_m)]
        return {"shape": [self.m, self.n], "tile": [self.tile_m, self.tile_n],
                "stages": self.stages, "k_tiles": 1,
                "tile_cta": [[t % self.grid for t in row] for row in tiles],
                "tile_seq": [[t // self.grid for t in row] for row in tiles]}

    def fake_args(self):
        x = make_fake_tensor(self.dtype, (self.m, self.n), stride=(self.n, 1), assumed_align=16)
        out = make_fake_tensor(self.dtype, (self.m, self.n), stride=(self.n, 1),
                               assumed_align=16)
        scale = make_fake_tensor(cutlass.Float32, (self.m,), stride=(1,), assumed_align=16)
        bias = make_fake_tensor(cutlass.Float32, (self.m,), stride=(1,), assumed_align=16)
        return (x, scale, bias, out, make_fake_stream())

    def make_inputs(self, device):
        import torch

        g = torch.Generator(device="cpu").manual_seed(self.seed)
        tdtype = torch.float32 if self.dtype_name == "fp32" else torch.bfloat16
        x = torch.randn(self.m, self.n, generator=g).to(tdtype)
        # scale in [0.5, 1.5): zero-filled or stale stage data cannot reproduce the output
        scale = torch.rand(self.m, generator=g) + 0.5
        bias = torch.randn(self.m, generator=g)
        out = torch.full((self.m, self.n), float("nan"), dtype=tdtype)
        out = out.to(device)
        if self.overclaimed_align:
            # fault: one element into its buffer; cute_args still claims 16-byte alignment
            out = torch.full((self.m * self.n + 1,), float("nan"), dtype=tdtype,
                             device=device)[1:].view(self.m, self.n)
        return {"x": x.to(device), "scale": scale.to(device), "bias": bias.to(device),
                "out": out}

    def cute_args(self, tensors):
        import torch

        args = tuple(from_dlpack(tensors[k], assumed_align=16)
                     for k in ("x", "scale", "bias", "out"))
        stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        return (*args, stream)

    def reference(self, tensors):
        # float64 product is exact, so rounding to fp32 matches the kernel's single-rounded fma
        x = tensors["x"].double()
        y = x * tensors["scale"].double()[:, None] + tensors["bias"].double()[:, None]
        return y.float().to(tensors["x"].dtype)

    def output(self, tensors):
        return tensors["out"]
