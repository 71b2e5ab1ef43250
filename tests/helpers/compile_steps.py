"""Compile worker requests one after another in ONE process, as a warm pool worker would
(engine/compile_cache.py), and print one JSON line per compile.

    python tests/helpers/compile_steps.py STEPS.json

STEPS.json: a list of {"request": PATH, "env": {VAR: VALUE}} (env set before that compile).
Each line: the compiled event's compile_cache, secs, probe/fault sites, the PTX's SHA-256 and
what the DSL built (whether it built from a cache hit, whether the host entry exists, the
lowered module's text hash)."""

import hashlib
import json
import os
import sys
from pathlib import Path

from cutlass.base_dsl.compile_backend import LegacyCompilerBackend

from cutedebug.engine import worker

built: list[dict] = []
original = LegacyCompilerBackend._build_compiled_function


def _build(backend, ctx, arch, cache_state):
    fn = original(backend, ctx, arch, cache_state)
    built.append(
        {
            "hit": bool(cache_state.cache_hit),
            "entry": fn.capi_func is not None,
            "module": hashlib.sha256(str(fn.ir_module).encode()).hexdigest(),
        }
    )
    return fn


LegacyCompilerBackend._build_compiled_function = _build

for step in json.loads(Path(sys.argv[1]).read_text()):
    os.environ.update(step.get("env") or {})
    request = json.loads(Path(step["request"]).read_text())
    events_path = Path(request["events"])
    events_path.write_text("")
    built.clear()
    worker.run(request, worker.Events(str(events_path)))
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    compiled = next(e for e in events if e["event"] == "compiled")
    ptx = Path(request["ptx_path"]).read_bytes()
    print(
        json.dumps(
            {
                "cache": compiled.get("compile_cache"),
                "secs": compiled["secs"],
                "probe_sites": compiled.get("probe_sites"),
                "fault_sites": compiled.get("fault_sites"),
                "ptx": hashlib.sha256(ptx).hexdigest(),
                "built": built[-1] if built else None,
            }
        ),
        flush=True,
    )
