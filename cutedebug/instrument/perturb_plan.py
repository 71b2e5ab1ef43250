"""Schedule perturbation, host side: positions, delay rules, policies, the rule table, shrinking.

A *position* is a protocol point where the instrumented kernel may be delayed (see
``perturb.py``, the trace-time observer that emits the delay code): a (role, pipeline, op,
where) of the kernel, e.g. "consumer, pipeline 0, before consumer_release" or "consumer,
pipeline 0, after consumer_wait" (between a wait and the shared-memory reads it guards).
Positions are numbered at trace time in program order.

A *rule* says, for one position, how long to wait (``delay_ns``) and when: a CTA range, a stage
(-1: any), an iteration range (the pipeline state's ``count``, i.e. the k-tile / the number of
advances before the op) and a warp (-1: any). The rules live in a small device table (one row
per position, ``ROW_WORDS`` int32 words), read by the kernel at each position: one compile
serves every seed, every replay and every shrinking step, and the delays are data, not code.

Policies turn a seed into rules (``rules_for``): ``random`` (seeded, a random subset of
positions, each with a random delay and random CTA / iteration windows), ``targeted`` (one
position, the seed picks the delay of a sweep) and ``role`` (every position of one role slower
throughout). ``shrink`` is delta debugging over a failing rule set: fewer rules first, then each
rule's CTA and iteration windows halved while the failure keeps its signature.

This module is stdlib only: the parent plans, describes and shrinks without cutlass or torch.
"""

from __future__ import annotations

import dataclasses
import random
import struct
from collections.abc import Callable, Sequence
from typing import Any

ROW_WORDS = 8  # delay_ns, cta_lo, cta_hi, stage, it_lo, it_hi, warp, reserved (int32 each)
ANY = -1
MAX_INT = 0x7FFFFFFF
POLICIES = ("random", "targeted", "role")
# Delays sized to widen real windows (a TMA tile lands in ~1-5 us; a k-tile of WGMMA is a few
# us) yet stay far below the probes' wait budget (hundreds of ms).
DELAYS_US = (1, 2, 5, 10, 20, 50)
SWEEP_US = (1, 2, 5, 10, 20, 50, 100, 200)


class PerturbError(ValueError):
    """A perturbation request is invalid; the message names the field and what is allowed."""


