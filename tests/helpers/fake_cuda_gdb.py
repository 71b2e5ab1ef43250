"""A stand-in for cuda-gdb on a core, for CPU tests of cutedebug.analyses.cudagdb.GdbSession.

usage: fake_cuda_gdb.py [-batch] [-ex CMD ...]   (FAKE_GDB: a JSON file, below)

FAKE_GDB = {"rounds": [text, ...], "starts": path, "hang_round": N, "exit_round": N,
"no_session": bool, "argv": path}. Each start appends its pid and mode (session / batch) to ``starts``. Interactive (no -batch), as GdbSession drives
it: commands are read from stdin a round at a time (a round ends with the echo of its marker,
``echo @@@xxx N\\n``); at a round's first line it prints ``rounds[N-1]`` (what cuda-gdb printed
for that round's commands on the H200), at its end the marker. Round ``hang_round`` never
answers (sleeps); at round ``exit_round`` it prints half the text and exits 1. With -batch
(one round given as -ex commands, the way the reader ran cuda-gdb before; its fallback) it
prints the round of its -batch start; with no_session it exits at once unless -batch.
"""

import json
import os
import re
import sys
import time

cfg = json.load(open(os.environ["FAKE_GDB"]))
batch = "-batch" in sys.argv
with open(cfg["starts"], "a") as f:
    f.write(f"{os.getpid()} {'batch' if batch else 'session'}\n")
if cfg.get("argv"):  # the command line it was started with (one JSON list per start)
    with open(cfg["argv"], "a") as f:
        f.write(json.dumps(sys.argv[1:]) + "\n")
rounds = cfg["rounds"]
if batch:
    n = open(cfg["starts"]).read().count(" batch\n")
    sys.stdout.write(rounds[min(n, len(rounds)) - 1])
    sys.exit(0)
if cfg.get("no_session"):  # a cuda-gdb that quits on a pipe for stdin
    sys.exit(0)
END = re.compile(r"^echo (@@@\w+ (\d+))\\n$")
n, said = 1, False  # the round being read; its answer printed?


def answer() -> None:
    """Round n's recorded text, printed at its first line as cuda-gdb answers a command at
    once (its output grows while the rest of the round is still being written to it)."""
    global said
    if said:
        return
    said = True
    text = rounds[n - 1] if n <= len(rounds) else ""
    if n == cfg.get("hang_round"):
        time.sleep(60)
    if n == cfg.get("exit_round"):
        sys.stdout.write(text[: len(text) // 2])
        sys.stdout.flush()
        sys.exit(1)
    sys.stdout.write(text)
    sys.stdout.flush()


for line in sys.stdin:
    line = line.rstrip("\n")
    if line == "quit":
        sys.exit(0)
    answer()
    m = END.match(line)
    if m:
        sys.stdout.write(m.group(1) + "\n")
        sys.stdout.flush()
        n, said = int(m.group(2)) + 1, False
