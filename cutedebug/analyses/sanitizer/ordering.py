"""Which racecheck hazards a cutlass.pipeline orders, from the kernel's recorded protocol.

A WAR hazard (a read, then another thread's write of the same shared memory) is ordered when
the read is followed by a ``consumer_release`` of a pipeline that covers the reading threads
and the write follows that pipeline's ``producer_acquire``: the acquire waits on the empty
barrier the releases arrive on. A RAW hazard (a write, then a read) is ordered when the write
is followed by a covering ``producer_commit`` and the read follows the pipeline's
``consumer_wait``. Each op counts only in the access's own Python function (the kernel's, or a
library helper's: quack's tile scheduler) and only when it sits in no `if` branch the access is
not in (the threads that made the access made the op: a release under `if lane == 0` does not
order the other lanes' reads). racecheck does not credit mbarrier arrive / wait ordering (on
the H200 a correct mbarrier hand-off gave 102 WAR hazards: tools/sanitizer_samples/
mbarrier_handoff.py), so it reports such hazards anyway.

A release / commit covers its callers when it arrives and either syncs the warp before the
arrive (an elected lane then speaks for lanes that are done: quack's elect-one release) or is
cutlass's own PipelineAsync method (every calling thread arrives). A TMA pipeline's release is
one elected lane's without a sync and its commit arrives nowhere: not credited. Two producer
writes (WAW) are not credited.

What the rule takes for granted, as the protocol lint and the fault catalogue check apart: the
accesses index the stage of the state they waited on / acquired, and the arrive counts are
right. The op lines are the recorder's protocol sites: the kernel's call site of each op and,
for an op called inside a helper, the helper's own line (``via``, basename:line).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from cutedebug.analyses.sanitizer.findings import (
    RAW_HAZARD,
    WAR_HAZARD,
    Finding,
    enclosing_def,
)

Reader = Callable[[str | None, int | None], str | None]


@dataclass(frozen=True)
class Op:
    pipeline: str
    op: str
    file: str  # basename
    line: int
    covers: bool  # a release / commit that arrives for every thread that called it


SPAN_OPS = ("consumer_wait", "consumer_release", "producer_acquire", "producer_commit")
ORDERED_KINDS = (RAW_HAZARD, WAR_HAZARD)  # two producer writes (WAW): not credited
REACH = 800  # lines above an access searched for its `def` (a kernel body is long)


def op_lines(sites: Iterable[dict[str, Any]] | None) -> list[Op]:
    """Each pipeline op site at the kernel's call site and at its ``via`` line."""
    out = []
    for s in sites or []:
        pipe, op = s.get("pipeline"), s.get("op")
        if not pipe or op not in SPAN_OPS:
            continue
        covers = _covers(s) if op in ("consumer_release", "producer_commit") else True
        if s.get("file") and s.get("line"):
            out.append(Op(pipe, op, os.path.basename(s["file"]), int(s["line"]), covers))
        via = s.get("via")
        if isinstance(via, str) and ":" in via:
            name, _, line = via.rpartition(":")
            if line.isdigit():
                out.append(Op(pipe, op, name, int(line), covers))
    return out


def _covers(site: dict[str, Any]) -> bool:
    """Whether a release / commit arrives for every thread that called it: it arrives, and
    either syncs the warp before its arrive (an elected lane then speaks for lanes that are
    done) or is cutlass's own PipelineAsync method (every calling thread arrives; a TMA
    pipeline's release is one elected lane's without a sync, its commit arrives nowhere)."""
    if not site.get("arrives"):
        return False
    if "sync_warp" in (site.get("syncs_before") or []):
        return True
    owner, method = str(site.get("owner") or ""), str(site.get("method") or "")
    return owner.startswith("cutlass.") and method.split(".", 1)[0] == "PipelineAsync"


