"""tools/benchlib.py: the CUDA-event median the benchmark scripts share (with fake events)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import benchlib  # noqa: E402


class FakeTorch:
    """Events whose elapsed time is a scripted sequence of sample durations (ms)."""

    def __init__(self, durations):
        self.durations, self.synced = list(durations), 0
        torch = self

        class Event:
            def __init__(self, enable_timing):
                assert enable_timing

            def record(self):
                pass

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return torch.durations.pop(0)

        class Cuda:
            @staticmethod
            def synchronize():
                torch.synced += 1

        Cuda.Event = Event
        self.cuda = Cuda


def test_median_of_per_call_means_after_warmup():
    calls = []
    torch = FakeTorch([40.0, 8.0, 12.0, 400.0, 10.0])   # one sample per run, 4 calls each
    ms = benchlib.median_ms(lambda: calls.append(1), torch, runs=5, reps=4, warmup=3)
    assert ms == 3.0                 # median of 10, 2, 3, 100, 2.5 ms per call
    assert len(calls) == 3 + 5 * 4   # warm-up calls are made but not timed
    assert torch.synced == 1         # the warm-up is drained before timing starts
