"""mutate target without a GPU, run through pytest: like pytest_two.py, but the second item
passes only after the first (it reads what the first left in the module): run alone it fails,
so its mutants must run the whole command. Not collected by the suite."""

import os
import sys
import tempfile

os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.gettempdir())  # KeepPTX's files
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "kernels"), os.path.join(ROOT, "tests")]

import cutlass.cute as cute  # noqa: E402
from helpers.ptx import expect_tx_bytes  # noqa: E402
from tma_stream import TmaStream  # noqa: E402

SEEN: dict[str, list[int]] = {}


def _expect_tx() -> list[int]:
    kernel = TmaStream(m=256, n=512)
    compiled = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](kernel, *kernel.fake_args())
    return sorted(set(expect_tx_bytes(compiled.__ptx__)))


def test_first():
    SEEN["first"] = _expect_tx()
    assert SEEN["first"] == [33024]


def test_second():
    assert "first" in SEEN, "needs test_first to have run"
    assert _expect_tx() == [33024]
