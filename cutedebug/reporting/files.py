"""Writing report files: atomically, with the same permissions as any file the user creates.

Every report, record and picture cutedebug writes goes through ``write_text``: a reader (or a
run killed mid-write) sees the old file or the new one, never half of one, and the file's mode
is ``0o666`` minus the umask (``tempfile.mkstemp`` would leave ``0o600``, unreadable to the
rest of a team sharing a runs folder).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_text(path: Path | str, text: str, *, fsync: bool = True) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a unique temporary file beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


atomic_write = write_text
