"""Cluster row reduction over distributed shared memory (SM90): row sum and RMSNorm.

For a row-major [M, N] input x (fp32 or bf16; math in fp32):
- ``op = "sum"``:     out[m] = sum_n x[m, n]                                  (fp32, shape [M])
- ``op = "rmsnorm"``: out[m, n] = x[m, n] * rsqrt(mean_n x[m, n]^2 + eps) * w[n]
                                                                   (x's dtype, w fp32 [N])

Rows are too wide for one CTA: a cluster of C = ``cluster`` CTAs (2, 4 or 8, launched as
cluster dims (C, 1, 1)) splits every row. CTA rank r (``%cluster_ctarank``) owns the vector
slice [r * S, min((r + 1) * S, N / V)) of a row, V = 16 / sizeof(dtype) elements per 128-bit
vector (V = 1 when a row is not a multiple of 16 bytes: scalar loads), S = ceil(N / V / C).

Schedule: G = ``clusters`` clusters (0: one per row, G = M); cluster g = ``%clusterid.x`` handles
rows g, g + G, g + 2G, ... Row i of a cluster (i = 0, 1, ...) uses slot s = i % 2 and mbarrier
phase (i // 2) % 2, so with more than two rows per cluster both barriers cycle through both
phases.

Per row, in every CTA (T = ``threads`` threads, W = T / 32 warps, U = ``unroll``):
1. slice -> registers: U 128-bit loads per thread in flight, fp32 accumulators (x, or x^2);
2. warp shuffle reduction, lane 0 -> warp_sums[s][warp] (smem), ``bar.sync``, warp 0 reduces
   the W values into the CTA partial p (fp32);
3. warp 0 lane 0 arms its OWN barrier: ``mbarrier.arrive.expect_tx(bar[s], C * 4)``;
   lanes k < C push p into CTA k's ``partials[s][r]`` with ``st.async.shared::cluster ...
   mbarrier::complete_tx::bytes`` on CTA k's bar[s] (4 bytes each; k == r is this CTA);
4. every thread waits on its own bar[s] at parity (i // 2) % 2, then
   ``fence.acq_rel.cluster`` (acquire pattern at cluster scope: the partials were written by
   other CTAs), and sums partials[s][0 .. C) in rank order (identical in every CTA);
5. sum: CTA rank (row % C) thread 0 writes out[row]; rmsnorm: every CTA normalizes its slice
   (second pass over x, 128-bit loads of x and w, 128-bit stores).

Smem: the ``cute.struct`` SharedStorage (``smem_fields``): bar[0..2), partials[2][C] and
warp_sums[2][W] (fp32, 16 B aligned); ``smem_bytes`` is its size.

Barrier arithmetic (bar[0], bar[1] in smem, initialised by thread 0 with arrive count 1):
- arrivals per phase: 1 (the arm in step 3, by this CTA's warp 0 lane 0);
- tx bytes per phase: C partials x 4 bytes = 4C (8, 16, 32 for C = 2, 4, 8), every CTA of the
  cluster (itself included) delivering 4 bytes through st.async complete_tx (derived: one slot
  of SharedStorage's partials, checked at trace time against ``cute.size_in_bytes``);
- a peer's bytes may land before the arm (the tx count goes negative, legal); the phase
  completes once the arm arrived and all 4C bytes landed.
Slot reuse (no empty barriers): peer P writes slot s for row i + 2 only after P's wait of row
i + 1, which needs this CTA's row i + 1 partial, sent after this CTA's ``bar.sync`` of row i + 1,
which every warp reaches only after reading row i's slot s. warp_sums is double-buffered the
same way: warp 0 reads warp_sums[s] for row i before it reaches row i + 1's ``bar.sync``, and
the other warps write warp_sums[s] for row i + 2 only after that ``bar.sync``, so a CTA barrier
orders the reuse (with one buffer, the order went through the partials mbarrier: correct, but
racecheck, which does not model mbarriers, reported it as a WAR hazard).

Cluster synchronization:
- after init: ``fence.mbarrier_init.release.cluster`` + ``barrier.cluster.arrive.relaxed`` +
  ``barrier.cluster.wait``: no peer st.async reaches a barrier before it is initialised;
- trailing: ``barrier.cluster.arrive`` (release) + ``barrier.cluster.wait``: no CTA exits
  while a peer may still address its shared memory, and no CTA exits before its own st.async
  were consumed (each receiver's wait proves they landed; the barrier carries that back).

Ragged shapes: any M >= 1; N not a multiple of C * V * T * U (the last CTA's slice is shorter,
loads past the slice end are predicated off); N not a multiple of V falls back to scalar loads.
Element offsets are 32-bit: M * N < 2**31. TOLERANCE: sum, atol 2e-7 * N (fp32 accumulation of
N terms vs a float64 reference); rmsnorm, 1e-5 (fp32) / one bf16 ulp (bf16).

Faults (cutedebug injects them; nothing here is faulty unless a switch is set):
- registry ``wrong_expect_tx`` (through ``cute.arch.mbarrier_arrive_and_expect_tx``):
  + k bytes: bar[s] never completes -> HANG in the partials wait (raw_wait site);
  - k bytes: the phase completes before the last partial lands (MISMATCH, timing-dependent);
  the late bytes are charged to the barrier's next phase, which falls k bytes further behind
  each time, so with enough rows per cluster it ends in a HANG.
- registry ``missing_init_fence`` (drop="fence"): the mbarrier init is not fenced at cluster
  scope; expect PASS at run time (peers start sending only after their slice loads).
- registry ``cta_scope_sync``: ``fence.acq_rel.cluster`` after the wait becomes
  ``fence.acq_rel.cta`` and/or the trailing ``barrier.cluster.arrive`` loses its release;
  formally a data race on the partials, expect PASS on current hardware (PTX-visible only).
Kernel-level switches (SWITCHES):
- ``skip_init_cluster_sync``: no cluster barrier after init (a ``bar.sync`` only): a fast peer's
  st.async may hit an uninitialised barrier and be lost -> HANG; usually PASS (timing).
- ``skip_cluster_tail``: no trailing cluster barrier; every CTA still waits for its own incoming
  bytes, so a CTA exits only with its outgoing st.async possibly in flight: expect PASS.
- ``cluster_mismatch``: launched with cluster dims L = 2C (C <= 4) or C / 2 (C = 8) while the
  kernel reduces over C (G is rounded up to even so the grid stays a multiple of L): with
  L = 2C, CTAs of rank >= C get no partials -> HANG in the partials wait (ranks < C get 2C
  partials, their phases complete early -> wrong sums; rank >= C CTAs read past their row).
  The kernel's PTX is unchanged: only the launch differs.
- ``unassumed_align`` (a wrong-value-table switch; off = the PTX above, byte for byte): the
  slice loads go through an explicit 128-bit copy atom on a view of x whose row pitch is a
  run-time value with no ``cute.assume(pitch, divby=V)``: the DSL's verifier cannot prove
  16-byte alignment and rejects the copy (COMPILE_ERROR). Needs 128-bit loads (V > 1).
- ``overclaimed_align`` (same table row): x is a view one element into its buffer (like
  ``buf[1:]``) while ``from_dlpack(..., assumed_align=16)`` claims 16: the DSL checks the
  pointer when it converts the real arguments and rejects it (COMPILE_ERROR "Tensor data
  pointer is not aligned to 16 bytes", measured on the H200). Host side only.

Tiling (``tiling()``, for cutedebug's mismatch map): rmsnorm output [M, N] in tiles of one row
x one CTA slice (V * S columns); the tile's CTA is (row's cluster, slice rank); sum output [M]
as M x 1 tiles of one row.
"""

