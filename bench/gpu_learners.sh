#!/usr/bin/env bash
# The learner alone at 100 000 steps on a GPU machine lent for ~15 minutes (issue 45's first gate):
# `bench/learners.py alone` on the development seeds, all cells at once under CUDA MPS with TF32
# matrix products, each cell's critic on the CUDA-graph path. The 9 crossq cells take ~10 minutes of
# an H200 and their start and scoring come on top, more than one 10-minute command, so the work runs
# detached and two calls share it:
#
#   bash bench/gpu_learners.sh start DIR [LEARNER] [SEEDS]   starts the cells detached (setsid), returns
#   bash bench/gpu_learners.sh wait DIR OUT [SECONDS]        waits for them (at most SECONDS, default 540),
#                                                            then copies the table and JSON to OUT
#
# `wait` must follow while the machine is still warm (it is given back ~30 s after a call ends): call
# `start`, then `wait` at once, and `wait` again if the first ran out of SECONDS. The cells stop at
# 14 minutes whatever happens (`--minutes 14`) and are scored then. $ALONE_ARGS go to `alone` (a dry
# run on a CPU machine: ALONE_ARGS="--envs Pendulum-v1 --steps 3000 --critic-hidden 32,32").
set -u
cmd=${1:?usage: bench/gpu_learners.sh start DIR [LEARNER] [SEEDS] | wait DIR OUT [SECONDS]}
dir=${2:?usage: bench/gpu_learners.sh start DIR [LEARNER] [SEEDS] | wait DIR OUT [SECONDS]}
case "$cmd" in
start)
    learner=${3:-crossq}
    seeds=${4:-1,2,3}
    mkdir -p "$dir"
    export CUDA_MPS_PIPE_DIRECTORY=$dir/mps CUDA_MPS_LOG_DIRECTORY=$dir/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d 2>"$dir/mps.err" || echo "no MPS: the cells share the GPU by time slices"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$dir/nvidia-smi.txt" 2>&1
    TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 PYTHONUNBUFFERED=1 setsid nohup python3 bench/learners.py alone \
        --learner "$learner" --seeds "$seeds" --minutes 14 --runs "$dir/runs" --out "$dir/alone.json" ${ALONE_ARGS:-} \
        >"$dir/alone.txt" 2>&1 &
    echo "started: $learner alone, seeds $seeds, in $dir (pid $!)"
    ;;
wait)
    out=${3:?usage: bench/gpu_learners.sh wait DIR OUT [SECONDS]}
    limit=${4:-540}
    t0=$(date +%s)
    while [ ! -s "$dir/alone.json" ] && [ $(($(date +%s) - t0)) -lt "$limit" ]; do sleep 5; done
    mkdir -p "$out"
    cp "$dir/alone.json" "$dir/alone.txt" "$dir/nvidia-smi.txt" "$out/" 2>/dev/null
    if [ -s "$dir/alone.json" ]; then cat "$dir/alone.txt"; exit 0; fi
    for log in "$dir"/runs/*/*.log; do echo "$log: $(tail -c 200 "$log" | tr '\r' '\n' | tail -1)"; done
    echo "not finished after ${limit} s: call wait again while the machine is warm"
    exit 3
    ;;
*)
    echo "usage: bench/gpu_learners.sh start DIR [LEARNER] [SEEDS] | wait DIR OUT [SECONDS]" >&2
    exit 2
    ;;
esac
