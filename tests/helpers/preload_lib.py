"""A library that writes which process imported it, and a kernel file that imports it: what
the preload tests of the fork server and of the warm pool's server use."""

import os
from pathlib import Path

from cutedebug.engine import scenario as S

ROOT = Path(__file__).resolve().parent.parent.parent

LIB = """
import os
with open(os.environ["PRELOAD_PROBE_OUT"], "a") as f:
    f.write(f"{os.getpid()}\\n")
if os.environ.get("PRELOAD_PROBE_PRINT") == "1":  # a chatty library: Python and C level
    print("preload_probe_lib: hello")
    os.write(1, b"preload_probe_lib: hello from fd 1\\n")
if os.environ.get("PRELOAD_PROBE_CUDA") == "1":
    import torch
    torch.cuda._initialized = True  # what an import that touched the GPU leaves behind
"""

KERNEL = f"""
import importlib.util

import preload_probe_lib  # noqa: F401  (the library the scenario declares)

_spec = importlib.util.spec_from_file_location("_preload_minimal", {str(ROOT / "kernels" / "minimal.py")!r})
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
Minimal = _mod.Minimal
"""


def make_probe_lib(tmp_path: Path, monkeypatch) -> tuple[S.Scenario, Path]:
    """The library on PYTHONPATH and an ad-hoc scenario declaring it; the file each import
    appends its process id to."""
    lib = tmp_path / "lib"
    (lib / "preload_probe_lib").mkdir(parents=True)
    (lib / "preload_probe_lib" / "__init__.py").write_text(LIB)
    (tmp_path / "kernel_file.py").write_text(KERNEL)
    out = tmp_path / "imported_in.txt"
    monkeypatch.setenv("PRELOAD_PROBE_OUT", str(out))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(lib), os.environ.get("PYTHONPATH", "")]))
    sc = S.adhoc(str(tmp_path / "kernel_file.py") + ":Minimal", {}, None, {}, "PASS")
    sc = sc.with_overrides(modules=("preload_probe_lib",))
    return sc, out
