"""Probes: the diagnosis, one line per pattern the records show, aggregated over CTAs; the
snapshot as JSON with it. Every rule states only what the records show: a producer past the
consumers is not a circular wait; a CTA whose events were lost (records dropped, beacon slots
shared) is not told that a role never ran; a raw mbarrier's hypothesis names who arms it,
who arrives and who delivers bytes. No cutlass, no torch."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from cutedebug.instrument.probe_host import (
    ProbePicture,
    ProbeSnapshot,
    StuckRecord,
    WarpView,
    warp_evidence,
    warp_views,
)
from cutedebug.instrument.probe_layout import Site, _as_sites

# A picture travels as one line of the worker's event channel (capped at 1 MiB by the
# watchdog's reader): it lists at most this many stuck records and beacons (a record ~150 B of
# JSON) and counts the rest, so a grid of thousands of timed-out warps still gets its picture
# through. The diagnosis is made from every decoded record before the lists are cut.
PICTURE_MAX_ITEMS = 2048


def snapshot_to_json(
    snapshot: ProbeSnapshot, sites: Any = None, max_items: int = PICTURE_MAX_ITEMS
) -> dict[str, Any]:
    by_id = _as_sites(sites)
    stuck = _first_of_each_kind(
        snapshot.stuck, lambda r: (r.site_id, r.warp, r.stage, r.phase), max_items
    )
    beacons = _first_of_each_kind(
        snapshot.beacons, lambda b: (b.site_id, b.warp, b.stage, b.phase), max_items
    )
    return ProbePicture(
        warps=warp_evidence(snapshot, by_id),
        stuck=stuck,
        beacons=beacons,
        stuck_unlisted=len(snapshot.stuck) - len(stuck) + snapshot.stuck_unlisted,
        beacons_unlisted=len(snapshot.beacons) - len(beacons) + snapshot.beacons_unlisted,
        progress_counter_total=snapshot.progress_counter_total,
        n_stuck_reported=snapshot.n_stuck_reported,
        header_magic=snapshot.header_magic,
        max_ctas=snapshot.max_ctas,
        diagnosis=diagnose(snapshot, by_id) if by_id or snapshot.stuck else [],
    ).to_json()


def _first_of_each_kind(items: list, kind: Any, limit: int) -> list:
    """At most ``limit`` items in their order, the first of every kind kept first."""
    if len(items) <= limit:
        return list(items)
    seen: set = set()
    firsts = [i for i, x in enumerate(items) if kind(x) not in seen and not seen.add(kind(x))]
    keep = set(firsts[:limit])
    for i in range(len(items)):
        if len(keep) >= limit:
            break
        keep.add(i)
    return [items[i] for i in sorted(keep)]


def _progress_on(
    views: list[WarpView], key: tuple, ops: tuple[str, ...], by_id: dict[int, Site]
) -> int:
    """Highest PipelineState seq among completed waits on pipeline ``key`` with an op in ops."""
    best = 0
    for v in views:
        b = v.last
        site = by_id.get(b.site_id) if b else None
        if site and site.pipeline_key == key and site.op in ops and site.kind == "pipeline":
            best = max(best, b.seq)
    return best


def _phase_rule(r: StuckRecord, site: Site) -> str | None:
    if site.kind != "pipeline" or not site.stages or r.seq <= 0 or r.stage < 0:
        return None
    if site.op not in ("producer_acquire", "consumer_wait", "producer_tail"):
        return None
    count = r.seq - 1
    start = 1 if site.role == "producer" else 0
    stage, phase = count % site.stages, start ^ ((count // site.stages) & 1)
    if (stage, phase) == (r.stage, r.phase):
        return None
    return (
        f"{site.role} waits on {site.barrier}[{r.stage}] phase {r.phase} but its "
        f"PipelineState count {count} implies {site.barrier}[{stage}] phase {phase}: "
        f"stage/phase bookkeeping broken (PipelineState.advance not flipping the phase?) "
        f"at {site.where}"
    )


def _stuck_seq_done(v: WarpView) -> int:
    """Waits of its pipeline a stuck warp completed before this one (its seq - 1)."""
    return max(v.stuck.seq - 1, 0) if v.stuck and v.stuck.seq > 0 else 0


def _cta_rules(views: list[WarpView], by_id: dict[int, Site], complete: bool = True) -> list[str]:
    """What the records of one CTA show. ``complete``: no stuck report was dropped and no
    beacon slot was shared, so a warp without events completed no wait."""
    out: list[str] = []
    stuck = [v for v in views if v.stuck]
    for v in stuck:
        site = by_id.get(v.stuck.site_id)
        if site is not None and (msg := _phase_rule(v.stuck, site)):
            out.append(msg)
    if out:
        return out
    by_site: dict[tuple[int, int, int], list[WarpView]] = defaultdict(list)
    for v in stuck:
        by_site[(v.stuck.site_id, v.stuck.stage, v.stuck.phase)].append(v)
    for (sid, stage, phase), group in by_site.items():
        site = by_id.get(sid)
        if site is None:
            out.append(f"warps wait on unknown site {sid} [{stage}] phase {phase}")
            continue
        others = [v for v in views if v not in group]
        if site.op == "consumer_wait" and site.barrier == "full":
            out.append(_consumer_rule(site, stage, phase, group, others, by_id, complete))
        elif site.op in ("producer_acquire", "producer_tail") and site.barrier == "empty":
            msg = _producer_rule(site, stage, phase, others, by_id, complete)
            if msg:
                out.append(msg)
        elif site.kind == "raw":
            out.append(_raw_rule(site, stage, phase, group, others, by_id))
        else:
            out.append(f"{len(group)} warps stuck at {site.describe(stage, phase)}")
    return out


def _consumer_rule(
    site: Site,
    stage: int,
    phase: int,
    group: list[WarpView],
    others: list[WarpView],
    by_id: dict[int, Site],
    complete: bool,
) -> str:
    key = site.pipeline_key
    producers = [v for v in others if v.role(by_id) == "producer"]
    same = [
        v
        for v in producers
        if v.stuck and (s := by_id.get(v.stuck.site_id)) and s.pipeline_key == key
    ]
    produced = max(
        [_progress_on(producers, key, ("producer_acquire",), by_id)]
        + [_stuck_seq_done(v) for v in same]
    )
    waiting_for = group[0].stuck.seq
    p_stuck = [v for v in producers if v.stuck]
    p_tail = [v for v in same if by_id[v.stuck.site_id].op == "producer_tail"]
    if p_tail or (waiting_for and produced >= waiting_for) or (producers and not p_stuck):
        past = (
            f" (producer acquired #{produced}, consumer waits for #{waiting_for})"
            if waiting_for and produced
            else ""
        )
        return (
            f"consumers wait on full[{stage}] phase {phase} while the producer is past "
            f"it{past}: the full barrier never completed → expect_tx larger than the bytes "
            f"delivered, a TMA load missing, or full's arrive count too large? "
            f"({site.where})"
        )
    if same:
        ps = same[0].stuck
        pw = by_id[ps.site_id].describe(ps.stage, ps.phase)
        return (
            f"circular wait: consumers wait on full[{stage}] phase {phase} (#{waiting_for})"
            f" and the producer waits on {pw} (#{ps.seq}) before filling it: a "
            f"consumer_release missing or on the wrong stage, or the producer's phase "
            f"bookkeeping off? ({site.where})"
        )
    if p_stuck:
        ps = p_stuck[0].stuck
        psite = by_id.get(ps.site_id)
        pw = psite.describe(ps.stage, ps.phase) if psite else f"site {ps.site_id}"
        return (
            f"consumers wait on full[{stage}] phase {phase} of this pipeline while the "
            f"producer waits on {pw} of another pipeline: the records do not show "
            f"whether it filled this stage ({site.where})"
        )
    if not complete:
        return (
            f"consumers wait on full[{stage}] phase {phase} and this CTA has no producer "
            f"record or beacon, but the buffer lost events (stuck reports dropped or "
            f"beacon slots shared by CTAs): the producer's state is unknown "
            f"({site.where})"
        )
    return (
        f"consumers wait on full[{stage}] phase {phase} and no producer warp completed "
        f"any wait: the producer never ran (role dispatch / warp index?) or exited early "
        f"({site.where})"
    )


def _producer_rule(
    site: Site,
    stage: int,
    phase: int,
    others: list[WarpView],
    by_id: dict[int, Site],
    complete: bool,
) -> str | None:
    consumers = [v for v in others if v.role(by_id) == "consumer"]
    c_stuck = [
        v
        for v in consumers
        if v.stuck and (s := by_id.get(v.stuck.site_id)) and s.pipeline_key == site.pipeline_key
    ]
    if c_stuck:
        return None  # reported from the consumers' side (circular wait)
    consumed = _progress_on(consumers, site.pipeline_key, ("consumer_wait",), by_id)
    done = f" (last consumer_wait #{consumed})" if consumed else ""
    if not consumers and not complete:
        return (
            f"{site.op} waits on empty[{stage}] phase {phase} and this CTA has no consumer "
            f"record or beacon, but the buffer lost events: the consumers' state is "
            f"unknown ({site.where})"
        )
    if site.op == "producer_tail":
        return (
            f"producer_tail waits on empty[{stage}] phase {phase} while the consumers are "
            f"done{done}: fewer consumer releases than stages filled (release skipped at "
            f"the end?) or empty's arrive count larger than the releases ({site.where})"
        )
    return (
        f"producer waits on empty[{stage}] phase {phase} while the consumers are "
        f"done{done}: consumer release missing, or the empty barrier's arrive count "
        f"larger than the releases ({site.where})"
    )


def _raw_rule(
    site: Site,
    stage: int,
    phase: int,
    group: list[WarpView],
    others: list[WarpView],
    by_id: dict[int, Site],
) -> str:
    """A raw mbarrier (no cutlass.pipeline): who arms it, who arrives, who delivers bytes."""
    what = site.describe(stage, phase)
    passed = [v for v in others if v.last and v.last.site_id == site.id]
    if passed:
        return (
            f"{len(group)} warps wait on {what} that {len(passed)} other warps passed: "
            f"they wait for a later phase that nobody completes (phase bookkeeping, or "
            f"arrivals counted once for all?)"
        )
    ops = [s for s in by_id.values() if s.kind == "raw_op"]
    arms = [s for s in ops if "expect_tx" in s.op]
    senders = [s for s in ops if s.op == "store_async_dsmem"]
    arrives = [s for s in ops if s.op == "mbarrier_arrive"]
    inits = [s for s in ops if s.op == "mbarrier_init"]

    def at(xs: list[Site]) -> str:
        return ", ".join(dict.fromkeys(x.where for x in xs))

    head = f"every waiting warp ({len(group)}) waits on {what} and none passed it"
    if arms:
        nbytes = sorted({s.tx_bytes for s in arms if s.tx_bytes is not None})
        tx = f" ({', '.join(map(str, nbytes))} B)" if nbytes else ""
        send = f", bytes delivered by st.async complete_tx at {at(senders)}" if senders else ""
        return (
            f"{head}; the kernel arms its raw barriers with arrive.expect_tx{tx} at "
            f"{at(arms)}{send}: the phase completes only when every arrival AND every "
            f"expected byte landed → expect_tx larger than the bytes delivered, a sender "
            f"(peer CTA) missing or aiming at another barrier / slot, or the arm missing?"
        )
    if arrives:
        init = f" (init at {at(inits)})" if inits else ""
        return (
            f"{head}; the kernel arrives on raw barriers at {at(arrives)}{init}: fewer "
            f"arrivals than the init count, arrivals on another barrier or phase, or an "
            f"arriving warp that exited early?"
        )
    return (
        f"{head}; no raw arrive / expect_tx / complete_tx on an mbarrier was traced in "
        f"this kernel's own code: nobody arrives on it (missing mbarrier_arrive), or the "
        f"arrivals come from code the probes do not see"
    )


def diagnose(snapshot: ProbeSnapshot, sites: Any = None, *, stalled: bool = False) -> list[str]:
    """One line per recognized pattern, aggregated over CTAs (most frequent first)."""
    by_id = _as_sites(sites)
    views = warp_views(snapshot)
    ctas: dict[int, list[WarpView]] = defaultdict(list)
    for v in views.values():
        ctas[v.cta].append(v)
    counts: dict[str, list[int]] = defaultdict(list)
    complete = snapshot.complete  # once: it scans every record and beacon
    for cta, vs in sorted(ctas.items()):
        for msg in dict.fromkeys(_cta_rules(vs, by_id, complete)):
            counts[msg].append(cta)
    lines = []
    for msg, cs in sorted(counts.items(), key=lambda kv: (-len(kv[1]), kv[1][0])):
        where = f"CTA {cs[0]}" if len(cs) == 1 else f"{len(cs)} CTAs ({_ranges(cs)})"
        lines.append(f"{where}: {msg}")
    if snapshot.dropped_records:
        lines.append(
            f"{snapshot.dropped_records} more stuck reports did not fit the buffer "
            f"(raise max_records)"
        )
    if not snapshot.stuck:
        if snapshot.beacons and stalled:
            lines.append(
                "no bounded wait timed out yet but no warp completed a wait: the hang "
                "is outside mbarrier waits (named barrier, spin on a flag, TMEM "
                "allocation?) → printf-bisection; last events: "
                + _last_events_summary(views, by_id)
            )
        elif stalled:
            lines.append(
                "no warp ever completed an instrumented wait (or beacons are off): "
                "the hang is before the first wait or outside mbarrier waits"
            )
    return lines


def _ranges(xs: list[int]) -> str:
    xs, parts, i = sorted(xs), [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts[:8]) + (",…" if len(parts) > 8 else "")


def _last_events_summary(views: dict[tuple[int, int], WarpView], by_id: dict[int, Site]) -> str:
    seen: dict[str, int] = defaultdict(int)
    for v in views.values():
        if v.last:
            site = by_id.get(v.last.site_id)
            desc = site.describe(v.last.stage, v.last.phase) if site else f"site {v.last.site_id}"
            seen[f"{v.role(by_id)} warp {v.warp}: {desc}"] += 1
    return "; ".join(f"{k} ×{n}" for k, n in sorted(seen.items())[:6])
