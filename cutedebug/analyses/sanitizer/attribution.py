"""Which kernel of the process a finding belongs to.

compute-sanitizer checks every kernel the process launches: the torch reference's too
(racecheck reported 1000 hazards inside PyTorch's attention kernel under a clean FA-4
forward). The worker names the kernels it launched (the compiled module's PTX entries, the
symbols the sanitizer reports in <func>); findings of any other kernel are counted apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cutedebug import records
from cutedebug.analyses.sanitizer.findings import Finding
from cutedebug.analyses.sanitizer.triage import GroupRecord, classify, group


@dataclass(frozen=True, slots=True, kw_only=True)
class OtherKernel(records.Record):
    """Findings of a kernel the worker did not launch (a sanitize result's ``other_kernels``):
    counted apart, never the verdict."""

    kernel: str
    records: int
    count: int
    class_: str = records.named("class")  # the class its findings would have had
    groups: list[GroupRecord]  # its first groups, most first


def is_launched_kernel(name: str | None, kernel_names: Sequence[str]) -> bool:
    """``name`` (a finding's kernel) is one the worker launched: equal, or one a prefix of
    the other (a tool that shortens long symbols)."""
    if not name:
        return False
    return any(
        name == k or (min(len(name), len(k)) >= 16 and (name.startswith(k) or k.startswith(name)))
        for k in kernel_names
    )


def attribute(
    findings: Iterable[Finding], kernel_names: Sequence[str]
) -> tuple[list[Finding], list[Finding]]:
    """(the kernel under test's findings, other kernels' findings).

    A finding belongs to another kernel only when it names a kernel and that kernel is not one
    the worker launched. Findings that name no kernel (API errors, parse failures, the
    summary cross-check) stay with the run, and so does everything when the launched kernels
    are unknown (no names: nothing is set aside, never a finding hidden).
    """
    own: list[Finding] = []
    others: list[Finding] = []
    for f in findings:
        if kernel_names and f.kernel and not is_launched_kernel(f.kernel, kernel_names):
            others.append(f)
        else:
            own.append(f)
    return own, others


def other_kernels(
    others: Iterable[Finding],
    tool: str,
    read: Callable[[str | None, int | None], str | None] | None = None,
    max_groups: int = 4,
) -> list[OtherKernel]:
    """Per other kernel: its name, records, count, class and first groups (most first)."""
    by_kernel: dict[str, list[Finding]] = {}
    for f in others:
        by_kernel.setdefault(f.kernel or "?", []).append(f)
    out = [
        OtherKernel(
            kernel=name,
            records=len(fs),
            count=sum(f.count for f in fs),
            class_=classify(fs, tool),
            groups=[g.record(read) for g in group(fs)[:max_groups]],
        )
        for name, fs in by_kernel.items()
    ]
    out.sort(key=lambda k: -k.count)
    return out
