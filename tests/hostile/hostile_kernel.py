"""A kernel adapter that attacks the harness instead of computing anything (adversarial tests).

``behaviour`` picks the attack; it happens in ``fake_args`` (the worker calls it after
importing and constructing the kernel, in phase "imported") or while ``cute.compile`` traces
``__call__``. Written to be run by the real worker, forked from the real fork server.
"""

import os
import signal
import subprocess
import sys
import time

import cutlass.cute as cute

GRANDCHILD = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(10000)"


def _trace_time_failure(behaviour: str) -> None:
    """Raised while cute.compile traces __call__ (the DSL forbids a raise in __call__ itself)."""
    if behaviour == "raise_10mb":
        raise ValueError("x" * (10 << 20))
    raise RuntimeError("hostile kernel: nothing to compile")


class Hostile:
    PARAMS = {"behaviour": "sleep", "pidfile": ""}

    def __init__(self, behaviour: str = "sleep", pidfile: str = ""):
        self.behaviour, self.pidfile = behaviour, pidfile

    def fake_args(self):
        b = self.behaviour
        if b == "sleep":
            if self.pidfile:
                with open(self.pidfile, "w") as f:
                    f.write(str(os.getpid()))
            time.sleep(10_000)
        elif b == "spin":
            while True:
                pass
        elif b == "tree":  # setsid'd, SIGTERM-ignoring grandchildren, exec'd and not
            kids = [
                subprocess.Popen([sys.executable, "-c", GRANDCHILD], start_new_session=True).pid
                for _ in range(2)
            ]
            pid = os.fork()
            if pid == 0:
                os.setsid()
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                time.sleep(10_000)
                os._exit(0)
            kids.append(pid)
            with open(self.pidfile, "w") as f:
                f.write(" ".join(map(str, kids)))
            time.sleep(10_000)
        elif b in ("scrubbed", "scrubbed_then_return"):
            # A daemon no tag can find: double fork, its own session, an empty environment.
            code = (
                "import os, signal, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
                "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(10000)"
            )
            pid = os.fork()
            if pid == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execve(sys.executable, [sys.executable, "-c", code, self.pidfile], {})
                os._exit(0)
            os.waitpid(pid, 0)
            while not (os.path.exists(self.pidfile) and open(self.pidfile).read()):
                time.sleep(0.01)
            if b == "scrubbed":
                time.sleep(10_000)
        elif b == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif b == "user_error":
            return 1 / 0
        return ()

    @cute.jit
    def __call__(self):
        _trace_time_failure(self.behaviour)

    def make_inputs(self, device):
        return {}

    def cute_args(self, tensors):
        return ()

    def reference(self, tensors):
        return None

    def output(self, tensors):
        return None
