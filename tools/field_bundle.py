"""The field libraries packed small for a device call, and whether a call's carry fits.

    python3 tools/field_bundle.py            # .whl/*.whl -> .field/field-site.tar.xz
    python3 tools/field_bundle.py --check    # the carry of a wheel call against 64 MiB

A device call carries the tracked tree plus the named folders, 64 MiB in all, counted as the
files take on disk (4 KiB blocks: a wheel call with the tree of 2026-12-01, 747 files, 5.3 MB
of bytes but 6.8 MiB of blocks, was refused at 65.4 MiB). The DSL bundle takes 53.5 MiB, the
four field wheels (../shared/device/README.md) 5.2 MiB: together with the tree, over. Packed
here instead: the wheels unzipped into one site folder (what ``pip install --target`` makes,
without ``__pycache__``) as one xz tarball, about 2.9 MiB, unpacked on the device by
tools/gpu_pending.py. ``torch_c_dlpack_ext`` is left out: its prebuilt addons are for torch
2.4-2.9 and the GPU machine has torch 2.11, so tvm_ffi never loads one there (it imports the
module optionally and falls back without it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / ".whl"
BUNDLE = ROOT / ".field" / "field-site.tar.xz"
LEFT_OUT = ("torch_c_dlpack_ext",)
LIMIT = 64 << 20
DSL = ROOT / ".device"
# What a wheel call carries besides the tree (measured 2026-12-01: 53.52 and 2.86 MiB, rounded
# up): the tracked tree must stay under the rest, which tests/test_field_bundle.py checks in CI.
CARRIED = (53.6 + 2.9) * 2**20
TREE_BUDGET = LIMIT - CARRIED


def build(wheels: Path = WHEELS, bundle: Path = BUNDLE) -> Path:
    found = sorted(w for w in wheels.glob("*.whl") if not w.name.startswith(LEFT_OUT))
    if not found:
        raise SystemExit(f"{wheels}: no wheel (download them as ../shared/device/README.md says)")
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        for w in found:
            with zipfile.ZipFile(w) as z:
                z.extractall(site)
        for cache in list(site.rglob("__pycache__")):
            shutil.rmtree(cache)
        for p in site.rglob("*"):  # zip keeps no modes: the shared libraries must load
            if p.suffix == ".so" or ".so." in p.name:
                p.chmod(0o755)
        bundle.parent.mkdir(parents=True, exist_ok=True)
        part = bundle.with_suffix(".part")
        with tarfile.open(part, "w:xz", preset=9) as t:
            for p in sorted(site.iterdir()):
                t.add(p, arcname=p.name)
        os.replace(part, bundle)
    print(
        f"{bundle}: {bundle.stat().st_size / 2**20:.2f} MiB from "
        f"{', '.join(w.name.split('-')[0] for w in found)}"
    )
    return bundle


def blocks(paths: list[Path]) -> int:
    """Bytes the files take on disk (what a device call's limit counts)."""
    return sum(p.stat().st_blocks * 512 for p in paths if p.is_file())


def tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [ROOT / f for f in out.split("\0") if f]


def check() -> int:
    parts = {
        "tracked tree": blocks(tracked()),
        ".device": blocks(list(DSL.rglob("*"))),
        ".field": blocks(list(BUNDLE.parent.rglob("*"))),
    }
    total = sum(parts.values())
    for name, n in parts.items():
        print(f"{name:13} {n / 2**20:6.2f} MiB")
    verdict = "fits" if total <= LIMIT else "does NOT fit"
    print(f"{'a wheel call':13} {total / 2**20:6.2f} MiB of {LIMIT >> 20}: {verdict}")
    return 0 if total <= LIMIT else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="does a wheel call's carry fit")
    a = ap.parse_args(argv)
    if a.check:
        return check()
    build()
    return check()


if __name__ == "__main__":
    sys.exit(main())
