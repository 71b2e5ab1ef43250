"""What a fresh interpreter costs here, piece by piece: the parts a cold `cutedebug run` is
made of, each timed as its own new process (wall seconds, median of --reps, the pieces
alternated within each rep so that load drifts over all of them alike).

    python3 tools/cold_breakdown.py [--reps 3] [--json OUT]

Pieces: the bare interpreter; the CLI's imports for a run (`cutedebug run --help`); `import torch`; torch with
a CUDA context (what a run's worker does before its inputs exist); `import cutlass.cute`; torch
with its context then cutlass, and the same with torch and the context in a thread beside
cutlass's import (what a worker overlapping them could gain). (The health check in a new
process is gpu_pending's perturb_keys step's, both ways.) Where there is no GPU device node
the CUDA pieces are skipped (said so). First it prints whether this interpreter writes
bytecode and whether the DSL has it cached (tools/pool_bench.py: bytecode_state): without
both, every new process compiles cutlass's sources again.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pool_bench import bytecode_state  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = "torch.cuda.init(); torch.empty(1, device='cuda'); torch.cuda.synchronize()"
CUDA_CONTEXT = "import torch; " + CONTEXT
# A cold worker imports torch and makes its CUDA context, then imports cutlass: one after the
# other, and the same with torch and the context in a thread beside cutlass's import (what an
# overlapping worker could gain, the GIL and the import locks included).
IN_TURN = CUDA_CONTEXT + "; import cutlass.cute"
BESIDE = (
    "import threading\nerr = []\n"
    "def gpu():\n    try:\n        import torch\n        "
    + CONTEXT.replace("; ", "\n        ")
    + "\n    except BaseException as e:\n        err.append(e)\n"
    "t = threading.Thread(target=gpu)\nt.start()\nimport cutlass.cute\nt.join()\n"
    "if err:\n    raise err[0]"
)
PIECES = (  # name, argv after the interpreter, extra environment, needs a GPU
    ("python", ["-c", "pass"], {}, False),
    ("cli_run_imports", ["-m", "cutedebug", "run", "--help"], {}, False),
    ("torch", ["-c", "import torch"], {}, False),
    ("torch_cuda_context", ["-c", CUDA_CONTEXT], {}, True),
    ("cutlass", ["-c", "import cutlass.cute"], {}, False),
    ("context_then_cutlass", ["-c", IN_TURN], {}, True),
    ("context_beside_cutlass", ["-c", BESIDE], {}, True),
)


def gpu_here() -> bool:
    sys.path.insert(0, str(ROOT))
    from cutedebug import devices

    return devices.gpu_device_node() is not None


def timed(argv: list[str], extra: dict[str, str]) -> tuple[float, int, str]:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT, env=env)
    return time.monotonic() - t0, r.returncode, (r.stdout.strip().splitlines() or [""])[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", help="write every sample here")
    args = ap.parse_args()
    state = bytecode_state()
    print(f"bytecode: {state}")
    gpu = gpu_here()
    pieces = [p for p in PIECES if gpu or not p[3]]
    if not gpu:
        print("no GPU device node here: the CUDA pieces are skipped")
    samples: dict[str, list[float]] = {name: [] for name, *_ in pieces}
    ok = True
    for rep in range(args.reps):
        order = pieces if rep % 2 == 0 else pieces[::-1]
        for name, argv, extra, _ in order:
            wall, rc, line = timed(argv, extra)
            samples[name].append(round(wall, 3))
            if rc != 0:
                ok = False
                print(f"{name}: exit status {rc}: {line[:300]}")
    for name, walls in samples.items():
        print(
            f"{name:20s} median {statistics.median(walls):6.2f} s "
            f"(min {min(walls):.2f}, max {max(walls):.2f}, n={len(walls)})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"bytecode": state, "samples": samples}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
