"""Compile reuse in warm pool workers (engine/compile_cache.py): a traced IR seen before skips
the DSL's back end, with the same PTX and the same trace-time records; anything that changes
what is compiled (the kernel's source, its fault or fault argument, the probe budget, a compile
option, a DSL variable) misses; a damaged entry is compiled afresh, never trusted.

Each scenario is compiled (compile-only, probes on: the CPU's probe buffer address is a
constant, as a pool worker's is on a GPU, instrument/probe_memory.py) several times in one
process by tests/helpers/compile_steps.py."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cutedebug.engine import compile_cache, runner
from cutedebug.engine import scenario as S

ROOT = Path(__file__).resolve().parent.parent
HANG = ROOT / "scenarios" / "tma_stream" / "wrong_expect_tx_plus.toml"
STEPS = ROOT / "tests" / "helpers" / "compile_steps.py"
PROBES = {"budget_ns": 500_000_000}


def request(tmp: Path, name: str, sc: S.Scenario, probes=PROBES, **extra) -> str:
    req, _, _ = runner.write_request(tmp / name, sc, mode="compile", probes=probes, **extra)
    return str(req)


def compile_steps(tmp: Path, steps: list[dict], cache: Path | None) -> list[dict]:
    plan = tmp / "steps.json"
    plan.write_text(json.dumps(steps))
    env = {k: v for k, v in os.environ.items() if k != compile_cache.CACHE_VAR}
    env["PYTHONPATH"] = str(ROOT)
    # the runtime arch the kernel's: the DSL builds the host entry (JIT engine) as on the GPU
    env["CUTE_DSL_ARCH"] = "sm_90a"
    if cache is not None:
        env[compile_cache.CACHE_VAR] = str(cache)
    r = subprocess.run(
        [sys.executable, str(STEPS), str(plan)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def with_fault_args(sc: S.Scenario, **args) -> S.Scenario:
    return dataclasses.replace(sc, fault_args={**sc.fault_args, **args})


@pytest.mark.slow
def test_the_same_trace_reuses_the_compile_and_anything_else_misses(tmp_path):
    sc = S.load(HANG)
    same = request(tmp_path, "a", sc)
    steps = [
        {"request": same},  # stored
        {"request": request(tmp_path, "b", sc)},  # reused: another run folder, same IR
        {"request": request(tmp_path, "fault_arg", with_fault_args(sc, delta_bytes=32))},
        {"request": request(tmp_path, "budget", sc, probes={"budget_ns": 250_000_000})},
        {"request": request(tmp_path, "lines", sc, line_table=True)},  # GenerateLineInfo
        {"request": request(tmp_path, "no_fault", dataclasses.replace(sc, fault=None))},
        {"request": request(tmp_path, "off", sc, compile_cache=False)},
        {"request": same, "env": {"CUTE_DSL_CUTEDEBUG_TEST": "1"}},  # a DSL variable
        {"request": request(tmp_path, "c", sc)},  # still set: reused again
    ]
    runs = compile_steps(tmp_path, steps, tmp_path / "cache")
    reused = [r["cache"]["reused"] for r in runs]
    assert reused == [False, True, False, False, False, False, None, False, True], runs
    first, second = runs[0], runs[1]
    assert first["cache"]["key"] == second["cache"]["key"]
    assert len({r["cache"]["key"] for r in runs[1:6]}) == 5  # each change: another key
    assert runs[6]["cache"]["why"] == "turned off (--no-compile-cache)"
    # the reused compile is the fresh one: same PTX, same lowered module, a host entry; and
    # the trace-time records (from the trace, which always runs) are the same
    assert second["ptx"] == first["ptx"] == runs[6]["ptx"] == runs[7]["ptx"]
    assert second["built"]["hit"] and not first["built"]["hit"]
    assert second["built"]["module"] == first["built"]["module"]
    assert second["built"]["entry"] and first["built"]["entry"]
    assert second["probe_sites"] == first["probe_sites"] and first["probe_sites"]
    assert second["fault_sites"] == first["fault_sites"] and first["fault_sites"]
    # what changed the IR changed the PTX too: a stale entry would have shown the old one
    assert runs[2]["ptx"] != first["ptx"] and runs[3]["ptx"] != first["ptx"]
    assert runs[4]["ptx"] != first["ptx"] and runs[5]["ptx"] != first["ptx"]


@pytest.mark.slow
def test_a_changed_kernel_source_misses_and_a_damaged_entry_is_compiled_afresh(tmp_path):
    kernel = tmp_path / "minimal_copy.py"
    source = (ROOT / "kernels" / "minimal.py").read_text()
    kernel.write_text(source)
    toml = tmp_path / "copy.toml"
    toml.write_text(
        f'id = "copy/clean"\n[kernel]\nfile = "{kernel}"\nentry = "Minimal"\n'
        '[params]\nn = 4096\n[expect]\nverdict = "PASS"\n'
    )
    cache = tmp_path / "cache"
    sc = S.load(toml)
    keep_ir = {"request": request(tmp_path, "a", sc), "env": {compile_cache.IR_VAR: "1"}}
    before = compile_steps(tmp_path, [keep_ir], cache)[0]
    (kept,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert "2.000000e+00" in (kept / "traced.mlir").read_text()  # the traced IR, kept as text
    # the same lines, another constant: only the IR's content tells them apart
    assert "cutlass.Float32(2.0)" in source
    kernel.write_text(source.replace("cutlass.Float32(2.0)", "cutlass.Float32(3.0)"))
    edited, again = compile_steps(
        tmp_path,
        [{"request": request(tmp_path, "b", sc)}, {"request": request(tmp_path, "c", sc)}],
        cache,
    )
    assert (before["cache"]["reused"], edited["cache"]["reused"]) == (False, False)
    assert again["cache"]["reused"] is True and again["ptx"] == edited["ptx"] != before["ptx"]
    # damage the entry's stored module: the next compile does not trust it
    entry = cache / edited["cache"]["key"]
    entries = [p for p in cache.iterdir() if p.name.startswith(entry.name)]
    assert len(entries) == 1
    blob = entries[0] / "module.mlirbc"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    damaged, healed = compile_steps(
        tmp_path,
        [{"request": request(tmp_path, "d", sc)}, {"request": request(tmp_path, "e", sc)}],
        cache,
    )
    assert damaged["cache"]["reused"] is False
    assert "CRC32" in damaged["cache"]["why"], damaged["cache"]
    assert damaged["ptx"] == edited["ptx"]
    assert healed["cache"]["reused"] is True and healed["ptx"] == edited["ptx"]


def test_no_folder_means_no_reuse_and_says_why():
    with compile_cache.reuse(None, "because") as outcome:
        pass
    assert outcome.to_json() == {"reused": None, "why": "because"}
    assert compile_cache.reused({"compile_cache": {"reused": True}})
    assert not compile_cache.reused({"compile_cache": {"reused": None}})
    assert not compile_cache.reused(None)


def test_pruning_keeps_the_most_recently_used(tmp_path):
    for i in range(5):
        (tmp_path / f"k{i}").mkdir()
        os.utime(tmp_path / f"k{i}", (1000 + i, 1000 + i))
    os.utime(tmp_path / "k0", (2000, 2000))  # used last
    (tmp_path / ".tmp-1-x").mkdir()  # a store under way is not an entry
    assert compile_cache.prune(tmp_path, keep=3) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-1-x", "k0", "k3", "k4"]


def test_pruning_bounds_the_folders_bytes_too_keeping_the_most_recent(tmp_path):
    for i in range(4):
        (tmp_path / f"k{i}").mkdir()
        (tmp_path / f"k{i}" / "cubin").write_bytes(b"x" * 100)
        os.utime(tmp_path / f"k{i}", (1000 + i, 1000 + i))
    assert compile_cache.prune(tmp_path, keep=10, max_bytes=250) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k2", "k3"]
    (tmp_path / "k3" / "cubin").write_bytes(b"x" * 1000)  # one entry over the bound: it stays
    assert compile_cache.prune(tmp_path, keep=10, max_bytes=250) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k3"]
