"""cuda-gdb on a GPU core (one process fed rounds of commands, or -batch), and its output
parsed (cutedebug.analyses.coredump).

Each regex matches the output of one ``info cuda`` / ``bt`` / ``p`` command; the samples they
were written against are real captures from the H200 (tests/data/coredump/, cuda-gdb 13.0).
"""

from __future__ import annotations

import glob
import os
import re
import select
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutedebug.engine import lifeline

GDB_LIMIT_S = 30.0


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
        p = lifeline.run_tool(argv, timeout_s)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"cuda-gdb did not finish in {timeout_s:g} s") from e
    return p.stdout + p.stderr, round(time.monotonic() - t0, 3)


# One cuda-gdb process per core. Loading the core is most of a run's time (on the H200, 0.3 s
# for a 3 MB core, 2.5-3 s for the 128 MB core of 8,448 warps; reports/2026-12-01-h200/
# coredump), so the reader's rounds of commands, each decided from the answers to the one
# before, go to one process in turn instead of one `cuda-gdb -batch` each.
# The reader's first round: the kernels, every warp, the focused warp's frame and instruction
# (its function offset: the kernel's address). Also sent by a prefetch (coredump.prefetch_core).
ROUND1 = [
    "echo @@kernels\\n",
    "info cuda kernels",
    "echo @@warps\\n",
    "info cuda warps device 0",
    "echo @@focus\\n",
    "bt",
    "x/1i $pc",
]
SENTINEL = "@@@done"  # echoed after round N as "@@@done N" (a third @: never an @@section)


