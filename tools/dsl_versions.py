"""Check cutedebug on every nvidia-cutlass-dsl version its dependency range admits (CPU only).

    python tools/dsl_versions.py                        # 4.7.0 4.7.1 4.8.0 + this venv's
    python tools/dsl_versions.py --quick                # ~25 scenarios, probes on
    python tools/dsl_versions.py --versions 4.7.1 -k tma_stream
    python tools/dsl_versions.py --make-venvs            # create /tmp/cd-dsl-<v> first

For each version, one child process (the Python of /tmp/cd-dsl-<version>, a venv with only
that nvidia-cutlass-dsl installed and this repository's main venv appended for torch & co;
``--make-venvs`` creates them with pip) compiles every scenario in-process exactly as its
worker does for ``cutedebug run --compile-only`` (``tools/ptx_fingerprints.compile_variant``:
kernel params, the trace-time fault patches, the lint recorder), with the probes off and on.
The repository's kernels import two 4.8 module paths (``cutlass.memory``,
``cutlass.tensor_utils``); on 4.7 ``tools/dsl_compat/sitecustomize.py`` aliases them to the
4.7 objects, so what is compared is cutedebug itself (the installed package has no kernels).
Per scenario and variant it records: compiled or what the worker said instead, at how many
sites the fault applied, the static protocol findings (severity + check), the PTX's sha1.

The versions are then compared with the reference (the version this venv runs, the one CI
uses): a scenario that compiles on the reference and not on another version, a fault that
applies at a different number of sites, or different lint findings is a DIFFERENCE (exit 1);
a different PTX alone is reported as a count (a new DSL may emit other code for the same
kernel). The summary is the table the README quotes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RANGE = ("4.7.0", "4.7.1", "4.8.0")  # the range's versions besides this venv's
VENVS = "/tmp/cd-dsl-{}"


def _fingerprints():
    spec = importlib.util.spec_from_file_location(
        "ptx_fingerprints", ROOT / "tools" / "ptx_fingerprints.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def quick_selection(scenarios: list) -> list:
    """Each family's clean scenario and the first scenario of every fault kind: every patch
    of the fault registry and the probes on every kernel family, ~25 compiles."""
    chosen, families, kinds = [], set(), set()
    for sc in scenarios:
        if sc.missing_modules():  # a field library that is not installed: nothing compiles
            continue
        family = sc.id.split("/")[0]
        if (not sc.fault and family not in families) or (sc.fault and sc.fault not in kinds):
            chosen.append(sc)
            families.add(family) if not sc.fault else kinds.add(sc.fault)
    return chosen


def child(filter_: str, quick: bool) -> int:
    """In the version's interpreter: one JSON line per scenario and variant."""
    sys.path.insert(0, str(ROOT))
    import cutlass

    from cutedebug.engine import scenario as S

    fp = _fingerprints()
    print(json.dumps({"version": cutlass.__version__, "cutlass": cutlass.__file__}), flush=True)
    scenarios = sorted((S.load(f) for f in S.discover(ROOT / "scenarios")), key=lambda s: s.id)
    scenarios = [s for s in scenarios if filter_ in s.id]
    variants = [("probes=off", {}), ("probes=on", {"probes": fp.PROBES})]
    if quick:  # probes on: the fault patches, the probes and the lint recorder together
        scenarios, variants = quick_selection(scenarios), variants[1:]
    with tempfile.TemporaryDirectory(prefix="cutedebug-dsl-") as tmp:
        for n, sc in enumerate(scenarios):
            for name, kw in variants:
                sha, evs = fp.compile_variant(sc, Path(tmp) / f"{n}-{name}", **kw)
                compiled = next((e for e in evs if e["event"] == "compiled"), None)
                row = {
                    "id": sc.id,
                    "variant": name,
                    "outcome": "compiled" if compiled else sha,
                    "ptx": sha if compiled else None,
                    "fault_count": (compiled or {}).get("fault_count"),
                    "static": sorted(
                        {
                            (f.get("severity"), f.get("check"))
                            for f in (compiled or {}).get("static_findings") or []
                            if f.get("severity") in ("error", "warning")
                        }
                    ),
                }
                print(json.dumps(row), flush=True)
    return 0


