"""The H200 compute-sanitizer captures (tests/data/sanitizer/h200/) as one folder of plain files.

The largest captures are kept gzip-compressed in the repository (``racecheck_raw.xml.gz``, ...:
the tracked tree travels to the GPU machine with the DSL bundle and the field wheels, 64 MiB in
all). :func:`captures` gives the folder the tests and the fake compute-sanitizer read: the
captures linked, the ``.gz`` ones unpacked, made once per content and shared by every process
of a test session (xdist workers and the fake's subprocesses included). The folder is one
checkout's (its path and every file's content are in the name): the links point into that
checkout, so another worktree on the machine, or the same one after a capture changed, never
reads through them.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "data" / "sanitizer" / "h200"


def captures(source: Path = SOURCE) -> Path:
    """``source`` with every top-level ``NAME.gz`` also unpacked to ``NAME``; ``source`` itself when
    nothing in it is compressed."""
    packed = sorted(source.glob("*.gz"))
    if not packed:
        return source
    digest = hashlib.sha1(str(source.resolve()).encode())
    for p in sorted(source.iterdir()):
        digest.update(p.name.encode())
        if p.is_file():
            digest.update(p.read_bytes())
    final = Path(tempfile.gettempdir()) / f"cutedebug-h200-captures-{digest.hexdigest()[:16]}"
    if final.is_dir():
        return final
    work = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=final.parent))
    for p in source.iterdir():
        os.symlink(p, work / p.name)
        if p in packed:
            (work / p.name[: -len(".gz")]).write_bytes(gzip.decompress(p.read_bytes()))
    try:
        os.rename(work, final)  # atomic; another process may have made it first
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
    return final
