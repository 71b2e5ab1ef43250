"""Schedule perturbation's keys (stdlib only): delays reach a subset of CTAs (cluster rank,
parity, window), of warps (one warp, one warpgroup) and of lanes (the non-elected ones); the
random policy draws them so that 32 seeds reach the asymmetric cases latent bugs need; the
targeted and role policies take them as a scope; shrinking states the subset in words.

The fake launches below decide "exposed" with ``reaches``: the device's test of a row
(perturb.maybe_delay) written out again from the row layout documented in perturb_plan.Rule,
applied to every (CTA, rank, warp, lane) of a launch shape, the way the GPU would."""

from __future__ import annotations

import struct

import pytest

from cutedebug.instrument import perturb_plan as P

# a warp-specialised cluster GEMM's positions (as tests/test_perturb.py finds them in the PTX)
GEMM = [
    P.Position(0, "any", "create", "before", 0, "/k/sm90_gemm.py", 341),
    P.Position(1, "any", "create", "after", 0, "/k/sm90_gemm.py", 341),
    P.Position(2, "producer", "producer_acquire", "after", 0, "/k/sm90_gemm.py", 393),
    P.Position(3, "producer", "producer_commit", "after", 0, "/k/sm90_gemm.py", 403),
    P.Position(4, "consumer", "consumer_wait", "after", 0, "/k/sm90_gemm.py", 455),
    P.Position(5, "consumer", "consumer_release", "before", 0, "/k/sm90_gemm.py", 470),
    P.Position(6, "producer", "producer_tail", "before", 0, "/k/sm90_gemm.py", 406),
]
SHAPE = {"ctas": 8, "warps": 12, "cluster": 2}


def reaches(row, cta, rank, warp, lane, it=0, stage=0):
    """Whether a device row delays this thread: the kernel's test (perturb.maybe_delay),
    written out again from the row layout documented in perturb_plan.Rule."""
    d, clo, chi, st, ilo, ihi, wlo, whi, lanes, ranks, mod, rem, *_ = row
    return bool(
        d > 0
        and clo <= cta <= chi
        and (st < 0 or st == stage)
        and ilo <= it <= ihi
        and wlo <= warp <= whi
        and (lanes >> lane) & 1  # int32 masks: Python's >> of a negative one keeps bit i
        and (ranks >> rank) & 1
        and cta % mod == rem
    )


def threads(ctas=8, cluster=2, warps=12):
    for cta in range(ctas):
        for warp in range(warps):
            for lane in range(32):
                yield cta, cta % cluster, warp, lane


def _row(rule):
    return struct.unpack("<16i", P.table_bytes([rule], rule.position + 1)[-64:])


def test_every_key_selects_exactly_the_threads_it_names():
    cases = {
        "rank=1": lambda c, r, w, ln: r == 1,
        "cta=odd": lambda c, r, w, ln: c % 2 == 1,
        "cta=2-5": lambda c, r, w, ln: 2 <= c <= 5,
        "warp=0": lambda c, r, w, ln: w == 0,
        "warpgroup=2": lambda c, r, w, ln: 8 <= w <= 11,
        "lane=nonelected": lambda c, r, w, ln: ln != 0,
        "lane=4-7": lambda c, r, w, ln: 4 <= ln <= 7,
        "rank=0 warp=4-5 lane=0": lambda c, r, w, ln: r == 0 and 4 <= w <= 5 and ln == 0,
    }
    for scope, want in cases.items():
        row = _row(P.Rule(0, 1000, **P.parse_scope(scope)))
        got = {t for t in threads() if reaches(row, *t)}
        assert got == {t for t in threads() if want(*t)}, scope


