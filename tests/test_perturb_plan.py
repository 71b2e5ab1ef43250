"""Schedule perturbation, host side: rules, policies, the device table, shrinking (stdlib only)."""

from __future__ import annotations

import re
import struct

import pytest
from test_perturb_keys import reaches

from cutedebug.instrument import perturb_plan as P

POS = [
    P.Position(0, "producer", "producer_acquire", "after", 0, "/k/tma_stream.py", 238),
    P.Position(1, "producer", "producer_commit", "after", 0, "/k/tma_stream.py", 243),
    P.Position(2, "consumer", "consumer_wait", "after", 0, "/k/tma_stream.py", 269),
    P.Position(3, "consumer", "consumer_release", "before", 0, "/k/tma_stream.py", 279),
]


def test_rule_in_words_names_delay_op_iteration_and_cta():
    r = P.Rule(3, 20_000, cta_lo=5, cta_hi=5, it_lo=3, it_hi=3)
    assert r.describe({p.id: p for p in POS}) == (
        "a 20 us delay before consumer_release of pipeline 0 (tma_stream.py:279) (consumer) "
        "at k-tile 3 of CTA 5"
    )
    assert P.Rule(1, 5_000).describe({p.id: p for p in POS}).endswith("in every CTA")


def test_table_has_one_row_per_position_and_zero_rows_elsewhere():
    rule = P.Rule(2, 7_000, 1, 4, -1, 2, 9, 3, 3, lanes=P.NON_ELECTED, ranks=0b10, cta_mod=2)
    raw = P.table_bytes([rule], 4)
    assert len(raw) == 4 * P.ROW_WORDS * 4 == 4 * 64
    rows = [struct.unpack_from("<16i", raw, i * 64) for i in range(4)]
    # delay, cta window, stage, iteration window, warp window, lane mask (bit 0 off: -2 as
    # int32), rank mask, cta residue; the rest unused
    assert rows[2] == (7_000, 1, 4, -1, 2, 9, 3, 3, -2, 2, 2, 0, 0, 0, 0, 0)
    # a row without a rule: no delay, every key open (masks all ones = -1)
    assert rows[0] == (0, 0, P.MAX_INT, -1, 0, P.MAX_INT, 0, P.MAX_INT, -1, -1, 1, 0, 0, 0, 0, 0)
    assert all(row[0] == 0 for i, row in enumerate(rows) if i != 2)
    with pytest.raises(P.PerturbError, match="positions 0..3"):
        P.table_bytes([P.Rule(4, 1)], 4)


def test_a_replay_rule_outside_32_bits_is_refused_as_bad_input():
    """A hand-edited replay rule (cutedebug run --replay with rules in the report) whose field
    does not fit the device row's int32 words: a PerturbError naming it, not a struct.error
    (which the worker would have turned into HARNESS_ERROR)."""
    rule = P.Rule.from_json({"position": 0, "delay_ns": 1000, "cta_hi": 1 << 40})
    with pytest.raises(P.PerturbError, match="must fit a 32-bit int"):
        P.validate_rules([rule])
    P.validate_rules([P.Rule.from_json({"position": 0, "delay_ns": 1000, "cta_hi": 7})])


def test_a_seed_gives_the_same_rules_every_time_and_seeds_differ():
    pol = P.Policy()
    a = P.rules_for(pol, 7, POS, ctas=16, iterations=32)
    assert a == P.rules_for(pol, 7, POS, ctas=16, iterations=32)
    others = {tuple(P.rules_for(pol, s, POS, ctas=16, iterations=32)) for s in range(32)}
    assert len(others) > 20  # seeds explore different delay sets
    for s in range(64):
        rules = P.rules_for(pol, s, POS, ctas=16, iterations=32)
        assert rules, "a seed always perturbs something"
        P.validate_rules(rules)
        for r in rules:
            assert r.delay_ns // 1000 in P.DELAYS_US
            assert r.cta_hi >= r.cta_lo and r.it_hi >= r.it_lo


def test_targeted_sweeps_delays_on_one_position_and_role_slows_one_role():
    t = [P.rules_for(P.Policy("targeted", target=2), s, POS) for s in range(len(P.SWEEP_US))]
    assert {tuple(r.position for r in rs) for rs in t} == {(2,)}
    assert [rs[0].delay_ns for rs in t] == [us * 1000 for us in P.SWEEP_US]
    role = P.rules_for(P.Policy("role", role="consumer", delay_us=3), 0, POS)
    assert [(r.position, r.delay_ns, r.cta_lo, r.cta_hi) for r in role] == [
        (2, 3000, 0, P.MAX_INT),
        (3, 3000, 0, P.MAX_INT),
    ]


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"name": "chaos"}, "allowed random, targeted, role"),
        ({"density": 0}, "allowed \\(0, 1\\]"),
        ({"name": "role", "role": "warp"}, "role=producer\\|consumer\\|any"),
        ({"scope": "rank=x"}, "rank takes cluster ranks"),
        ({"scope": "lane=3-40"}, "lane takes a lane 0..31"),
        ({"scope": "core=1"}, "KEY one of rank, cta, warp"),
        ({"delay_us": -1}, "allowed \\(0, 10000\\]"),
    ],
)
def test_bad_policies_say_what_is_allowed(bad, match):
    with pytest.raises(P.PerturbError, match=match):
        P.Policy(**bad)


