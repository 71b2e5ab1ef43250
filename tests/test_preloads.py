"""A fork server imports a run's library modules once (engine/preloads.py): which modules, that
the forked worker finds them imported and compiles what a fresh worker compiles, and that an
import which initializes CUDA makes the client restart the server without preloads."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cutedebug import devices
from cutedebug.engine import preloads, runner
from cutedebug.engine import scenario as S
from tests.helpers.preload_lib import make_probe_lib

ROOT = Path(__file__).resolve().parent.parent


def request_for(tmp_path: Path, kernel_source: str, modules: list[str]) -> Path:
    kernel = tmp_path / "kernel_file.py"
    kernel.write_text(kernel_source)
    req = tmp_path / "request.json"
    req.write_text(json.dumps({"scenario": {"kernel": {"file": str(kernel)}, "modules": modules}}))
    return req


def test_the_declared_modules_and_the_kernel_files_imports_from_them(tmp_path):
    src = textwrap.dedent(
        """
        import math
        import cuda.bindings.driver as cuda
        import cutlass.cute as cute
        from quack.gemm_default_epi import GemmDefaultSm90
        from quack.tile_scheduler import TileSchedulerOptions
        import quack.cute_dsl_utils, os
        from .local import thing

        def later():
            import quack.not_at_top_level
        """
    )
    req = request_for(tmp_path, src, ["quack"])
    assert preloads.modules_for(req) == [
        "quack",
        "quack.gemm_default_epi",
        "quack.tile_scheduler",
        "quack.cute_dsl_utils",
    ]
    # nothing declared: nothing preloaded (the repository's own kernels need torch and cutlass,
    # which every fork server has imported already)
    (tmp_path / "none").mkdir()
    assert preloads.modules_for(request_for(tmp_path / "none", src, [])) == []
    (tmp_path / "kernel_file.py").unlink()
    assert preloads.modules_for(req) == ["quack"]  # an unreadable kernel file: declared only
    assert preloads.modules_for(tmp_path / "missing.json") == []


def test_health_checks_and_cuda_free_imports_fork(monkeypatch):
    p = preloads.Preloader()
    assert p({"job": "health", "request": "/nowhere"}) is None
    assert p({"request": "/nowhere"}) is None and p.cuda_error is None


@pytest.fixture
def probe_lib(tmp_path, monkeypatch):
    return make_probe_lib(tmp_path, monkeypatch)


@pytest.mark.slow
def test_forked_workers_find_the_library_imported_once_in_the_server(tmp_path, probe_lib):
    sc, out = probe_lib
    fresh = runner.run_scenario(sc, runs_root=tmp_path / "fresh", mode="compile")
    fresh_pid = out.read_text().split()
    assert len(fresh_pid) == 1  # the fresh worker imported it itself
    out.unlink()
    fs = runner.start_forkserver(tmp_path / "fs")
    assert fs is not None
    try:
        forked = [
            runner.run_scenario(
                sc, runs_root=tmp_path / f"forked{i}", mode="compile", forkserver=fs
            )
            for i in range(2)
        ]
        server = fs.proc.pid
    finally:
        fs.close()
    assert out.read_text().split() == [str(server)]  # once, in the server, for both runs
    ptx = [(r.run_dir / "kernel.ptx").read_text() for r in [fresh, *forked]]
    assert ptx[0] == ptx[1] == ptx[2]
    assert all(r.expected for r in [fresh, *forked]), [r.reason for r in [fresh, *forked]]


@pytest.mark.slow
def test_a_library_that_prints_when_imported_does_not_break_the_servers_answers(
    tmp_path, probe_lib, monkeypatch
):
    """The fork server answers on its stdout: what a preloaded library prints there (print or
    a write to fd 1) goes to the server's log instead, and the runs still fork."""
    sc, out = probe_lib
    monkeypatch.setenv("PRELOAD_PROBE_PRINT", "1")
    fs = runner.start_forkserver(tmp_path / "fs")
    assert fs is not None
    try:
        server = fs.proc.pid
        runs = [
            runner.run_scenario(sc, runs_root=tmp_path / f"r{i}", mode="compile", forkserver=fs)
            for i in range(2)
        ]
        assert fs.proc.pid == server  # not restarted
    finally:
        fs.close()
    assert out.read_text().split() == [str(server)]
    for r in runs:
        assert r.expected and "forkserver_error" not in r.evidence, r.reason
    log = (tmp_path / "fs" / "forkserver.log").read_text()
    assert "preload_probe_lib: hello" in log and "hello from fd 1" in log


