"""tools/coredump_coverage.py over the committed H200 rows: issue #25's table is what those
files say, computed apart here from the raw rows and the scenario files."""

from __future__ import annotations

import gzip
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import coredump_coverage as C  # noqa: E402
import gpu_pending  # noqa: E402


def _raw(rel: str) -> list[dict]:
    p = ROOT / rel
    return json.load(gzip.open(p, "rt") if p.suffix == ".gz" else open(p))


def _hang_ids_from_toml() -> set[str]:
    """HANG scenarios on sm_90a read from the TOML text alone (not through the loader)."""
    out = set()
    for f in (ROOT / "scenarios").rglob("*.toml"):
        d = tomllib.loads(f.read_text())
        e = d.get("expect", {})
        arch = d.get("requires", {}).get("arch", ["sm_90a"])
        if "HANG" in [e.get("verdict"), *e.get("also", [])] and "sm_90a" in arch:
            out.add(d["id"])
    return out


def test_every_hang_scenario_has_one_row_and_each_row_is_the_newest_run_of_it():
    cov = C.coverage()
    assert {r["scenario"] for r in cov} == _hang_ids_from_toml()
    ran: dict[str, tuple[str, dict]] = {}  # newest default-flags row that read, by hand
    no_core: dict[str, list[str]] = {}  # and the rows that ran but read nothing
    for label, rel, flags in C.RUNS:
        for i, r in enumerate(_raw(rel)):
            if flags == "default" and "skipped" not in r and r["verdict"] != "UNSUPPORTED":
                attached = bool(r.get("attach")) and "error" not in r["attach"]
                if r.get("dump_s") is None and not attached:
                    no_core.setdefault(r["scenario"], []).append(f"{r['verdict']} ({label}#{i})")
                else:
                    ran[r["scenario"]] = (f"{label}#{i}", r)
    for r in cov:
        assert r["ran_without_core"] == no_core.get(r["scenario"], []), r["scenario"]
        if r["scenario"] not in ran:
            assert not r["measured"], r["scenario"]
            continue
        source, raw = ran[r["scenario"]]
        assert r["source"] == source
        assert (r["verdict"], r["localization_ok"], r["added_s"], r["healthy"]) == (
            raw["verdict"],
            raw["localization_ok"],
            raw["added_s"],
            raw["healthy"],
        )


def test_the_summary_counts_what_the_h200_rows_say():
    cov = C.coverage()
    s = C.summary(cov)
    done = [r for r in cov if r["measured"]]
    # every own-family HANG scenario was dumped on the H200; what is left is field scenarios
    # (s4's call had no field libraries: its field rows read UNSUPPORTED and do not count)
    assert {r["scenario"] for r in cov if not r["field"]} <= {r["scenario"] for r in done}
    assert s["not_measured"] == [r["scenario"] for r in cov if not r["measured"]]
    assert all(n.startswith("field/") for n in s["not_measured"])
    assert s["verdict_ok"] == s["measured"] == len(done)
    assert s["graded"] == sum(r["localization_ok"] is not None for r in done)
    # no misses: quack GEMM's named-barrier hangs, found at the epilogue's barrier but under
    # bisection's name for that role in s2/call4, read consumer with the role rule (8040c07) in
    # 2026-12-02-h200-s4 call1, the newer row that wins
    missed = [r for r in done if r["localization_ok"] is False]
    assert missed == [] and s["localized_ok"] == s["graded"]
    rows = {r["scenario"]: r for r in done}
    for n in ("wrong_barrier_threads_plus", "wrong_barrier_threads_minus"):
        r = rows[f"field/quack_gemm_sm90/{n}"]
        assert r["localization_ok"] and "consumer: named_barrier/named" in r["core"], r
    # the scenarios without an expected place are the ones whose TOML names none
    assert set(s["no_expected_place"]) == {r["scenario"] for r in done if not r["expected_place"]}
    assert s["healthy_after_every_dump"] and s["leftovers"] == 0


