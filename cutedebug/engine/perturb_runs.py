"""Perturbed runs inside the worker: N seeds, replay, shrinking — one compile, many launches.

The kernel was traced with ``instrument.perturb`` (delay positions reading a rule table in device
memory). Here the worker writes each seed's rules into that table and launches again, so every
seed, the replay and every shrinking candidate cost one launch, not one compile.

Events (besides the usual ones, which describe the *reported* run so the verdict rules apply
unchanged):

- ``perturb_positions``: the positions the trace produced;
- ``perturb_seed``: before each launch (seed, rules): if the kernel hangs past the probes and
  the watchdog kills the worker, the last one names the seed that did it;
- ``perturb_result``: after each launch (seed, outcome, digest);
- ``perturb_shrunk``: the minimal rule set, each rule described in words, and the runs it took;
- ``perturb_summary``: seeds run, the exposing seed (or none), and whether outputs differed bit
  for bit across seeds for a kernel that declares ``DETERMINISTIC = True``.

The seeds of one process share it: a seed runs after the launches of the seeds before it (what
they left in shared memory, in barrier words, in the caches), so a failure can need them. The
summary's ``history_from`` names the first seed when the exposing one was not it, and a replay
``with history`` (the request's ``replay_from``: seeds FIRST..SEED in order after one compile)
reruns that sequence. Its verdict is SEED's; an earlier seed that exposes a failure stops it
there and is reported as itself (``exposed_by`` != ``replay_of``), never as SEED's.

A run that ends in a CUDA error leaves the context unusable: it is reported as is (the seed is
named) and nothing more runs in this process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from cutedebug.event_kinds import PerturbPositions, PerturbSeed, PerturbShrunk, PerturbSummary
from cutedebug.instrument import perturb_plan as P

PASS, MISMATCH, HANG, CRASH = "PASS", "MISMATCH", "HANG", "CRASH"


class OneRun:
    """What one launch gave: the outcome and the events that would report it."""

    def __init__(
        self, outcome: str, events: list[tuple[str, dict[str, Any]]], digest: str | None = None
    ):
        self.outcome, self.events, self.digest = outcome, events, digest

    @property
    def exposed(self) -> bool:
        return self.outcome != PASS

    @property
    def fatal(self) -> bool:  # the CUDA context is gone
        return self.outcome == CRASH


def drive(
    spec: dict[str, Any],
    positions: list[P.Position],
    write_table: Callable[[bytes], None],
    launch: Callable[[], OneRun],
    emit: Callable[..., None],
    *,
    ctas: int | None,
    iterations: int | None,
    deterministic: bool,
    warps: int | None = None,
    cluster: int | None = None,
) -> None:
    """Run the seeds of ``spec`` (see ``spec_from_request``) and emit what they gave.

    ``ctas`` / ``warps`` / ``cluster`` (the traced launch, when static) and ``iterations``
    bound the random keys of the seeds' rules and the shrinking's windows."""
    policy = P.Policy(**spec.get("policy", {}))
    replay_of = int(spec["replay"]) if spec.get("replay") is not None else None
    emit(
        "perturb_positions",
        positions=[p.to_json() for p in positions],
        dropped=spec.get("dropped", 0),
        policy=policy.to_json(),
        shape={"ctas": ctas, "warps": warps, "cluster": cluster, "iterations": iterations},
        replay_of=replay_of,
    )
    by_id = {p.id: p for p in positions}

    def run_rules(rules: list[P.Rule], seed: int | None, tag: str) -> OneRun:
        write_table(P.table_bytes(rules, len(positions)))
        rows = [r.to_json() for r in rules]
        if seed in policies:  # a referee's seed names its own policy (what its replay needs)
            emit("perturb_seed", seed=seed, tag=tag, rules=rows, policy=policies[seed].to_json())
        else:
            emit("perturb_seed", seed=seed, tag=tag, rules=rows)
        res = launch()
        emit("perturb_result", seed=seed, tag=tag, outcome=res.outcome, digest=res.digest)
        return res

    policies: dict[int | None, P.Policy] = {}  # a referee's plans each have their own
    if spec.get("rules") is not None:  # replay of an explicit rule set
        plans = [(spec.get("seed"), [P.Rule.from_json(r) for r in spec["rules"]])]
    else:
        seeds = spec.get("seeds") or []
        if spec.get("referee"):  # seed i is the referee's plan i (a replay: that plan alone)
            every = dict(referee_plans(positions, max(seeds, default=-1) + 1))
            policies = {s: every[s] for s in seeds if s in every}
        plans = [
            (
                s,
                P.rules_for(
                    policies.get(s, policy), s, positions, ctas, iterations, warps, cluster
                ),
            )
            for s in (list(policies) if spec.get("referee") else seeds)
        ]
    if spec.get("referee") and not plans:  # no position: one launch as it is, said so
        plans = [(0, [])]
    for _, rules in plans:  # every plan checked before the first launch: a bad one runs none
        P.validate_rules(rules)
        P.table_bytes(rules, len(positions))
    last: OneRun | None = None
    exposing: tuple[int | None, list[P.Rule], OneRun] | None = None
    digests: dict[str, int | None] = {}
    runs = 0
    for seed, rules in plans:
        res = run_rules(rules, seed, "seed")
        runs += 1
        last = res
        if res.exposed:
            exposing = (seed, rules, res)
            break
        if res.digest:
            digests.setdefault(res.digest, seed)
    nondeterministic = deterministic and exposing is None and len(digests) > 1
    shrunk: list[P.Rule] | None = None
    if exposing is not None and spec.get("shrink") and not exposing[2].fatal:
        seed, rules, first = exposing
        signature = first.outcome
        tried = 0

        def fails(candidate: list[P.Rule]) -> bool:
            nonlocal tried
            if not candidate:
                return False
            tried += 1
            res = run_rules(candidate, seed, "shrink")
            if res.fatal:
                raise _ContextLost(res)
            return res.outcome == signature

        try:
            shrunk = P.shrink(rules, fails, ctas, iterations, warps, by_id)
            # the reported run is the minimal set's own (its events describe it)
            final = run_rules(shrunk, seed, "shrunk")
            if final.outcome == signature:
                exposing = (seed, shrunk, final)
            emit(
                "perturb_shrunk",
                seed=seed,
                rules=[r.to_json() for r in shrunk],
                described=[r.describe(by_id) for r in shrunk],
                runs=tried + 1,
                from_rules=len(rules),
                reproduced=final.outcome == signature,
            )
        except _ContextLost as lost:
            emit(
                "perturb_shrunk",
                seed=seed,
                rules=None,
                runs=tried,
                error=f"a shrinking candidate ended in {lost.res.outcome}: the CUDA context is "
                "gone, shrinking stopped (the exposing seed's rules stand)",
            )
            exposing = (seed, rules, lost.res)
    reported = exposing[2] if exposing is not None else last
    seeds_run = [s for s, _ in plans][:runs]
    emit(
        "perturb_summary",
        seeds=seeds_run,
        runs=runs,
        exposed_by=exposing[0] if exposing is not None else None,
        exposing_outcome=exposing[2].outcome if exposing is not None else None,
        exposing_policy=(
            (policies.get(exposing[0]) or policy).to_json() if exposing is not None else None
        ),
        referee=referee_summary(policies, runs, by_id) if policies else None,
        exposing_rules=[r.to_json() for r in exposing[1]] if exposing is not None else None,
        described=[r.describe(by_id) for r in exposing[1]] if exposing is not None else None,
        nondeterministic=nondeterministic,
        distinct_outputs=len(digests) if deterministic else None,
        digest_seeds=dict(list(digests.items())[:8]) if nondeterministic else None,
        replay_of=replay_of,
        history_from=history_from(seeds_run, exposing[0] if exposing is not None else None),
    )
    for name, fields in reported.events if reported is not None else []:
        emit(name, **fields)


# ---- the sanitizer's referee (analyses/sanitizer/referee.py) ---------------------------------
# The schedules that widen the window between a shared-memory hazard's two sides in a kernel
# ordered by mbarriers: each role slower throughout (a consumer that reads late against the
# producer's next write; a producer that writes late against consumers that read early), one
# protocol position at a time (a delay after producer_acquire, after consumer_wait, before
# consumer_release, after a raw wait, before a raw arrive), and random subsets. Delays run from
# large to small: a hand-off that is not ordered shows at the widest window first.
REFEREE_ROLE_US = (50.0, 200.0, 10.0, 2.0)
REFEREE_TARGET_US = (200.0, 50.0, 1000.0, 10.0)
# target order: the ops whose window is the hand-off's own first
REFEREE_TARGET_OPS = (
    ("consumer_release", "before"),
    ("producer_acquire", "after"),
    ("consumer_wait", "after"),
    ("mbarrier_wait", "after"),
    ("mbarrier_try_wait", "after"),
    ("mbarrier_arrive", "before"),
    ("mbarrier_arrive_and_expect_tx", "before"),
    ("producer_commit", "after"),
)


def referee_plans(positions: list[P.Position], n: int) -> list[tuple[int, P.Policy]]:
    """``n`` (seed, policy) pairs, round-robin over the schedule families this kernel has (a
    role without positions, or no target position, is left out); each pair replays alone as
    ``--replay SEED`` under its policy. Seeds are 0..n-1."""
    roles = {p.role for p in positions}
    rank = {op: i for i, op in enumerate(REFEREE_TARGET_OPS)}
    targets = sorted(
        (p for p in positions if (p.op, p.where) in rank),
        key=lambda p: (rank[(p.op, p.where)], p.id),
    )
    families: list[str] = [r for r in ("producer", "consumer") if r in roles]
    families += ["targeted"] * bool(targets) + ["random"] * bool(positions)
    out: list[tuple[int, P.Policy]] = []
    turns: dict[str, int] = {}
    for seed in range(n if families else 0):
        fam = families[seed % len(families)]
        k = turns[fam] = turns.get(fam, -1) + 1
        if fam == "targeted":
            # every target once at the widest delay, then again at the next one
            pos, us = targets[k % len(targets)], REFEREE_TARGET_US[k // len(targets) % 4]
            out.append((seed, P.Policy("targeted", target=pos.id, delay_us=us)))
        elif fam == "random":
            out.append((seed, P.Policy("random")))
        else:
            us = REFEREE_ROLE_US[k % len(REFEREE_ROLE_US)]
            out.append((seed, P.Policy("role", role=fam, delay_us=us)))
    return out


def referee_summary(
    policies: dict[int | None, P.Policy], runs: int, by_id: dict[int, P.Position]
) -> dict[str, Any]:
    """What the referee's launches tried, in words: runs per family and the targets."""
    tried = [policies[s] for s in list(policies)[:runs]]
    per: dict[str, int] = {}
    for pol in tried:
        name = f"role {pol.role}" if pol.name == "role" else pol.name
        per[name] = per.get(name, 0) + 1
    targets = []
    for pol in tried:
        pos = by_id.get(pol.target) if pol.name == "targeted" else None
        if pos is not None and pos.label not in targets:
            targets.append(pos.label)
    return {"runs": per, "targets": targets[:16], "targets_total": len(targets)}


