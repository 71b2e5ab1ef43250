"""GPU coredumps: where every warp of a hung or crashed kernel is, with no probes and no recompile.

A run that asks for it (request field ``coredump``) gets, before CUDA initializes in the worker,
the driver's coredump settings (:func:`worker_env`): a user-triggered dump through a named pipe
in the run folder, a dump on a GPU exception, memory sections skipped (a core of ~0.6 MB), no
abort on an exception (the worker still reports the CUDA error).

- On a hang, the watchdog's before-kill hook (:func:`before_kill`) writes the pipe and waits,
  bounded, for the core; then the child is killed as usual.
- :func:`read_core` runs ``cuda-gdb -batch`` on the core (bounded) and parses it into per-warp
  records (:class:`WarpRecord`): CTA, warp, lanes, PC, what the SASS there is
  (cutedebug.analyses.sass), the barrier register values, the trace-time site
  (cutedebug.instrument.waitsites) and the bisection site (role, op) it belongs to.
- :func:`evidence` turns them into the HANG evidence the probes give (stuck sites, per-role
  answer, diagnosis, the stuck map), with "coredump" as the source; :func:`crash_evidence`
  gives the faulting warp, PC and line of a crash.

cuda-gdb's output formats are parsed by the regexes below, each next to a sample captured on the
H200 (tests/data/coredump/).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutedebug.analyses import sass as S

SKIP_MEMORY = "skip_global_memory,skip_shared_memory,skip_local_memory"
PIPE_NAME = "coredump.pipe"  # the driver creates <run dir>/coredump.pipe.<pid>
CORE_NAME = "coredump"  # the driver writes <run dir>/coredump.<pid>.nvcudmp
DUMP_LIMIT_S = 10.0
GDB_LIMIT_S = 30.0


# ---- capture --------------------------------------------------------------------------------
def worker_env(run_dir: Path | str) -> dict[str, str]:
    """Driver settings for a worker whose hangs and crashes should leave a core in run_dir.
    Must be in the environment before CUDA initializes (the worker sets them first thing)."""
    d = Path(run_dir)
    return {
        "CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1",
        "CUDA_ENABLE_COREDUMP_ON_EXCEPTION": "1",
        "CUDA_ENABLE_CPU_COREDUMP_ON_EXCEPTION": "0",
        "CUDA_COREDUMP_PIPE": str(d / f"{PIPE_NAME}.%p"),
        "CUDA_COREDUMP_FILE": str(d / f"{CORE_NAME}.%p.nvcudmp"),
        "CUDA_COREDUMP_GENERATION_FLAGS": SKIP_MEMORY + ",skip_abort",
    }


def cores(run_dir: Path | str, pid: int | None = None) -> list[Path]:
    pat = f"{CORE_NAME}.{pid if pid is not None else '*'}.nvcudmp*"
    return sorted(Path(run_dir).glob(pat))


def trigger(
    pid: int, run_dir: Path | str, limit_s: float = DUMP_LIMIT_S, alive: Any = None
) -> dict[str, Any]:
    """Write the coredump pipe of worker ``pid`` and wait (at most ``limit_s``) until its core
    is complete: the file stopped growing for 0.3 s, or the process exited. Never raises."""
    d = Path(run_dir)
    pipe = d / f"{PIPE_NAME}.{pid}"
    t0 = time.monotonic()
    facts: dict[str, Any] = {"pipe": str(pipe)}
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)
    except OSError as e:
        facts["error"] = f"could not write the coredump pipe: {type(e).__name__}: {e}"
        return facts
    last, since = -1, None
    while time.monotonic() - t0 < limit_s:
        found = cores(d, pid)
        size = sum(p.stat().st_size for p in found) if found else -1
        now = time.monotonic()
        if size != last:
            last, since = size, now
        if size > 0 and now - since >= 0.3:
            break
        if alive is not None and not alive() and found:
            break
        time.sleep(0.02)
    found = cores(d, pid)
    facts["dump_s"] = round(time.monotonic() - t0, 3)
    if not found or last <= 0:
        facts["error"] = f"no core written within {limit_s:g} s of the pipe write"
        return facts
    facts.update(core=str(found[0]), core_bytes=found[0].stat().st_size)
    return facts


def before_kill(ctx: dict[str, Any]) -> dict[str, Any] | None:
    """Watchdog hook (before the SIGKILL of a hung child): dump the GPU state of a worker that
    runs with :func:`worker_env`, i.e. whose run folder holds its coredump pipe."""
    if ctx.get("phase") != "launched" or not ctx.get("events_path") or not ctx.get("pid"):
        return None
    run_dir = Path(ctx["events_path"]).parent
    if not (run_dir / f"{PIPE_NAME}.{ctx['pid']}").exists():
        return None

    def alive() -> bool:
        try:
            os.kill(ctx["pid"], 0)
            return True
        except OSError:
            return False

    return {"coredump": trigger(int(ctx["pid"]), run_dir, alive=alive)}


# ---- cuda-gdb ------------------------------------------------------------------------------
def find_cuda_gdb() -> str | None:
    found = shutil.which("cuda-gdb")
    if found:
        return found
    hits = sorted(glob.glob("/usr/local/cuda*/bin/cuda-gdb"), reverse=True)
    return hits[0] if hits else None


def find_nvdisasm() -> str | None:
    found = shutil.which("nvdisasm")
    if found:
        return found
    hits = sorted(glob.glob("/usr/local/cuda*/bin/nvdisasm"), reverse=True)
    return hits[0] if hits else None


def run_gdb(
    core: Path | str,
    commands: list[str],
    timeout_s: float = GDB_LIMIT_S,
    cuda_gdb: str | None = None,
) -> tuple[str, float]:
    """cuda-gdb -batch on the core; (stdout + stderr, seconds). Raises RuntimeError when it is
    missing or does not finish in time (the caller reports that, never a localization)."""
    exe = cuda_gdb or find_cuda_gdb()
    if not exe:
        raise RuntimeError("cuda-gdb not found (PATH, /usr/local/cuda*/bin)")
    argv = [
        exe,
        "-nx",
        "-q",
        "-batch",
        "-ex",
        "set pagination off",
        "-ex",
        "set width 0",
        "-ex",
        "set confirm off",
        "-ex",
        f"target cudacore {core}",
    ]
    for c in commands:
        argv += ["-ex", c]
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"cuda-gdb did not finish in {timeout_s:g} s") from e
    return p.stdout + p.stderr, round(time.monotonic() - t0, 3)


# ---- parsing cuda-gdb's output ---------------------------------------------------------------
KERNEL_ROW = re.compile(
    r"^\s*\*?\s*(\d+)\s+(\S+)\s+(\d+)\s+(-?\d+)\s+([A-Za-z]+(?: \([a-z]+\))?)\s+"
    r"(0x[0-9a-f]+)\s+\((\d+),(\d+),(\d+)\)\s+\((\d+),(\d+),(\d+)\)\s+(.*)$"
)
SM_HEADER = re.compile(r"^\s*Device (\d+) SM (\d+)\s*$")
WARP_ROW = re.compile(
    r"^\s*\*?\s*(\d+)\s+(0x[0-9a-f]{8})\s+(0x[0-9a-f]{8})\s+(0x[0-9a-f]+)\s+"
    r"(\d+)\s+\((\d+),(\d+),(\d+)\)\s+\((\d+),(\d+),(\d+)\)"
)
SECTION = re.compile(r"^@@(\w+)(.*)$")
FRAME = re.compile(r"^#(\d+)\s+(?:(0x[0-9a-f]+) in )?(.+?)\s+(?:\(.*?\)\s+)?at\s+(\S+):(\d+)\s*$")
VALUE = re.compile(r"^\$\d+\s*=\s*(0x[0-9a-f]+|-?\d+)\s*$")
EXCEPTION = re.compile(r"CUDA Exception:\s*(.+?)\s*$", re.M)
TRIGGERED_AT = re.compile(r"exception was triggered at PC (0x[0-9a-f]+)(?:\s*\((.*?):(\d+)\))?")
FOCUS = re.compile(
    r"focus set to CUDA kernel (\d+), grid (\d+), block \((\d+),(\d+),(\d+)\), "
    r"thread \((\d+),(\d+),(\d+)\), device (\d+), sm (\d+), warp (\d+), lane (\d+)"
)


@dataclass
class Kernel:
    id: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    name: str
    status: str = ""


@dataclass
class WarpRecord:
    dev: int
    sm: int
    hw_warp: int  # warp slot on the SM
    active: int  # active lanes mask
    divergent: int
    pc: int  # function-relative ("physical") PC
    kernel: int
    block: tuple[int, int, int]
    thread: tuple[int, int, int]  # first active lane's threadIdx
    cta: int = 0  # linear block index
    warp: int = 0  # warp index in its CTA
    construct: S.Construct | None = None
    site: Any = None  # waitsites.WaitSite
    site_exact: bool = False
    role: str = "?"  # bisection's role of the site (checkpoint.assign_roles), else the op's
    op: str = ""
    barrier: str = ""
    file: str = ""
    line: int = 0
    frames: list[dict[str, Any]] = field(default_factory=list)
    registers: dict[str, int] = field(default_factory=dict)

    @property
    def first_lane(self) -> int:
        return (self.active & -self.active).bit_length() - 1 if self.active else 0

    def to_json(self) -> dict[str, Any]:
        c = self.construct
        return {
            "sm": self.sm,
            "hw_warp": self.hw_warp,
            "cta": self.cta,
            "block": self.block,
            "warp": self.warp,
            "lanes": f"{self.active:#010x}",
            "pc": f"{self.pc:#x}",
            "kind": c.kind if c else None,
            "instruction": c.anchor.text if c and c.anchor else None,
            "barrier_id": c.barrier_id if c else None,
            "role": self.role,
            "op": self.op,
            "barrier": self.barrier or None,
            "site": self.site.seq if self.site is not None else None,
            "site_exact": self.site_exact,
            "where": f"{os.path.basename(self.file)}:{self.line}" if self.file else None,
            "registers": {k: f"{v:#x}" for k, v in self.registers.items()},
            "frames": self.frames,
        }


def parse_kernels(text: str) -> list[Kernel]:
    out = []
    for line in text.splitlines():
        m = KERNEL_ROW.match(line)
        if m:
            g = tuple(int(m.group(i)) for i in (7, 8, 9))
            b = tuple(int(m.group(i)) for i in (10, 11, 12))
            out.append(Kernel(int(m.group(1)), g, b, m.group(13).split("(")[0].strip(), m.group(5)))
    return out


def parse_warps(text: str) -> list[WarpRecord]:
    """Rows of ``info cuda warps`` (every SM's section) as records; duplicates (the same warp
    listed by two filters) dropped."""
    dev = sm = None
    seen: dict[tuple[int, int, int], WarpRecord] = {}
    for line in text.splitlines():
        m = SM_HEADER.match(line)
        if m:
            dev, sm = int(m.group(1)), int(m.group(2))
            continue
        m = WARP_ROW.match(line)
        if m and dev is not None and sm is not None:
            key = (dev, sm, int(m.group(1)))
            seen.setdefault(
                key,
                WarpRecord(
                    dev,
                    sm,
                    key[2],
                    int(m.group(2), 16),
                    int(m.group(3), 16),
                    int(m.group(4), 16),
                    int(m.group(5)),
                    tuple(int(m.group(i)) for i in (6, 7, 8)),
                    tuple(int(m.group(i)) for i in (9, 10, 11)),
                ),
            )
    return list(seen.values())


def sections(text: str) -> dict[str, list[str]]:
    """Output split at ``@@name args`` markers (echoed by the command lists below)."""
    out: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        m = SECTION.match(line.strip())
        if m:
            cur = m.group(1) + m.group(2)
            out[cur] = []
        elif cur is not None:
            out[cur].append(line)
    return out


def parse_frames(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        m = FRAME.match(line.strip())
        if m:
            fn = m.group(3).split("<<<")[0].strip()
            out.append(
                {
                    "level": int(m.group(1)),
                    "function": fn,
                    "file": m.group(4),
                    "line": int(m.group(5)),
                }
            )
    return out


def parse_values(lines: list[str]) -> list[int]:
    return [int(m.group(1), 0) for m in map(VALUE.match, (x.strip() for x in lines)) if m]


def parse_exception(text: str) -> dict[str, Any] | None:
    """What cuda-gdb says about a core written on a GPU exception, or None."""
    m = EXCEPTION.search(text)
    if not m:
        return None
    out: dict[str, Any] = {"exception": m.group(1)}
    t = TRIGGERED_AT.search(text)
    if t:
        out["pc"] = t.group(1)
        if t.group(2):
            out["file"], out["line"] = t.group(2), int(t.group(3))
    f = FOCUS.search(text)
    if f:
        v = [int(x) for x in f.groups()]
        out.update(
            kernel=v[0],
            block=tuple(v[2:5]),
            thread=tuple(v[5:8]),
            device=v[8],
            sm=v[9],
            hw_warp=v[10],
            lane=v[11],
        )
    return out


# ---- reading a core ------------------------------------------------------------------------
MAX_WARPS = 256  # warps whose registers are read (one cuda-gdb focus each)
WAIT_OPS = {
    "named_barrier_sync": "named_barrier",
    "sync_threads": "named_barrier",
    "cluster_wait": "cluster_wait",
}


@dataclass
class CoreReport:
    core: str
    kernels: list[Kernel] = field(default_factory=list)
    warps: list[WarpRecord] = field(default_factory=list)
    exception: dict[str, Any] | None = None
    site_map_notes: list[str] = field(default_factory=list)
    gdb_s: float = 0.0
    passes: int = 0
    sass_source: str = ""
    raw: dict[str, str] = field(default_factory=dict)  # each pass's output (kept in the run)


def sass_of_cubin(cubin: Path | str, nvdisasm: str | None = None) -> str | None:
    exe = nvdisasm or find_nvdisasm()
    if not exe or not Path(cubin).exists():
        return None
    p = subprocess.run([exe, "-g", "-c", str(cubin)], capture_output=True, text=True, timeout=60)
    return p.stdout if p.returncode == 0 and p.stdout else None


def read_core(
    core: Path | str,
    *,
    sass_text: str | None = None,
    wait_sites: list | None = None,
    checkpoint_sites: list[dict[str, Any]] | None = None,
    timeout_s: float = GDB_LIMIT_S,
    cuda_gdb: str | None = None,
) -> CoreReport:
    """Every warp of the core as a record (module docstring). Raises RuntimeError when cuda-gdb
    is missing, too slow, or prints nothing we can read."""
    t_end = time.monotonic() + timeout_s
    rep = CoreReport(core=str(core))
    text, secs = run_gdb(
        core,
        [
            "echo @@kernels\\n",
            "info cuda kernels",
            "echo @@warps\\n",
            "info cuda warps device 0",
            "echo @@focus\\n",
            "bt",
        ],
        timeout_s,
        cuda_gdb,
    )
    rep.raw["pass1"], rep.gdb_s, rep.passes = text, secs, 1
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
    reps = _one_per_pc(rep.warps)
    cmds: list[str] = []
    if sass_text is None and reps:
        cmds += [_focus(reps[0]), "echo @@disassemble\\n", "disassemble"]
        rep.sass_source = "cuda-gdb disassemble"
    else:
        rep.sass_source = "nvdisasm of the worker's cubin" if sass_text else "none"
    for w in reps:
        cmds += [f"echo @@bt {w.dev} {w.sm} {w.hw_warp}\\n", _focus(w), "bt"]
    if cmds:
        text2, secs2 = run_gdb(core, cmds, max(1.0, t_end - time.monotonic()), cuda_gdb)
        rep.raw["pass2"], rep.gdb_s, rep.passes = text2, rep.gdb_s + secs2, 2
        sec = sections(text2)
        for w in reps:
            frames = parse_frames(sec.get(f"bt {w.dev} {w.sm} {w.hw_warp}", []))
            for other in rep.warps:
                if other.pc == w.pc and other.kernel == w.kernel:
                    other.frames = frames
        if sass_text is None:
            sass_text = "\n".join(sec.get("disassemble", []))
    code = S.parse(sass_text) if sass_text else None
    if code is not None and code.instrs:
        smap = S.map_sites(code, wait_sites or [])
        rep.site_map_notes = smap.notes
        for w in rep.warps:
            _place(w, code, smap, checkpoint_sites or [])
        _read_registers(rep, t_end, cuda_gdb)
    else:
        rep.site_map_notes.append("no SASS: PCs not classified")
    return rep


def _focus(w: WarpRecord) -> str:
    return f"cuda device {w.dev} sm {w.sm} warp {w.hw_warp} lane {w.first_lane}"


def _one_per_pc(warps: list[WarpRecord]) -> list[WarpRecord]:
    out: dict[tuple[int, int], WarpRecord] = {}
    for w in warps:
        out.setdefault((w.kernel, w.pc), w)
    return list(out.values())


def _place(w: WarpRecord, code: S.Sass, smap: S.SiteMap, cp_sites: list[dict[str, Any]]) -> None:
    c = code.classify(w.pc)
    w.construct = c
    w.file, w.line = code.line_at(w.pc)
    if w.frames:  # cuda-gdb's innermost frame with a line beats the SASS line table
        w.file, w.line = w.frames[0]["file"], w.frames[0]["line"]
    site, exact = smap.site_of(c)
    w.site, w.site_exact = site, exact
    if site is not None:
        w.op = site.op if site.kind in S.MBAR_KINDS else WAIT_OPS.get(site.kind, site.kind)
        w.barrier = site.barrier
        w.file, w.line = site.file or w.file, site.line or w.line
        cp = _checkpoint_site(site, cp_sites)
        w.role = cp["role"] if cp else site.role
    elif c.kind == "named_barrier":
        w.op, w.barrier = "named_barrier", "named"
    elif c.kind in ("spin_load", "nanosleep", "cluster_barrier", "exit"):
        w.op = c.kind
    else:
        w.op = c.kind
    if w.role in ("?", "any") and cp_sites and w.file:
        near = _next_site(w.file, w.line, cp_sites)
        if near is not None:
            w.role = near["role"]


def _checkpoint_site(site: Any, cp_sites: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The bisection site (its role) that a traced wait belongs to: same file and line, and
    the op that contains the wait."""
    want = site.op if site.kind in S.MBAR_KINDS else "named_barrier"
    same = [c for c in cp_sites if c.get("file") == site.file and c.get("line") == site.line]
    for c in same:
        if c.get("op") == want or (want.endswith(c.get("op", "@")) and c.get("op")):
            return c
    return same[0] if same else None


