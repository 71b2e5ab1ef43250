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
                twice = prev is not None and (prev.file, prev.line) == (e.file, e.line)
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
            elif prev is not None and (prev.file, prev.line) == (e.file, e.line):
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
            acq = [e for e in seq if e.kind == "producer_acquire"]
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
        if (
            not proto.of("consumer_release", key)
            and not any(e.in_loop for e in acq)
            and rec.stages is not None
            and len(acq) <= rec.stages
        ):
            # single-use stages, never released: there is no pending arrive to drain (and a
            # producer_tail would wait for releases that never come)
            continue
        multi = clustered or (rec.cluster_size or 1) > 1
        sev = "error" if multi else "warning"
        why = (
            "a consumer's remote arrive may target a CTA that has already exited"
            if multi
            else "single CTA: usually benign, but the last empty-barrier arrives "
            "are left pending when the producer exits"
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
