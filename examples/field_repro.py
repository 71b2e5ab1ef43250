"""Repro script over public CuTe DSL libraries, checked against torch: what a user would run.

    python examples/field_repro.py [--only rmsnorm|rmsnorm_bwd|gemm|attention]
    cutedebug exec -- python examples/field_repro.py      # the same, watched and instrumented

Calls only the libraries' public entry points (quack-kernels 0.6.5, flash-attn-4 4.0.0b36,
`pip install 'cutedebug[field]'`): ``quack.rmsnorm`` forward and backward (bf16, N = 32768,
which quack runs on a 2-CTA cluster forward and a 4-CTA cluster backward on Hopper),
``quack.gemm_interface.gemm`` (bf16, 2048^3), ``flash_attn.cute.flash_attn_func`` (bf16,
batch 2, 8 heads, seqlen 1024, head dim 128). Each result is compared with the same math in
fp32 torch; one line per check, exit status 1 if any is off, 0 if all match.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch


def check(name: str, out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> bool:
    out, ref = out.float(), ref.float()
    bad = ~torch.isclose(out, ref, atol=atol, rtol=rtol)
    n_bad = int(bad.sum())
    err = float((out - ref).abs().nan_to_num(float("inf")).max())
    print(
        f"{name:12s} {'ok' if n_bad == 0 else 'MISMATCH'}  max |err| {err:.3g}  "
        f"{n_bad}/{ref.numel()} off (atol {atol}, rtol {rtol})",
        flush=True,
    )
    return n_bad == 0


def rmsnorm(gen: torch.Generator, backward: bool) -> bool:
    from quack import rmsnorm as quack_rmsnorm

    rows, n, eps = 2048, 32768, 1e-6
    x = torch.randn(rows, n, generator=gen, device="cuda").to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(n, generator=gen, device="cuda")).to(torch.bfloat16)
    x.requires_grad_(backward)
    w.requires_grad_(backward)
    y = quack_rmsnorm(x, w, eps=eps)
    xf, wf = (
        x.detach().float().requires_grad_(backward),
        w.detach().float().requires_grad_(backward),
    )
    ref = torch.nn.functional.rms_norm(xf, (n,), wf, eps=eps)
    if not backward:
        return check("rmsnorm", y, ref, 2e-2, 1e-2)
    dy = torch.randn(rows, n, generator=gen, device="cuda").to(torch.bfloat16)
    y.backward(dy)
    ref.backward(dy.float())
    ok_dx = check("rmsnorm dx", x.grad, xf.grad, 5e-2, 2e-2)
    ok_dw = check("rmsnorm dw", w.grad / rows, wf.grad / rows, 5e-2, 2e-2)
    return ok_dx and ok_dw


def gemm(gen: torch.Generator) -> bool:
    from quack.gemm_interface import gemm as quack_gemm

    m = n = k = 2048
    a = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
    b = torch.randn(k, n, generator=gen, device="cuda").to(torch.bfloat16)
    d = quack_gemm(a, b, tuned=False)
    # entries ~ N(0, k): std 45, bf16 output rounding up to ~0.25
    return check("gemm", d, a.float() @ b.float(), 1.0, 2e-2)


def attention(gen: torch.Generator) -> bool:
    from flash_attn.cute import flash_attn_func

    b, s, h, d = 2, 1024, 8, 128
    q, k, v = (
        torch.randn(b, s, h, d, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3)
    )
    out = flash_attn_func(q, k, v, causal=False)
    out = out[0] if isinstance(out, tuple) else out
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    ref = ((qf @ kf.transpose(-1, -2)) / math.sqrt(d)).softmax(-1) @ vf
    return check("attention", out, ref.transpose(1, 2), 2e-2, 2e-2)


CHECKS = {
    "rmsnorm": lambda g: rmsnorm(g, False),
    "rmsnorm_bwd": lambda g: rmsnorm(g, True),
    "gemm": gemm,
    "attention": attention,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only", choices=sorted(CHECKS), action="append", help="run only these checks (repeatable)"
    )
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU visible to torch: nothing to check", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = [CHECKS[name](gen) for name in (args.only or CHECKS)]
    torch.cuda.synchronize()
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
