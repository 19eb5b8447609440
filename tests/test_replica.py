"""Read replicas: a primary and a replica on loopback (real redis-servers, real replication).

A job's version is decided on the primary; its bytes come from the replica when the replica has
them, after a bounded wait when it lags, and from the primary otherwise — never another version.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import redis

from aesrl_queue import codec
from aesrl_queue.config import RunConfig
from aesrl_queue.connection import connect
from aesrl_queue.redis_server import RedisServer
from aesrl_queue.store import Store, live_workers
from tests.conftest import ROOT, child_env, wait_for
from workers import jobs, replica

RUN = "replica-test"


@pytest.fixture()
def pair(tmp_path):
    """(primary, replica) servers; the replica has finished its first sync."""
    # No 5 s wait before the first (diskless) full sync.
    primary = RedisServer(directory=tmp_path / "primary", extra_args=["--repl-diskless-sync-delay", "0"]).start()
    rep = RedisServer(directory=tmp_path / "replica",
                      extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    rc = connect(rep.url)
    wait_for(lambda: rc.info("replication").get("master_link_status") == "up", 20, what="the replica's first sync")
    rc.close()
    yield primary, rep
    rep.cleanup()
    primary.cleanup()


@pytest.fixture()
def clients(pair):
    primary, rep = pair
    p, r = connect(primary.url), connect(rep.url)
    yield p, r
    p.close()
    r.close()


def _synced(p, r) -> bool:
    return r.info("replication").get("master_repl_offset", -1) >= p.info("replication")["master_repl_offset"]


def _detach(r) -> None:
    """Stop the replica from applying the primary's stream: from now on it lags."""
    r.execute_command("REPLICAOF", "NO", "ONE")


def _attach(r, port: int) -> None:
    r.execute_command("REPLICAOF", "127.0.0.1", str(port))


def _run(p, version: int = 4, critic: int = 0) -> tuple[Store, RunConfig]:
    cfg = RunConfig.from_preset("AesrlNull-v0", algo="es", rl_ratio=0.0, hidden=(8, 8), run_id=RUN,
                                env_kwargs={"episode_len": 5}).resolve()
    store = Store(p, RUN)
    assert store.write_config(cfg)
    _publish(store, cfg, version)
    if critic:
        store.publish_critic(critic, {"critic": np.full(10, critic, np.float32)})
    return store, cfg


def _mu(cfg: RunConfig, version: int) -> np.ndarray:
    return np.full(cfg.actor_dim, float(version), np.float32)


def _publish(store: Store, cfg: RunConfig, version: int) -> None:
    pipe = store.r.pipeline()
    store.publish_dist(version, _mu(cfg, version), np.full(cfg.actor_dim, 1e-3, np.float32), pipe=pipe)
    store.set_state(pipe=pipe, version=version)
    pipe.execute()


def _context(p, monkeypatch, url: str, wait_s: float) -> jobs._RunContext:
    monkeypatch.setenv(replica.READ_URL_ENV, url)
    monkeypatch.setenv(replica.WAIT_ENV, str(wait_s))
    replica._READERS.clear()
    ctx = jobs._RunContext(p, RUN)
    assert ctx.reader.replica is not None and ctx.reader.wait_s == wait_s
    return ctx


def _begin(ctx: jobs._RunContext, job: str):
    ctx.store.add_inflight(job, {"kind": "es", "version": 0, "seed": 1})
    return ctx.begin(job, codec.pack({"worker": "test", "t": time.time()}))


def test_reads_come_from_the_replica_when_it_is_in_sync(pair, clients, monkeypatch):
    p, r = clients
    store, cfg = _run(p, version=4)
    wait_for(lambda: _synced(p, r), 60, what="replication")
    ctx = _context(p, monkeypatch, pair[1].url, wait_s=0.5)
    assert ctx.cfg.spec_hash == cfg.spec_hash  # the config is read from the primary (never an earlier run's)
    version, mu, var = _begin(ctx, "j1")
    assert version == 4 and np.array_equal(mu, _mu(cfg, 4))
    assert ctx.reader.stats["replica"] == 1 and ctx.reader.stats["primary"] == 0, ctx.reader.stats
    # The job is registered on the primary with the version it uses (the scheduler keeps it).
    assert p.hget(store.key("refs"), "j1") == b"4"


