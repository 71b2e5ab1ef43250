"""Do files written by `cutedebug sanitize`, `bisect` and `mutate` read back as their records
and write back byte for byte?

    .venv/bin/python tools/records_roundtrip.py PATH [PATH ...]

A PATH is a file or a folder (searched for sanitize.json, bisect.json, a mutate matrix.json,
results.jsonl, clean.json and a run's events.jsonl). Each file is read with its record
(SanitizeSummary, BisectReport, MutationMatrix, one MutantRecord a line of results.jsonl,
CleanReport, one Event a line of events.jsonl, its payload its kind's record) and written the
way the command writes it; a line per file says OK or where the text first differs, or the field a record
refused. Exit status 0 when every file round-trips, 1 otherwise, 2 when no such file was found.
Meant for the files of a GPU session (the CPU tests cover those under tests/data/).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutedebug.analyses import mutate as M  # noqa: E402
from cutedebug.analyses.bisect_record import BisectReport  # noqa: E402
from cutedebug.analyses.mutate_record import MutationMatrix  # noqa: E402
from cutedebug.analyses.sanitizer.result import SanitizeSummary  # noqa: E402
from cutedebug.commands.sanitize import dump_summary  # noqa: E402
from cutedebug.event import Event  # noqa: E402
from cutedebug.records import RecordError  # noqa: E402

NAMES = (
    "sanitize.json",
    "bisect.json",
    "matrix.json",
    "results.jsonl",
    "clean.json",
    "events.jsonl",
)


def kind(path: Path) -> str | None:
    """Which of NAMES the file is (``X.sanitize.json`` counts as a sanitize.json, and
    ``events.jsonl.gz`` as events.jsonl: read through gzip)."""
    name = path.name.removesuffix(".gz")
    return next((n for n in NAMES if name == n or name.endswith("." + n)), None)


def read_text(path: Path) -> str:
    if path.suffix == ".gz":
        import gzip

        return gzip.decompress(path.read_bytes()).decode()
    return path.read_text()


def _indented(record: object) -> str:
    return json.dumps(record.to_json(), indent=1, default=str)  # type: ignore[attr-defined]


def _lines(text: str, write_line: Callable[[str, str], str]) -> str:
    out = [write_line(ln, f"line {i}") for i, ln in enumerate(text.splitlines(), 1)]
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _results(text: str) -> str:
    return _lines(text, lambda ln, at: M.result_line(M.MutantRecord.from_json(json.loads(ln), at)))


def _events(text: str) -> str:
    """As the worker's Events.emit writes a line (instrument/launch.py's writes the same)."""
    return _lines(
        text, lambda ln, at: json.dumps(Event.from_json(json.loads(ln), at).to_json(), default=str)
    )


def rewrite(path: Path, text: str) -> tuple[str, str] | None:
    """(record name, the text written back), or None when the file is not one of ours (a
    triage matrix.json)."""
    readers: dict[str, tuple[str, Callable[[str], str]]] = {
        "sanitize.json": (
            "SanitizeSummary",
            lambda t: dump_summary(SanitizeSummary.from_json(json.loads(t))),
        ),
        "bisect.json": ("BisectReport", lambda t: _indented(BisectReport.from_json(json.loads(t)))),
        "matrix.json": (
            "MutationMatrix",
            lambda t: _indented(MutationMatrix.from_json(json.loads(t))),
        ),
        "results.jsonl": ("MutantRecord lines", _results),
        "clean.json": (
            "CleanReport",
            lambda t: M.clean_text(M.CleanReport.from_json(json.loads(t))),
        ),
        "events.jsonl": ("Event lines", _events),
    }
    what = kind(path) or ""
    if what == "matrix.json" and json.loads(text).get("schema") != 1:
        return None  # `cutedebug triage`'s matrix (tests/test_records.py round-trips those)
    name, read = readers[what]
    return name, read(text)


def first_difference(a: str, b: str) -> str:
    for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines()), 1):
        if x != y:
            return f"line {i}: {x[:120]!r} -> {y[:120]!r}"
    return f"lengths {len(a)} -> {len(b)}"


def main(argv: list[str]) -> int:
    files: list[Path] = []
    for arg in argv:
        p = Path(arg)
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file() and kind(f))
        elif kind(p):
            files.append(p)
    if not files:
        print(f"no {', '.join(NAMES)} under {argv}", file=sys.stderr)
        return 2
    bad = 0
    for f in files:
        text = read_text(f)
        try:
            got = rewrite(f, text)
        except (RecordError, ValueError) as e:
            print(f"REFUSED {f}: {e}")
            bad += 1
            continue
        if got is None:
            print(f"skipped {f} (not a mutate matrix)")
            continue
        name, back = got
        if back == text:
            print(f"OK {f} ({name})")
        else:
            print(f"DIFFERS {f} ({name}): {first_difference(text, back)}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
