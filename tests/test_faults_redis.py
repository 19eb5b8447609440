"""Redis itself fails under a running run: restarted (with AOF, the settings of docs/redis.md) and
frozen for a few seconds. Every component waits, reconnects with backoff and says so in its log;
none crashes; the run completes with every result applied exactly once.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import pytest

from aesrl_queue.config import RunConfig
from aesrl_queue.connection import connect
from aesrl_queue.redis_server import RedisServer
from aesrl_queue.store import Store
from scheduler.loop import Scheduler
from tests.conftest import wait_for
from tests.faults import check_exactly_once, sleep_config

pytestmark = pytest.mark.slow

# The settings docs/redis.md tells users to run with (AOF, fsync every second, never evict).
AOF_ARGS = ["--appendfsync", "everysec", "--maxmemory-policy", "noeviction"]


def _start_run(procs, url: str, cfg, run: str, workers: int = 2) -> None:
    for i in range(workers):
        procs.rq_worker(f"w{i}", url)
    procs.cli("scheduler", "scheduler", "start", "--redis-url", url, "--config", str(cfg), "--run-id", run)
    procs.cli("critic", "critic", "start", "--redis-url", url, "--run", run)


def _alive(procs) -> dict[str, int | None]:
    return {name: p.poll() for name, p in procs.procs.items()}


def test_redis_frozen_then_restarted_with_aof(tmp_path, procs):
    run = "faults-redis-restart"
    data = tmp_path / "redis"
    server = RedisServer(directory=data, appendonly=True, extra_args=AOF_ARGS).start()
    port = server.port
    try:
        url = server.url
        client = connect(url)
        store = Store(client, run)
        cfg = sleep_config(tmp_path / "run.json", mean_s=0.4, total_steps=2500, initial_steps=300)
        _start_run(procs, url, cfg, run)
        wait_for(lambda: store.state()["rl_applied"] >= 1, 120, what="RL results before the freeze",
                 on_fail=procs.logs)

        # 1. Frozen for 6 s (SIGSTOP): every command waits; nothing fails, nobody exits.
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(6.0)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert all(code is None for code in _alive(procs).values()), procs.logs()
        frozen_at = store.state()["results_applied"]
        wait_for(lambda: store.state()["results_applied"] >= frozen_at + 3 and store.state()["rl_applied"] >= 2, 60,
                 what="results after the freeze", on_fail=procs.logs)
        before = store.state()

        # 2. A clean restart: SIGTERM (Redis writes and fsyncs the AOF), down for a few seconds, same dir and port.
        server.stop()
        down_at = time.monotonic()
        time.sleep(10.0)
        server = RedisServer(port=port, directory=data, appendonly=True, extra_args=AOF_ARGS).start()
        print(f"\nRedis down for {time.monotonic() - down_at:.1f}s")
        client = connect(url)
        store = Store(client, run)
        after = store.state()
        # AOF kept everything: the state is at least what it was before the restart.
        assert after["results_applied"] >= before["results_applied"] and after["version"] >= before["version"]

        wait_for(lambda: store.status() == "finished", 240, interval=0.5, what="the run to finish after the restart",
                 on_fail=procs.logs)
        assert procs.procs["scheduler"].wait(30) == 0, procs.log("scheduler")
        assert procs.procs["critic"].wait(60) == 0, procs.log("critic")
        alive = _alive(procs)
        assert alive["w0"] is None and alive["w1"] is None, (alive, procs.logs())
        out = check_exactly_once(client, store)
        assert out["state"]["steps"] >= 2500
        assert out["state"]["results_applied"] > after["results_applied"]
        # Each component said what happened, and that it is back.
        for name in ("scheduler", "critic"):
            log = procs.log(name)
            assert "Redis unreachable" in log and "Redis reachable again" in log, (name, log[-3000:])
        for name in ("w0", "w1"):
            log = procs.log(name)
            assert "Redis unreachable" in log and "Redis reachable again" in log, (name, log[-3000:])
    finally:
        server.cleanup()


def test_scheduler_outlives_an_outage_longer_than_its_retries(tmp_path, procs, caplog):
    """The CLI's clients retry for about a minute; beyond that the loop itself waits and then resumes
    from Redis. Shown in-process with clients that give up after one retry."""
    caplog.set_level(logging.INFO)
    data = tmp_path / "redis"
    server = RedisServer(directory=data, appendonly=True, extra_args=AOF_ARGS).start()
    port = server.port
    cfg = RunConfig.from_preset("AesrlSleep-v0", algo="es", run_id="faults-long-outage", hidden=(8, 8),
                                env_kwargs={"episode_len": 20, "mean_s": 0.3}, total_steps=1200,
                                mean_eval_episodes=1, result_ttl=30, failure_ttl=60).resolve()
    client = connect(server.url, retries=1)
    sched = Scheduler(client, connect(server.url, blocking=True, retries=1), cfg)
    outcome: list[str] = []
    thread = threading.Thread(target=lambda: outcome.append(sched.run()), daemon=True)
    try:
        procs.rq_worker("w0", server.url)
        procs.rq_worker("w1", server.url)
        thread.start()
        store = Store(client, cfg.run_id)
        wait_for(lambda: store.state()["results_applied"] >= 5, 60, what="results before the outage",
                 on_fail=procs.logs)
        server.stop()
        time.sleep(6.0)
        server = RedisServer(port=port, directory=data, appendonly=True, extra_args=AOF_ARGS).start()
        thread.join(120)
        assert outcome == ["finished"], (outcome, procs.logs())
        out = check_exactly_once(client, store)
        assert out["state"]["steps"] >= 1200
        text = caplog.text
        assert f"scheduler of run {cfg.run_id} waits for Redis" in text and f"scheduler of run {cfg.run_id} resumes" in text
        assert f"run {cfg.run_id}: resumed at version" in text  # state re-read from Redis, as after a restart
    finally:
        sched.stop_event.set()
        thread.join(10)
        server.cleanup()
