"""What the probes say about one run, from its events: the stuck sites, the per-warp picture and
the diagnosis (the runner's evidence; the stuck map is drawn from the same picture by
``cutedebug.reporting.stuck_map``). Never imports torch or cutlass.
"""

from __future__ import annotations

from typing import Any

from cutedebug.engine import verdict as V
from cutedebug.event_kinds import Compiled, CudaError, Progress


def probe_evidence(o: V.Outcome) -> dict[str, Any] | None:
    """Stuck sites, per-warp picture and diagnosis from the probes, if any ran (the stuck
    map is drawn from the same picture by ``cutedebug.reporting.stuck_map``).

    Uses the final probe report when the kernel ended (bounded waits fired) and otherwise the
    last live picture the worker streamed before the watchdog killed it.
    """
    picture, final = probe_picture(o)
    if not picture:
        return None
    from cutedebug.instrument import probes

    sites = (o.last(Compiled) or Compiled()).probe_sites or []
    snap = probes.snapshot_from_json(picture)
    stalled = o.killed_by_watchdog == "stall"
    diagnosis = picture.get("diagnosis") or probes.diagnose(snap, sites, stalled=stalled)
    stuck_sites = []
    for row in picture.get("warps", []):
        st = row.get("stuck")
        if not st:
            continue
        stuck_sites.append(
            {
                "cta": row.get("cta"),
                "warp": row.get("warp"),
                "role": row.get("role"),
                "op": st.get("op"),
                "barrier": st.get("barrier") or None,
                "stage": st.get("stage"),
                "phase": st.get("phase"),
                "waited_ms": st.get("waited_ms"),
                "location": st.get("where"),
                "site": st.get("site"),
            }
        )
    source = (
        "final probe report"
        if final
        else "last live picture before the fault (each warp's last completed event)"
        if o.last(CudaError)
        else "last live picture before the kill"
    )
    return {
        "probe_source": source,
        "stuck_sites": stuck_sites,
        "diagnosis": diagnosis,
        "warps": picture.get("warps", [])[:256],
        "n_stuck_reported": picture.get("n_stuck_reported"),
    }


def probe_picture(o: V.Outcome) -> tuple[dict[str, Any] | None, bool]:
    """The probe picture a run's evidence is drawn from, and whether it is the final report
    (else the last live picture the worker streamed before a kill or a fault)."""
    final = o.event("probe_report")  # its payload is a picture (ProbeReport)
    if final is not None:
        return final, True
    for e in reversed(o.all(Progress)):
        if e.picture:
            return e.picture, False
    return None, False
