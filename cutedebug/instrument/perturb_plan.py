"""Schedule perturbation, host side: positions, delay rules, policies, the rule table, shrinking.

A *position* is a protocol point where the instrumented kernel may be delayed (see
``perturb.py``, the trace-time observer that emits the delay code): a (role, pipeline, op,
where) of the kernel, e.g. "consumer, pipeline 0, before consumer_release" or "consumer,
pipeline 0, after consumer_wait" (between a wait and the shared-memory reads it guards).
Positions are numbered at trace time in program order.

A *rule* says, for one position, how long to wait (``delay_ns``) and in which threads: a CTA
range and residue (e.g. the odd CTAs), a set of cluster ranks, a stage (-1: any), an iteration
range (the pipeline state's ``count``, i.e. the k-tile / the number of advances before the op),
a warp range (one warp, one warpgroup) and a set of lanes (e.g. every lane but the elected lane
0). Latent protocol bugs need *asymmetry*: a peer CTA that initialises its barriers late, one
consumer warp that reads late, the lanes of a warp out of step; a delay in every thread alike
barely moves their relative timing. The rules live in a small device table (one row per
position, ``ROW_WORDS`` int32 words), read by the kernel at each position: one compile serves
every seed, every replay and every shrinking step, and the delays are data, not code.

Policies turn a seed into rules (``rules_for``): ``random`` (seeded, a random subset of
positions, each with a random delay and random keys drawn from the launch shape: CTA subsets by
cluster rank, parity or window, one warp or warpgroup, the non-elected lanes, an iteration
window), ``targeted`` (one position, the seed picks the delay of a sweep) and ``role`` (every
position of one role slower throughout); each takes fixed keys (``scope``, ``parse_scope``:
"rank=1 warp=0 lane=nonelected iter=3-"). ``shrink`` is delta debugging over a failing rule
set: fewer rules first, then each rule's iteration, CTA and warp windows halved while the
failure keeps its signature.

This module is stdlib only: the parent plans, describes and shrinks without cutlass or torch.
"""

from __future__ import annotations

import dataclasses
import random
import struct
from collections.abc import Callable, Sequence
from typing import Any

ROW_WORDS = 16  # see Rule.row: the delay, then the keys, int32 each (the last words unused)
ANY = -1
MAX_INT = 0x7FFFFFFF
ALL_BITS = 0xFFFFFFFF  # a lane / cluster-rank mask that takes every one
NON_ELECTED = ALL_BITS & ~1  # every lane but lane 0, the one a warp's elect / release uses
POLICIES = ("random", "targeted", "role")
# Delays sized to widen real windows (a TMA tile lands in ~1-5 us; a k-tile of WGMMA is a few
# us) yet stay far below the probes' wait budget (hundreds of ms).
DELAYS_US = (1, 2, 5, 10, 20, 50)
SWEEP_US = (1, 2, 5, 10, 20, 50, 100, 200)
# ops whose position has a pipeline state (a stage and an iteration to key on)
STATE_OPS = (
    "producer_acquire",
    "producer_commit",
    "consumer_wait",
    "consumer_release",
    "producer_tail",
)
WARPGROUP = 4  # warps


class PerturbError(ValueError):
    """A perturbation request is invalid; the message names the field and what is allowed."""