def history_from(seeds_run: list[int | None], exposed_by: int | None) -> int | None:
    """The first seed of the process when seeds ran before the exposing one (None: it was the
    first, or nothing exposed)."""
    if exposed_by is None or not seeds_run or seeds_run[0] in (None, exposed_by):
        return None
    return seeds_run[0]


class _ContextLost(Exception):
    def __init__(self, res: OneRun):
        super().__init__(res.outcome)
        self.res = res


def run_in_worker(perturb: dict[str, Any], sess: Any, table: Any, launch: Any, events: Any) -> None:
    """The worker's perturbed path: ``launch`` is its ``Launch`` (engine/worker.py)."""
    from cutedebug.instrument import perturb as device

    spec = spec_from_request(perturb)
    spec["dropped"] = sess.dropped
    first = [True]

    def one() -> OneRun:
        got: list[tuple[str, dict[str, Any]]] = []

        # positional-only: events have fields called ``name`` (cuda_error's CUDA error name)
        def emit(event: str, /, **f: Any) -> None:
            if event == "launched":  # live: the watchdog's phase and kernel deadline
                events.emit(event, **f)
            else:
                got.append((event, f))

        launch.once(emit, live=events, fresh=not first[0])
        first[0] = False
        return classify(got)

    kernel = launch.kernel
    shape = getattr(sess, "shape", None) or {}
    try:
        drive(
            spec,
            sess.positions,
            lambda raw: device.write_table(table, raw),
            one,
            events.emit,
            ctas=spec.get("ctas") or shape.get("ctas"),
            iterations=spec.get("iterations"),
            deterministic=bool(getattr(kernel, "DETERMINISTIC", False)),
            warps=spec.get("warps") or shape.get("warps"),
            cluster=spec.get("cluster") or shape.get("cluster"),
        )
    except P.PerturbError as e:  # the request does not fit this kernel (drive launched nothing)
        events.emit("unsupported", reason=f"perturbation not run: {e}")


