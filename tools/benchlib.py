"""Shared by the benchmark scripts in tools/: a kernel timed against its baselines in ONE loop.

A speed claim is a ratio measured in one run. :func:`compare` alternates the sides of a
:class:`Case` (kernel, baseline 1, baseline 2, kernel, ... : A B A B ...), each sample being
CUDA events around ``reps`` back-to-back calls after one untimed call of that side (the switch
from the other side is not timed), with ``warmup`` untimed calls per side before the loop. The
GPU's SM and memory clocks, power draw and temperature are read right before and right after
every sample (the H200 is power-capped: its SM clock swings 1245-1980 MHz under load, and a
baseline timed after an idle gap or after another size sees other clocks). The ratio is taken
per round, between the kernel's sample and the baseline's sample of the same round; its median
and spread (min-max over the rounds) are what the scripts print.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

CLOCK_FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu")
UNITS = {"GB/s": 1e6, "TFLOP/s": 1e9}  # work per ms -> unit: bytes/ms / 1e6, flop/ms / 1e9


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


# ---- GPU clocks ------------------------------------------------------------------------------
class GpuClocks:
    """Reads clocks.sm / clocks.mem (MHz), power.draw (W) and temperature.gpu (C) of the GPU
    that torch's device 0 is: through NVML (pynvml, microseconds per read) when it is there,
    else ``nvidia-smi --query-gpu=...`` (tens of ms per read). ``read()`` returns a dict with
    those four keys (None where unreadable); ``source`` says which reader is used."""

    def __init__(self, torch=None):
        self.source, self._nvml, self._handle, self._index = "none", None, None, 0
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        if visible.isdigit():
            self._index = int(visible)
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = self._nvml_handle(pynvml, torch)
            self._nvml, self.source = pynvml, "nvml"
            return
        except Exception:  # noqa: BLE001  (no pynvml, no driver: try nvidia-smi)
            pass
        if shutil.which("nvidia-smi"):
            self.source = "nvidia-smi"

    def _nvml_handle(self, pynvml, torch):
        if torch is not None:
            try:
                uuid = str(torch.cuda.get_device_properties(0).uuid)
                for text in (uuid, "GPU-" + uuid):
                    try:
                        return pynvml.nvmlDeviceGetHandleByUUID(text)
                    except Exception:  # noqa: BLE001
                        continue
            except Exception:  # noqa: BLE001
                pass
        return pynvml.nvmlDeviceGetHandleByIndex(self._index)

    def read(self) -> dict[str, float | None]:
        if self.source == "nvml":
            n, h = self._nvml, self._handle
            out: dict[str, float | None] = {}
            for key, get in (
                ("clocks.sm", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
                ("clocks.mem", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
                ("power.draw", lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0),
                ("temperature.gpu", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            ):
                try:
                    out[key] = float(get())
                except Exception:  # noqa: BLE001
                    out[key] = None
            return out
        if self.source == "nvidia-smi":
            try:
                text = subprocess.run(
                    [
                        "nvidia-smi",
                        "-i",
                        str(self._index),
                        "--query-gpu=" + ",".join(CLOCK_FIELDS),
                        "--format=csv,noheader,nounits",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=10,
                    check=False,
                ).stdout
                return parse_smi_clocks(text)
            except (OSError, subprocess.TimeoutExpired):
                pass
        return dict.fromkeys(CLOCK_FIELDS)


def parse_smi_clocks(text: str) -> dict[str, float | None]:
    """One line of ``nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu
    --format=csv,noheader,nounits`` ("1980, 3201, 412.35, 41"); unreadable fields are None."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    parts = [p.strip() for p in line.split(",")]
    out: dict[str, float | None] = {}
    for i, key in enumerate(CLOCK_FIELDS):
        try:
            out[key] = float(parts[i])
        except (IndexError, ValueError):
            out[key] = None
    return out


class CheckFailed(Exception):
    """The kernel's output at the benchmark size did not match its reference."""


# ---- the ABAB loop ---------------------------------------------------------------------------
@dataclass
class Side:
    """One contender: ``fn()`` launches it once; ``work`` is what one call moves or computes
    (bytes for GB/s, flops for TFLOP/s)."""

    name: str
    fn: Callable[[], Any]
    work: float
    ms: list[float] = field(default_factory=list)
    clocks: list[tuple[dict, dict]] = field(default_factory=list)  # (before, after) per sample

    def rate(self, unit: str) -> float:
        return self.work / statistics.median(self.ms) / UNITS[unit]


@dataclass
class Case:
    """A kernel and its baselines, measured together. ``check`` is what the output check at
    the benchmark size said (None: not checked yet)."""

    label: str
    unit: str
    kernel: Side
    baselines: list[Side]
    check: str | None = None
    notes: str = ""

    @property
    def sides(self) -> list[Side]:
        return [self.kernel, *self.baselines]

    def ratios(self, baseline: Side) -> list[float]:
        """Per round: kernel rate / baseline rate (> 1: the kernel is faster)."""
        k = self.kernel
        return [(k.work / tk) / (baseline.work / tb) for tk, tb in zip(k.ms, baseline.ms)]


def compare(
    case: Case,
    torch,
    *,
    rounds: int = 20,
    reps: int = 5,
    warmup: int = 5,
    clocks: GpuClocks | None = None,
) -> Case:
    """Time every side of ``case`` in one loop, side after side in each round (A B A B ...),
    each sample after one untimed call of its own side; fills each side's ``ms`` (mean per
    call) and ``clocks`` (read before and after the sample). Returns the case."""
    for side in case.sides:
        side.ms, side.clocks = [], []
        for _ in range(warmup):
            side.fn()
        torch.cuda.synchronize()
    for _ in range(rounds):
        for side in case.sides:
            side.fn()
            torch.cuda.synchronize()
            before = clocks.read() if clocks else {}
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                side.fn()
            end.record()
            end.synchronize()
            after = clocks.read() if clocks else {}
            side.ms.append(start.elapsed_time(end) / reps)
            side.clocks.append((before, after))
    return case


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def clock_range(side: Side, key: str) -> tuple[float, float] | None:
    vals = [c[key] for pair in side.clocks for c in pair if c.get(key) is not None]
    return (min(vals), max(vals)) if vals else None


