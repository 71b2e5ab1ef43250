"""exec target: hangs in Python (never returns from wait_forever)."""

import time


def wait_forever():
    while True:
        time.sleep(0.05)


print("waiting for a flag that never comes", flush=True)
wait_forever()
