"""GPU coredumps: where every warp of a hung or crashed kernel is, with no probes and no recompile.

A run localized this way (``runner.run_scenario(core=Localizer())``: ``cutedebug run/triage
--coredump``) gets, before CUDA initializes in its worker (request ``env``), the driver's coredump
settings (:func:`worker_env`; the capture half is cutedebug.analyses.coredump_capture, re-exported
here): a user-triggered dump through a named pipe in the run folder, a dump on a GPU exception,
memory sections skipped (1-6 MB cores for this repository's kernels on the H200), no abort (the
worker still reports a CUDA error). The worker also keeps its cubin and records, observe-only,
the wait table (cutedebug.instrument.waitsites) and the bisection sites.

- On a hang, the watchdog's before-kill hook (:func:`before_kill`) writes the pipe and waits,
  bounded (:data:`DUMP_LIMIT_S`), until the core is complete (the worker closed it); then the
  child is killed as usual, and falls back to the plain kill when no core comes.
- :func:`read_core` runs cuda-gdb on the core (one process, two rounds of commands, bounded;
  nvdisasm of the cubin while it loads the core; cutedebug.analyses.cudagdb) and makes a
  record per warp: CTA, warp, lanes, PC and its offset, what the SASS there is
  (cutedebug.analyses.sass), the barrier / flag registers, the traced site it belongs to and
  that site's bisection role.
- :func:`analyse` turns a run folder's core into the HANG evidence the probes give (stuck sites,
  per-role answers, diagnosis, the stuck map; cutedebug.analyses.coredump_evidence) with
  "coredump" as the source, or a crash's faulting warp, instruction and line.
- ``cutedebug exec --coredump``: :func:`dump_all` dumps every CUDA process of the command.
"""

from __future__ import annotations

import atexit
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cutedebug.analyses import coredump_attach
from cutedebug.analyses import sass as S
from cutedebug.analyses.coredump_capture import (  # noqa: F401  (the capture half, re-exported)
    CORE_NAME,
    DUMP_LIMIT_S,
    FLAGS_VAR,
    PIPE_NAME,
    SKIP_FLAGS,
    SKIP_MEMORY,
    before_kill,
    cores,
    dump_all,
    elf_complete,
    generation_flags,
    held_open,
    remove_pipes,
    trigger,
    worker_env,
)
from cutedebug.analyses.coredump_evidence import (
    bounded,
    crash_evidence,
    diagnosis,
    grade,
    picture,
    role_answers,
    stuck_sites,
)
from cutedebug.analyses.coredump_place import (  # noqa: F401  (MAX_WARPS re-exported)
    MAX_WARPS,
    _focus,
    _focus_base,
    _offsets,
    _one_per_pc,
    _parse_registers,
    _place_all,
    _register_commands,
    _same_function,
)
from cutedebug.analyses.cudagdb import (
    GDB_LIMIT_S,
    ROUND1,
    CoreReport,
    WarpRecord,
    find_nvdisasm,
    gdb_batch,
    gdb_session,
    parse_exception,
    parse_frames,
    parse_kernels,
    parse_pc_offset,
    parse_warps,
    sections,
)
from cutedebug.engine import lifeline
from cutedebug.event_kinds import CheckpointSites, Compiled

KEEP_CORE_MAX = 64 << 20  # a larger core is removed once read (the cuda-gdb text stays)


# ---- reading a core ------------------------------------------------------------------------


def sass_of_cubin(cubin: Path | str, nvdisasm: str | None = None) -> str | None:
    exe = nvdisasm or find_nvdisasm()
    if not exe or not Path(cubin).exists():
        return None
    try:
        p = lifeline.run_tool([exe, "-g", "-c", str(cubin)], 60)
    except subprocess.TimeoutExpired:
        return None
    return p.stdout if p.returncode == 0 and p.stdout else None


