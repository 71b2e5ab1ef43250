"""One table of every kernel against its like-for-like baseline, measured in one process.

    python tools/bench_table.py                       # ~2-3 min on an H200
    python tools/bench_table.py --rounds 30 --json bench.json

Rows (each case is compiled, run once and checked against its reference at the benchmark size
before it is timed; the scripts named give the full sweeps):
- tma_stream (bench_tma_stream.py): 2 GiB fp32 and bf16 vs ``out.copy_(x)``;
- row sum (bench_cluster_reduce.py): 2 GiB fp32 and bf16, N = 131072, vs
  ``torch.sum(x, dim=1, dtype=torch.float32)``;
- GEMM (bench_sm90_gemm.py): 4096^3 and 8192^3 bf16 vs ``torch.matmul(a, b.T, out=c)`` (cuBLAS);
- attention (bench_sm90_attention.py): b4 h16 s4096 d128, non-causal and causal, vs PyTorch's
  default SDPA and cuDNN SDPA forced by name.

Timing (tools/benchlib.py): within a case, kernel and baselines alternate in one loop
(A B A B ...), each sample ``--reps`` launches after one untimed call, ``--rounds`` rounds,
GPU clocks (SM, memory, power, temperature) read before and after every sample. The ratio is
kernel rate / baseline rate per round (> 1: the kernel is faster); the table gives its median
and min-max and the clock ranges each side saw.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import bench_cluster_reduce as crb  # noqa: E402
import bench_sm90_attention as attb  # noqa: E402
import bench_sm90_gemm as gemmb  # noqa: E402
import bench_tma_stream as tmab  # noqa: E402
from benchlib import JSON_HELP, GpuClocks, no_gpu_reason, run_table, timing_args  # noqa: E402


def all_cases(torch, gib: float, out=print):
    yield from tmab.cases(tmab.HEADLINE, gib, torch)
    yield from crb.cases([("sum", d, 131072, crb.HEADLINE) for d in ("fp32", "bf16")], gib, torch)
    yield from gemmb.cases(gemmb.HEADLINE, torch)
    yield from attb.cases(attb.TIMED, torch, backends=("default", "cudnn"), out=out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    timing_args(ap, rounds_help="A/B rounds per case (>= 10)")
    ap.add_argument("--gib", type=float, default=2.0, help="input size of the bandwidth cases")
    ap.add_argument("--json", help=JSON_HELP)
    args = ap.parse_args(argv)
    reason = no_gpu_reason()
    if reason:
        print(f"bench_table: nothing to benchmark: {reason}.")
        return 0
    import torch

    t0 = time.monotonic()
    clocks = GpuClocks(torch)
    torch.backends.cuda.matmul.allow_tf32 = False
    print(
        f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; clocks via "
        f"{clocks.source}; before: {clocks.read()}",
        flush=True,
    )
    rounds = max(args.rounds, 10)

    def legend(measured) -> str:  # a blank line, the ratio, each case's notes
        return (
            f"\nratio = kernel rate / baseline rate per round (> 1: kernel faster); {rounds} "
            f"rounds x {args.reps} launches per sample, sides alternated in one loop; every "
            f"output checked at the benchmark size; total {time.monotonic() - t0:.0f} s"
        ) + "".join(f"\n- {c.label}: {c.notes}" for c in measured if c.notes)

    return run_table(
        all_cases(torch, args.gib),
        torch,
        script="bench_table",
        rounds=rounds,
        reps=args.reps,
        warmup=5,
        clocks=clocks,
        legend=legend,
        json_path=args.json,
        meta={"device": torch.cuda.get_device_name(0), "torch": torch.__version__},
    )


if __name__ == "__main__":
    sys.exit(main())
