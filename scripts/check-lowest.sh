#!/usr/bin/env bash
# Install the lowest versions setup.cfg allows (each install_requires line's >= bound, pinned with
# ==) into a fresh venv and run the end-to-end path: a local Pendulum-v1 run of 3,000 steps with two
# workers and its evaluation. Run it after lowering a bound: a range is one the project has run.
#
#   scripts/check-lowest.sh [VENV_DIR]     (default: a new folder under $TMPDIR, removed at the end)
#
# Torch comes first as bootstrap.sh installs it (AESRL_TORCH_SPEC / AESRL_TORCH_INDEX), pinned to
# the lowest allowed torch unless AESRL_TORCH_SPEC says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/aesrl-lowest.XXXXXX")
venv=${1:-$work/venv}
[ -n "${1:-}" ] || trap 'rm -rf "$work"' EXIT
"$PY" - setup.cfg > "$work/lowest.txt" <<'EOF'
import configparser, re, sys
cfg = configparser.ConfigParser()
cfg.read(sys.argv[1])
for line in cfg["options"]["install_requires"].split("\n"):
    m = re.match(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*.*?>=\s*([^,\s]+)", line)
    if m:
        print(f"{m.group(1)}=={m.group(3)}")
EOF
echo "lowest allowed versions:" $(cat "$work/lowest.txt") >&2
torch_spec=${AESRL_TORCH_SPEC:-$(grep '^torch==' "$work/lowest.txt")}
"$PY" -m venv "$venv"
pip() { "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@"; }
if [ -n "${AESRL_TORCH_INDEX:-}" ]; then
    pip --index-url "$AESRL_TORCH_INDEX" "$torch_spec"
else
    pip "$torch_spec"
fi
pip -c "$work/lowest.txt" -e .
"$venv/bin/python" -m pip freeze --disable-pip-version-check | grep -iE "^($(cut -d= -f1 "$work/lowest.txt" | paste -sd'|'))==" >&2
cd "$work"
"$venv/bin/aesrl-queue" run --env Pendulum-v1 --steps 3000 --workers 2 --run-id lowest --out "$work/runs"
"$venv/bin/aesrl-queue" evaluate "$work/runs/lowest" --episodes 2
echo "check-lowest: the lowest allowed versions ran a local run and its evaluation" >&2