def read_core(
    core: Path | str,
    *,
    sass_text: str | Callable[[], str | None] | None = None,
    wait_sites: list | None = None,
    checkpoint_sites: list[dict[str, Any]] | None = None,
    timeout_s: float = GDB_LIMIT_S,
    cuda_gdb: str | None = None,
) -> CoreReport:
    """Every warp of the core as a record (module docstring). Raises RuntimeError when cuda-gdb
    is missing, too slow, or prints nothing we can read.

    One cuda-gdb process (cudagdb.GdbSession: the core is loaded once), two rounds of commands
    when the SASS is known and the core has one kernel: (1) kernels, every warp, the focus's bt
    and x/1i (the kernel's address, so every absolute PC gets its offset); (2) per distinct PC
    a bt, and the barrier registers of the waiting warps. Otherwise a third round reads the
    registers once the PCs are placed. ``sass_text`` may be a callable (nvdisasm of the cubin):
    it is called while cuda-gdb loads the core.

    Should the session fail (cuda-gdb exits, prints no warp, or a round times out), the same
    rounds go to one ``cuda-gdb -batch`` each, with a fresh time limit, as the reader ran
    before; ``fallback`` says why, and later cores of this process go there directly."""
    global SESSION_FAILED
    if callable(sass_text):
        sass_text = _once(sass_text)
    args = (core, sass_text, wait_sites, checkpoint_sites)
    why = SESSION_FAILED
    if not why:
        gdb = _take_prefetched(core) or gdb_session(core, cuda_gdb)
        try:
            rep = _read(gdb, *args, time.monotonic() + timeout_s)
            rep.processes = gdb.started
            return rep
        except RuntimeError as e:
            why = f"one cuda-gdb process for every round failed: {e}"[:300]
        finally:
            gdb.close()
    elif (pre := _take_prefetched(core)) is not None:
        pre.close(kill=True)  # started before the session was found wanting
    gdb = gdb_batch(core, cuda_gdb)
    rep = _read(gdb, *args, time.monotonic() + timeout_s)
    SESSION_FAILED = why  # -batch read the core the session could not: keep to -batch
    rep.processes, rep.fallback = gdb.started, why
    return rep


# Why the one-process session failed on a core -batch then read (later cores: -batch at once)
SESSION_FAILED = ""


def _once(f: Callable[[], str | None]) -> Callable[[], str | None]:
    done: list[str | None] = []

    def once() -> str | None:
        if not done:
            done.append(f())
        return done[0]

    return once


