"""Library modules imported when a server starts, ahead of the runs that need them
(engine/preloads.py): the fork server of a matrix (``runner.start_forkserver(preload=...)``,
triage, the coredump table) and the warm pool (``cutedebug pool start TARGET | --module``). The
import then counts in no run's clock; the server's answer says what it holds and how long the
import took, or why preloading is off."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cutedebug.commands import cli, exits
from cutedebug.engine import pool, preloads, runner
from cutedebug.engine import scenario as S
from tests.helpers.preload_lib import make_probe_lib

ROOT = Path(__file__).resolve().parent.parent


def scenario_toml(folder: Path, kernel: Path, name: str, modules: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / f"{name}.toml"
    f.write_text(
        textwrap.dedent(
            f"""\
            id = "pre/{name}"
            description = "the minimal kernel through a library that records its importer"
            [kernel]
            file = "{kernel}"
            entry = "Minimal"
            [expect]
            verdict = "PASS"
            note = "predicted: the minimal kernel, no fault"
            [requires]
            arch = ["sm_90a"]
            modules = {modules!r}
            """
        ).replace("'", '"')
    )
    return f


def test_a_matrixs_modules_once_each_in_order(tmp_path):
    kernel = tmp_path / "k.py"
    kernel.write_text(
        "import quack.gemm\nimport torch\nfrom quack import utils\n\n\nclass K:\n    pass\n"
    )
    a = S.adhoc(f"{kernel}:K", {}, None, {}, "PASS").with_overrides(modules=("quack",))
    b = a.with_overrides(modules=("flash_attn.cute", "quack"))
    none = a.with_overrides(modules=())
    assert preloads.modules_of_scenarios([none, a, b]) == [
        "quack",
        "quack.gemm",
        "flash_attn.cute",
    ]
    assert preloads.modules_of_scenarios([none]) == []


def test_the_servers_answer_in_one_line():
    on = {"preloaded": ["quack", "quack.gemm"], "preload_s": 3.456, "preload": "on"}
    assert preloads.summary(on) == "2 library module(s) preloaded in 3.46 s (quack, quack.gemm)"
    off = {"preloaded": [], "preload": "off: importing x initialized CUDA in the fork server"}
    assert (
        preloads.summary(off) == "preloading off: importing x initialized CUDA in the fork server"
    )
    failed = {**on, "preloaded": ["quack"], "failed": {"quack.gem": "ModuleNotFoundError: no"}}
    assert preloads.summary(failed) == (
        "1 library module(s) preloaded in 3.46 s (quack); quack.gem not importable "
        "(ModuleNotFoundError: no)"
    )


@pytest.mark.parametrize(
    "argv, says",
    [
        (["kernels/minimal.py:Minimal"], "not a scenario file or folder"),
        (["--module", "quack-kernels"], "'quack-kernels' is not a Python module name"),
        (["nowhere/"], "nowhere/: not a scenario file or folder"),
    ],
)
def test_pool_start_refuses_what_is_not_a_scenario_or_a_module_before_starting(
    pool_dir, capsys, argv, says
):
    assert cli.main(["pool", "start", *argv]) == exits.EXIT_USAGE
    assert says in capsys.readouterr().err
    assert pool.servers() == []  # refused before any server was started


@pytest.mark.slow
def test_a_fork_server_started_with_the_modules_imports_them_before_any_run(tmp_path, monkeypatch):
    sc, out = make_probe_lib(tmp_path, monkeypatch)
    fs = runner.start_forkserver(tmp_path / "fs", preload=["preload_probe_lib"])
    assert fs is not None
    try:
        server = fs.proc.pid
        assert out.read_text().split() == [str(server)]  # imported already, by the server
        said = fs.preloaded
        assert said["preload"] == "on" and "preload_probe_lib" in said["preloaded"]
        assert 0 < said["preload_s"] < 60
        res = runner.run_scenario(sc, runs_root=tmp_path / "r", mode="compile", forkserver=fs)
        assert fs.proc.pid == server
    finally:
        fs.close()
    assert out.read_text().split() == [str(server)]  # the run imported nothing more
    assert res.expected, res.reason
    assert "1 module(s) preloaded" in (tmp_path / "fs" / "forkserver.log").read_text()


@pytest.mark.slow
def test_a_start_preload_that_initializes_cuda_leaves_a_server_without_preloads(
    tmp_path, monkeypatch
):
    sc, out = make_probe_lib(tmp_path, monkeypatch)
    monkeypatch.setenv("PRELOAD_PROBE_CUDA", "1")
    fs = runner.start_forkserver(tmp_path / "fs", preload=["preload_probe_lib"])
    assert fs is not None
    try:
        tainted = out.read_text().split()
        assert fs.preloaded == {
            "preloaded": [],
            "preload": "off: importing preload_probe_lib initialized CUDA in the fork server",
        }
        assert not fs.preload_libraries and [str(fs.proc.pid)] != tainted
        res = runner.run_scenario(sc, runs_root=tmp_path / "r", mode="compile", forkserver=fs)
    finally:
        fs.close()
    assert res.expected and "forkserver_error" not in res.evidence, res.reason
    assert len(out.read_text().split()) == 2  # the tainted server, then the worker itself


@pytest.mark.slow
def test_triage_imports_the_matrixs_libraries_once_before_its_first_compile(
    tmp_path, monkeypatch, capsys
):
    _, out = make_probe_lib(tmp_path, monkeypatch)
    scen = tmp_path / "scen"
    for name in ("a", "b"):
        scenario_toml(scen, tmp_path / "kernel_file.py", name, ["preload_probe_lib"])
    cli.main(["triage", str(scen), "--out", str(tmp_path / "o"), "--jobs", "1"])
    printed = capsys.readouterr().out
    assert "fork server default: 1 library module(s) preloaded in" in printed, printed
    assert "(preload_probe_lib)" in printed
    assert len(out.read_text().split()) == 1  # the server's import, for both compiles
    assert "[  2/2]" in printed


def pool_start(*args: str) -> subprocess.CompletedProcess:
    """`cutedebug pool start ARGS` as a user runs it, in this environment (so that the client
    here finds the same pool)."""
    return subprocess.run(
        [sys.executable, "-m", "cutedebug", "pool", "start", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
    )


@pytest.mark.slow
def test_pool_start_with_targets_imports_their_libraries_before_the_first_run(
    tmp_path, monkeypatch, pool_dir
):
    sc, out = make_probe_lib(tmp_path, monkeypatch)
    toml = scenario_toml(tmp_path / "scen", tmp_path / "kernel_file.py", "a", ["preload_probe_lib"])
    started = pool_start(str(toml))
    assert started.returncode == 0, started.stdout + started.stderr
    assert "1 library module(s) preloaded in" in started.stdout, started.stdout
    c = pool.client(start=False)
    assert c is not None
    server = c.info["pid"]
    assert out.read_text().split() == [str(server)]
    try:
        res = runner.run_scenario(sc, runs_root=tmp_path / "r", mode="compile", forkserver=c)
        again = c.preload_modules(["preload_probe_lib"])  # held already: nothing imported again
    finally:
        c.close()
    assert res.expected and res.evidence["pool"]["pid"] == server, res.reason
    assert res.timings["imports_s"] < 1.0
    assert again["preload"] == "on" and again["preloaded"] == ["preload_probe_lib"]
    assert out.read_text().split() == [str(server)]
    typo = pool_start("--module", "preload_probe_lip")
    assert typo.returncode == exits.EXIT_USAGE, typo.stdout + typo.stderr
    assert f"server {server} already runs" in typo.stdout
    assert "preload_probe_lip not importable (ModuleNotFoundError" in typo.stdout
