"""A stand-in for cutedebug.engine.worker on a machine with a (fake) GPU, for the overlap tests
of `cutedebug triage`: the real event channel and the real worker's GPU token step
(worker.take_gpu), with the compile and the kernel replaced by sleeps.

usage: python token_worker.py REQUEST.json

The scenario's params say what it does: ``compile_s`` (sleep while "compiling"),
``kernel_s`` (sleep while "launched"), ``behaviour`` ("pass", "hang": never ends after its
launch, "compile_error": fails in its compile). Every step is appended to the file named by
$OVERLAP_LOG as one JSON line {"what", "id", "mode", "pid", "tag", "xdist", "t"} (t:
time.time(); xdist: the pytest-xdist worker that started it, if any), so a test can tell who
compiled and who held the GPU when.
"""

import json
import os
import sys
import time

from cutedebug.engine import lifeline, worker
from cutedebug.engine.events import Events

request = json.loads(open(sys.argv[-1]).read())
sc, events = request["scenario"], Events(request["events"])
params = {"compile_s": 0.5, "kernel_s": 0.2, "behaviour": "pass", **sc["params"]}  # K.PARAMS
tag = os.environ.get(lifeline.RUN_TAG_VAR, "")


def log(what: str) -> None:
    line = {"what": what, "id": sc["id"], "mode": request.get("mode"), "pid": os.getpid()}
    line |= {"tag": tag, "xdist": os.environ.get("PYTEST_XDIST_WORKER"), "t": time.time()}
    with open(os.environ["OVERLAP_LOG"], "a") as f:
        f.write(json.dumps(line) + "\n")


events.emit("started", pid=os.getpid(), python=sys.version.split()[0], mono0=round(events.t0, 6))
events.emit("device", present=True, name="fake H200", cc=[9, 0], arch="sm_90a")
events.emit("imported", params=params)
events.emit("compiling", arch="sm_90a", fault=None, fault_args={})
log("compile_start")
time.sleep(float(params["compile_s"]))
log("compile_end")
if params["behaviour"] == "compile_error":
    events.emit("compile_error", type="DSLRuntimeError", message="rejected", traceback="")
    events.emit("done")
    sys.exit(0)
events.emit("compiled", secs=float(params["compile_s"]), arch="sm_90a", static_findings=[])
if request.get("mode") == "compile":  # a compile-only child never looks for the GPU
    events.emit("unsupported", reason="compile-only run: execution not requested")
    events.emit("done")
    sys.exit(0)
waited = worker.take_gpu(request, events)
log("gpu_acquired")
events.emit("launched")
if params["behaviour"] == "hang":
    while True:
        time.sleep(1)
time.sleep(float(params["kernel_s"]))
events.emit("synced", kernel_s=float(params["kernel_s"]))
events.emit("checked", ok=True, digest="abc")
log("exit")
events.emit("done")
