"""A hung worker that behaves like the CUDA driver with user-triggered coredumps enabled.

usage: python fake_core_worker.py EVENTS_PATH BEHAVIOUR

It creates <events dir>/coredump.pipe.<pid> (a FIFO, as the driver does with
CUDA_COREDUMP_PIPE=<dir>/coredump.pipe.%p), reports phases up to "launched" and hangs. Reading
the pipe, BEHAVIOUR "dump" writes <dir>/coredump.<pid>.nvcudmp (64 KiB in two pieces, 0.2 s
apart, as a dump in progress grows), closes it, notes the time it did in <dir>/closed.<pid>
(time.monotonic) and keeps hanging; "dump_pause" the same with 0.6 s between the pieces (a
driver still collecting state, the file open and not growing); "dump_child" the same from a
child process of the worker; "no_dump" reads and writes nothing.
"""

import json
import os
import sys
import threading
import time


def write_core(d, pid, pause):
    with open(os.path.join(d, f"coredump.{pid}.nvcudmp"), "wb") as core:
        core.write(b"\x7fELF" + bytes(32 * 1024 - 4))
        core.flush()
        time.sleep(pause)
        core.write(bytes(32 * 1024))
    with open(os.path.join(d, f"closed.{pid}"), "w") as f:
        f.write(repr(time.monotonic()))


if sys.argv[1] == "--write":  # the helper of "dump_child"
    write_core(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    sys.exit(0)
events_path, behaviour = sys.argv[1], sys.argv[2]
d = os.path.dirname(os.path.abspath(events_path))
pid = os.getpid()
pipe = os.path.join(d, f"coredump.pipe.{pid}")
os.mkfifo(pipe)


def emit(name, **kw):
    with open(events_path, "a") as f:
        f.write(json.dumps({"event": name, "t": 0.0, **kw}) + "\n")


def listen():
    with open(pipe, "rb") as f:
        f.read(1)
    if behaviour == "dump_child":  # a helper process of the worker writes the core
        import subprocess

        subprocess.Popen([sys.executable, __file__, "--write", d, str(pid), "0.6"])
        return
    if behaviour in ("dump", "dump_pause"):
        write_core(d, pid, 0.2 if behaviour == "dump" else 0.6)


threading.Thread(target=listen, daemon=True).start()
for name in ("started", "imported", "compiling", "compiled", "launched"):
    emit(name)
time.sleep(10_000)
