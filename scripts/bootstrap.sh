#!/usr/bin/env bash
# Create .venv (once) and install the project with its dev extras.
#
# Torch: `pip install torch==2.13.0` takes whatever build the configured index offers. From PyPI on
# Linux that is the CUDA build (several GB); a mirror may offer the CPU build. For the CPU build
# from PyTorch's own index, set AESRL_TORCH_INDEX=https://download.pytorch.org/whl/cpu (passed as
# pip's --index-url for torch alone). AESRL_TORCH_SPEC replaces the requirement (default torch==2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${AESRL_TORCH_SPEC:-torch==2.13.0}
TORCH_INDEX=${AESRL_TORCH_INDEX:-}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.aesrl-installed
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ]; then
    if [ -n "$TORCH_INDEX" ]; then
        .venv/bin/python -m pip install -q --disable-pip-version-check --index-url "$TORCH_INDEX" "$TORCH_SPEC"
    else
        .venv/bin/python -m pip install -q --disable-pip-version-check "$TORCH_SPEC"
    fi
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
    touch "$stamp"
fi
