"""TFLOP/s of kernels/sm90_attention.py against torch's SDPA backends, alternated in one loop.

    python tools/bench_sm90_attention.py            # correctness sweep, then timing (< 3 min)
    python tools/bench_sm90_attention.py --quick    # smoke check (~30 s)
    python tools/bench_sm90_attention.py --rounds 40
    python tools/bench_sm90_attention.py --kernel old/sm90_attention.py   # A/B another version

Problem: O = softmax(Q K^T / sqrt(d)) V (+ lse), bf16, q / k / v / o as [batch, seqlen, heads, d];
the torch peers are ``F.scaled_dot_product_attention`` on [b, h, s, d] transposed views of the
same tensors: PyTorch's default choice (no ``sdpa_kernel`` context: what a user gets; the CUDA
kernel it launched is named in the output), cuDNN forced by name
(``sdpa_kernel([SDPBackend.CUDNN_ATTENTION])``), and the flash backend (FlashAttention-2) forced
by name for comparison with earlier numbers. A backend that does not run here is left out
with the reason. TFLOP/s = 4 * b * h * s^2 * d / time (half of it causal); ratio = kernel
TFLOP/s / backend TFLOP/s per round.

Correctness first: ragged seqlens (not multiples of the 128 tile), d 64 / 128, causal and not,
O and lse against an fp32 reference (the kernel's own ``reference``), then every timed
configuration's O against an fp32 reference per batch at the benchmark size. Timing
(tools/benchlib.py): kernel, default SDPA, cuDNN, flash alternated in one loop (A B C D A B C D
...), ``--reps`` launches per sample, ``--rounds`` rounds, GPU clocks read around every sample;
median and min-max of the per-round ratio. Exits 0 with "no GPU" when there is no usable GPU, 1
when a correctness check fails.
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

KERNEL = ROOT / "kernels" / "sm90_attention.py"
RAGGED = [  # (batch, heads, seqlen, d, causal)
    (1, 2, 1000, 64, False),
    (1, 2, 1000, 64, True),
    (2, 3, 777, 128, True),
    (2, 3, 777, 128, False),
    (1, 1, 1, 64, False),  # one query, one key
    (1, 2, 129, 128, True),  # one full tile + one row
    (3, 2, 2048, 64, True),
]
TIMED = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True)]
BACKENDS = ("default", "cudnn", "flash")


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
    return (
        f"{int(bad.sum())} of {bad.numel()} bad; first flat index {i} got {out[i].item()!r} "
        f"want {ref[i].item()!r}; max |err| {(out - ref).abs().nan_to_num(1e30).max():.3g}"
    )


def sdpa_views(tensors: dict):
    return tuple(tensors[n].transpose(1, 2) for n in ("q", "k", "v"))  # [b, h, s, d] views


def o_reference_per_batch(kern, tensors: dict, torch):
    """fp32 O [b, s, h, d], one batch element at a time (scores of 16 x 4096^2 fp32 = 1 GiB)."""
    parts = []
    for b in range(kern.batch):
        one = {n: tensors[n][b : b + 1] for n in ("q", "k", "v")}
        out, _ = kern.reference_parts(one)
        parts.append(out)
    return torch.cat(parts)


def sdpa_side(backend: str, q, k, v, causal: bool, flops: float, torch) -> tuple[Side | None, str]:
    """SDPA as one side: "default" (PyTorch's own choice), "cudnn" or "flash" forced through
    sdpa_kernel. (None, why) when that backend does not run here."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if backend == "default":
        name = "SDPA default"

        def call():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        which = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
        name = {"cudnn": "SDPA cuDNN", "flash": "SDPA flash (FA2)"}[backend]

        def call():
            with sdpa_kernel([which]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    try:
        call()
        torch.cuda.synchronize()
    except RuntimeError as e:
        return None, f"{name} does not run here: {str(e).splitlines()[0][:200]}"
    return Side(name, call, flops), ""


def launched_kernel(fn, torch) -> str:
    """The name of the longest CUDA kernel one call of ``fn`` launches (torch.profiler)."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if str(e.device_type).endswith("CUDA")]
        best = max(kernels, key=lambda e: e.time_range.elapsed_us())
        return best.name[:120]
    except Exception as e:  # noqa: BLE001  (profiler unavailable: say so)
        return f"unknown ({type(e).__name__})"


def cases(plan, torch, kernel_file: Path = KERNEL, backends=BACKENDS, out=print):
    """For each (batch, heads, seqlen, d, causal) of ``plan``: the kernel compiled, run once and
    its O checked per batch against an fp32 reference at the benchmark size, as a Case against
    the SDPA backends on the same tensors (raises CheckFailed on a mismatch)."""
    cls = load_entry(kernel_file, "Sm90Attention")
    atol, rtol = cls.TOLERANCE
    for batch, heads, seqlen, d, causal in plan:
        kern = cls(batch=batch, heads=heads, seqlen=seqlen, head_dim=d, causal=causal)
        tensors = gpu_inputs(kern, 0, torch)
        compiled, cargs, _ = compile_and_run(kern, tensors, torch)
        label = f"attention b{batch} h{heads} s{seqlen} d{d} {'causal' if causal else 'non-causal'}"
        problem = mismatch(
            tensors["o"], o_reference_per_batch(kern, tensors, torch), atol, rtol, torch
        )
        if problem:
            raise CheckFailed(f"{label}: {problem}")
        flops = 4 * batch * heads * seqlen * seqlen * d / (2 if causal else 1)
        q, k, v = sdpa_views(tensors)
        sides, notes = [], []
        for backend in backends:
            side, why = sdpa_side(backend, q, k, v, causal, flops, torch)
            if side is None:
                notes.append(why)
                out(f"{label}: {why}")
                continue
            if backend == "default":
                kname = launched_kernel(side.fn, torch)
                notes.append(f"SDPA default launched {kname}")
                out(f"{label}: SDPA default launched {kname}", flush=True)
            sides.append(side)
        yield Case(
            label,
            "TFLOP/s",
            Side("kernel", lambda f=compiled, x=cargs: f(*x), flops),
            sides,
            check="O matches the fp32 reference at this size",
            notes="; ".join(notes),
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="smoke check: 3 ragged cases, fewer samples"
    )
    timing_args(ap)
    ap.add_argument(
        "--kernel",
        type=Path,
        default=KERNEL,
        help="kernel file to measure (another "
        "version of sm90_attention.py, for an A/B in the same session)",
    )
    ap.add_argument("--json", help=JSON_HELP)
    args = ap.parse_args(argv)
    reason = no_gpu_reason()
    if reason:
        print(f"bench_sm90_attention: no GPU ({reason}); nothing to benchmark.")
        return 0
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    clocks = GpuClocks(torch)
    print(
        f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
        f"kernel {args.kernel}; clocks via {clocks.source}",
        flush=True,
    )
    cls = load_entry(args.kernel, "Sm90Attention")
    atol, rtol = cls.TOLERANCE

    # -- correctness: ragged seqlens, d 64 / 128, causal and not (O and lse) ----------------
    for batch, heads, seqlen, d, causal in RAGGED[:3] if args.quick else RAGGED:
        kern = cls(batch=batch, heads=heads, seqlen=seqlen, head_dim=d, causal=causal)
        tensors = gpu_inputs(kern, 1, torch)
        _, _, secs = compile_and_run(kern, tensors, torch)
        problem = mismatch(kern.output(tensors), kern.reference(tensors), atol, rtol, torch)
        print(
            f"check b={batch} h={heads} s={seqlen} d={d} causal={causal}: "
            f"{'FAIL ' + problem if problem else 'PASS'} (compile {secs:.1f} s)",
            flush=True,
        )
        if problem:
            return 1

    # -- timing vs SDPA --------------------------------------------------------------------
    rounds, reps = max(args.rounds, 10), (2 if args.quick else args.reps)
    return run_table(
        cases(TIMED, torch, args.kernel),
        torch,
        script="bench_sm90_attention",
        rounds=rounds,
        reps=reps,
        warmup=3,
        clocks=clocks,
        legend=lambda _: (
            f"ratio = kernel TFLOP/s / backend TFLOP/s per round, "
            f"{rounds} rounds x {reps} launches, every side in one loop"
        ),
        json_path=args.json,
    )


if __name__ == "__main__":
    sys.exit(main())