def test_iteration_scope_opens_to_the_end_and_rules_in_words_name_the_subset():
    assert P.parse_scope("iter=3-") == {"it_lo": 3, "it_hi": P.MAX_INT}
    assert P.parse_scope("iter=3") == {"it_lo": 3, "it_hi": 3}
    by_id = {p.id: p for p in GEMM}
    r = P.Rule(5, 50_000, it_lo=12, **P.parse_scope("rank=1 warpgroup=1 lane=nonelected"))
    assert r.describe(by_id) == (
        "a 50 us delay before consumer_release of pipeline 0 (sm90_gemm.py:470) (consumer) "
        "at k-tiles 12+ of cluster rank 1 in warps 4-7 in lanes 1-31 (not lane 0, the elected "
        "one)"
    )
    r = P.Rule(0, 20_000, **P.parse_scope("warp=0 cta=odd"))
    assert r.describe(by_id) == (
        "a 20 us delay before create of pipeline 0 (sm90_gemm.py:341) of odd CTAs in warp 0"
    )


def test_targeted_and_role_policies_take_the_scope():
    (t,) = P.rules_for(P.Policy("targeted", target=0, scope="rank=1", delay_us=20), 0, GEMM)
    assert (t.position, t.delay_ns, t.ranks) == (0, 20_000, 0b10)
    role = P.rules_for(P.Policy("role", role="consumer", scope="rank=1 iter=12-"), 3, GEMM)
    assert [(r.position, r.ranks, r.it_lo, r.it_hi) for r in role] == [
        (4, 0b10, 12, P.MAX_INT),
        (5, 0b10, 12, P.MAX_INT),
    ]
    every = P.rules_for(P.Policy("role", role="any", scope="warp=0"), 0, GEMM)
    assert [r.position for r in every] == [p.id for p in GEMM]
    # old JSON (one warp or -1) still reads
    assert P.Rule.from_json({"position": 1, "delay_ns": 5, "warp": 3}).warp_lo == 3
    assert P.Rule.from_json({"position": 1, "delay_ns": 5, "warp": -1}).warp_hi == P.MAX_INT


def test_random_keys_stay_inside_the_launch_and_reach_the_asymmetric_cases_in_32_seeds():
    pol = P.Policy()
    seen = {"warp 0 alone": 0, "one rank": 0, "one warpgroup": 0, "lanes": 0, "parity": 0}
    for seed in range(32):
        for r in P.rules_for(pol, seed, GEMM, **SHAPE):
            row = _row(r)
            hit = {t for t in threads() if reaches(row, *t, it=r.it_lo)}
            assert hit, f"seed {seed}: {r} reaches no thread of the launch"
            warps = {t[2] for t in hit}
            ranks = {t[1] for t in hit}
            seen["warp 0 alone"] += warps == {0} and r.position == 0
            seen["one rank"] += len(ranks) == 1 and r.position == 0
            seen["one warpgroup"] += len(warps) == 4
            seen["lanes"] += {t[3] for t in hit} == set(range(1, 32))
            seen["parity"] += r.cta_mod == 2
            if not GEMM[r.position].iterates:
                assert (r.it_lo, r.it_hi) == (0, P.MAX_INT), "create has no iteration to key"
    assert all(seen.values()), seen


# ---- through the worker's seed loop: fake latent bugs that only asymmetry exposes ----------