@dataclasses.dataclass(frozen=True)
class Position:
    """One point of the kernel where a delay can be inserted (numbered at trace time)."""

    id: int
    role: str  # producer | consumer | any
    op: str  # the pipeline op (or raw barrier op, or create) the position belongs to
    where: str  # "before" | "after" the op
    pipeline: int | None  # the pipeline's creation index (None: not a cutlass.pipeline op)
    file: str | None = None
    line: int | None = None
    via: str | None = None
    stateful: bool | None = True  # False: the op had no pipeline state (a TMA store's): count 0

    @property
    def label(self) -> str:
        pipe = f" of pipeline {self.pipeline}" if self.pipeline is not None else ""
        loc = f" ({self.file.rsplit('/', 1)[-1]}:{self.line})" if self.file else ""
        return f"{self.where} {self.op}{pipe}{loc}"

    @property
    def iterates(self) -> bool:
        """The position has a pipeline state: its stage and iteration are keys."""
        return self.op in STATE_OPS and self.stateful is not False

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Position:  # stateful absent (older): None
        return cls(**{f.name: d.get(f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class Rule:
    """Delay ``delay_ns`` at ``position`` in the threads its keys select.

    A thread is delayed when every key holds: its CTA (linear block id) in [cta_lo, cta_hi]
    and ``cta % cta_mod == cta_rem``; its rank in the cluster a bit of ``ranks``; the pipeline
    state's stage == ``stage`` (-1: any) and count (the iteration) in [it_lo, it_hi]; its warp
    (linear thread id // 32) in [warp_lo, warp_hi]; its lane a bit of ``lanes``."""

    position: int
    delay_ns: int
    cta_lo: int = 0
    cta_hi: int = MAX_INT  # inclusive
    stage: int = ANY
    it_lo: int = 0
    it_hi: int = MAX_INT  # inclusive
    warp_lo: int = 0
    warp_hi: int = MAX_INT  # inclusive
    lanes: int = ALL_BITS
    ranks: int = ALL_BITS
    cta_mod: int = 1
    cta_rem: int = 0

    def row(self) -> tuple[int, ...]:
        """The device row (int32 words; the masks as their two's-complement bits)."""
        words = (
            self.delay_ns,
            self.cta_lo,
            self.cta_hi,
            self.stage,
            self.it_lo,
            self.it_hi,
            self.warp_lo,
            self.warp_hi,
            _signed(self.lanes),
            _signed(self.ranks),
            self.cta_mod,
            self.cta_rem,
        )
        return words + (0,) * (ROW_WORDS - len(words))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Rule:
        d = dict(d)
        if "warp" in d:  # a rule written before warp windows: one warp or any
            w = int(d.pop("warp"))
            if w >= 0:
                d.setdefault("warp_lo", w)
                d.setdefault("warp_hi", w)
        try:
            return cls(**{f.name: int(d[f.name]) for f in dataclasses.fields(cls) if f.name in d})
        except (TypeError, ValueError, KeyError) as e:
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
        ctas = []
        if (self.cta_lo, self.cta_hi) != (0, MAX_INT):
            ctas.append(_window("CTA", self.cta_lo, self.cta_hi))
        if self.cta_mod == 2:
            ctas.append(("odd" if self.cta_rem else "even") + " CTAs")
        elif self.cta_mod > 2:
            ctas.append(f"CTAs {self.cta_rem} mod {self.cta_mod}")
        if self.ranks != ALL_BITS:
            ctas.append("cluster " + _bits("rank", self.ranks))
        scope.append(("of " + ", ".join(ctas)) if ctas else "in every CTA")
        if (self.warp_lo, self.warp_hi) != (0, MAX_INT):
            scope.append("in " + _window("warp", self.warp_lo, self.warp_hi))
        if self.lanes == NON_ELECTED:
            scope.append("in lanes 1-31 (not lane 0, the elected one)")
        elif self.lanes != ALL_BITS:
            scope.append("in " + _bits("lane", self.lanes))
        return " ".join([what, *scope])


def _signed(bits: int) -> int:
    bits &= ALL_BITS
    return bits - (1 << 32) if bits >= 1 << 31 else bits


def _window(name: str, lo: int, hi: int) -> str:
    if lo == hi:
        return f"{name} {lo}"
    if hi >= MAX_INT:
        return f"{name}s {lo}+"
    return f"{name}s {lo}-{hi}"


def _bits(name: str, mask: int) -> str:
    """'rank 1', 'ranks 0-2', 'lanes 0, 3, 5' for the set bits of a 32-bit mask."""
    on = [i for i in range(32) if mask >> i & 1]
    if not on:
        return f"no {name}"
    if len(on) == 1:
        return f"{name} {on[0]}"
    if on == list(range(on[0], on[-1] + 1)):
        return f"{name}s {on[0]}-{on[-1]}"
    return f"{name}s " + ", ".join(map(str, on))


def table_bytes(rules: Sequence[Rule], n_positions: int) -> bytes:
    """The device table: one row per position (a position with no rule has delay 0)."""
    rows = [Rule(0, 0).row()] * max(n_positions, 1)
    for r in rules:
        if not 0 <= r.position < n_positions:
            raise PerturbError(
                f"rule for position {r.position}: the kernel has positions 0..{n_positions - 1}"
            )
        rows[r.position] = r.row()
    return b"".join(struct.pack(f"<{ROW_WORDS}i", *row) for row in rows)


def validate_rules(rules: Sequence[Rule]) -> None:
    seen = set()
    for r in rules:
        if r.position in seen:
            raise PerturbError(f"two rules for position {r.position}: one rule per position")
        seen.add(r.position)
        if not 0 <= r.delay_ns <= 10_000_000:
            raise PerturbError(f"rule delay_ns {r.delay_ns}: allowed 0..10000000 (10 ms)")
        if any(not -(1 << 31) <= w < 1 << 31 for w in r.row()):  # a hand-edited replay rule
            raise PerturbError(f"rule {r.to_json()}: every field must fit a 32-bit int")
        if r.cta_mod < 1 or not 0 <= r.cta_rem < r.cta_mod:
            raise PerturbError(
                f"rule cta_mod {r.cta_mod}, cta_rem {r.cta_rem}: need cta_mod >= 1 and "
                "0 <= cta_rem < cta_mod"
            )


# ---- scopes: which CTAs / warps / lanes / iterations a rule reaches ---------------------------

SCOPE_KEYS = ("rank", "cta", "warp", "warpgroup", "lane", "iter", "stage")


def parse_scope(text: str | None) -> dict[str, int]:
    """``"rank=1 warp=0 lane=nonelected iter=3-"`` -> the Rule fields it fixes.

    rank=R[,R..] (cluster ranks), cta=N | N-M | odd | even, warp=N | N-M, warpgroup=G (warps
    4G..4G+3), lane=N | N-M | nonelected (lanes 1-31), iter=N | N- | N-M, stage=N."""
    out: dict[str, int] = {}
    for item in (text or "").replace(";", " ").split():
        key, sep, val = item.partition("=")
        if not sep or key not in SCOPE_KEYS or not val:
            raise PerturbError(
                f"perturbation scope {item!r}: expected KEY=VALUE with KEY one of "
                f"{', '.join(SCOPE_KEYS)} (e.g. 'rank=1 warp=0 lane=nonelected iter=3-')"
            )
        try:
            out.update(_scope_item(key, val))
        except ValueError:
            raise PerturbError(
                f"perturbation scope {item!r}: {key} takes {_SCOPE_FORMS[key]}"
            ) from None
    return out


_SCOPE_FORMS = {
    "rank": "cluster ranks 0..31, comma-separated (rank=1, rank=0,2)",
    "cta": "a CTA id, a range N-M, odd or even",
    "warp": "a warp id or a range N-M",
    "warpgroup": "a warpgroup id (warps 4G..4G+3)",
    "lane": "a lane 0..31, a range N-M (within 0..31) or nonelected",
    "iter": "an iteration N, N- (N and after) or N-M",
    "stage": "a stage index >= 0",
}


def _range(val: str, open_end: bool = False) -> tuple[int, int]:
    lo, dash, hi = val.partition("-")
    a = int(lo)
    b = (MAX_INT if open_end and not hi else int(hi)) if dash else a
    if a < 0 or b < a:
        raise ValueError(val)
    return a, b


def _scope_item(key: str, val: str) -> dict[str, int]:
    if key == "rank":
        ranks = [int(v) for v in val.split(",")]
        if not all(0 <= r < 32 for r in ranks):
            raise ValueError(val)
        return {"ranks": sum(1 << r for r in set(ranks))}
    if key == "cta":
        if val in ("odd", "even"):
            return {"cta_mod": 2, "cta_rem": int(val == "odd")}
        lo, hi = _range(val)
        return {"cta_lo": lo, "cta_hi": hi}
    if key == "warp":
        lo, hi = _range(val)
        return {"warp_lo": lo, "warp_hi": hi}
    if key == "warpgroup":
        g = int(val)
        if g < 0:
            raise ValueError(val)
        return {"warp_lo": WARPGROUP * g, "warp_hi": WARPGROUP * g + WARPGROUP - 1}
    if key == "lane":
        if val == "nonelected":
            return {"lanes": NON_ELECTED}
        lo, hi = _range(val)
        if hi > 31:
            raise ValueError(val)
        return {"lanes": sum(1 << i for i in range(lo, hi + 1))}
    if key == "iter":
        lo, hi = _range(val, open_end=True)
        return {"it_lo": lo, "it_hi": hi}
    st = int(val)
    if st < 0:
        raise ValueError(val)
    return {"stage": st}


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the host knows of the launch (the trace's ``launch`` call; None: not static)."""

    ctas: int | None = None
    warps: int | None = None
    cluster: int | None = None
    iterations: int | None = None


def scope_misses(keys: dict[str, int], shape: Shape) -> str | None:
    """Why fixed keys select no thread of this launch (a rank, warp or CTA it does not have),
    or None. A rule with such keys is a delay that never happens: a run under it would be
    reported as if its schedule had been tried."""
    n = shape.cluster
    if n and not keys.get("ranks", ALL_BITS) & ((1 << min(n, 32)) - 1):
        return f"its clusters have {n} CTA(s): ranks 0..{n - 1}"
    if shape.warps and keys.get("warp_lo", 0) >= shape.warps:
        return f"its CTAs have {shape.warps} warp(s): 0..{shape.warps - 1}"
    if shape.ctas:
        lo, hi = keys.get("cta_lo", 0), min(keys.get("cta_hi", MAX_INT), shape.ctas - 1)
        mod, rem = keys.get("cta_mod", 1), keys.get("cta_rem", 0)
        if not any(c % mod == rem for c in range(lo, min(hi, lo + mod - 1) + 1)):
            return f"it has {shape.ctas} CTA(s): 0..{shape.ctas - 1}"
    return None


def _draw_scope(rng: random.Random, shape: Shape, iterates: bool) -> dict[str, int]:
    """Random keys for one rule: about half the rules reach a subset of CTAs (one cluster
    rank, all ranks but one, a parity or a window of CTAs), a third a subset of warps (warp
    0, the one that initialises the barriers; another single warp; one warpgroup), one in
    seven the non-elected lanes only; a position with a pipeline state also gets an
    iteration window half the time (a third of those open-ended: from k-tile N on)."""
    out: dict[str, int] = {}
    ctas, warps, cluster = shape.ctas or 1, shape.warps or 1, shape.cluster or 1
    if rng.random() < 0.5:
        kind = rng.random()
        if cluster > 1 and kind < 0.6:
            r = rng.randrange(cluster)
            every = (1 << cluster) - 1
            out["ranks"] = 1 << r if rng.random() < 0.5 else every & ~(1 << r)
        elif ctas > 1 and kind < 0.8:
            out.update(cta_mod=2, cta_rem=rng.randrange(2))
        elif ctas > 1:
            lo = rng.randrange(ctas)
            out.update(cta_lo=lo, cta_hi=min(ctas - 1, lo + rng.randrange(max(ctas // 4, 1))))
    if warps > 1 and rng.random() < 0.35:
        kind = rng.random()
        if kind < 0.4:
            out.update(warp_lo=0, warp_hi=0)
        elif kind < 0.7 or warps < 2 * WARPGROUP:
            w = rng.randrange(warps)
            out.update(warp_lo=w, warp_hi=w)
        else:
            g = rng.randrange(warps // WARPGROUP)
            out.update(warp_lo=WARPGROUP * g, warp_hi=WARPGROUP * g + WARPGROUP - 1)
    if rng.random() < 1 / 7:
        out["lanes"] = NON_ELECTED
    if iterates and rng.random() < 0.5:
        iters = max(int(shape.iterations or 8), 1)
        lo = rng.randrange(iters)
        hi = MAX_INT if rng.random() < 1 / 3 else lo + rng.randrange(max(iters // 2, 1))
        out.update(it_lo=lo, it_hi=hi)
    return out


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
    # the keys every rule of the policy takes (parse_scope); random draws the others
    scope: str | None = None

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise PerturbError(f"--policy {self.name!r}: allowed {', '.join(POLICIES)}")
        if not 0.0 < self.density <= 1.0:
            raise PerturbError(f"perturbation density {self.density}: allowed (0, 1]")
        if self.name == "role" and self.role not in ("producer", "consumer", "any"):
            raise PerturbError(f"--policy role needs role=producer|consumer|any, got {self.role!r}")
        if self.delay_us is not None and not 0 < self.delay_us <= 10_000:
            raise PerturbError(f"perturbation delay {self.delay_us} us: allowed (0, 10000]")
        parse_scope(self.scope)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def rules_for(
    policy: Policy,
    seed: int,
    positions: Sequence[Position],
    ctas: int | None = None,
    iterations: int | None = None,
    warps: int | None = None,
    cluster: int | None = None,
) -> list[Rule]:
    """The rules a seed gives under a policy; the same (policy, seed, positions, shape) ->
    the same rules.

    ``ctas`` / ``iterations`` / ``warps`` / ``cluster`` (when known) bound the random keys so
    that they hit: a rank subset needs a cluster, a warp subset the warps of the block.
    """
    if not positions:
        return []
    rng = random.Random(f"{policy.name}:{seed}")
    shape = Shape(ctas, warps, cluster, iterations)
    fixed = parse_scope(policy.scope)
    if (why := scope_misses(fixed, shape)) is not None:
        raise PerturbError(
            f"perturbation scope {policy.scope!r} selects no thread of this launch: {why}"
        )
    # iter= / stage= key a pipeline state: a position without one (create, a raw barrier op)
    # runs its delay at stage 0, count 0, so under them it is left out, never given a rule
    # that cannot fire
    state_keys = sorted({"iter" if k.startswith("it_") else k for k in fixed} & {"iter", "stage"})

    def keyed(p: Position) -> bool:
        return p.iterates or not state_keys

    if policy.name == "targeted":
        target = policy.target if policy.target is not None else seed % len(positions)
        if not 0 <= target < len(positions):
            raise PerturbError(
                f"targeted position {target}: the kernel has positions 0..{len(positions) - 1}"
            )
        if not keyed(positions[target]):
            raise PerturbError(
                f"perturbation scope {policy.scope!r}: {' and '.join(state_keys)} need a "
                f"position with a pipeline state; position {target} "
                f"({positions[target].label}) has none"
            )
        us = policy.delay_us or SWEEP_US[seed % len(SWEEP_US)]
        return [Rule(positions[target].id, int(us * 1000), **fixed)]
    if policy.name == "role":
        us = policy.delay_us or DELAYS_US[seed % len(DELAYS_US)]
        out = [
            Rule(p.id, int(us * 1000), **fixed)
            for p in positions
            if (policy.role == "any" or p.role == policy.role) and keyed(p)
        ]
        if not out:
            have = sorted({p.role for p in positions if keyed(p)})
            raise PerturbError(
                f"--policy role {policy.role}: no position of that role"
                + (" with a pipeline state" if state_keys else "")
                + f" in this kernel (roles there: {', '.join(have) or 'none'})"
            )
        return out
    eligible = [p for p in positions if keyed(p)]
    if not eligible:
        raise PerturbError(
            f"perturbation scope {policy.scope!r}: {' and '.join(state_keys)} need a position "
            "with a pipeline state; this kernel has none"
        )
    out = []
    for p in positions:
        if rng.random() >= policy.density or not keyed(p):
            continue
        us = policy.delay_us or rng.choice(DELAYS_US)
        keys = {**_draw_scope(rng, shape, p.iterates), **fixed}
        out.append(Rule(p.id, int(us * 1000), **keys))
    if not out:  # a seed always perturbs something
        p = eligible[rng.randrange(len(eligible))]
        out.append(Rule(p.id, int((policy.delay_us or rng.choice(DELAYS_US)) * 1000), **fixed))
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
    rule: Rule,
    fails: Callable[[Rule], bool],
    ctas: int | None,
    iterations: int | None,
    warps: int | None = None,
    iterates: bool = True,
) -> Rule:
    """Halve a failing rule's iteration, CTA and warp windows while it keeps failing (an
    open window is first bounded by the launch shape where it is known)."""
    cache: dict[Rule, bool] = {}

    def test(r: Rule) -> bool:
        if r not in cache:
            cache[r] = fails(r)
        return cache[r]

    for lo_f, hi_f, bound in (
        ("it_lo", "it_hi", iterations),
        ("cta_lo", "cta_hi", ctas),
        ("warp_lo", "warp_hi", warps),
    ):
        if lo_f == "it_lo" and not iterates:  # no pipeline state there: nothing to narrow
            continue
        lo, hi = getattr(rule, lo_f), getattr(rule, hi_f)
        if bound:
            hi = min(hi, int(bound) - 1)
        elif lo_f == "warp_lo":  # warps unknown: kept (31 halvings of 2**31 would say little)
            continue
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
    if rule.cta_lo == rule.cta_hi and rule.cta_lo % rule.cta_mod == rule.cta_rem:
        rule = dataclasses.replace(rule, cta_mod=1, cta_rem=0)  # one CTA: its residue is moot
    return rule


def shrink(
    rules: list[Rule],
    fails: Callable[[list[Rule]], bool],
    ctas: int | None = None,
    iterations: int | None = None,
    warps: int | None = None,
    positions: dict[int, Position] | None = None,
) -> list[Rule]:
    """A minimal failing rule set: ddmin over the rules, then each rule's windows narrowed
    (``positions``, by id: an iteration window only where the position has a state)."""
    minimal = ddmin(list(rules), fails)
    out = list(minimal)
    for i, r in enumerate(minimal):

        def one(candidate: Rule, i: int = i) -> bool:
            return fails(out[:i] + [candidate] + out[i + 1 :])

        pos = (positions or {}).get(r.position)
        out[i] = narrow(r, one, ctas, iterations, warps, pos is None or pos.iterates)
    return out