@pytest.mark.slow
def test_an_import_that_initializes_cuda_restarts_the_server_without_preloads(
    tmp_path, probe_lib, monkeypatch
):
    sc, out = probe_lib
    monkeypatch.setenv("PRELOAD_PROBE_CUDA", "1")
    fs = runner.start_forkserver(tmp_path / "fs")
    assert fs is not None
    first_server = fs.proc.pid
    try:
        res = runner.run_scenario(sc, runs_root=tmp_path / "r", mode="compile", forkserver=fs)
        second_server = fs.proc.pid
        again = runner.run_scenario(sc, runs_root=tmp_path / "r2", mode="compile", forkserver=fs)
    finally:
        fs.close()
    assert second_server != first_server and not fs.preload_libraries
    pids = out.read_text().split()
    # the tainted server imported it, then each forked worker imported it itself
    assert pids[0] == str(first_server) and len(pids) == 3
    assert str(second_server) not in pids
    assert res.expected and again.expected, (res.reason, again.reason)
    assert "forkserver_error" not in res.evidence
    log = (tmp_path / "fs" / "forkserver.log").read_text()
    assert "importing preload_probe_lib initialized CUDA in the fork server" in log


@pytest.mark.slow
def test_a_compile_only_worker_does_not_import_torch(tmp_path, monkeypatch):
    """A fresh compile-only worker never looks for a GPU, so never imports torch (1.7 s of
    CPU); a run-mode worker does (its device check) where the machine has a GPU device node,
    and answers from the device nodes without torch where it has none; both compile the same
    PTX."""
    out = tmp_path / "torch_seen.txt"
    monkeypatch.setenv("TORCHLESS_OUT", str(out))
    target = str(ROOT / "tests" / "helpers" / "torchless_kernel.py") + ":TorchlessMinimal"
    sc = S.adhoc(target, {}, None, {}, "PASS")
    compiled = runner.run_scenario(sc, runs_root=tmp_path / "c", mode="compile")
    ran = runner.run_scenario(sc, runs_root=tmp_path / "r", mode="run")
    node = devices.gpu_device_node()
    assert out.read_text().split() == ["False", str(node is not None)]
    assert compiled.evidence["device"] == {
        "present": None,
        "reason": "compile-only run: no GPU looked for",
    }
    assert "present" in ran.evidence["device"] and ran.evidence["device"]["present"] is not None
    if node is None:
        assert ran.evidence["device"] == {"present": False, "reason": devices.NO_DEVICE_NODE}
    assert (compiled.run_dir / "kernel.ptx").read_text() == (ran.run_dir / "kernel.ptx").read_text()


@pytest.mark.skipif(
    devices.gpu_device_node() is not None, reason="a machine with a GPU device node"
)
def test_without_a_gpu_device_node_the_fork_server_and_its_workers_leave_torch_alone(
    tmp_path, monkeypatch
):
    """No GPU device node: the fork server does not import torch (~1.7 s of CPU per start),
    and neither does a worker it forks, in compile or in run mode, nor its health check, which
    says why there is no GPU."""
    out = tmp_path / "torch_seen.txt"
    monkeypatch.setenv("TORCHLESS_OUT", str(out))
    target = str(ROOT / "tests" / "helpers" / "torchless_kernel.py") + ":TorchlessMinimal"
    sc = S.adhoc(target, {}, None, {}, "PASS")
    fs = runner.start_forkserver(tmp_path / "fs")
    assert fs is not None
    try:
        for mode in ("compile", "run"):
            res = runner.run_scenario(sc, runs_root=tmp_path / mode, mode=mode, forkserver=fs)
            assert res.evidence["compiled"]["ptx_bytes"] > 0, res.reason
        health = runner.health_check(forkserver=fs, run_dir=tmp_path / "h")
        maps = Path(f"/proc/{fs.proc.pid}/maps").read_text()
    finally:
        fs.close()
    assert out.read_text().split() == ["False", "False"]
    assert res.evidence["device"] == {"present": False, "reason": devices.NO_DEVICE_NODE}
    assert health.pop("forked") is True and health.pop("secs") > 0
    assert health == {"healthy": None, "reason": f"no CUDA GPU: {devices.NO_DEVICE_NODE}"}
    assert "libtorch" not in maps and "/cutlass" in maps