def classify(got: list[tuple[str, dict[str, Any]]]) -> OneRun:
    """The outcome of one launch from the events it would have reported."""
    names = {n: f for n, f in got}
    digest = (names.get("checked") or {}).get("digest")
    if "cuda_error" in names:
        return OneRun(CRASH, got)
    if (names.get("probe_report") or {}).get("stuck"):
        return OneRun(HANG, got)
    if (names.get("checked") or {}).get("ok") is False:
        return OneRun(MISMATCH, got, digest)
    return OneRun(PASS, got, digest)


def spec_from_request(perturb: dict[str, Any]) -> dict[str, Any]:
    """Normalize the request's ``perturb`` field (written by the runner)."""
    out = dict(perturb)
    n = int(out.get("n", 0) or 0)
    base = int(out.get("seed", 0) or 0)
    if out.get("replay") is not None and out.get("replay_from") is not None:
        first, seed = int(out["replay_from"]), int(out["replay"])
        if not 0 <= first <= seed:
            raise P.PerturbError(
                f"replay from seed {first} to seed {seed}: the first seed must be 0..{seed}"
            )
        out["seeds"] = list(range(first, seed + 1))  # the history, then the seed
    elif out.get("replay") is not None:
        out["seeds"] = [int(out["replay"])]
    elif out.get("rules") is None:
        out["seeds"] = [base + i for i in range(max(n, 1))]
    return out


