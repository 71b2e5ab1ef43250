"""Which racecheck hazards a cutlass.pipeline orders: the reading side inside a consumer's
``consumer_wait .. consumer_release`` of a pipeline, the writing side inside its producer's
``producer_acquire .. producer_commit``, in the same Python function (the kernel's or a
library helper's, e.g. quack's tile scheduler).

Such accesses cannot overlap when the pipeline's protocol holds: a write waits (acquire, on the
empty barrier) for every consumer's release of the stage, which comes after their reads (WAR);
a read waits (consumer_wait, on the full barrier) for the producer's commit, which comes after
its writes (RAW); two producer writes to a stage are a consumer round apart (WAW). racecheck
does not credit mbarrier arrive / wait ordering (on the H200 a correct mbarrier hand-off gave
102 WAR hazards: tools/sanitizer_samples/mbarrier_handoff.py), so it reports them anyway.

What the rule takes for granted, as the protocol lint and the fault catalogue check apart: the
accesses index the stage of the state they waited on / acquired, and the pipeline's arrive
counts are right. Only pipelines whose release and commit arrive for every calling thread
are credited (cutlass.pipeline.PipelineAsync; a TMA pipeline's commit is a no-op and its release
comes from one elected lane), and only when the closing op (release / commit) is in no `if`
branch the access is not in: a release under `if lane == 0` does not order the other lanes'
reads.

The op lines are the recorder's protocol sites: the kernel's call site of each op and, for an
op called inside a helper, the helper's own line (``via``, basename:line).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from cutedebug.analyses.sanitizer.findings import (
    RAW_HAZARD,
    WAR_HAZARD,
    WAW_HAZARD,
    Finding,
    enclosing_def,
)

Reader = Callable[[str | None, int | None], str | None]

READ_SPAN = ("consumer_wait", "consumer_release")
WRITE_SPAN = ("producer_acquire", "producer_commit")
ORDERED_KINDS = (RAW_HAZARD, WAR_HAZARD, WAW_HAZARD)
REACH = 800  # lines above an access searched for its `def` (a kernel body is long)


def op_lines(sites: Iterable[dict[str, Any]] | None) -> list[tuple[str, str, str, int]]:
    """(pipeline, op, file basename, line) of each pipeline op site, its ``via`` line too."""
    out = []
    for s in sites or []:
        pipe, op = s.get("pipeline"), s.get("op")
        if not pipe or op not in READ_SPAN + WRITE_SPAN:
            continue
        if s.get("file") and s.get("line"):
            out.append((pipe, op, os.path.basename(s["file"]), int(s["line"])))
        via = s.get("via")
        if isinstance(via, str) and ":" in via:
            name, _, line = via.rpartition(":")
            if line.isdigit():
                out.append((pipe, op, name, int(line)))
    return out


# The pipeline classes whose consumer_release and producer_commit arrive for every thread that
# calls them (cutlass.pipeline.PipelineAsync: no signalling-thread predicate, no transaction
# bytes). The TMA / UMMA pipelines arrive from one elected thread (a warp's other lanes need
# their own sync first) or by bytes; a library's subclass may change either: not credited.
THREAD_ARRIVE_CLASSES = ("PipelineAsync",)


def _thread_arrive(pipeline: str) -> bool:
    return pipeline.split("#", 1)[0] in THREAD_ARRIVE_CLASSES


@lru_cache(maxsize=64)
def _branches(path: str) -> tuple[tuple[int, int, int], ...]:
    """(id, first line, last line) of each branch of each `if` statement in a source file
    (the body and the else part are two branches); () when it cannot be parsed."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return ()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            for part in (node.body, node.orelse):
                if part:
                    out.append((len(out), part[0].lineno, part[-1].end_lineno or part[-1].lineno))
    return tuple(out)


def _within(path: str | None, line: int) -> frozenset[int] | None:
    if not path or not os.path.isfile(path):
        return None
    return frozenset(i for i, a, b in _branches(path) if a <= line <= b)


def _no_narrower(path: str | None, op_line: int, access_line: int) -> bool:
    """Whether every `if` branch the op is in also holds the access: the threads that made
    the access all reach the op (a release under `if lane == 0` does not order other lanes'
    reads). False when the file cannot be read."""
    op, acc = _within(path, op_line), _within(path, access_line)
    return op is not None and acc is not None and op <= acc


def guarding(
    file: str | None,
    line: int | None,
    access: str | None,
    ops: Sequence[tuple[str, str, str, int]],
    read_raw: Reader,
) -> set[str]:
    """The pipelines whose span (by the access's kind) encloses ``file:line`` in its function."""
    if not file or not line or access not in ("Read", "Write"):
        return set()
    name = enclosing_def(file, line, read_raw, REACH)
    if name is None:
        return set()
    base = os.path.basename(file)
    opens, closes = READ_SPAN if access == "Read" else WRITE_SPAN

    def same_def(at: int) -> bool:
        return enclosing_def(file, at, read_raw, REACH) == name

    out = set()
    for pipe in {p for p, _, b, _ in ops if b == base}:
        if not _thread_arrive(pipe):
            continue
        here = [(op, at) for p, op, b, at in ops if p == pipe and b == base]
        before = any(op == opens and at < line and same_def(at) for op, at in here)
        after = any(
            op == closes and at > line and same_def(at) and _no_narrower(file, at, line)
            for op, at in here
        )
        if before and after:
            out.add(pipe)
    return out


def pipeline_order(
    f: Finding, ops: Sequence[tuple[str, str, str, int]], read_raw: Reader
) -> str | None:
    """The pipeline that orders both sides of a shared-memory hazard, said in words; None when
    the hazard is not one this rule can credit."""
    if f.kind not in ORDERED_KINDS or f.address_space not in (None, "shared"):
        return None
    if len(f.sites) != 2 or not ops:
        return None
    sets = [guarding(s.file, s.line, s.access, ops, read_raw) for s in f.sites]
    common = sets[0] & sets[1]
    if not common:
        return None
    pipe = sorted(common)[0]
    sides = ", ".join(
        f"{(s.access or '?').lower()} at {os.path.basename(s.file or '?')}:{s.line} inside "
        + (
            "consumer_wait..consumer_release"
            if s.access == "Read"
            else "producer_acquire..producer_commit"
        )
        for s in f.sites
    )
    return f"{pipe}: {sides}"


def order_checker(
    sites: Iterable[dict[str, Any]] | None, read_raw: Reader
) -> Callable[[Finding], str | None] | None:
    """The check ``filter_noise`` asks of each hazard, for a kernel's recorded protocol sites;
    None when the kernel recorded no pipeline op."""
    ops = op_lines(sites)
    if not ops:
        return None
    read = lru_cache(maxsize=None)(read_raw)  # racecheck repeats a hazard up to 1000 times
    memo: dict[tuple, str | None] = {}

    def check(f: Finding) -> str | None:
        key = (f.kind, f.address_space, tuple((s.file, s.line, s.access) for s in f.sites))
        if key not in memo:
            memo[key] = pipeline_order(f, ops, read)
        return memo[key]

    return check
