"""Fingerprints of the PTX cutedebug's device instrumentation produces, for refactors.

    python tools/ptx_fingerprints.py > before.txt    # (CPU only: CUTE_DSL_ARCH=sm_90a)
    ... change probes.py / checkpoint.py ...
    python tools/ptx_fingerprints.py | diff before.txt -

Compiles tma_stream, flag_spin and sm90_gemm with the probes (beacons off and on) and with each
of the first four checkpoint sites enabled, and prints one sha1 per PTX. Byte-identical PTX
means the GPU runs exactly what it ran before: a change to the device helpers that keeps every
fingerprint needs no new GPU run.
"""

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
from cutedebug.instrument import (
    checkpoint,  # noqa: E402
    probes,  # noqa: E402
)

KERNELS = [
    ("kernels/tma_stream.py", "TmaStream"),
    ("kernels/flag_spin.py", "FlagSpin"),
    ("kernels/sm90_gemm.py", "Sm90Gemm"),
]
ADDR = 0x7F0000000000  # a fixed buffer address: it is baked into the PTX


def ptx(obj) -> str:
    # a fresh dump directory per compile: KeepPTX writes the file there
    opts = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX(), DumpDir(tempfile.mkdtemp())]
    return opts(obj, *obj.fake_args()).__ptx__


def main() -> int:
    for path, entry in KERNELS:
        obj = kernel_api.load_entry(ROOT / path, entry)()
        variants = {}
        for beacons in (False, True):
            with probes.instrument(probes.ProbeConfig(budget_ns=10**8, beacons=beacons), ADDR):
                variants[f"probes beacons={beacons}"] = ptx(obj)
        with checkpoint.session({"site": None}) as sess:
            ptx(obj)
        for site in sess.table()[:4]:
            with checkpoint.session({"site": site["id"]}):
                variants[f"checkpoint site {site['id']}"] = ptx(obj)
        for name, text in variants.items():
            print(f"{entry:<10} {name:<22} {hashlib.sha1(text.encode()).hexdigest()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
