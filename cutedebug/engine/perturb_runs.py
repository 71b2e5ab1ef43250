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
    emit(
        "perturb_positions",
        positions=[p.to_json() for p in positions],
        dropped=spec.get("dropped", 0),
        policy=policy.to_json(),
        shape={"ctas": ctas, "warps": warps, "cluster": cluster, "iterations": iterations},
    )
    by_id = {p.id: p for p in positions}

    def run_rules(rules: list[P.Rule], seed: int | None, tag: str) -> OneRun:
        write_table(P.table_bytes(rules, len(positions)))
        emit("perturb_seed", seed=seed, tag=tag, rules=[r.to_json() for r in rules])
        res = launch()
        emit("perturb_result", seed=seed, tag=tag, outcome=res.outcome, digest=res.digest)
        return res

    if spec.get("rules") is not None:  # replay of an explicit rule set
        plans = [(spec.get("seed"), [P.Rule.from_json(r) for r in spec["rules"]])]
    else:
        seeds = spec.get("seeds") or []
        plans = [
            (s, P.rules_for(policy, s, positions, ctas, iterations, warps, cluster)) for s in seeds
        ]
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
    emit(
        "perturb_summary",
        seeds=[s for s, _ in plans][:runs],
        runs=runs,
        exposed_by=exposing[0] if exposing is not None else None,
        exposing_outcome=exposing[2].outcome if exposing is not None else None,
        exposing_rules=[r.to_json() for r in exposing[1]] if exposing is not None else None,
        described=[r.describe(by_id) for r in exposing[1]] if exposing is not None else None,
        nondeterministic=nondeterministic,
        distinct_outputs=len(digests) if deterministic else None,
        digest_seeds=dict(list(digests.items())[:8]) if nondeterministic else None,
    )
    for name, fields in reported.events if reported is not None else []:
        emit(name, **fields)


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
    if out.get("replay") is not None:
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
    if summary is None and seeds:  # killed mid-run (a hang past the probes, a crash)
        last = seeds[-1]
        out["perturbation"].update(
            exposed_by=last.seed,
            killed_during=last.tag,
            exposing_rules=last.rules,
            runs=len(seeds),
        )
    shrunk = o.last(PerturbShrunk)
    if shrunk is not None:
        out["perturbation"]["shrunk"] = shrunk.to_json()
    return out


def rerun_fields(perturb: dict[str, Any] | None, first: Any) -> dict[str, Any]:
    """The request fields of the rerun with probes after a perturbed run hung without them:
    the exposing seed alone (the one the killed run was in), not an unperturbed launch, which
    would grade a kernel other than the one that hung (engine/runner.py)."""
    if not perturb:
        return {}
    seed = (evidence(first).get("perturbation") or {}).get("exposed_by")
    return {
        "perturb": {**perturb, "replay": seed, "shrink": False} if seed is not None else perturb
    }


def keep_first_hang(perturb: dict[str, Any] | None, first: tuple, rerun: tuple) -> tuple:
    """A perturbed HANG whose replay with probes did not hang again stays the HANG it was
    (killed at the deadline, unlocalized), never the replay's PASS."""
    if perturb and rerun[0].verdict.value != HANG:
        said = f" (the exposing seed's replay with probes gave {rerun[0].verdict.value})"
        return (replace(first[0], reason=first[0].reason + said), *first[1:])
    return rerun
