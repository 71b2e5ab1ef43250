"""Inputs for the reporting tests and tools/screenshot.py: a large hang's probe snapshot and a
wide triage matrix, built the way the worker and the triage build them."""

from __future__ import annotations

from cutedebug.commands import triage as T
from cutedebug.instrument.probes import Beacon, ProbeSnapshot, Site, StuckRecord, pack_beacon

FILE = "/src/kernels/tma_stream.py"
SITES = [
    Site(
        0,
        "pipeline",
        "producer_acquire",
        "empty",
        "PipelineTmaAsync",
        "",
        FILE,
        238,
        "load",
        "ring.producer_acquire(state)",
        4,
        4,
        None,
    ),
    Site(
        1,
        "pipeline",
        "consumer_wait",
        "full",
        "PipelineTmaAsync",
        "",
        FILE,
        269,
        "compute",
        "ring.consumer_wait(state)",
        4,
        1,
        33024,
    ),
]
CONSUMERS, PRODUCER = (0, 1, 2, 3), 4
RECORDS_HELD = 1024  # ProbeConfig.max_records


def _record(
    site: int, cta: int, warp: int, stage: int, phase: int, seq: int, n: int
) -> StuckRecord:
    return StuckRecord(
        site_id=site,
        block=(cta, 0, 0),
        block_linear=cta,
        warp=warp,
        stage=stage,
        phase=phase,
        seq=seq,
        waited_ns=500_000_000 + n,
        smid=cta % 132,
        lane=0,
        globaltimer=10**12 + n,
    )


def _beacon(site: int, cta: int, warp: int, stage: int, phase: int, seq: int) -> Beacon:
    word = pack_beacon(site, stage, phase, seq, cta)
    return Beacon(cta=cta, warp=warp, site_id=site, stage=stage, phase=phase, seq=seq, word=word)


def hang_1024_ctas() -> tuple[ProbeSnapshot, list[Site]]:
    """expect_tx too large on 1,024 CTAs: every consumer warp stuck on full[0] (item #1), each
    producer stuck on empty[0] after acquiring items 1-4. 5,120 stuck reports, of which the
    buffer held the first 1,024 (in the order warps timed out: CTA by CTA), so CTAs 205-1023
    show only their producers' beacons and the consumers as 'no record'."""
    reports = []
    for cta in range(1024):
        for w in CONSUMERS:
            reports.append((1, cta, w, 0, 0, 1))
        reports.append((0, cta, PRODUCER, 0, 0, 5))
    stuck = [_record(*r, n) for n, r in enumerate(reports[:RECORDS_HELD])]
    beacons = [_beacon(0, cta, PRODUCER, 3, 1, 4) for cta in range(1024)]
    snap = ProbeSnapshot(
        stuck=stuck,
        beacons=beacons,
        n_stuck_reported=len(reports),
        progress_counter_total=4 * 1024 + len(reports),
        header_magic=1,
    )
    return snap, SITES


def _call(mode: str, verdict: str, *, loc_ok=None, reason: str = "recorded") -> T.CallRecord:
    return T.CallRecord.from_json(
        {
            "mode": mode,
            "verdict": verdict,
            "reason": reason,
            "compiled": True,
            "fault_count": 1,
            "static_findings": [],
            "localization": {"ok": loc_ok},
            "verdicts": [verdict],
            "harness_errors": int(verdict == "HARNESS_ERROR"),
            "wall_s": 2.5,
            "compile_s": 1.0,
            "kernel_s": 0.5,
            "overhead_s": 1.0,
            "device": None,
            "report": f"runs/{mode}/report.md",
        }
    )


FAULTS = [
    None,
    "wrong_expect_tx",
    "missing_phase_flip",
    "skip_producer_tail",
    "skip_consumer_release",
    "extra_consumer_release",
    "wrong_arrive_count",
    "missing_init_fence",
]
OUTCOMES = [
    ("HANG", "HANG", True),
    ("HANG", "HANG", False),
    ("MISMATCH", "PASS", None),
    ("PASS", "PASS", None),
    ("CRASH", "HARNESS_ERROR", None),
    ("HANG", "CRASH", None),
]


def wide_record(kernel: str, fault: str | None, i: int) -> T.TriageRecord:
    expect, got, loc_ok = OUTCOMES[i % len(OUTCOMES)]
    if fault is None:
        expect, got, loc_ok = "PASS", "PASS", None
    sid = f"{kernel}/{fault or 'clean'}"
    rec = T.TriageRecord(
        id=sid,
        source=f"/s/{sid}.toml",
        kernel=f"{kernel}.py:{kernel.title().replace('_', '')}",
        fault=fault,
        fault_args={"delta_bytes": 16} if fault == "wrong_expect_tx" else {},
        params={},
        digest="d",
        repeat=1,
        expected=T.Expected(
            verdict=expect,
            also=[],
            localization={"op": "consumer_wait"} if expect == "HANG" else {},
        ),
        compile=_call("compile", "UNSUPPORTED"),
        run=_call("run", got, loc_ok=loc_ok, reason=f"{got} <{sid}>"),
        not_run=None,
        invalid=None,
        status="compiled",
    )
    T.finalize(rec, rec.run, None)
    return rec


def wide_matrix(kernels: int = 24) -> T.TriageMatrix:
    """A triage matrix of ``kernels`` kernel families × 8 faults (clean included)."""
    names = [f"kernel_family_{k:02d}" for k in range(kernels)]
    recs = [wide_record(k, f, i + j) for i, k in enumerate(names) for j, f in enumerate(FAULTS)]
    facts = T.Facts(
        harness_errors=sum(r.harness_errors for r in recs),
        processes_left=[],
        gpu_health={"healthy": True},
        total_s=321.0,
        interrupted=False,
        overhead_s={"n": len(recs), "mean": 1.0, "max": 1.0, "max_id": recs[0].id},
    )
    env = T.Environment(
        date="2026-12-01",
        host=None,
        gpu="NVIDIA H200",
        arch="sm_90a",
        driver="580",
        cutlass="4.8.1",
        torch="2.11",
        python="3.12",
        gpu_reason=None,
    )
    return T.build_matrix(
        recs, dir_="scenarios", command="cutedebug triage scenarios", env=env, facts=facts
    )
