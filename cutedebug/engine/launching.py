"""One launch of a compiled kernel and its check, inside the worker (engine/worker.py).

``Launch.once`` launches, synchronizes, reads the probes' records and compares with the
reference, reporting through an ``emit`` callback: the plain run calls it once with the event
channel, schedule perturbation (engine/perturb_runs.py) once per seed with a collector. Also the
pieces it is made of: CUDA error names, the comparison, the output digest and the probe
monitor that streams live pictures while a kernel runs.
"""

from __future__ import annotations

import hashlib
import threading
import time
from contextlib import nullcontext
from typing import Any

from cutedebug.engine.blame import user_call
from cutedebug.errors import CUDA_ERRORS, cuda_error_name  # noqa: F401  (re-exported)


def compare(out, ref, atol: float, rtol: float) -> dict[str, Any]:
    import torch

    out = out.detach().float().cpu()
    ref = ref.detach().float().cpu()
    if out.shape != ref.shape:
        return {
            "ok": False,
            "numel": ref.numel(),
            "n_bad": ref.numel(),
            "frac_bad": 1.0,
            "max_abs_err": float("inf"),
            "max_rel_err": float("inf"),
            "first_bad_index": None,
            "shape_mismatch": [list(out.shape), list(ref.shape)],
        }
    good = torch.isclose(out, ref, atol=atol, rtol=rtol)
    n_bad = int((~good).sum())
    diff = (out - ref).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    rel = diff / ref.abs().clamp_min(1e-30)
    first = None
    if n_bad:
        flat = int((~good).flatten().nonzero()[0])
        first = [int(i) for i in torch.unravel_index(torch.tensor(flat), ref.shape)]
    return {
        "ok": n_bad == 0,
        "numel": ref.numel(),
        "n_bad": n_bad,
        "frac_bad": n_bad / max(ref.numel(), 1),
        "max_abs_err": float(diff.max()) if diff.numel() else 0.0,
        "max_rel_err": float(rel.max()) if rel.numel() else 0.0,
        "first_bad_index": first,
        "n_nan": int(torch.isnan(out).sum()),
        "atol": atol,
        "rtol": rtol,
    }


def digest(t) -> str:
    import torch

    t = t.detach().contiguous().cpu()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


class ProbeMonitor:
    """Streams beacon snapshots from host-mapped memory while the kernel runs.

    Every interval: a "progress" event with the change counter (the runner's stall detector
    watches it), emitted before anything else is computed. Whenever the picture changed, at
    most every ``picture_s``: a second "progress" event that also carries the per-warp picture
    (bounded: probes.PICTURE_MAX_ITEMS), so a kernel that never exits still leaves one.
    """

    def __init__(
        self, events: Any, buf, cfg, sites, interval_s: float = 0.05, picture_s: float = 0.25
    ):
        self.events, self.buf, self.cfg, self.sites = events, buf, cfg, sites
        self.interval_s, self.picture_s = interval_s, picture_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        from cutedebug.instrument import probes

        last_picture_t, last_sig = 0.0, None
        while not self._stop.wait(self.interval_s):
            snap = probes.decode(self.buf.numpy().tobytes(), self.cfg, self.sites)
            fields: dict[str, Any] = {
                "counter": snap.progress_counter_total,
                "stuck": len(snap.stuck),
            }
            # the counter first, on its own: the stall detector must see the records arrive
            # even while the picture of thousands of them is being built
            self.events.emit("progress", **fields)
            sig = probes.progress_signature(snap)
            now = time.monotonic()
            if sig != last_sig and now - last_picture_t >= self.picture_s:
                picture = probes.snapshot_to_json(snap, self.sites)
                self.events.emit("progress", **fields, picture=picture)
                last_picture_t, last_sig = now, sig

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=1.0)


class Launch:
    """One launch of the compiled kernel and its check, reporting through ``emit``.

    The plain run calls ``once`` once; perturbation (engine/perturb_runs.py) calls it per seed
    with fresh inputs (``fresh=True``) and an ``emit`` that collects the events, so every seed is
    judged exactly as a plain run is."""

    def __init__(
        self, kernel, compiled, args, tensors, where, request, probe_buf, probe_cfg, site_table
    ):
        self.kernel, self.compiled, self.args, self.tensors = kernel, compiled, args, tensors
        self.where, self.request = where, request
        self.probe_buf, self.probe_cfg, self.site_table = probe_buf, probe_cfg, site_table
        self.waits_timed_out = False  # the last launch ended by the probes' bounded waits

    def once(self, emit, live=None, fresh: bool = False) -> None:
        import torch

        kernel, compiled, where, request = self.kernel, self.compiled, self.where, self.request
        probe_buf, probe_cfg, site_table = self.probe_buf, self.probe_cfg, self.site_table
        if fresh:  # a later launch: new inputs and outputs, an empty probe buffer
            self.tensors = kernel.make_inputs("cuda")
            self.args = kernel.cute_args(self.tensors)
            if probe_cfg is not None:
                from cutedebug.instrument import probes

                probes.init_buffer(probe_buf.numpy(), probe_cfg)
        args, tensors = self.args, self.tensors
        self.waits_timed_out = False
        atol, rtol = getattr(kernel, "TOLERANCE", (1e-5, 1e-5))
        launch = getattr(kernel, "launch", None)
        monitor = (
            ProbeMonitor(live, probe_buf, probe_cfg, site_table)
            if probe_cfg and live
            else nullcontext()
        )
        emit("launched")
        t0 = time.monotonic()
        with monitor:
            try:
                if launch is not None:
                    launch(compiled, args)
                else:
                    compiled(*args)
                torch.cuda.synchronize()
            except Exception as e:
                msg = str(e)
                if probe_cfg is not None:
                    # Pinned host memory stays readable after the context died. Stuck records
                    # written before the fault mean the waits timed out first: warps that leave
                    # a timed-out wait can fault the CTA (e.g. TMA still landing in its smem).
                    from cutedebug.instrument import probes

                    snap = probes.decode(probe_buf.numpy().tobytes(), probe_cfg, site_table)
                    if snap.stuck or snap.beacons:
                        emit(
                            "probe_report",
                            **probes.snapshot_to_json(snap, site_table),
                            after_cuda_error=True,
                        )
                emit(
                    "cuda_error", name=cuda_error_name(msg) or type(e).__name__, message=msg[:2000]
                )
                return
        emit("synced", kernel_s=round(time.monotonic() - t0, 6))

        if probe_cfg is not None:
            from cutedebug.instrument import probes

            snap = probes.decode(probe_buf.numpy().tobytes(), probe_cfg, site_table)
            emit("probe_report", **probes.snapshot_to_json(snap, site_table))
            if snap.stuck:
                # The waits were bounded: the output is garbage by construction, not a
                # MISMATCH.
                self.waits_timed_out = True
                emit("checked", skipped="bounded waits timed out", ok=None)
                return

        from cutedebug.engine import valuemap

        out = user_call(where, "output", kernel.output, tensors)
        ref = user_call(where, "reference", kernel.reference, tensors)
        stats = compare(out, ref, atol, rtol)
        stats["digest"] = digest(out)
        if stats["ok"] is False and "shape_mismatch" not in stats:
            # where the wrong values are (never raises)
            stats.update(
                valuemap.mismatch_fields(
                    kernel, out, ref, atol, rtol, request.get("dump_dir"), stats["digest"]
                )
            )
        emit("checked", **stats)