def test_a_lagging_replica_never_serves_an_older_version(pair, clients, monkeypatch):
    p, r = clients
    store, cfg = _run(p, version=4)
    wait_for(lambda: _synced(p, r), 60, what="replication")
    ctx = _context(p, monkeypatch, pair[1].url, wait_s=0.2)
    _detach(r)
    _publish(store, cfg, 5)  # the replica still has version 4 as current and no dist:5
    assert int(r.hget(store.key("state"), "version")) == 4 and not r.exists(store.key("dist:5"))
    t0 = time.monotonic()
    version, mu, _var = _begin(ctx, "j2")
    waited = time.monotonic() - t0
    assert version == 5 and np.array_equal(mu, _mu(cfg, 5)), "the job must use the primary's version"
    assert ctx.reader.stats["primary"] == 1, ctx.reader.stats
    assert waited >= 0.15, waited  # it waited about wait_s for the replica, then read the primary
    # The mean evaluated after an RL job is read from the replica: older, but labelled as such.
    got_version, got_mu = ctx.read_current_mu()
    assert got_version == 4 and np.array_equal(got_mu, _mu(cfg, 4))


def test_a_job_waits_for_its_version_to_reach_the_replica(pair, clients, monkeypatch):
    p, r = clients
    store, cfg = _run(p, version=4)
    wait_for(lambda: _synced(p, r), 60, what="replication")
    ctx = _context(p, monkeypatch, pair[1].url, wait_s=10.0)
    _detach(r)
    _publish(store, cfg, 6)
    # The replica catches up (partial resync) 0.3 s after the job has started waiting.
    threading.Timer(0.3, _attach, args=(connect(pair[1].url), pair[0].port)).start()
    version, mu, _var = _begin(ctx, "j3")
    assert version == 6 and np.array_equal(mu, _mu(cfg, 6))
    stats = ctx.reader.stats
    assert stats["waited"] == 1 and stats["primary"] == 0, stats  # served by the replica after a wait
    assert r.exists(store.key("dist:6"))


def test_a_waiting_job_is_woken_by_the_announcement_of_its_version_not_by_polling(pair, clients, monkeypatch):
    """The scheduler PUBLISHes v after the commit that writes dist:{v}; a job whose version is not on the replica yet
    waits for that announcement (with a 0.1 s backstop) instead of asking the replica every few ms."""
    p, r = clients
    store, cfg = _run(p, version=4)
    wait_for(lambda: _synced(p, r), 60, what="replication")
    ctx = _context(p, monkeypatch, pair[1].url, wait_s=3.0)
    _detach(r)  # from here the test plays the replication stream by hand
    _publish(store, cfg, 5)  # named on the primary, not yet on the replica

    def hmgets() -> int:
        return int(r.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0))

    def arrives() -> None:  # 0.6 s after the job's first look at the replica
        wait_for(lambda: hmgets() > before, 10, interval=0.005, what="the job's first look")
        time.sleep(0.6)
        r.hset(store.key("dist:5"), mapping=p.hgetall(store.key("dist:5")))
        r.publish(store.key("versions"), 5)

    before = hmgets()
    threading.Thread(target=arrives, daemon=True).start()
    t0 = time.monotonic()
    version, mu, _var = _begin(ctx, "j9")
    waited = time.monotonic() - t0
    assert version == 5 and np.array_equal(mu, _mu(cfg, 5))
    assert ctx.reader.stats["primary"] == 0 and ctx.reader.stats["waited"] == 1  # the replica served it
    assert waited >= 0.55, waited  # it waited for the version (how long is bench territory)
    # 0.6 s: the first look, ~6 backstop looks and the one after the announcement, where polling every
    # 1-20 ms asked ~35 times
    assert hmgets() - before <= 12, hmgets() - before


