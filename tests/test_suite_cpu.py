"""tools/suite_cpu.py: the per-item CPU of a pytest process tree (a subprocess's CPU counts
toward the item that ran it, a sleep's does not) and the tables summed per file and worker."""

import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("suite_cpu", ROOT / "tools" / "suite_cpu.py")
suite_cpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite_cpu)

pytest_plugins = ["pytester"]


def test_summary_sums_per_worker_and_per_file():
    items = [
        {"id": "tests/test_a.py::x", "worker": "gw0", "t0": 100.0, "t1": 101.0, "cpu": 0.75},
        {"id": "tests/test_a.py::y[1]", "worker": "gw0", "t0": 101.0, "t1": 104.0, "cpu": 0.25},
        {
            "id": "scenarios/k/one.toml::compile",
            "worker": "gw1",
            "t0": 100.5,
            "t1": 102.5,
            "cpu": 2.0,
        },
        {"id": "scenarios/k/two.toml::run", "worker": "gw0", "t0": 104.0, "t1": 104.5, "cpu": 0.0},
    ]
    s = suite_cpu.summarize(items)
    assert s["items"] == 4 and s["cpu"] == 3.0
    assert s["workers"] == {
        "gw0": {"items": 3, "cpu": 1.0, "end_s": 4.5},
        "gw1": {"items": 1, "cpu": 2.0, "end_s": 2.5},
    }
    # the scenario family's files are one row, ahead of the test file by CPU
    assert list(s["files"]) == ["scenarios/k/*.toml", "tests/test_a.py"]
    assert s["files"]["scenarios/k/*.toml"] == {
        "items": 2,
        "cpu": 2.0,
        "wall": 2.5,
        "workers": ["gw0", "gw1"],
    }
    assert s["files"]["tests/test_a.py"]["wall"] == 4.0
    text = suite_cpu.render(s, top=1)
    assert "     2.0      2.5      2  scenarios/k/*.toml (gw0,gw1)" in text
    assert "tests/test_a.py" not in text  # --top 1


BUSY = """
import subprocess, sys, time

def test_busy_child():
    # a child process that burns 0.4 s of CPU: its parent (this pytest) reaps it
    code = "import time\\nwhile time.process_time() < 0.4: pass"
    subprocess.run([sys.executable, "-c", code], check=True)

def test_sleeps():
    time.sleep(0.4)
"""


def test_plugin_counts_a_childs_cpu_toward_its_item_and_not_a_sleep(pytester, monkeypatch):
    pytester.makepyfile(test_work=BUSY)
    out = pytester.path / "records"
    out.mkdir()
    monkeypatch.setenv(suite_cpu.DIR_VAR, str(out))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # this suite's own, under xdist
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(ROOT / "tools"), os.environ.get("PYTHONPATH", "")])
    )
    res = pytester.runpytest_subprocess("-p", "suite_cpu", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=2)
    recs = {r["id"].split("::")[1]: r for r in suite_cpu.read(out)}
    assert set(recs) == {"test_busy_child", "test_sleeps"}
    assert all(r["worker"] == "main" for r in recs.values())
    busy, sleeps = recs["test_busy_child"], recs["test_sleeps"]
    assert busy["cpu"] >= 0.35  # the child burns 0.4 s (counted in clock ticks of 10 ms)
    assert sleeps["cpu"] < 0.2 <= 0.4 <= sleeps["t1"] - sleeps["t0"]
    assert json.loads((out / "main.jsonl").read_text().splitlines()[0])["id"].endswith(
        "test_busy_child"
    )


def test_report_of_an_empty_folder_is_a_usage_error(tmp_path, capsys):
    assert suite_cpu.main(["--report", str(tmp_path)]) == 2
    assert f"no records in {tmp_path}" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--report"], ["--top", "x", "--report", "."]])
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as e:
        suite_cpu.main(argv)
    assert e.value.code == 2


