"""Which GPUs a session may use, and which one each parallel worker gets.

Stdlib only (nvidia-smi, never torch). A GPU is named as CUDA names it in
``CUDA_VISIBLE_DEVICES``: an nvidia-smi index ("3") or a UUID ("GPU-8c2f..."). Binding a
process to a GPU is setting ``CUDA_VISIBLE_DEVICES`` to that one name before anything in it
creates a CUDA context; every worker it forks or spawns inherits it, and sees it as device 0.

- :func:`visible_gpus`: the GPUs this process may use: the entries of its own
  ``CUDA_VISIBLE_DEVICES`` when it is set (their order kept), else every GPU nvidia-smi lists.
- :func:`parse_gpus`: ``all`` or a comma list (``0,1,3``), checked against those.
- :func:`worker_index` and :func:`gpu_for_worker`: pytest-xdist worker ``gwN`` gets the N-th
  GPU of the list (round robin when there are more workers than GPUs).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from cutedebug.engine import lifeline

VISIBLE_VAR = "CUDA_VISIBLE_DEVICES"


class GpuSpecError(ValueError):
    """A --gpus value that names no usable GPU (the message says which are allowed)."""


def smi_rows(
    fields: str, timeout_s: float = 20.0, *, tied: bool = True
) -> tuple[list[list[str]], str]:
    """What nvidia-smi lists per GPU for ``--query-gpu=FIELDS`` (a comma list): (one row of
    stripped values per GPU, ""), or ([], why not: no nvidia-smi, it failed, it listed no
    GPU). The harness's one way of asking nvidia-smi (health.detect_gpu, smi_gpus,
    preloads.uniform_cc). ``tied``: a child tied to this process (lifeline.run_tool, which
    starts the process's keeper); False: a plain child with the same timeout, for a fork server,
    which must leave no keeper beside its workers."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "no NVIDIA GPU on this machine (nvidia-smi not found)"
    argv = [smi, f"--query-gpu={fields}", "--format=csv,noheader"]
    try:
        out = (
            lifeline.run_tool(argv, timeout_s)
            if tied
            else subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"nvidia-smi failed: {e}"
    width = fields.count(",") + 1
    rows = [
        [c.strip() for c in ln.split(",")]
        for ln in out.stdout.splitlines()
        if ln.strip() and ln.count(",") == width - 1
    ]
    if out.returncode != 0 or not rows:
        msg = (out.stderr or out.stdout).strip()[:300]
        return [], f"nvidia-smi lists no usable GPU: {msg}"
    return rows, ""


def smi_gpus(timeout_s: float = 20.0) -> list[str]:
    """Indices of the GPUs nvidia-smi lists ("0", "1", ...); [] without nvidia-smi or GPUs."""
    rows, _ = smi_rows("index", timeout_s)
    return [r[0] for r in rows if r[0].isdigit()]


def visible_gpus(env: dict[str, str] | None = None) -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries."""
    env = os.environ if env is None else env
    visible = env.get(VISIBLE_VAR)
    if visible is not None:
        entries = [e.strip() for e in visible.split(",")]
        # CUDA stops at the first invalid entry ("-1", "" hide every GPU)
        out = []
        for e in entries:
            if not e or e.startswith("-"):
                break
            out.append(e)
        return out
    return smi_gpus()


def parse_gpus(spec: str, visible: list[str]) -> list[str]:
    """``all`` -> every visible GPU; ``0,2`` -> those, in that order, each one visible.
    Raises GpuSpecError naming the allowed values."""
    text = spec.strip()
    allowed = (
        f"'all' or a comma list of {', '.join(visible)}"
        if visible
        else "'all' (no GPU is visible here)"
    )
    if text == "all":
        return list(visible)
    names = [p.strip() for p in text.split(",")]
    if not text or any(not n for n in names):
        raise GpuSpecError(f"--gpus {spec!r}: empty GPU name; allowed: {allowed}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise GpuSpecError(f"--gpus {spec!r}: {', '.join(dup)} named twice; allowed: {allowed}")
    unknown = [n for n in names if n not in visible]
    if unknown:
        raise GpuSpecError(
            f"--gpus {spec!r}: {', '.join(unknown)} not visible here; allowed: {allowed}"
        )
    return names


def worker_index(worker_id: str | None) -> int | None:
    """pytest-xdist's worker id ``gw3`` -> 3; None for the controller or without xdist."""
    if not worker_id or not worker_id.startswith("gw") or not worker_id[2:].isdigit():
        return None
    return int(worker_id[2:])


def gpu_for_worker(index: int, gpus: list[str]) -> str:
    """The GPU worker ``index`` runs on: the index-th of ``gpus``, round robin."""
    if not gpus:
        raise GpuSpecError("no GPU to bind the worker to")
    return gpus[index % len(gpus)]
