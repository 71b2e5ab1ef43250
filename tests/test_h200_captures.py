"""tests/helpers/h200_captures.py: the unpacked captures folder belongs to one checkout.

Several worktrees share this machine's temporary folder: a folder made from one checkout must
never serve another (its links point into the first, which may differ or be removed)."""

from __future__ import annotations

import gzip
import shutil

import pytest
from helpers import h200_captures


@pytest.fixture
def captures():
    """h200_captures.captures, its folders removed after the test (they live in /tmp)."""
    made = []

    def make(source):
        made.append(h200_captures.captures(source))
        return made[-1]

    yield make
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def _source(root, text):
    src = root / "h200"
    src.mkdir(parents=True)
    (src / "racecheck_raw.xml.gz").write_bytes(gzip.compress(b"<same/>"))
    (src / "manifest.tsv").write_text(text)
    return src


def test_each_checkout_reads_its_own_captures_even_after_another_is_removed(tmp_path, captures):
    a = captures(_source(tmp_path / "wt-a", "a\n"))
    b = captures(_source(tmp_path / "wt-b", "b\n"))
    assert (a / "manifest.tsv").read_text() == "a\n"
    assert (b / "manifest.tsv").read_text() == "b\n"
    assert (b / "racecheck_raw.xml").read_bytes() == b"<same/>"
    shutil.rmtree(tmp_path / "wt-a")  # a worktree removed: the others still read theirs
    assert (captures(tmp_path / "wt-b" / "h200") / "manifest.tsv").read_text() == "b\n"


def test_a_changed_capture_is_read_as_changed(tmp_path, captures):
    src = _source(tmp_path / "wt", "old\n")
    assert (captures(src) / "manifest.tsv").read_text() == "old\n"
    (src / "manifest.tsv").write_text("new\n")  # the link follows; a plain file copy would not
    (src / "racecheck_raw.xml.gz").write_bytes(gzip.compress(b"<new/>"))
    assert (captures(src) / "racecheck_raw.xml").read_bytes() == b"<new/>"
