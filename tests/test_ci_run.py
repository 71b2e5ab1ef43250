""".ci/run and the two parts of the suite: the README's test command (not slow) and the slow
part. CI runs both, every test is in exactly one, and CI fails when either part fails or
collects nothing. The script runs here against stand-ins for set-up, ruff and pytest (each
records its arguments and exits as the case says), so these checks take milliseconds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$CI_FAKE_LOG"
case "$*" in
  *"-m not slow"*) exit "${CI_FAKE_FAST:-0}" ;;
  *"-m slow"*) exit "${CI_FAKE_SLOW:-0}" ;;
esac
exit 0
"""


def _ci(tmp_path: Path, fast: int = 0, slow: int = 0, fmt: int = 0):
    tree = tmp_path / "repo"
    (tree / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", tree / ".ci" / "run")
    (tree / "tools").mkdir()
    (tree / "tools" / "setup.sh").write_text("exit 0\n")
    bin_ = tree / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text(FAKE_PYTHON)
    (bin_ / "ruff").write_text(f"#!/usr/bin/env bash\nexit {fmt}\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    log = tmp_path / "calls.log"
    env = {
        **os.environ,
        "CI_FAKE_LOG": str(log),
        "CI_FAKE_FAST": str(fast),
        "CI_FAKE_SLOW": str(slow),
    }
    r = subprocess.run(
        ["bash", str(tree / ".ci" / "run")], capture_output=True, text=True, env=env, timeout=60
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return r, calls


def test_ci_runs_the_readme_command_then_the_slow_part(tmp_path):
    r, calls = _ci(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert calls == [
        "-m pytest -n 2 --dist loadfile -m not slow",
        "-m pytest -n 2 --dist loadfile -m slow",
    ]
    assert 'CI: -m "not slow": exit 0' in r.stdout and 'CI: -m "slow": exit 0' in r.stdout


@pytest.mark.parametrize(
    "fast, slow, fmt",
    [(1, 0, 0), (0, 1, 0), (5, 0, 0), (0, 5, 0), (0, 0, 1), (2, 0, 0)],
    ids=["fast-fails", "slow-fails", "fast-empty", "slow-empty", "format", "fast-usage"],
)
def test_ci_fails_when_either_part_fails_or_collects_nothing(tmp_path, fast, slow, fmt):
    r, calls = _ci(tmp_path, fast, slow, fmt)
    assert r.returncode != 0, r.stdout
    assert len(calls) == 2  # a failed first part does not skip the second
    if 5 in (fast, slow):
        assert "collected no tests; failing" in r.stdout


def test_fault_scenarios_of_the_heavy_families_are_slow_the_rest_not():
    """conftest.py marks a scenario slow before `-m` deselects: the fault scenarios of
    SLOW_FAULT_FAMILIES (both items), not their clean ones nor other families' faults."""
    picked = [
        "scenarios/sm90_gemm/clean.toml",
        "scenarios/sm90_gemm/skip_consumer_release.toml",
        "scenarios/tma_stream/skip_consumer_release.toml",
        "scenarios/tma_stream/unassumed_align.toml",
    ]
    out = {}
    for expr in ("slow", "not slow"):
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only"]
            + ["-m", expr, *picked],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        out[expr] = sorted(line for line in r.stdout.splitlines() if "::" in line)
    assert out["slow"] == [
        "scenarios/sm90_gemm/skip_consumer_release.toml::compile",
        "scenarios/sm90_gemm/skip_consumer_release.toml::run",
    ]
    assert len(out["not slow"]) == 6 and not set(out["slow"]) & set(out["not slow"])


def test_the_slow_rule_on_every_scenario():
    """Every scenario of the checkout: slow exactly when its family is listed and it has a
    fault whose verdict a compile does not decide."""
    import importlib.util

    from cutedebug.commands.pytest_items import COMPILE_VERDICTS
    from cutedebug.engine import scenario as S

    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    root = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root)

    seen = {True: 0, False: 0}
    for path in sorted((ROOT / "scenarios").rglob("*.toml")):
        sc = S.load(path)
        family = path.relative_to(ROOT / "scenarios").parts[0]
        want = family in root.SLOW_FAULT_FAMILIES and sc.fault is not None
        want = want and sc.expect.verdict not in COMPILE_VERDICTS
        assert root.slow_scenario(path, sc.fault, sc.expect.verdict) == want, path
        seen[want] += 1
    assert seen[True] > 0 and seen[False] > 0
    assert not root.slow_scenario(ROOT / "tests" / "x.toml", "drop_sync", "HANG")
