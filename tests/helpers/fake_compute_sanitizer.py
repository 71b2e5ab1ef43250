"""A stand-in for compute-sanitizer that replays a real H200 capture, for CPU tests.

    python fake_compute_sanitizer.py --tool T [--xml --save F] [options] TARGET ARGV...

It accepts the options ``cutedebug.analyses.sanitizer.build_command`` emits (an unknown option is an
error, as with the real tool), then, for the capture named by $FAKE_SANITIZER_CASE in
tests/data/sanitizer/h200/:

- copies CASE.xml to the ``--save`` path (unless FAKE_SANITIZER_XML=0),
- prints CASE.text.txt's ``=========`` lines (the real tool prints them even with --xml;
  FAKE_SANITIZER_TEXT=0 prints only the banner),
- exits with the capture's recorded exit code (manifest.tsv) when it is non-zero, else with
  the target's.

The target (the worker command) is handled per $FAKE_SANITIZER_MODE:

- ``exec`` (default): run it for real. On a machine without a GPU the worker compiles and
  reports UNSUPPORTED: the kernel never runs.
- ``simulate``: do not run it; write the events a worker on an H200 would have written for a
  kernel that ran and matched its reference (or, ``simulate-crash``, died with a launch
  failure, as a kernel that memcheck stops does).
- ``hang``: write the events up to "launched", then sleep (a sanitized kernel that never ends).

FAKE_SANITIZER_KERNELS="NAME,..." puts those kernel names in the simulated "compiled" event
(the kernels the worker launched; the capture's findings of other kernels are counted apart).

FAKE_SANITIZER_EVENTS='{"compiled": {...}, "protocol_sites": {...}}' adds those fields to the simulated
events (e.g. the pipelines a real compile of a field kernel recorded), "protocol_sites" emitted
after "compiled" as the worker does.

FAKE_SANITIZER_BELOW="PARAM=V:OTHER_CASE" replays OTHER_CASE instead when the request's
scenario has PARAM < V (a finding that disappears below a problem size, for --shrink).

FAKE_SANITIZER_SOURCE_ROOT="FROM=TO" rewrites the path prefix FROM to TO in the saved XML (the
source files a capture names), so a test can point the records at the kernel source revision
the capture was made against.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from h200_captures import captures  # noqa: E402

H200 = captures()  # tests/data/sanitizer/h200, its .gz captures unpacked
WITH_VALUE = {
    "--tool",
    "--save",
    "--print-limit",
    "--error-exitcode",
    "--report-api-errors",
    "--show-backtrace",
    "--target-processes",
    "--racecheck-report",
    "--racecheck-deadlock-timeout",
}
FLAGS = {"--xml"}


def parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("--"):
        name = argv[i]
        if name in FLAGS:
            opts[name] = "1"
            i += 1
        elif name in WITH_VALUE and i + 1 < len(argv):
            opts[name] = argv[i + 1]
            i += 2
        else:
            print(f"========= Error: Unrecognized option {name}", flush=True)
            sys.exit(1)
    return opts, argv[i:]


def recorded_exit(case: str) -> int:
    for line in (H200 / "manifest.tsv").read_text().splitlines()[1:]:
        name, _tool, mode, code, _secs = line.split("\t")
        if name == case and mode == "xml":
            return int(code)
    raise SystemExit(f"fake compute-sanitizer: no capture named {case!r}")


def worker_events(target: list[str], names: list[str], **extra: dict) -> None:
    request = json.loads(Path(target[-1]).read_text())
    with open(request["events"], "a") as f:
        for name in names:
            fields = extra.get(name, {})
            f.write(json.dumps({"event": name, "t": 0.0, **fields}) + "\n")


DEVICE = {"present": True, "name": "NVIDIA H200", "cc": [9, 0], "arch": "sm_90a"}
UP_TO_LAUNCH = ["started", "device", "imported", "compiling", "compiled", "launched"]


def main() -> int:
    opts, target = parse(sys.argv[1:])
    case = os.environ["FAKE_SANITIZER_CASE"]
    mode = os.environ.get("FAKE_SANITIZER_MODE", "exec")
    if below := os.environ.get("FAKE_SANITIZER_BELOW"):
        cond, other = below.split(":")
        name, value = cond.split("=")
        params = json.loads(Path(target[-1]).read_text())["scenario"]["params"]
        if params.get(name, int(value)) < int(value):
            case = other
    text = (H200 / f"{case}.text.txt").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("=========")]
    if os.environ.get("FAKE_SANITIZER_TEXT", "1") == "0":
        lines = lines[:1]
    print(lines[0], flush=True)  # the banner comes before the target's own output
    compiled = {"secs": 0.1, "arch": "sm_90a"}
    if kernels := os.environ.get("FAKE_SANITIZER_KERNELS"):
        compiled["kernel_names"] = kernels.split(",")  # what the worker says it launched
    extra = {"device": DEVICE, "compiled": compiled, "synced": {"kernel_s": 0.002}}
    more = json.loads(os.environ.get("FAKE_SANITIZER_EVENTS") or "{}")
    for name, fields in more.items():
        extra[name] = {**extra.get(name, {}), **fields}
    up_to_launch = list(UP_TO_LAUNCH)
    if "protocol_sites" in more:
        up_to_launch.insert(up_to_launch.index("compiled") + 1, "protocol_sites")
    rc = 0
    if mode == "exec":
        rc = subprocess.run(target, check=False).returncode
    elif mode == "simulate":
        worker_events(
            target,
            [*up_to_launch, "synced", "checked", "done"],
            checked={"ok": True, "digest": "d"},
            **extra,
        )
    elif mode == "simulate-crash":
        worker_events(
            target,
            [*up_to_launch, "cuda_error", "done"],
            cuda_error={
                "name": "cudaErrorLaunchFailure",
                "message": "CUDA error: unspecified launch failure",
            },
            **extra,
        )
    elif mode == "hang":
        worker_events(target, up_to_launch, **extra)
        time.sleep(600)
    else:
        raise SystemExit(f"fake compute-sanitizer: unknown FAKE_SANITIZER_MODE {mode!r}")
    for ln in lines[1:]:
        print(ln)
    if "--save" in opts and os.environ.get("FAKE_SANITIZER_XML", "1") != "0":
        if root := os.environ.get("FAKE_SANITIZER_SOURCE_ROOT"):
            old, new = root.split("=", 1)
            xml = (H200 / f"{case}.xml").read_text(errors="surrogateescape")
            Path(opts["--save"]).write_text(xml.replace(old, new), errors="surrogateescape")
        else:
            shutil.copyfile(H200 / f"{case}.xml", opts["--save"])
    return recorded_exit(case) or rc


if __name__ == "__main__":
    sys.exit(main())
