"""TFLOP/s of kernels/sm90_gemm.py against torch.matmul (cuBLAS), alternated in one loop.

    python tools/bench_sm90_gemm.py            # correctness sweep, then the timing table (< 3 min)
    python tools/bench_sm90_gemm.py --quick    # smoke check (~30 s): 2 ragged checks, 4096^3
    python tools/bench_sm90_gemm.py --rounds 40

Problem: C[M, N] = A[M, K] @ B[N, K]^T, bf16 in, fp32 accumulate, bf16 out; the torch peer is
``torch.matmul(a, b.T)`` on the same tensors (same layouts: A, B K-major, C row-major).
TFLOP/s = 2 * M * N * K / median time; ratio = kernel TFLOP/s / torch TFLOP/s.

Correctness first: ragged shapes (M, N, K not multiples of the tile, tile rows past M in a
cluster, one k-tile, many k-tiles) for cluster_m 1 and 2, each against an fp32 reference
(float32 matmul of the same bf16 inputs, TF32 off), then every timed configuration on its own
inputs at the benchmark size. Timing (tools/benchlib.py): kernel and torch.matmul alternated in
one loop (A B A B ...), ``--reps`` back-to-back launches per sample (host call overhead hidden
while the GPU is busy), ``--rounds`` rounds, GPU clocks read around every sample; the ratio is
taken per round, its median and min-max printed. Exits 0 with "no GPU" when there is no usable
GPU, 1 when a correctness check fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import (  # noqa: E402
    JSON_HELP,
    Case,
    CheckFailed,
    GpuClocks,
    Side,
    no_gpu_reason,
    run_table,
    timing_args,
)

from cutedebug.kernel_api import load_entry

KERNEL = ROOT / "kernels" / "sm90_gemm.py"
TIMED_SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (8192, 8192, 1024), (256, 8192, 8192)]
RAGGED = [  # (m, n, k, cluster_m, tile_n, ctas)
    (1000, 1000, 1000, 1, 256, 8),  # 4 tiles per CTA, 16 k-tiles each: the ring wraps
    (1000, 1000, 1000, 2, 256, 8),
    (4097, 264, 72, 2, 256, 0),  # odd tile rows: the last cluster's rank 1 is past M
    (300, 1000, 520, 2, 128, 0),
    (129, 8, 8, 1, 256, 0),  # one k-tile, N smaller than one TMA box
    (777, 2056, 4104, 2, 256, 5),
]
HEADLINE = [((4096, 4096, 4096), (1, 256)), ((8192, 8192, 8192), (1, 256))]


def persistent_ctas(cluster_m: int, sms: int) -> int:
    """CTAs of one full wave: max active clusters of this size times the cluster size."""
    try:
        from cutlass.utils import HardwareInfo

        return HardwareInfo().get_max_active_clusters(cluster_m) * cluster_m
    except Exception:  # an older driver or DSL: fall back to the SM count
        return sms // cluster_m * cluster_m


def gpu_inputs(m: int, n: int, k: int, seed: int, torch) -> dict:
    """Unit-variance outputs, drawn on the GPU (make_inputs draws on the CPU: slow at 8192^3)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    b = (torch.randn(n, k, generator=g, device="cuda") * k**-0.5).to(torch.bfloat16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    return {"a": a, "b": b, "c": c}


def fp32_reference(tensors: dict, torch):
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return tensors["a"].float() @ tensors["b"].float().T
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def mismatch(out, ref, atol: float, rtol: float, torch) -> str | None:
    """None when out (bf16) matches the fp32 reference, else a one-line description."""
    out = out.float()
    bad = ~torch.isclose(out, ref, atol=atol, rtol=rtol)  # NaN (never written) is bad too
    if not bad.any():
        return None
    r, c = (int(i) for i in bad.nonzero()[0])
    return (
        f"{int(bad.sum())} of {bad.numel()} bad; first [{r}, {c}] got {out[r, c].item()!r} "
        f"want {ref[r, c].item()!r}; max |err| {(out - ref).abs().nan_to_num(1e30).max():.3g}"
    )


def run_kernel(cls, params: dict, tensors: dict, torch):
    """Compile for the real args, run once, return (compiled, cute args, compile seconds)."""
    from cutlass import cute

    k = cls(**params)
    t0 = time.monotonic()
    compiled = cute.compile[cute.GPUArch("sm_90a")](k, *k.fake_args())
    secs = time.monotonic() - t0
    args = k.cute_args(tensors)
    tensors["c"].fill_(float("nan"))
    compiled(*args)
    torch.cuda.synchronize()
    return k, compiled, args, secs


def cases(plan, torch):
    """For each ((m, n, k), (cluster_m, tile_n)) of ``plan``: the kernel compiled, run once and
    checked against an fp32 reference at the benchmark size, as a Case against
    ``torch.matmul(a, b.T)`` on the same tensors (raises CheckFailed on a mismatch)."""
    cls = load_entry(KERNEL, "Sm90Gemm")
    atol, rtol = cls.TOLERANCE
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tensors, ref, shape_now = None, None, None
    for (m, n, k), (cluster_m, tile_n) in plan:
        if shape_now != (m, n, k):
            tensors = ref = None
            torch.cuda.empty_cache()
            tensors, shape_now = gpu_inputs(m, n, k, 0, torch), (m, n, k)
            ref = fp32_reference(tensors, torch)
        stages = 4 if tile_n == 256 else 6
        params = dict(
            m=m,
            n=n,
            k=k,
            cluster_m=cluster_m,
            tile_n=tile_n,
            stages=stages,
            ctas=persistent_ctas(cluster_m, sms),
        )
        _, compiled, cargs, _ = run_kernel(cls, params, tensors, torch)
        label = f"GEMM {m}x{n}x{k} bf16 cluster {cluster_m} 128x{tile_n} S{stages}"
        problem = mismatch(tensors["c"], ref, atol, rtol, torch)
        if problem:
            raise CheckFailed(f"{label}: {problem}")
        a, b = tensors["a"], tensors["b"]
        flops = 2 * m * n * k
        yield Case(
            label,
            "TFLOP/s",
            Side("kernel", lambda f=compiled, x=cargs: f(*x), flops),
            [
                Side(
                    "torch.matmul(a, b.T)",
                    lambda a=a, b=b, c=torch.empty_like(tensors["c"]): torch.matmul(a, b.T, out=c),
                    flops,
                )
            ],
            check="output matches the fp32 reference at this size",
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke check: 2 ragged shapes, 4096^3")
    timing_args(ap)
    ap.add_argument("--json", help=JSON_HELP)
    args = ap.parse_args(argv)
    reason = no_gpu_reason()
    if reason:
        print(f"bench_sm90_gemm: no GPU ({reason}); nothing to benchmark.")
        return 0
    import torch

    t_start = time.monotonic()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ctas = {c: persistent_ctas(c, sms) for c in (1, 2)}
    clocks = GpuClocks(torch)
    print(
        f"device: {torch.cuda.get_device_name(0)}, {sms} SMs; persistent CTAs: "
        f"cluster 1 -> {ctas[1]}, cluster 2 -> {ctas[2]}; clocks via {clocks.source}",
        flush=True,
    )
    cls = load_entry(KERNEL, "Sm90Gemm")
    atol, rtol = cls.TOLERANCE

    # -- correctness on ragged shapes ---------------------------------------------------------
    for m, n, k, cluster_m, tile_n, grid in RAGGED[::3] if args.quick else RAGGED:
        params = dict(
            m=m,
            n=n,
            k=k,
            cluster_m=cluster_m,
            tile_n=tile_n,
            stages=4 if tile_n == 256 else 6,
            ctas=grid or ctas[cluster_m],
        )
        tensors = gpu_inputs(m, n, k, 1, torch)
        _, _, _, secs = run_kernel(cls, params, tensors, torch)
        problem = mismatch(tensors["c"], fp32_reference(tensors, torch), atol, rtol, torch)
        print(
            f"ragged check {params}: {'FAIL ' + problem if problem else 'PASS'} "
            f"(compile {secs:.1f} s)",
            flush=True,
        )
        if problem:
            return 1

    # -- timing table --------------------------------------------------------------------------
    shapes = [(4096, 4096, 4096)] if args.quick else TIMED_SHAPES
    configs = [(1, 256), (2, 256)] if args.quick else [(1, 256), (2, 256), (2, 128)]
    rounds = max(args.rounds, 10)
    return run_table(
        cases([(s, c) for s in shapes for c in configs], torch),
        torch,
        script="bench_sm90_gemm",
        rounds=rounds,
        reps=args.reps,
        warmup=5,
        clocks=clocks,
        legend=lambda _: (
            f"ratio = kernel TFLOP/s / torch.matmul TFLOP/s per round, "
            f"{rounds} rounds x {args.reps} launches, A B A B in one loop; "
            f"total {time.monotonic() - t_start:.0f} s"
        ),
        json_path=args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
