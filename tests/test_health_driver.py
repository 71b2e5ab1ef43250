"""The GPU health check through the CUDA driver API (cutedebug.engine.health.driver_check), on
a stand-in libcuda built here from C: the real ctypes marshalling (64-bit device pointers, the
kernel's parameter array, the launch geometry) against a library that runs the check kernel's
effect on host memory; and main()'s rule that only a healthy answer from the driver stands
without torch."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from cutedebug.engine import health

FAKE_LIBCUDA = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
static int fail(const char *name) {
  const char *f = getenv("FAKE_CUDA_FAIL");
  return f && strcmp(f, name) == 0 ? 700 : 0;
}
int cuInit(unsigned flags) { return flags ? 1 : fail("cuInit"); }
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return fail("cuDeviceGet"); }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = (void *)0x1234; return 0; }
int cuCtxSetCurrent(void *ctx) { return ctx == (void *)0x1234 ? 0 : 1; }
int cuModuleLoadData(void **mod, const char *ptx) {
  *mod = (void *)0x5678;
  return strstr(ptx, ".entry fill") ? fail("cuModuleLoadData") : 218;
}
int cuModuleGetFunction(void **fn, void *mod, const char *name) {
  *fn = (void *)0x9abc;
  return mod == (void *)0x5678 && strcmp(name, "fill") == 0 ? 0 : 500;
}
int cuMemAlloc_v2(uint64_t *ptr, size_t bytes) {
  /* a device pointer above 4 GiB, as on a GPU: a truncated one would not come back */
  char *p = malloc(bytes + 16);
  *ptr = (uint64_t)(uintptr_t)p;
  return p ? 0 : 2;
}
int cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shmem, void *stream, void **params, void **extra) {
  if (fn != (void *)0x9abc || gy != 1 || gz != 1 || by != 1 || bz != 1 || extra) return 1;
  uint32_t *y = (uint32_t *)(uintptr_t)*(uint64_t *)params[0];
  uint32_t n = *(uint32_t *)params[1];
  if ((uint64_t)gx * bx < n) return 9;
  const char *wrong = getenv("FAKE_CUDA_WRONG");
  for (uint32_t i = 0; i < n; i++) y[i] = 2 * i + 1;
  if (wrong) y[atoi(wrong)] = 7;
  return fail("cuLaunchKernel");
}
int cuCtxSynchronize(void) {
  if (getenv("FAKE_CUDA_SEGV")) *(volatile int *)0 = 1;  /* a fault inside the library */
  return fail("cuCtxSynchronize");
}
int cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t bytes) {
  memcpy(dst, (void *)(uintptr_t)src, bytes);
  return 0;
}
int cuMemGetInfo_v2(size_t *free_b, size_t *total) {
  *free_b = (size_t)139 << 30; *total = (size_t)141 << 30; return 0;
}
int cuDeviceGetName(char *name, int len, int dev) {
  strncpy(name, "Fake H200", len); return 0;
}
int cuMemFree_v2(uint64_t ptr) { free((void *)(uintptr_t)ptr); return 0; }
"""


@pytest.fixture(scope="module")
def libcuda(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in libcuda")
    d = tmp_path_factory.mktemp("libcuda")
    (d / "fake.c").write_text(FAKE_LIBCUDA)
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(d / "libcuda.so.1"), str(d / "fake.c")],
        check=True,
    )
    return str(d / "libcuda.so.1")


def test_the_driver_check_launches_its_kernel_and_reads_it_back(libcuda):
    res = health.driver_check(libcuda)
    assert res == {"healthy": True, "device": "Fake H200", "free_gib": 139.0, "via": "driver"}


def test_a_failing_driver_call_is_named_with_its_result(libcuda, monkeypatch):
    for name in ("cuInit", "cuModuleLoadData", "cuLaunchKernel", "cuCtxSynchronize"):
        monkeypatch.setenv("FAKE_CUDA_FAIL", name)
        res = health.driver_check(libcuda)
        assert res == {"healthy": False, "error": f"{name} returned CUresult 700", "via": "driver"}


