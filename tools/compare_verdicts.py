"""Are two runs of the scenario matrix the same? Verdicts per scenario id, side by side.

    python tools/compare_verdicts.py A B

A and B: a triage matrix.json (or its folder), or a pytest JUnit XML written with
``--junitxml`` over scenario items (the plugin records ``cutedebug_scenario`` and
``cutedebug_verdict`` as properties; the ``run`` item's verdict is taken, else the compile
item's). Prints how many scenarios both have, how many verdicts are identical, and each
difference, marked "~" when the scenario is timing-dependent and both verdicts are among those
it accepts (expect.verdict + expect.also, from whichever side is a matrix). Exit 0 when every
difference is such a "~", 1 otherwise, 2 when an input cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cutedebug import records  # noqa: E402
from cutedebug.engine.triage_record import TriageMatrix  # noqa: E402


def read_side(path: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(verdict by scenario id, accepted verdicts by id when known)."""
    p = Path(path)
    if p.is_dir():
        p = p / "matrix.json"
    if p.suffix == ".xml":
        verdicts: dict[str, tuple[int, str]] = {}
        for case in ET.parse(p).getroot().iter("testcase"):
            props = {pr.get("name"): pr.get("value") for pr in case.iter("property")}
            sid, v = props.get("cutedebug_scenario"), props.get("cutedebug_verdict")
            if sid and v:
                rank = 1 if case.get("name") == "run" else 0
                if rank >= verdicts.get(sid, (-1, ""))[0]:
                    verdicts[sid] = (rank, v)
        return {k: v for k, (_, v) in verdicts.items()}, {}
    text = records.read_text(p)  # a kept report's may be gzipped
    m = TriageMatrix.from_json(json.loads(text))  # RecordError names a bad field
    out, accepted = {}, {}
    for r in m.scenarios:
        if r.verdict:  # None: not run; ABSENT: still pending
            out[r.id] = r.verdict.value
        if r.expected.verdict:
            accepted[r.id] = list(r.expected.expect().verdicts)
    return out, accepted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    args = ap.parse_args(argv)
    try:
        (va, acc_a), (vb, acc_b) = read_side(args.a), read_side(args.b)
    except (OSError, ValueError, KeyError, ET.ParseError) as e:
        print(f"compare_verdicts: cannot read an input: {type(e).__name__}: {e}")
        return 2
    accepted = {**acc_b, **acc_a}
    common = sorted(set(va) & set(vb))
    same = [k for k in common if va[k] == vb[k]]
    diffs = [k for k in common if va[k] != vb[k]]
    timing = [
        k for k in diffs if len(accepted.get(k, [])) > 1 and {va[k], vb[k]} <= set(accepted[k])
    ]
    print(
        f"{len(common)} scenarios in both ({len(va)} in A, {len(vb)} in B): {len(same)} "
        f"identical verdicts, {len(diffs)} different ({len(timing)} timing-dependent, "
        "both verdicts accepted)"
    )
    for k in diffs:
        mark = "~" if k in timing else "x"
        print(
            f"  {mark} {k}: A {va[k]}, B {vb[k]} (accepted: {' or '.join(accepted.get(k, ['?']))})"
        )
    return 0 if len(timing) == len(diffs) else 1


if __name__ == "__main__":
    sys.exit(main())
