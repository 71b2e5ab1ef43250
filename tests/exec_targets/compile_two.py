"""mutate target without a GPU: two kernels traced in one process (kernels/tma_stream.py at two
sizes: two traces of the same function, with different argument shapes; with ``--same``, one
size twice: two traces of the same IR). Prints each one's expect_tx bytes and fails when either
differs from the clean kernel's 33024 B per stage."""

import os
import sys
import tempfile

os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.gettempdir())  # KeepPTX's files
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "kernels"), os.path.join(ROOT, "tests")]

import cutlass.cute as cute  # noqa: E402
from helpers.ptx import expect_tx_bytes  # noqa: E402
from tma_stream import TmaStream  # noqa: E402

ok = True
for name, m in (("first", 256), ("second", 256 if "--same" in sys.argv else 512)):
    kernel = TmaStream(m=m, n=512)
    compiled = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](kernel, *kernel.fake_args())
    tx = sorted(set(expect_tx_bytes(compiled.__ptx__)))
    print(f"{name} expect_tx {tx}", flush=True)
    ok = ok and tx == [33024]
sys.exit(0 if ok else 1)
