"""The minimal kernel, saying in its fake_args whether torch was imported by then (compile-only
workers must not import it)."""

import importlib.util
import os
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_torchless_minimal", Path(__file__).resolve().parents[2] / "kernels" / "minimal.py"
)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)


class TorchlessMinimal(_mod.Minimal):
    def fake_args(self):
        with open(os.environ["TORCHLESS_OUT"], "a") as f:
            f.write(f"{'torch' in sys.modules}\n")
        return super().fake_args()