@dataclasses.dataclass(frozen=True)
class Position:
    """One point of the kernel where a delay can be inserted (numbered at trace time)."""

    id: int
    role: str  # producer | consumer | any
    op: str  # the pipeline op the position belongs to
    where: str  # "before" | "after" the op
    pipeline: int | None  # the pipeline's creation index (None: not a cutlass.pipeline op)
    file: str | None = None
    line: int | None = None
    via: str | None = None

    @property
    def label(self) -> str:
        pipe = f" of pipeline {self.pipeline}" if self.pipeline is not None else ""
        loc = f" ({self.file.rsplit('/', 1)[-1]}:{self.line})" if self.file else ""
        return f"{self.where} {self.op}{pipe}{loc}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Position:
        return cls(**{f.name: d.get(f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class Rule:
    """Delay ``delay_ns`` at ``position`` for the warps / CTAs / stages / iterations given."""

    position: int
    delay_ns: int
    cta_lo: int = 0
    cta_hi: int = MAX_INT  # inclusive
    stage: int = ANY
    it_lo: int = 0
    it_hi: int = MAX_INT  # inclusive
    warp: int = ANY

    def row(self) -> tuple[int, ...]:
        return (
            self.delay_ns,
            self.cta_lo,
            self.cta_hi,
            self.stage,
            self.it_lo,
            self.it_hi,
            self.warp,
            0,
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Rule:
        try:
            return cls(**{f.name: int(d[f.name]) for f in dataclasses.fields(cls) if f.name in d})
        except (TypeError, ValueError) as e:
            raise PerturbError(f"perturbation rule {d!r}: {e}") from e

    def describe(self, positions: dict[int, Position] | None = None) -> str:
        pos = (positions or {}).get(self.position)
        us = self.delay_ns / 1000
        what = f"a {us:g} us delay {pos.label if pos else f'at position {self.position}'}"
        if pos is not None and pos.role not in ("any", None):
            what += f" ({pos.role})"
        scope = []
        if (self.it_lo, self.it_hi) != (0, MAX_INT):
            scope.append("at " + _window("k-tile", self.it_lo, self.it_hi))
        if self.stage != ANY:
            scope.append(f"in stage {self.stage}")
        if (self.cta_lo, self.cta_hi) != (0, MAX_INT):
            scope.append("of " + _window("CTA", self.cta_lo, self.cta_hi))
        else:
            scope.append("in every CTA")
        if self.warp != ANY:
            scope.append(f"(warp {self.warp})")
        return " ".join([what, *scope])


def _window(name: str, lo: int, hi: int) -> str:
    if lo == hi:
        return f"{name} {lo}"
    if hi >= MAX_INT:
        return f"{name}s {lo}+"
    return f"{name}s {lo}-{hi}"


def table_bytes(rules: Sequence[Rule], n_positions: int) -> bytes:
    """The device table: one row per position (a position with no rule has delay 0)."""
    rows = [(0, 0, MAX_INT, ANY, 0, MAX_INT, ANY, 0)] * max(n_positions, 1)
    for r in rules:
        if not 0 <= r.position < n_positions:
            raise PerturbError(
                f"rule for position {r.position}: the kernel has positions 0..{n_positions - 1}"
            )
        rows[r.position] = r.row()
    return b"".join(struct.pack("<8i", *row) for row in rows)


def validate_rules(rules: Sequence[Rule]) -> None:
    seen = set()
    for r in rules:
        if r.position in seen:
            raise PerturbError(f"two rules for position {r.position}: one rule per position")
        seen.add(r.position)
        if not 0 <= r.delay_ns <= 10_000_000:
            raise PerturbError(f"rule delay_ns {r.delay_ns}: allowed 0..10000000 (10 ms)")


# ---- policies --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Policy:
    name: str = "random"
    # random: probability that a position gets a rule; targeted: the position swept;
    # role: the role slowed down and its delay
    density: float = 0.5
    target: int | None = None
    role: str | None = None
    delay_us: float | None = None

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise PerturbError(f"--policy {self.name!r}: allowed {', '.join(POLICIES)}")
        if not 0.0 < self.density <= 1.0:
            raise PerturbError(f"perturbation density {self.density}: allowed (0, 1]")
        if self.name == "role" and self.role not in ("producer", "consumer"):
            raise PerturbError(f"--policy role needs role=producer|consumer, got {self.role!r}")
        if self.delay_us is not None and not 0 < self.delay_us <= 10_000:
            raise PerturbError(f"perturbation delay {self.delay_us} us: allowed (0, 10000]")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def rules_for(
    policy: Policy,
    seed: int,
    positions: Sequence[Position],
    ctas: int | None = None,
    iterations: int | None = None,
) -> list[Rule]:
    """The rules a seed gives under a policy; the same (policy, seed, positions) -> same rules.

    ``ctas`` / ``iterations`` (when known) bound the random windows so that they hit.
    """
    if not positions:
        return []
    rng = random.Random(f"{policy.name}:{seed}")
    ctas = max(int(ctas or 1), 1)
    iters = max(int(iterations or 8), 1)
    if policy.name == "targeted":
        target = policy.target if policy.target is not None else seed % len(positions)
        if not 0 <= target < len(positions):
            raise PerturbError(
                f"targeted position {target}: the kernel has positions 0..{len(positions) - 1}"
            )
        us = policy.delay_us or SWEEP_US[seed % len(SWEEP_US)]
        return [Rule(positions[target].id, int(us * 1000))]
    if policy.name == "role":
        us = policy.delay_us or DELAYS_US[seed % len(DELAYS_US)]
        return [Rule(p.id, int(us * 1000)) for p in positions if p.role == policy.role]
    out = []
    for p in positions:
        if rng.random() >= policy.density:
            continue
        us = policy.delay_us or rng.choice(DELAYS_US)
        cta_lo, cta_hi = 0, MAX_INT
        if ctas > 1 and rng.random() < 0.5:  # half the rules hit a window of CTAs
            cta_lo = rng.randrange(ctas)
            cta_hi = min(ctas - 1, cta_lo + rng.randrange(max(ctas // 4, 1)))
        it_lo, it_hi = 0, MAX_INT
        if rng.random() < 0.5:  # half hit a window of iterations
            it_lo = rng.randrange(iters)
            it_hi = it_lo + rng.randrange(max(iters // 2, 1))
        out.append(Rule(p.id, int(us * 1000), cta_lo, cta_hi, ANY, it_lo, it_hi, ANY))
    if not out:  # a seed always perturbs something
        p = positions[rng.randrange(len(positions))]
        out.append(Rule(p.id, int((policy.delay_us or rng.choice(DELAYS_US)) * 1000)))
    return out


# ---- shrinking (delta debugging) -------------------------------------------------------------


def ddmin(items: list[Any], fails: Callable[[list[Any]], bool]) -> list[Any]:
    """Zeller's ddmin: a 1-minimal sublist of ``items`` for which ``fails`` stays true.

    ``fails`` is never called twice with the same candidate (results are cached)."""
    cache: dict[tuple[int, ...], bool] = {}

    def test(idx: list[int]) -> bool:
        key = tuple(idx)
        if key not in cache:
            cache[key] = fails([items[i] for i in idx])
        return cache[key]

    current = list(range(len(items)))
    n = 2
    while len(current) >= 2:
        chunk = max(len(current) // n, 1)
        subsets = [current[i : i + chunk] for i in range(0, len(current), chunk)]
        reduced = False
        for s in subsets:
            if test(s):
                current, n, reduced = s, 2, True
                break
        if not reduced:
            for s in subsets:
                comp = [i for i in current if i not in s]
                if comp and test(comp):
                    current, n, reduced = comp, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(current):
                break
            n = min(n * 2, len(current))
    return [items[i] for i in current]


def narrow(
    rule: Rule, fails: Callable[[Rule], bool], ctas: int | None, iterations: int | None
) -> Rule:
    """Halve a failing rule's CTA and iteration windows while it keeps failing."""
    cache: dict[Rule, bool] = {}

    def test(r: Rule) -> bool:
        if r not in cache:
            cache[r] = fails(r)
        return cache[r]

    for lo_f, hi_f, bound in (("it_lo", "it_hi", iterations), ("cta_lo", "cta_hi", ctas)):
        lo, hi = getattr(rule, lo_f), getattr(rule, hi_f)
        if bound:
            hi = min(hi, int(bound) - 1)
        while hi > lo:
            mid = (lo + hi) // 2
            left = dataclasses.replace(rule, **{lo_f: lo, hi_f: mid})
            right = dataclasses.replace(rule, **{lo_f: mid + 1, hi_f: hi})
            if test(left):
                rule, hi = left, mid
            elif test(right):
                rule, lo = right, mid + 1
            else:
                break
    return rule


def shrink(
    rules: list[Rule],
    fails: Callable[[list[Rule]], bool],
    ctas: int | None = None,
    iterations: int | None = None,
) -> list[Rule]:
    """A minimal failing rule set: ddmin over the rules, then each rule's windows narrowed."""
    minimal = ddmin(list(rules), fails)
    out = list(minimal)
    for i, r in enumerate(minimal):

        def one(candidate: Rule, i: int = i) -> bool:
            return fails(out[:i] + [candidate] + out[i + 1 :])

        out[i] = narrow(r, one, ctas, iterations)
    return out
