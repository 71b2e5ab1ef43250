"""Fingerprints of the PTX every scenario compiles to, for refactors that must not change it.

    python tools/ptx_fingerprints.py > before.txt        # CPU only (CUTE_DSL_ARCH not needed)
    ... change the instrumentation, a kernel, the worker ...
    python tools/ptx_fingerprints.py | diff before.txt -

Every scenario under scenarios/ (or the ones given; ``-k SUBSTR`` filters by id) is compiled
in this process exactly as its worker compiles it for ``cutedebug run --compile-only`` (the
same request, ``engine.worker.run``: kernel params, trace-time fault patches, lint recorder),
once with the probes off and once on (bounded waits + beacons); the clean scenario of each
family also with beacons off and with each of its first four checkpoint sites enabled (the
printf-bisection's runs). One line per variant: ``<scenario id> <variant> <sha1 of the PTX>``,
or what the worker said instead of PTX (``unsupported: ...`` for the field kernels whose
libraries are not installed, ``compile_error: ...``). The probe buffer's address is a fixed
constant on a CPU machine, so the PTX of a probed variant is reproducible.

Byte-identical PTX means the GPU runs exactly what it ran before: a change that keeps every
fingerprint needs no new GPU run. Takes a few minutes on a 2-core machine (~230 compiles).
"""

from __future__ import annotations

import argparse
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


def compile_variant(sc, workdir: Path, *, probes=None, bisect=None) -> tuple[str, list[dict]]:
    """(fingerprint or what came instead, the worker's events) of one compile-only run."""
    from cutedebug.engine import runner, worker

    extra = {} if bisect is None else {"bisect": bisect}
    req, events_path, _ = runner.write_request(workdir, sc, mode="compile", probes=probes, **extra)
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
        return hashlib.sha1(ptx_path.read_bytes()).hexdigest(), evs
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "targets",
        nargs="*",
        default=[str(ROOT / "scenarios")],
        help="scenario files or directories (default: scenarios/)",
    )
    p.add_argument("-k", dest="filter", default="", help="only scenario ids containing this")
    p.add_argument("--no-checkpoints", action="store_true", help="skip the checkpoint variants")
    args = p.parse_args(argv)

    from cutedebug.engine import scenario as S

    scenarios = []
    for t in args.targets:
        for f in S.discover(t):
            sc = S.load(f)
            if args.filter in sc.id:
                scenarios.append(sc)
    scenarios.sort(key=lambda s: s.id)
    clean_of_family: dict[str, str] = {}
    for sc in scenarios:
        if not sc.fault:
            clean_of_family.setdefault(sc.id.split("/")[0], sc.id)
    with tempfile.TemporaryDirectory(prefix="cutedebug-ptx-") as tmp:
        for n, sc in enumerate(scenarios):
            is_clean = clean_of_family.get(sc.id.split("/")[0]) == sc.id
            for name, kw in variants(sc, is_clean):
                fp, _ = compile_variant(sc, Path(tmp) / f"{n}-{name.replace(' ', '_')}", **kw)
                print(f"{sc.id:<52} {name:<24} {fp}", flush=True)
            if not is_clean or args.no_checkpoints:
                continue
            _, evs = compile_variant(sc, Path(tmp) / f"{n}-sites", bisect={"site": None})
            table = next((e["sites"] for e in evs if e["event"] == "checkpoint_sites"), [])
            for site in table[:CHECKPOINT_SITES]:
                fp, _ = compile_variant(
                    sc, Path(tmp) / f"{n}-cp{site['id']}", bisect={"site": site["id"]}
                )
                print(f"{sc.id:<52} {'checkpoint site ' + str(site['id']):<24} {fp}", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    sys.exit(main())