from __future__ import annotations

import operator
from typing import ClassVar, NamedTuple

import cuda.bindings.driver as cuda
import cutlass
from cutlass import cute
from cutlass.cute.runtime import from_dlpack, make_fake_stream, make_fake_tensor
from cutlass.memory import SmemAllocator

DTYPES = {"fp32": cutlass.Float32, "bf16": cutlass.BFloat16}
ELEM_BYTES = {"fp32": 4, "bf16": 2}
VECTOR_BYTES = 16
SLOTS = 2  # double-buffered partials, barriers and warp_sums


def smem_struct(name: str, **fields) -> cute.struct:
    """``cute.struct`` with ``fields`` in order. (A class body's annotations would be strings
    here: this module keeps ``from __future__ import annotations`` for the DSL's signatures.)"""
    return cute.struct(type(name, (), {"__annotations__": fields}))


class Span(NamedTuple):
    """This CTA's vector slice [start, end) of a row, and the thread that walks it."""

    start: cutlass.Int32
    end: cutlass.Int32
    tid: cutlass.Int32


def slice_bounds(rank: int, nv: int, cluster: int) -> tuple[int, int]:
    """[start, end) in vectors of the slice CTA ``rank`` reduces (host-side mirror)."""
    per = -(-nv // cluster)
    return min(rank * per, nv), min((rank + 1) * per, nv)


def launch_cluster(cluster: int, mismatch: bool) -> int:
    """Cluster size the kernel is launched with (differs from ``cluster`` under the switch)."""
    if not mismatch:
        return cluster
    return 2 * cluster if cluster <= 4 else cluster // 2


class ClusterReduce:
    PARAMS: ClassVar[dict[str, object]] = {
        "m": 256, "n": 65536, "dtype": "fp32", "op": "sum", "cluster": 2, "clusters": 0,
        "threads": 256, "unroll": 8, "eps": 1e-6, "seed": 0,
    }
    CHOICES: ClassVar[dict[str, tuple]] = {
        "dtype": ("fp32", "bf16"),
        "op": ("sum", "rmsnorm"),
        "cluster": (2, 4, 8),
        "threads": (128, 256, 512),
        "unroll": (1, 2, 4, 8),
    }
    SHRINKABLE = ("m", "n", "clusters")
    ARCHS = ("sm_90a",)
    SWITCHES: ClassVar[dict[str, str]] = {
        "skip_init_cluster_sync": "no cluster barrier after mbarrier init (CTA bar.sync only)",
        "skip_cluster_tail": "no trailing cluster barrier before exit",
        "cluster_mismatch": "launch cluster dims differ from the cluster the kernel reduces over",
        "unassumed_align": "128-bit load atom on a view of x with an unassumed run-time row pitch",
        "overclaimed_align": "x is an offset view (buf[1:]) passed as 16-byte aligned",
    }
    TOLERANCE = (1e-5, 1e-5)

    def __init__(self, m=PARAMS["m"], n=PARAMS["n"], dtype=PARAMS["dtype"], op=PARAMS["op"],
                 cluster=PARAMS["cluster"], clusters=PARAMS["clusters"],
                 threads=PARAMS["threads"], unroll=PARAMS["unroll"], eps=PARAMS["eps"],
                 seed=PARAMS["seed"], skip_init_cluster_sync=False, skip_cluster_tail=False,
                 cluster_mismatch=False, unassumed_align=False, overclaimed_align=False):
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: allowed {list(DTYPES)}")
        if op not in ("sum", "rmsnorm"):
            raise ValueError(f"op {op!r}: allowed ['sum', 'rmsnorm']")
        if cluster not in (2, 4, 8):
            raise ValueError(f"cluster={cluster}: allowed 2, 4, 8")
        if threads % 32 or not 32 <= threads <= 1024 or unroll < 1:
            raise ValueError(f"threads={threads} (multiple of 32, <= 1024), unroll={unroll}")
        if m < 1 or n < 1 or clusters < 0:
            raise ValueError(f"need m, n >= 1 and clusters >= 0 (m={m} n={n} "
                             f"clusters={clusters})")
        if m * n >= 2**31:
            raise ValueError(f"m*n={m * n}: element offsets are 32-bit (keep m*n < 2**31)")
        self.m, self.n, self.dtype_name, self.op = m, n, dtype, op
        self.dtype = DTYPES[dtype]
        self.cluster, self.threads, self.unroll = cluster, threads, unroll
        self.eps, self.seed = float(eps), seed
        self.skip_init_cluster_sync = skip_init_cluster_sync
        self.skip_cluster_tail = skip_cluster_tail
        self.cluster_mismatch = cluster_mismatch
        self.unassumed_align = unassumed_align
        self.overclaimed_align = overclaimed_align
        self.launch_cluster = launch_cluster(cluster, cluster_mismatch)
        elem = ELEM_BYTES[dtype]
        self.vec = VECTOR_BYTES // elem if n % (VECTOR_BYTES // elem) == 0 else 1
        self.nv = n // self.vec
        if unassumed_align and self.vec == 1:
            raise ValueError(f"unassumed_align needs 128-bit loads: n={n} must be a multiple "
                             f"of {VECTOR_BYTES // elem}")
        self.slice = -(-self.nv // cluster)
        self.chunk = threads * unroll
        self.iters = -(-self.slice // self.chunk)
        last = self.nv - (cluster - 1) * self.slice  # the shortest slice (last rank)
        self.full_iters = max(0, last) // self.chunk  # unpredicated in every CTA
        self.warps = threads // 32
        self.groups = m if clusters == 0 else min(clusters, m)
        if self.launch_cluster > cluster:  # grid must be a multiple of the launch cluster
            self.groups += self.groups % 2
        self.grid = cluster * self.groups
        fields = self.smem_fields()
        self.storage = smem_struct("SharedStorage", **fields)
        self.smem_bytes = self.storage.size_in_bytes()
        # tx bytes per phase: one slot of partials (C fp32 values, one from every CTA;
        # __call__ checks it against cute.size_in_bytes of the slot's layout)
        self.tx_bytes = fields["partials"].dtype.size_in_bytes // SLOTS
        if op == "sum":
            self.TOLERANCE = (2e-7 * n + 1e-5, 1e-5)
        else:
            self.TOLERANCE = (1e-5, 1e-5) if dtype == "fp32" else (8e-3, 8e-3)

    def smem_fields(self) -> dict:
        """The CTA's smem, in order: bar[0..SLOTS) (mbarriers), partials[SLOTS][C] (fp32, one
        per CTA of the cluster, written by st.async), warp_sums[SLOTS][W] (fp32)."""
        mem, align = cute.struct.MemRange, cute.struct.Align
        return {
            "bars": mem[cutlass.Int64, SLOTS],
            "partials": align[mem[cutlass.Float32, self.cluster * SLOTS], 16],
            "warp_sums": align[mem[cutlass.Float32, self.warps * SLOTS], 16],
        }

    def partials_layout(self) -> cute.Layout:
        """partials as (rank, slot): a slot's C values are contiguous."""
        return cute.make_layout((self.cluster, SLOTS), stride=(1, self.cluster))

    # ---- host side ------------------------------------------------------------------------
    @cute.jit
    def __call__(self, x: cute.Tensor, w: cute.Tensor, out: cute.Tensor,
                 stream: cuda.CUstream):
        self.check_storage()
        self.kernel(x, w, out).launch(
            grid=(self.grid, 1, 1), block=(self.threads, 1, 1),
            cluster=(self.launch_cluster, 1, 1), stream=stream)

    def check_storage(self):
        """Trace time: SharedStorage holds the partials exactly, and the expect_tx count is one
        slot of them (cute.size_in_bytes)."""
        layout = self.partials_layout()
        if self.smem_fields()["partials"].dtype.size != cute.cosize(layout):
            raise ValueError(f"SharedStorage.partials: not the cosize {cute.cosize(layout)} of "
                             "its layout")
        slot_bytes = cute.size_in_bytes(cutlass.Float32, cute.slice_(layout, (None, 0)))
        if slot_bytes != self.tx_bytes:
            raise ValueError(f"tx bytes {self.tx_bytes}: a slot of partials is {slot_bytes} B")

    # ---- device side ----------------------------------------------------------------------
    @cute.kernel
    def kernel(self, x: cute.Tensor, w: cute.Tensor, out: cute.Tensor):
        C = self.cluster
        tid, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        rank = cute.arch.block_idx_in_cluster()
        group, _, _ = cute.arch.cluster_idx()

        # -- prologue: smem, barriers, cluster-wide init visibility ---------------------------
        storage = SmemAllocator().allocate(self.storage)
        bars = storage.bars.data_ptr()
        partials = storage.partials.get_tensor(self.partials_layout())
        warp_sums = storage.warp_sums.get_tensor(cute.make_layout((self.warps, SLOTS)))
        if tid == 0:
            for s in cutlass.range_constexpr(SLOTS):
                cute.arch.mbarrier_init(bars + s, 1)
        cute.arch.mbarrier_init_fence()
        if cutlass.const_expr(self.skip_init_cluster_sync):
            cute.arch.sync_threads()  # fault: the CTA sees the init, its peers need not
        else:
            cute.arch.cluster_arrive_relaxed()
            cute.arch.cluster_wait()

        if cutlass.const_expr(self.unassumed_align):
            # fault: the row pitch is a run-time value nobody promised divisible by V
            # (no cute.assume): the 128-bit load atom needs an alignment x cannot prove
            pitch = cutlass.Int32(self.n)
            x = cute.make_tensor(x.iterator, cute.make_layout((self.m, self.n),
                                                              stride=(pitch, 1)))

        # vector slice [start, end) of this CTA, thread tid's first vector in it
        start = rank * self.slice
        span = Span(start, cutlass.min(start + self.slice, self.nv), tid)

        # -- mainloop: one row per iteration ------------------------------------------------
        for row in cutlass.range(group, self.m, self.groups, unroll=1):
            i = (row - group) // self.groups
            s = i % SLOTS
            phase = (i // SLOTS) % 2
            xrow = x[(row, None)]
            part = self.slice_sum(xrow, span)
            part = cute.arch.warp_reduction(part, operator.add)
            if lane == 0:
                warp_sums[(warp, s)] = part
            cute.arch.sync_threads()
            if warp == 0:
                self.exchange(warp_sums, partials, bars + s, s, rank, lane)
            total = self.gather(partials, bars + s, s, phase)
            if cutlass.const_expr(self.op == "sum"):
                if tid == 0 and rank == row % C:
                    out[row] = total
            else:
                rstd = cute.math.rsqrt(total / self.n + self.eps)
                self.normalize(xrow, w, out[(row, None)], rstd, span)

        # -- tail: keep smem alive until the whole cluster is done --------------------------
        if cutlass.const_expr(not self.skip_cluster_tail):
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    @cute.jit
    def slice_sum(self, xrow: cute.Tensor, span: Span) -> cutlass.Float32:
        """This thread's fp32 sum of x (or x^2) over its vectors of [start, end).

        U 128-bit loads are issued back to back per iteration (U * 16 bytes in flight per
        thread); iterations [0, full_iters) need no predicate in any CTA.
        """
        start, end, tid = span
        vec, U, T = self.vec, self.unroll, self.threads
        rx = cute.make_rmem_tensor((vec, U), self.dtype)
        acc = cute.make_rmem_tensor((vec,), cutlass.Float32)
        acc.fill(0.0)
        for it in cutlass.range(self.full_iters, unroll=1):
            base = start + it * self.chunk + tid
            for u in cutlass.range_constexpr(U):
                src = cute.local_tile(xrow, (vec,), (base + u * T,))
                if cutlass.const_expr(self.unassumed_align):
                    load = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype,
                                               num_bits_per_copy=128)
                    cute.copy(load, src, rx[(None, u)])
                else:
                    cute.autovec_copy(src, rx[(None, u)])
            self.accumulate(rx, acc)
        if cutlass.const_expr(self.full_iters < self.iters):
            for it in cutlass.range(self.full_iters, self.iters, unroll=1):
                base = start + it * self.chunk + tid
                rx.fill(0.0)
                for u in cutlass.range_constexpr(U):
                    if base + u * T < end:
                        cute.autovec_copy(cute.local_tile(xrow, (vec,), (base + u * T,)),
                                          rx[(None, u)])
                self.accumulate(rx, acc)
        total = cutlass.Float32(0.0)
        for e in cutlass.range_constexpr(vec):
            total = total + acc[e]
        return total

    @cute.jit
    def accumulate(self, rx: cute.Tensor, acc: cute.Tensor):
        """acc[e] += x (sum) or x * x (rmsnorm), fp32, over the U loaded vectors."""
        for u in cutlass.range_constexpr(self.unroll):
            for e in cutlass.range_constexpr(self.vec):
                v = rx[(e, u)].to(cutlass.Float32)
                if cutlass.const_expr(self.op == "sum"):
                    acc[e] = acc[e] + v
                else:
                    acc[e] = acc[e] + v * v

    @cute.jit
    def exchange(self, warp_sums: cute.Tensor, partials: cute.Tensor, bar: cute.Pointer,
                 s: cutlass.Int32, rank: cutlass.Int32, lane: cutlass.Int32):
        """Warp 0: CTA partial (sum of warp_sums[s]) -> every peer's partials[s][rank]."""
        v = cutlass.Float32(0.0)
        if lane < self.warps:
            v = warp_sums[(lane, s)]
        p = cute.arch.warp_reduction(v, operator.add)
        if lane == 0:
            cute.arch.mbarrier_arrive_and_expect_tx(bar, self.tx_bytes)
        if lane < self.cluster:
            dst = partials.iterator + (s * self.cluster + rank)
            cute.arch.store_async_dsmem(dst, p.bitcast(cutlass.Int32), bar, lane)

    @cute.jit
    def gather(self, partials: cute.Tensor, bar: cute.Pointer, s: cutlass.Int32,
               phase: cutlass.Int32) -> cutlass.Float32:
        """Wait for all C partials of slot s, then their sum in rank order."""
        cute.arch.mbarrier_wait(bar, phase)
        cute.arch.fence_acq_rel_cluster()
        total = cutlass.Float32(0.0)
        for k in cutlass.range_constexpr(self.cluster):
            total = total + partials[(k, s)]
        return total

    @cute.jit
    def normalize(self, xrow: cute.Tensor, w: cute.Tensor, orow: cute.Tensor,
                  rstd: cutlass.Float32, span: Span):
        """rmsnorm second pass: out = x * rstd * w over this CTA's slice (predicated)."""
        start, end, tid = span
        vec, T = self.vec, self.threads
        rx = cute.make_rmem_tensor((vec,), self.dtype)
        rw = cute.make_rmem_tensor((vec,), cutlass.Float32)
        ry = cute.make_rmem_tensor((vec,), self.dtype)
        for it in cutlass.range(self.iters * self.unroll, unroll=1):
            v = start + it * T + tid
            if v < end:
                cute.autovec_copy(cute.local_tile(xrow, (vec,), (v,)), rx)
                cute.autovec_copy(cute.local_tile(w, (vec,), (v,)), rw)
                for e in cutlass.range_constexpr(vec):
                    ry[e] = (rx[e].to(cutlass.Float32) * rstd * rw[e]).to(self.dtype)
                cute.autovec_copy(ry, cute.local_tile(orow, (vec,), (v,)))

    # ---- interface ------------------------------------------------------------------------
    def tiling(self):
        """rmsnorm: tiles of one row x one CTA slice; sum: one element per row. A tile's CTA:
        (the row's cluster, the slice's rank; for sum the rank that writes the row); its
        position: the row's index among its cluster's rows (slot = position % 2)."""
        width = self.vec * self.slice
        ranks = 1 if self.op == "sum" else -(-self.n // width)
        cta, seq = [], []
        for row in range(self.m):
            group, position = row % self.groups, row // self.groups
            owners = [row % self.cluster] if self.op == "sum" else range(ranks)
            cta.append([group * self.cluster + r for r in owners])
            seq.append([position] * len(owners))
        shape = [self.m, 1] if self.op == "sum" else [self.m, self.n]
        tile = [1, 1] if self.op == "sum" else [1, width]
        return {"shape": shape, "tile": tile, "stages": SLOTS, "k_tiles": 1,
                "tile_cta": cta, "tile_seq": seq}

    def _out_shape(self):
        return (self.m,) if self.op == "sum" else (self.m, self.n)

    def fake_args(self):
        x = make_fake_tensor(self.dtype, (self.m, self.n), stride=(self.n, 1), assumed_align=16)
        w = make_fake_tensor(cutlass.Float32, (self.n,), stride=(1,), assumed_align=16)
        if self.op == "sum":
            out = make_fake_tensor(cutlass.Float32, (self.m,), stride=(1,), assumed_align=16)
        else:
            out = make_fake_tensor(self.dtype, (self.m, self.n), stride=(self.n, 1),
                                   assumed_align=16)
        return (x, w, out, make_fake_stream())

    def make_inputs(self, device):
        import torch

        g = torch.Generator(device="cpu").manual_seed(self.seed)
        tdtype = torch.float32 if self.dtype_name == "fp32" else torch.bfloat16
        # a per-row offset: a stale or missing partial cannot reproduce another row's sum
        x = (torch.randn(self.m, self.n, generator=g)
             + torch.randn(self.m, 1, generator=g)).to(tdtype)
        w = torch.rand(self.n, generator=g) + 0.5
        odtype = torch.float32 if self.op == "sum" else tdtype
        out = torch.full(self._out_shape(), float("nan"), dtype=odtype)
        x = x.to(device)
        if self.overclaimed_align:
            # fault: one element into its buffer; cute_args still claims 16-byte alignment
            view = torch.empty(self.m * self.n + 1, dtype=tdtype, device=device)[1:]
            x = view.view(self.m, self.n).copy_(x)
        return {"x": x, "w": w.to(device), "out": out.to(device)}

    def cute_args(self, tensors):
        import torch

        args = tuple(from_dlpack(tensors[k], assumed_align=16) for k in ("x", "w", "out"))
        stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        return (*args, stream)

    def reference(self, tensors):
        x = tensors["x"].double()
        if self.op == "sum":
            return x.sum(dim=1).float()
        rstd = (x.square().mean(dim=1, keepdim=True) + self.eps).rsqrt()
        return (x * rstd * tensors["w"].double()).to(tensors["x"].dtype)

    def output(self, tensors):
        return tensors["out"]
