#!/usr/bin/env bash
# One side of the GPU race of docs/performance.md, as one command for a GPU machine lent for a few
# minutes: `aesrl` (the paper's sizes, 14 workers) or our `td3` alone on the machine for MINUTES, its μ
# scored at every minute and at its end on the protocol's 10 fixed start states (bench/gpu.py race).
# Run it once for each, one after the other on the same machine, then put the two side by side at
# equal minutes with `python bench/gpu.py report DIR/aesrl DIR/td3` (the folders the .tar.gz hold).
# Under OUT: the race's printed table (ALGO.txt), nvidia-smi's readings and the run folder without
# its Redis files and snapshots (the scores are in its gpu.json) as ALGO.tar.gz.
#
#   bash bench/gpu_race.sh OUT aesrl|td3 MINUTES [RACE_ARGS]
#
# RACE_ARGS go to the race after the script's own (a dry run on a CPU machine:
# "--env Pendulum-v1 --hidden 16,16 --random-steps 400 --workers 1 --snapshot-every 10").
set -u
out=${1:?usage: bench/gpu_race.sh OUT aesrl|td3 MINUTES [RACE_ARGS]}
algo=${2:?usage: bench/gpu_race.sh OUT aesrl|td3 MINUTES [RACE_ARGS]}
minutes=${3:?usage: bench/gpu_race.sh OUT aesrl|td3 MINUTES [RACE_ARGS]}
extra=${4:-}
t0=$(date +%s)
work=${RACE_DIR:-$(mktemp -d)}
export PYTHONUNBUFFERED=1
mkdir -p "$out"
command -v nvidia-smi >/dev/null || nvidia-smi() { echo "no nvidia-smi"; }
smi="$out/$algo-nvidia-smi.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$smi" 2>&1
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 30 >>"$smi" 2>&1 &
watch=$!
python3 bench/gpu.py race --algos "$algo" --minutes "$minutes" --workers 14 --out "$work/$algo" $extra \
    >"$out/$algo.txt" 2>&1
rc=$?
kill $watch 2>/dev/null
cp "$work/$algo/gpu.json" "$out/$algo-gpu.json" 2>/dev/null
tar czf "$out/$algo.tar.gz" -C "$work" --exclude=redis --exclude=snapshots "$algo"
cat "$out/$algo.txt"
echo "race exit $rc, $(($(date +%s) - t0)) s in all"
exit $rc
