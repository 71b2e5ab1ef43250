"""Correctness sweep of kernels/tma_stream.py on an SM90 GPU: one PASS/FAIL line per case.

    python tools/gpu_check_tma_stream.py            # full sweep (~50 cases)
    python tools/gpu_check_tma_stream.py --quick    # a dozen cases

Each case compiles the kernel the way cutedebug does (``cute.compile`` on ``fake_args``), runs it
on ``cute_args`` of seeded random inputs (output pre-filled with NaN), and compares with
``reference`` at the kernel's TOLERANCE. Cases cover fp32/bf16, 2..8 stages, ragged M and N
(including M=1 and N smaller than a tile), 1 to #SM CTAs (so the ring wraps many times), 4 and
8 consumer warps and several tile shapes. The case line is printed before launch, so a hang
names its case; run under ``timeout`` if in doubt. Exits 0 when there is no usable GPU, 1 when
any case fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import no_gpu_reason  # noqa: E402

from cutedebug.kernel_api import load_entry

KERNEL = ROOT / "kernels" / "tma_stream.py"

RAGGED = [(1, 8), (31, 8), (1000, 1000), (1025, 264), (4097, 2056), (3000, 7992), (8192, 8192)]


def cases(sms: int, quick: bool) -> list[dict]:
    out = []
    for dtype in ("fp32", "bf16"):
        for stages in (2, 4):
            for m, n in RAGGED[:4] if quick else RAGGED:
                out.append({"m": m, "n": n, "dtype": dtype, "stages": stages, "ctas": sms})
    if quick:
        return out + [{"m": 1000, "n": 1000, "dtype": "fp32", "stages": 2, "ctas": 1}]
    extra = [
        {"m": 1000, "n": 1000, "stages": 2, "ctas": 1},  # one CTA: ~128 tiles through 2 slots
        {"m": 1000, "n": 1000, "stages": 3, "ctas": 3},
        {"m": 4097, "n": 2056, "stages": 5, "ctas": 7, "dtype": "bf16"},
        {"m": 4097, "n": 2056, "stages": 6, "tile_m": 16, "tile_n": 128},
        {"m": 4097, "n": 2056, "stages": 8, "tile_m": 16, "tile_n": 256},
        {"m": 4097, "n": 2056, "stages": 6, "tile_m": 64, "dtype": "bf16"},
        {"m": 3000, "n": 7992, "stages": 4, "tile_m": 128, "tile_n": 64, "dtype": "bf16"},
        {"m": 777, "n": 1000, "stages": 4, "consumer_warps": 8},
        {"m": 777, "n": 1000, "stages": 3, "consumer_warps": 8, "dtype": "bf16", "ctas": 5},
        {"m": 50, "n": 72, "stages": 2, "consumer_warps": 8, "tile_m": 16, "tile_n": 64, "ctas": 1},
        {"m": 20000, "n": 4096, "stages": 4, "ctas": sms, "seed": 1},
        {"m": 20000, "n": 4096, "stages": 4, "ctas": sms, "seed": 1, "dtype": "bf16"},
    ]
    return out + extra


def run_case(cls, params: dict) -> tuple[bool, str]:
    """Compile, launch once, compare. Returns (passed, one-line detail)."""
    import torch
    from cutlass import cute

    try:
        k = cls(**params)
    except ValueError as e:
        return True, f"SKIP invalid configuration: {e}"
    tensors = k.make_inputs("cuda")
    t0 = time.perf_counter()
    compiled = cute.compile[cute.GPUArch("sm_90a")](k, *k.fake_args())
    compile_s = time.perf_counter() - t0
    compiled(*k.cute_args(tensors))
    torch.cuda.synchronize()
    out, ref = k.output(tensors), k.reference(tensors)
    atol, rtol = k.TOLERANCE
    bad = ~torch.isclose(out.float(), ref.float(), atol=atol, rtol=rtol)
    nbad = int(bad.sum())
    info = f"tiles={k.num_tiles} grid={k.grid} tx={k.tx_bytes}B compile={compile_s:.2f}s"
    if nbad == 0:
        return True, info
    first = tuple(int(i) for i in bad.nonzero()[0])
    err = (out.float() - ref.float()).abs().nan_to_num(float("inf"))
    return False, (
        f"{info} bad={nbad}/{bad.numel()} first_bad={first} "
        f"got={out[first].item()!r} want={ref[first].item()!r} "
        f"max_err={err.max().item():.3g} nan={int(torch.isnan(out).sum())}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a dozen cases instead of ~50")
    args = ap.parse_args(argv)
    reason = no_gpu_reason()
    if reason:
        print(f"gpu_check_tma_stream: nothing to check: {reason}.")
        return 0
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device: {torch.cuda.get_device_name(0)}, {sms} SMs")
    cls = load_entry(KERNEL, "TmaStream")
    failed = 0
    all_cases = cases(sms, args.quick)
    for i, params in enumerate(all_cases):
        label = " ".join(f"{k}={v}" for k, v in params.items())
        print(f"[{i + 1:2d}/{len(all_cases)}] {label} ... ", end="", flush=True)
        try:
            ok, detail = run_case(cls, params)
        except Exception as e:  # noqa: BLE001 - a CUDA error poisons the context: stop
            print(f"FAIL {type(e).__name__}: {e}")
            return 1
        failed += not ok
        print(
            ("PASS " if ok and not detail.startswith("SKIP") else "" if ok else "FAIL ") + detail,
            flush=True,
        )
    print(f"{len(all_cases) - failed}/{len(all_cases)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
