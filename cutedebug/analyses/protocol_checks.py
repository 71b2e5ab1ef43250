"""The invariants of a barrier protocol (analyses/lint.py runs them): each ``_check_*`` takes a
recorded ``Protocol`` (instrument/recorder.py) and returns ``Finding`` records whose message
states the arithmetic. Pure Python: no cutlass, no torch."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from cutedebug.instrument.protocol import _prod
from cutedebug.instrument.recorder import PipelineRecord, Protocol

SEVERITIES = ("error", "warning", "info")
# Pipelines whose create() passes the declared groups to mbarrier.init unchanged (unless
# enable_multicast_signaling recomputes the consumer count).
_KNOWN_GROUP_RULES = (
    "PipelineAsync",
    "PipelineCpAsync",
    "PipelineTmaAsync",
    "PipelineTmaUmma",
    "PipelineAsyncUmma",
    "PipelineUmmaAsync",
)


@dataclasses.dataclass
class Finding:
    severity: str  # error | warning | info
    check: str
    pipeline: str | None
    message: str
    arithmetic: str = ""
    file: str | None = None
    line: int | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Finding:
        return cls(**{f.name: d.get(f.name) for f in dataclasses.fields(cls)})

    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}" if self.file else "-"


def _group_threads(g: tuple[str, Any] | None, block_threads: int | None) -> int | None:
    if not g or g[1] is None:
        return None
    agent, size = g
    if agent == "Thread":
        return size
    if agent == "Warp":
        return 32 * size
    if agent == "ThreadBlock" and block_threads:
        return size * block_threads
    return None


@dataclasses.dataclass
class _Where:
    file: str | None
    line: int | None


def _f(
    severity: str,
    check: str,
    pipe: str | None,
    message: str,
    arithmetic: str = "",
    where: Any = None,
) -> Finding:
    file = getattr(where, "file", None) if where is not None else None
    line = getattr(where, "line", None) if where is not None else None
    return Finding(severity, check, pipe, message, arithmetic, file, line)


def _check_expect_tx(proto: Protocol) -> list[Finding]:
    out = []
    for key, rec in proto.pipelines.items():
        if rec.full_op != "TmaLoad":
            continue
        acquires = proto.of("producer_acquire", key)
        for acq in acquires:
            copies, txs = acq.detail["copies"], acq.detail["expect_tx"]
            if not copies:
                if acq is acquires[-1] and not any(a.detail["copies"] for a in acquires):
                    out.append(
                        _f(
                            "info",
                            "expect_tx",
                            key,
                            f"no TMA copy traced against the "
                            f"full barrier of {key}: expect_tx bytes not checked",
                            where=acq,
                        )
                    )
                continue
            if not txs:
                out.append(
                    _f(
                        "error",
                        "expect_tx",
                        key,
                        f"producer_acquire at {acq.where()} "
                        "issues no arrive.expect_tx on the full barrier, but TMA copies "
                        "complete on it",
                        where=acq,
                    )
                )
                continue
            if any(t is None for t in txs) or any(c["bytes"] is None for c in copies):
                out.append(
                    _f(
                        "info",
                        "expect_tx",
                        key,
                        "expect_tx or a TMA copy size is a run-time value: not checked",
                        where=acq,
                    )
                )
                continue
            tx = sum(txs)
            parts = " + ".join(f"{c['label']} {c['bytes']}" for c in copies)
            per_cta = sum(c["bytes"] for c in copies)
            factor = rec.v_size if rec.cls in ("PipelineTmaUmma",) else 1
            delivered = per_cta * factor
            mc = [
                f"{c['label']} multicast to {c['multicast']} CTAs"
                for c in copies
                if c["multicast"] and c["multicast"] > 1
            ]
            arith = (
                f"expect_tx {tx} B per stage; TMA copies deliver {delivered} B "
                f"({parts}{f'; x {factor} CTAs of the 2-CTA pair' if factor > 1 else ''}"
                f"{'; ' + ', '.join(mc) if mc else ''}); declared tx_count {rec.tx_count}"
            )
            if tx != delivered:
                verdict = (
                    "the full barrier never completes: consumer_wait hangs"
                    if tx > delivered
                    else "the phase completes before all bytes land: consumers "
                    "may read a partly written stage"
                )
                out.append(
                    _f(
                        "error",
                        "expect_tx",
                        key,
                        f"full barrier of pipeline {key}: "
                        f"expect_tx {tx} B per stage, TMA copies deliver {delivered} B "
                        f"({parts}): {verdict}",
                        arith,
                        acq,
                    )
                )
            elif any(not c["barrier_known"] for c in copies):
                out.append(
                    _f(
                        "info",
                        "expect_tx",
                        key,
                        "a TMA copy's barrier pointer was not "
                        "traced to a pipeline; attributed to the preceding "
                        "producer_acquire",
                        arith,
                        acq,
                    )
                )
    return out


def _expected_empty(rec: PipelineRecord, block: int | None) -> tuple[int | None, str]:
    group = _group_threads(rec.consumer_group, block)
    if group is None:
        return None, "consumer group size is a run-time value"
    if rec.multicast_signaling:
        ms = rec.mcast_size
        if ms is None:
            return None, "multicast size unknown"
        return ms * (group // 32), (
            f"{ms} multicast CTAs x {group // 32} consumer warps ({group} threads / 32)"
        )
    return group, f"consumer group {rec.consumer_group[0]} x {rec.consumer_group[1]}"


def _check_arrive_counts(proto: Protocol) -> list[Finding]:
    out = []
    block = proto.block_threads
    warps = block // 32 if block else None
    for key, rec in proto.pipelines.items():
        where = _Where(rec.file, rec.line)
        known = rec.cls in _KNOWN_GROUP_RULES
        full_want = _group_threads(rec.producer_group, block)
        if (
            known
            and full_want is not None
            and rec.full_init is not None
            and rec.full_init != full_want
        ):
            out.append(
                _f(
                    "error",
                    "arrive_count",
                    key,
                    f"full barriers of {key} are "
                    f"initialised with arrive count {rec.full_init}, the producer group "
                    f"declares {full_want}: "
                    + (
                        "the phase never completes (hang in consumer_wait)"
                        if rec.full_init > full_want
                        else "the phase completes before every producer arrived"
                    ),
                    f"mbarrier.init count {rec.full_init} != producer group "
                    f"{rec.producer_group[0]} x {rec.producer_group[1]} = {full_want}",
                    where,
                )
            )
        empty_want, how = _expected_empty(rec, block)
        if (
            known
            and empty_want is not None
            and rec.empty_init is not None
            and rec.empty_init != empty_want
        ):
            out.append(
                _f(
                    "error",
                    "arrive_count",
                    key,
                    f"empty barriers of {key} are "
                    f"initialised with arrive count {rec.empty_init}, the releasing "
                    f"consumers give {empty_want} arrivals per phase: "
                    + (
                        "the phase never completes (hang in producer_acquire)"
                        if rec.empty_init > empty_want
                        else "the phase completes before "
                        "every consumer released (stage refilled while still read)"
                    ),
                    f"mbarrier.init count {rec.empty_init} != {how} = {empty_want}",
                    where,
                )
            )
        if rec.cls == "PipelineTmaAsync" and rec.empty_init and warps:
            ms = rec.mcast_size or 1
            most = warps * ms
            if rec.empty_init > most:
                out.append(
                    _f(
                        "error",
                        "arrive_count",
                        key,
                        f"empty barriers of {key} expect "
                        f"{rec.empty_init} arrivals per phase, but consumer_release "
                        f"arrives from one lane per warp and multicast peer: at most "
                        f"{most} in a CTA of {warps} warps (a thread count given where "
                        "PipelineTmaAsync counts warps?)",
                        f"{rec.empty_init} > {warps} warps x {ms} multicast CTAs = {most}",
                        where,
                    )
                )
        acquire_sites = {(e.file, e.line) for e in proto.of("producer_acquire", key)}
        if (
            rec.full_op == "TmaLoad"
            and rec.full_init
            and acquire_sites
            and rec.full_init > len(acquire_sites)
        ):
            out.append(
                _f(
                    "warning",
                    "arrive_count",
                    key,
                    f"full barriers of {key} wait for "
                    f"{rec.full_init} arrive.expect_tx per phase; each producer_acquire "
                    f"issues one (elected thread) and {len(acquire_sites)} acquire "
                    "call site(s) were traced",
                    f"init {rec.full_init} > {len(acquire_sites)} acquire site(s) x 1",
                    where,
                )
            )
    return out


_SYNC_KINDS = ("sync_threads", "cluster_wait")
_USE_KINDS = (
    "producer_acquire",
    "consumer_wait",
    "consumer_release",
    "producer_tail",
    "tma_copy",
    "expect_tx",
    "mbarrier_arrive",
    "mbarrier_wait",
    "producer_commit",
)


def _check_init(proto: Protocol) -> list[Finding]:
    out = []
    ev = proto.events
    inits = [i for i, e in enumerate(ev) if e.kind in ("mbarrier_init", "mbarrier_array_init")]
    if not inits:
        return out
    clustered = (_prod(proto.launch.get("cluster")) or 1) > 1 or any(
        (p.cluster_size or 1) > 1 for p in proto.pipelines.values()
    )
    uses_tma = bool(proto.of("tma_copy"))
    # Each init must be followed by a fence and a sync before the first use after it.
    checked_uses: set[int] = set()
    for i in inits:
        first = next((j for j in range(i + 1, len(ev)) if ev[j].kind in _USE_KINDS), None)
        if first is None or first in checked_uses:
            continue
        checked_uses.add(first)
        last_init = max(k for k in inits if k < first)
        between = [e.kind for e in ev[last_init + 1 : first]]
        named_all = any(
            e.kind == "named_barrier_sync"
            and (
                e.detail["all_threads"]
                or (proto.block_threads and e.detail["threads"] == proto.block_threads)
            )
            for e in ev[last_init + 1 : first]
        )
        init_ev, use = ev[last_init], ev[first]
        what = f"mbarrier.init at {init_ev.where()}" + (
            f" ({init_ev.pipeline})" if init_ev.pipeline else ""
        )
        if "init_fence" not in between:
            sev = "error" if clustered or uses_tma else "warning"
            out.append(
                _f(
                    sev,
                    "init_fence",
                    init_ev.pipeline,
                    f"{what} is not followed by "
                    f"fence.mbarrier_init before its first use ({use.kind} at "
                    f"{use.where()}): "
                    + (
                        "the init may not be visible to the "
                        f"{'cluster / ' if clustered else ''}async proxy (TMA complete_tx)"
                        if clustered or uses_tma
                        else "the init is not ordered before other threads' barrier operations"
                    ),
                    f"events between init and first use: {between or 'none'}",
                    init_ev,
                )
            )
        # a pipeline without a cluster layout is CTA-local: only its own CTA's warps use its
        # barriers, so a CTA sync orders the init even in a clustered launch
        rec = proto.pipelines.get(init_ev.pipeline) if init_ev.pipeline else None
        cluster_sync = clustered and not (rec is not None and (rec.cluster_size or 1) == 1)
        synced = (
            ("cluster_wait" in between)
            if cluster_sync
            else ("sync_threads" in between or "cluster_wait" in between or named_all)
        )
        if not synced:
            need = "cluster arrive + wait" if cluster_sync else "CTA sync (bar.sync 0)"
            out.append(
                _f(
                    "error",
                    "init_sync",
                    init_ev.pipeline,
                    f"{what} is not followed by "
                    f"a {need} before its first use ({use.kind} at {use.where()}): other "
                    "warps may use the barrier before it is initialised",
                    f"events between init and first use: {between or 'none'}",
                    init_ev,
                )
            )
    return out


def _check_phase_flip(proto: Protocol) -> list[Finding]:
    out = []
    for name, info in proto.state_types.items():
        cls = (info.get("class") or name).rpartition(".")[2].partition("[")[0]
        start = info.get("start", 0)
        if info.get("flips") is False:
            out.append(
                _f(
                    "error",
                    "phase_flip",
                    None,
                    f"{info['role']} pipeline state "
                    f"{cls} does not flip its phase when its index wraps: after one lap "
                    "the waits test the wrong parity",
                    f"shadow advance({info['stages']}) from (index 0, phase {start}) gave "
                    f"(index {info['after'][0]}, phase {info['after'][1]}), expected "
                    f"(index 0, phase {1 - start})",
                    _Where(info.get("file"), info.get("line")),
                )
            )
        elif info.get("error"):
            out.append(
                _f(
                    "info",
                    "phase_flip",
                    None,
                    f"pipeline state {cls} could not be "
                    f"shadowed ({info['error']}): phase flip not checked",
                )
            )
    return out


def _check_warp_release(proto: Protocol) -> list[Finding]:
    """PipelineTmaAsync releases from one lane per warp: the warp's reads must be done first."""
    out = []
    for key, rec in proto.pipelines.items():
        if rec.cls != "PipelineTmaAsync":
            continue
        last_wait = None
        for i, e in enumerate(proto.events):
            if e.pipeline == key and e.kind == "consumer_wait":
                last_wait = i
            elif e.pipeline == key and e.kind == "consumer_release" and last_wait is not None:
                between = {x.kind for x in proto.events[last_wait + 1 : i]}
                if not between & {
                    "sync_warp",
                    "sync_threads",
                    "named_barrier_sync",
                    "warpgroup_wait",
                }:
                    out.append(
                        _f(
                            "info",
                            "warp_release",
                            key,
                            f"consumer_release at "
                            f"{e.where()} arrives from one lane per warp with no "
                            "__syncwarp (or barrier) after consumer_wait at "
                            f"{proto.events[last_wait].where()}: other lanes may still "
                            "read the stage when the producer refills it",
                            "no warp-level sync between wait and release",
                            e,
                        )
                    )
                last_wait = None
    return out
