"""The scale benchmark runs end to end in --quick mode and writes the rows and the knee it promises.

Checks names, shapes and the relations that hold by construction; never a wall-clock number.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from aesrl_queue.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent

ROW_KEYS = {
    "workers", "replicas", "hosts", "results_per_s", "ideal_per_s", "efficiency", "scheduler_cores", "redis_cores",
    "replica_cores", "worker_cores", "box_cores", "net_in_MBps", "net_out_MBps", "net_repl_out_MBps",
    "out_MB_per_result", "in_MB_per_result", "scheduler_ms_per_result", "redis_ms_per_result", "job_s_median",
    "applied",
}


@pytest.mark.slow
def test_scale_quick_writes_rows_and_knee(tmp_path):
    out = tmp_path / "scale.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("AESRL_REDIS_URL", None)
    env.pop("AESRL_READ_URL", None)
    # the first defaults' ES job (one episode of 1 s): with the default's pairs (2 s) the versions a host
    # receives per result double and the replicas' saving below is no longer clear of its bound
    proc = subprocess.run([sys.executable, "bench/scale.py", "--quick", "--shape", "trains", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    data = json.loads(out.read_text())
    assert data["benchmark"] == "scale" and data["mode"] == "quick"
    rows = data["rows"]
    assert [(r["workers"], r["copy"]) for r in rows] == [(8, "none"), (32, "none"), (128, "none"), (128, "replica")]
    for r in rows:
        assert ROW_KEYS <= set(r), sorted(ROW_KEYS - set(r))
        assert r["applied"] > 0 and r["results_per_s"] > 0
        assert r["failed_per_result"] == 0, r  # every simulated job reads what it needs
        assert r["ideal_per_s"] == pytest.approx(r["workers"] / data["settings"]["episode_s"])
    plain, with_replicas = rows[2], rows[3]
    # Without replicas every job downloads μ and var (1.03 MB at 129k parameters) from the primary
    # (per applied result only roughly: a short window can hold more applies than job starts).
    assert data["settings"]["actor_params"] == 129_193
    assert plain["out_MB_per_result"] > 0.5 and plain["net_repl_out_MBps"] == 0
    # With replicas the primary's egress is replication: the jobs read μ/var from their host's replica.
    assert with_replicas["replicas"] == with_replicas["hosts"] == 4
    assert with_replicas["net_repl_out_MBps"] > 0.8 * with_replicas["net_out_MBps"]
    assert with_replicas["out_MB_per_result_per_host"] < 0.5 * plain["out_MB_per_result_per_host"]
    cap = data["capacity"]
    assert {(c["copy"], c["link"]) for c in cap} == {(copy, link) for copy in ("none", "replica")
                                                     for link in ("1 GbE", "10 GbE")}
    assert all(set(c["workers"]) == {"1s", "5s"} and c["bound_by"] in ("link", "redis", "scheduler") for c in cap)
    knee = data["knee"]
    assert {"workers", "bottleneck", "why", "ceilings", "first_limit_on_own_machines"} <= set(knee)
    assert knee["first_limit_on_own_machines"] in knee["ceilings"]
    assert "results/s" in proc.stdout and "knee at" in proc.stdout


def test_loop_cost_measures_the_loop_alone(redis_server, tmp_path):
    """bench/loop_cost.py: every fed result applied, the costs positive, an ES-only run's workers
    make two script calls per result (start and finish) and store no transitions, and a host replica
    follows the versions published, the last one included."""
    sys.path.insert(0, str(ROOT))
    from bench.loop_cost import measure

    url = redis_server.url
    client = redis.Redis.from_url(url)
    with RedisServer(directory=tmp_path / "host",
                     extra_args=["--replicaof", "127.0.0.1", str(redis_server.port)]) as local:
        row = measure(url, "aesrl", batch=6, results=18, workers=4, profile=False, redis_pid=redis_server.proc.pid,
                      replicas=[local.url])
        assert redis.Redis.from_url(local.url).exists(f"aesrl:loop-cost-aesrl-6:dist:{row['published']}")
    assert row["results"] >= 18 and row["dim"] == 129_193
    assert row["loop_ms_per_result"] > 0 and row["eps_ms_per_result"] > 0 and row["redis_ms_per_result"] > 0
    assert row["redis_cpu_ms_per_result"] > 0 and row["redis_ms_per_beat"] > 0
    assert row["replica_has_last"] == [1] and row["host_replicas"] == 1
    assert row["redis_by_command"]["evalsha"][0] == pytest.approx(2.0)
    assert "xadd" in row["redis_by_command"]  # results and history entries; never an episode:
    assert client.xlen("aesrl:loop-cost-aesrl-6:replay") == 0
    assert client.hget("aesrl:loop-cost-aesrl-6:state", "steps") not in (None, b"0")


def test_the_at_rate_model_fits_a_cost_per_result_and_per_commit():
    """Two batch sizes fix a cost per result and one per commit; the limit is the rate that fills one
    thread, the host replicas' fixed cost per host charged to Redis whatever the rate."""
    sys.path.insert(0, str(ROOT))
    from bench.scale import at_rate_model, capacity

    def row(batch, loop_ms, redis_ms):  # loop 0.3 ms per result + 2 ms per commit, Redis 0.4 + 1
        return {"batch": batch, "host_replicas": 4, "loop_ms_per_result": loop_ms, "eps_ms_per_result": 0.6,
                "replica_idle_ms_per_s_per_host": 5.0,
                "at_rate": {"results_per_s": batch * 10, "redis_ms": redis_ms + 5.0 * 4 / (batch * 10)}}

    loop = {"rows": [row(10, 0.3 + 2 / 10, 0.4 + 1 / 10), row(100, 0.3 + 2 / 100, 0.4 + 1 / 100)], "rq": {},
            "commit_hz": 10}
    model = at_rate_model(loop)
    assert model["loop"] == pytest.approx((0.3, 2.0)) and model["redis"] == pytest.approx((0.4, 1.0))
    point = {"rl_share_target": 0.0, "copy": "replica", "hosts": 4, "workers": 128, "results_per_s": 100.0,
             "efficiency": 0.99, "out_MB_per_result": 0.001,
             "redis_ms_per_result": 5.0, "scheduler_ms_per_result": 5.0, "scheduler_loop_ms_per_result": 5.0}
    one = next(c for c in capacity([point], loop) if c["link"] == "1 GbE")
    assert one["limits"]["scheduler"] == pytest.approx((1000 - 20) / 0.3)
    assert one["limits"]["redis"] == pytest.approx((1000 - 10 - 5.0 * 4) / 0.4)
    assert one["bound_by"] == "redis" and one["costs_from"] == "loop_cost"
    assert one["scheduler_other_cores"] == pytest.approx(0.6 * one["results_per_s"] / 1e3)
    assert at_rate_model({"rows": [row(10, 1, 1)], "rq": {}}) is None  # one batch size fixes nothing
    woken = [row(10, 0.5 + 2 / 10, 0.4 + 1 / 10), row(100, 0.5 + 2 / 100, 0.4 + 1 / 100)]
    for r in woken:  # a loop woken for every result: the dearest case is the one planned with
        r["per_read"] = 1
    assert at_rate_model(loop | {"rows": loop["rows"] + woken})["loop"] == pytest.approx((0.5, 2.0))