def test_a_probe_buffer_that_no_kernel_reads_needs_no_torch():
    """Compile-only (or no GPU): the probe buffer is a bytearray with its header at the same
    constant address, so a probed compile-only worker does not import torch for it."""
    code = (
        "import sys; from cutedebug.instrument import probes; "
        "from cutedebug.instrument.probe_layout import ProbeConfig, buffer_nbytes; "
        "cfg = ProbeConfig(); buf, addr = probes.pinned_allocator(False)(cfg); "
        "print(type(buf).__name__, len(buf) == buffer_nbytes(cfg), hex(addr), "
        "'torch' in sys.modules)"
    )
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split() == ["bytearray", "True", "0x7f0000000000", "False"], out.stderr


def test_a_probed_compile_is_the_same_with_the_bytearray_buffer(tmp_path):
    """The PTX of a probed compile whose buffer is the bytearray equals the one built over
    the torch buffer the allocator used before (same layout, same constant address)."""
    import contextlib

    import torch
    from cutlass import cute

    from cutedebug import kernel_api
    from cutedebug.instrument import probes
    from cutedebug.instrument.probe_layout import buffer_nbytes, init_buffer

    def torch_buffer(cfg):
        buf = torch.zeros(buffer_nbytes(cfg), dtype=torch.uint8)
        init_buffer(buf.numpy(), cfg)
        return buf, 0x7F0000000000

    cls = kernel_api.load_entry(str(ROOT / "kernels" / "tma_stream.py"), "TmaStream")
    texts, headers = [], []
    for allocate in (torch_buffer, probes.pinned_allocator(False)):
        k = cls(m=4096, n=512, ctas=4)
        with (
            contextlib.chdir(tmp_path),
            probes.instrument(probes.ProbeConfig(), allocate=allocate) as table,
        ):
            compiled = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX()](k, *k.fake_args())
        texts.append(compiled.__ptx__)
        buf = table.buffer[0]
        headers.append(bytes(buf.numpy()) if isinstance(buf, torch.Tensor) else bytes(buf))
    assert texts[0] == texts[1]
    assert headers[0] == headers[1]


