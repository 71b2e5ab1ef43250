"""TFLOP/s of kernels/sm90_attention.py against torch scaled_dot_product_attention, same run.

    python tools/bench_sm90_attention.py            # correctness sweep, then timing (< 3 min)
    python tools/bench_sm90_attention.py --quick    # smoke check (~30 s)
    python tools/bench_sm90_attention.py --runs 50
    python tools/bench_sm90_attention.py --kernel old/sm90_attention.py   # A/B another version

Problem: O = softmax(Q K^T / sqrt(d)) V (+ lse), bf16, q / k / v / o as [batch, seqlen, heads, d];
the torch peer is ``F.scaled_dot_product_attention`` on [b, h, s, d] transposed views of the same
tensors (the flash backend, forced through ``torch.nn.attention.sdpa_kernel``; cuDNN is timed
too when it runs here, and the best backend is reported). TFLOP/s = 4 * b * h * s^2 * d / time
(half of it causal); ratio = kernel / SDPA flash (target >= 0.70 at b=4, h=16, s=4096, d=128).

Correctness first: ragged seqlens (not multiples of the 128 tile), d 64 / 128, causal and not,
O and lse against an fp32 reference (the kernel's own ``reference``), then every timed
configuration's O against an fp32 reference per batch. Timing: CUDA events around ``--reps``
back-to-back launches, median of ``--runs`` (>= 20) samples after warm-up. Exits 0 with "no GPU"
when there is no usable GPU, 1 when a correctness check fails.
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

KERNEL = ROOT / "kernels" / "sm90_attention.py"
RAGGED = [  # (batch, heads, seqlen, d, causal)
    (1, 2, 1000, 64, False),
    (1, 2, 1000, 64, True),
    (2, 3, 777, 128, True),
    (2, 3, 777, 128, False),
    (1, 1, 1, 64, False),       # one query, one key
    (1, 2, 129, 128, True),     # one full tile + one row
    (3, 2, 2048, 64, True),
]
TIMED = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True)]
TARGET = 0.70




def gpu_inputs(kern, seed: int, torch) -> dict:
    """make_inputs' distribution, drawn on the GPU (drawing on the CPU is slow at s=4096)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (kern.batch, kern.seqlen, kern.heads, kern.d)
    q = (torch.randn(shape, generator=g, device="cuda") * 2.0).to(torch.bfloat16)
    k = torch.randn(shape, generator=g, device="cuda").to(torch.bfloat16)
    v = torch.randn(shape, generator=g, device="cuda").to(torch.bfloat16)
    o = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((kern.batch, kern.heads, kern.seqlen), float("nan"), device="cuda")
    return {"q": q, "k": k, "v": v, "o": o, "lse": lse}


def compile_and_run(kern, tensors: dict, torch):
    """Compile for the real args, run once; (compiled, args, compile seconds)."""
    from cutlass import cute

    args = kern.cute_args(tensors)
    t0 = time.monotonic()
    compiled = cute.compile[cute.GPUArch("sm_90a")](kern, *args)
    secs = time.monotonic() - t0
    compiled(*args)
    torch.cuda.synchronize()
    return compiled, args, secs


def mismatch(out, ref, atol: float, rtol: float, torch) -> str | None:
    out = out.float().flatten()
    ref = ref.float().flatten()
    bad = ~torch.isclose(out, ref, atol=atol, rtol=rtol)  # NaN (never written) is bad too
    if not bad.any():
        return None
    i = int(bad.nonzero()[0])
    return (f"{int(bad.sum())} of {bad.numel()} bad; first flat index {i} got {out[i].item()!r} "
            f"want {ref[i].item()!r}; max |err| {(out - ref).abs().nan_to_num(1e30).max():.3g}")


def sdpa_views(tensors: dict):
    return tuple(tensors[n].transpose(1, 2) for n in ("q", "k", "v"))  # [b, h, s, d] views


def o_reference_per_batch(kern, tensors: dict, torch):
    """fp32 O [b, s, h, d], one batch element at a time (scores of 16 x 4096^2 fp32 = 1 GiB)."""
    parts = []
    for b in range(kern.batch):
        one = {n: tensors[n][b:b + 1] for n in ("q", "k", "v")}
        out, _ = kern.reference_parts(one)
        parts.append(out)
    return torch.cat(parts)


