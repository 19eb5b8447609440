"""The algorithm comparison benchmark runs end to end in --quick mode and writes one row per algorithm.

Checks names and shapes only: wall-clock numbers and returns are never asserted in the test suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aesrl_queue.config import ALGOS

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_compare_quick_has_a_row_per_algorithm(tmp_path):
    out = tmp_path / "compare.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("AESRL_REDIS_URL", None)
    proc = subprocess.run([sys.executable, "bench/compare.py", "--quick", "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["env"] == "Pendulum-v1" and data["mode"] == "quick"
    steps, wall = data["budgets"]["steps"], data["budgets"]["wall_s"]
    assert [row["algo"] for row in data["table"]] == list(ALGOS)
    for row in data["table"]:
        assert row["runs"] == len(data["seeds"]) and row["finished"] == row["runs"], row
        for key in (f"f@{steps // 2}steps", f"f@{steps}steps", f"f@{wall / 2:g}s", f"f@{wall:g}s", "steps_per_s"):
            assert set(row[key]) == {"mean", "std", "n"}, (key, row)
        assert row[f"f@{steps}steps"]["n"] == row["runs"], row
    for run in data["runs"]:
        assert run["steps"] >= steps and run["series"], run["algo"]
        # The rows compare what they claim to: RL individuals where the algorithm has them, none for es/td3.
        assert (run["rl_applied"] > 0) == (run["algo"] not in ("es", "td3")), run
    # The printed table names every algorithm.
    for algo in ALGOS:
        assert f"\n{algo} " in proc.stdout, proc.stdout