def test_critic_is_at_least_the_version_the_primary_named(pair, clients, monkeypatch):
    p, r = clients
    store, cfg = _run(p, version=1, critic=1)
    wait_for(lambda: _synced(p, r), 60, what="replication")
    ctx = _context(p, monkeypatch, pair[1].url, wait_s=0.1)
    _detach(r)
    store.publish_critic(2, {"critic": np.full(10, 2.0, np.float32)})
    _begin(ctx, "j4")
    assert ctx.critic_named == 2
    version, blob = ctx.reader.critic(store, at_least=ctx.critic_named, tag=ctx.token)
    assert version == 2 and codec.unpack(blob)["critic"][0] == 2.0  # not the replica's version 1
    assert ctx.reader.stats["primary"] >= 1


def test_a_dead_replica_falls_back_and_is_bypassed(pair, clients, monkeypatch):
    p, r = clients
    store, cfg = _run(p, version=3)
    wait_for(lambda: _synced(p, r), 60, what="replication")
    ctx = _context(p, monkeypatch, pair[1].url, wait_s=0.1)
    pair[1].stop(kill=True)
    for i in range(replica.BYPASS_AFTER + 2):
        version, mu, _var = _begin(ctx, f"j{10 + i}")
        assert version == 3 and np.array_equal(mu, _mu(cfg, 3))
    stats = ctx.reader.stats
    assert stats["errors"] == replica.BYPASS_AFTER, stats  # then it stops trying for a while
    assert not ctx.reader.usable()
    # Skipped for failing (not for lagging), it is not tried for the replay either.
    store.append_episode({"obs": np.ones((4, cfg.obs_dim), np.float32), "act": np.zeros((4, cfg.act_dim), np.float32),
                          "rew": np.zeros(4, np.float32), "next_obs": np.zeros((4, cfg.obs_dim), np.float32),
                          "done": np.zeros(4, np.float32)}, "e0")
    assert ctx.sync_mirror() == 4 and ctx.reader.stats["errors"] == replica.BYPASS_AFTER


def test_a_copy_behind_is_skipped_briefly_and_longer_while_it_stays_behind(clients, monkeypatch):
    """Lag (the copy answers without the key) skips it for LAG_BYPASS_S, doubling while misses go on,
    back to LAG_BYPASS_S after a hit; a copy that fails to answer is skipped for BYPASS_S."""
    p, _r = clients
    monkeypatch.setattr(replica, "LAG_BYPASS_S", 0.2)
    copy = redis.Redis(host="127.0.0.1", port=p.connection_pool.connection_kwargs["port"], db=15)  # a keyspace apart
    reader = replica.ReplicaReader(p, copy, wait_s=0.01)
    p.set("lag-key", b"v")

    def get(c):
        return c.get("lag-key")

    def left() -> float:
        return reader._bypass_until - time.monotonic()

    for _ in range(replica.BYPASS_AFTER):
        assert reader.wait_for(get, "lag-key") == b"v"  # from the primary
    assert not reader.usable() and 0 < left() <= 0.2
    time.sleep(0.25)
    assert reader.usable() and reader.wait_for(get, "lag-key") == b"v"  # one more miss: skipped again,
    assert 0.2 < left() <= 0.4  # twice as long
    reader.replica.set("lag-key", b"v")  # the copy caught up: the next read after the skip is a hit
    time.sleep(0.45)
    hits = reader.stats["replica"]
    assert reader.wait_for(get, "lag-key") == b"v" and reader.stats["replica"] == hits + 1
    assert reader._lag_bypass_s == 0.2
    reader.replica.delete("lag-key")
    dead = replica.ReplicaReader(p, redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2), wait_s=0.01)
    for _ in range(replica.BYPASS_AFTER):
        assert dead.wait_for(get, "lag-key") == b"v"
    assert dead._bypass_until - time.monotonic() > replica.BYPASS_S - 1


