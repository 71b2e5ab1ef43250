import os
import shutil
import tempfile

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run unless HYPOTHESIS_PROFILE=explore: a CI
# verdict must not depend on the draw. Explore locally to find new counterexamples; pin each one
# found with @example so the deterministic run keeps checking it.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# KeepPTX writes its files into CUTE_DSL_DUMP_DIR (default: the working directory).
os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.mkdtemp(prefix="cutedebug-ptx-"))


def _gpu_reason() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU on this machine (nvidia-smi not found)"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    checked = False
    for item in items:
        if item.get_closest_marker("gpu") is None:
            continue
        if not checked:
            reason, checked = _gpu_reason(), True
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def shared_forkserver(tmp_path_factory):
    """One fork server for the whole session (each start imports torch and cutlass: seconds);
    a test that kills it gets it restarted by its next spawn."""
    from cutedebug.engine import runner

    fs = runner.start_forkserver(tmp_path_factory.mktemp("forkserver"))
    if fs is None:
        pytest.skip("the fork server could not start here")
    yield fs
    fs.close()


@pytest.fixture
def fake_sanitizer(tmp_path):
    """A compute-sanitizer that replays the H200 captures (tests/helpers/sanitize_runs.py)."""
    from helpers.sanitize_runs import fake_sanitizer_at

    return fake_sanitizer_at(tmp_path / "bin")


@pytest.fixture
def pool_dir(monkeypatch):
    """A warm pool of the test's own: a short folder (a socket path's limit), no spare worker,
    and every server stopped at the end with nothing of it left."""
    from cutedebug.engine import pool, pool_spare

    d = tempfile.mkdtemp(prefix="cdpre-", dir="/tmp")
    monkeypatch.setenv(pool.DIR_VAR, d)
    monkeypatch.setenv(pool.IDLE_VAR, "300")
    monkeypatch.setenv(pool_spare.SPARE_VAR, "0")
    yield d
    left = []
    for r in pool.servers():
        left += pool.stop(r["key"])["left"]
    shutil.rmtree(d, ignore_errors=True)
    assert left == []
