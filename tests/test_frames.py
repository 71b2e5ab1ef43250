"""The frame rule (instrument/frames.py): installed libraries are kernel code, CPU only."""

import os
import sys
import sysconfig

from cutedebug.instrument import frames


def _venv(tmp_path):
    lib = tmp_path / "venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return lib, (str(lib) + os.sep,)


def test_classify_installed_library_in_a_venv_is_kernel_code(tmp_path):
    lib, stdlib = _venv(tmp_path)
    dsl = str(lib / "site-packages" / "nvidia_cutlass_dsl") + os.sep
    own = str(tmp_path / "checkout" / "cutedebug") + os.sep
    cases = {
        lib / "site-packages" / "quack" / "gemm_sm90.py": "kernel",
        lib / "dist-packages" / "flash_attn" / "cute" / "flash_fwd_sm90.py": "kernel",
        lib
        / "site-packages"
        / "nvidia_cutlass_dsl"
        / "python_packages"
        / "cutlass"
        / "x.py": "dsl",
        lib / "functools.py": "stdlib",
        lib / "json" / "decoder.py": "stdlib",
        tmp_path / "checkout" / "cutedebug" / "instrument" / "faults.py": "cutedebug",
        tmp_path / "checkout" / "kernels" / "tma_stream.py": "kernel",
        # a stdlib module whose own name contains the word is still the stdlib
        lib / "site_packages_helper.py": "stdlib",
    }
    for path, want in cases.items():
        assert frames.classify(str(path), dsl, stdlib, own) == want, path


def test_this_interpreter_site_packages_is_not_library():
    """The project's own venv: its lib/pythonX.Y is platstdlib and contains site-packages."""
    import cutlass
    import pytest as installed  # any installed package

    assert frames.is_library(cutlass.__file__)
    assert frames.is_library(os.__file__)
    assert frames.is_library(frames.__file__)
    path = os.path.abspath(installed.__file__)
    if any(path.startswith(p + os.sep) for p in sysconfig.get_paths().values()):
        assert not frames.is_library(path)