def _next_site(file: str, line: int, cp_sites: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first bisection site at or after file:line (program order): where a warp stuck in a
    hand-written loop at that line would arrive next."""
    after = [c for c in cp_sites if c.get("file") == file and c.get("line", 0) >= line]
    return min(after, key=lambda c: (c["line"], c["id"])) if after else None


def _read_registers(rep: CoreReport, t_end: float, cuda_gdb: str | None) -> None:
    """The barrier address and parity registers of each waiting warp (at most MAX_WARPS)."""
    todo = [
        w
        for w in rep.warps
        if w.construct is not None and (w.construct.address_reg or w.construct.phase_reg)
    ][:MAX_WARPS]
    if not todo:
        return
    cmds: list[str] = []
    for w in todo:
        regs = [
            r
            for r in (w.construct.address_reg, w.construct.phase_reg)
            if r and r not in ("RZ", "URZ")
        ]
        if not regs:
            continue
        cmds += [f"echo @@reg {w.dev} {w.sm} {w.hw_warp} {' '.join(regs)}\\n", _focus(w)]
        cmds += [f"p/x ${r}" for r in regs]
    if not cmds:
        return
    text, secs = run_gdb(rep.core, cmds, max(1.0, t_end - time.monotonic()), cuda_gdb)
    rep.raw["pass3"], rep.gdb_s, rep.passes = text, rep.gdb_s + secs, rep.passes + 1
    by_key = {(w.dev, w.sm, w.hw_warp): w for w in todo}
    for name, lines in sections(text).items():
        parts = name.split()
        if parts[0] != "reg" or len(parts) < 5:
            continue
        w = by_key.get((int(parts[1]), int(parts[2]), int(parts[3])))
        if w is not None:
            w.registers.update(zip(parts[4:], parse_values(lines)))


# ---- evidence -------------------------------------------------------------------------------
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


def stuck_sites(
    rep: CoreReport, cp_sites: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """One entry per distinct (role, op, barrier, place) over the live warps, plus what the
    warps that are gone imply (see :func:`inferred_sites`)."""
    groups: dict[tuple, dict[str, Any]] = {}
    for w in rep.warps:
        if w.construct is None or w.construct.kind in ("other", "exit"):
            continue
        key = (w.role, w.op, w.barrier, w.file, w.line, parity(w))
        g = groups.setdefault(
            key,
            {
                "role": w.role,
                "op": w.op,
                "barrier": w.barrier or None,
                "stage": None,
                "phase": parity(w),
                "location": f"{os.path.basename(w.file)}:{w.line}" if w.file else None,
                "site": w.site.seq if w.site is not None else None,
                "site_exact": w.site_exact,
                "kind": w.construct.kind,
                "instruction": w.construct.anchor.text if w.construct.anchor else None,
                "barrier_id": w.construct.barrier_id,
                "ctas": set(),
                "warps": set(),
                "smem_offsets": set(),
                "source": "coredump",
            },
        )
        g["ctas"].add(w.cta)
        g["warps"].add(w.warp)
        if (off := barrier_offset(w)) is not None:
            g["smem_offsets"].add(off)
    out = []
    for g in groups.values():
        g["ctas"], g["warps"] = sorted(g["ctas"]), sorted(g["warps"])
        g["smem_offsets"] = [f"{o:#x}" for o in sorted(g["smem_offsets"])]
        g["cta"], g["warp"] = g["ctas"][0], g["warps"][0]
        out.append(g)
    out.sort(key=lambda g: (-len(g["ctas"]) * len(g["warps"]), g["role"]))
    return out + inferred_sites(rep, cp_sites or [])


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
    that the gone role arrives on: that role exited before its arrive (consumer_release for
    an empty barrier, producer_commit for a full one)."""
    gone = missing_warps(rep)
    if not gone:
        return []
    out: dict[tuple, dict[str, Any]] = {}
    for w in rep.warps:
        if w.cta not in gone or w.barrier not in ARRIVES_ON or w.site is None:
            continue
        role, op = ARRIVES_ON[w.barrier]
        live_roles = {x.role for x in rep.warps if x.cta == w.cta}
        if role in live_roles:
            continue
        where = next((c for c in cp_sites if c.get("op") == op), None)
        key = (role, op, w.barrier)
        g = out.setdefault(
            key,
            {
                "role": role,
                "op": op,
                "barrier": w.barrier,
                "stage": None,
                "phase": None,
                "location": f"{os.path.basename(where['file'])}:{where['line']}" if where else None,
                "site": None,
                "kind": "exited",
                "inferred": True,
                "source": "coredump",
                "why": f"no {role} warp is left in these CTAs while {w.role} warps wait on "
                f"{w.barrier} ({w.op}): the {role} warps exited before their {op}",
                "ctas": set(),
                "warps": set(),
            },
        )
        g["ctas"].add(w.cta)
        g["warps"].update(gone[w.cta])
    res = []
    for g in out.values():
        g["ctas"], g["warps"] = sorted(g["ctas"]), sorted(g["warps"])
        g["cta"], g["warp"] = g["ctas"][0], g["warps"][0]
        res.append(g)
    return res


def role_answers(rep: CoreReport, cp_sites: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per role, the first bisection site its warps never get past (what printf-bisection
    answers), from the core alone: the op that contains the wait the warps sit in, the named
    barrier itself, or for a hand-written spin the next site after the spin's line."""
    out: dict[str, dict[str, Any]] = {}
    for s in stuck_sites(rep, cp_sites):
        if s["role"] in out or s["role"] in ("?", None):
            continue
        if s.get("inferred"):
            out[s["role"]] = {"op": s["op"], "barrier": s["barrier"], "how": s["why"]}
            continue
        if s["kind"] == "spin_load" and cp_sites:
            w = next(x for x in rep.warps if x.op == s["op"] and x.role == s["role"])
            nxt = _next_site(
                w.file, w.line + 1, [c for c in cp_sites if c.get("role") in (s["role"], "all")]
            )
            if nxt is not None:
                out[s["role"]] = {
                    "op": nxt["op"],
                    "barrier": nxt.get("barrier") or None,
                    "site": nxt["id"],
                    "how": f"spins on a global load at "
                    f"{s['location']}: never reaches #{nxt['id']} {nxt['op']} "
                    f"{nxt.get('name') or ''} ({os.path.basename(nxt['file'])}:"
                    f"{nxt['line']})".replace("  ", " "),
                }
                continue
        out[s["role"]] = {
            "op": s["op"],
            "barrier": s["barrier"],
            "how": f"stuck in {s['kind']} at {s['location']}",
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
    for c in cands:
        if all(c.get(k) == v or (k == "role" and v == "any") for k, v in want.items()):
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
