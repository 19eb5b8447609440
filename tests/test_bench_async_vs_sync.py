"""bench/async_vs_sync.py --quick runs serial, synchronous and asynchronous schedulers on real workers
and writes one row per (case, algorithm, workers), each having evaluated its budget on every worker it
was given (cemrl on one). No timing is asserted here. Without
--out, --quick writes to a temporary folder, never over the committed bench/results."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def committed_results() -> dict[str, str]:
    """sha256 of every tracked file under bench/results, but those a background learning bench rewrites."""
    files = subprocess.run(["git", "ls-files", "bench/results"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    skip = re.compile(r"bench/results/(learning\.json|learning/curves-.*\.png)$")
    return {f: hashlib.sha256((ROOT / f).read_bytes()).hexdigest() for f in files
            if not skip.match(f) and (ROOT / f).exists()}


@pytest.mark.slow
def test_async_vs_sync_quick_rows():
    before = committed_results()
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("AESRL_REDIS_URL", None)
    proc = subprocess.run([sys.executable, "bench/async_vs_sync.py", "--quick"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = Path(re.search(r"^wrote (\S+)", proc.stdout, re.M).group(1))
    assert not out.resolve().is_relative_to(ROOT / "bench" / "results"), out
    assert committed_results() == before
    data = json.loads(out.read_text())
    rows = {(r["case"], r["algo"], r["workers"]) for r in data["rows"]}
    assert rows == {("varying", "cemrl", 1), ("varying", "pcemrl", 1), ("varying", "aesrl", 1),
                    ("varying", "pcemrl", 4), ("varying", "aesrl", 4)}
    for r in data["rows"]:
        # every configuration evaluated its budget, and used every worker it was given (cemrl one)
        assert r["evals"] >= data["evals"], r
        assert 0 < r["applied"] <= r["evals"], r
        assert r["workers_used"] == (1 if r["algo"] == "cemrl" else r["workers"]), r
        assert r["workers_seen"] == r["workers_used"], r
        # busy time cannot exceed the workers used over the wall time; s/eval is wall / evaluations
        assert 0.0 < r["utilisation"] <= 1.05, r
        # the same jobs on a dispatcher that costs nothing: busy at most all the time
        assert 0.0 < r["utilisation_ideal"] <= 1.0 + 1e-9, r
        assert r["s_per_eval"] == pytest.approx(r["wall_s"] / r["evals"]), r
    assert "vs serial" in proc.stdout and "async/sync" in proc.stdout
    if out.parent.name.startswith("aesrl-bench-"):  # the temporary folder of --quick
        shutil.rmtree(out.parent, ignore_errors=True)
