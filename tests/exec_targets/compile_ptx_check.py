"""exec / mutate target without a GPU: compiles kernels/tma_stream.py for sm_90a and checks its
PTX the way a test checks outputs.

Prints the facts it read (expect_tx bytes, mbarrier.init arrive counts, bounded-wait timers),
then checks expect_tx and the init counts against the clean kernel's; exits 1 when they differ.
It does not check the tail drain or the releases: those faults survive it.
"""

import os
import sys
import tempfile

os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.gettempdir())  # KeepPTX's files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "kernels"), os.path.join(ROOT, "tests")]

import cutlass.cute as cute  # noqa: E402
from helpers.ptx import expect_tx_bytes, init_counts  # noqa: E402
from tma_stream import TmaStream  # noqa: E402

CLEAN_EXPECT_TX = [33024]  # x 32768 + scale 128 + bias 128 per stage
CLEAN_INIT = [1, 4]  # full: one producer arrive; empty: one per consumer warp

kernel = TmaStream(m=256, n=512)
compiled = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](kernel, *kernel.fake_args())
ptx = compiled.__ptx__
tx, init = sorted(set(expect_tx_bytes(ptx))), sorted(set(init_counts(ptx)))
print(f"expect_tx {tx}")
print(f"mbarrier.init counts {init}")
print(f"globaltimer reads {ptx.count('%globaltimer')}")
if tx != CLEAN_EXPECT_TX or init != CLEAN_INIT:
    print(f"PTX check failed: expected expect_tx {CLEAN_EXPECT_TX}, init counts {CLEAN_INIT}")
    sys.exit(1)
print("PTX check passed")
