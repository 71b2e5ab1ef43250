"""tools/benchlib.py: the A B A B loop, its per-round ratios and the clock readings (fake events)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import benchlib  # noqa: E402


class FakeTorch:
    """CUDA events over a log of calls: an event pair's elapsed time is the scripted duration
    of the sample it brackets; every launch and synchronize is logged in order."""

    def __init__(self, durations):
        self.durations, self.log = list(durations), []
        torch = self

        class Event:
            def __init__(self, enable_timing):
                assert enable_timing

            def record(self):
                torch.log.append("record")

            def synchronize(self):
                torch.log.append("event-sync")

            def elapsed_time(self, end):
                return torch.durations.pop(0)

        class Cuda:
            @staticmethod
            def synchronize():
                torch.log.append("sync")

        Cuda.Event = Event
        self.cuda = Cuda


class FakeClocks:
    """Counts its reads; the SM clock drops by 100 MHz per read (a power-capped GPU)."""

    def __init__(self):
        self.reads = 0

    def read(self):
        self.reads += 1
        return {
            "clocks.sm": 2000.0 - 100 * self.reads,
            "clocks.mem": 3201.0,
            "power.draw": 500.0 + self.reads,
            "temperature.gpu": 40.0,
        }


def make_case(torch, work_k=100.0, work_b=100.0):
    k = benchlib.Side("kernel", lambda: torch.log.append("A"), work_k)
    b = benchlib.Side("base", lambda: torch.log.append("B"), work_b)
    return benchlib.Case("case", "GB/s", k, [b])


def test_sides_alternate_in_one_loop_with_warmup_and_an_untimed_call_per_sample():
    # rounds of (kernel, baseline) samples: 2 ms/4 ms, 2/4, 1/4 (4 reps each: per call / 4)
    torch = FakeTorch([8.0, 16.0, 8.0, 16.0, 4.0, 16.0])
    case = benchlib.compare(
        make_case(torch), torch, rounds=3, reps=4, warmup=2, clocks=FakeClocks()
    )
    launches = "".join(x for x in torch.log if x in "AB")
    # warm-up per side, then per round: A (1 untimed + 4 timed), B (1 + 4)
    assert launches == "AA" + "BB" + ("A" * 5 + "B" * 5) * 3
    assert case.kernel.ms == [2.0, 2.0, 1.0]
    assert case.baselines[0].ms == [4.0, 4.0, 4.0]
    # each sample's untimed call is drained before its events start
    first_sample = torch.log.index("record")
    assert torch.log[first_sample - 2 : first_sample] == ["A", "sync"]


def test_ratio_is_taken_per_round_and_summarised_by_median_and_spread():
    torch = FakeTorch([8.0, 16.0, 8.0, 16.0, 4.0, 16.0])
    case = benchlib.compare(make_case(torch), torch, rounds=3, reps=4, warmup=0)
    ratios = case.ratios(case.baselines[0])
    assert ratios == [2.0, 2.0, 4.0]  # baseline time / kernel time for equal work
    assert benchlib.spread(ratios) == {"median": 2.0, "min": 2.0, "max": 4.0}
    assert case.kernel.rate("GB/s") == pytest.approx(100.0 / 2.0 / 1e6)


def test_ratio_accounts_for_different_work_per_call():
    # the kernel moves 8 more bytes per row than the copy: rates, not times, are compared
    torch = FakeTorch([10.0, 10.0])
    case = benchlib.compare(
        make_case(torch, work_k=108.0, work_b=100.0), torch, rounds=1, reps=1, warmup=0
    )
    assert case.ratios(case.baselines[0]) == [pytest.approx(1.08)]


def test_clocks_are_read_before_and_after_every_sample_and_reported_as_ranges():
    torch = FakeTorch([8.0, 16.0, 8.0, 16.0])
    clocks = FakeClocks()
    case = benchlib.compare(make_case(torch), torch, rounds=2, reps=4, warmup=1, clocks=clocks)
    assert clocks.reads == 2 * 2 * 2  # rounds x sides x (before, after)
    # kernel samples were read 1,2 and 5,6; the baseline's 3,4 and 7,8
    assert benchlib.clock_range(case.kernel, "clocks.sm") == (1400.0, 1900.0)
    assert benchlib.clock_range(case.baselines[0], "clocks.sm") == (1200.0, 1700.0)
    (row,) = benchlib.rows(case)
    assert row[4:] == ["2.000", "2.000-2.000", "1400-1900 / 1200-1700", "3201", "508", "40"]
    table = benchlib.format_table([row])
    assert table.splitlines()[0].startswith("| case")
    assert "1400-1900 / 1200-1700" in table


def test_run_cases_drops_each_case_s_closures_after_measuring():
    torch = FakeTorch([1.0, 2.0])
    printed = []
    table, measured = benchlib.run_cases(
        iter([make_case(torch)]),
        torch,
        rounds=1,
        reps=1,
        warmup=0,
        clocks=None,
        out=lambda *a, **k: printed.append(a[0]),
    )
    assert measured[0].kernel.fn is None and measured[0].baselines[0].fn is None
    assert table[0][4] == "2.000" and printed == [" | ".join(table[0])]
    assert benchlib.case_json(measured[0])["ratios"]["base"]["per_round"] == [2.0]


def test_run_table_prints_rows_table_and_legend_and_stops_at_a_failed_check(tmp_path):
    """The scripts' tail: each case's row as measured, the table with the legend of the measured
    cases under it, the samples to --json with the script's meta; a failed check ends it with
    MISMATCH and status 1 (the cases measured before it printed their rows)."""
    import json

    torch = FakeTorch([1.0, 2.0] * 2)
    clocks = FakeClocks()
    clocks.source = "fake"
    printed = []

    def cases(fail: bool):
        yield make_case(torch)
        if fail:
            raise benchlib.CheckFailed("case 2: 3 bad")
        yield make_case(torch)

    def run(fail: bool, json_path=None) -> int:
        return benchlib.run_table(
            cases(fail),
            torch,
            script="bench_x",
            rounds=1,
            reps=1,
            warmup=0,
            clocks=clocks,
            legend=lambda measured: f"{len(measured)} case(s)",
            json_path=json_path,
            meta={"device": "fake"},
            out=lambda *a, **k: printed.append(a[0]),
        )

    path = tmp_path / "b.json"
    assert run(False, str(path)) == 0
    rows = printed[:2]
    assert printed[2] == "\n" + benchlib.format_table([r.split(" | ") for r in rows]) + (
        "\n2 case(s)"
    )
    meta = json.loads(path.read_text())["meta"]
    assert meta == {"script": "bench_x", "rounds": 1, "reps": 1, "clocks": "fake", "device": "fake"}
    printed.clear()
    torch.durations = [1.0, 2.0]
    assert run(True) == 1
    assert len(printed) == 2 and printed[1] == "MISMATCH case 2: 3 bad"


def test_nvidia_smi_clock_line_is_parsed_and_unreadable_fields_are_none():
    # nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu
    #            --format=csv,noheader,nounits
    assert benchlib.parse_smi_clocks("1980, 3201, 412.35, 41\n") == {
        "clocks.sm": 1980.0,
        "clocks.mem": 3201.0,
        "power.draw": 412.35,
        "temperature.gpu": 41.0,
    }
    got = benchlib.parse_smi_clocks("1755, 3201, [N/A], 38\n")
    assert got["power.draw"] is None and got["clocks.sm"] == 1755.0
    assert benchlib.parse_smi_clocks("") == dict.fromkeys(benchlib.CLOCK_FIELDS)