PROGRAM = """
import sys

sys.path.insert(0, {kernels!r})
import cutlass.cute as cute
from tma_stream import TmaStream

k = TmaStream(m=4096, n=512, ctas=4)
cute.compile[cute.GPUArch("sm_90a")](k, *k.fake_args())
with open({out!r}, "w") as f:
    f.write(str("torch" in sys.modules))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")),
    reason="a machine with a GPU device node: exec's probes import torch there",
)
def test_exec_probes_without_a_gpu_leave_torch_unimported(tmp_path):
    """`cutedebug exec --probes` on a machine without a GPU: the program's kernel is traced with
    its bounded waits, and the instrumentation did not import torch for a probe buffer no
    kernel will read."""
    import subprocess
    import sys

    from cutedebug.engine.run_report import ExecReport

    out = tmp_path / "torch_seen.txt"
    prog = tmp_path / "compile_only.py"
    prog.write_text(PROGRAM.format(kernels=str(ROOT / "kernels"), out=str(out)))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cutedebug",
            "exec",
            "--probes",
            "--runs-dir",
            str(tmp_path / "runs"),
        ]
        + ["--", sys.executable, str(prog)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    report = next(ln for ln in r.stdout.splitlines() if "report:" in ln).split("report:")[1]
    rep = ExecReport.from_json(
        json.loads((Path(report.strip()).parent / "report.json").read_text())
    )
    assert rep.kernels_traced == 1
    assert any(p.probe_sites for p in rep.processes)  # the waits were instrumented
    assert out.read_text() == "False"


# ---- imports that ask the GPU, and a forked child's check (preloads.import_env, fork_probe) ----
def _fake_smi(folder: Path, stdout: str, rc: int = 0) -> Path:
    """An nvidia-smi that prints ``stdout`` and exits ``rc``, alone on a PATH folder."""
    folder.mkdir(exist_ok=True)
    (folder / "out.txt").write_text(stdout)
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat {folder / 'out.txt'}\nexit {rc}\n")
    smi.chmod(0o755)
    return folder


def _smi(monkeypatch, tmp_path, stdout: str | None, rc: int = 0):
    monkeypatch.setattr(preloads, "_CC", [])
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    # where there is none, PATH holds nothing else: a machine's own nvidia-smi stays unseen
    path = (
        f"{_fake_smi(tmp_path / 'smi', stdout, rc)}:{os.environ['PATH']}"
        if stdout is not None
        else empty
    )
    monkeypatch.setenv("PATH", str(path))


@pytest.mark.parametrize(
    "listed, cc",
    [("9.0\n9.0\n", "90"), ("10.0\n", "100"), ("9.0\n10.0\n", None), ("", None), (None, None)],
)
def test_quacks_arch_is_set_only_where_every_gpu_shares_one(monkeypatch, tmp_path, listed, cc):
    _smi(monkeypatch, tmp_path, listed)
    monkeypatch.delenv(preloads.ARCH_VAR, raising=False)
    monkeypatch.delenv(preloads.NVML_VAR, raising=False)
    assert preloads.uniform_cc() == cc
    want = {preloads.NVML_VAR: "1", **({preloads.ARCH_VAR: cc} if cc else {})}
    assert preloads.import_env() == want
    monkeypatch.setenv(preloads.ARCH_VAR, "80")  # the user's own setting is left alone
    monkeypatch.setenv(preloads.NVML_VAR, "0")
    assert preloads.import_env() == {}


def test_asking_nvidia_smi_leaves_no_process_beside_the_fork_servers_workers(tmp_path):
    """The server asks nvidia-smi once; nothing it starts for that (no keeper of its own, as
    lifeline.run_tool would start) lives on beside the workers it forks."""
    smi = _fake_smi(tmp_path / "smi", "9.0\n")
    code = (
        "import psutil\n"
        "from cutedebug.engine import preloads\n"
        "print(preloads.uniform_cc(), len(psutil.Process().children(recursive=True)))\n"
    )
    env = dict(os.environ, PATH=f"{smi}:{os.environ['PATH']}")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.stdout.split() == ["90", "0"], out.stderr


def test_the_imports_see_the_settings_and_the_server_keeps_none_of_them(tmp_path, monkeypatch):
    lib = tmp_path / "lib" / "preload_env_probe"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text(
        "import os\nSEEN = {k: os.environ.get(k) for k in ('QUACK_ARCH', "
        "'PYTORCH_NVML_BASED_CUDA_CHECK')}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    monkeypatch.delenv(preloads.ARCH_VAR, raising=False)
    monkeypatch.delenv(preloads.NVML_VAR, raising=False)
    monkeypatch.setattr(preloads, "_CC", ["90"])
    probes = []
    monkeypatch.setattr(preloads, "fork_probe", lambda: probes.append(1))
    monkeypatch.setattr(preloads, "freeze", lambda: None)
    req = request_for(tmp_path, "import preload_env_probe\n", ["preload_env_probe"])
    p = preloads.Preloader()
    try:
        assert p({"request": str(req)}) is None
        import preload_env_probe

        assert preload_env_probe.SEEN == {"QUACK_ARCH": "90", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    finally:
        sys.modules.pop("preload_env_probe", None)
    assert preloads.ARCH_VAR not in os.environ and preloads.NVML_VAR not in os.environ
    assert probes == [1]  # a fresh import: one forked child checked the GPU
    assert p({"request": str(req)}) is None and probes == [1]  # nothing new: no second check


def test_a_forked_child_that_cannot_use_the_gpu_stops_preloading(tmp_path, monkeypatch):
    frozen = []
    monkeypatch.setattr(preloads, "fork_probe", lambda: "a child forked after preloading x")
    monkeypatch.setattr(preloads, "freeze", lambda: frozen.append(1))
    req = request_for(tmp_path, "import json\n", ["json"])
    p = preloads.Preloader()
    assert p({"request": str(req)}) == "a child forked after preloading x"
    assert p.cuda_error and not frozen  # the server answers no_preload: its client restarts it
    assert p({"request": str(req)}) == p.cuda_error


@pytest.mark.parametrize(
    "check, why",
    [
        ("healthy", None),
        ("no driver", None),
        ("unhealthy", "could not use the GPU (health check: {'healthy': False"),
        ("hangs", "gave no answer within 1 s"),
        ("raises", "could not use the GPU (RuntimeError: cuInit returned CUresult 3)"),
    ],
)
def test_the_forked_childs_check(monkeypatch, check, why):
    """fork_probe forks for real; the child runs this process's (patched) driver check."""
    import time

    from cutedebug.engine import health

    def driver_check():
        if check == "no driver":
            raise OSError("libcuda.so.1: cannot open shared object file")
        if check == "hangs":
            time.sleep(60)
        if check == "raises":
            raise RuntimeError("cuInit returned CUresult 3")
        return {"healthy": check == "healthy"}

    monkeypatch.setattr(devices, "gpu_device_node", lambda: "/dev/nvidia0")
    monkeypatch.setattr(health, "driver_check", driver_check)
    t0 = time.monotonic()
    got = preloads.fork_probe(timeout_s=1.0)
    assert (got is None) if why is None else (why in got), got
    assert time.monotonic() - t0 < 10  # the hung child was killed, not waited for
    monkeypatch.setattr(devices, "gpu_device_node", lambda: None)
    assert preloads.fork_probe() is None  # no GPU here: nothing a fork could break


