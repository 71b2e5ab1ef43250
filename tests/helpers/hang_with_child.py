"""A kernel file whose import starts a grandchild in a session of its own, then never
finishes (warm pool kill tests: the kill must take the grandchild too)."""

import subprocess
import sys
import time

subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(10_000)"],
    start_new_session=True,
    stdin=subprocess.DEVNULL,
)
time.sleep(10_000)


class Hang:
    PARAMS = {"n": 1}
