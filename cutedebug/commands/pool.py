"""`cutedebug pool start|status|stop`: the warm pool (cutedebug/engine/pool.py), a resident
fork server that `cutedebug run` reuses across invocations.

    cutedebug pool start [--idle SECONDS] [TARGET ...] [--module NAME ...]
                                            start this environment's server (or keep the running
                                            one); it imports the libraries of the TARGET scenarios
                                            (requires.modules) and each NAME now, ahead of the runs
    cutedebug pool status [--json]          every server: pid, key, this environment's or not, runs
    cutedebug pool stop [--all]             stop this environment's server (--all: every one,
                                            and the files of servers that exited when idle)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

from cutedebug.commands import exits
from cutedebug.engine import pool, preloads
from cutedebug.engine import scenario as S
from cutedebug.engine.forkserver import ForkServerError
from cutedebug.errors import UsageError


def _idle(text: str) -> float:
    try:
        return pool.idle_seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def cmd_start(args: argparse.Namespace) -> int:
    try:
        d = pool.pool_dir()
        paths = pool.Paths.of(d, pool.key_of(pool.fingerprint()))  # socket path not too long
        pool.idle_seconds(args.idle)  # --idle is checked already; CUTEDEBUG_POOL_IDLE_S here
    except (pool.PoolError, ValueError) as e:
        raise UsageError(str(e)) from None
    modules = libraries(args.targets, args.module)  # bad input refused before any start
    c = pool.client(start=True, idle_s=args.idle)
    if c is None:
        print(f"cutedebug pool: no server could be started (log: {paths.log})")
        return exits.EXIT_HARNESS
    said = None
    try:
        said = c.preload_modules(modules) if modules else None
    except ForkServerError as e:
        said = {"preload": f"off: {e}"}
    info = c.info
    c.close()
    meta = pool.read_meta(c.paths.meta) or {}
    if info["started_now"]:
        print(
            f"pool: started server {info['pid']} for this environment (key {info['key']}) in "
            f"{info['connect_s']:.1f} s; it exits after {meta.get('idle_s', c.idle_s):g} s "
            f"without a run; stop it with `cutedebug pool stop`"
        )
    else:
        print(
            f"pool: server {info['pid']} already runs for this environment (key {info['key']}, "
            f"exits after {meta.get('idle_s', '?')} s without a run)"
        )
    if said is not None:
        print(f"  {preloads.summary(said)}")
    print(f"  log: {c.paths.log}")
    # a module asked for that does not import here is the caller's to fix (the server runs)
    return exits.EXIT_USAGE if said and said.get("failed") else exits.EXIT_OK


def libraries(targets: list[str], names: list[str]) -> list[str]:
    """The library modules of the scenario files or folders ``targets`` (requires.modules and
    their kernel files' imports from them) and the modules ``names``; UsageError for a target
    that is not a scenario or a name that is not a module name."""
    scenarios = []
    for target in targets:
        if not (target.endswith(".toml") or Path(target).is_dir()):
            raise UsageError(
                f"pool start: {target}: not a scenario file or folder (a TOML file or a "
                "folder of them); a kernel file's libraries go with --module NAME"
            )
        try:
            files = S.discover(Path(target))
            if not files:
                raise UsageError(f"pool start: {target}: no scenario files (*.toml) found")
            scenarios += [S.load(f) for f in files]
        except S.ScenarioError as e:
            raise UsageError(str(e)) from None
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise UsageError(f"pool start: --module {name!r} is not a Python module name")
    return list(dict.fromkeys(preloads.modules_of_scenarios(scenarios) + list(names)))


def cmd_status(args: argparse.Namespace) -> int:
    if not pool.pool_dir_path().is_dir():  # never used here: nothing to list, nothing made
        print("[]" if args.json else f"pool: no server running (folder {pool.pool_dir_path()})")
        return exits.EXIT_OK
    try:
        rows = pool.servers()
    except pool.PoolError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print(json.dumps(rows, indent=1))
        return exits.EXIT_OK
    if not rows:
        print(f"pool: no server running (folder {pool.pool_dir()})")
        return exits.EXIT_OK
    now = time.time()
    for r in rows:
        state = "answers" if r["answers"] else ("alive, not answering" if r["alive"] else "dead")
        if r.get("retired"):
            state += f"; retired ({r['retired']}), exits when its last command is done"
        age = now - float(r.get("started") or now)
        print(
            f"pool: server {r.get('pid')} key {r['key']} "
            f"{'(this environment)' if r['this_env'] else '(another environment)'}: {state}; "
            f"{r.get('runs') if r.get('runs') is not None else '?'} run(s), up {age:.0f} s, "
            f"exits after {r.get('idle_s', '?')} s without a run; {r.get('python')}"
        )
        if r.get("spare") is not None or r.get("compiled") is not None:
            print(f"  spare worker: {r.get('spare')}; compile cache: {r.get('compiled')} entries")
        print(f"  log: {r['log']}")
    return exits.EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    if not pool.pool_dir_path().is_dir():
        print("pool: no server running" + ("" if args.all else " for this environment"))
        return exits.EXIT_OK
    try:
        if args.all:
            keys = [r["key"] for r in pool.servers()]
        else:
            keys = [pool.key_of(pool.fingerprint())]
    except pool.PoolError as e:
        raise UsageError(str(e)) from None
    status = exits.EXIT_OK
    stopped = 0
    for key in keys:
        try:
            res = pool.stop(key)
        except pool.PoolError:  # a folder too long for a socket path holds no server
            continue
        if res["how"] == "not running":
            continue
        stopped += 1
        left = res["left"]
        print(
            f"pool: {res['how']} server {res['pid']} (key {key}); "
            f"{len(left)} process(es) left" + (f": {left}" if left else "")
        )
        if left:
            status = exits.EXIT_HARNESS
    if not stopped:
        print("pool: no server running" + ("" if args.all else " for this environment"))
    if args.all:
        with contextlib.suppress(pool.PoolError):
            pool.tidy()  # the locks and logs of servers that exited when idle
    return status


def add_parser(sub) -> None:
    p = sub.add_parser(
        "pool",
        help="the warm pool: a resident fork server `cutedebug run` reuses",
        description=__doc__.split("\n\n")[0],
        epilog=exits.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = p.add_subparsers(dest="verb", required=True)
    s = verbs.add_parser("start", help="start this environment's server (or keep the running one)")
    s.add_argument(
        "--idle",
        type=_idle,
        default=None,
        metavar="SECONDS",
        help=f"exit after this long without a run (default {pool.DEFAULT_IDLE_S:g}, "
        f"or {pool.IDLE_VAR}; at most {pool.MAX_IDLE_S:g})",
    )
    s.add_argument(
        "targets",
        nargs="*",
        metavar="TARGET",
        help="scenario files or folders whose libraries (requires.modules) the server imports "
        "now, so that no run pays for them",
    )
    s.add_argument(
        "--module",
        action="append",
        default=[],
        metavar="NAME",
        help="a library module the server imports now (your kernel's, e.g. quack.gemm); repeatable",
    )
    s.set_defaults(func=cmd_start)
    st = verbs.add_parser("status", help="list the running servers")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)
    sp = verbs.add_parser("stop", help="stop this environment's server")
    sp.add_argument("--all", action="store_true", help="stop every server of this user")
    sp.set_defaults(func=cmd_stop)