def test_ddmin_finds_the_minimal_pair_and_never_repeats_a_candidate():
    seen = []

    def fails(sub):
        key = tuple(sub)
        assert key not in seen
        seen.append(key)
        return 3 in sub and 7 in sub

    assert P.ddmin(list(range(12)), fails) == [3, 7]


def test_shrink_narrows_windows_to_the_one_cta_and_k_tile_that_matter():
    # the "bug": a delay at position 3 reaching CTA 5 at k-tile 3 exposes it
    def fails(rules):
        return any(
            r.position == 3 and r.cta_lo <= 5 <= r.cta_hi and r.it_lo <= 3 <= r.it_hi for r in rules
        )

    rules = [P.Rule(0, 1000), P.Rule(1, 2000), P.Rule(3, 20_000), P.Rule(2, 5000, 0, 7)]
    out = P.shrink(rules, fails, ctas=16, iterations=32)
    assert out == [P.Rule(3, 20_000, 5, 5, -1, 3, 3)]


# ---- the worker's seed loop (engine/perturb_runs.drive) with a fake launch -----------------


def _drive(spec, verdict_of, deterministic=False, digest_of=None):
    import struct as _s

    from cutedebug.engine import perturb_runs as R

    table = {}
    events = []

    def write(raw):
        table["rows"] = [_s.unpack_from("<16i", raw, i * 64) for i in range(len(raw) // 64)]

    def launch():
        rows = table["rows"]
        outcome = verdict_of(rows)
        d = digest_of(rows) if digest_of else "d0"
        evs = [("checked", {"ok": outcome == "PASS", "digest": d})]
        if outcome == "HANG":
            evs = [("probe_report", {"stuck": [{"site": 3}]})]
        return R.OneRun(outcome, evs, d)

    R.drive(
        R.spec_from_request(spec),
        POS,
        write,
        launch,
        lambda name, **f: events.append((name, f)),
        ctas=16,
        iterations=32,
        deterministic=deterministic,
    )
    return events


def _bug(rows):  # position 3 delayed for CTA 5 at k-tile 3 (any consumer warp or lane)
    hit = any(
        reaches(rows[3], cta=5, it=3, warp=w, lane=ln, rank=0) for w in range(4) for ln in range(32)
    )
    return "MISMATCH" if hit else "PASS"


def test_seeds_run_until_one_exposes_and_its_events_are_the_reported_run():
    ev = _drive({"n": 64, "seed": 0}, _bug)
    names = [n for n, _ in ev]
    summary = dict(ev)["perturb_summary"]
    assert summary["exposed_by"] is not None and summary["exposing_outcome"] == "MISMATCH"
    seeds = [f["seed"] for n, f in ev if n == "perturb_seed"]
    assert seeds == list(range(summary["exposed_by"] + 1))  # stopped at the first
    assert names[-1] == "checked" and ev[-1][1]["ok"] is False  # the verdict rules see it
    # replay: the same seed alone gives the same rules and the same outcome
    again = _drive({"n": 1, "replay": summary["exposed_by"]}, _bug)
    assert dict(again)["perturb_summary"]["exposing_rules"] == summary["exposing_rules"]


def test_shrink_states_the_one_delay_that_matters():
    ev = _drive({"n": 64, "seed": 0, "shrink": True}, _bug)
    shrunk = dict(ev)["perturb_shrunk"]
    assert shrunk["reproduced"] is True
    (words,) = shrunk["described"]
    assert re.fullmatch(
        r"a \d+ us delay before consumer_release of pipeline 0 "
        r"\(tma_stream.py:279\) \(consumer\) at k-tile 3 of CTA 5"
        r"( in warps? [\d+-]+)?( in lanes 1-31 \(not lane 0, the elected one\))?",
        words,
    )
    assert len(shrunk["rules"]) == 1 and shrunk["rules"][0]["position"] == 3


def test_all_pass_is_no_exposure_and_differing_bits_are_nondeterministic_if_declared():
    ev = _drive({"n": 8}, lambda rows: "PASS")
    s = dict(ev)["perturb_summary"]
    assert s["exposed_by"] is None and s["runs"] == 8 and s["nondeterministic"] is False
    ev = _drive(
        {"n": 8},
        lambda rows: "PASS",
        deterministic=True,
        digest_of=lambda rows: "a" if rows[2][0] else "b",
    )
    assert dict(ev)["perturb_summary"]["nondeterministic"] is True
    ev = _drive(
        {"n": 8},
        lambda rows: "PASS",
        deterministic=False,
        digest_of=lambda rows: "a" if rows[2][0] else "b",
    )
    assert dict(ev)["perturb_summary"]["nondeterministic"] is False