def _read(
    gdb: Any,
    core: Path | str,
    sass_text: str | Callable[[], str | None] | None,
    wait_sites: list | None,
    checkpoint_sites: list[dict[str, Any]] | None,
    t_end: float,
) -> CoreReport:
    rep = CoreReport(core=str(core))
    t0 = time.monotonic()
    if getattr(gdb, "awaiting", False):  # a prefetch sent round 1 already (prefetch_core)
        rep.prefetched = round(t0 - gdb.sent_at, 3)
    else:
        gdb.send(ROUND1)
    if callable(sass_text):
        sass_text = sass_text()  # while cuda-gdb loads the core
    # the limit counts from now (a prefetch's round has had its head start)
    text, secs = gdb.receive(max(1.0, t_end - t0) + (rep.prefetched or 0.0))
    rep.raw["pass1"], rep.gdb_s, rep.passes = text, secs, 1
    rep.rounds_s.append(secs)
    rep.round1_wait_s = round(time.monotonic() - t0, 3)
    rep.kernels = parse_kernels(text)
    rep.warps = parse_warps(text)
    rep.exception = parse_exception(text)
    if not rep.warps and rep.exception is None:
        raise RuntimeError("cuda-gdb listed no warp in the core: " + text[-300:].strip())
    kernels = {k.id: k for k in rep.kernels}
    for w in rep.warps:
        k = kernels.get(w.kernel)
        if k is not None:
            gx, gy, _ = k.grid
            bx, by, _ = k.block
            w.cta = w.block[0] + w.block[1] * gx + w.block[2] * gx * gy
            w.warp = (w.thread[0] + w.thread[1] * bx + w.thread[2] * bx * by) // 32
    base = _focus_base(text, rep.warps)
    code = S.parse(sass_text) if sass_text else None
    smap = S.map_sites(code, wait_sites or []) if code is not None and code.instrs else None
    # the cubin's SASS describes one kernel: warps of another (e.g. a library's kernel in
    # flight) are listed but not placed in it
    foreign = {
        k.id
        for k in rep.kernels
        if code is not None and code.function and not _same_function(k.name, code.function)
    }
    mine = [w for w in rep.warps if w.kernel not in foreign]
    early = smap is not None and all(w.kernel in base for w in mine)
    if early:  # place the PCs now, so the second round reads the registers too
        _offsets(rep.warps, base)
        _place_all(mine, code, smap, checkpoint_sites or [])
    reps = _one_per_pc(rep.warps)
    cmds: list[str] = []
    if sass_text is None and reps:
        cmds += [_focus(reps[0]), "echo @@disassemble\\n", "disassemble"]
        rep.sass_source = "cuda-gdb disassemble"
    else:
        rep.sass_source = "nvdisasm of the worker's cubin" if sass_text else "none"
    for w in reps:  # the warps table has absolute PCs: x/1i gives the function offset
        cmds += [f"echo @@pc {w.kernel} {w.pc:#x}\\n", _focus(w), "x/1i $pc", "bt"]
    if early:
        cmds += _register_commands(rep.warps)
    if cmds:
        text2, secs2 = gdb.run(cmds, max(1.0, t_end - time.monotonic()))
        rep.raw["pass2"], rep.gdb_s, rep.passes = text2, rep.gdb_s + secs2, 2
        rep.rounds_s.append(secs2)
        sec = sections(text2)
        by_pc: dict[tuple[int, int], list[WarpRecord]] = {}
        for other in rep.warps:
            by_pc.setdefault((other.kernel, other.pc), []).append(other)
        for w in reps:
            lines = sec.get(f"pc {w.kernel} {w.pc:#x}", [])
            frames = parse_frames(lines)
            off = parse_pc_offset(lines)
            if off is not None:
                base.setdefault(w.kernel, w.pc - off)
            for other in by_pc[(w.kernel, w.pc)]:
                other.frames = frames
        _offsets(rep.warps, base)
        if early:
            _parse_registers(rep, sec)
        if sass_text is None:
            sass_text = "\n".join(sec.get("disassemble", []))
            code = S.parse(sass_text)
            smap = S.map_sites(code, wait_sites or []) if code.instrs else None
    rep.base, rep.sass = base, code
    if smap is None:
        rep.site_map_notes.append("no SASS: PCs not classified")
        return rep
    rep.site_map_notes = list(smap.notes)
    if foreign:
        names = sorted({k.name[:60] for k in rep.kernels if k.id in foreign})
        rep.site_map_notes.append(
            f"{len(rep.warps) - len(mine)} warp(s) of other kernels "
            f"({', '.join(names)}) not placed: the SASS is the run's "
            "kernel's"
        )
    _place_all(mine, code, smap, checkpoint_sites or [])  # again: the frames came with round 2
    if not early:
        cmds = _register_commands(rep.warps)
        if cmds:
            text3, secs3 = gdb.run(cmds, max(1.0, t_end - time.monotonic()))
            rep.raw["pass3"], rep.gdb_s, rep.passes = text3, rep.gdb_s + secs3, 3
            rep.rounds_s.append(secs3)
            _parse_registers(rep, sections(text3))
    return rep


# ---- a run with a core ----------------------------------------------------------------------
def request_fields(run_dir: Path | str) -> dict[str, Any]:
    """What a worker needs for a coredump run: the driver settings, the cubin kept, the
    trace-time wait table, the line table, and the bisection sites (observe-only: no site
    enabled, the code is unchanged) for their roles."""
    d = Path(run_dir).resolve()
    return {
        "env": worker_env(d),
        "cubin_path": str(d / "kernel.cubin"),
        "wait_sites": True,
        "line_table": True,
        "bisect": {"site": None},
    }


# nvdisasm of a hung worker's cubin, started by the before-kill hook :func:`prefetch_sass`
# (beside the dump, the kill and the health check: CPU only), taken by :func:`analyse`
_SASS: dict[str, tuple[float, threading.Thread, list]] = {}
_SASS_LOCK = threading.Lock()
SASS_KEEP_S = 600.0  # a prefetch no analyse took (a run that was not analysed) is dropped