def test_every_hang_read_attached_within_the_target():
    """The whole sm_90 HANG matrix with --coredump's default (cuda-gdb attached before the
    kill; reports/2026-12-02-h200-s7 calls 2-4): every scenario that hung read that way, the
    same places as the dump gave, at most 2.76 s added (FA-4 backward's 640 warps)."""
    cov = C.coverage()
    s = C.summary(cov)
    done = [r for r in cov if r["measured"]]
    attached = [r for r in done if r["read"] == "attach"]
    # 96 HANG scenarios: FA-4 forward's extra_consumer_release did not hang unprobed (MISMATCH
    # again), quack GEMM's missing_phase_flip_producer crashed this time (CRASH is among its
    # verdicts) and keeps its older dumped row; quack RMSNorm forward's wrong_expect_tx_minus
    # counts since HANG joined its verdicts (2026-12-03-h200-s11: 2 of 57 runs), never read
    # hung from a core (its 4 --coredump runs crashed)
    assert len(cov) == 96 and len(attached) == 93
    assert "field/quack_rmsnorm_fwd/wrong_expect_tx_minus" in s["not_measured"]
    assert [r["scenario"] for r in done if r["read"] == "dump"] == [
        "field/quack_gemm_sm90/missing_phase_flip_producer"
    ]
    assert all(r["added_s"] <= C.ADDED_TARGET_S for r in attached)
    assert max(r["added_s"] for r in attached) == 2.76
    assert s["added_small"]["within_target"] == s["added_small"]["n"]
    # the biggest: FA-4 forward wrong_barrier_threads_minus, 1,152 warps, 2.48 s (s9 call1)
    assert s["added_big_newest"] == {"n": 12, "read": ["attach"], "max": 2.476, "within_target": 12}
    modes = C.by_read()
    assert modes["attach"]["localized_ok"] == modes["attach"]["graded"] == 87
    assert modes["dump"]["localized_ok"] == modes["dump"]["graded"] == 87
    # the same role/op/barrier answer where both ways read a scenario
    dumped = {r["scenario"]: r for r in C.coverage(read="dump") if r["measured"]}
    for r in attached:
        if r["scenario"] in dumped and r["localization_ok"] is not None:
            assert dumped[r["scenario"]]["localization_ok"] is True, r["scenario"]


def test_seconds_added_by_the_dump_small_grids_within_target_and_the_big_grid_over_it():
    cov = C.coverage(read="dump")  # each scenario's newest reading from the driver's core
    s = C.summary(cov)
    a = s["added_small"]
    # under 1000 warps, nine did not make it, all quack RMSNorm backward's persistent clusters
    # (960 warps, a 132-133 MB core: 5.68-7.19 s added, the dump 4.85-6.30 s of it;
    # reports/2026-12-02-h200-s3/call3 and -s5/call2) or FA-4 backward (640 warps, a 214 MB
    # core: 5.77 and 4.82 s added); the warp count is no proxy for the dump
    over = {r["scenario"]: r["added_s"] for r in cov if r["measured"] and r["added_s"] > 5}
    small = {
        n: x for n, x in over.items() if next(r for r in cov if r["scenario"] == n)["warps"] < 1000
    }
    assert a["n"] - a["within_target"] == len(small) == 9 and a["max"] == 7.194
    assert all("quack_rmsnorm_bwd" in n or "fa4_bwd" in n for n in small), small
    assert over["field/quack_rmsnorm_bwd/skip_consumer_release"] == 6.001
    assert over["field/fa4_bwd_sm90/wrong_expect_tx_plus"] == 5.765
    assert over["field/quack_rmsnorm_bwd/extra_consumer_release"] == 7.194
    big = s["added_big"]
    assert {"minimal/spin_hang", "field/fa4_fwd_sm90/wrong_barrier_threads_plus"} <= {
        b["scenario"] for b in big
    }
    # s2's run: dump 5.382 s + reading 3.798 s (reports/2026-12-02-h200-s2/call2/coredump)
    s2 = next(b for b in big if b["source"] == "s2/call2#0")
    assert (s2["dump_s"], s2["core_s"], s2["added_s"], s2["warps"]) == (5.382, 3.798, 9.18, 8448)
    # the driver's dump of a full grid is over the target every time; cuda-gdb attached to the
    # same hung workers is not (reports/2026-12-02-h200-s7/call1: 1.75-1.88 s, the same places)
    dumped = [b for b in big if b["read"] == "dump"]
    attached = {b["scenario"]: b["added_s"] for b in big if "s7/call1 attach" in b["source"]}
    assert all(b["read"] == "attach" for b in big if "s7/call1 attach" in b["source"])
    assert dumped and all(b["added_s"] > C.ADDED_TARGET_S for b in dumped)
    assert attached == {
        "minimal/spin_hang": 1.852,
        "field/fa4_fwd_sm90/skip_consumer_release": 1.88,
        "field/fa4_fwd_sm90/wrong_expect_tx_minus": 1.75,
    }
    assert s["added_big_newest"]["read"] == ["dump"] and s["added_big_newest"]["within_target"] == 0


def test_bisection_only_scenarios_graded_from_the_core_within_ten_seconds():
    s = C.summary(C.coverage())
    rows = {b["scenario"]: b for b in s["bisect_only"]}
    own = [b for n, b in rows.items() if not n.startswith("field/")]
    assert own and all(b["localized"] and b["within_target"] for b in own)
    # against printf-bisection on the same GPU (reports/2026-11-30-h200-s3/bisect-table.txt)
    assert rows["bisect/tma_stream_early_exit_consumer"]["bisection_wall_s"] == 20.3
    assert rows["bisect/tma_stream_early_exit_consumer"]["core_wall_s"] == 4.8  # attached, s7
    # the field's four with the libraries imported by the fork server at its start (s9 call1,
    # 10.5 s once, in no row): 6.7-9.6 s. With the import at a fresh server's first FA-4 run
    # (s8 call3) that run took 10.1 s; before any preload (s7) 12.7-13.6 s. `cutedebug bisect`
    # of the same four as fresh commands: 42-48 s (tools/core_vs_bisect.py, s8)
    field = {n: b["core_wall_s"] for n, b in rows.items() if n.startswith("field/")}
    assert sorted(field.values()) == [6.74, 6.94, 8.63, 9.57], field
    assert all(b["localized"] and b["within_target"] for b in rows.values())
    assert all(40 < rows[n]["bisection_wall_s"] < 50 for n in field)


