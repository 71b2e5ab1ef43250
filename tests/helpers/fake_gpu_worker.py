"""cutedebug.engine.worker on a machine that claims to have a given GPU (device detection faked).

usage: python fake_gpu_worker.py NAME MAJOR MINOR REQUEST.json

Everything else is the real worker: it loads the scenario, compiles, and decides whether the
kernel can run on this "device" exactly as it would on real hardware.
"""

import sys

from cutedebug.engine import worker

name, major, minor = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cc = (major, minor)
worker.detect_device = lambda: {
    "present": True,
    "name": name,
    "cc": list(cc),
    "arch": worker.ARCH_BY_CC.get(cc, f"sm_{major}{minor}"),
}
sys.exit(worker.main(sys.argv[4:]))