def prefetch_sass(ctx: dict[str, Any]) -> None:
    """Watchdog hook, before :func:`before_kill`: start nvdisasm on the cubin of a worker that
    runs with :func:`worker_env` (its run folder holds its coredump pipe), in a thread."""
    if ctx.get("phase") != "launched" or not ctx.get("events_path") or not ctx.get("pid"):
        return None
    d = Path(ctx["events_path"]).parent.resolve()
    cubin = d / "kernel.cubin"
    if not cubin.exists() or not (d / f"{PIPE_NAME}.{ctx['pid']}").exists():
        return None
    out: list[tuple[str | None, float]] = []

    def work() -> None:
        t = time.monotonic()
        text = sass_of_cubin(cubin)
        out.append((text, round(time.monotonic() - t, 3)))

    th = threading.Thread(target=work, name="cutedebug-nvdisasm", daemon=True)
    now = time.monotonic()
    with _SASS_LOCK:
        for k in [k for k, v in _SASS.items() if now - v[0] > SASS_KEEP_S]:
            del _SASS[k]
        _SASS[str(d)] = (now, th, out)
    th.start()
    return None


def _prefetched_sass(run_dir: Path, info: dict[str, Any]) -> Callable[[], str | None]:
    """The SASS of the run's cubin for read_core: the prefetch's, waited for, or nvdisasm
    now; ``info`` gets nvdisasm's seconds and, for a prefetch, the seconds still waited."""
    with _SASS_LOCK:
        pre = _SASS.pop(str(run_dir.resolve()), None)

    def sass() -> str | None:
        t = time.monotonic()
        if pre is not None:
            _, th, out = pre
            th.join(60.0)
            if out:
                text, secs = out[0]
                info.update(nvdisasm_s=secs, nvdisasm_wait_s=round(time.monotonic() - t, 3))
                return text
        text = sass_of_cubin(run_dir / "kernel.cubin")
        info["nvdisasm_s"] = round(time.monotonic() - t, 3)
        return text

    return sass


# A hung worker read through an attached cuda-gdb before the kill (coredump_attach), by run
# folder, taken by analyse
_ATTACHED: dict[str, tuple[float, CoreReport]] = {}


def keep_attached(run_dir: Path | str, rep: CoreReport) -> None:
    now = time.monotonic()
    with _SASS_LOCK:
        for k in [k for k, v in _ATTACHED.items() if now - v[0] > SASS_KEEP_S]:
            del _ATTACHED[k]  # a run nobody analysed
        _ATTACHED[str(Path(run_dir).resolve())] = (now, rep)


def take_attached(run_dir: Path | str) -> CoreReport | None:
    with _SASS_LOCK:
        got = _ATTACHED.pop(str(Path(run_dir).resolve()), None)
    return got[1] if got else None


def attach_or_dump(ctx: dict[str, Any]) -> dict[str, Any] | None:
    """Watchdog hook (CUTEDEBUG_COREDUMP_READ=attach, the default): this module's reader over
    cuda-gdb attached to the hung worker, the dump when that fails
    (coredump_attach.read_or_dump)."""
    return coredump_attach.read_or_dump(ctx, _read, _prefetched_sass, keep_attached)


# cuda-gdb sessions a prefetch started on a complete core (round 1 sent), taken by read_core
_SESSIONS: dict[str, tuple[float, Any]] = {}


def prefetch_core(ctx: dict[str, Any]) -> dict[str, Any] | None:
    """Watchdog hook, after :func:`before_kill`: the core it waited for is complete (the
    worker closed it), so start cuda-gdb on it and send round 1 now: the core loads while the
    worker is killed and the GPU health check runs (cuda-gdb reads a core through libcudacore,
    not the GPU). analyse's read_core takes the session; one nobody takes is closed after
    SASS_KEEP_S, and at exit. Returns {"cuda_gdb_prefetch": "started" or why not} for a run
    whose worker wrote a core (its pid's core in the run folder: the coredump settings were
    its, whether or not the driver kept the pipe after the dump), None for any other run."""
    if ctx.get("phase") != "launched" or not ctx.get("events_path") or not ctx.get("pid"):
        return None
    d = Path(ctx["events_path"]).parent.resolve()
    pid = int(ctx["pid"])
    found = cores(d, pid)
    if not found:
        return None  # no coredump settings, or no core came: nothing to load

    def skipped(why: str) -> dict[str, Any]:
        return {"cuda_gdb_prefetch": f"not started: {why}"}

    if SESSION_FAILED:
        return skipped("an earlier session failed: reading with -batch")
    if (held := held_open(pid, found)) is not False:
        return skipped("the worker may still write the core" if held else "/proc is mute")
    if found[0].stat().st_size == 0 or elf_complete(found[0]) is False:
        return skipped("the core is shorter than its ELF header says")
    try:
        gdb = gdb_session(found[0])
        gdb.send(ROUND1)
    except (RuntimeError, OSError) as e:
        return skipped(f"{type(e).__name__}: {e}"[:200])  # read_core says it again
    now = time.monotonic()
    with _SASS_LOCK:
        stale = [k for k, v in _SESSIONS.items() if now - v[0] > SASS_KEEP_S]
        old = [_SESSIONS.pop(k)[1] for k in stale]
        old += [x[1] for x in [_SESSIONS.pop(str(found[0].resolve()), None)] if x]
        _SESSIONS[str(found[0].resolve())] = (now, gdb)
    for g in old:
        g.close(kill=True)  # its output unread: no quit it could read
    return {"cuda_gdb_prefetch": "started"}


