"""Timing shared by the benchmark scripts: CUDA-event medians after warm-up."""

import statistics


def median_ms(fn, torch, runs: int, reps: int, warmup: int = 5) -> float:
    """Median over ``runs`` samples of the mean time of ``reps`` back-to-back calls of ``fn``,
    in milliseconds, timed with CUDA events after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / reps)
    return statistics.median(samples)