def run_version(
    python: str, filter_: str, timeout_s: float, quick: bool = False
) -> tuple[dict, list[dict], str]:
    compat = ROOT / "tools" / "dsl_compat"  # 4.7 aliases for the kernels' 4.8 imports
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", PYTHONPATH=f"{compat}{os.pathsep}{ROOT}")
    argv = [python, __file__, "--child", "-k", filter_] + (["--quick"] if quick else [])
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    if not lines:
        return {}, [], f"exit {proc.returncode}: {proc.stderr[-1500:]}"
    return lines[0], lines[1:], "" if proc.returncode == 0 else f"exit {proc.returncode}"


def compare(ref: list[dict], other: list[dict]) -> tuple[list[str], int]:
    """(differences that matter, number of variants whose PTX differs)."""
    by_key = {(r["id"], r["variant"]): r for r in other}
    diffs, ptx_diff = [], 0
    for r in ref:
        o = by_key.get((r["id"], r["variant"]))
        key = f"{r['id']} [{r['variant']}]"
        if o is None:
            diffs.append(f"{key}: missing")
            continue
        for field in ("outcome", "fault_count", "static"):
            if r[field] != o[field]:
                diffs.append(f"{key}: {field} {o[field]!r} (reference {r[field]!r})")
        ptx_diff += r["ptx"] != o["ptx"]
    return diffs, ptx_diff


def make_venvs(versions: list[str]) -> None:
    site = next(p for p in sys.path if p.endswith("site-packages"))
    base = getattr(sys, "_base_executable", sys.executable)
    for v in versions:
        d = Path(VENVS.format(v))
        if not (d / "bin" / "python").exists():
            subprocess.run([base, "-m", "venv", str(d)], check=True)
        vsite = subprocess.run(
            [d / "bin" / "python", "-c", "import site; print(site.getsitepackages()[0])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        Path(vsite, "zz-cutedebug-main-venv.pth").write_text(site + "\n")
        subprocess.run(
            [
                d / "bin" / "python",
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                f"nvidia-cutlass-dsl=={v}",
            ],
            check=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--versions", nargs="+", default=list(RANGE))
    p.add_argument("-k", dest="filter", default="", help="only scenario ids containing this")
    p.add_argument("--make-venvs", action="store_true")
    p.add_argument(
        "--quick",
        action="store_true",
        help="each family's clean scenario and the "
        "first scenario of every fault kind, probes on (see quick_selection)",
    )
    p.add_argument("--json", type=Path, help="write every row of every version here")
    p.add_argument("--timeout", type=float, default=3600.0, help="per version, seconds")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.filter, args.quick)
    if args.make_venvs:
        make_venvs(args.versions)
    head, ref, err = run_version(sys.executable, args.filter, args.timeout, args.quick)
    if err and not ref:
        print(f"reference ({sys.executable}) failed: {err}", file=sys.stderr)
        return 2
    results = {head["version"]: ref}
    compiled = sum(r["outcome"] == "compiled" for r in ref)
    print(
        f"reference nvidia-cutlass-dsl {head['version']}: {len(ref)} variants of "
        f"{len({r['id'] for r in ref})} scenarios, {compiled} compiled",
        flush=True,
    )
    status = 0
    for v in args.versions:
        py = Path(VENVS.format(v)) / "bin" / "python"
        if not py.exists():
            print(f"{v}: no venv at {py.parent.parent} (--make-venvs)")
            status = 1
            continue
        head_v, rows, err = run_version(str(py), args.filter, args.timeout, args.quick)
        if head_v.get("version") != v:
            print(f"{v}: the venv runs {head_v.get('version')!r}, not {v} {err}")
            status = 1
            continue
        results[v] = rows
        diffs, ptx_diff = compare(ref, rows)
        ok = sum(r["outcome"] == "compiled" for r in rows)
        print(
            f"{v}: {ok}/{len(rows)} variants compiled; {len(diffs)} difference(s) in "
            f"outcome / fault sites / lint findings; PTX differs in {ptx_diff}"
            + (f" ({err})" if err else ""),
            flush=True,
        )
        for d in diffs[:40]:
            print(f"  {d}")
        status = max(status, 1 if diffs or err else 0)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