def _take_prefetched(core: Path | str) -> Any:
    with _SASS_LOCK:
        got = _SESSIONS.pop(str(Path(core).resolve()), None)
    return got[1] if got else None


@atexit.register
def close_prefetched() -> None:
    """End the cuda-gdb of every prefetch nobody took (killed: its output was never read)."""
    with _SASS_LOCK:
        left = [v[1] for v in _SESSIONS.values()]
        _SESSIONS.clear()
    for g in left:
        g.close(kill=True)


def register_hook(read: str = "dump") -> None:
    """Put :func:`prefetch_sass`, the hook that takes the hung worker's GPU state and
    :func:`prefetch_core` in the watchdog's before-kill hooks, in that order (nvdisasm runs
    while the state is taken, cuda-gdb loads a core while the worker is killed and the GPU
    checked). ``read`` "dump": :func:`before_kill`, the driver's dump; "attach":
    :func:`attach_or_dump`, cuda-gdb attached to the live worker first, the dump when that
    fails. The other taker leaves the list."""
    try:
        from cutedebug.engine import watchdog as W
    except ImportError:  # the watchdog still lives in the runner
        from cutedebug.engine import runner as W
    hooks = getattr(W, "BEFORE_KILL", None)
    if hooks is None:
        raise RuntimeError("this engine has no before-kill hook: coredumps cannot be taken")
    take = attach_or_dump if read == "attach" else before_kill
    for h in (prefetch_sass, before_kill, attach_or_dump, prefetch_core):
        while h in hooks:
            hooks.remove(h)
    hooks += [prefetch_sass, take, prefetch_core]


