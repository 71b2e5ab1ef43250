"""A hung worker that behaves like the CUDA driver with user-triggered coredumps enabled.

usage: python fake_core_worker.py EVENTS_PATH BEHAVIOUR

It creates <events dir>/coredump.pipe.<pid> (a FIFO, as the driver does with
CUDA_COREDUMP_PIPE=<dir>/coredump.pipe.%p), reports phases up to "launched" and hangs. Reading
the pipe, BEHAVIOUR "dump" writes <dir>/coredump.<pid>.nvcudmp (64 KiB in two pieces, 0.2 s
apart, as a dump in progress grows), closes it, notes the time it did in <dir>/closed.<pid>
(time.monotonic) and keeps hanging; "dump_pause" the same with 0.6 s between the pieces (a
driver still collecting state, the file open and not growing); "dump_child" the same from a
child process of the worker; "dump_reopen" closes it half-written and appends the rest 0.6 s
later (its ELF header says 64 KiB from the start); "no_dump" reads and writes nothing.
"""

import json
import os
import struct
import sys
import threading
import time


def elf_header(size):
    """An ELF64 header whose one section header is the file's last 64 bytes."""
    h = bytearray(64)
    h[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<QQ", h, 32, 0, size - 64)  # e_phoff, e_shoff
    struct.pack_into("<HHHH", h, 54, 56, 0, 64, 1)  # phentsize, phnum, shentsize, shnum
    return bytes(h)


def write_core(d, pid, pause, reopen=False):
    path = os.path.join(d, f"coredump.{pid}.nvcudmp")
    with open(path, "wb") as core:
        core.write(elf_header(64 * 1024) + bytes(32 * 1024 - 64))
        core.flush()
        if reopen:  # closed half-written, opened again to write the rest
            core.close()
            time.sleep(pause)
            core = open(path, "ab")
        else:
            time.sleep(pause)
        core.write(bytes(32 * 1024))
        core.close()
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
    if behaviour in ("dump", "dump_pause", "dump_reopen"):
        write_core(d, pid, 0.2 if behaviour == "dump" else 0.6, behaviour == "dump_reopen")


threading.Thread(target=listen, daemon=True).start()
for name in ("started", "imported", "compiling", "compiled", "launched"):
    emit(name)
time.sleep(10_000)
