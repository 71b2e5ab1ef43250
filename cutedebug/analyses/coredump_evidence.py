"""The HANG (and crash) evidence a GPU core gives, in the probes' vocabulary.

From the per-warp records of cutedebug.analyses.coredump: stuck sites (one per waiting warp, plus
the warps that are gone where that says where their role stopped), per-role answers in the
vocabulary of printf-bisection (the first site a role never gets past), a grade against the
scenario's expected localization, a diagnosis line per role, the stuck map's picture, and a
crash's faulting warp, PC and line.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from cutedebug.analyses.cudagdb import CoreReport, WarpRecord
from cutedebug.instrument.probe_diagnosis import PICTURE_MAX_ITEMS


def parity(w: WarpRecord) -> int | None:
    c = w.construct
    if c is None or c.kind != "mbarrier_wait":
        return None
    if c.phase_reg == "RZ":
        return 0
    v = w.registers.get(c.phase_reg)
    return None if v is None else (v >> 31) & 1 if v >= 2 else v & 1


def barrier_offset(w: WarpRecord) -> int | None:
    """The waited barrier's shared-memory offset in its CTA's window (register + immediate)."""
    c = w.construct
    v = w.registers.get(c.address_reg) if c is not None else None
    return None if v is None else ((v + c.address_imm) & 0xFFFFFF)


def global_address(w: WarpRecord) -> str | None:
    """The address a spinning warp loads from (both halves of a 64-bit register pair)."""
    c = w.construct
    if c is None or c.kind != "spin_load" or c.address_reg not in w.registers:
        return None
    v = w.registers[c.address_reg] & 0xFFFFFFFF
    if c.address_hi:
        if c.address_hi not in w.registers:
            return None
        v |= (w.registers[c.address_hi] & 0xFFFFFFFF) << 32
    return f"{v + c.address_imm:#x}"


def stuck_sites(
    rep: CoreReport, cp_sites: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """One entry per live warp that waits (as the probes give one per stuck warp), plus one
    per warp that is gone where that implies where its role stopped (:func:`inferred_sites`).
    Computed once per core and checkpoint table (role_answers, diagnosis and grade ask again;
    a big grid has thousands of entries); a new list each call."""
    key = ("stuck_sites", repr(cp_sites or []))
    if key not in rep.derived:
        rep.derived[key] = _stuck_sites(rep, cp_sites or [])
    return list(rep.derived[key])


def bounded(
    sites: list[dict[str, Any]], limit: int = PICTURE_MAX_ITEMS
) -> tuple[list[dict[str, Any]], int]:
    """At most ``limit`` stuck sites, the first of every kind (role, op, barrier, place, what
    the warp does, inferred or not) kept first, in their order; and how many were left out.
    The probes' pictures are bounded the same way (probe_diagnosis.PICTURE_MAX_ITEMS)."""
    return first_of_each_kind(
        sites,
        lambda s: (s["role"], s["op"], s["barrier"], s["location"], s["kind"], s.get("inferred")),
        limit,
    )


def first_of_each_kind(items: list, kind: Any, limit: int) -> tuple[list, int]:
    """At most ``limit`` of ``items`` in their order: the first item of every kind, then the
    others from the start; and how many were left out."""
    if len(items) <= limit:
        return list(items), 0
    seen: set = set()
    keep: set[int] = set()
    for i, x in enumerate(items):
        k = kind(x)
        if k not in seen:
            seen.add(k)
            keep.add(i)
    keep = set(sorted(keep)[:limit])
    i = 0
    while len(keep) < limit:
        keep.add(i)
        i += 1
    return [x for i, x in enumerate(items) if i in keep], len(items) - len(keep)


def pipeline_role(w: WarpRecord) -> str:
    """The probes' role of a warp at a pipeline wait: the side of its op (producer_* ->
    producer, consumer_* -> consumer), whatever bisection calls the function it waits in (a
    library's producer function may be named by its function, "load_tma", or be "all");
    elsewhere bisection's role."""
    r = w.site.role if w.site is not None else "any"
    return r if r in ("producer", "consumer") else w.role


