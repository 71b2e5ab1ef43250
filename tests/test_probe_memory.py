"""The probe buffer at the warm pool's reserved address (instrument/probe_memory.py): every
forked worker gets its buffer at the one address the server reserved, in pages of its own;
where the driver's device address is not the host address (or it refuses), the pages go back
and the caller takes today's pinned buffer. The driver's registration is faked here (no GPU):
what it returns is the input under test."""

from pathlib import Path

import pytest
from helpers.program_json import program_json

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = r"""
import json, os, sys
from cutedebug.instrument import probe_memory as pm

out = {"before": pm.fixed_buffer(4096, register=lambda a, s: a)}  # not a pool worker yet
out["before_why"] = pm.last_miss
base = pm.reserve()
out["base"] = base
results = []
for child in range(2):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        got = pm.fixed_buffer(10_000, register=lambda a, s: a)
        tensor, addr = got
        first = bytes(tensor.numpy()[:8])  # fresh pages: zero, whatever a sibling wrote
        tensor.numpy()[:8] = child + 1
        again = pm.fixed_buffer(64, register=lambda a, s: a)  # one buffer per process
        os.write(w, json.dumps({"addr": addr, "n": tensor.numel(), "first": list(first),
                                "again": again, "again_why": pm.last_miss}).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    results.append(json.loads(os.read(r, 65536)))
out["children"] = results
# another device address: the pages go back to the reservation, and can be taken again
out["moved"] = pm.fixed_buffer(4096, register=lambda a, s: a + 4096)
out["moved_why"] = pm.last_miss
def refuse(a, s):
    raise RuntimeError("cuMemHostRegister: CUDA_ERROR_NOT_PERMITTED")
out["refused"] = pm.fixed_buffer(4096, register=refuse)
out["refused_why"] = pm.last_miss
out["too_big"] = pm.fixed_buffer(pm.RESERVE_BYTES + 1, register=lambda a, s: a)
out["too_big_why"] = pm.last_miss
got = pm.fixed_buffer(4096, register=lambda a, s: a)
out["after"] = got[1] if got else None
print(json.dumps(out))
"""


@pytest.mark.slow  # a program that starts a fork server and forks two workers (~8-9 s)
def test_every_forked_worker_gets_its_own_pages_at_the_one_reserved_address():
    out = program_json(PROGRAM, ROOT, timeout=120)
    assert out["before"] is None and "no reservation" in out["before_why"]
    base = out["base"]
    assert base and base % 4096 == 0
    a, b = out["children"]
    assert a["addr"] == b["addr"] == base
    assert a["n"] == b["n"] == 10_000
    assert a["first"] == b["first"] == [0] * 8  # the second did not see the first's bytes
    assert a["again"] is None and "already" in a["again_why"]
    assert out["moved"] is None
    assert f"{base + 4096:#x}" in out["moved_why"] and f"{base:#x}" in out["moved_why"]
    assert out["refused"] is None and "CUDA_ERROR_NOT_PERMITTED" in out["refused_why"]
    assert out["too_big"] is None and "exceed" in out["too_big_why"]
    assert out["after"] == base  # each refusal gave the pages back