def _range_text(r: tuple[float, float] | None, fmt: str = "{:.0f}") -> str:
    if r is None:
        return "n.a."
    lo, hi = (fmt.format(x) for x in r)
    return lo if lo == hi else f"{lo}-{hi}"


TABLE_HEAD = (
    "case",
    "kernel",
    "baseline",
    "baseline rate",
    "ratio median",
    "ratio min-max",
    "SM MHz kernel / baseline",
    "mem MHz",
    "W max",
    "C max",
)


def rows(case: Case) -> list[list[str]]:
    """One table row per baseline of a measured case."""
    out = []
    k = case.kernel
    for b in case.baselines:
        r = spread(case.ratios(b))
        mem = clock_range(k, "clocks.mem"), clock_range(b, "clocks.mem")
        mem_all = None if None in mem else (min(mem[0][0], mem[1][0]), max(mem[0][1], mem[1][1]))
        watts = [x for s in (k, b) if (w := clock_range(s, "power.draw")) for x in w]
        temps = [x for s in (k, b) if (t := clock_range(s, "temperature.gpu")) for x in t]
        out.append(
            [
                case.label,
                f"{k.rate(case.unit):.1f} {case.unit}",
                b.name,
                f"{b.rate(case.unit):.1f}",
                f"{r['median']:.3f}",
                f"{r['min']:.3f}-{r['max']:.3f}",
                f"{_range_text(clock_range(k, 'clocks.sm'))} / "
                f"{_range_text(clock_range(b, 'clocks.sm'))}",
                _range_text(mem_all),
                f"{max(watts):.0f}" if watts else "n.a.",
                f"{max(temps):.0f}" if temps else "n.a.",
            ]
        )
    return out


def format_table(all_rows: list[list[str]], head: tuple[str, ...] = TABLE_HEAD) -> str:
    """A Markdown table (also readable as plain text)."""
    widths = [
        max(len(h), *(len(r[i]) for r in all_rows)) if all_rows else len(h)
        for i, h in enumerate(head)
    ]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in all_rows]
    return "\n".join(lines)


def case_json(case: Case) -> dict[str, Any]:
    """Every sample of a measured case, for the record (times in ms, clocks as read)."""
    return {
        "label": case.label,
        "unit": case.unit,
        "check": case.check,
        "notes": case.notes,
        "sides": [
            {
                "name": s.name,
                "work": s.work,
                "rate_median": s.rate(case.unit),
                "ms": s.ms,
                "clocks": s.clocks,
            }
            for s in case.sides
        ],
        "ratios": {
            b.name: {**spread(case.ratios(b)), "per_round": case.ratios(b)} for b in case.baselines
        },
    }


def write_json(path: str, cases: list[Case], meta: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "cases": [case_json(c) for c in cases]}, f, indent=1)


def run_cases(
    cases: Iterable[Case],
    torch,
    *,
    rounds: int,
    reps: int,
    warmup: int,
    clocks: GpuClocks | None,
    out=print,
) -> tuple[list[list[str]], list[Case]]:
    """Measure each (already checked) case and print its rows as they come; ``cases`` may be
    a generator that builds and checks each case just before it is measured."""
    table: list[list[str]] = []
    measured: list[Case] = []
    for case in cases:
        measured.append(case)
        compare(case, torch, rounds=rounds, reps=reps, warmup=warmup, clocks=clocks)
        for side in case.sides:
            side.fn = None  # drop the closures: their tensors are freed before the next case
        for row in rows(case):
            table.append(row)
            out(" | ".join(row), flush=True)
    return table, measured


# ---- the scripts' shared front and tail ----------------------------------------------------------
JSON_HELP = "write every sample and clock reading here"


def timing_args(
    ap: argparse.ArgumentParser, *, reps: int = 5, rounds_help: str = "A/B rounds (>= 10)"
) -> None:
    """``--rounds`` (20; at least 10 are run) and ``--reps`` (launches per timed sample)."""
    ap.add_argument("--rounds", type=int, default=20, help=rounds_help)
    ap.add_argument("--reps", type=int, default=reps, help="launches per timed sample")


def run_table(
    cases: Iterable[Case],
    torch,
    *,
    script: str,
    rounds: int,
    reps: int,
    warmup: int,
    clocks: GpuClocks,
    legend: Callable[[list[Case]], str],
    json_path: str | None,
    meta: dict[str, Any] | None = None,
    out=print,
) -> int:
    """A script's measurement: each case's rows as it is measured (``run_cases``), then the
    table with ``legend(measured cases)`` under it, every sample to ``json_path`` (--json) when
    given. The exit status: 0, or 1 after ``MISMATCH ...`` when a case's check failed."""
    try:
        table, measured = run_cases(
            cases, torch, rounds=rounds, reps=reps, warmup=warmup, clocks=clocks, out=out
        )
    except CheckFailed as e:
        out(f"MISMATCH {e}")
        return 1
    out(f"\n{format_table(table)}\n{legend(measured)}")
    if json_path:
        head = {"script": script, "rounds": rounds, "reps": reps, "clocks": clocks.source}
        write_json(json_path, measured, head | (meta or {}))
    return 0
