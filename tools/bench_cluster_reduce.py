"""Correctness and speed of kernels/cluster_reduce.py against torch's own row sum, in one loop.

    python tools/bench_cluster_reduce.py               # ~2 GiB inputs, rows of 64k/128k/256k
    python tools/bench_cluster_reduce.py --gib 4 --rounds 30
    python tools/bench_cluster_reduce.py --skip-sweep --rows 131072

1. Correctness sweep (small, ragged): op sum / rmsnorm x fp32 / bf16 x cluster 2 / 4 / 8, N with
   a ragged last slice and N with no 16-byte rows (scalar fallback), one cluster per row and
   persistent clusters (both barriers cycle through both phases). Output pre-filled with NaN,
   compared with ``reference`` at the kernel's TOLERANCE.
2. Speed: for each dtype and row length, x of ``--gib`` GiB (M = bytes / row bytes), every
   configuration is checked at that size (row sums against a float64 torch.sum; rmsnorm on a
   sample of rows) and then timed against its like-for-like torch baseline in the same loop:
   row sum vs ``torch.sum(x, dim=1, dtype=torch.float32)`` (fp32 accumulate, fp32 [M] out, as
   the kernel), rmsnorm vs ``F.rms_norm(x, (N,), w, eps)`` (torch's eager rms_norm).

Both sides of a pair move the same bytes, so ratio = baseline time / kernel time per round
(> 1: the kernel is faster); GB/s counts x once (+ 4 M output bytes) for the row sum, x read
and out written for rmsnorm (its second read of the slice is not counted). Timing
(tools/benchlib.py): A B A B in one loop, ``--reps`` launches per sample, ``--rounds`` rounds,
GPU clocks read around every sample. Exits 0 with "no GPU" when there is none, 1 when a check
fails.
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

KERNEL = ROOT / "kernels" / "cluster_reduce.py"


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
    out.append(
        {
            "m": 300,
            "n": 65536,
            "cluster": 4,
            "clusters": 7,
            "threads": 512,
            "unroll": 4,
            "dtype": "bf16",
        }
    )
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
        return False, (
            f"{int(bad.sum())} of {out.numel()} bad; first {i} got "
            f"{out[i].item()!r} want {ref[i].item()!r}"
        )
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
    ]


HEADLINE = {"cluster": 2, "clusters": 0, "threads": 256, "unroll": 8}


def cases(plan, gib: float, torch):
    """For each (op, dtype, N, config) of ``plan``: the kernel compiled, run once and checked
    at the benchmark size, as a Case against its torch baseline on the same tensors (raises
    CheckFailed on a mismatch)."""
    import torch.nn.functional as F

    cls = load_entry(KERNEL, "ClusterReduce")
    tensors, key = None, None
    for op, dtype, n, cfg in plan:
        elem = 4 if dtype == "fp32" else 2
        m = min(int(gib * 2**30) // (n * elem), (2**31 - 1) // n)  # 32-bit offsets
        if key != (dtype, n):
            tensors = None
            torch.cuda.empty_cache()
            tensors, key = big_inputs(m, n, dtype, torch), (dtype, n)
        x, w = tensors["x"], tensors["w"]
        k = cls(m=m, n=n, dtype=dtype, op=op, **cfg)
        if op == "sum":
            out = torch.full((m,), float("nan"), device="cuda")
            moved = x.nbytes + 4 * m
            base = Side(
                "torch.sum(x, dim=1)", lambda x=x: torch.sum(x, dim=1, dtype=torch.float32), moved
            )
        else:
            out = torch.full_like(x, float("nan"))
            moved = 2 * x.nbytes
            wx = w.to(x.dtype)
            base = Side(
                "F.rms_norm(x, (N,), w)",
                lambda x=x, wx=wx, eps=k.eps, n=n: F.rms_norm(x, (n,), wx, eps),
                moved,
            )
        tensors["out"] = out
        compiled = compile_kernel(k)
        cargs = k.cute_args(tensors)
        compiled(*cargs)
        torch.cuda.synchronize()
        label = (
            f"{'row sum' if op == 'sum' else op} {m}x{n} {dtype} C{cfg['cluster']} "
            f"G{k.groups} T{cfg['threads']} U{cfg['unroll']}"
        )
        problem = check_big(k, tensors, torch)
        if problem:
            raise CheckFailed(f"{label}: {problem}")
        del tensors["out"]  # the closure below keeps out alive while the kernel writes it
        yield Case(
            label,
            "GB/s",
            Side("kernel", lambda f=compiled, a=cargs, _out=out: f(*a), moved),
            [base],
            check="output matches the reference at this size",
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0, help="size of x in GiB (default 2)")
    timing_args(ap, reps=10)
    ap.add_argument(
        "--rows",
        type=int,
        nargs="*",
        default=[65536, 131072, 262144],
        help="row lengths N (elements)",
    )
    ap.add_argument("--skip-sweep", action="store_true", help="skip the correctness sweep")
    ap.add_argument("--json", help=JSON_HELP)
    args = ap.parse_args(argv)
    reason = no_gpu_reason()
    if reason:
        print(f"bench_cluster_reduce: no GPU ({reason}); nothing to do.")
        return 0
    import torch

    t_start = time.monotonic()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    clocks = GpuClocks(torch)
    print(f"device: {torch.cuda.get_device_name(0)}, {sms} SMs; clocks via {clocks.source}")
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

    plan = [
        (op, dtype, n, cfg)
        for dtype in ("fp32", "bf16")
        for n in args.rows
        for op, cfg in [("sum", c) for c in configs(sms)] + [("rmsnorm", HEADLINE)]
    ]
    rounds = max(args.rounds, 10)
    return run_table(
        cases(plan, args.gib, torch),
        torch,
        script="bench_cluster_reduce",
        rounds=rounds,
        reps=args.reps,
        warmup=3,
        clocks=clocks,
        legend=lambda _: (
            f"ratio = baseline time / kernel time per round (same "
            f"bytes), {rounds} rounds x {args.reps} launches, A B A B in one loop; G = clusters "
            f"launched; total {time.monotonic() - t_start:.0f} s"
        ),
        json_path=args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
