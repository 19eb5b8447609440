"""bench/async_vs_sync.py --quick runs serial, synchronous and asynchronous schedulers on real workers
and writes one row per (case, algorithm, workers). Shapes only: no timing is asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_async_vs_sync_quick_rows(tmp_path):
    out = tmp_path / "avs.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("AESRL_REDIS_URL", None)
    proc = subprocess.run([sys.executable, "bench/async_vs_sync.py", "--quick", "--out", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    data = json.loads(out.read_text())
    rows = {(r["case"], r["algo"], r["workers"]) for r in data["rows"]}
    assert rows == {("varying", "cemrl", 1), ("varying", "pcemrl", 1), ("varying", "aesrl", 1),
                    ("varying", "pcemrl", 4), ("varying", "aesrl", 4)}
    for r in data["rows"]:
        # every configuration evaluated its budget, and used the workers it was given
        assert r["evals"] >= data["evals"], r
        assert 0.0 < r["utilisation"] <= 1.05, r
        assert r["workers_seen"] <= r["workers"], r
    assert "vs serial" in proc.stdout and "async/sync" in proc.stdout
