"""``--perturb N [--policy P] [--seed S] [--replay S [--replay-from F]] [--shrink] ...``: options
shared by ``run`` and ``triage``, validated here (exit 2 with the option, the value and what is
allowed); and the exact command that replays a perturbed run's exposure (``replay_command``),
which its report prints.

The seeds of ``--perturb N`` run in one process after one compile, each after the launches of
the seeds before it; a failure can need them (what they left in shared memory or barrier
words). ``--replay SEED`` runs the seed alone in a fresh worker; ``--replay SEED --replay-from
FIRST`` runs FIRST..SEED in one worker, in order, as the exposing run did."""

from __future__ import annotations

import argparse
import shlex
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
    g.add_argument(
        "--replay",
        type=_seed,
        metavar="SEED",
        help="run exactly this seed again (alone, in a fresh worker, unless --replay-from)",
    )
    g.add_argument(
        "--replay-from",
        type=_seed,
        metavar="FIRST",
        help="with --replay SEED: run the seeds FIRST..SEED in one worker, in order, after one "
        "compile, as the run that exposed SEED did (its report prints this command); the "
        "verdict is SEED's, an earlier seed that exposes a failure is reported as itself",
    )
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
    first = getattr(args, "replay_from", None)
    if first is not None:
        if replay is None:
            raise UsageError(
                f"--replay-from {first} needs --replay SEED (it runs the seeds {first}..SEED in "
                "one worker, in order)"
            )
        if first > replay:
            raise UsageError(f"--replay-from {first}: allowed 0..{replay} (at most --replay)")
        if replay - first + 1 > MAX_SEEDS:
            raise UsageError(
                f"--replay-from {first} --replay {replay}: {replay - first + 1} seeds, allowed "
                f"at most {MAX_SEEDS} (--replay-from {replay - MAX_SEEDS + 1}..{replay})"
            )
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
        "replay_from": first,
        "shrink": bool(args.shrink),
        "policy": policy.to_json(),
    }


# ---- the replay command a perturbed run's report prints ------------------------------------

_DEFAULTS = {"name": "random", "density": 0.5}
_POLICY_FLAGS = (  # Policy.to_json key -> the option that sets it
    ("name", "--policy"),
    ("density", "--perturb-density"),
    ("target", "--perturb-target"),
    ("role", "--perturb-role"),
    ("delay_us", "--perturb-delay-us"),
    ("scope", "--perturb-scope"),
)


def _options() -> dict[str, bool]:
    """Every option of the perturbation group -> whether it takes a value."""
    p = argparse.ArgumentParser(add_help=False)
    add_arguments(p)
    return {o: a.nargs != 0 for a in p._actions for o in a.option_strings}


def strip_options(tokens: list[str]) -> list[str]:
    """``tokens`` (a command line) without the perturbation options and their values, also
    as ``--opt=value`` or abbreviated (argparse took an abbreviation only when it named one
    option, and no other option of ``run`` or ``triage`` begins like these)."""
    opts = _options()
    out: list[str] = []
    skip = False
    for tok in tokens:
        if skip:
            skip = False
            continue
        name, eq, _ = tok.partition("=")
        if name.startswith("--") and len(name) > 2:
            hits = [o for o in opts if o == name] or [o for o in opts if o.startswith(name)]
            if hits:
                skip = opts[hits[0]] and not eq
                continue
        out.append(tok)
    return out


def policy_flags(policy: dict[str, Any]) -> list[str]:
    """The options that give ``policy`` (Policy.to_json) again; the defaults left out."""
    out: list[str] = []
    for key, flag in _POLICY_FLAGS:
        value = policy.get(key)
        if value is None or _DEFAULTS.get(key) == value:
            continue
        out += [flag, str(value)]
    return out


def replay_command(base: str, policy: dict[str, Any], seed: int, first: int | None) -> str:
    """The command that replays ``seed``: ``base`` (the run's command line) without its
    perturbation options, the policy's, ``--replay SEED`` and, when seeds FIRST..SEED-1 ran
    before it in the exposing process, ``--replay-from FIRST``."""
    tokens = strip_options(shlex.split(base)) + policy_flags(policy)
    tokens += ["--replay", str(seed)]
    if first is not None and first != seed:
        tokens += ["--replay-from", str(first)]
    return shlex.join(tokens)


def attach_replay(result: Any, request: dict[str, Any] | None) -> None:
    """Put the replay commands of a perturbed run's exposure into its evidence (what its report
    and terminal line print): ``replay_command`` (with the history when there was one) and, then,
    ``replay_alone_command``. ``request``: the run's perturb field (its policy)."""
    p = (getattr(result, "evidence", None) or {}).get("perturbation")
    if not p or p.get("exposed_by") is None or not request:
        return
    from cutedebug.reporting import report

    base = result.command or report.reproduce_command(result)
    policy = p.get("policy") or request.get("policy") or {}
    seed, first = p["exposed_by"], p.get("history_from")
    p["replay_command"] = replay_command(base, policy, seed, first)
    if first is not None:
        p["replay_alone_command"] = replay_command(base, policy, seed, None)
