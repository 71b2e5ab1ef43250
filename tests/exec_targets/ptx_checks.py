"""exec / mutate target: a small pytest file (not collected by the project's own test run: its
name does not start with test_) that compiles kernels/tma_stream.py for sm_90a and checks
facts of its PTX, one test each, the way a library's test file checks outputs."""

import os
import sys
import tempfile

import pytest

os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.gettempdir())  # KeepPTX's files
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "kernels"), os.path.join(ROOT, "tests")]


@pytest.fixture(scope="module")
def ptx():
    import cutlass.cute as cute
    from tma_stream import TmaStream

    kernel = TmaStream(m=256, n=512)
    compiled = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](kernel, *kernel.fake_args())
    return compiled.__ptx__


def test_expect_tx_is_the_stage_bytes(ptx):
    from helpers.ptx import expect_tx_bytes

    assert sorted(set(expect_tx_bytes(ptx))) == [33024]  # x 32768 + scale 128 + bias 128


def test_barrier_init_counts(ptx):
    from helpers.ptx import init_counts

    assert sorted(set(init_counts(ptx))) == [1, 4]
