"""tools/field_bundle.py: the field wheels packed for a device call, and the carry's count."""

from __future__ import annotations

import os
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import field_bundle  # noqa: E402


def wheel(folder: Path, name: str, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(folder / name, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)


def test_the_bundle_is_the_unzipped_wheels_without_caches_or_the_unused_addon(tmp_path):
    wheels = tmp_path / "whl"
    wheels.mkdir()
    wheel(
        wheels,
        "quack_kernels-0.6.5-py3-none-any.whl",
        {
            "quack/__init__.py": b"x = 1\n",
            "quack/__pycache__/__init__.cpython-312.pyc": b"\0",
            "quack_kernels-0.6.5.dist-info/METADATA": b"Name: quack-kernels\n",
        },
    )
    wheel(
        wheels,
        "apache_tvm_ffi-0.1.15-cp312-cp312-manylinux_2_28_x86_64.whl",
        {
            "tvm_ffi/lib/libtvm_ffi.so": b"\x7fELF",
        },
    )
    wheel(
        wheels,
        "torch_c_dlpack_ext-0.1.5-cp312-cp312-manylinux_2_28_x86_64.whl",
        {
            "torch_c_dlpack_ext/core.py": b"",
        },
    )
    out = field_bundle.build(wheels, tmp_path / "b" / "field-site.tar.xz")
    with tarfile.open(out) as t:
        members = {m.name: m for m in t.getmembers() if m.isfile()}
    assert sorted(members) == [
        "quack/__init__.py",
        "quack_kernels-0.6.5.dist-info/METADATA",
        "tvm_ffi/lib/libtvm_ffi.so",
    ]
    assert members["tvm_ffi/lib/libtvm_ffi.so"].mode & 0o111  # loadable after unpacking
    assert not list((tmp_path / "b").glob("*.part"))


def test_blocks_count_what_the_files_take_on_disk(tmp_path):
    small = tmp_path / "a"
    small.write_bytes(b"1")
    assert field_bundle.blocks([small]) == small.stat().st_blocks * 512 >= 1
    assert field_bundle.blocks([tmp_path / "missing", tmp_path]) == 0
    assert os.path.getsize(small) == 1


def test_the_tracked_tree_leaves_room_for_the_dsl_bundle_and_the_field_libraries():
    """A device call carries at most 64 MiB of disk blocks: the DSL bundle, the field bundle
    and the tracked tree. Reports and fixtures that grow the tree past its share would make
    the field steps impossible to run: compress them (matrix.json.gz, *.txt.gz)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    used = field_bundle.blocks(field_bundle.tracked())
    assert used <= field_bundle.TREE_BUDGET, (
        f"the tracked tree takes {used / 2**20:.2f} MiB of disk blocks, over its "
        f"{field_bundle.TREE_BUDGET / 2**20:.2f} MiB share of a device call"
    )
