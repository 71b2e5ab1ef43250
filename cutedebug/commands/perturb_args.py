"""``--perturb N [--policy P] [--seed S] [--replay S] [--shrink] ...``: options shared by ``run``
and ``triage``, validated here (exit 2 with the option, the value and what is allowed)."""

from __future__ import annotations

import argparse
from typing import Any

from cutedebug.errors import UsageError
from cutedebug.instrument.perturb_plan import POLICIES, PerturbError, Policy

MAX_SEEDS = 4096


def _ranged(convert, ok, not_a_number: str, out_of_range: str):
    """An argparse type: ``convert`` the text, then ``ok`` it; each failure an
    ArgumentTypeError naming the value and what is allowed ({} is the text / the value)."""

    def parse(text: str):
        try:
            x = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(not_a_number.format(repr(text))) from None
        if not ok(x):  # a comparison with nan is False: refused too
            raise argparse.ArgumentTypeError(out_of_range.format(x))
        return x

    return parse


_seeds = _ranged(
    int,
    lambda n: 1 <= n <= MAX_SEEDS,
    f"{{}}: a whole number of seeds, 1..{MAX_SEEDS}",
    f"{{}}: allowed 1..{MAX_SEEDS}",
)
_seed = _ranged(
    int,
    lambda n: 0 <= n < 2**31,
    "{}: a seed is a whole number >= 0",
    f"{{}}: allowed 0..{2**31 - 1}",
)
_density = _ranged(
    float, lambda x: 0.0 < x <= 1.0, "{}: a fraction in (0, 1]", "{}: allowed (0, 1]"
)
_delay = _ranged(
    float,
    lambda x: 0.0 < x <= 10_000.0,
    "{}: microseconds, (0, 10000]",
    "{}: allowed (0, 10000] microseconds",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("schedule perturbation (delays at protocol positions, by seed)")
    g.add_argument(
        "--perturb",
        type=_seeds,
        metavar="N",
        help="run N seeded schedules after one compile; any non-PASS exposes a bug",
    )
    g.add_argument(
        "--policy",
        choices=POLICIES,
        default="random",
        help="random (seeded subsets of positions), targeted (one position, the seed "
        "picks the delay of a sweep) or role (one role slower throughout)",
    )
    g.add_argument("--seed", type=_seed, default=0, help="first seed (seeds S..S+N-1)")
    g.add_argument("--replay", type=_seed, metavar="SEED", help="run exactly this seed again")
    g.add_argument(
        "--shrink",
        action="store_true",
        help="reduce an exposing seed's delays to a minimal set (delta debugging)",
    )
    g.add_argument(
        "--perturb-density",
        type=_density,
        default=0.5,
        help="random: the share of positions a seed delays (default 0.5)",
    )
    g.add_argument(
        "--perturb-role",
        choices=("producer", "consumer", "any"),
        help="role policy: the role slowed down (any: every position, e.g. with a scope)",
    )
    g.add_argument(
        "--perturb-scope",
        metavar="KEYS",
        help="the threads every delay reaches, e.g. 'rank=1' (one CTA of each cluster), "
        "'warp=0', 'warpgroup=1', 'lane=nonelected', 'cta=odd', 'iter=3-' (space-separated; "
        "random draws the keys not given)",
    )
    g.add_argument(
        "--perturb-target",
        type=_seed,
        metavar="POSITION",
        help="targeted policy: the position swept (default: seed mod positions)",
    )
    g.add_argument(
        "--perturb-delay-us",
        type=_delay,
        metavar="US",
        help="a fixed delay instead of the policy's choice",
    )


def request_field(args: argparse.Namespace) -> dict[str, Any] | None:
    """The worker request's ``perturb`` field, or None when not asked for."""
    n = getattr(args, "perturb", None)
    replay = getattr(args, "replay", None)
    if n is None and replay is None:
        if getattr(args, "shrink", False):
            raise UsageError("--shrink needs --perturb N or --replay SEED")
        return None
    try:
        policy = Policy(
            args.policy,
            density=args.perturb_density,
            target=args.perturb_target,
            role=args.perturb_role,
            delay_us=args.perturb_delay_us,
            scope=getattr(args, "perturb_scope", None),
        )
    except PerturbError as e:
        raise UsageError(str(e)) from None
    return {
        "n": n or 1,
        "seed": args.seed,
        "replay": replay,
        "shrink": bool(args.shrink),
        "policy": policy.to_json(),
    }
