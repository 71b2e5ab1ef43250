#!/usr/bin/env bash
# Set up a development environment in .venv (idempotent; fast when already done).
#   bash tools/setup.sh
# Installs cutedebug (editable) with nvidia-cutlass-dsl 4.8.1, psutil, pytest, pytest-timeout,
# hypothesis, pytest-xdist, ruff, and torch when it is not importable (the CPU build where one
# is on disk);
# then, if it installs, the 'field' extra (quack-kernels, flash-attn-4, triton, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.cutedebug-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ tools/ci-constraints.txt -nt "$stamp" ]; then
  # CI compiles on one DSL version of the range (tools/ci-constraints.txt: 4.8.1, the GPU
  # bundle's); tools/dsl_versions.py checks the others
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]" \
    -c tools/ci-constraints.txt
  if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    # A CPU build is enough here (compile-level work and CPU references); GPU machines bring
    # their own CUDA build of torch.
    .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" \
      || .venv/bin/python -m pip install -q --disable-pip-version-check torch
  fi
  # The field extra (public libraries for scenarios/field): wanted, not required. Without it
  # the field scenarios are skipped with the reason; a failed download must not fail set-up.
  if ! .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[field]"; then
    echo "cutedebug: the 'field' extra did not install; scenarios/field will be skipped"
  fi
  touch "$stamp"
fi
.venv/bin/python -c "import cutlass, torch, psutil, pytest_timeout; print('cutedebug env ready: cutlass', cutlass.__version__, '| torch', torch.__version__)"
