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
