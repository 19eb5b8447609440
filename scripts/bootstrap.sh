#!/usr/bin/env bash
# Create .venv (once) and install the project with its dev extras. Torch is pinned to the CPU
# build here: an unpinned torch would download a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${AESRL_TORCH_SPEC:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.aesrl-installed
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check "$TORCH_SPEC"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
    touch "$stamp"
fi
