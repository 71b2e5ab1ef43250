"""Pairing invariants of a barrier protocol: consumer_wait / consumer_release and
producer_acquire / producer_commit per pipeline (single-use stages and no-op subclass methods
understood), producer_tail, named-barrier thread counts (sequential reuse understood).
Part of the checks analyses/lint.py runs; pure Python."""

from __future__ import annotations

from typing import Any

from cutedebug.analyses.protocol_checks import Finding, _f, _prod
from cutedebug.instrument.recorder import Event, Protocol


def _check_pairing(proto: Protocol) -> list[Finding]:
    out = []
    for key, rec in proto.pipelines.items():
        seq = [
            e
            for e in proto.events
            if e.pipeline == key
            and e.kind
            in ("consumer_wait", "consumer_release", "producer_acquire", "producer_commit")
        ]
        waits = [e for e in seq if e.kind == "consumer_wait"]
        if _credit_only(proto, key, seq) and not rec.barrier_pointers:
            out.append(_credit_finding(key, seq))
            continue
        # A release that traced no arrive is a no-op method of this pipeline (a subclass's):
        # it releases nothing, so it is not paired with a wait.
        noop = [
            e
            for e in seq
            if e.kind == "consumer_release"
            and e.detail["arrives"] == 0
            and not e.detail["conditional_arrives"]
        ]
        releases = [e for e in seq if e.kind == "consumer_release" and e not in noop]
        if noop:
            out.append(
                _f(
                    "info",
                    "release_pairing",
                    key,
                    f"consumer_release at "
                    f"{noop[0].where()} ({noop[0].detail.get('method', '')}) traced no "
                    "arrive on the empty barrier: a no-op for this pipeline, not paired",
                    f"{len(noop)} release call(s) with 0 arrives",
                    noop[0],
                )
            )
        acquires = [e for e in seq if e.kind == "producer_acquire"]
        tails = proto.of("producer_tail", key)
        # The producer waits on a stage's empty barrier again only in a loop, past the number
        # of stages, or in producer_tail; otherwise a stage it filled once needs no release.
        reacquired = (
            bool(tails)
            or any(e.in_loop for e in acquires)
            or (rec.stages is not None and len(acquires) > rec.stages)
        )
        noop_release = "consumer_release" in rec.noop_ops
        if waits and not releases and noop_release:
            out.append(
                _f(
                    "info",
                    "release_pairing",
                    key,
                    f"consumer_release of {rec.cls} is a no-op method "
                    f"({rec.noop_ops['consumer_release']}): its consumer_wait at "
                    f"{waits[0].where()} is not paired with a release",
                    f"no-op consumer_release; {len(waits)} consumer_wait call(s)",
                    waits[0],
                )
            )
        elif waits and not releases:
            w = waits[0]
            if not reacquired:
                out.append(
                    _f(
                        "info",
                        "release_pairing",
                        key,
                        f"consumer_wait at {w.where()} "
                        f"has no consumer_release of {key}: single-use stages (the "
                        "producer never waits on their empty barrier again), legal",
                        f"{len(acquires)} producer_acquire call(s) outside loops <= "
                        f"{rec.stages} stage(s), no producer_tail",
                        w,
                    )
                )
                continue
            why = (
                "its producer_tail waits for every stage's release"
                if tails
                else "the producer re-acquires the stage"
            )
            out.append(
                _f(
                    "error",
                    "release_pairing",
                    key,
                    f"consumer_wait at {w.where()} "
                    f"has no consumer_release of {key} on any path: {why} and hangs",
                    f"{len(waits)} consumer_wait call(s), 0 consumer_release call(s)",
                    w,
                )
            )
            continue
        if len(releases) < len(waits) and not noop_release:
            if tails:
                out.append(
                    _f(
                        "error",
                        "release_pairing",
                        key,
                        f"{len(waits)} consumer_wait "
                        f"call(s) but {len(releases)} consumer_release call(s) of {key}: "
                        "the stage left unreleased is waited for by producer_tail",
                        f"waits {len(waits)} != releases {len(releases)}",
                        releases[-1],
                    )
                )
            else:
                out.append(
                    _f(
                        "info",
                        "release_pairing",
                        key,
                        f"{len(waits)} consumer_wait "
                        f"call(s) but {len(releases)} consumer_release call(s) of {key}: "
                        "the last stage is not released, legal when the producer never "
                        "re-acquires it (there is no producer_tail)",
                        f"waits {len(waits)} != releases {len(releases)}",
                        releases[-1],
                    )
                )
        last_wait: Event | None = None
        prev: Event | None = None
        for e in seq:
            if e.kind == "consumer_wait":
                last_wait, prev = e, None
                continue
            if e.kind != "consumer_release" or e in noop:
                continue
            base = set(last_wait.conds) if last_wait else set()
            extra = [c for c in e.conds if c not in base]
            if extra or e.detail["conditional_arrives"]:
                cond = (extra or e.detail["conditional_arrives"][0])[0]
                twice = (
                    prev is not None
                    and (prev.file, prev.line) == (e.file, e.line)
                    and not _distinct_stages(prev, e)
                )
                effect = (
                    "on the path where it holds the stage is released twice (the empty "
                    "barrier runs a phase ahead: the producer overwrites a stage still "
                    "being read)"
                    if twice
                    else "on the path where it fails the stage is "
                    "never released (producer_acquire of that stage hangs)"
                )
                wait_at = f" at {last_wait.where()}" if last_wait else ""
                out.append(
                    _f(
                        "error",
                        "release_pairing",
                        key,
                        f"consumer_release at "
                        f"{e.where()} arrives on the empty barrier under a run-time "
                        f"condition ({cond}) that its consumer_wait{wait_at} is not "
                        f"under: {effect}",
                        f"wait under {sorted(base) or 'no condition'}; release under "
                        f"{list(e.conds) + [c for c in e.detail['conditional_arrives']]}"
                        f"{'; 1 unconditional + 1 conditional release' if twice else ''}",
                        e,
                    )
                )
            elif (
                prev is not None
                and (prev.file, prev.line) == (e.file, e.line)
                and not _distinct_stages(prev, e)
            ):
                out.append(
                    _f(
                        "error",
                        "release_pairing",
                        key,
                        f"consumer_release at "
                        f"{e.where()} is performed twice for one consumer_wait: the empty "
                        "barrier runs a phase ahead and the producer overwrites a stage "
                        "still being read",
                        "2 releases after 1 wait",
                        e,
                    )
                )
            if e.detail["arrives"] > 1:
                out.append(
                    _f(
                        "error",
                        "release_pairing",
                        key,
                        f"consumer_release at "
                        f"{e.where()} arrives {e.detail['arrives']} times on the empty "
                        "barrier",
                        f"{e.detail['arrives']} arrives in one release",
                        e,
                    )
                )
            prev = e
        if (
            len(releases) > len(waits)
            and waits
            and not any(f.check == "release_pairing" and f.pipeline == key for f in out)
        ):
            out.append(
                _f(
                    "warning",
                    "release_pairing",
                    key,
                    f"{len(releases)} "
                    f"consumer_release call(s) but {len(waits)} consumer_wait call(s) "
                    f"of {key}",
                    f"releases {len(releases)} > waits {len(waits)}",
                    releases[-1],
                )
            )
        if rec.full_op == "AsyncThread":
            drains = _drains(proto, key)
            acq = [e for e in seq if e.kind == "producer_acquire" and e not in drains]
            # a commit that traced no arrive on the full barrier is a no-op method (the
            # barrier is arrived elsewhere): not paired
            com = [e for e in seq if e.kind == "producer_commit" and e.detail.get("arrives", 1) > 0]
            if (
                len(com) < len(acq)
                and len(com) == 0
                and any(e.kind == "producer_commit" for e in seq)
            ):
                c = next(e for e in seq if e.kind == "producer_commit")
                out.append(
                    _f(
                        "info",
                        "commit_pairing",
                        key,
                        f"producer_commit at {c.where()} "
                        f"({c.detail.get('method', '')}) traced no arrive on the full "
                        "barrier: a no-op for this pipeline, not paired",
                        "0 arrives in every commit",
                        c,
                    )
                )
            elif len(com) < len(acq) and "producer_commit" in rec.noop_ops:
                out.append(_noop_commit(proto, key, rec, acq[-1]))
            elif len(com) < len(acq) and len(com) + len(
                armed := _data_path_arms(seq_all(proto, key))
            ) >= len(acq):
                a = armed[0]
                out.append(
                    _f(
                        "info",
                        "commit_pairing",
                        key,
                        f"{len(acq)} producer_acquire call(s), {len(com)} producer_commit "
                        f"call(s) of {key}: the producer arrives on the full barrier itself "
                        f"with arrive.expect_tx at {a.where()} (through producer_get_barrier's "
                        "pointer; the bytes come from a hardware response or a peer, e.g. a "
                        "cluster launch control query), so its acquires are not paired with "
                        "commits",
                        f"acquires {len(acq)}; commits {len(com)}; arrive.expect_tx on the "
                        f"full barrier {len(armed)}",
                        a,
                    )
                )
            elif len(com) < len(acq):
                out.append(
                    _f(
                        "error",
                        "commit_pairing",
                        key,
                        f"{len(acq)} producer_acquire "
                        f"call(s) but {len(com)} producer_commit call(s) of {key}: its "
                        "full barrier is arrived on by producer_commit",
                        f"acquires {len(acq)} != commits {len(com)}",
                        acq[-1],
                    )
                )
    return out