def test_capacity_takes_bytes_per_result_and_the_loop_thread():
    """A host replica receives every write, so the link's bytes are per result; the scheduler's limit is
    its loop thread, with the ε threads' cores beside it; a starved point is not used."""
    sys.path.insert(0, str(ROOT))
    from bench.scale import GBE_MBPS, capacity

    def row(workers, rate, efficiency, out_per_result, loop_ms):
        return {"rl_share_target": 0.0, "copy": "replica", "hosts": 4, "workers": workers, "results_per_s": rate,
                "efficiency": efficiency, "out_MB_per_result": out_per_result,
                "redis_ms_per_result": 0.5, "scheduler_ms_per_result": 2.0, "scheduler_loop_ms_per_result": loop_ms}

    cap = capacity([row(128, 100.0, 0.99, 0.45, 1.0), row(256, 120.0, 0.5, 0.42, 0.1)])
    one = next(c for c in cap if c["link"] == "1 GbE")
    assert one["at_workers"] == 128  # the 256-worker point did not keep up
    assert one["limits"]["link"] == pytest.approx(GBE_MBPS / 0.45)
    assert one["limits"]["redis"] == pytest.approx(2000.0) and one["limits"]["scheduler"] == pytest.approx(1000.0)
    assert one["bound_by"] == "link" and one["fixed_MBps"] == 0.0
    assert one["out_MB_per_result_per_host_there"] == pytest.approx(0.45 / 4)