def analyse(
    run_dir: Path | str,
    outcome: Any,
    facts: dict[str, Any],
    expected: dict[str, Any] | None = None,
    localized_by: str = "probes",
    timeout_s: float = GDB_LIMIT_S,
) -> dict[str, Any]:
    """Evidence from the run's core (a hang's, dumped before the kill, or a crash's), for the
    run's report; {"coredump": {"error": ...}} when there is none or it cannot be read."""
    d = Path(run_dir)
    hooks = facts.get("before_kill", [])
    dump = next((f["coredump"] for f in hooks if "coredump" in f), None)
    remove_pipes(d)
    found = cores(d)
    info: dict[str, Any] = {"dump": dump}
    prefetch = next((f["cuda_gdb_prefetch"] for f in hooks if "cuda_gdb_prefetch" in f), None)
    if prefetch:  # whether cuda-gdb loaded the core during the kill and the health check
        info["prefetch"] = prefetch
    if errors := [f["error"] for f in hooks if "error" in f]:
        info["hook_errors"] = errors  # a before-kill hook that raised
    attach = next((f["attach"] for f in hooks if "attach" in f), None)
    if attach is not None:  # CUTEDEBUG_COREDUMP_READ=attach: what the attached reading did
        info["attach"] = attach
    attached = take_attached(d)
    if not found and attached is None:
        info["error"] = (dump or {}).get("error") or "no core was written"
        return {"coredump": info}
    # no outcome (`cutedebug exec`: any program): no trace-time tables, the SASS alone
    comp = (outcome.last(Compiled) if outcome is not None else None) or Compiled()
    from cutedebug.instrument import waitsites

    wait_sites = waitsites.sites_from_json(comp.wait_sites)
    cp_table = (outcome.last(CheckpointSites) if outcome is not None else None) or (
        CheckpointSites()
    )
    cp_sites = cp_table.sites or []
    t0 = time.monotonic()
    if attached is not None:  # read from the live worker before the kill: no core to read
        rep = attached
    else:
        sass = _prefetched_sass(d, info)  # read_core calls it while cuda-gdb loads the core
        try:
            rep = read_core(
                found[0],
                sass_text=sass,
                wait_sites=wait_sites,
                checkpoint_sites=cp_sites,
                timeout_s=timeout_s,
            )
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            info["error"] = f"reading the core failed: {e}"
            return {"coredump": info}
        info.update(core=found[0].name, core_bytes=found[0].stat().st_size)
    for name, text in rep.raw.items():
        (d / f"coredump_gdb_{name}.txt").write_text(text)
    info.update(
        gdb_s=rep.gdb_s,
        gdb_passes=rep.passes,
        gdb_rounds_s=rep.rounds_s,
        gdb_processes=rep.processes,
        gdb_round1_wait_s=rep.round1_wait_s,  # round 1 as read_core waited for it
        **({"gdb_prefetched_s": rep.prefetched} if rep.prefetched is not None else {}),
        **({"gdb_fallback": rep.fallback} if rep.fallback else {}),
        sass=rep.sass_source,
        site_map=rep.site_map_notes
        or ["every wait loop and BAR.SYNC mapped to its traced site (counts agree)"],
        warps=len(rep.warps),
        analysis_s=round(time.monotonic() - t0, 3),
    )
    if info.get("core_bytes", 0) > KEEP_CORE_MAX:  # e.g. 130 MB for 8,448 warps of a big grid
        found[0].unlink()
        info["core_removed"] = f"over {KEEP_CORE_MAX >> 20} MB: removed after reading"
    out: dict[str, Any] = {"coredump": info}
    if rep.exception is not None:
        out["crash"] = crash_evidence(rep)
        return out
    # a big grid's thousands of stuck warps: at most PICTURE_MAX_ITEMS in the report, every
    # kind of place among them; the diagnosis and the per-role answers count them all
    sites, unlisted = bounded(stuck_sites(rep, cp_sites))
    out.update(
        probe_source=(
            "coredump (cuda-gdb attached to the hung worker before the kill; no probes, no dump)"
            if attached is not None
            else "coredump (cuda-gdb on the GPU core taken before the kill; no probes)"
        ),
        stuck_sites=sites,
        diagnosis=diagnosis(rep, cp_sites),
        role_answers=role_answers(rep, cp_sites),
        warps=[w.to_json() for w in rep.warps[:256]],
        coredump_picture=picture(rep),
    )
    if unlisted:
        out["stuck_sites_unlisted"] = unlisted
    if expected:
        out["coredump_grade"] = grade(expected, rep, cp_sites, by=localized_by)
    return out


class Localizer:
    """What ``runner.run_scenario(core=...)`` needs to localize a hang (or a crash) from its GPU
    core: the worker's request fields and, after the run, the evidence."""

    def __init__(self, timeout_s: float = GDB_LIMIT_S, read: str | None = None):
        self.timeout_s = timeout_s
        generation_flags()  # a bad $CUTEDEBUG_COREDUMP_FLAGS is a usage error, before any run
        # a bad $CUTEDEBUG_COREDUMP_READ too: "attach" (the default) or "dump"
        self.read = read or coredump_attach.read_mode()
        register_hook(self.read)

    def request_fields(self, run_dir: Path | str) -> dict[str, Any]:
        fields = request_fields(run_dir)
        if self.read == "attach":  # a debugger that is not its ancestor may attach (Yama)
            fields["allow_ptrace"] = True
        return fields

    def evidence(
        self, run_dir: Path | str, outcome: Any, facts: dict[str, Any], scenario: Any
    ) -> dict[str, Any]:
        exp = scenario.expect
        return analyse(
            run_dir, outcome, facts, exp.localization(), exp.localized_by, self.timeout_s
        )
