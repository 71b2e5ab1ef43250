"""Which patch faults reach a kernel, and where: compile it once per fault (no GPU) and list the
sites each fault changed (op, file:line), plus the static protocol findings of the clean trace.

    CUTE_DSL_ARCH=sm_90a python tools/field_fault_sites.py scenarios/field/quack_rmsnorm.py:QuackRMSNormBwd
    python tools/field_fault_sites.py --json out.json FILE.py:ENTRY ...
    python tools/field_fault_sites.py --trace-only FILE.py:ENTRY ...

A fault with 0 sites leaves the compiled kernel clean: a scenario with it could only PASS.
Everything runs in this one process (one DSL import, ~3-5 s per compile). The sites and the
static findings are decided while the kernel is traced: ``--trace-only`` stops each compile
after the trace (the DSL's dry run, CUTE_DSL_DRYRUN=1; same sites and findings, a fraction of
the CPU) and so does not show that the faulted kernel also lowers to PTX.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Each patch fault once with its default arguments, plus the variants the scenarios use.
VARIANTS = (
    ("wrong_expect_tx", {"delta_bytes": 16}),
    ("wrong_expect_tx", {"delta_bytes": -16}),
    ("missing_phase_flip", {"role": "consumer"}),
    ("missing_phase_flip", {"role": "producer"}),
    ("skip_producer_tail", {}),
    ("skip_consumer_release", {}),
    ("extra_consumer_release", {}),
    ("wrong_arrive_count", {"barrier": "empty", "delta": 1}),
    ("wrong_arrive_count", {"barrier": "empty", "delta": -1}),
    ("wrong_arrive_count", {"barrier": "full", "delta": 1}),
    ("missing_init_fence", {}),
    ("drop_sync", {"which": -1, "sync": "cta"}),
    ("drop_sync", {"which": -1, "sync": "warp"}),
    ("cta_scope_sync", {}),
    ("wrong_barrier_threads", {"delta": 32}),
    ("wrong_barrier_threads", {"delta": -32}),
    ("early_exit", {"role": "consumer"}),
    ("early_exit", {"role": "producer"}),
    ("expect_tx_no_2cta_doubling", {}),
)


def survey(target: str, arch: str, only: tuple[str, ...] = ()) -> dict:
    import cutlass.cute as cute
    from cutlass.base_dsl.compiler import DumpDir

    from cutedebug import kernel_api
    from cutedebug.analyses import lint
    from cutedebug.instrument import faults

    file, entry = target.rsplit(":", 1)
    cls = kernel_api.load_entry(file, entry)
    out = {"target": target, "arch": arch, "faults": []}

    def compile_once(name, args):
        kernel = cls(**kernel_api.resolve_params(cls, {}, target))
        t0 = time.monotonic()
        with lint.record() as protocol, faults.inject(name, args) as applied:
            cute.compile[cute.GPUArch(arch), DumpDir(tempfile.gettempdir())](
                kernel, *kernel.fake_args()
            )
        return applied, lint.static_findings(protocol), time.monotonic() - t0

    _, findings, secs = compile_once(None, {})
    out["clean"] = {"secs": round(secs, 2), "static_findings": findings}
    print(f"{target}: clean compile {secs:.1f} s, {len(findings)} static finding(s)")
    for f in findings:
        print(f"    {f.get('severity')} {f.get('check')}: {f.get('message', '')[:150]}")
    for name, args in VARIANTS:
        if only and name not in only:
            continue
        try:
            applied, _, secs = compile_once(name, args)
        except Exception as e:  # a fault that cannot apply here is a fact, not a crash
            rec = {"fault": name, "args": args, "error": f"{type(e).__name__}: {e}"[:300]}
            print(f"  {name}{args}: ERROR {rec['error']}")
            out["faults"].append(rec)
            continue
        where = Counter(
            f"{s.get('op')} {Path(s['file']).name if s.get('file') else None}:{s.get('line')}"
            for s in applied.sites
        )
        rec = {
            "fault": name,
            "args": args,
            "count": applied.count,
            "secs": round(secs, 2),
            "sites": dict(where),
            "patched": sorted(set(applied.patched)),
        }
        out["faults"].append(rec)
        shown = ", ".join(f"{k} x{v}" for k, v in where.most_common(6))
        print(f"  {name}{args}: {applied.count} site(s)  {shown}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="+", help="FILE.py:ENTRY")
    ap.add_argument("--arch", default=os.environ.get("CUTE_DSL_ARCH", "sm_90a"))
    ap.add_argument("--json", help="write the survey here")
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="FAULT",
        help="survey only this fault (repeatable)",
    )
    ap.add_argument(
        "--trace-only",
        action="store_true",
        help="stop each compile after the trace (CUTE_DSL_DRYRUN=1): sites and findings only",
    )
    a = ap.parse_args(argv)
    if a.trace_only:  # read by the DSL when cutlass is first imported (in survey)
        os.environ["CUTE_DSL_DRYRUN"] = "1"
    results = [survey(t, a.arch, tuple(a.only)) for t in a.targets]
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