FAKE_GPU = """
import sys, traceback
sys.path.insert(0, {root!r})
import torch
asked = []
def rec(name, ret):
    def f(*a, **k):
        asked.append(name)
        return ret
    return f
torch.cuda.is_available = rec("is_available", True)  # what the H200 answers
torch.cuda.device_count = rec("device_count", 1)
for name, ret in (("get_device_capability", (9, 0)), ("current_device", 0), ("_lazy_init", None)):
    setattr(torch.cuda, name, rec(name, ret))
from cutedebug.engine import preloads
preloads._CC[:] = ["90"]
import contextlib
preload = sys.argv[1] == "preload"
with preloads._env(preloads.import_env()) if preload else contextlib.nullcontext():
    import flash_attn.cute.flash_fwd_sm90  # noqa: F401  (FA-4 forward's kernel file imports it)
print(sorted(set(asked) - {{"is_available", "device_count"}}))
"""


@pytest.mark.slow
def test_fa4s_import_asks_the_gpu_only_without_the_preload_settings(tmp_path):
    """FA-4's import pulls in quack.rmsnorm, whose module-level configs ask torch for the
    GPU's capability (a CUDA context: the fork server restarted without preloads on the H200).
    With a GPU faked in torch.cuda: asked without import_env, not asked with it."""
    import subprocess
    import sys

    pytest.importorskip("flash_attn.cute")
    script = tmp_path / "fake_gpu.py"
    script.write_text(FAKE_GPU.format(root=str(ROOT)))
    env = {k: v for k, v in os.environ.items() if k not in (preloads.ARCH_VAR, preloads.NVML_VAR)}
    env.setdefault("CUTE_DSL_ARCH", "sm_90a")
    got = {}
    for mode in ("plain", "preload"):
        r = subprocess.run(
            [sys.executable, str(script), mode],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        got[mode] = r.stdout.strip().splitlines()[-1]
    assert got == {"plain": "['get_device_capability']", "preload": "[]"}


def test_a_preload_request_takes_a_list_of_names_and_nothing_else():
    """The pool's op preload passes the client's list through; Preloader reads it: a string
    is no list of names (its letters are not modules), a non-string entry is left out."""
    loaded = []
    p = preloads.Preloader()
    p.load = lambda names: loaded.append(names)
    p({"job": "preload", "modules": "quack"})
    p({"job": "preload", "modules": ["quack", 3, None, "flash_attn.cute"]})
    p({"job": "preload"})
    assert loaded == [[], ["quack", "flash_attn.cute"], []]


def test_a_preload_ask_replaces_a_dead_server_as_a_spawn_does_and_counts_it(monkeypatch, tmp_path):
    """PoolClient.preload_modules replaces a server that stopped answering through the
    connection's one count of replacements (spawn's): after MAX_REPLACEMENTS of them it
    raises instead of replacing it again."""
    from cutedebug.engine import pool

    client = pool.PoolClient(pool.Paths.of(tmp_path, "k"), "k", {}, idle_s=60.0)
    monkeypatch.setattr(pool.PoolClient, "alive", property(lambda self: True))
    client._ask = lambda msg, timeout=0: None  # the server we had: no answer
    asked = []
    client._ask_another = lambda msg, timeout=0: (
        asked.append(msg["op"])
        or {
            "preloaded": ["quack"],
            "preload": "on",
        }
    )
    for _ in range(pool.MAX_REPLACEMENTS):
        assert client.preload_modules(["quack"])["preloaded"] == ["quack"]
    assert client.replacements == pool.MAX_REPLACEMENTS and asked == ["preload"] * 3
    with pytest.raises(pool.ForkServerError, match="replaced 3 times"):
        client.preload_modules(["quack"])
