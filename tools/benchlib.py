"""Shared by the GPU scripts in tools/: can this machine run the kernels, and CUDA-event medians."""

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


def no_gpu_reason() -> str | None:
    """Why this machine cannot run the sm_90a kernels, or None when it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"the kernel targets sm_90a; this GPU is sm_{major}{minor}"
    return None
