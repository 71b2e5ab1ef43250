"""Fingerprints of every scenario's instrumented PTX and trace-time results, for refactors.

    python tools/scenario_fingerprints.py [DIR ...] > before.txt   # CPU only
    ... change cutedebug/instrument ...
    python tools/scenario_fingerprints.py [DIR ...] | diff before.txt -

For each scenario (default: every one under scenarios/) it compiles the kernel as the worker
does (lint recorder, then the fault, then the probes when ``--probes``) and prints one line:
the scenario id, the sha1 of its PTX, the fault's site count and call lines, and the lint
findings of severity error. Identical lines mean the GPU runs exactly what it ran before and
the trace-time results did not move; a changed line names what moved.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutlass import cute  # noqa: E402
from cutlass.base_dsl.compiler import DumpDir  # noqa: E402

from cutedebug import kernel_api  # noqa: E402
from cutedebug.engine import scenario as S  # noqa: E402
from cutedebug.instrument import faults, probes  # noqa: E402

try:  # the recorder's home
    from cutedebug.analyses.lint import check  # noqa: E402
    from cutedebug.instrument.recorder import record  # noqa: E402
except ImportError:  # before the split
    from cutedebug.analyses.lint import check, record  # noqa: E402

ADDR = 0x7F0000000000


def fingerprint(sc: S.Scenario, with_probes: bool) -> str:
    cls = kernel_api.load_entry(sc.kernel_file, sc.kernel_entry)
    given = dict(sc.params)
    patch_fault = sc.fault
    if (
        sc.fault
        and faults.FAULTS.get(sc.fault) is None
        or (sc.fault and faults.FAULTS[sc.fault].kind == "switch")
    ):
        given[sc.fault] = True
        patch_fault = None
    kernel = cls(**kernel_api.resolve_params(cls, given, sc.id))
    target = sc.archs[0]
    with contextlib.ExitStack() as stack:
        proto = stack.enter_context(record())
        applied = stack.enter_context(
            faults.inject(patch_fault, sc.fault_args) if patch_fault else contextlib.nullcontext()
        )
        if with_probes:
            stack.enter_context(probes.instrument(probes.ProbeConfig(), ADDR))
        opts = cute.compile[cute.GPUArch(target), cute.KeepPTX(), DumpDir(tempfile.mkdtemp())]
        ptx = opts(kernel, *kernel.fake_args()).__ptx__
    sha = hashlib.sha1(ptx.encode()).hexdigest()
    sites = ""
    if patch_fault:
        lines = sorted({f"{os.path.basename(s['file'] or '?')}:{s['line']}" for s in applied.sites})
        sites = f" sites={applied.count} at {','.join(lines)}"
    errors = sorted({f"{f.check}@{f.where()}" for f in check(proto) if f.severity == "error"})
    return f"{sc.id} {'probes' if with_probes else 'plain'} {sha}{sites} lint_errors={errors}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="*", default=["scenarios"])
    ap.add_argument("--probes", action="store_true", help="with the probes too")
    args = ap.parse_args()
    for d in args.dirs:
        for f in S.discover(Path(d)):
            sc = S.load(f)
            for with_probes in (False, True) if args.probes else (False,):
                try:
                    print(fingerprint(sc, with_probes), flush=True)
                except Exception as e:  # a scenario that does not compile: say so, go on
                    print(
                        f"{sc.id} {'probes' if with_probes else 'plain'} ERROR "
                        f"{type(e).__name__}: {str(e)[:200]}",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
