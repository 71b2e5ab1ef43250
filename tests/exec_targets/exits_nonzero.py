"""exec target: its own check fails (non-zero exit after printing why)."""

import sys

print("computing", flush=True)
got, want = 0.5, 0.25
print(f"check failed: max abs error {abs(got - want)} > 1e-3", flush=True)
sys.exit(3)
