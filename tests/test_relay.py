"""The host relay (workers/relay.py): what it copies onto the host, and a whole run whose workers,
started by `aesrl-queue worker`, read their versions from it."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from aesrl_queue.config import RunConfig
from aesrl_queue.connection import connect
from aesrl_queue.redis_server import RedisServer
from aesrl_queue.store import Store, live_relays, live_workers
from tests.conftest import wait_for
from tests.faults import check_exactly_once
from workers.relay import Relay


@pytest.fixture()
def local(tmp_path):
    server = RedisServer(directory=tmp_path / "local").start()
    c = connect(server.url)
    yield c
    c.close()
    server.cleanup()


def _run(client, run_id: str, algo: str) -> tuple[Store, RunConfig]:
    cfg = RunConfig.from_preset("AesrlNull-v0", algo=algo, run_id=run_id, hidden=(8, 8),
                                env_kwargs={"episode_len": 5}).resolve()
    store = Store(client, run_id)
    assert store.write_config(cfg)
    store.set_state(status="running")
    return store, cfg


def _publish(store: Store, cfg: RunConfig, version: int) -> None:
    store.publish_dist(version, np.full(cfg.actor_dim, version, np.float32), np.full(cfg.actor_dim, 1e-3, np.float32))
    store.set_state(version=version)


def _episode(cfg: RunConfig, n: int) -> dict[str, np.ndarray]:
    return {"obs": np.ones((n, cfg.obs_dim), np.float32), "act": np.zeros((n, cfg.act_dim), np.float32),
            "rew": np.zeros(n, np.float32), "next_obs": np.zeros((n, cfg.obs_dim), np.float32),
            "done": np.zeros(n, np.float32)}


def test_relay_copies_versions_critic_and_the_replay_of_rl_runs_only(client, local):
    es, es_cfg = _run(client, "relay-es", "es")
    rl, rl_cfg = _run(client, "relay-rl", "aesrl")
    for store, cfg in ((es, es_cfg), (rl, rl_cfg)):
        _publish(store, cfg, 3)
        store.append_episode(_episode(cfg, 4), "j1")
    rl.publish_critic(2, {"critic": np.full(10, 2.0, np.float32)})
    relay = Relay(client, local)
    relay.step()
    for store in (es, rl):
        assert local.get(store.key("config")) == client.get(store.key("config"))
        assert store.dist_blobs(3, client=local) == store.dist_blobs(3)
        assert store.current_version(client=local) == 3
    assert rl.critic_blob(client=local) == rl.critic_blob()
    assert local.xlen(rl.key("replay")) == 1 and local.xlen(es.key("replay")) == 0
    # The next version is copied on the next look, and only it; the replay follows entry by entry.
    _publish(rl, rl_cfg, 4)
    ids = [rl.append_episode(_episode(rl_cfg, 4), f"j{i}") for i in range(2, 5)]
    relay.step()
    assert rl.dist_blobs(4, client=local) == rl.dist_blobs(4)
    assert [i.decode() for i, _f in local.xrange(rl.key("replay"))][-3:] == ids
    # Only what a replay mirror decodes crosses to the host: 4 observations, not the whole episode.
    entry = local.xrange(rl.key("replay"))[-1][1]
    assert set(entry) == {b"len", b"job", b"obs"}
    assert rl.decode_episode("x", entry, obs_only=True)["obs"].shape == (4, rl_cfg.obs_dim)
    # What the primary dropped is dropped on the host with the next copy.
    client.xtrim(rl.key("replay"), minid=ids[1], approximate=False)
    ids.append(rl.append_episode(_episode(rl_cfg, 4), "j5"))
    relay.step()
    assert [i.decode() for i, _f in local.xrange(rl.key("replay"))] == ids[1:]
    assert relay.stats["versions"] == 3 and relay.stats["critics"] == 1
    # A finished run is no longer followed.
    es.set_state(status="finished")
    relay._runs_at = -1e9
    relay.step()
    assert "relay-es" not in relay.runs and "relay-rl" in relay.runs


def test_a_running_relay_heartbeats_and_status_lists_it(client, local):
    """The relay says what its host holds, after each look that went through; `status` shows it."""
    import threading

    from cli.report import gather, render

    store, cfg = _run(client, "relay-beat", "es")
    _publish(store, cfg, 2)
    stop = threading.Event()
    relay = Relay(client, local, stop=stop)
    thread = relay.start()
    try:
        wait_for(lambda: int(live_relays(client).get(relay.name, {}).get("versions", 0)) >= 1, timeout=10,
                 what="a relay heartbeat naming one copied version")
        beat = live_relays(client)[relay.name]
        assert int(beat["runs"]) >= 1 and int(beat["errors"]) == 0 and float(beat["mb"]) >= 0
        status = gather(client, "relay-beat")
        mine = [r for r in status["relays"] if r["name"] == relay.name]
        assert len(mine) == 1 and mine[0]["versions"] >= 1 and mine[0]["looked_s"] is not None
        assert re.search(r"relays \d+ .*\n(.*\n)*.* versions \d+ ", render(status))
    finally:
        stop.set()
        thread.join(timeout=5)


@pytest.mark.slow
def test_workers_started_by_the_worker_command_read_through_their_relay(redis_url, client, procs, tmp_path):
    procs.cli("workers", "worker", "--redis-url", redis_url, "--processes", "2")
    wait_for(lambda: len(live_workers(client)) == 2, 90, what="both workers", on_fail=procs.logs)
    found = re.search(r"relay on (redis://\S+)", procs.log("workers"))
    assert found, procs.log("workers")
    local = connect(found.group(1))
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"env_id": "AesrlSleep-v0", "env_kwargs": {"episode_len": 50, "mean_s": 0.05},
                               "mean_eval_episodes": 1}))
    procs.cli("scheduler", "scheduler", "start", "--redis-url", redis_url, "--config", str(cfg), "--algo", "es",
              "--run-id", "relay-run", "--steps", "2000", "--hidden", "8,8")
    store = Store(client, "relay-run")
    wait_for(lambda: store.exists() and store.status() == "finished", 180, interval=0.5,
             what="the run to finish", on_fail=procs.logs)
    check_exactly_once(client, store)
    # Every μ/var the workers read came through the relay; the ES run's replay did not.
    assert local.info("stats")["keyspace_hits"] >= 10
    assert local.xlen(store.key("replay")) == 0
    local.close()