class GdbSession:
    """cuda-gdb on one core (or attached to a live process: ``pid``), interactive on pipes:
    :meth:`send` a round of commands (its end marked by an echoed sentinel), :meth:`receive`
    its output (everything printed up to the sentinel; the first round's includes what
    ``target cudacore`` or ``attach`` printed), :meth:`close` (its quit detaches).
    Tied like :func:`lifeline.run_tool`'s tools (run tag, PDEATHSIG, own process group; swept
    on close). A round past its time limit kills the process and raises RuntimeError; a
    cuda-gdb that exits returns what it printed (the caller's parsers find what is there)."""

    def __init__(self, core: Path | str, cuda_gdb: str | None = None, pid: int | None = None):
        exe = cuda_gdb or find_cuda_gdb()
        if not exe:
            raise RuntimeError("cuda-gdb not found (PATH, /usr/local/cuda*/bin)")
        self.argv = [exe, "-nx", "-q"]
        if pid is not None:  # the GPU's state needs none of the host libraries' symbols
            self.argv += ["-iex", "set auto-solib-add off"]
        for c in ("set prompt", "set pagination off", "set width 0", "set height 0"):
            self.argv += ["-ex", c]
        # a live process (pid: attached, detached again by close's quit) or a GPU core
        target = f"attach {pid}" if pid is not None else f"target cudacore {core}"
        self.argv += ["-ex", "set confirm off", "-ex", target]
        self.proc: subprocess.Popen | None = None
        self.tag = lifeline.new_run_tag()
        self.rounds = 0
        self.started = 0  # processes started (one per session)
        self._todo = b""
        self.sent_at = 0.0  # when the last round was sent
        self.awaiting = False  # a round sent and not yet received
        self._eof = False

    def send(self, commands: list[str]) -> None:
        if self.proc is None:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=lifeline.child_env(None, self.tag),
                start_new_session=True,
                preexec_fn=lifeline.preexec(),
            )
            self.started += 1
            for f in (self.proc.stdin, self.proc.stdout):
                os.set_blocking(f.fileno(), False)
        self.rounds += 1
        end = f"echo {SENTINEL} {self.rounds}\\n"
        self._todo += "".join(c + "\n" for c in [*commands, end]).encode()
        self.sent_at, self.awaiting = time.monotonic(), True
        self._write()

    def _write(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        if self._todo:
            try:
                n = os.write(self.proc.stdin.fileno(), self._todo)
            except BlockingIOError:
                return
            except BrokenPipeError:
                n = len(self._todo)  # cuda-gdb is gone: its output says what it did
            self._todo = self._todo[n:]

    def receive(self, timeout_s: float = GDB_LIMIT_S) -> tuple[str, float]:
        """The last round's output, and the seconds since it was sent."""
        assert self.proc is not None and self.proc.stdout is not None
        out, fd = bytearray(), self.proc.stdout.fileno()
        mark = f"{SENTINEL} {self.rounds}\n".encode()
        self.awaiting = False
        t_end = self.sent_at + timeout_s
        seen = 0  # out[:seen] holds no mark
        while not self._eof:
            i = out.find(mark, max(0, seen - len(mark)))
            if i >= 0:
                del out[i:]
                break
            seen = len(out)
            left = t_end - time.monotonic()
            if left <= 0:
                self.close(kill=True)
                raise RuntimeError(f"cuda-gdb did not finish in {timeout_s:g} s")
            wfds = [self.proc.stdin] if self._todo else []
            r, w, _ = select.select([fd], wfds, [], min(left, 0.5))
            if w:
                self._write()
            if r:
                try:
                    chunk = os.read(fd, 1 << 20)
                except BlockingIOError:
                    continue
                if not chunk:
                    self._eof = True
                    try:
                        rc: int | str = self.proc.wait(2.0)
                    except subprocess.TimeoutExpired:
                        rc = "still running, output closed"
                    out += f"\n[cuda-gdb exited: {rc}]\n".encode()
                out += chunk
        return out.decode("utf-8", "replace"), round(time.monotonic() - self.sent_at, 3)

    def run(self, commands: list[str], timeout_s: float = GDB_LIMIT_S) -> tuple[str, float]:
        self.send(commands)
        return self.receive(timeout_s)

    def close(self, kill: bool = False) -> None:
        """Quit cuda-gdb (killed when it does not within 2 s), then sweep what it left."""
        p, self.proc = self.proc, None
        if p is None:
            return
        if not kill and p.poll() is None:
            try:
                os.set_blocking(p.stdin.fileno(), True)
                p.stdin.write(b"quit\n")
                p.stdin.close()
                p.wait(2.0)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        if p.poll() is None:
            lifeline.kill_group(p.pid)
        lifeline.sweep(self.tag, timeout=1.0)
        p.wait()
        for f in (p.stdin, p.stdout):
            try:
                f.close()
            except (OSError, ValueError):
                pass

    def __enter__(self) -> GdbSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def gdb_session(core: Path | str, cuda_gdb: str | None = None) -> GdbSession:
    return GdbSession(core, cuda_gdb)


class BatchGdb:
    """GdbSession's interface over one ``cuda-gdb -batch`` per round (:func:`run_gdb`: the core
    loaded each time): the reader's fallback when the one-process session fails."""

    def __init__(self, core: Path | str, cuda_gdb: str | None = None):
        self.core, self.cuda_gdb = core, cuda_gdb
        self.rounds = self.started = 0
        self._cmds: list[str] = []

    def send(self, commands: list[str]) -> None:
        self._cmds = list(commands)

    def receive(self, timeout_s: float = GDB_LIMIT_S) -> tuple[str, float]:
        self.rounds += 1
        self.started += 1
        return run_gdb(self.core, self._cmds, timeout_s, self.cuda_gdb)

    def run(self, commands: list[str], timeout_s: float = GDB_LIMIT_S) -> tuple[str, float]:
        self.send(commands)
        return self.receive(timeout_s)

    def close(self, kill: bool = False) -> None:
        pass


def gdb_batch(core: Path | str, cuda_gdb: str | None = None) -> BatchGdb:
    return BatchGdb(core, cuda_gdb)


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
# "The exception was triggered at PC 0x7f72d77a1130  kernel_cutlass_..._0  (minimal.py:64)"
# (cuda-gdb 13.0 on the H200: the function's name between the PC and the file:line)
TRIGGERED_AT = re.compile(
    r"exception was triggered at PC (0x[0-9a-f]+)"
    r"(?:[^\n(]*\(([^():\n]+):(\d+)\))?"
)
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
    pc: int  # the "Active PC" of `info cuda warps`: an absolute (virtual) address
    kernel: int
    block: tuple[int, int, int]
    thread: tuple[int, int, int]  # first active lane's threadIdx
    offset: int | None = None  # the PC's offset in its function (x/1i $pc: <name+offset>)
    cta: int = 0  # linear block index
    warp: int = 0  # warp index in its CTA
    construct: Any = None  # sass.Construct: what the SASS at the PC is
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
            "offset": f"{self.offset:#x}" if self.offset is not None else None,
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


PC_OFFSET = re.compile(r"(0x[0-9a-f]+)\s+<[^>+]*\+(\d+)>:")


def parse_pc_offset(lines: list[str]) -> int | None:
    """The function offset in ``x/1i $pc``'s "=> 0x7fecdb7a03b0 <kernel+944>:" line."""
    for line in lines:
        if line.lstrip().startswith("=>"):
            m = PC_OFFSET.search(line)
            if m:
                return int(m.group(2))
    return None


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


@dataclass
class CoreReport:
    core: str
    kernels: list[Kernel] = field(default_factory=list)
    warps: list[WarpRecord] = field(default_factory=list)
    exception: dict[str, Any] | None = None
    site_map_notes: list[str] = field(default_factory=list)
    gdb_s: float = 0.0
    passes: int = 0  # rounds of commands, all in one cuda-gdb process (GdbSession)
    rounds_s: list[float] = field(default_factory=list)  # each round's seconds (the first: load)
    processes: int = 0  # cuda-gdb processes started (1; one per round after a fallback)
    prefetched: float | None = None  # round 1 sent this long before read_core (at the kill)
    round1_wait_s: float = 0.0  # what read_core still waited for round 1 (nvdisasm included)
    fallback: str = ""  # why the rounds went to one cuda-gdb -batch each
    sass_source: str = ""
    raw: dict[str, str] = field(default_factory=dict)  # each pass's output (kept in the run)
    base: dict[int, int] = field(default_factory=dict)  # kernel id -> its function's address
    sass: Any = None  # sass.Sass of the kernel, when there was SASS
    # what coredump_evidence derived from the warps, kept (stuck sites per checkpoint table)
    derived: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)
