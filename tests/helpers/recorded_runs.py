"""The two probed runs recorded on the H200 (tests/data/runs/CASE: request.json and the
worker's events.jsonl, kept gzipped): their event lines as the worker wrote them."""

from __future__ import annotations

import gzip
from pathlib import Path

RUNS = Path(__file__).resolve().parent.parent / "data" / "runs"


def lines(case: str) -> list[str]:
    return gzip.decompress((RUNS / case / "events.jsonl.gz").read_bytes()).decode().splitlines()


def events_file(case: str, dest: Path) -> Path:
    """The run's events.jsonl written out under ``dest`` (for readers that take a path)."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "events.jsonl"
    path.write_bytes(gzip.decompress((RUNS / case / "events.jsonl.gz").read_bytes()))
    return path
