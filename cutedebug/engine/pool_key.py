"""The warm pool's key: what a resident server must share with a command to serve it
(:func:`fingerprint`, :func:`key_of`), and what tells an old server from its successor in the
same checkout (:func:`home`, :func:`superseded`). See :mod:`cutedebug.engine.pool`."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from cutedebug.engine import lifeline
from cutedebug.engine.pool_server import POOL_TAG_VAR

DIR_VAR = "CUTEDEBUG_POOL_DIR"
IDLE_VAR = "CUTEDEBUG_POOL_IDLE_S"
WARM_VAR = "CUTEDEBUG_WARM"
REPO_ROOT = Path(__file__).resolve().parents[2]
# Variables that differ between two invocations of the same setup and change nothing a worker
# does (terminal, shell bookkeeping, the harness's own tags and the pool's own settings).
VOLATILE_ENV = frozenset(
    {
        lifeline.RUN_TAG_VAR,
        lifeline.SESSION_VAR,
        POOL_TAG_VAR,
        DIR_VAR,
        IDLE_VAR,
        WARM_VAR,
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "TERM",
        "COLUMNS",
        "LINES",
        "PS1",
        "PROMPT_COMMAND",
        "LS_COLORS",
        "SSH_CLIENT",
        "SSH_CONNECTION",
        "SSH_TTY",
        "TMUX",
        "TMUX_PANE",
        "STY",
        "WINDOWID",
        "TERM_SESSION_ID",
        "XDG_SESSION_ID",
        "PYTEST_CURRENT_TEST",
    }
)
DSL_DIST_GLOB = "nvidia_cutlass_dsl*.dist-info"  # the DSL and its -libs-* parts


def fingerprint(env: dict[str, str] | None = None) -> dict[str, Any]:
    """What a server must share with a command to serve it (see the module docstring)."""
    env = dict(os.environ if env is None else env)
    sources = hashlib.sha256()
    pkg = REPO_ROOT / "cutedebug"
    for path in sorted(pkg.rglob("*.py")):
        st = path.stat()
        sources.update(f"{path.relative_to(pkg)} {st.st_size} {st.st_mtime_ns}\n".encode())
    dists = {}
    for entry in sys.path:  # the DSL's and torch's install records, in import order
        if not os.path.isdir(entry):
            continue
        for pattern in (DSL_DIST_GLOB, "torch-*.dist-info"):
            for where in sorted(Path(entry).glob(pattern)):
                name = where.name.split("-")[0]
                dists.setdefault(name, [where.name, str(where), where.stat().st_mtime_ns])
    kept = sorted((k, v) for k, v in env.items() if k not in VOLATILE_ENV)
    try:
        from importlib.util import find_spec

        cutlass = getattr(find_spec("cutlass"), "origin", None)  # where, without importing it
    except (ImportError, ValueError):
        cutlass = None
    return {
        "python": os.path.realpath(sys.executable),
        "version": sys.version,
        "prefix": sys.prefix,
        "repo": str(REPO_ROOT),
        "sources": sources.hexdigest()[:16],
        "dists": dists,
        "cutlass": cutlass,
        "env": hashlib.sha256(json.dumps(kept).encode()).hexdigest()[:16],
    }


HOME_FIELDS = ("repo", "python", "prefix")  # what makes two servers the same place
CODE_FIELDS = ("sources", "dists")  # what only moves forward there (edits, upgrades)


def home(fp: dict[str, Any]) -> dict[str, Any]:
    """What a server records of the place it serves and the code it loaded: two servers with
    the same place and other code are an old one and its successor."""
    return {k: fp.get(k) for k in HOME_FIELDS + CODE_FIELDS}


def superseded(meta: dict[str, Any], current: dict[str, Any]) -> bool:
    """Is the server of ``meta`` one that no command can use again: same checkout and
    interpreter as ``current`` (a :func:`home`), other sources or installs? A server from
    before homes were recorded, or of another place, is never judged superseded."""
    h = meta.get("home")
    if not isinstance(h, dict) or not all(h.get(k) for k in HOME_FIELDS + CODE_FIELDS):
        return False
    same_place = all(h.get(k) == current.get(k) for k in HOME_FIELDS)
    return same_place and any(
        json.dumps(h.get(k), sort_keys=True) != json.dumps(current.get(k), sort_keys=True)
        for k in CODE_FIELDS
    )


def key_of(fp: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]
