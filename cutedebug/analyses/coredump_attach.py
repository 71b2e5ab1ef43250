"""A hung worker's GPU state read through cuda-gdb attached to it, before the kill (#25).

The driver's coredump collects the state of every SM holding warps, 35-67 ms an SM on the
H200 (6-9 s for a kernel that holds all 132), and it ends the kernel it dumps: a dump asked
before the kill decision turned three hangs into CRASH (reports/2026-12-02-h200-s6, call3),
so its seconds cannot be moved off the verdict. cuda-gdb attached to the live worker, with the
host libraries' symbols left unloaded, listed a full GPU's kernel, SMs and focused warps in
0.9 s and left the kernel running after it detached (tools/attach_probe.py, same reports,
call5).

A coredump run (``--coredump``) takes the hung worker's state this way by default
(``CUTEDEBUG_COREDUMP_READ=attach``; ``dump`` takes the driver's core instead): the
before-kill hook (coredump.attach_or_dump: :func:`read_or_dump` given the core reader's rounds,
coredump._read: every warp, per-PC frames and offsets, the waiting warps' barrier registers)
runs them over the attached process, with the trace-time tables from the worker's events so
far and the SASS nvdisasm made of its cubin meanwhile (coredump.prefetch_sass), and keeps the
report for coredump.analyse; cuda-gdb's quit detaches, then the watchdog kills the worker as
usual. When
attaching fails (no cuda-gdb, no permission, a round past its time, no warp listed) the hook
takes the driver's dump instead, and the report says why. The worker of such a run allows any
process to trace it (``allow_ptrace``: Yama's ptrace_scope 1 refuses a debugger that is not
its ancestor). On the H200 (reports/2026-12-02-h200-s7, call1) it added 1.1-1.9 s where the
dump added 0.6-7.5 s (FA-4 forward's two full-grid hangs: 1.9 / 1.8 s against 6.6 / 6.7 s),
with the same localization, a healthy GPU and nothing left.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cutedebug.analyses import coredump_capture
from cutedebug.analyses.cudagdb import GdbSession
from cutedebug.errors import UsageError
from cutedebug.event import Event
from cutedebug.event_kinds import CheckpointSites, Compiled

READ_VAR = "CUTEDEBUG_COREDUMP_READ"
READS = ("dump", "attach")
ATTACH_LIMIT_S = 20.0  # every round together; past it the dump is taken instead


def read_mode() -> str:
    """$CUTEDEBUG_COREDUMP_READ: "attach" (unset or empty) or "dump"; UsageError otherwise."""
    raw = os.environ.get(READ_VAR, "").strip()
    if raw and raw not in READS:
        raise UsageError(f"{READ_VAR}={raw!r}: allowed values are {', '.join(READS)}")
    return raw or "attach"


def tables(events_path: Path | str) -> tuple[list, list[dict[str, Any]]]:
    """The trace-time wait table and checkpoint sites a worker has written to its events so
    far (its compile's; both empty before it), for placing the attached reader's PCs."""
    from cutedebug.instrument import waitsites

    compiled, checkpoints = Compiled(), CheckpointSites()
    try:
        lines = Path(events_path).read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            ev = Event.from_json(json.loads(line))
        except (ValueError, TypeError):
            continue  # a partial last line, or one the runner reports as malformed itself
        if isinstance(ev.payload, Compiled) and ev.payload.wait_sites is not None:
            compiled = ev.payload  # the last compile that wrote a wait table
        elif isinstance(ev.payload, CheckpointSites):
            checkpoints = ev.payload
    return waitsites.sites_from_json(compiled.wait_sites), list(checkpoints.sites or [])


# What coredump gives read_or_dump: its reader's rounds (coredump._read), the SASS of the run's
# cubin (coredump._prefetched_sass) and where the report waits for analyse (keep_attached)
Reader = Callable[..., Any]


def attach_read(
    ctx: dict[str, Any],
    read: Reader,
    sass_of: Callable[[Path, dict[str, Any]], Any],
    keep: Callable[[Path, Any], None],
    limit_s: float | None = None,
) -> dict[str, Any] | None:
    """Read the launched worker ``ctx["pid"]`` of a coredump run (its cubin kept in the run
    folder) through an attached cuda-gdb: {"attach": {"attach_s", "warps", "rounds_s"}} with
    the report given to ``keep``, {"attach": {"error": ...}} when it could not, None for any
    other child."""
    if ctx.get("phase") != "launched" or not ctx.get("events_path") or not ctx.get("pid"):
        return None
    d = Path(ctx["events_path"]).parent
    if not (d / "kernel.cubin").exists():
        return None  # not a coredump run's worker (request_fields keeps the cubin)
    pid = int(ctx["pid"])
    limit_s = ATTACH_LIMIT_S if limit_s is None else limit_s
    t0 = time.monotonic()
    info: dict[str, Any] = {}
    wait_sites, cp_sites = tables(ctx["events_path"])
    sass = sass_of(d, info)  # nvdisasm, started by prefetch_sass
    gdb = None
    try:
        gdb = GdbSession(f"process {pid}", pid=pid)
        rep = read(gdb, f"process {pid}", sass, wait_sites, cp_sites, t0 + limit_s)
        rep.processes = gdb.started
    except Exception as e:  # noqa: BLE001  (whatever failed, the dump must still be taken)
        return {
            "attach": {
                "error": f"{type(e).__name__}: {e}"[:400],
                "attach_s": round(time.monotonic() - t0, 3),
            }
        }
    finally:
        if gdb is not None:
            gdb.close()  # its quit detaches: the worker is killed next, by the watchdog
    keep(d, rep)
    return {
        "attach": {
            "attach_s": round(time.monotonic() - t0, 3),
            "warps": len(rep.warps),
            "rounds_s": rep.rounds_s,
            **{k: v for k, v in info.items() if k.startswith("nvdisasm")},
        }
    }


def read_or_dump(
    ctx: dict[str, Any],
    read: Reader,
    sass_of: Callable[[Path, dict[str, Any]], Any],
    keep: Callable[[Path, Any], None],
) -> dict[str, Any] | None:
    """:func:`attach_read`, and the driver's dump (coredump_capture.before_kill) only when
    attaching failed."""
    got = attach_read(ctx, read, sass_of, keep)
    if got is not None and "error" not in got["attach"]:
        return got
    if got is not None:  # a debugger killed mid-attach can leave the worker stopped (its
        try:  # SIGSTOP delivered on the automatic detach): the driver's dump needs it running
            os.kill(int(ctx["pid"]), signal.SIGCONT)
        except OSError:
            pass
    dumped = coredump_capture.before_kill(ctx)
    if got is None:
        return dumped
    return {**got, **(dumped or {})}
