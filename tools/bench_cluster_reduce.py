"""Correctness and bandwidth of kernels/cluster_reduce.py against a torch device-to-device copy.

    python tools/bench_cluster_reduce.py               # ~2 GiB inputs, rows of 64k/128k/256k
    python tools/bench_cluster_reduce.py --gib 4 --runs 30
    python tools/bench_cluster_reduce.py --skip-sweep --rows 131072

1. Correctness sweep (small, ragged): op sum / rmsnorm x fp32 / bf16 x cluster 2 / 4 / 8, N with
   a ragged last slice and N with no 16-byte rows (scalar fallback), one cluster per row and
   persistent clusters (both barriers cycle through both phases). Output pre-filled with NaN,
   compared with ``reference`` at the kernel's TOLERANCE.
2. Bandwidth: for each dtype and row length, x of ``--gib`` GiB (M = bytes / row bytes), every
   configuration is checked against torch (float64 row sums) and timed; then a torch copy
   ``dst.copy_(x)`` of the same tensor in the same run.

Byte accounting (1 GB = 1e9 bytes): row sum reads x once (its M * 4 output bytes are counted
too); rmsnorm reads x (+ w per CTA, not counted) and writes out, its second read of the slice
is not counted; the copy moves 2 * x.nbytes (read + write), as CUDA's bandwidthTest counts a
device-to-device copy. ratio = kernel GB/s / copy GB/s; target for row sum >= 0.80.
Timing: CUDA events around ``--reps`` back-to-back launches, median of ``--runs`` (>= 20)
samples after warm-up. Exits 0 with "no GPU" when there is none, 1 when a check fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import median_ms, no_gpu_reason  # noqa: E402

from cutedebug.kernel_api import load_entry

KERNEL = ROOT / "kernels" / "cluster_reduce.py"
TARGET = 0.80




def sweep_cases() -> list[dict]:
    out = []
    for op in ("sum", "rmsnorm"):
        for dtype in ("fp32", "bf16"):
            for cluster in (2, 4, 8):
                # 40968: 16-byte rows, last slice ragged; 12347: odd N, scalar loads
                out.append({"m": 37, "n": 40968, "clusters": 5})
                out.append({"m": 19, "n": 12347, "clusters": 0})
                for case in out[-2:]:
                    case.update(op=op, dtype=dtype, cluster=cluster)
    out.append({"m": 3, "n": 7, "cluster": 8, "op": "sum"})  # slices of 1 vector and empty ones
    out.append({"m": 300, "n": 65536, "cluster": 4, "clusters": 7, "threads": 512,
                "unroll": 4, "dtype": "bf16"})
    return out


def compile_kernel(k):
    from cutlass import cute

    return cute.compile[cute.GPUArch("sm_90a")](k, *k.fake_args())


def run_small(cls, params: dict, torch) -> tuple[bool, str]:
    k = cls(**params)
    tensors = k.make_inputs("cuda")
    compile_kernel(k)(*k.cute_args(tensors))
    torch.cuda.synchronize()
    out, ref = k.output(tensors).float(), k.reference(tensors).float()
    atol, rtol = k.TOLERANCE
    bad = ~torch.isclose(out, ref, atol=atol, rtol=rtol)
    if bad.any():
        i = tuple(int(v) for v in bad.nonzero()[0])
        return False, (f"{int(bad.sum())} of {out.numel()} bad; first {i} got "
                       f"{out[i].item()!r} want {ref[i].item()!r}")
    return True, f"max |err| {float((out - ref).abs().max()):.3g}"


def big_inputs(m: int, n: int, dtype: str, torch) -> dict:
    """Drawn on the GPU (a few GiB is slow on the CPU); a per-row offset as in make_inputs."""
    g = torch.Generator(device="cuda").manual_seed(0)
    tdtype = torch.float32 if dtype == "fp32" else torch.bfloat16
    x = torch.randn(m, n, generator=g, device="cuda", dtype=tdtype)
    x += torch.randn(m, 1, generator=g, device="cuda", dtype=tdtype)
    w = torch.rand(n, generator=g, device="cuda") + 0.5
    return {"x": x, "w": w}


def check_big(k, tensors, torch) -> str | None:
    out = tensors["out"]
    atol, rtol = k.TOLERANCE
    if k.op == "sum":
        ref = torch.sum(tensors["x"], dim=1, dtype=torch.float64).float()
    else:
        rows = slice(0, min(k.m, 64))  # a sample of rows: the float64 reference is large
        part = {"x": tensors["x"][rows], "w": tensors["w"]}
        ref, out = k.reference(part), out[rows]
    bad = ~torch.isclose(out.float(), ref.float(), atol=atol, rtol=rtol)
    if bad.any():
        i = tuple(int(v) for v in bad.nonzero()[0])
        return f"{int(bad.sum())} bad; first {i} got {out[i].item()!r} want {ref[i].item()!r}"
    return None


def configs(sms: int) -> list[dict]:
    """(cluster, clusters, threads, unroll) tried per shape; clusters 0 = one per row."""
    return [
        {"cluster": 2, "clusters": 0, "threads": 256, "unroll": 8},
        {"cluster": 4, "clusters": 0, "threads": 256, "unroll": 8},
        {"cluster": 2, "clusters": 0, "threads": 512, "unroll": 4},
        # persistent: 8 CTAs of 256 threads per SM (~31 registers per thread fits 8)
        {"cluster": 2, "clusters": 8 * sms // 2, "threads": 256, "unroll": 8},
        {"cluster": 4, "clusters": 8 * sms // 4, "threads": 256, "unroll": 8},
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0, help="size of x in GiB (default 2)")
    ap.add_argument("--runs", type=int, default=20, help="timed samples (median; >= 20)")
    ap.add_argument("--reps", type=int, default=3, help="launches per timed sample")
    ap.add_argument("--rows", type=int, nargs="*", default=[65536, 131072, 262144],
                    help="row lengths N (elements)")
    ap.add_argument("--skip-sweep", action="store_true", help="skip the correctness sweep")
    args = ap.parse_args(argv)
    reason = no_gpu_reason()
    if reason:
        print(f"bench_cluster_reduce: no GPU ({reason}); nothing to do.")
        return 0
    import torch

    t_start = time.monotonic()
    runs = max(args.runs, 20)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device: {torch.cuda.get_device_name(0)}, {sms} SMs")
    cls = load_entry(KERNEL, "ClusterReduce")

    if not args.skip_sweep:
        failed = 0
        for params in sweep_cases():
            ok, detail = run_small(cls, params, torch)
            failed += not ok
            print(f"check {params}: {'PASS' if ok else 'FAIL'} {detail}", flush=True)
        if failed:
            print(f"{failed} correctness case(s) failed")
            return 1
        print(f"correctness sweep passed ({time.monotonic() - t_start:.1f} s)")

    print(f"\n{'op':>7} {'dtype':>5} {'M x N':>14} {'C':>2} {'G':>5} {'T':>4} {'U':>2} "
          f"{'ms':>7} {'GB/s':>7} {'copy GB/s':>9} {'ratio':>6}", flush=True)
    best_sum: dict[tuple, float] = {}
    for dtype in ("fp32", "bf16"):
        elem = 4 if dtype == "fp32" else 2
        for n in args.rows:
            m = min(int(args.gib * 2**30) // (n * elem), (2**31 - 1) // n)  # 32-bit offsets
            torch.cuda.empty_cache()
            tensors = big_inputs(m, n, dtype, torch)
            x = tensors["x"]
            dst = torch.empty_like(x)
            t_copy = median_ms(lambda d=dst, s=x: d.copy_(s), torch, runs, args.reps, warmup=3)
            gbs_copy = 2 * x.nbytes / t_copy / 1e6
            del dst
            plan = [("sum", c) for c in configs(sms)] + [("rmsnorm", configs(sms)[0])]
            for op, cfg in plan:
                k = cls(m=m, n=n, dtype=dtype, op=op, **cfg)
                if op == "sum":
                    out = torch.full((m,), float("nan"), device="cuda")
                    moved = x.nbytes + 4 * m
                else:
                    out = torch.full_like(x, float("nan"))
                    moved = 2 * x.nbytes
                tensors["out"] = out
                compiled = compile_kernel(k)
                cargs = k.cute_args(tensors)
                compiled(*cargs)
                torch.cuda.synchronize()
                problem = check_big(k, tensors, torch)
                if problem:
                    print(f"MISMATCH {op} {dtype} {m}x{n} {cfg}: {problem}")
                    return 1
                t = median_ms(lambda f=compiled, a=cargs: f(*a), torch, runs, args.reps, warmup=3)
                gbs = moved / t / 1e6
                ratio = gbs / gbs_copy
                if op == "sum":
                    key = (dtype, n)
                    best_sum[key] = max(best_sum.get(key, 0.0), ratio)
                print(f"{op:>7} {dtype:>5} {f'{m}x{n}':>14} {cfg['cluster']:>2} "
                      f"{k.groups:>5} {cfg['threads']:>4} {cfg['unroll']:>2} {t:>7.3f} "
                      f"{gbs:>7.0f} {gbs_copy:>9.0f} {ratio:>6.3f}", flush=True)
                del tensors["out"], out
            del tensors, x
    print(f"\nrow sum, best ratio per shape (target >= {TARGET:.2f}):")
    for (dtype, n), r in best_sum.items():
        print(f"  {dtype} N={n}: {r:.3f} {'met' if r >= TARGET else 'MISSED'}")
    print(f"median of {runs} samples x {args.reps} launches; G = clusters launched; "
          f"total {time.monotonic() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
