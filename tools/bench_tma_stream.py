"""Bandwidth of kernels/tma_stream.py against a torch device-to-device copy of the same bytes.

    python tools/bench_tma_stream.py                # 2 GiB inputs, default configurations
    python tools/bench_tma_stream.py --gib 4 --runs 50

Byte accounting: the kernel reads x and writes out (same shape and dtype) plus reads
scale and bias (8 bytes per row), so it moves 2 * x.nbytes + 8 * M bytes; the copy
``dst.copy_(x)`` moves 2 * x.nbytes (read + write). GB/s = bytes moved / median time, 1 GB =
1e9 bytes; ratio = kernel GB/s / copy GB/s (target >= 0.85).

Before timing: the quick ragged-shape sweep of tools/gpu_check_tma_stream.py, then each timed
configuration is checked against the reference on its own random (non-zero) input. Timing: CUDA
events around ``--reps`` back-to-back launches (so host call overhead is hidden), median of
``--runs`` samples after warm-up. Exits 0 with a message when there is no usable GPU, 1 when a
correctness check fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from benchlib import median_ms  # noqa: E402
from gpu_check_tma_stream import no_gpu_reason, run_case

from cutedebug.kernel_api import load_entry

KERNEL = ROOT / "kernels" / "tma_stream.py"
COLS = 16384
# (dtype, tile_m, tile_n, stages, consumer_warps)
CONFIGS = [
    ("fp32", 32, 256, 2, 4),
    ("fp32", 32, 256, 4, 4),
    ("fp32", 32, 256, 6, 4),
    ("fp32", 64, 128, 4, 4),
    ("fp32", 32, 256, 4, 8),
    ("bf16", 32, 256, 4, 4),
    ("bf16", 64, 256, 4, 4),
    ("bf16", 64, 256, 6, 4),
]


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
        part = {key: v[r0:r0 + chunk_rows] for key, v in tensors.items()}
        out, ref = part["out"].float(), k.reference(part).float()
        bad = ~torch.isclose(out, ref, atol=atol, rtol=rtol)
        if bad.any():
            r, c = (int(i) for i in bad.nonzero()[0])
            return (f"{int(bad.sum())} bad in rows {r0}..{r0 + len(out) - 1}; first "
                    f"[{r0 + r}, {c}] got {out[r, c].item()!r} want {ref[r, c].item()!r}")
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0, help="size of x in GiB (default 2)")
    ap.add_argument("--runs", type=int, default=30, help="timed samples (median; >= 20)")
    ap.add_argument("--reps", type=int, default=5, help="launches per timed sample")
    ap.add_argument("--skip-sweep", action="store_true", help="skip the ragged-shape sweep")
    args = ap.parse_args(argv)
    reason = no_gpu_reason()
    if reason:
        print(f"bench_tma_stream: nothing to benchmark: {reason}.")
        return 0
    import torch
    from cutlass import cute

    runs = max(args.runs, 20)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device: {torch.cuda.get_device_name(0)}, {sms} SMs")
    cls = load_entry(KERNEL, "TmaStream")

    if not args.skip_sweep:
        for params in ({"m": 1000, "n": 1000, "stages": 2, "ctas": 3},
                       {"m": 4097, "n": 2056, "stages": 4, "ctas": sms, "dtype": "bf16"},
                       {"m": 3000, "n": 7992, "stages": 6, "ctas": sms},
                       {"m": 31, "n": 8, "stages": 2, "ctas": sms, "dtype": "bf16"}):
            ok, detail = run_case(cls, params)
            print(f"ragged check {params}: {'PASS' if ok else 'FAIL'} {detail}", flush=True)
            if not ok:
                return 1

    header = (f"{'shape':>14} {'dtype':>5} {'tile':>7} {'S':>2} {'cw':>2} {'GB/s kernel':>11} "
              f"{'GB/s copy':>9} {'ratio':>6}")
    print(header, flush=True)
    inputs_for: dict[str, dict] = {}
    ratios: list[float] = []
    for dtype, tile_m, tile_n, stages, cw in CONFIGS:
        elem = 4 if dtype == "fp32" else 2
        m = int(args.gib * 2**30) // (COLS * elem)
        k = cls(m=m, n=COLS, dtype=dtype, tile_m=tile_m, tile_n=tile_n, stages=stages,
                consumer_warps=cw, ctas=sms)
        if dtype not in inputs_for:
            inputs_for.clear()
            torch.cuda.empty_cache()
            inputs_for[dtype] = gpu_inputs(k, torch)
        tensors = inputs_for[dtype]
        tensors["out"].fill_(float("nan"))
        compiled = cute.compile[cute.GPUArch("sm_90a")](k, *k.fake_args())
        cargs = k.cute_args(tensors)
        compiled(*cargs)
        torch.cuda.synchronize()
        problem = check_big(k, tensors, torch)
        if problem:
            print(f"MISMATCH {dtype} tile {tile_m}x{tile_n} stages {stages}: {problem}")
            return 1
        x, dst = tensors["x"], tensors["out"]
        t_kernel = median_ms(lambda f=compiled, a=cargs: f(*a), torch, runs, args.reps, warmup=3)
        t_copy = median_ms(lambda d=dst, s=x: d.copy_(s), torch, runs, args.reps, warmup=3)
        gbs_kernel = (2 * x.nbytes + 8 * m) / t_kernel / 1e6
        gbs_copy = 2 * x.nbytes / t_copy / 1e6
        ratios.append(gbs_kernel / gbs_copy)
        line = (f"{f'{m}x{COLS}':>14} {dtype:>5} {f'{tile_m}x{tile_n}':>7} {stages:>2} {cw:>2} "
                f"{gbs_kernel:>11.0f} {gbs_copy:>9.0f} {gbs_kernel / gbs_copy:>6.3f}")
        print(line, flush=True)
    best = max(ratios)
    print(f"median of {runs} samples x {args.reps} launches; ratio best {best:.3f}, lowest "
          f"{min(ratios):.3f} (target >= 0.85: {'met' if best >= 0.85 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