def _lowering(h: str, t0: float, worker: str = "gw0", cpu: float = 1.0) -> dict:
    return {
        "hash": h,
        "function": "f",
        "t0": t0,
        "wall": cpu,
        "cpu": cpu,
        "pid": 1,
        "worker": worker,
    }


def test_repeats_say_which_cache_could_have_saved_them():
    items = [
        {"id": "tests/test_a.py::x", "worker": "gw0", "t0": 0.0, "t1": 10.0, "cpu": 5.0},
        {"id": "tests/test_b.py::y", "worker": "gw0", "t0": 10.0, "t1": 20.0, "cpu": 5.0},
        {"id": "tests/test_c.py::z", "worker": "gw1", "t0": 0.0, "t1": 20.0, "cpu": 5.0},
    ]
    compiles = [
        _lowering("X", 1.0, cpu=0.5),  # first X
        _lowering("X", 2.0, cpu=0.25),  # again in test_a: a per-module cache has it
        _lowering("Y", 3.0),
        _lowering("X", 11.0, cpu=2.0),  # first X in test_b, after test_a's
        _lowering("X", 15.0, worker="gw1", cpu=4.0),  # test_c on gw1: first X there
        _lowering("Z", 16.0, worker="gw1"),
    ]
    r = suite_cpu.repeats(items, compiles)
    assert (r["lowerings"], r["cpu"], r["distinct"]) == (6, 8.75, 3)
    assert r["repeats"] == {
        "all": (3, 6.25),
        "same_file": (1, 0.25),
        "other_files": (2, 6.0),
        "other_worker": (1, 4.0),
    }
    assert r["top"] == [(6.25, 4, ["tests/test_a.py", "tests/test_b.py", "tests/test_c.py"])]
    text = suite_cpu.render_repeats(r)
    assert "6 DSL lowerings (8.8 s of CPU), 3 distinct MLIR" in text
    assert "      2 ... after some in other files only (6.0 s)" in text


COMPILES = """
import tempfile
from pathlib import Path

from cutlass import cute
from cutlass.base_dsl.compiler import DumpDir

from cutedebug.kernel_api import load_entry

Minimal = load_entry(Path({kernel!r}), "Minimal")


def lower(**params):
    k = Minimal(**params)
    cute.compile[cute.GPUArch("sm_90a"), DumpDir(tempfile.mkdtemp())](k, *k.fake_args())
"""


@pytest.mark.slow  # 4 compiles of the minimal kernel in an inner pytest: seconds
def test_the_hook_logs_every_lowering_of_an_inner_run(pytester, monkeypatch):
    pytest.importorskip("cutlass")
    kernel = str(ROOT / "kernels" / "minimal.py")
    pytester.makepyfile(
        lowering=COMPILES.format(kernel=kernel),
        test_a="from lowering import lower\n\ndef test_twice():\n    lower()\n    lower()\n",
        test_b="from lowering import lower\n\n"
        "def test_again_and_another():\n    lower()\n    lower(n=4096)\n",
    )
    pytester.makeini("[pytest]\n")
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    out = pytester.path / "records"
    args = ["-p", "no:cacheprovider", "-p", "no:cutedebug", str(pytester.path)]
    rc, wall, cpu = suite_cpu.run(out, args, compiles=True)
    assert rc == 0 and wall > 0 and cpu > 0
    lowerings = suite_cpu.read_compiles(out)
    assert len(lowerings) == 4 and all(c["worker"] == "main" for c in lowerings)
    assert len({c["hash"] for c in lowerings}) == 2 and all(c["cpu"] > 0 for c in lowerings)
    r = suite_cpu.repeats(suite_cpu.read(out), lowerings)
    assert {k: n for k, (n, _) in r["repeats"].items()} == {
        "all": 2,
        "same_file": 1,
        "other_files": 1,
        "other_worker": 0,
    }
    # without --compiles nothing is hooked
    rc, _, _ = suite_cpu.run(out, args)
    assert rc == 0 and suite_cpu.read_compiles(out) is None
