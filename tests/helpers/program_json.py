"""A Python program run in a fresh interpreter (only the tree on its path) whose last line of
output is one JSON object: that object, or the test fails with the program's stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def program_json(program: str, root: Path | str, timeout: float) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
