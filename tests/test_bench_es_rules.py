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
    variants = ("paper", "linear", "mirror-pp25", "openai-es")
    assert all(f"{v} |" in res.stdout for v in variants)
    rows = json.loads(out.read_text())["rows"]
    assert {r["variant"] for r in rows} == set(variants)
    for r in rows:
        assert r["steps"] >= 20_000 and len(r["curve"]) >= 2 and all(-2000 < f < 0 for _, f in r["curve"])
    paper, linear, pp25, oes = (next(r for r in rows if r["variant"] == v) for v in variants)
    # a μ episode per individual costs interactions; an antithetic pair or a population does not
    assert paper["interactions"] > linear["interactions"] > linear["steps"]
    assert pp25["interactions"] == pp25["steps"] and oes["interactions"] == oes["steps"]
    # p_positive 0.25 caps every p at a quarter; the losers of the pairs get 0
    assert 0 < pp25["p_mean"] <= 0.125 + 1e-9
    assert oes["generations"] == -(-oes["steps"] // (2 * 20 * 200))
    # The paper's floor leaves σ at ~0.003; the ES default keeps it at var_init's ~0.03.
    assert paper["sigma_final"] < 0.005 < 0.02 < linear["sigma_final"]
    assert (committed.read_bytes() if committed.exists() else None) == before
