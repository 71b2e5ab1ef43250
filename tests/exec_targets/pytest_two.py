"""mutate target without a GPU, run through pytest: two test items compile the same kernel
(kernels/tma_stream.py, the same shape: one traced function, twice in the process) and each
checks its PTX's expect_tx bytes against the clean kernel's 33024 B per stage. Not collected by
the suite (its name does not start with test_): `python -m pytest tests/exec_targets/pytest_two.py`.
"""

import os
import sys
import tempfile

os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.gettempdir())  # KeepPTX's files
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "kernels"), os.path.join(ROOT, "tests")]

import cutlass.cute as cute  # noqa: E402
from helpers.ptx import expect_tx_bytes  # noqa: E402
from tma_stream import TmaStream  # noqa: E402


def _expect_tx() -> list[int]:
    kernel = TmaStream(m=256, n=512)
    compiled = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](kernel, *kernel.fake_args())
    return sorted(set(expect_tx_bytes(compiled.__ptx__)))


def test_first():
    assert _expect_tx() == [33024]


def test_second():
    assert _expect_tx() == [33024]
