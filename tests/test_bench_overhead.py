"""The overhead benchmark runs end to end in --quick mode and writes the rows it promises, with values
that hold whatever the machine's speed: the counts it was asked for, every worker used, no failed
result, byte sizes that follow from the parameter counts, percentiles in order, ratios that are
value / reference. How fast anything is stays out of the suite (bench/overhead.py reports it).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

EXPECTED_ROWS = {
    # 1. raw RQ reference
    "raw_simpleworker_noop", "raw_aesrlworker_noop", "raw_enqueue_many",
    # 2. end to end
    "e2e_results_per_s", "e2e_results_per_s_vs_aesrl_noop", "e2e_results_per_s_steady", "e2e_job_body_ms",
    "e2e_scheduler_cpu_ms", "e2e_redis_cmds",
    # 3. scheduler apply time, with the parts of the 129k apply
    "apply_10k_median", "apply_10k_p99", "apply_129k_median", "apply_129k_p99", "apply_1M_median", "apply_1M_p99",
    "apply_129k_part_rebuild", "apply_129k_part_tell", "apply_129k_part_exec", "apply_129k_part_hmget",
    "apply_129k_perturbation",
    # 4. bytes per job
    "bytes_es_job_hash_queued", "bytes_es_job_data_field", "bytes_es_result_entry", "bytes_rl_job_hash_queued",
    "bytes_rl_result_entry", "bytes_rl_ind_129k", "bytes_mu_var_download_129k", "bytes_mu_eval_download_129k",
    "apply_129k_cpu_median",
    # context for the numbers above
    "redis_rtt_hot", "redis_rtt_after_cpu",
}


@pytest.mark.slow
def test_overhead_quick_writes_expected_rows(tmp_path):
    out = tmp_path / "overhead.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("AESRL_REDIS_URL", None)
    proc = subprocess.run([sys.executable, "bench/overhead.py", "--quick", "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    data = json.loads(out.read_text())
    assert data["benchmark"] == "overhead" and data["mode"] == "quick"
    names = {row["name"] for row in data["rows"]}
    assert EXPECTED_ROWS <= names, f"missing rows: {sorted(EXPECTED_ROWS - names)}"
    for row in data["rows"]:
        assert set(row) >= {"name", "measure", "value", "unit", "reference", "ratio"}
        value, ref = row["value"], row["reference"]
        assert value is None or (math.isfinite(value) and value >= 0), row
        if value is not None and ref:
            assert row["ratio"] == pytest.approx(value / ref), row
    for key in ("cores", "python", "rq", "redis_py", "redis_server"):
        assert key in data["machine"]
    value = {row["name"]: row["value"] for row in data["rows"]}
    details = data["details"]

    # The raw RQ runs ran the jobs asked for, on every worker.
    for raw in (*details["raw_simpleworker"], *details["raw_aesrlworker"]):
        assert raw["jobs"] == data["jobs"] and raw["workers_seen"] == data["workers"], raw
    # The end-to-end runs reached their budget with every result applied once and none failed.
    for e2e in details["e2e"]:
        assert e2e["status"] == "finished" and e2e["steps"] >= data["steps"], e2e
        assert e2e["applied"] == e2e["history"] > 0 and e2e["failed"] == e2e["rejected"] == 0, e2e
        assert e2e["redis_cmds_per_result"] > 0 and e2e["sched_round_trips_per_result"] > 0, e2e
    # The apply bench measures the expensive path: every apply moved μ; float32 vectors of dim params.
    for a in details["apply"]:
        assert a["moved"] == a["n"] > 0, a
        assert a["median_ms"] <= a["p99_ms"] <= a["max_ms"], a
        assert a["mu_bytes"] == a["var_bytes"] == a["ind_bytes"] == 4 * a["dim"], a
        assert a["replay_entry_bytes"] >= a["replay_expected_bytes"], a
        label = a["label"]
        assert value[f"bytes_mu_var_download_{label}"] == 2 * value[f"bytes_mu_eval_download_{label}"], label
    assert value["bytes_es_job_data_field"] < value["bytes_es_job_hash_queued"]  # a field of that hash
    # The table went to stdout too, with its header.
    assert "measure" in proc.stdout and "ratio" in proc.stdout