def time_sdpa(backend, q, k, v, causal: bool, torch, runs: int, reps: int) -> float | None:
    """Median ms of SDPA forced to one backend, or None when it does not run here."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    def call():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    try:
        call()
        torch.cuda.synchronize()
    except RuntimeError:
        return None
    return median_ms(call, torch, runs, reps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke check: 3 ragged cases, "
                    "fewer samples")
    ap.add_argument("--runs", type=int, default=20, help="timed samples (median; >= 20)")
    ap.add_argument("--reps", type=int, default=5, help="launches per timed sample")
    ap.add_argument("--kernel", type=Path, default=KERNEL, help="kernel file to measure (another "
                    "version of sm90_attention.py, for an A/B in the same session)")
    args = ap.parse_args(argv)
    reason = no_gpu_reason()
    if reason:
        print(f"bench_sm90_attention: no GPU ({reason}); nothing to benchmark.")
        return 0
    import torch
    from torch.nn.attention import SDPBackend

    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
          f"kernel {args.kernel}", flush=True)
    cls = load_entry(args.kernel, "Sm90Attention")
    atol, rtol = cls.TOLERANCE

    # -- correctness: ragged seqlens, d 64 / 128, causal and not (O and lse) ----------------
    for batch, heads, seqlen, d, causal in RAGGED[:3] if args.quick else RAGGED:
        kern = cls(batch=batch, heads=heads, seqlen=seqlen, head_dim=d, causal=causal)
        tensors = gpu_inputs(kern, 1, torch)
        _, _, secs = compile_and_run(kern, tensors, torch)
        problem = mismatch(kern.output(tensors), kern.reference(tensors), atol, rtol, torch)
        print(f"check b={batch} h={heads} s={seqlen} d={d} causal={causal}: "
              f"{'FAIL ' + problem if problem else 'PASS'} (compile {secs:.1f} s)", flush=True)
        if problem:
            return 1

    # -- timing vs SDPA --------------------------------------------------------------------
    runs, reps = max(args.runs, 20), (2 if args.quick else args.reps)
    print(f"{'b h s d':>14} {'causal':>6} {'TFLOP/s':>8} {'flash':>7} {'cudnn':>7} "
          f"{'ratio':>6} {'vs best':>7} {'target':>6}", flush=True)
    ok = True
    for batch, heads, seqlen, d, causal in TIMED:
        kern = cls(batch=batch, heads=heads, seqlen=seqlen, head_dim=d, causal=causal)
        tensors = gpu_inputs(kern, 0, torch)
        compiled, cargs, _ = compile_and_run(kern, tensors, torch)
        problem = mismatch(tensors["o"], o_reference_per_batch(kern, tensors, torch), atol,
                           rtol, torch)
        if problem:
            print(f"MISMATCH b={batch} h={heads} s={seqlen} d={d} causal={causal}: {problem}")
            return 1
        flops = 4 * batch * heads * seqlen * seqlen * d / (2 if causal else 1)
        t = median_ms(lambda f=compiled, x=cargs: f(*x), torch, runs, reps)
        q, k, v = sdpa_views(tensors)
        t_flash = time_sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal, torch, runs, reps)
        t_cudnn = time_sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal, torch, runs, reps)
        tf = flops / t / 1e9
        tf_flash = flops / t_flash / 1e9 if t_flash else float("nan")
        tf_cudnn = flops / t_cudnn / 1e9 if t_cudnn else float("nan")
        best_name, best = max((("flash", tf_flash), ("cudnn", tf_cudnn)),
                              key=lambda x: -1 if x[1] != x[1] else x[1])
        ratio = tf / tf_flash
        met = ratio >= TARGET
        ok &= met
        print(f"{f'{batch} {heads} {seqlen} {d}':>14} {str(causal):>6} {tf:>8.1f} "
              f"{tf_flash:>7.1f} {tf_cudnn:>7.1f} {ratio:>6.3f} {tf / best:>7.3f} "
              f"{TARGET:>6.2f} {'met' if met else 'MISSED'} (best SDPA backend: {best_name})",
              flush=True)
        del tensors
        torch.cuda.empty_cache()
    print(f"median of {runs} samples x {reps} launches; ratio = kernel / SDPA flash backend; "
          f"target {'met' if ok else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