def test_a_replica_skipped_for_lagging_still_serves_the_replay(pair, clients, monkeypatch):
    """Versions a lagging copy lacks come from the primary, and after BYPASS_AFTER of them in a row the
    copy is skipped; the replay (append-only) is still read from it: fewer entries, the rest later,
    never a whole catch-up from the primary."""
    p, r = clients
    store, cfg = _run(p, version=3)
    ep = {"obs": np.ones((4, cfg.obs_dim), np.float32), "act": np.zeros((4, cfg.act_dim), np.float32),
          "rew": np.zeros(4, np.float32), "next_obs": np.zeros((4, cfg.obs_dim), np.float32),
          "done": np.zeros(4, np.float32)}
    old = [store.append_episode(ep, f"e{i}") for i in range(3)]
    wait_for(lambda: _synced(p, r), 60, what="replication")
    ctx = _context(p, monkeypatch, pair[1].url, wait_s=0.05)
    _detach(r)
    new = [store.append_episode(ep, f"n{i}") for i in range(2)]
    for i in range(replica.BYPASS_AFTER):
        _publish(store, cfg, 4 + i)  # not on the copy: each job reads its version from the primary
        assert _begin(ctx, f"j{20 + i}")[0] == 4 + i
    assert not ctx.reader.usable(), ctx.reader.stats
    before = dict(ctx.reader.stats)
    assert ctx.sync_mirror() == 3 * 4  # what the copy holds: the three old episodes only
    last = ctx.mirror_last.decode() if isinstance(ctx.mirror_last, bytes) else ctx.mirror_last
    assert last == old[-1]
    assert ctx.reader.stats["replica"] > before["replica"] and ctx.reader.stats["primary"] == before["primary"]
    _attach(r, pair[0].port)  # the copy catches up: the next job's mirror takes the rest from it
    wait_for(lambda: _synced(p, r), 60, what="replication")
    assert ctx.sync_mirror() == len(new) * 4 and len(ctx.mirror) == (len(old) + len(new)) * 4
    assert ctx.reader.stats["primary"] == before["primary"]


def test_worker_cli_refuses_a_read_url_that_is_not_a_replica(pair):
    primary, _rep = pair
    out = subprocess.run([sys.executable, "-m", "cli.main", "worker", "--redis-url", primary.url, "--read-url",
                          primary.url, "-n", "1"], capture_output=True, text=True, env=child_env(), cwd=ROOT,
                         timeout=60)
    assert out.returncode == 2, out.stderr
    assert "not a replica" in out.stderr and "--replicaof" in out.stderr


@pytest.mark.slow
def test_rq_workers_reading_a_replica_run_a_whole_run(pair, clients, procs, monkeypatch, tmp_path):
    """Scheduler and results on the primary, one worker reading μ/var from the replica, one not."""
    primary, rep = pair
    p, r = clients
    procs.rq_worker("plain", primary.url)
    monkeypatch.setenv(replica.READ_URL_ENV, rep.url)
    procs.rq_worker("replica-reader", primary.url)
    monkeypatch.delenv(replica.READ_URL_ENV)
    wait_for(lambda: len(live_workers(p)) == 2, 90, what="both workers", on_fail=procs.logs)
    hits0 = r.info("stats")["keyspace_hits"]
    cfg = tmp_path / "run.json"  # 40 jobs of ~0.1 s: both workers take a share
    cfg.write_text(json.dumps({"env_id": "AesrlSleep-v0", "env_kwargs": {"episode_len": 50, "mean_s": 0.1},
                               "mean_eval_episodes": 1}))
    procs.cli("scheduler", "scheduler", "start", "--redis-url", primary.url, "--config", str(cfg), "--algo", "es",
              "--run-id", RUN, "--steps", "2000", "--hidden", "8,8")
    store = Store(p, RUN)
    wait_for(lambda: store.exists() and store.status() == "finished", 120, interval=0.5,
             what="the run to finish", on_fail=procs.logs)
    st = store.state()
    history = [h for _i, h in store.history()]
    assert len(history) == st["results_applied"] > 0
    workers = {h["worker"] for h in history}
    assert len(workers) == 2, workers  # both workers contributed results
    # The reading worker's dist:{v} reads were served by the replica.
    assert r.info("stats")["keyspace_hits"] - hits0 >= 5
    assert "not a replica" not in procs.log("replica-reader")
