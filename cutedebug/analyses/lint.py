"""Static protocol checks: the invariants of a kernel's barrier protocol, with the arithmetic.

The protocol is recorded while the kernel is traced, by ``instrument/recorder.record()`` (also
importable from here): each pipeline keyed by the layer's identity (creation order, class,
the kernel's create() line), every pipeline op per role in trace order, TMA copies, expect_tx,
named barriers, mbarrier init / fence / syncs. ``check(protocol)`` turns it into ``Finding``
records whose message states the arithmetic.

Enter ``record()`` with or around ``faults.inject``: the layer runs the fault's handlers
before the recorder's, so the recorder sees what the fault makes the kernel do::

    with lint.record() as proto, faults.inject(name, args):
        compiled = cute.compile(kernel, *args)
    findings = lint.check(proto)

This module imports cutlass only inside ``record()``: the parent (``cutedebug lint``,
commands/lint.py) runs the compile in a child process (``python -m cutedebug.analyses.lint
REQUEST.json``).
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from cutedebug.analyses.pairing_checks import (  # noqa: F401  (part of this interface)
    _check_named_barriers,
    _check_pairing,
    _check_producer_tail,
)
from cutedebug.analyses.protocol_checks import (  # noqa: F401  (part of this interface)
    SEVERITIES,
    Finding,
    _check_arrive_counts,
    _check_expect_tx,
    _check_init,
    _check_phase_flip,
    _check_warp_release,
)
from cutedebug.engine.compile_checks import HARNESS_CHECK, harness_finding  # noqa: F401
from cutedebug.instrument.recorder import (  # noqa: F401  (the protocol's types, and record)
    Event,
    PipelineRecord,
    Protocol,
    record,
)

# ---- checks ----------------------------------------------------------------------------------


def check(proto: Protocol) -> list[Finding]:
    """Every invariant over the recorded protocol; the message states the arithmetic."""
    out: list[Finding] = []
    for fn in (
        _check_expect_tx,
        _check_arrive_counts,
        _check_pairing,
        _check_producer_tail,
        _check_named_barriers,
        _check_init,
        _check_phase_flip,
        _check_warp_release,
    ):
        out += fn(proto)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(out, key=lambda f: (order[f.severity], f.check, f.file or "", f.line or 0))


def static_findings(proto: Protocol) -> list[dict[str, Any]]:
    """check() as JSON: the compile check the runner's callers hand the worker
    (``runner.run_scenario(..., compile_checks=[lint.static_findings])``; engine/compile_checks.py)
    for its "compiled" event. A checker that crashes does not fail the run but leaves one
    visible error finding (check "harness_error"), never "clean"."""
    try:
        return [f.to_json() for f in check(proto)]
    except Exception as e:
        return [harness_finding("the static checks", e)]


# ---- the child: compile one scenario under record() ------------------------------------------


def compile_and_check(sc: dict[str, Any], dump_dir: str | None = None) -> dict[str, Any]:
    """Compile the scenario's kernel (fake args) inside record(); protocol + findings as JSON."""
    import cutlass.cute as cute
    from cutlass.base_dsl.compiler import DumpDir

    from cutedebug import kernel_api
    from cutedebug.instrument import faults

    where = f"{sc['kernel']['file']}:{sc['kernel']['entry']}"
    cls = kernel_api.load_entry(sc["kernel"]["file"], sc["kernel"]["entry"])
    given = dict(sc.get("params") or {})
    fault, fault_args = sc.get("fault"), sc.get("fault_args") or {}
    patch_fault = fault
    if fault and (fault not in faults.FAULTS or faults.FAULTS[fault].kind == "switch"):
        given[fault] = True
        patch_fault = None
    params = kernel_api.resolve_params(cls, given, where)
    kernel = cls(**params)
    archs = getattr(cls, "ARCHS", None) if sc.get("arch_from_kernel") else None
    target = (archs or sc.get("archs") or ["sm_90a"])[0]
    with (
        record() as proto,
        faults.inject(patch_fault, fault_args) if patch_fault else contextlib.nullcontext(),
    ):
        cute.compile[cute.GPUArch(target), DumpDir(dump_dir or tempfile.gettempdir())](
            kernel, *kernel.fake_args()
        )
    return {
        "protocol": proto.to_json(),
        "findings": static_findings(proto),
        "arch": target,
        "params": params,
    }


def _child(argv: list[str]) -> int:
    req = json.loads(Path(argv[0]).read_text())
    try:
        out = compile_and_check(req["scenario"], req.get("dump_dir"))
    except Exception as e:
        import traceback

        out = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    Path(req["out"]).write_text(json.dumps(out, default=str))
    return 0


def render(findings: list[Finding], title: str = "") -> str:
    lines = [title] if title else []
    if not findings:
        lines.append("  no findings")
        return "\n".join(lines)
    rows = [(f.severity, f.check, f.where(), f.pipeline or "-", f.message) for f in findings]
    head = ("severity", "check", "where", "pipeline")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(4)]
    lines.append("  " + "  ".join(h.ljust(w) for h, w in zip(head, widths)) + "  message")
    for f, r in zip(findings, rows):
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
        if f.arithmetic:
            lines.append("  " + " " * (sum(widths) + 8) + "  = " + f.arithmetic)
    return "\n".join(lines)


if __name__ == "__main__":
    from cutedebug.analyses import (
        lint as _module,  # record() must run as cutedebug.analyses.lint, not __main__
    )

    sys.exit(_module._child(sys.argv[1:]))