def _drains(proto: Protocol, key: str) -> list[Event]:
    """A final producer_acquire after the producer's loop that fills nothing (no commit, TMA
    copy or expect_tx of the pipeline after it): the kernel's own drain, e.g. FA-4's
    ``producer_acquire_w_index_phase(q_stage - 1, phase)`` "equivalent to producer_tail"."""
    events = [e for e in proto.events if e.pipeline == key]
    acq = [e for e in events if e.kind == "producer_acquire"]
    if len(acq) < 2 or acq[-1].in_loop or not any(e.in_loop for e in acq[:-1]):
        return []
    last = acq[-1]
    after = events[events.index(last) + 1 :]
    fills = ("producer_commit", "tma_copy", "expect_tx", "producer_acquire")
    if last.detail.get("copies") or any(e.kind in fills for e in after):
        return []
    return [last]


def _closing_handshake(proto: Protocol, key: str) -> Event | None:
    """A cross-CTA handshake outside loops traced after the pipeline's loop started: a
    remote raw mbarrier arrive followed by a raw wait (cutlass's 2-CTA TMEM dealloc), or a
    cluster arrive + wait. It keeps each CTA alive until its peer got there; a trace does not
    show that every role reaches it after its last release, hence a warning, not clean."""
    looped = [i for i, e in enumerate(proto.events) if e.pipeline == key and e.in_loop]
    if not looped:
        return None
    after = [e for e in proto.events[looped[0] :] if not e.in_loop]
    for i, e in enumerate(after):
        remote = e.kind == "mbarrier_arrive" and e.detail.get("remote")
        if (remote or e.kind == "cluster_arrive") and any(
            w.kind in ("mbarrier_wait", "cluster_wait") for w in after[i + 1 :]
        ):
            return e
    return None


