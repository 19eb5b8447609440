"""bench/es_rules.py --quick: ES alone on Pendulum with the scheduler's distribution, no Redis."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT, child_env


def test_quick_mode_prints_the_table_and_leaves_the_committed_results_alone(tmp_path) -> None:
    committed = ROOT / "bench" / "results" / "es_rules.json"
    before = committed.read_bytes() if committed.exists() else None
    out = tmp_path / "es.json"
    res = subprocess.run([sys.executable, "bench/es_rules.py", "--quick", "--out", str(out)], cwd=ROOT,
                         env=child_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "paper |" in res.stdout and "linear |" in res.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {r["variant"] for r in rows} == {"paper", "linear"}
    for r in rows:
        assert r["steps"] >= 20_000 and r["interactions"] > r["steps"]
        assert len(r["curve"]) >= 5 and all(-2000 < f < 0 for _, f in r["curve"])
    paper, linear = (next(r for r in rows if r["variant"] == v) for v in ("paper", "linear"))
    # The paper's floor leaves σ at ~0.003; the ES default keeps it at var_init's ~0.03.
    assert paper["sigma_final"] < 0.005 < 0.02 < linear["sigma_final"]
    assert (committed.read_bytes() if committed.exists() else None) == before
