"""Fingerprints of the PTX every scenario compiles to, for refactors that must not change it.

    python tools/ptx_fingerprints.py > before.txt        # CPU only (CUTE_DSL_ARCH not needed)
    ... change the instrumentation, a kernel, the worker ...
    python tools/ptx_fingerprints.py | diff before.txt -

Every scenario under scenarios/ (or the ones given; ``-k SUBSTR`` filters by id, ``--kernel
STEM`` by kernel file, e.g. ``--kernel sm90_gemm`` also takes the bisect/ scenarios of that
kernel) is compiled in this process exactly as its worker compiles it for ``cutedebug run
--compile-only`` (the same request, ``engine.worker.run``: kernel params, trace-time fault
patches, lint recorder), once with the probes off and once on (bounded waits + beacons); the
clean scenario of each kernel file (its first scenario if it has none) also with beacons off,
with line info (the sanitizer's and the coredump's compile), with the perturbation's delay
positions, and with each of its first four checkpoint sites enabled (the printf-bisection's
runs). One line per variant: ``<scenario id>
<variant> <sha1 of the PTX>``, or what the worker said instead of PTX (``unsupported: ...`` for
the field kernels whose libraries are not installed, ``compile_error: ...``). The probe buffer's
address is a fixed constant on a CPU machine, so the PTX of a probed variant is reproducible.

Byte-identical PTX means the GPU runs exactly what it ran before: a change that keeps every
fingerprint needs no new GPU run. Takes a few minutes on a 2-core machine (~230 compiles).

Kernel edits that only move source lines (a refactor of a kernel file) change three things in
the PTX and nothing else, so they are compared with line information set aside:

    python tools/ptx_fingerprints.py --kernel sm90_gemm --save before/   # old kernel source
    python tools/ptx_fingerprints.py --kernel sm90_gemm --save after/    # new kernel source
    python tools/ptx_fingerprints.py --compare before/ after/

``--compare`` reads the saved PTX of both sides and, per variant, prints ``identical``,
``same except line info`` with what differed, or ``DIFFERS`` with the first differing line
(exit 1 if any variant differs or is missing on one side). Line information is exactly:
``.loc`` / ``.file`` directives and the DWARF ``.section .debug_*`` blocks (line-info compiles
only), and the ``FILE.py:LINE`` a probe's stuck banner (``cutedebug: STUCK site N ... at
FILE.py:LINE``) or a checkpoint's banner (``cutedebug: CHECKPOINT site N ... at FILE.py:LINE``)
bakes into a ``printfFormat_*`` byte array, whose declared length moves with the number of
digits. Normalising replaces those line numbers by ``<line>``, re-declares the array with that
text, and drops the directives; every other byte (instructions, registers, smem offsets,
immediates, parameter lists, kernel names) must match.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROBES = {"budget_ns": 10**8}
CHECKPOINT_SITES = 4
PERTURB = {"seeds": 1}  # compile-only: the request's presence puts the delay positions in

# .global .align 1 .b8 printfFormat_3[137] = {99, 117, ...};
_BYTES_DECL = re.compile(r"^(\.global \.align \d+ \.b8 \w+)\[(\d+)\] = \{([\d, ]*)\};$")
_BANNER = re.compile(r"^cutedebug: (STUCK|CHECKPOINT) site \d+ ")
_WHERE_LINE = re.compile(r"(\.py):(\d+)")
_LINE_DIRECTIVE = re.compile(r"^\s*\.(loc|file)\s")


def strip_line_info(ptx: str) -> tuple[str, dict[str, int]]:
    """``ptx`` with its line information set aside (see the module docstring), and how much of
    each kind there was: ``loc`` / ``file`` directives, ``debug_sections`` lines, and
    ``banner_lines`` (line numbers in printf banners)."""
    counts = {"loc": 0, "file": 0, "debug_sections": 0, "banner_lines": 0}
    out: list[str] = []
    in_debug = False
    for line in ptx.splitlines():
        if in_debug:
            counts["debug_sections"] += 1
            in_debug = line.strip() != "}"
            continue
        if line.lstrip().startswith(".section") and ".debug_" in line:
            counts["debug_sections"] += 1
            in_debug = not line.rstrip().endswith("}")
            continue
        if m := _LINE_DIRECTIVE.match(line):
            counts[m.group(1)] += 1
            continue
        if m := _BYTES_DECL.match(line.strip()):
            text = bytes(int(b) for b in m.group(3).split(",") if b.strip()).decode("latin-1")
            if _BANNER.match(text):
                text, n = _WHERE_LINE.subn(r"\1:<line>", text)
                counts["banner_lines"] += n
                line = f"{m.group(1)}[*] = {json.dumps(text)};"
        out.append(line)
    return "\n".join(out) + "\n", counts


def compile_variant(
    sc, workdir: Path, *, probes=None, bisect=None, keep: Path | None = None, **extra
) -> tuple[str, list[dict]]:
    """(fingerprint or what came instead, the worker's events) of one compile-only run.
    ``keep``: where to copy the PTX; ``extra``: further request fields (``line_table``,
    ``perturb``)."""
    from cutedebug.analyses import lint
    from cutedebug.engine import runner, worker

    if bisect is not None:
        extra["bisect"] = bisect
    req, events_path, _ = runner.write_request(
        workdir, sc, mode="compile", probes=probes, compile_checks=[lint.static_findings], **extra
    )
    request = json.loads(req.read_text())
    events = worker.Events(str(events_path))
    try:
        worker.run(request, events)
    except Exception as e:  # the worker's own process would report it the same way
        return f"error: {type(e).__name__}: {str(e)[:120]}", []
    finally:
        events._f.close()
    evs = [json.loads(line) for line in events_path.read_text().splitlines() if line.strip()]
    by_name = {e["event"]: e for e in evs}
    ptx_path = Path(request["ptx_path"])
    if "compiled" in by_name and ptx_path.exists():
        ptx = ptx_path.read_bytes()
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            keep.write_bytes(ptx)
        return hashlib.sha1(ptx).hexdigest(), evs
    for name in ("unsupported", "compile_error", "harness_error"):
        if name in by_name:
            e = by_name[name]
            why = e.get("reason") or f"{e.get('type')}: {e.get('message', '')}"
            why = re.sub(r"\x1b\[[0-9;]*m", "", str(why))  # the DSL colors its errors
            return f"{name}: {' '.join(str(why).split())[:120]}", evs
    return "no PTX: " + ",".join(e["event"] for e in evs), evs


def variants(sc, clean: bool):
    yield "probes=off", {}
    yield "probes=on", {"probes": PROBES}
    if clean:
        yield "probes=on beacons=off", {"probes": {**PROBES, "beacons": False}}
        yield "probes=off lineinfo", {"line_table": True}
        yield "perturb", {"perturb": PERTURB}


def family(sc) -> str:
    """A scenario's kernel family: its kernel file (bisect/ scenarios belong to theirs)."""
    return str(sc.kernel_file)


def _saved_name(scenario_id: str, variant: str) -> str:
    return f"{scenario_id.replace('/', '__')}__{variant.replace(' ', '_').replace('=', '-')}"


def compare(before: Path, after: Path) -> int:
    """Print one line per variant saved in ``before`` or ``after``; 1 if any differs."""
    olds = json.loads((before / "fingerprints.json").read_text())
    news = json.loads((after / "fingerprints.json").read_text())
    bad = 0
    totals = {"identical": 0, "same except line info": 0, "DIFFERS": 0, "missing": 0}
    for key in sorted(set(olds) | set(news)):
        sid, variant = key.split("\t")
        label = f"{sid:<52} {variant:<24}"
        o, n = olds.get(key), news.get(key)
        if o is None or n is None:
            print(f"{label} missing {'before' if o is None else 'after'}")
            totals["missing"] += 1
            bad = 1
            continue
        if o["file"] is None or n["file"] is None:  # no PTX on a side: compare what came
            same = o["fingerprint"] == n["fingerprint"]
            verdict = "identical" if same else "DIFFERS"
            print(f"{label} {verdict} (no PTX: {n['fingerprint'][:80]})")
            totals[verdict] += 1
            bad |= not same
            continue
        old_ptx = (before / o["file"]).read_text(encoding="latin-1")
        new_ptx = (after / n["file"]).read_text(encoding="latin-1")
        if old_ptx == new_ptx:
            print(f"{label} identical")
            totals["identical"] += 1
            continue
        old_norm, old_counts = strip_line_info(old_ptx)
        new_norm, new_counts = strip_line_info(new_ptx)
        if old_norm == new_norm:
            changed = [
                f"{k} {old_counts[k]}->{new_counts[k]}"
                if old_counts[k] != new_counts[k]
                else f"{k} {new_counts[k]}"
                for k in old_counts
                if old_counts[k] or new_counts[k]
            ]
            print(f"{label} same except line info ({', '.join(changed)})")
            totals["same except line info"] += 1
            continue
        diff = difflib.unified_diff(old_norm.splitlines(), new_norm.splitlines(), n=0, lineterm="")
        first = [d for d in diff if d[:1] in "+-" and d[:3] not in ("+++", "---")][:2]
        print(f"{label} DIFFERS: {' | '.join(x[:100] for x in first)}")
        totals["DIFFERS"] += 1
        bad = 1
    print("# " + ", ".join(f"{k}: {v}" for k, v in totals.items()))
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "targets",
        nargs="*",
        default=[str(ROOT / "scenarios")],
        help="scenario files or directories (default: scenarios/)",
    )
    p.add_argument("-k", dest="filter", default="", help="only scenario ids containing this")
    p.add_argument("--kernel", default="", help="only scenarios of this kernel file (its stem)")
    p.add_argument("--no-checkpoints", action="store_true", help="skip the checkpoint variants")
    p.add_argument(
        "--all-checkpoints",
        action="store_true",
        help=f"every checkpoint site of the clean scenario, not the first {CHECKPOINT_SITES}",
    )
    p.add_argument("--save", type=Path, help="keep every variant's PTX in this directory")
    p.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("BEFORE", "AFTER"),
        help="compare two --save directories, line information set aside",
    )
    args = p.parse_args(argv)
    if args.compare:
        return compare(*args.compare)

    from cutedebug.engine import scenario as S

    scenarios = []
    for t in args.targets:
        for f in S.discover(t):
            sc = S.load(f)
            if args.filter in sc.id and (
                not args.kernel or Path(sc.kernel_file).stem == args.kernel
            ):
                scenarios.append(sc)
    scenarios.sort(key=lambda s: s.id)
    # the extra variants go to each kernel file's clean scenario, or to its first scenario
    # when it has none (flag_spin has only its bisect/ scenarios)
    clean_of_family: dict[str, str] = {}
    for sc in sorted(scenarios, key=lambda s: (bool(s.fault), s.id)):
        clean_of_family.setdefault(family(sc), sc.id)
    saved: dict[str, dict] = {}

    def emit(sc, variant: str, workdir: Path, **kw) -> list[dict]:
        keep = args.save / (_saved_name(sc.id, variant) + ".ptx") if args.save else None
        fp, evs = compile_variant(sc, workdir, keep=keep, **kw)
        print(f"{sc.id:<52} {variant:<24} {fp}", flush=True)
        has_ptx = keep is not None and keep.exists()
        saved[f"{sc.id}\t{variant}"] = {"fingerprint": fp, "file": keep.name if has_ptx else None}
        return evs

    with tempfile.TemporaryDirectory(prefix="cutedebug-ptx-") as tmp:
        for n, sc in enumerate(scenarios):
            is_clean = clean_of_family.get(family(sc)) == sc.id
            for name, kw in variants(sc, is_clean):
                emit(sc, name, Path(tmp) / f"{n}-{name.replace(' ', '_')}", **kw)
            if not is_clean or args.no_checkpoints:
                continue
            _, evs = compile_variant(sc, Path(tmp) / f"{n}-sites", bisect={"site": None})
            table = next((e["sites"] for e in evs if e["event"] == "checkpoint_sites"), [])
            for site in table if args.all_checkpoints else table[:CHECKPOINT_SITES]:
                name = f"checkpoint site {site['id']}"
                emit(sc, name, Path(tmp) / f"{n}-cp{site['id']}", bisect={"site": site["id"]})
    if args.save:
        (args.save / "fingerprints.json").write_text(json.dumps(saved, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    sys.exit(main())
