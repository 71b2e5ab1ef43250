"""A tiny GPU job run in a fresh process after a kill: is the GPU still usable?

Prints one JSON line: {"healthy": bool, ...}.
"""

import json
import sys


def main() -> int:
    try:
        import torch

        if not torch.cuda.is_available():
            print(json.dumps({"healthy": None, "reason": "no CUDA GPU"}))
            return 0
        a = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        ok = (a * 2 + 1).max().item() == 2.0 * ((1 << 20) - 1) + 1
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        print(json.dumps({"healthy": ok, "device": torch.cuda.get_device_name(0),
                          "free_gib": round(free / 2**30, 1)}))
        return 0 if ok else 1
    except Exception as e:
        print(json.dumps({"healthy": False, "error": f"{type(e).__name__}: {e}"}))
        return 1


if __name__ == "__main__":
    sys.exit(main())
