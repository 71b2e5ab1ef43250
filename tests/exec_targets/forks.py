"""exec target: leaves a child and a grandchild behind (the grandchild in a session of its
own, out of the command's process group), prints their pids once both run, and exits 0."""

import subprocess
import sys

GRANDCHILD = "import time; print('up', flush=True); time.sleep(600)"
CHILD = (
    "import subprocess, sys, time; "
    f"p = subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}], "
    "stdout=subprocess.PIPE, text=True, start_new_session=True); "
    "p.stdout.readline(); print(p.pid, flush=True); time.sleep(600)"
)
child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
grandchild = int(child.stdout.readline())
print(f"child {child.pid} grandchild {grandchild}", flush=True)
