"""A kernel file whose import never finishes (for fork-server kill tests)."""

import time

time.sleep(10_000)


class Sleepy:
    PARAMS = {"n": 1}
