"""Bandwidth of kernels/tma_stream.py against a torch device-to-device copy, in one loop.

    python tools/bench_tma_stream.py                # ragged sweep, then 2 GiB inputs
    python tools/bench_tma_stream.py --skip-sweep --gib 4 --rounds 40

Byte accounting: the kernel reads x and writes out (same shape and dtype) plus reads scale and
bias (8 bytes per row), so it moves 2 * x.nbytes + 8 * M bytes; the copy ``out.copy_(x)`` moves
2 * x.nbytes (read + write). GB/s = bytes moved / median time, 1 GB = 1e9 bytes.

Before timing: the quick ragged-shape sweep of tools/gpu_check_tma_stream.py, then each timed
configuration is checked against the reference on its own random input at the benchmark size.
Timing (tools/benchlib.py): kernel and copy alternated in one loop (A B A B ...), ``--reps``
launches per sample, ``--rounds`` rounds, GPU clocks read around every sample; the ratio is
kernel GB/s / copy GB/s per round, its median and min-max printed. Exits 0 with a message when
there is no usable GPU, 1 when a correctness check fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

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
from gpu_check_tma_stream import run_case

from cutedebug.kernel_api import load_entry

KERNEL = ROOT / "kernels" / "tma_stream.py"
COLS = 16384
# (dtype, tile_m, tile_n, stages, consumer_warps)
CONFIGS = [
    ("fp32", 32, 256, 2, 4),
    ("fp32", 32, 256, 4, 4),
    ("fp32", 64, 128, 4, 4),
    ("fp32", 32, 256, 4, 8),
    ("bf16", 32, 256, 4, 4),
    ("bf16", 64, 256, 6, 4),
]
HEADLINE = [("fp32", 32, 256, 4, 4), ("bf16", 64, 256, 6, 4)]


def gpu_inputs(k, torch) -> dict:
    """make_inputs' tensors, drawn on the GPU (a few GiB is slow to draw on the CPU)."""
    g = torch.Generator(device="cuda").manual_seed(k.seed)
    tdtype = torch.float32 if k.dtype_name == "fp32" else torch.bfloat16
    x = torch.randn(k.m, k.n, generator=g, device="cuda", dtype=tdtype)
    scale = torch.rand(k.m, generator=g, device="cuda") + 0.5
    bias = torch.randn(k.m, generator=g, device="cuda")
    out = torch.full_like(x, float("nan"))
    return {"x": x, "scale": scale, "bias": bias, "out": out}


def check_big(k, tensors, torch, chunk_rows: int = 4096) -> str | None:
    """None when out matches the reference everywhere, else a one-line description."""
    atol, rtol = k.TOLERANCE
    for r0 in range(0, k.m, chunk_rows):
        part = {key: v[r0 : r0 + chunk_rows] for key, v in tensors.items()}
        out, ref = part["out"].float(), k.reference(part).float()
        bad = ~torch.isclose(out, ref, atol=atol, rtol=rtol)
        if bad.any():
            r, c = (int(i) for i in bad.nonzero()[0])
            return (
                f"{int(bad.sum())} bad in rows {r0}..{r0 + len(out) - 1}; first "
                f"[{r0 + r}, {c}] got {out[r, c].item()!r} want {ref[r, c].item()!r}"
            )
    return None


def cases(configs, gib: float, torch):
    """Each configuration built, compiled, run once and checked at the benchmark size, as a
    Case (kernel vs ``out.copy_(x)`` on the same tensors); raises CheckFailed on a mismatch."""
    from cutlass import cute

    cls = load_entry(KERNEL, "TmaStream")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tensors, tensors_dtype = None, None
    for dtype, tile_m, tile_n, stages, cw in configs:
        elem = 4 if dtype == "fp32" else 2
        m = int(gib * 2**30) // (COLS * elem)
        k = cls(
            m=m,
            n=COLS,
            dtype=dtype,
            tile_m=tile_m,
            tile_n=tile_n,
            stages=stages,
            consumer_warps=cw,
            ctas=sms,
        )
        if tensors_dtype != dtype:
            tensors = None
            torch.cuda.empty_cache()
            tensors, tensors_dtype = gpu_inputs(k, torch), dtype
        tensors["out"].fill_(float("nan"))
        compiled = cute.compile[cute.GPUArch("sm_90a")](k, *k.fake_args())
        cargs = k.cute_args(tensors)
        compiled(*cargs)
        torch.cuda.synchronize()
        problem = check_big(k, tensors, torch)
        label = f"tma_stream {m}x{COLS} {dtype} {tile_m}x{tile_n} S{stages} cw{cw}"
        if problem:
            raise CheckFailed(f"{label}: {problem}")
        x, dst = tensors["x"], tensors["out"]
        yield Case(
            label,
            "GB/s",
            Side("kernel", lambda f=compiled, a=cargs: f(*a), 2 * x.nbytes + 8 * m),
            [Side("out.copy_(x)", lambda d=dst, s=x: d.copy_(s), 2 * x.nbytes)],
            check="output matches the reference at this size",
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0, help="size of x in GiB (default 2)")
    timing_args(ap)
    ap.add_argument("--skip-sweep", action="store_true", help="skip the ragged-shape sweep")
    ap.add_argument("--json", help=JSON_HELP)
    args = ap.parse_args(argv)
    reason = no_gpu_reason()
    if reason:
        print(f"bench_tma_stream: nothing to benchmark: {reason}.")
        return 0
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    clocks = GpuClocks(torch)
    print(f"device: {torch.cuda.get_device_name(0)}, {sms} SMs; clocks via {clocks.source}")
    if not args.skip_sweep:
        cls = load_entry(KERNEL, "TmaStream")
        for params in (
            {"m": 1000, "n": 1000, "stages": 2, "ctas": 3},
            {"m": 4097, "n": 2056, "stages": 4, "ctas": sms, "dtype": "bf16"},
            {"m": 3000, "n": 7992, "stages": 6, "ctas": sms},
            {"m": 31, "n": 8, "stages": 2, "ctas": sms, "dtype": "bf16"},
        ):
            ok, detail = run_case(cls, params)
            print(f"ragged check {params}: {'PASS' if ok else 'FAIL'} {detail}", flush=True)
            if not ok:
                return 1
    rounds = max(args.rounds, 10)
    return run_table(
        cases(CONFIGS, args.gib, torch),
        torch,
        script="bench_tma_stream",
        rounds=rounds,
        reps=args.reps,
        warmup=3,
        clocks=clocks,
        legend=lambda _: (
            f"ratio = kernel GB/s / copy GB/s per round, {rounds} rounds "
            f"x {args.reps} launches, A B A B in one loop"
        ),
        json_path=args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