def test_a_wrong_value_from_the_kernel_is_unhealthy(libcuda, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_WRONG", "4097")
    res = health.driver_check(libcuda)
    assert res["healthy"] is False and "wrote 7 at 4097, not 8195" in res["error"]


@pytest.mark.parametrize(
    "driver, torch_says, healthy, via",
    [
        ({"healthy": True, "via": "driver"}, None, True, "driver"),  # torch never asked
        ({"healthy": False, "error": "x", "via": "driver"}, True, True, "torch"),
        (OSError("libcuda.so.1: cannot open"), False, False, "torch"),
    ],
)
def test_only_a_healthy_driver_answer_stands_without_torch(
    driver, torch_says, healthy, via, monkeypatch, capsys
):
    from cutedebug import devices

    monkeypatch.setattr(devices, "gpu_device_node", lambda: "/dev/nvidia0")
    monkeypatch.setenv(health.DRIVER_VAR, "1")
    asked = []

    def fake_driver():
        if isinstance(driver, Exception):
            raise driver
        return dict(driver)

    def fake_torch():
        asked.append(1)
        return {"healthy": torch_says, "device": "H200", "via": "torch"}

    monkeypatch.setattr(health, "in_child", lambda fn: fn())
    monkeypatch.setattr(health, "driver_check", fake_driver)
    monkeypatch.setattr(health, "torch_check", fake_torch)
    rc = health.main()
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["healthy"] is healthy and out["via"] == via
    assert rc == (0 if healthy else 1)
    assert bool(asked) == (via == "torch")
    if via == "torch":
        assert out["driver_check"]["via"] == "driver"


def test_a_crash_inside_the_driver_library_costs_only_the_checks_child(
    libcuda, monkeypatch, capsys
):
    """A segfault in the driver call (here: the stand-in's cuCtxSynchronize) kills the forked
    child that made it; main() goes on to torch and says what happened to the driver check."""
    from cutedebug import devices

    monkeypatch.setenv("FAKE_CUDA_SEGV", "1")
    monkeypatch.setenv(health.DRIVER_VAR, "1")
    monkeypatch.setattr(devices, "gpu_device_node", lambda: "/dev/nvidia0")
    real = health.driver_check
    monkeypatch.setattr(health, "driver_check", lambda: real(libcuda))
    monkeypatch.setattr(health, "torch_check", lambda: {"healthy": True, "via": "torch"})
    assert health.main() == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["via"] == "torch" and out["healthy"] is True
    assert out["driver_check"]["healthy"] is None
    assert "process died (signal 11)" in out["driver_check"]["error"]
    with pytest.raises(RuntimeError, match="ValueError: no"):
        health.in_child(lambda: (_ for _ in ()).throw(ValueError("no")))
    assert health.in_child(lambda: {"a": 1}) == {"a": 1}


def test_with_the_driver_turned_off_the_check_is_torchs_alone(monkeypatch, capsys):
    """CUTEDEBUG_HEALTH_DRIVER=0: torch only, the driver not asked."""
    from cutedebug import devices

    monkeypatch.setattr(devices, "gpu_device_node", lambda: "/dev/nvidia0")
    monkeypatch.setenv(health.DRIVER_VAR, "0")
    monkeypatch.setattr(health, "in_child", lambda fn: pytest.fail("the driver was asked"))
    monkeypatch.setattr(health, "torch_check", lambda: {"healthy": True, "via": "torch"})
    assert health.main() == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out == {"healthy": True, "via": "torch"}


def test_by_default_the_driver_answers_first(monkeypatch, capsys):
    """The default since the H200 measured it (reports/2026-12-02-h200, call2 perturb_keys:
    0.53-0.67 s through the driver, 4.28-4.81 s through torch): a healthy driver answer is
    final, torch is not imported."""
    from cutedebug import devices

    monkeypatch.setattr(devices, "gpu_device_node", lambda: "/dev/nvidia0")
    monkeypatch.delenv(health.DRIVER_VAR, raising=False)
    monkeypatch.setattr(health, "in_child", lambda fn: {"healthy": True, "via": "driver"})
    monkeypatch.setattr(health, "torch_check", lambda: pytest.fail("torch was asked"))
    assert health.main() == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out == {"healthy": True, "via": "driver"}