def _distinct_stages(a: Event, b: Event) -> bool:
    """Two releases of stages the kernel names statically and differently (an unrolled loop
    over the stages): not one stage released twice."""
    sa, sb = a.detail.get("stage"), b.detail.get("stage")
    return sa is not None and sb is not None and sa != sb


def _credit_only(proto: Protocol, key: str, seq: list[Event]) -> bool:
    """A pipeline whose full barrier the kernel never uses: no consumer_wait, no commit (nor
    a raw arrive / expect_tx on its full barrier; the caller also requires that the kernel
    never took its pointer), only acquires and releases. It is a credit
    counter on the empty barrier (FA-4's SM100 softmax statistics: producer_acquire waits
    for the consumers' consumer_release; the data is signalled another way)."""
    kinds = {e.kind for e in seq}
    return (
        "producer_acquire" in kinds
        and "consumer_release" in kinds
        and not kinds & {"consumer_wait", "producer_commit"}
        and not any(e.kind == "expect_tx" and e.pipeline == key for e in proto.events)
    )


def _credit_finding(key: str, seq: list[Event]) -> Finding:
    acq = [e for e in seq if e.kind == "producer_acquire"]
    rel = [e for e in seq if e.kind == "consumer_release"]
    return _f(
        "info",
        "release_pairing",
        key,
        f"{key} is used as a credit counter: its full barrier is never committed nor waited "
        f"on; producer_acquire (at {acq[0].where()}) waits for consumer_release (at "
        f"{rel[0].where()}) on the empty barrier: acquires are not paired with commits, "
        "releases not with waits",
        f"{len(acq)} producer_acquire, 0 producer_commit, 0 consumer_wait, "
        f"{len(rel)} consumer_release call(s)",
        acq[0],
    )


