"""racecheck hazards a cutlass.pipeline orders (analyses/sanitizer/ordering.py), on quack's SM90
GEMM as the H200 saw it: racecheck said RACE, WAR at tile_scheduler.py:683 (the consumers' read
of the scheduler's shared record) / tile_scheduler.py:940 (the scheduler warp's write of the
next one), ×1000 (reports/2026-12-01-h200-s4/call4/field_sanitize/log.txt; the referee's 32
perturbed runs all matched, reports/2026-12-02-h200-s2/call4/referee). The read lies between
the scheduler pipeline's consumer_wait (679) and consumer_release (689), the write between its
producer_acquire (923) and producer_commit (941): the pipeline's mbarriers order them.

The op lines come from a compile of the field scenario for sm_90a here (the recorder's protocol
sites: the kernel's call site and the tile scheduler's own line, ``via``); the hazard is the
H200's, re-stated as the Finding the parser makes of it.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from cutedebug.analyses.sanitizer.findings import Finding, Site, source_line
from cutedebug.analyses.sanitizer.ordering import op_lines, order_checker, pipeline_order
from cutedebug.analyses.sanitizer.triage import NOISE_PIPELINE_ORDERED, filter_noise

REPO = Path(__file__).resolve().parents[1]
RAW = partial(source_line, strip=False)


@pytest.fixture(scope="module")
def quack_gemm(tmp_path_factory):
    """(the quack package folder, the protocol sites of the field GEMM's compile)."""
    from cutedebug.engine import runner
    from cutedebug.engine import scenario as S
    from cutedebug.event_kinds import ProtocolSites

    sc = S.load(REPO / "scenarios" / "field" / "quack_gemm_sm90" / "clean.toml")
    if sc.missing_modules():
        pytest.skip(f"field libraries not installed: {sc.missing_modules()}")
    import quack

    out = tmp_path_factory.mktemp("qg")
    _, outcome, _ = runner.run_once(sc, out, mode="compile", lineinfo=True)
    sites = outcome.last(ProtocolSites)
    assert sites is not None, (out / "worker.log").read_text()[-3000:]
    return Path(quack.__file__).parent, sites.sites


def hazard(kind, a, b, space="shared"):
    (fa, la, xa), (fb, lb, xb) = a, b
    return Finding(
        tool="racecheck",
        kind=kind,
        severity="error",
        kernel="kernel_cutlass_kernel_quackgemm_sm90GemmSm90_0",
        file=fa,
        line=la,
        address_space=space,
        count=1000,
        sites=(Site(fa, la, access=xa), Site(fb, lb, access=xb)),
    )


@pytest.mark.slow
def test_the_h200_hazard_on_quack_gemm_is_ordered_by_its_scheduler_pipeline(quack_gemm):
    root, sites = quack_gemm
    sched = str(root / "tile_scheduler.py")
    ops = op_lines(sites)
    # the scheduler pipeline's ops at the tile scheduler's own lines, as the recorder kept them
    scheduler = {(o.op, o.file, o.line) for o in ops if o.pipeline.startswith("PipelineAsync#1")}
    assert {
        ("consumer_wait", "tile_scheduler.py", 679),
        ("consumer_release", "tile_scheduler.py", 689),
        ("producer_acquire", "tile_scheduler.py", 923),
        ("producer_commit", "tile_scheduler.py", 941),
    } <= scheduler
    h200 = hazard("WAR_HAZARD", (sched, 683, "Read"), (sched, 940, "Write"))
    why = pipeline_order(h200, ops, RAW)
    assert why is not None and why.startswith("PipelineAsync#1@gemm_sm90.py:1960: ")
    assert "read at tile_scheduler.py:683 before consumer_release" in why
    assert "write at tile_scheduler.py:940 after producer_acquire" in why
    # the scheduler's release is quack's elected lane after a warp sync: it covers the lanes
    (rel,) = {
        (o.covers, o.line)
        for o in ops
        if o.op == "consumer_release" and o.file == "tile_scheduler.py"
    }
    assert rel == (True, 689)
    kept, filtered = filter_noise([h200] * 3, ordered=order_checker(sites, RAW))
    assert kept == [] and len(filtered) == 3
    assert filtered[0].noise_reason == f"{NOISE_PIPELINE_ORDERED}: {why}"


@pytest.mark.slow
def test_what_the_pipeline_does_not_order_stays_a_finding(quack_gemm):
    root, sites = quack_gemm
    sched, base = str(root / "tile_scheduler.py"), str(root / "gemm_base.py")
    check = order_checker(sites, RAW)
    # the read after the consumer released the stage (the state's advance, line 690)
    late = hazard("WAR_HAZARD", (sched, 690, "Read"), (sched, 940, "Write"))
    # a global-memory hazard: the rule speaks of shared memory only
    gmem = hazard("WAR_HAZARD", (sched, 683, "Read"), (sched, 940, "Write"), space="global")
    # threads writing a TMA pipeline's stage: its commit is a no-op (the bytes complete it)
    tma = hazard("RAW_HAZARD", (base, 1031, "Write"), (sched, 683, "Read"))
    for f in (late, gmem, tma):
        assert check(f) is None, f
    kept, filtered = filter_noise([late, gmem], ordered=check)
    assert kept == [late, gmem] and filtered == []


CUTLASS_OWN = {"arrives": 1, "owner": "cutlass.pipeline.sm90", "method": "PipelineAsync.x"}


def _sites(path, pipe, lines, **extra):
    return [
        {"op": op, "pipeline": pipe, "file": str(path), "line": n, **CUTLASS_OWN, **extra}
        for op, n in lines
    ]


def test_no_pipeline_ops_no_check_and_raw_mbarrier_kernels_are_not_credited(tmp_path):
    """A kernel without cutlass.pipeline ops (raw mbarriers: tools/sanitizer_samples'
    hand-off) gets no ordering check: its RACE stays for the caveat and the referee."""
    assert order_checker([], RAW) is None
    raw = [{"op": "mbarrier_wait", "pipeline": None, "file": "k.py", "line": 3}]
    assert order_checker(raw, RAW) is None


def test_the_rule_on_small_kernels(tmp_path):
    k = tmp_path / "k.py"
    k.write_text(
        "def kernel(p):\n"
        "    p.consumer_wait(s)\n"
        "    x = buf[s]\n"
        "    p.consumer_release(s)\n"
        "    p.producer_acquire(s)\n"
        "    buf[s] = y\n"
        "    p.producer_commit(s)\n"
        "\n"
        "def other(p):\n"
        "    buf[s] = y\n"
    )
    lines = (("consumer_wait", 2), ("consumer_release", 4), ("producer_acquire", 5))
    sites = _sites(k, "PipelineAsync#0@k.py:1", lines + (("producer_commit", 7),))
    check = order_checker(sites, RAW)
    war = hazard("WAR_HAZARD", (str(k), 3, "Read"), (str(k), 6, "Write"))
    assert check(war) == (
        "PipelineAsync#0@k.py:1: read at k.py:3 before consumer_release, "
        "write at k.py:6 after producer_acquire"
    )
    # the same write in another function: the acquire is not that function's
    assert check(hazard("WAR_HAZARD", (str(k), 3, "Read"), (str(k), 10, "Write"))) is None
    # a read after the release
    assert check(hazard("WAR_HAZARD", (str(k), 5, "Read"), (str(k), 6, "Write"))) is None
    # a library's class whose release may be one elected lane's: credited only when the
    # release syncs the warp before its arrive
    lib = [dict(s, owner="somelib.pipeline") for s in sites]
    assert order_checker(lib, RAW)(war) is None
    assert order_checker([dict(s, syncs_before=["sync_warp"]) for s in lib], RAW)(war)
    # a TMA pipeline's release (one elected lane, no sync, not cutlass's PipelineAsync)
    tma = [
        dict(s, pipeline="PipelineTmaAsync#0@k.py:1", method="PipelineTmaAsync.x") for s in sites
    ]
    assert order_checker(tma, RAW)(war) is None

    # a release only lane 0 makes does not order the other lanes' reads
    k2 = tmp_path / "k2.py"
    k2.write_text(
        "def kernel(p, lane):\n"
        "    p.consumer_wait(s)\n"
        "    x = buf[s]\n"
        "    if lane == 0:\n"
        "        p.consumer_release(s)\n"
        "    p.producer_acquire(s)\n"
        "    buf[s] = y\n"
    )
    lane0 = _sites(
        k2,
        "PipelineAsync#0@k2.py:1",
        (("consumer_wait", 2), ("consumer_release", 5), ("producer_acquire", 6)),
    )
    assert (
        order_checker(lane0, RAW)(hazard("WAR_HAZARD", (str(k2), 3, "Read"), (str(k2), 7, "Write")))
        is None
    )

    # RAW: the write before a covering commit, the read after the wait
    k3 = tmp_path / "k3.py"
    k3.write_text(
        "def kernel(p):\n"
        "    p.producer_acquire(s)\n"
        "    buf[s] = y\n"
        "    p.producer_commit(s)\n"
        "    p.consumer_wait(s)\n"
        "    x = buf[s]\n"
        "    p.consumer_release(s)\n"
    )
    raw_sites = _sites(
        k3,
        "PipelineAsync#0@k3.py:1",
        (
            ("producer_acquire", 2),
            ("producer_commit", 4),
            ("consumer_wait", 5),
            ("consumer_release", 7),
        ),
    )
    raw = hazard("RAW_HAZARD", (str(k3), 3, "Write"), (str(k3), 6, "Read"))
    assert order_checker(raw_sites, RAW)(raw)
    # a commit that arrives nowhere (a TMA pipeline's) orders no thread's write
    none = [dict(s, arrives=0) if s["op"] == "producer_commit" else s for s in raw_sites]
    assert order_checker(none, RAW)(raw) is None
    # two producer writes (WAW) are not credited
    waw = hazard("WAW_HAZARD", (str(k3), 3, "Write"), (str(k3), 3, "Write"))
    assert order_checker(raw_sites, RAW)(waw) is None


def test_cutedebug_sanitize_filters_a_pipeline_ordered_hazard_end_to_end(fake_sanitizer, tmp_path):
    """The H200's racecheck capture of race_smem.py (RAW: write line 28, read line 31), replayed
    through `cutedebug sanitize` for a worker whose compile recorded a covering producer_commit
    and a consumer_wait of one pipeline between the two lines: racecheck's RAW is that
    pipeline's hand-off, the tool's verdict CLEAN with the records filtered and counted; the
    same capture with the commit from a library class that does not sync its warp stays RACE."""
    import json

    from helpers.sanitize_runs import sanitize_tool, tool_report

    path = "/work/main/tools/sanitizer_samples/race_smem.py"  # as the H200 recorded it
    own = {"arrives": 1, "owner": "cutlass.pipeline.sm90", "method": "PipelineAsync.x"}
    sites = [
        {
            "op": "producer_commit",
            "pipeline": "PipelineAsync#0@race_smem.py:1",
            "file": path,
            "line": 29,
            **own,
        },
        {
            "op": "consumer_wait",
            "pipeline": "PipelineAsync#0@race_smem.py:1",
            "file": path,
            "line": 29,
        },
    ]

    def run(sites, where, expect):
        events = {"compiled": {"pipelines": []}, "protocol_sites": {"sites": sites}}
        r = sanitize_tool(
            fake_sanitizer,
            "racecheck_raw",
            "simulate",
            REPO / "scenarios" / "minimal" / "clean.toml",
            "racecheck",
            tmp_path / where,
            "--referee",
            "0",
            expect=expect,
            env={"FAKE_SANITIZER_EVENTS": json.dumps(events)},
        )
        return r, tool_report(r, "racecheck")

    r, (_, md, res) = run(sites, "ordered", "PASS")
    assert r.stdout.splitlines()[0].startswith("racecheck: CLEAN"), r.stdout
    assert res["verdict"] == "CLEAN" and res["filtered_count"] > 0
    assert "pipeline-ordered" in md
    lib = [dict(s, owner="somelib.pipeline") if s["op"] == "producer_commit" else s for s in sites]
    r, (_, _, res) = run(lib, "library", "RACE")
    assert r.stdout.splitlines()[0].startswith("racecheck: RACE — RAW_HAZARD at race_smem.py:28")