def test_the_crash_core_names_memchecks_line():
    c = C.crash_pair()
    assert c["core"] == "Warp Illegal Address at minimal.py:64"
    assert c["memcheck_where"] == "minimal.py:64" and c["same_line"]


def test_the_gpu_steps_name_exactly_what_is_not_measured():
    """coredump_rest + coredump_field(_gemm) run every field HANG scenario not yet dumped,
    each once, and none of those already dumped (CORE_DONE_FIELD); coredump_rest's one extra
    is the small own hang whose core comes back as a fixture."""
    cov = C.coverage()
    pending = {r["scenario"] for r in cov if not r["measured"]}
    measured = {r["scenario"] for r in cov if r["measured"]}
    rest, field_rest = set(gpu_pending.CORE_REST), set(gpu_pending.CORE_FIELD_REST)
    done = set(gpu_pending.CORE_DONE_FIELD)
    field_hangs = {sc.id for sc in C.hang_scenarios() if sc.id.startswith("field/")}
    assert rest - field_hangs == {"tma_stream/wrong_expect_tx_plus"}
    assert not rest & field_rest and not (rest | field_rest) & done
    assert (rest | field_rest | done) - {"tma_stream/wrong_expect_tx_plus"} == field_hangs
    assert done <= measured  # what the H200 dumped is not run again
    assert pending <= rest | field_rest  # so the two steps name everything still to measure
    cmd = gpu_pending.BY_NAME["coredump_rest"].command
    assert all(f"scenarios/{n}.toml" in cmd for n in rest)
    # coredump_field and coredump_field_gemm split the rest between them, each scenario once
    cmds = [gpu_pending.BY_NAME[s].command for s in ("coredump_field", "coredump_field_gemm")]
    assert all(sum(f"scenarios/{n}.toml" in c for c in cmds) == 1 for n in field_rest)
    # quack GEMM's named-barrier hangs first: graded False before the role rule (8040c07),
    # whose consumer is the epilogue's warp branch
    by = {sc.id: sc.expect.localization().get("role") for sc in C.hang_scenarios()}
    assert [by[n] for n in gpu_pending.CORE_REST[:2]] == ["consumer", "consumer"]
    assert all("quack_gemm" in n for n in gpu_pending.CORE_REST[:2])


def test_a_newer_run_added_on_the_command_line_counts(tmp_path, capsys):
    """After a GPU call: its rows file given with --add marks those scenarios measured, and
    a newer row of a scenario replaces the older one; a bad --add is a usage error."""
    old = _raw("reports/2026-12-02-h200-s2/call2/coredump/rows.json.gz")[1]
    new_rows = [
        {**old, "scenario": "field/quack_softmax/wrong_expect_tx_plus", "added_s": 2.5},
        {**old, "added_s": 0.9},  # sm90_gemm/early_exit_consumer again
        {"scenario": "field/fa4_fwd_sm90/extra_consumer_release", "skipped": "budget"},
        {**old, "scenario": "minimal/oob_store", "verdict": "CRASH", "core": "X at minimal.py:64"},
    ]
    f = tmp_path / "rows.json"
    f.write_text(json.dumps(new_rows))
    assert C.main(["--pending", "--add", f"next={f}"]) == 0
    pending = capsys.readouterr().out.split()
    assert "field/quack_softmax/wrong_expect_tx_plus" not in pending
    # skipped: not measured (its one run on the H200 read MISMATCH: no hang, no core)
    assert "field/fa4_fwd_sm90/extra_consumer_release" in pending
    runs = [*C.RUNS, ("next", str(f), "default")]
    rows = {r["scenario"]: r for r in C.coverage(runs=runs)}
    assert rows["sm90_gemm/early_exit_consumer"]["source"] == "next#1"
    assert rows["sm90_gemm/early_exit_consumer"]["added_s"] == 0.9
    crashes = C.summary(list(rows.values()), runs=runs)["crash_rows"]
    assert [(x["scenario"], x["core"]) for x in crashes if x["source"] == "next#3"] == [
        ("minimal/oob_store", "X at minimal.py:64")
    ]
    assert C.main(["--add", "no-equals-sign"]) == 2
    assert "LABEL=PATH" in capsys.readouterr().err


def test_the_crash_through_coredump_on_the_h200_names_memchecks_line():
    """s2/call4: minimal/oob_store through `--coredump` (the exception's core, not a replay):
    CRASH at minimal.py:64, memcheck's line for the same kernel file."""
    s = C.summary(C.coverage())
    rows = [x for x in s["crash_rows"] if x["scenario"] == "minimal/oob_store"]
    assert rows and rows[0]["source"] == "s2/call4#0" and rows[0]["verdict"] == "CRASH"
    assert rows[0]["core"].endswith(f"at {s['crash']['memcheck_where']}")
