"""bench/learning.py --quick runs AES-RL, TD3 and serial CEM-RL through `aesrl-queue run` on Pendulum-v1
and plots them with `aesrl-queue plot`. Shapes only: which rows and files exist, not the returns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_learning_quick_rows_and_plot(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("AESRL_REDIS_URL", None)
    proc = subprocess.run([sys.executable, "bench/learning.py", "--quick", "--out-dir", str(tmp_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    data = json.loads((tmp_path / "learning.json").read_text())
    assert {(r["env"], r["algo"]) for r in data["rows"]} == {("Pendulum-v1", a) for a in ("aesrl", "td3", "cemrl")}
    for r in data["rows"]:
        assert r["evals"] >= 1 and (tmp_path / "Pendulum-v1" / f"{r['algo']}-s1" / "metrics.jsonl").is_file()
        assert isinstance(r["f_mu_steps_100"], float)
    png = tmp_path / "Pendulum-v1.png"
    assert png.stat().st_size > 20_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "f(μ)@100%" in proc.stdout