def _stuck_sites(rep: CoreReport, cp_sites: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for w in sorted(rep.warps, key=lambda w: (w.cta, w.warp)):
        if w.construct is None or w.construct.kind in ("other", "exit"):
            continue
        off = barrier_offset(w)
        out.append(
            {
                "cta": w.cta,
                "block": list(w.block),
                "warp": w.warp,
                "role": w.role,
                "pipeline_role": pipeline_role(w),
                "op": w.op,
                "barrier": w.barrier or None,
                "stage": None,
                "phase": parity(w),
                "waited_ms": None,
                "location": f"{os.path.basename(w.file)}:{w.line}" if w.file else None,
                "site": w.site.seq if w.site is not None else None,
                "site_exact": w.site_exact,
                "kind": w.construct.kind,
                "instruction": w.construct.anchor.text if w.construct.anchor else None,
                "barrier_id": w.construct.barrier_id,
                "pc": f"{w.offset:#x}" if w.offset is not None else f"{w.pc:#x}",
                "sm": w.sm,
                "smem_offset": f"{off:#x}"
                if off is not None and w.construct.kind == "mbarrier_wait"
                else None,
                "address": global_address(w),
                "source": "coredump",
            }
        )
    return out + inferred_sites(rep, cp_sites)


def missing_warps(rep: CoreReport) -> dict[int, list[int]]:
    """CTA -> its warps absent from the core (exited), for CTAs that still have live warps."""
    kernels = {k.id: k for k in rep.kernels}
    live: dict[tuple[int, int], set[int]] = {}
    for w in rep.warps:
        live.setdefault((w.kernel, w.cta), set()).add(w.warp)
    out = {}
    for (kid, cta), ws in live.items():
        k = kernels.get(kid)
        if k is None:
            continue
        n = -(-(k.block[0] * k.block[1] * k.block[2]) // 32)
        gone = sorted(set(range(n)) - ws)
        if gone:
            out[cta] = gone
    return out


ARRIVES_ON = {"empty": ("consumer", "consumer_release"), "full": ("producer", "producer_commit")}


def inferred_sites(rep: CoreReport, cp_sites: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Warps gone from the core while live warps of the same CTA wait on a pipeline barrier
    that no live warp's role arrives on: the arriving role (consumers on empty, the producer
    on full) exited before its arrive (consumer_release / producer_commit). One entry per gone
    warp of those CTAs."""
    gone = missing_warps(rep)
    out = []
    by_cta: dict[int, list[WarpRecord]] = {}
    if gone:
        for w in rep.warps:
            by_cta.setdefault(w.cta, []).append(w)
    for cta, warps in sorted(gone.items()):
        live = by_cta.get(cta, [])
        roles = {pipeline_role(w) for w in live}  # the producer / consumer sides still alive
        if roles & {"?", "any", "all"}:
            continue  # a live warp of unknown role may be the one that arrives
        waits = [w for w in live if w.barrier in ARRIVES_ON and w.site is not None]
        implied = {ARRIVES_ON[w.barrier] for w in waits} - {
            r for r in ARRIVES_ON.values() if r[0] in roles
        }
        for role, op in sorted(implied):
            w = next(x for x in waits if ARRIVES_ON[x.barrier] == (role, op))
            site = next(
                (c for c in cp_sites if c.get("op") == op and c.get("role") in (role, "all")), None
            )
            for gw in warps:
                out.append(
                    {
                        "cta": cta,
                        "block": list(w.block),
                        "warp": gw,
                        "role": role,
                        "op": op,
                        "barrier": w.barrier,
                        "stage": None,
                        "phase": None,
                        "waited_ms": None,
                        "location": f"{os.path.basename(site['file'])}:{site['line']}"
                        if site
                        else None,
                        "site": None,
                        "kind": "exited",
                        "inferred": True,
                        "source": "coredump",
                        "why": f"warp {gw} is gone from the core while {w.role} warps wait "
                        f"on {w.barrier} ({w.op}) and no live warp is a {role}: the "
                        f"{role} warps exited before their {op}",
                    }
                )
    return out


def role_answers(rep: CoreReport, cp_sites: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per role, the first bisection site its warps never get past (what printf-bisection
    answers), from the core alone: the op that contains the wait most of its warps sit in, the
    named barrier itself, for a hand-written spin the next site after the spin's line, for a
    role whose warps are gone the arrive they skipped (:func:`inferred_sites`)."""
    by_role: dict[str, Counter] = {}
    first: dict[tuple, dict[str, Any]] = {}
    for s in stuck_sites(rep, cp_sites):
        if s["role"] in ("?", None):
            continue
        key = (s["op"], s["barrier"], s["kind"], s["location"])
        by_role.setdefault(s["role"], Counter())[key] += 1
        first.setdefault((s["role"], *key), s)
    out: dict[str, dict[str, Any]] = {}
    for role, counts in by_role.items():
        (op, barrier, kind, location), n = counts.most_common(1)[0]
        s = first[(role, op, barrier, kind, location)]
        if s.get("inferred"):
            out[role] = {"op": op, "barrier": barrier, "warps": n, "how": s["why"]}
            continue
        if kind == "spin_load" and cp_sites:
            w = next(x for x in rep.warps if x.op == op and x.role == role)
            nxt = _next_site(
                w.file, w.line + 1, [c for c in cp_sites if c.get("role") in (role, "all")]
            )
            if nxt is not None:
                name = f" {nxt['name']!r}" if nxt.get("name") else ""
                out[role] = {
                    "op": nxt["op"],
                    "barrier": nxt.get("barrier") or None,
                    "site": nxt["id"],
                    "warps": n,
                    "how": f"spins on a global load at {location}: never reaches "
                    f"#{nxt['id']} {nxt['op']}{name} "
                    f"({os.path.basename(nxt['file'])}:{nxt['line']})",
                }
                continue
        out[role] = {
            "op": op,
            "barrier": barrier,
            "warps": n,
            "how": f"{n} warp(s) in {kind} at {location}",
        }
    return out


def grade(
    expected: dict[str, Any], rep: CoreReport, cp_sites: list[dict[str, Any]], by: str = "probes"
) -> dict[str, Any]:
    """The scenario's expected localization against the core: against the stuck sites when the
    probes grade it, against the per-role answers when only bisection could (stage is graded
    by neither)."""
    want = {k: v for k, v in expected.items() if k != "stage"}
    if not want:
        return {"ok": None, "expected": {}}
    if by == "bisect":
        cands = [{"role": r, **a} for r, a in role_answers(rep, cp_sites).items()]
    else:
        cands = stuck_sites(rep, cp_sites)

    def same(c: dict[str, Any], k: str, v: Any) -> bool:  # a role in either vocabulary
        return c.get(k) == v or (k == "role" and v in ("any", c.get("pipeline_role")))

    for c in cands:
        if all(same(c, k, v) for k, v in want.items()):
            return {
                "ok": True,
                "expected": want,
                "matched": {
                    k: c.get(k)
                    for k in ("role", "op", "barrier", "location", "how")
                    if c.get(k) is not None
                },
            }
    return {
        "ok": False,
        "expected": want,
        "why": "no warp of the core agrees with every expected field",
        "got": [{k: c.get(k) for k in ("role", "op", "barrier")} for c in cands][:8],
    }


def crash_evidence(rep: CoreReport) -> dict[str, Any]:
    """The faulting warp, PC and line of a core written on a GPU exception: the PC cuda-gdb
    says the exception was triggered at, its instruction in the SASS and that instruction's
    line (a memory instruction keeps its own line: compare memcheck's)."""
    ex = dict(rep.exception or {})
    w = next((x for x in rep.warps if (x.sm, x.hw_warp) == (ex.get("sm"), ex.get("hw_warp"))), None)
    if w is not None:
        ex.update(
            cta=w.cta,
            warp=w.warp,
            frames=w.frames,
            pc_offset=f"{w.offset:#x}" if w.offset is not None else None,
        )
    base = rep.base.get(ex.get("kernel", w.kernel if w is not None else -1))
    if ex.get("pc") and base is not None and rep.sass is not None:
        off = int(ex["pc"], 16) - base
        n = rep.sass.index_at(off)
        if n is not None and rep.sass.instrs[n].offset == off:
            i = rep.sass.instrs[n]
            ex.update(fault_offset=f"{off:#x}", instruction=i.text)
            if i.line:
                ex["sass_file"], ex["sass_line"] = i.file, i.line
    if not ex.get("line"):
        if ex.get("sass_line"):
            ex["file"], ex["line"] = ex["sass_file"], ex["sass_line"]
        elif w is not None and w.file:
            ex["file"], ex["line"] = w.file, w.line
    if ex.get("file"):
        ex["where"] = f"{os.path.basename(ex['file'])}:{ex['line']}"
    return ex


def diagnosis(rep: CoreReport, cp_sites: list[dict[str, Any]]) -> list[str]:
    """The patterns recognized (most CTAs first), then one line per role: where its warps
    are (or why they are gone), over how many CTAs."""
    lines = patterns(rep)
    ctas = sorted({w.cta for w in rep.warps})
    for role, a in role_answers(rep, cp_sites).items():
        bar = f" {a['barrier']}" if a["barrier"] else ""
        lines.append(
            f"{role}: {a['how']} ({a['op']}{bar}; {a['warps']} warp(s) over "
            f"{len(ctas)} CTA(s) in the core)"
        )
    return lines


def patterns(rep: CoreReport) -> list[str]:
    """What the warps' places say together, per CTA, aggregated over CTAs:

    - consumers wait on full with parity 0 (their first lap) while the producer waits on
      empty with parity 0 (a producer starts at parity 1: it is in its second lap, so it filled
      every stage once): the full barrier never completed;
    - a named barrier expects more threads than the live warps of the CTA can bring: the count
      is larger than the warps that arrive (or some of them exited / wait elsewhere).
    """
    found: dict[str, list[int]] = {}
    by_cta: dict[int, list[WarpRecord]] = {}
    for w in rep.warps:
        by_cta.setdefault(w.cta, []).append(w)
    for cta, ws in by_cta.items():
        cons = [w for w in ws if w.op == "consumer_wait" and w.barrier == "full"]
        prod = [
            w for w in ws if w.op in ("producer_acquire", "producer_tail") and w.barrier == "empty"
        ]
        if cons and prod and {parity(w) for w in cons} == {0} and {parity(w) for w in prod} == {0}:
            site = cons[0]
            found.setdefault(
                "consumers wait on full with parity 0 (first lap) while the producer waits on "
                "empty with parity 0 (its second lap: it filled every stage): the full barrier "
                "never completed -> expect_tx larger than the bytes delivered, a TMA load "
                f"missing, or full's arrive count too large? ({os.path.basename(site.file)}:"
                f"{site.line})",
                [],
            ).append(cta)
        for bar in {
            (w.construct.barrier_id, w.construct.threads)
            for w in ws
            if w.construct is not None
            and w.construct.kind == "named_barrier"
            and w.construct.threads
        }:
            at = [
                w
                for w in ws
                if w.construct is not None
                and w.construct.kind == "named_barrier"
                and (w.construct.barrier_id, w.construct.threads) == bar
            ]
            need = -(-bar[1] // 32)
            others = [w for w in ws if w not in at]
            if need > len(at) + len(others):
                found.setdefault(
                    f"bar.sync {bar[0]}, {bar[1]} expects {need} warps; {len(at)} wait there "
                    f"and no other warp of the CTA is alive to arrive: the thread count is "
                    f"larger than the warps that arrive (or some exited first) "
                    f"({os.path.basename(at[0].file)}:{at[0].line})",
                    [],
                ).append(cta)
            elif need > len(at):
                found.setdefault(
                    f"bar.sync {bar[0]}, {bar[1]} expects {need} warps; {len(at)} wait there "
                    f"while {len(others)} other warp(s) of the CTA wait elsewhere "
                    f"({os.path.basename(at[0].file)}:{at[0].line})",
                    [],
                ).append(cta)
    out = []
    for msg, ctas in sorted(found.items(), key=lambda kv: -len(kv[1])):
        out.append(f"{len(ctas)} CTA(s): {msg}")
    return out


def picture(rep: CoreReport) -> dict[str, Any]:
    """The core as a probe snapshot (stuck records, no beacons) and its site list, so the
    report draws the same stuck map as for probes (cutedebug.reporting.stuck_map)."""
    from cutedebug.instrument import probes

    table = probes.SiteTable()
    stuck = []
    for w in rep.warps:
        c = w.construct
        if c is None or c.kind in ("other", "exit"):
            continue
        s = w.site
        site = table.add(
            kind="pipeline" if s is not None and s.pipeline_class else "raw",
            op=w.op or c.kind,
            barrier=w.barrier or "",
            pipeline_class=getattr(s, "pipeline_class", ""),
            pipeline_name=getattr(s, "pipeline_name", ""),
            file=w.file,
            line=w.line,
            function=getattr(s, "function", ""),
            code=getattr(s, "code", ""),
            stages=getattr(s, "stages", None),
        )
        p = parity(w)
        stuck.append(
            probes.StuckRecord(
                site_id=site.id,
                block=w.block,
                block_linear=w.cta,
                warp=w.warp,
                stage=-1,
                phase=p if p is not None else 0,
                seq=0,
                waited_ns=0,
                smid=w.sm,
                lane=w.first_lane,
                globaltimer=0,
            )
        )
    # bounded as a probe picture is (the footnote lines and the diagnosis count them all)
    kept, unlisted = first_of_each_kind(
        stuck, lambda r: (r.site_id, r.warp, r.phase), PICTURE_MAX_ITEMS
    )
    return {
        "stuck": [r.to_json() for r in kept],
        "beacons": [],
        "n_stuck_reported": len(stuck),
        "stuck_unlisted": unlisted,
        "sites": table.to_json(),
        "lines": picture_lines(rep),
    }


def picture_lines(rep: CoreReport, limit: int = 16) -> list[str]:
    """The stuck map's footnote for a core: identical places on one line with their CTAs and
    warps (a core has no wait time or item number, unlike a probe's stuck record)."""
    groups: dict[tuple, list[WarpRecord]] = {}
    for w in rep.warps:
        c = w.construct
        if c is None or c.kind in ("other", "exit"):
            continue
        where = f"{os.path.basename(w.file)}:{w.line}" if w.file else "?"
        bar = f" bar.sync {c.barrier_id}, {c.threads}" if c.kind == "named_barrier" else ""
        key = (
            w.op or c.kind,
            w.barrier,
            parity(w),
            barrier_offset(w) if c.kind == "mbarrier_wait" else None,
            bar,
            where,
        )
        groups.setdefault(key, []).append(w)
    out = []
    for (op, barrier, p, off, bar, where), ws in sorted(groups.items(), key=lambda kv: -len(kv[1]))[
        :limit
    ]:
        ctas, warps = {w.cta for w in ws}, {w.warp for w in ws}
        detail = "".join(
            [
                f" {barrier}" if barrier else "",
                bar,
                f", parity {p}" if p is not None else "",
                f", smem {off:#x}" if off is not None else "",
            ]
        )
        out.append(
            f"  {'CTA' if len(ctas) == 1 else 'CTAs'} {_ranges(ctas)} "
            f"{'warp' if len(warps) == 1 else 'warps'} {_ranges(warps)}: "
            f"{op}{detail} ({where}), {len(ws)} warp(s) in the core"
        )
    return out


def _ranges(xs: set[int]) -> str:
    """ "0-3, 7" for {0, 1, 2, 3, 7}."""
    out, xs_sorted = [], sorted(xs)
    start = prev = xs_sorted[0]
    for x in xs_sorted[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(out)


def _next_site(file: str, line: int, cp_sites: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first bisection site at or after file:line (program order): where a warp stuck in a
    hand-written loop at that line would arrive next."""
    after = [c for c in cp_sites if c.get("file") == file and c.get("line", 0) >= line]
    return min(after, key=lambda c: (c["line"], c["id"])) if after else None
