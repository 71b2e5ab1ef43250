"""Warp roles by warp branch, for printf-bisection's sites (cutedebug.instrument.checkpoint):
a role function left with its function name (no pipeline role of its own, or a name taken
twice) takes the pipeline role the kernel-body branch it is called in plays first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def names_by_warp_branch(
    sites: Sequence[Any],
    groups: Sequence[tuple | None],
    names: dict[tuple, str],
    body_arms: Callable[[Any], list[tuple]],
    role_of_op: Callable[[str], str],
) -> dict[tuple, str]:
    """A role function left with its function name (it plays no pipeline role, or its role's
    name was taken twice) that the kernel calls inside one warp branch (a dynamic ``if`` arm of
    the kernel body) takes the pipeline role that branch plays first, when no other branch
    plays that role first: quack's GEMM calls its epilogue (named barriers, a TMA-store
    producer) in the consumer warps' branch after the mainloop, which is that branch's
    consumer; its producer branch's ``load_tma`` is the producer."""
    branch_of: dict[tuple, set[tuple]] = {}
    for s, g in zip(sites, groups):
        if g is not None:
            arms = body_arms(s)
            branch_of.setdefault(g, set()).add(arms[-1] if arms else None)
    first: dict[tuple, str] = {}  # branch -> the pipeline role of its first pipeline site
    for s, g in sorted(zip(sites, groups), key=lambda sg: sg[0].id):
        if g is None or s.kind != "pipeline":
            continue
        (branch,) = branch_of[g] if len(branch_of[g]) == 1 else (None,)
        if branch is not None and branch not in first:
            first[branch] = role_of_op(s.op)
    played = list(first.values())
    out = dict(names)
    for g, name in names.items():
        if name in ("producer", "consumer") or len(branch_of.get(g, ())) != 1:
            continue
        (branch,) = branch_of[g]
        role = first.get(branch)
        if role is not None and played.count(role) == 1:
            out[g] = role
    return out