def seq_all(proto: Protocol, key: str) -> list[Event]:
    return [e for e in proto.events if e.pipeline == key]


def _data_path_arms(events: list[Event]) -> list[Event]:
    """Fused arrive.expect_tx calls the kernel makes itself on a pipeline's full barrier
    (through producer_get_barrier's pointer), outside any pipeline op."""
    return [e for e in events if e.kind == "expect_tx" and e.detail.get("arrives")]


def _noop_commit(proto: Protocol, key: str, rec: Any, acquire: Event) -> Finding:
    """The pipeline's class makes producer_commit a no-op (a library's subclass whose full
    barrier is completed in the data path): its acquires have no commit to pair with."""
    where = rec.noop_ops["producer_commit"]
    armed = [
        e for e in proto.events if e.pipeline == key and e.kind in ("expect_tx", "mbarrier_arrive")
    ]
    by = (
        f"{armed[0].kind} on its barrier at {armed[0].where()}"
        if armed
        else "code outside the pipeline's methods that was not traced (e.g. a raw arrive "
        "through producer_get_barrier; if nothing arrives there, consumer_wait hangs)"
    )
    return _f(
        "info",
        "commit_pairing",
        key,
        f"producer_commit of {rec.cls} is a no-op method ({where}): the full barrier is "
        f"completed by {by}, so producer_acquire is not paired with a commit",
        f"no-op producer_commit; {len(proto.of('producer_commit', key))} commit call(s)",
        acquire,
    )


def _check_producer_tail(proto: Protocol) -> list[Finding]:
    out = []
    clustered = (_prod(proto.launch.get("cluster")) or 1) > 1
    for key, rec in proto.pipelines.items():
        if rec.cls == "PipelineTmaStore":
            continue
        acq = proto.of("producer_acquire", key)
        if not acq or proto.of("producer_tail", key):
            continue
        drains = _drains(proto, key)
        if drains:
            d = drains[-1]
            out.append(
                _f(
                    "info",
                    "producer_tail",
                    key,
                    f"{key} is drained by its final producer_acquire at {d.where()} (after "
                    "the producer's loop, nothing filled after it): it waits for the last "
                    "release of that stage, as producer_tail would",
                    f"{len(acq)} producer_acquire call(s), the last outside loops with no "
                    "commit, copy or expect_tx after it",
                    d,
                )
            )
            continue
        if (
            not proto.of("consumer_release", key)
            and not any(e.in_loop for e in acq)
            and rec.stages is not None
            and len(acq) <= rec.stages
        ):
            # single-use stages, never released: there is no pending arrive to drain (and a
            # producer_tail would wait for releases that never come)
            continue
        # a pipeline without a cluster layout is CTA-local: its consumers arrive in their own
        # CTA even when the launch is clustered
        multi = (rec.cluster_size or 1) > 1
        handshake = _closing_handshake(proto, key) if multi else None
        sev = "error" if multi and handshake is None else "warning"
        why = (
            "a consumer's remote arrive may target a CTA that has already exited"
            if multi
            else "single CTA: usually benign, but the last empty-barrier arrives "
            "are left pending when the producer exits"
        )
        if handshake is not None:
            why = (
                f"the kernel closes with a cluster handshake at {handshake.where()} (an arrive "
                "on a peer CTA's barrier and a wait outside loops, e.g. the 2-CTA TMEM "
                "dealloc): legal if every CTA reaches it only after its last release"
            )
        out.append(
            _f(
                sev,
                "producer_tail",
                key,
                f"{key} has producer_acquire at {acq[-1].where()} but no producer_tail: {why}",
                f"cluster size {rec.cluster_size or 1}"
                f"{' (launch cluster ' + str(proto.launch.get('cluster')) + ')' if clustered else ''}",
                acq[-1],
            )
        )
    return out


