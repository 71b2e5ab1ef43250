"""tools/ptx_fingerprints.py's line-info comparison: two PTX texts that differ only in where the
kernel's lines are (``.loc`` / ``.file`` directives, the FILE.py:LINE a probe or checkpoint
banner bakes into its printf format array, whose declared length moves with the digits) compare
equal; any other byte that differs (an instruction, an smem offset, another string) does not."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location(
    "ptx_fingerprints", ROOT / "tools" / "ptx_fingerprints.py"
)
fp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fp)


def printf_array(name: str, text: str) -> str:
    """A printf format as the DSL declares it in PTX (bytes of the text plus "\\n")."""
    data = (text + "\n").encode()
    return f".global .align 1 .b8 {name}[{len(data)}] = {{{', '.join(str(b) for b in data)}}};"


def kernel_ptx(
    stuck_line: int, cp_line: int, loc_line: int, offset: int = 1024, site: int = 3
) -> str:
    return "\n".join(
        [
            "//",
            printf_array(
                "printfFormat_1",
                f"cutedebug: STUCK site {site} consumer_wait full at sm90_gemm.py:{stuck_line} "
                "block=(%d,%d,%d) warp=%d",
            ),
            printf_array(
                "printfFormat_0",
                f"cutedebug: CHECKPOINT site 0 named_barrier at sm90_gemm.py:{cp_line} reached",
            ),
            printf_array("printfFormat_2", "user text 12.py:34"),
            ".visible .entry k(",
            ")",
            "{",
            f"\t.loc\t1 {loc_line} 0",
            f"\tmbarrier.try_wait.parity.shared::cta.b64 %p1, [%r1+{offset}], %r2;",
            "\tret;",
            "}",
            '\t.file\t1 "/work/main/kernels/sm90_gemm.py"',
        ]
    )


def test_only_line_information_is_set_aside():
    old = kernel_ptx(stuck_line=99, cp_line=248, loc_line=360)
    new = kernel_ptx(stuck_line=104, cp_line=251, loc_line=371)
    assert old != new and "printfFormat_1[87]" in old and "printfFormat_1[88]" in new
    (a, counts_a), (b, counts_b) = fp.strip_line_info(old), fp.strip_line_info(new)
    assert a == b
    assert counts_a == counts_b == {"loc": 1, "file": 1, "debug_sections": 0, "banner_lines": 2}
    assert "sm90_gemm.py:<line> block" in a and ".loc" not in a
    # a user's own string with a .py:N in it is not a banner: kept as is
    assert "printfFormat_2[19]" in a


def test_any_other_difference_is_kept():
    base = fp.strip_line_info(kernel_ptx(99, 248, 360))[0]
    assert fp.strip_line_info(kernel_ptx(99, 248, 360, offset=1032))[0] != base
    assert fp.strip_line_info(kernel_ptx(99, 248, 360, site=4))[0] != base


def test_compare_reports_each_variant(tmp_path, capsys):
    sides = {
        "before": {
            "same": kernel_ptx(99, 248, 360),
            "lines": kernel_ptx(99, 248, 360),
            "code": kernel_ptx(99, 248, 360),
        },
        "after": {
            "same": kernel_ptx(99, 248, 360),
            "lines": kernel_ptx(104, 251, 371),
            "code": kernel_ptx(104, 251, 371, offset=2048),
        },
    }
    for side, files in sides.items():
        d = tmp_path / side
        d.mkdir()
        table = {}
        for name, text in files.items():
            (d / f"{name}.ptx").write_text(text)
            table[f"k/{name}\tprobes=on"] = {"fingerprint": "x", "file": f"{name}.ptx"}
        table["k/unsupported\tprobes=off"] = {"fingerprint": "unsupported: no GPU", "file": None}
        (d / "fingerprints.json").write_text(json.dumps(table))
    assert fp.compare(tmp_path / "before", tmp_path / "after") == 1
    out = capsys.readouterr().out.splitlines()
    verdict = {line.split()[0]: line for line in out if not line.startswith("#")}
    assert verdict["k/same"].endswith("identical")
    assert "same except line info (loc 1, file 1, banner_lines 2)" in verdict["k/lines"]
    assert "DIFFERS" in verdict["k/code"] and "+2048]" in verdict["k/code"]
    assert "identical (no PTX" in verdict["k/unsupported"]
    assert out[-1] == "# identical: 2, same except line info: 1, DIFFERS: 1, missing: 0"
