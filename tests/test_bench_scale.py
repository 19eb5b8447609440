"""The scale benchmark runs end to end in --quick mode and writes the rows and the knee it promises.

Checks names, shapes and the relations that hold by construction; never a wall-clock number.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
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
    proc = subprocess.run([sys.executable, "bench/scale.py", "--quick", "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    data = json.loads(out.read_text())
    assert data["benchmark"] == "scale" and data["mode"] == "quick"
    rows = data["rows"]
    assert [(r["workers"], r["copy"]) for r in rows] == [(8, "none"), (32, "none"), (128, "none"), (128, "replica"),
                                                         (128, "relay")]
    for r in rows:
        assert ROW_KEYS <= set(r), sorted(ROW_KEYS - set(r))
        assert r["applied"] > 0 and r["results_per_s"] > 0
        assert r["ideal_per_s"] == pytest.approx(r["workers"] / data["settings"]["episode_s"])
    plain, with_replicas, with_relays = rows[2], rows[3], rows[4]
    # Without replicas every job downloads μ and var (1.03 MB at 129k parameters) from the primary
    # (per applied result only roughly: a short window can hold more applies than job starts).
    assert data["settings"]["actor_params"] == 129_193
    assert plain["out_MB_per_result"] > 0.5 and plain["net_repl_out_MBps"] == 0
    # With replicas the primary's egress is replication: the jobs read μ/var from their host's replica.
    assert with_replicas["replicas"] == with_replicas["hosts"] == 4
    assert with_replicas["net_repl_out_MBps"] > 0.8 * with_replicas["net_out_MBps"]
    # A relay is no replica: it reads what the host's workers need with ordinary commands.
    assert with_relays["relays"] == with_relays["hosts"] == 4 and with_relays["replicas"] == 0
    assert with_relays["net_repl_out_MBps"] == 0
    cap = data["capacity"]
    assert {(c["copy"], c["link"]) for c in cap} == {(copy, link) for copy in ("none", "replica", "relay")
                                                     for link in ("1 GbE", "10 GbE")}
    assert all(set(c["workers"]) == {"1s", "5s"} and c["bound_by"] in ("link", "redis", "scheduler") for c in cap)
    knee = data["knee"]
    assert {"workers", "bottleneck", "why", "ceilings", "first_limit_on_own_machines"} <= set(knee)
    assert knee["first_limit_on_own_machines"] in knee["ceilings"]
    assert "results/s" in proc.stdout and "knee at" in proc.stdout


def test_loop_cost_measures_the_loop_alone(redis_server, tmp_path):
    """bench/loop_cost.py: every fed result applied, the costs positive, an ES-only run's workers
    make two script calls per result (start and finish) and store no transitions, and a host's relay
    (a process of its own) follows the versions published, the last one included; its stats files go."""
    sys.path.insert(0, str(ROOT))
    from bench.loop_cost import measure

    url = redis_server.url
    client = redis.Redis.from_url(url)
    before = set(Path(tempfile.gettempdir()).glob("loop-cost-relays-*"))
    with RedisServer(directory=tmp_path / "host") as local:
        row = measure(url, "aesrl", batch=6, results=18, workers=4, profile=False, redis_pid=redis_server.proc.pid,
                      relays=[local.url])
        assert redis.Redis.from_url(local.url).exists(f"aesrl:loop-cost-aesrl-6:dist:{row['published']}")
    assert set(Path(tempfile.gettempdir()).glob("loop-cost-relays-*")) == before  # the relays' stats files go
    assert row["results"] >= 18 and row["dim"] == 129_193
    assert row["loop_ms_per_result"] > 0 and row["eps_ms_per_result"] > 0 and row["redis_ms_per_result"] > 0
    assert row["redis_cpu_ms_per_result"] > 0 and row["redis_ms_per_beat"] > 0
    # the relay copies the newest version when it looks (every 5 ms): on a quiet machine one per round,
    # on a loaded one it can skip some; the last one is there (above) and the row counts what it copied
    assert 1 <= row["relay_versions"][0] <= row["published"] + 1  # versions 0..published
    assert row["redis_by_command"]["evalsha"][0] == pytest.approx(2.0)
    assert "xadd" in row["redis_by_command"]  # results and history entries; never an episode:
    assert client.xlen("aesrl:loop-cost-aesrl-6:replay") == 0
    assert client.hget("aesrl:loop-cost-aesrl-6:state", "steps") not in (None, b"0")


def test_the_at_rate_model_fits_a_cost_per_result_and_per_commit():
    """Two batch sizes fix a cost per result and one per commit; the limit is the rate that fills one
    thread, the relays' polls per host charged to Redis whatever the rate."""
    sys.path.insert(0, str(ROOT))
    from bench.scale import at_rate_model, capacity

    def row(batch, loop_ms, redis_ms):  # loop 0.3 ms per result + 2 ms per commit, Redis 0.4 + 1
        return {"batch": batch, "relays": 4, "loop_ms_per_result": loop_ms, "eps_ms_per_result": 0.6,
                "relay_idle_ms_per_s_per_host": 5.0,
                "at_rate": {"results_per_s": batch * 10, "redis_ms": redis_ms + 5.0 * 4 / (batch * 10)}}

    loop = {"rows": [row(10, 0.3 + 2 / 10, 0.4 + 1 / 10), row(100, 0.3 + 2 / 100, 0.4 + 1 / 100)], "rq": {},
            "commit_hz": 10}
    model = at_rate_model(loop)
    assert model["loop"] == pytest.approx((0.3, 2.0)) and model["redis"] == pytest.approx((0.4, 1.0))
    point = {"rl_share_target": 0.0, "copy": "relay", "hosts": 4, "workers": 128, "results_per_s": 100.0,
             "efficiency": 0.99, "relay_MB_per_result_per_host": 0.0, "out_MB_per_result": 0.001,
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


def test_capacity_projects_the_relays_bytes_per_host_and_the_loop_thread():
    """Relay bytes follow the versions (per second and host), the rest the results; the scheduler's
    limit is its loop thread, with the ε threads' cores beside it; a starved point is not used."""
    sys.path.insert(0, str(ROOT))
    from bench.scale import GBE_MBPS, capacity

    def row(workers, rate, efficiency, out_per_result, loop_ms):
        return {"rl_share_target": 0.0, "copy": "relay", "hosts": 4, "workers": workers, "results_per_s": rate,
                "efficiency": efficiency, "relay_MB_per_result_per_host": 0.1, "out_MB_per_result": out_per_result,
                "redis_ms_per_result": 0.5, "scheduler_ms_per_result": 2.0, "scheduler_loop_ms_per_result": loop_ms}

    cap = capacity([row(128, 100.0, 0.99, 0.45, 1.0), row(256, 120.0, 0.5, 0.42, 0.1)])
    one = next(c for c in cap if c["link"] == "1 GbE")
    assert one["at_workers"] == 128  # the 256-worker point did not keep up
    assert one["limits"]["link"] == pytest.approx((GBE_MBPS - 4 * 0.1 * 100.0) / (0.45 - 4 * 0.1))
    assert one["limits"]["redis"] == pytest.approx(2000.0) and one["limits"]["scheduler"] == pytest.approx(1000.0)
    assert one["bound_by"] == "scheduler" and one["workers"] == {"1s": 1000, "5s": 5000}
    assert one["scheduler_other_cores"] == pytest.approx(1.0)
    assert one["out_MB_per_result_per_host_there"] == pytest.approx((40.0 + 1000 * 0.05) / 1000 / 4)
    # The replay's observations reach every relay per result: they are no part of the fixed bytes.
    rl = row(128, 100.0, 0.99, 0.45, 1.0) | {"relay_replay_MB_per_result_per_host": 0.04}
    one = next(c for c in capacity([rl]) if c["link"] == "1 GbE")
    assert one["fixed_MBps"] == pytest.approx(4 * 0.06 * 100.0) and one["MB_per_result"] == pytest.approx(0.45 - 0.24)
    # A starved scheduler that published 5 versions a second instead of 10 would halve the relays' bytes.
    one = next(c for c in capacity([rl | {"published_per_s": 5.0}]) if c["link"] == "1 GbE")
    assert one["fixed_MBps"] == pytest.approx(2 * 4 * 0.06 * 100.0)