def _check_named_barriers(proto: Protocol) -> list[Finding]:
    out = []
    block = proto.block_threads
    uses: dict[int, set[int | None]] = {}
    for e in proto.events:
        if e.kind not in ("named_barrier_sync", "named_barrier_arrive"):
            continue
        bid, n = e.detail["barrier_id"], e.detail["threads"]
        if e.detail["all_threads"]:
            n = block
        if bid is None:
            continue
        uses.setdefault(bid, set()).add(n)
        if n is None:
            continue
        if n % 32:
            out.append(
                _f(
                    "error",
                    "named_barrier",
                    None,
                    f"named barrier {bid} at {e.where()} "
                    f"counts {n} threads: bar.sync needs a multiple of the warp size",
                    f"{n} % 32 = {n % 32}",
                    e,
                )
            )
        if block and n > block:
            out.append(
                _f(
                    "error",
                    "named_barrier",
                    None,
                    f"named barrier {bid} at {e.where()} "
                    f"waits for {n} threads, the CTA has {block}: it never completes",
                    f"{n} > block {block}",
                    e,
                )
            )
        if bid == 0 and block and n != block:
            out.append(
                _f(
                    "warning",
                    "named_barrier",
                    None,
                    f"barrier 0 at {e.where()} with "
                    f"{n} threads: id 0 is sync_threads' barrier ({block} threads)",
                    f"{n} != {block}",
                    e,
                )
            )
    for bid, counts in uses.items():
        if len(counts) > 1:
            out.append(_reuse_finding(proto, bid, block))
    return out


def _reuse_finding(proto: Protocol, bid: int, block: int | None) -> Finding:
    """One named barrier id, several thread counts. bar.arrive(id, N) is completed by the
    bar.sync(id, N) of the same phase: an arrive count that no sync of the id shares is an
    error. bar.sync alone with several counts is sequential reuse (legal: each phase completes
    with its own count) unless the uses are under different run-time conditions (different
    roles may run them at once)."""
    evs = [
        e
        for e in proto.events
        if e.kind in ("named_barrier_sync", "named_barrier_arrive")
        and e.detail["barrier_id"] == bid
    ]

    def count(e: Event) -> int | None:
        return block if e.detail["all_threads"] else e.detail["threads"]

    syncs = {count(e) for e in evs if e.kind == "named_barrier_sync"}
    lonely = [e for e in evs if e.kind == "named_barrier_arrive" and count(e) not in syncs]
    counts = sorted(str(c) for c in {count(e) for e in evs})
    if lonely and syncs:
        e = lonely[0]
        return _f(
            "error",
            "named_barrier",
            None,
            f"bar.arrive on named barrier {bid} at "
            f"{e.where()} counts {count(e)} threads, but every bar.sync of id {bid} "
            f"counts {sorted(c for c in syncs if c)}: the phase completes early or never",
            f"arrive {count(e)} not in sync counts {sorted(map(str, syncs))}",
            e,
        )
    by_count: dict[Any, set] = {}
    for e in evs:
        by_count.setdefault(count(e), set()).add(e.conds)
    conds = {c for cs in by_count.values() for c in cs}
    if len(conds) > 1:
        return _f(
            "warning",
            "named_barrier",
            None,
            f"named barrier id {bid} is used with "
            f"thread counts {counts} under different run-time conditions: legal if the "
            "uses run one after the other, a hang or an early release if different "
            "roles run them at once",
            f"id {bid}: counts {counts}",
            evs[0],
        )
    return _f(
        "info",
        "named_barrier",
        None,
        f"named barrier id {bid} is reused with thread "
        f"counts {counts} one after the other on one path: each phase completes with "
        "its own count (legal)",
        f"id {bid}: counts {counts}",
        evs[0],
    )
