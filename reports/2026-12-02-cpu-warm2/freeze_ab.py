"""A GPU machine's pool server on the CPU machine (torch imported before the freeze, as
forkserver.preload does where a GPU device node exists): forked children compile the probed
HANG (compile-only, the compile cache on), alternately "after" (the server's modules frozen,
instrument/patching.freeze, and its objects out of the garbage collector's reach, gc.freeze:
what forkserver.preload does now) and "before" (neither), plus "modules_only" (the module
freeze without gc.freeze, as main had it at 86e8f33). Per child: compile_s (wall, as report.json), the
seconds inside the patcher's module scans (patching._holding), and the child's CPU seconds
(user + system, from wait4: less sensitive than wall to the other users of this machine).

    CUTE_DSL_ARCH=sm_90a PYTHONPATH=. python reports/2026-12-02-cpu-warm2/freeze_ab.py ROUNDS
"""

import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch  # noqa: F401  (as preload does where a GPU device node exists)

from cutedebug.engine import forkserver, runner
from cutedebug.engine import scenario as S

n = int(sys.argv[1])
tmp = Path(tempfile.mkdtemp(prefix="freeze-ab-"))
os.environ["CUTEDEBUG_COMPILE_CACHE"] = str(tmp / "cache")
sc = S.load("scenarios/tma_stream/wrong_expect_tx_plus.toml")
req_path, _, _ = runner.write_request(
    tmp / "run", sc, mode="compile", probes={"budget_ns": 500_000_000}
)
req = json.loads(req_path.read_text())
forkserver.preload()
from cutedebug.engine import worker  # noqa: E402
from cutedebug.instrument import patching  # noqa: E402

scan_s: list[float] = []
_holding = patching._holding


def timed_holding(ids, **kw):
    t0 = time.monotonic()
    try:
        return _holding(ids, **kw)
    finally:
        scan_s.append(time.monotonic() - t0)


patching._holding = timed_holding

frozen = (patching._skip, patching._frozen_ids, patching._frozen_objs)
print(
    f"modules {len(sys.modules)}, frozen (skipped) {len(frozen[0])}, objects out of the "
    f"collector's reach {gc.get_freeze_count()}"
)
res: dict[str, list] = {"after": [], "before": [], "modules_only": []}
for i in range(n + 1):  # the first round stores the cache entry: not counted
    for side in res:
        if side == "before":
            patching.thaw()
        else:
            patching._skip, patching._frozen_ids, patching._frozen_objs = frozen
        if side == "after":
            gc.freeze()
        else:
            gc.unfreeze()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            open(req["events"], "w").close()
            worker.run(req, worker.Events(req["events"]))
            ev = [json.loads(line) for line in open(req["events"])]
            c = next(e for e in ev if e["event"] == "compiled")
            reused = c["compile_cache"].get("reused")
            os.write(w, json.dumps([c["secs"], round(sum(scan_s), 4), reused]).encode())
            os._exit(0)
        os.close(w)
        _, _, usage = os.wait4(pid, 0)
        got = json.loads(os.read(r, 1000)) + [round(usage.ru_utime + usage.ru_stime, 3)]
        os.close(r)
        if i:
            res[side].append(got)
for side, v in res.items():
    secs, scans, cpu = ([x[k] for x in v] for k in (0, 1, 3))
    print(
        f"{side}: compile_s median {statistics.median(secs):.3f} (min {min(secs):.3f}, "
        f"max {max(secs):.3f}); scans median {statistics.median(scans):.4f} s; child CPU "
        f"median {statistics.median(cpu):.3f} s (min {min(cpu):.3f}, max {max(cpu):.3f}); "
        f"n={len(v)}; reused {sorted({x[2] for x in v})}"
    )
