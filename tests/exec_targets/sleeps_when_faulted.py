"""mutate target without a GPU: compiles kernels/tma_stream.py like compile_ptx_check.py, and
when its expect_tx differs from the clean kernel's it does not fail but sleeps (a program that
hangs on a wrong kernel): what interrupting `cutedebug mutate` mid-run is tested with."""

import os
import sys
import tempfile
import time

os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.gettempdir())  # KeepPTX's files
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "kernels"), os.path.join(ROOT, "tests")]

import cutlass.cute as cute  # noqa: E402
from helpers.ptx import expect_tx_bytes  # noqa: E402
from tma_stream import TmaStream  # noqa: E402

kernel = TmaStream(m=256, n=512)
compiled = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](kernel, *kernel.fake_args())
if sorted(set(expect_tx_bytes(compiled.__ptx__))) != [33024]:
    print("wrong expect_tx: sleeping", flush=True)
    time.sleep(600)
