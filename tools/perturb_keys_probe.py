"""GPU check of schedule perturbation's keys: does a rule delay exactly the threads it names?

One small cluster kernel (``CTAS`` CTAs in clusters of ``CLUSTER``, ``THREADS`` threads) traced
under ``perturb.instrument`` like any perturbed run: its raw barrier ops get the delay
positions (cutedebug/instrument/perturb.py), the rule table lives in device memory. Every
thread reads ``%globaltimer`` before and after a cluster barrier and stores the difference;
the rule of each scope below delays position ``PROBED`` (after that barrier's
``cluster_wait``) by ``DELAY_US``. A thread counts as delayed when its time exceeds half the
delay; the set of delayed (CTA, rank, warp, lane) must equal the set the rule's keys select by
their documented meaning (perturb_plan.Rule: CTA window and residue, cluster-rank mask, warp
window, lane mask), computed here on the host. One compile, one launch per scope.

A lane subset is expected to read as its whole warp: ptxas closes every delay's spin loop with
a convergence barrier (BSSY/BSYNC or WARPSYNC within 7 instructions after the loop in the SASS
of all four sm_90 families, ptxas 13.0), so the lanes a rule does not select wait there for the
ones it does. Each scope is reported "exact" (the keys, lane by lane), "whole warps" (the keys,
each warp with a selected lane taken whole) or MISMATCH; only a MISMATCH (a key that selects
other CTAs, ranks or warps than it names, or a delay in the zero table) fails the check.

    python tools/perturb_keys_probe.py                # on a GPU (sm_90): exit 1 on a mismatch
    python tools/perturb_keys_probe.py --compile-only # CPU: the positions and launch shape
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cutlass  # noqa: E402
from cutlass import cute  # noqa: E402
from cutlass.memory import SmemAllocator  # noqa: E402

from cutedebug.instrument import perturb  # noqa: E402
from cutedebug.instrument import perturb_plan as P  # noqa: E402

CTAS, CLUSTER, THREADS = 4, 2, 128
DELAY_US = 200
PROBED = 4  # after the second cluster_wait (positions: see POSITIONS)
POSITIONS = [
    ("before", "mbarrier_init"),
    ("before", "cluster_arrive_relaxed"),
    ("after", "cluster_wait"),
    ("before", "cluster_arrive"),
    ("after", "cluster_wait"),
]
SCOPES = [
    "",
    "rank=1",
    "cta=odd",
    "cta=1-2",
    "warp=2",
    "warpgroup=0 rank=0",
    "lane=nonelected",
    "lane=5-7 warp=1-2",
    "rank=0 warp=3 lane=0",
]


@cute.kernel
def keys_kernel(y: cute.Tensor):
    tid, _, _ = cute.arch.thread_idx()
    bid, _, _ = cute.arch.block_idx()
    bar = SmemAllocator().allocate_array(cutlass.Int64, 1, byte_alignment=8)
    if tid == 0:
        cute.arch.mbarrier_init(bar, 1)
    cute.arch.mbarrier_init_fence()
    cute.arch.cluster_arrive_relaxed()
    cute.arch.cluster_wait()
    t0 = cute.arch.globaltimer()
    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()
    t1 = cute.arch.globaltimer()
    y[bid * THREADS + tid] = cutlass.Int64(t1 - t0)


@cute.jit
def keys_host(y: cute.Tensor):
    keys_kernel(y).launch(grid=(CTAS, 1, 1), block=(THREADS, 1, 1), cluster=(CLUSTER, 1, 1))


def selected(rule: P.Rule) -> set[tuple[int, int, int, int]]:
    """(cta, rank, warp, lane) the rule's keys select, by Rule's documented meaning."""
    out = set()
    for cta in range(CTAS):
        rank = cta % CLUSTER
        for t in range(THREADS):
            warp, lane = t // 32, t % 32
            if (
                rule.cta_lo <= cta <= rule.cta_hi
                and cta % rule.cta_mod == rule.cta_rem
                and rule.ranks >> rank & 1
                and rule.warp_lo <= warp <= rule.warp_hi
                and rule.lanes >> lane & 1
            ):
                out.add((cta, rank, warp, lane))
    return out


def whole_warps(threads: set[tuple[int, int, int, int]]) -> set[tuple[int, int, int, int]]:
    """Every lane of each warp that has a thread in ``threads`` (reconverged after a delay)."""
    warps = {(c, r, w) for c, r, w, _ in threads}
    return {(c, r, w, lane) for c, r, w in warps for lane in range(32)}


def compare(delayed: set, rule: P.Rule) -> str:
    """'exact', 'whole warps' or 'MISMATCH ...' for the delayed threads of one launch."""
    want = selected(rule)
    if delayed == want:
        return "exact"
    if delayed == whole_warps(want):
        return "whole warps"
    extra, missing = sorted(delayed - whole_warps(want)), sorted(want - delayed)
    return f"MISMATCH extra {extra[:4]} missing {missing[:4]}"


def compile_kernel(addr: int, y: object):
    with perturb.instrument(addr) as sess:
        compiled = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](keys_host, y)
    got = [(p.where, p.op) for p in sess.positions]
    if got != POSITIONS or sess.shape != {"ctas": CTAS, "warps": THREADS // 32, "cluster": 2}:
        raise SystemExit(f"unexpected positions {got} / shape {sess.shape}")
    return compiled, sess


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true", help="trace and compile, no GPU")
    args = ap.parse_args()
    if args.compile_only:
        from cutlass.cute.runtime import make_fake_tensor

        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        y = make_fake_tensor(cutlass.Int64, (CTAS * THREADS,), stride=(1,), assumed_align=16)
        compiled, sess = compile_kernel(perturb.make_table(False)[1], y)
        print(f"compiled: {len(sess.positions)} positions, shape {sess.shape}")
        return 0
    import torch
    from cutlass.cute.runtime import from_dlpack

    table, addr = perturb.make_table(True)
    y = torch.zeros(CTAS * THREADS, dtype=torch.int64, device="cuda")
    yt = from_dlpack(y, assumed_align=16)
    compiled, sess = compile_kernel(addr, yt)
    bad = 0
    for scope in SCOPES:
        rule = P.Rule(PROBED, DELAY_US * 1000, **P.parse_scope(scope))
        perturb.write_table(table, P.table_bytes([rule], len(sess.positions)))
        y.zero_()
        compiled(yt)
        torch.cuda.synchronize()
        ns = y.cpu().tolist()
        delayed = {
            (c, c % CLUSTER, t // 32, t % 32)
            for c in range(CTAS)
            for t in range(THREADS)
            if ns[c * THREADS + t] > DELAY_US * 500
        }
        said = compare(delayed, rule)
        bad += said.startswith("MISMATCH")
        print(
            f"scope {scope or '(none)'!r}: {len(selected(rule))} threads selected, "
            f"{len(delayed)} delayed: {said}  (max {max(ns) / 1000:.0f} us)"
        )
    perturb.write_table(table, P.table_bytes([], len(sess.positions)))
    y.zero_()
    compiled(yt)
    torch.cuda.synchronize()
    slow = sum(v > DELAY_US * 500 for v in y.cpu().tolist())
    print(f"zero table: {slow} thread(s) delayed (want 0)")
    return 1 if bad or slow else 0


if __name__ == "__main__":
    sys.exit(main())