def evidence(o: Any) -> dict[str, Any]:
    """The perturbation part of a run's evidence (empty when the run was not perturbed)."""
    summary = o.last(PerturbSummary)
    seeds = o.all(PerturbSeed)
    if summary is None and not seeds:
        return {}
    out: dict[str, Any] = {"perturbation": summary.to_json() if summary is not None else {}}
    pos = o.last(PerturbPositions)
    if pos is not None:
        out["perturbation"]["positions"] = len(pos.positions or [])
        out["perturbation"]["dropped_positions"] = pos.dropped or 0
        out["perturbation"]["policy"] = pos.policy
        out["perturbation"]["shape"] = pos.shape
        if pos.replay_of is not None:  # known before any launch: a killed replay says it too
            out["perturbation"]["replay_of"] = pos.replay_of
    if summary is None and seeds:  # killed mid-run (a hang past the probes, a crash)
        last = seeds[-1]
        ran = [s.seed for s in seeds if s.tag == "seed"]
        out["perturbation"].update(
            exposed_by=last.seed,
            killed_during=last.tag,
            exposing_rules=last.rules,
            runs=len(seeds),
            seeds=ran,
            history_from=history_from(ran, last.seed),
        )
        if last.policy is not None:  # a referee's seed: its own policy
            out["perturbation"]["exposing_policy"] = last.policy
    shrunk = o.last(PerturbShrunk)
    if shrunk is not None:
        out["perturbation"]["shrunk"] = shrunk.to_json()
    return out


def rerun_fields(perturb: dict[str, Any] | None, first: Any) -> dict[str, Any]:
    """The request fields of the rerun with probes after a perturbed run hung without them:
    the exposing seed (the one the killed run was in) after the seeds that ran before it in
    that process, as they ran (a hang can need them), not an unperturbed launch, which would
    grade a kernel other than the one that hung (engine/runner.py)."""
    if not perturb:
        return {}
    p = evidence(first).get("perturbation") or {}
    seed = p.get("exposed_by")
    if seed is None:
        return {"perturb": perturb}
    return {
        "perturb": {
            **perturb,
            "replay": seed,
            "replay_from": p.get("history_from"),
            "shrink": False,
        }
    }


def keep_first_hang(perturb: dict[str, Any] | None, first: tuple, rerun: tuple) -> tuple:
    """A perturbed HANG whose replay with probes did not hang again stays the HANG it was
    (killed at the deadline, unlocalized), never the replay's PASS."""
    if perturb and rerun[0].verdict.value != HANG:
        p = evidence(first[1]).get("perturbation") or {}
        first_seed, seed = p.get("history_from"), p.get("exposed_by")
        after = f" after seeds {first_seed}-{seed - 1}" if first_seed is not None else ""
        said = f" (the exposing seed's replay with probes{after} gave {rerun[0].verdict.value})"
        return (replace(first[0], reason=first[0].reason + said), *first[1:])
    return rerun