def _branches(text: str) -> tuple[tuple[int, int, int], ...]:
    """(id, first line, last line) of each branch of each `if` statement in a source text
    (the body and the else part are two branches); () when it cannot be parsed."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return ()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            for part in (node.body, node.orelse):
                if part:
                    out.append((len(out), part[0].lineno, part[-1].end_lineno or part[-1].lineno))
    return tuple(out)


class _Source:
    """A source file as the reader sees it (the path as recorded on the GPU machine, found
    under the reader's roots elsewhere): its `if` branches, read once."""

    def __init__(self, read: Reader):
        self.read = read
        self.cache: dict[str, tuple[tuple[int, int, int], ...] | None] = {}

    def branches(self, file: str) -> tuple[tuple[int, int, int], ...] | None:
        if file not in self.cache:
            lines, n = [], 1
            while (text := self.read(file, n)) is not None:
                lines.append(text)
                n += 1
            self.cache[file] = _branches("\n".join(lines) + "\n") if lines else None
        return self.cache[file]

    def within(self, file: str, line: int) -> frozenset[int] | None:
        branches = self.branches(file)
        if branches is None:
            return None
        return frozenset(i for i, a, b in branches if a <= line <= b)

    def no_narrower(self, file: str, op_line: int, access_line: int) -> bool:
        """Whether every `if` branch the op is in also holds the access: the threads that made
        the access all made the op (a release under `if lane == 0` does not order the other
        lanes' reads). False when the file cannot be read."""
        op, acc = self.within(file, op_line), self.within(file, access_line)
        return op is not None and acc is not None and op <= acc


# What each side of a hazard needs from one pipeline, by the hazard's kind and the access:
# (op, "before" / "after" the access, whether that op must cover every caller).
NEEDS = {
    (WAR_HAZARD, "Read"): ("consumer_release", "after"),  # the read is done before the release
    (WAR_HAZARD, "Write"): ("producer_acquire", "before"),  # the write waits for the releases
    (RAW_HAZARD, "Write"): ("producer_commit", "after"),  # the write is done before the commit
    (RAW_HAZARD, "Read"): ("consumer_wait", "before"),  # the read waits for the commits
}


def guarding(
    kind: str,
    file: str | None,
    line: int | None,
    access: str | None,
    ops: Sequence[Op],
    source: _Source,
) -> set[str]:
    """The pipelines whose op (by the hazard's kind and the access) orders ``file:line``."""
    need = NEEDS.get((kind, access or ""))
    if need is None or not file or not line:
        return set()
    name = enclosing_def(file, line, source.read, REACH)
    if name is None:
        return set()
    op_name, side = need
    base = os.path.basename(file)
    out = set()
    for o in ops:
        if o.op != op_name or o.file != base or not o.covers:
            continue
        if (o.line > line) != (side == "after") or o.line == line:
            continue
        if enclosing_def(file, o.line, source.read, REACH) == name and source.no_narrower(
            file, o.line, line
        ):
            out.add(o.pipeline)
    return out


def _said(kind: str, s: Any) -> str:
    op, side = NEEDS[(kind, s.access or "")]
    where = f"{os.path.basename(s.file or '?')}:{s.line}"
    return f"{(s.access or '?').lower()} at {where} {'before' if side == 'after' else 'after'} {op}"


def pipeline_order(
    f: Finding, ops: Sequence[Op], read_raw: Reader, source: _Source | None = None
) -> str | None:
    """The pipeline that orders both sides of a shared-memory hazard, said in words; None when
    the hazard is not one this rule can credit."""
    if f.kind not in ORDERED_KINDS or f.address_space not in (None, "shared"):
        return None
    if len(f.sites) != 2 or not ops:
        return None
    source = source or _Source(read_raw)
    sets = [guarding(f.kind, s.file, s.line, s.access, ops, source) for s in f.sites]
    common = sets[0] & sets[1]
    if not common:
        return None
    pipe = sorted(common)[0]
    sides = ", ".join(_said(f.kind, s) for s in f.sites)
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
    source = _Source(read)
    memo: dict[tuple, str | None] = {}

    def check(f: Finding) -> str | None:
        key = (f.kind, f.address_space, tuple((s.file, s.line, s.access) for s in f.sites))
        if key not in memo:
            memo[key] = pipeline_order(f, ops, read, source)
        return memo[key]

    return check