def _drive(spec, exposed_by, **shape):
    from cutedebug.engine import perturb_runs as R

    table, events = {}, []

    def write(raw):
        table["rows"] = [struct.unpack_from("<16i", raw, i * 64) for i in range(len(raw) // 64)]

    def launch():
        bad = exposed_by(table["rows"])
        return R.OneRun("HANG" if bad else "PASS", [("checked", {"ok": not bad})])

    R.drive(
        R.spec_from_request(spec),
        GEMM,
        write,
        launch,
        lambda name, **f: events.append((name, f)),
        ctas=shape.get("ctas"),
        iterations=shape.get("iterations"),
        deterministic=False,
        warps=shape.get("warps"),
        cluster=shape.get("cluster"),
    )
    return dict(events)


def _init_race(rows):
    """missing_init_fence: some warp reaches its first wait (before create undelayed) while
    warp 0, which initialises the barriers, is still delayed before create."""
    return any(
        reaches(rows[0], cta, cta % 2, 0, 0)
        and not reaches(rows[0], cta, cta % 2, w, 0)
        and not reaches(rows[1], cta, cta % 2, w, 0)
        for cta in range(8)
        for w in range(1, 12)
    )


def _peer_init_race(rows):
    """skip_init_cluster_sync: one rank of a cluster inits late while its peer does not."""
    return any(
        reaches(rows[0], 2 * c + late, late, 0, 0)
        and not reaches(rows[0], 2 * c + 1 - late, 1 - late, 0, 0)
        for c in range(4)
        for late in (0, 1)
    )


@pytest.mark.parametrize("bug", [_init_race, _peer_init_race])
def test_asymmetric_bugs_are_exposed_within_32_seeds_and_shrink_names_the_subset(bug):
    s = _drive({"n": 32, "seed": 0, "shrink": True}, bug, **SHAPE, iterations=16)
    assert s["perturb_summary"]["exposed_by"] is not None
    shrunk = s["perturb_shrunk"]
    assert shrunk["reproduced"] and len(shrunk["rules"]) == 1
    (words,) = shrunk["described"]
    assert words.startswith("a ") and "before create of pipeline 0" in words
    assert "k-tile" not in words  # create has no iteration: its window is not narrowed
    if bug is _init_race:
        assert "in warp 0" in words
    else:
        assert "cluster rank" in words or "CTA" in words


def test_the_same_bugs_stay_hidden_when_every_thread_is_delayed_alike():
    for bug in (_init_race, _peer_init_race):
        s = _drive({"n": 32, "seed": 0, "policy": {"name": "role", "role": "any"}}, bug, **SHAPE)
        assert s["perturb_summary"]["exposed_by"] is None


def test_the_command_line_scope_reaches_the_policy_and_a_bad_one_is_a_usage_error():
    import argparse

    from cutedebug.commands import perturb_args
    from cutedebug.errors import UsageError

    p = argparse.ArgumentParser()
    perturb_args.add_arguments(p)
    args = p.parse_args(["--perturb", "4", "--policy", "role", "--perturb-role", "any"])
    args.perturb_scope = "rank=1 warp=0"
    assert perturb_args.request_field(args)["policy"]["scope"] == "rank=1 warp=0"
    args = p.parse_args(["--perturb", "4", "--perturb-scope", "rank=one"])
    with pytest.raises(UsageError, match="'rank=one': rank takes cluster ranks"):
        perturb_args.request_field(args)


def test_the_report_states_the_launch_the_keys_were_drawn_for_and_the_scope():
    from types import SimpleNamespace

    from cutedebug.reporting import perturbation

    words = P.Rule(0, 50_000, **P.parse_scope("rank=1")).describe({p.id: p for p in GEMM})
    result = SimpleNamespace(
        evidence={
            "perturbation": {
                "policy": {"name": "targeted", "scope": "rank=1"},
                "positions": 7,
                "runs": 1,
                "exposed_by": 0,
                "exposing_outcome": "HANG",
                "described": [words],
                "shape": {"ctas": 8, "warps": 12, "cluster": 2, "iterations": None},
            }
        }
    )
    md = "\n".join(perturbation.report_sections(result))
    assert "Keys drawn for the traced launch: ctas 8, warps 12, cluster 2." in md
    assert "Every delay scoped to `rank=1`." in md
    assert "- a 50 us delay before create of pipeline 0 (sm90_gemm.py:341) of cluster rank 1" in md
    assert "of cluster rank 1" in perturbation.summary_line(result)


# ---- a scope that selects no thread is refused, never run as if its schedule had been tried --


def test_a_scope_outside_the_launch_is_refused_naming_what_the_launch_has():
    cases = {
        "rank=1": ({"cluster": 1}, "its clusters have 1 CTA(s): ranks 0..0"),
        "rank=2,3": (SHAPE, "its clusters have 2 CTA(s): ranks 0..1"),
        "warp=12": (SHAPE, "its CTAs have 12 warp(s): 0..11"),
        "warpgroup=3": (SHAPE, "its CTAs have 12 warp(s): 0..11"),
        "cta=8-9": (SHAPE, "it has 8 CTA(s): 0..7"),
        "cta=odd": ({"ctas": 1}, "it has 1 CTA(s): 0..0"),
    }
    for scope, (shape, says) in cases.items():
        for pol in (
            P.Policy(scope=scope),
            P.Policy("targeted", target=2, scope=scope),
            P.Policy("role", role="any", scope=scope),
        ):
            with pytest.raises(P.PerturbError, match="selects no thread of this launch") as e:
                P.rules_for(pol, 0, GEMM, **shape)
            assert says in str(e.value) and repr(scope) in str(e.value), (scope, pol.name)
    # inside the launch, or the launch not known statically: taken as given
    for scope in ("rank=1", "warp=11", "cta=7", "cta=odd"):
        assert P.rules_for(P.Policy("targeted", target=2, scope=scope), 0, GEMM, **SHAPE)
    assert P.rules_for(P.Policy("targeted", target=2, scope="rank=5"), 0, GEMM)


def test_iteration_and_stage_keys_never_land_on_a_position_without_a_pipeline_state():
    # create runs its delay at count 0, stage 0: 'iter=3-' there would be a delay that never
    # happens, reported as tried
    with pytest.raises(P.PerturbError, match=r"iter need a position with a pipeline state"):
        P.rules_for(P.Policy("targeted", target=0, scope="iter=3-"), 0, GEMM, **SHAPE)
    with pytest.raises(P.PerturbError, match=r"stage need .* position 1 \(after create"):
        P.rules_for(P.Policy("targeted", target=1, scope="stage=1"), 0, GEMM, **SHAPE)
    role = P.rules_for(P.Policy("role", role="any", scope="iter=3-"), 0, GEMM, **SHAPE)
    assert [r.position for r in role] == [2, 3, 4, 5, 6]
    for seed in range(32):
        for r in P.rules_for(P.Policy(scope="iter=2-"), seed, GEMM, **SHAPE):
            assert GEMM[r.position].iterates and r.it_lo == 2, (seed, r)
    # without state keys create positions are drawn as before
    assert any(
        r.position in (0, 1) for s in range(8) for r in P.rules_for(P.Policy(), s, GEMM, **SHAPE)
    )
    # a role with no position at all (a kernel of raw barriers has only 'any') is refused too
    raw = [P.Position(0, "any", "mbarrier_wait", "after", None, "/k/cluster_reduce.py", 90)]
    with pytest.raises(P.PerturbError, match="no position of that role .*roles there: any"):
        P.rules_for(P.Policy("role", role="consumer"), 0, raw)
    with pytest.raises(P.PerturbError, match="this kernel has none"):
        P.rules_for(P.Policy(scope="iter=1"), 0, raw)


def test_a_scope_refused_in_the_worker_launches_nothing_and_reads_as_not_run():
    from types import SimpleNamespace

    from cutedebug.engine import perturb_runs as R
    from cutedebug.engine import verdict as V

    launches, events = [], []
    launch = SimpleNamespace(kernel=None, once=lambda *a, **k: launches.append(1))
    sess = SimpleNamespace(positions=GEMM, dropped=0, shape={"ctas": 8, "warps": 12, "cluster": 1})
    sink = SimpleNamespace(emit=lambda name, **f: events.append({"event": name, **f}))
    request = {"n": 4, "seed": 0, "policy": {"name": "random", "scope": "rank=1"}}
    R.run_in_worker(request, sess, None, launch, sink)
    assert launches == [] and "perturb_seed" not in [e["event"] for e in events]
    (unsupported,) = [e for e in events if e["event"] == "unsupported"]
    assert unsupported["reason"].startswith("perturbation not run: perturbation scope 'rank=1'")
    o = V.Outcome(phase="done")
    for e in [{"event": "device", "present": True, "name": "H200"}, *events, {"event": "done"}]:
        o.add(e)
    got = V.classify(o)
    assert got.verdict is V.Verdict.UNSUPPORTED and "ranks 0..0" in got.reason
    # a replayed rule set that does not fit the kernel's table: refused before any launch too
    events.clear()
    R.run_in_worker({"rules": [{"position": 9, "delay_ns": 1000}]}, sess, None, launch, sink)
    assert launches == [] and "positions 0..6" in events[-1]["reason"]
