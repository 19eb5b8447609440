"""The Redis schema of one run (docs/architecture.md) against a real redis-server: writes, reads, validation, trims."""

from __future__ import annotations

import math
import pickle
import time

import numpy as np
import pytest

from aesrl_queue import codec
from aesrl_queue.codec import CodecError
from aesrl_queue.config import RunConfig
from aesrl_queue.store import (
    RUNS_KEY,
    STATE_INTS,
    WORKER_KEY,
    WORKER_TTL,
    WORKERS_KEY,
    Store,
    decode_result,
    list_runs,
    live_workers,
    worker_ages,
    worker_beat,
    worker_gone,
)


def make_cfg(run_id: str = "r1", **overrides) -> RunConfig:
    return RunConfig.from_preset("AesrlNull-v0", run_id=run_id, **overrides).resolve()


@pytest.fixture()
def store(client) -> Store:
    s = Store(client, "r1")
    assert s.write_config(make_cfg("r1", replay_capacity=500))
    return s


def mark_started(store: Store, job: str, worker: str, host: str, pid: int) -> None:
    """The `started` entry a worker's start-job script writes, without the script's other effects."""
    store.r.hset(store.key("started"), job, codec.pack({"worker": worker, "host": host, "pid": pid, "t": time.time()}))


def episode(n: int, cfg: RunConfig, start: float = 0.0) -> dict[str, np.ndarray]:
    base = start + np.arange(n, dtype=np.float32)
    return {
        "obs": np.repeat(base[:, None], cfg.obs_dim, axis=1),
        "act": np.repeat(-base[:, None], cfg.act_dim, axis=1) / 100,
        "rew": base * 0.5,
        "next_obs": np.repeat(base[:, None] + 1, cfg.obs_dim, axis=1),
        "done": (np.arange(n) == n - 1).astype(np.float32),
    }


# -- config and runs ---------------------------------------------------------------------------------
def test_write_config_is_once_only_and_lists_the_run(client) -> None:
    cfg = make_cfg("r1")
    s = Store(client, "r1")
    assert not s.exists()
    assert s.write_config(cfg) is True
    assert s.exists()
    other = make_cfg("r1", seed=99, total_steps=5)
    assert s.write_config(other) is False
    # A fresh Store reads what the first write stored, not the second.
    stored = Store(client, "r1").config()
    assert stored == cfg and stored.seed == 0 and stored.spec_hash == cfg.spec_hash
    runs = dict(list_runs(client))
    assert list(runs) == ["r1"] and runs["r1"] == pytest.approx(cfg.created_at)
    assert s.status() == "created"


def test_config_of_a_missing_or_corrupt_run_raises_codec_error(client) -> None:
    with pytest.raises(CodecError, match="'nope' has no config"):
        Store(client, "nope").config()
    client.set("aesrl:bad:config", pickle.dumps({"env_id": "x"}))
    with pytest.raises(CodecError, match="pickle"):
        Store(client, "bad").config()


def test_state_types(store: Store) -> None:
    st = store.state()
    assert st["status"] == "created"
    for name in STATE_INTS:
        assert st[name] == 0 and type(st[name]) is int
    store.set_state(version=3, f_mu=-12.5, best_fitness=float("nan"), started_at=1.5, note="hi", n_rl=True)
    store.incr("steps", 40)
    store.incr("steps", 2)
    st = store.state()
    assert st["version"] == 3 and type(st["version"]) is int
    assert st["f_mu"] == -12.5 and type(st["f_mu"]) is float
    assert math.isnan(st["best_fitness"])
    assert st["started_at"] == 1.5 and st["note"] == "hi" and st["n_rl"] == 1 and st["steps"] == 42
    assert store.current_version() == 3 and store.state_field("steps") == 42
    assert store.state_field("missing", default=-1) == -1
    store.set_state(status="running", updated_at=time.time())
    assert store.status() == "running" and isinstance(store.state()["updated_at"], float)
    with pytest.raises(ValueError, match="status 'paused'"):
        store.set_state(status="paused")
    store.set_state(note=None, finished_at=None)  # None removes a field (and an absent one is fine)
    assert "note" not in store.state() and store.state()["status"] == "running"
    # A field that should be a number but is not is left out, not raised.
    store.r.hset(store.key("state"), "f_mu", "garbage")
    assert "f_mu" not in store.state()


# -- distribution versions ---------------------------------------------------------------------------
def test_publish_and_read_dist_round_trip(store: Store) -> None:
    dim = store.config().actor_dim
    mu = np.linspace(-1, 1, dim)
    var = np.full(dim, 1e-3)
    store.publish_dist(4, mu, var)
    got_mu, got_var = store.read_dist(4)
    assert got_mu.dtype == np.float32 and got_mu.shape == (dim,)
    np.testing.assert_allclose(got_mu, mu, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got_var, var, rtol=1e-6)
    got_mu[0] = 5.0  # writable
    store.drop_dists([4], ttl=30)
    assert 0 < store.r.ttl(store.key("dist:4")) <= 30
    store.drop_dists([4])
    assert not store.r.exists(store.key("dist:4"))


def test_read_dist_of_a_missing_version_names_it(store: Store) -> None:
    with pytest.raises(CodecError, match="version 17") as err:
        store.read_dist(17)
    assert "r1" in str(err.value)


def test_read_dist_rejects_truncated_zero_and_non_finite_blobs(store: Store) -> None:
    dim = store.config().actor_dim
    store.publish_dist(1, np.zeros(dim), np.full(dim, 1e-3))
    good = store.r.hget(store.key("dist:1"), "mu")
    store.r.hset(store.key("dist:1"), "mu", good[:-4])
    with pytest.raises(CodecError, match=rf"dist:1 mu has {dim - 1} values, expected {dim}"):
        store.read_dist(1)
    store.r.hset(store.key("dist:1"), "mu", good[:-1])
    with pytest.raises(CodecError, match="not a multiple"):
        store.read_dist(1)

    var = np.full(dim, 1e-3)
    var[5] = 0.0
    store.publish_dist(2, np.zeros(dim), var)
    with pytest.raises(CodecError, match="dist:2 var holds non-positive"):
        store.read_dist(2)
    var[5] = np.nan
    store.publish_dist(3, np.zeros(dim), var)
    with pytest.raises(CodecError, match="dist:3 var holds 1 non-finite"):
        store.read_dist(3)
    store.r.hset(store.key("dist:4"), mapping={"mu": pickle.dumps(np.zeros(dim, np.float32)), "var": good})
    with pytest.raises(CodecError, match="pickle"):
        store.read_dist(4)


# -- replay ------------------------------------------------------------------------------------------
def test_append_episode_counts_exactly_and_trims_whole_episodes(store: Store) -> None:
    cfg = store.config()
    assert cfg.replay_capacity == 500
    ids = []
    for i in range(5):
        ids.append(store.append_episode(episode(200, cfg, start=1000 * i), job=f"j{i}", extra_interactions=7))
        st = store.state()
        assert st["steps"] == 200 * (i + 1)
        assert st["interactions"] == 207 * (i + 1)
        assert st["replay_held"] <= cfg.replay_capacity
    assert store.r.xlen(store.key("replay")) == 2
    st = store.state()
    assert st["replay_held"] == 400 and st["steps"] == 1000
    # The two newest episodes are the ones kept, whole.
    rows = store.read_stream("replay")
    assert [i for i, _ in rows] == ids[3:]
    ep = store.decode_episode(*rows[0])
    assert ep["obs"].shape == (200, cfg.obs_dim) and ep["obs"][0, 0] == 3000.0
    assert store.r.llen(store.key("replay:index")) == 2


def test_append_episode_refuses_non_finite_transitions_and_stores_nothing(store: Store) -> None:
    cfg = store.config()
    store.append_episode(episode(10, cfg), job="ok")
    for name, bad in (("rew", np.nan), ("obs", np.inf), ("next_obs", -np.inf)):
        tr = episode(10, cfg)
        tr[name][3] = bad
        with pytest.raises(ValueError, match=f"{name} holds non-finite"):
            store.append_episode(tr, job="bad", extra_interactions=5)
    assert store.r.xlen(store.key("replay")) == 1
    st = store.state()
    assert st["steps"] == 10 and st["interactions"] == 10 and st["replay_held"] == 10


def test_finish_job_stores_the_episode_or_only_counts_it(store: Store) -> None:
    cfg = store.config()
    res = {"kind": "es", "version": 0, "seed": 1, "len": 10}
    kept = store.finish_job(episode(30, cfg), "j1", {"job": "j1", "fitness": 1.5, **res}, extra_interactions=4)
    counted = store.finish_job(episode(20, cfg), "j2", {"job": "j2", "fitness": 2.5, **res}, keep=False)
    assert store.r.xlen(store.key("replay")) == 1
    st = store.state()
    assert (st["steps"], st["interactions"], st["replay_held"]) == (50, 54, 30)
    results = store.read_stream("results")
    assert [i for i, _ in results] == [kept, counted]
    got = [decode_result(i, f) for i, f in results]
    assert [(r.steps, r.interactions, r.fitness) for r in got] == [(30, 34, 1.5), (50, 54, 2.5)]


def test_start_job_names_the_version_and_its_blobs_stay(store: Store) -> None:
    dim = store.config().actor_dim
    store.publish_dist(3, np.full(dim, 0.5, np.float32), np.full(dim, 2.0, np.float32))
    store.set_state(version=3)
    store.add_inflight("j1", {"kind": "es", "version": 3, "seed": 1})
    got = store.start_job("j1", b"info")
    assert int(got[0]) == 3 and got[1] is None  # no critic published yet
    assert store.r.hget(store.key("refs"), "j1") == b"3"
    mu, var = store.dist_blobs(int(got[0]))
    assert codec.decode_array(mu, size=dim)[0] == 0.5 and codec.decode_array(var, size=dim)[-1] == 2.0
    assert store.start_job("gone", b"info") is None


def test_decode_episode_round_trip_and_read_after(store: Store) -> None:
    cfg = store.config()
    tr = episode(6, cfg, start=2.0)
    first = store.append_episode(tr, job="j1")
    second = store.append_episode(episode(4, cfg), job="j2")
    rows = store.read_stream("replay")
    assert [i for i, _ in rows] == [first, second]
    ep = store.decode_episode(*rows[0])
    for name in ("obs", "act", "next_obs"):
        np.testing.assert_array_equal(ep[name], tr[name].astype(np.float32))
    assert ep["rew"].shape == (6,) and ep["done"].shape == (6,)
    np.testing.assert_array_equal(ep["rew"], tr["rew"])
    assert ep["done"][-1] == 1.0 and ep["done"][:-1].sum() == 0
    assert set(store.decode_episode(*rows[0], obs_only=True)) == {"obs"}
    assert [i for i, _ in store.read_stream("replay", after=first)] == [second]
    assert store.read_stream("replay", after=second) == []
    assert [i for i, _ in store.read_stream("replay", after="0-0", block_ms=100)] == [first, second]
    t0 = time.monotonic()
    assert store.read_stream("replay", after=second, block_ms=200) == []
    assert time.monotonic() - t0 >= 0.15


def test_decode_episode_validates_sizes(store: Store) -> None:
    cfg = store.config()

    def f4(n: int) -> bytes:
        return np.zeros(n, np.float32).tobytes()

    good = {"len": 5, "obs": f4(5 * cfg.obs_dim), "act": f4(5 * cfg.act_dim), "rew": f4(5),
            "next_obs": f4(5 * cfg.obs_dim), "done": f4(5)}
    key = store.key("replay")
    ok_id = store.r.xadd(key, good)
    assert store.decode_episode(ok_id, store.r.xrange(key)[0][1])["obs"].shape == (5, cfg.obs_dim)

    cases = {
        "short obs": ({**good, "obs": f4(5 * cfg.obs_dim - 1)}, "obs has 14 values, expected 15"),
        "long act": ({**good, "act": f4(6)}, "act has 6 values, expected 5"),
        "len lies": ({**good, "len": 4}, "expected 12"),
        "no len": ({k: v for k, v in good.items() if k != "len"}, "no valid 'len'"),
        "bad len": ({**good, "len": "five"}, "no valid 'len'"),
        "no rew": ({k: v for k, v in good.items() if k != "rew"}, "rew is missing"),
        "nan rew": ({**good, "rew": np.array([0, 0, np.nan, 0, 0], np.float32).tobytes()}, "non-finite"),
    }
    for label, (fields, message) in cases.items():
        entry = store.r.xadd(key, fields)
        raw = store.r.xrange(key, min=entry, max=entry)[0][1]
        with pytest.raises(CodecError, match=message) as err:
            store.decode_episode(entry, raw)
        assert entry.decode() in str(err.value), label


# -- results -----------------------------------------------------------------------------------------
def test_append_and_read_results(store: Store) -> None:
    a = store.append_result({"job": "j1", "kind": "es", "version": 3, "seed": 11, "fitness": -1.5, "len": 50,
                             "f_mu": -2.0, "f_mu_version": 2, "worker": "w1", "spec_hash": "abc",
                             "duration": 0.25}, extra_interactions=150)
    b = store.append_result({"job": "j2", "kind": "rl", "version": 4, "seed": 12, "fitness": float("nan"),
                             "status": "failed", "error": "boom", "ind": "aesrl:r1:ind:j2", "rl_steps": 10})
    assert store.state()["interactions"] == 150
    rows = store.read_stream("results")
    assert [i for i, _ in rows] == [a, b]
    r1 = decode_result(*rows[0])
    assert (r1.job, r1.kind, r1.status, r1.ok) == ("j1", "es", "ok", True)
    assert (r1.version, r1.seed, r1.fitness, r1.length, r1.f_mu, r1.f_mu_version) == (3, 11, -1.5, 50, -2.0, 2)
    assert (r1.worker, r1.spec_hash, r1.duration, r1.ind) == ("w1", "abc", 0.25, "")
    r2 = decode_result(*rows[1])
    assert r2.kind == "rl" and not r2.ok and r2.error == "boom" and r2.ind == "aesrl:r1:ind:j2"
    assert math.isnan(r2.fitness) and math.isnan(r2.f_mu) and r2.f_mu_version == -1
    assert [i for i, _ in store.read_stream("results", a)] == [b]
    assert [i for i, _ in store.read_stream("results", "0-0", block_ms=50)] == [a, b]
    assert store.read_stream("results", b, block_ms=50) == []


def test_decode_result_rejects_malformed_entries() -> None:
    good = {b"job": b"j", b"kind": b"es", b"version": b"1", b"seed": b"2", b"fitness": b"3.5"}
    assert decode_result(b"1-0", good).fitness == 3.5
    assert decode_result("1-0", {k.decode(): v.decode() for k, v in good.items()}).seed == 2
    inf = decode_result("1-0", {**good, b"fitness": b"inf"})
    assert inf.fitness == math.inf  # passes through: the scheduler rejects it
    cases = [
        ({k: v for k, v in good.items() if k != b"version"}, "has no field 'version'"),
        ({k: v for k, v in good.items() if k != b"seed"}, "has no field 'seed'"),
        ({k: v for k, v in good.items() if k != b"job"}, "has no field 'job'"),
        ({k: v for k, v in good.items() if k != b"kind"}, "kind '' is not es/rl"),
        ({**good, b"seed": b"abc"}, "field 'seed' is not a number"),
        ({**good, b"fitness": b"high"}, "field 'fitness' is not a number"),
        ({**good, b"version": b"nan"}, "field 'version' is not a number"),
        ({**good, b"len": b"1.5"}, "field 'len' is not a number"),
        ({**good, b"kind": b"ppo"}, "kind 'ppo' is not es/rl"),
        ({**good, b"status": b"maybe"}, "status 'maybe' is not ok/failed"),
    ]
    for fields, message in cases:
        with pytest.raises(CodecError, match=message) as err:
            decode_result(b"7-1", fields)
        assert "7-1" in str(err.value)


# -- individuals -------------------------------------------------------------------------------------
def test_put_and_get_individual(store: Store) -> None:
    dim = store.config().actor_dim
    z = np.arange(dim, dtype=np.float32) / dim
    key = store.put_individual("job-1", z, ttl=120)
    assert key == "aesrl:r1:ind:job-1"
    assert 0 < store.r.ttl(key) <= 120
    np.testing.assert_array_equal(store.get_individual(key), z)
    np.testing.assert_array_equal(store.get_individual("job-1"), z)  # by the job that stored it
    store.put_individual("job-2", z, ttl=0)
    assert store.r.ttl(store.key("ind:job-2")) > 0  # a TTL of 0 still expires: never kept forever


def test_get_individual_rejects_foreign_keys_and_bad_blobs(client, store: Store) -> None:
    dim = store.config().actor_dim
    other = Store(client, "r2")
    other.write_config(make_cfg("r2"))
    foreign = other.put_individual("job-1", np.zeros(dim), ttl=60)
    for key in (foreign, "aesrl:r1:config", store.key("dist:1"), "aesrl:r1x:ind:job-1"):
        with pytest.raises(CodecError, match="not an ind: key of run r1"):
            store.get_individual(key)
    store.r.set(store.key("ind:short"), np.zeros(dim - 1, np.float32).tobytes())
    with pytest.raises(CodecError, match=f"expected {dim}"):
        store.get_individual(store.key("ind:short"))
    with pytest.raises(CodecError, match="missing"):
        store.get_individual(store.key("ind:gone"))
    bad = np.zeros(dim, np.float32)
    bad[0] = np.nan
    store.r.set(store.key("ind:nan"), bad.tobytes())
    with pytest.raises(CodecError, match="1 non-finite"):
        store.get_individual(store.key("ind:nan"))


# -- critic ------------------------------------------------------------------------------------------
def test_publish_and_read_critic(store: Store) -> None:
    assert store.read_critic() is None and store.critic_version() == 0
    w = {"q1": np.arange(6, dtype=np.float32).reshape(2, 3), "target": np.ones(4, np.float32)}
    store.publish_critic(5, w)
    version, got = store.read_critic()
    assert version == 5 and store.critic_version() == 5
    assert set(got) == {"q1", "target"}
    np.testing.assert_array_equal(got["q1"], w["q1"])
    assert got["q1"].shape == (2, 3)


def test_read_critic_rejects_bad_weights(store: Store) -> None:
    store.publish_critic(1, {"q1": np.array([1.0, np.nan], np.float32)})
    with pytest.raises(CodecError, match="critic weight q1 holds non-finite"):
        store.read_critic()
    store.r.hset(store.key("critic"), mapping={"version": 2, "weights": codec.pack({"q1": [1.0, 2.0]})})
    with pytest.raises(CodecError, match="critic weight q1 should be an array"):
        store.read_critic()
    store.r.hset(store.key("critic"), "weights", pickle.dumps({"q1": np.zeros(2)}))
    with pytest.raises(CodecError, match="pickle"):
        store.read_critic()


def test_critic_checkpoint_round_trip(store: Store) -> None:
    assert store.load_checkpoint("critic") is None
    payload = {
        "critic": np.linspace(0, 1, 10, dtype=np.float32),
        "opt": {"state": {0: {"step": np.array(12.0, np.float32), "exp_avg": np.ones((2, 2), np.float32)}},
                "param_groups": [{"lr": 1e-3, "betas": [0.9, 0.999], "params": [0, 1]}]},
        "version": 7, "trained": 7000, "t": 123.5,
    }
    store.save_checkpoint("critic", payload)
    got = store.load_checkpoint("critic")
    np.testing.assert_array_equal(got["critic"], payload["critic"])
    step = got["opt"]["state"][0]["step"]
    assert step.shape == () and float(step) == 12.0
    assert got["opt"]["state"][0]["exp_avg"].shape == (2, 2)
    assert got["opt"]["param_groups"] == [{"lr": 1e-3, "betas": [0.9, 0.999], "params": [0, 1]}]
    assert (got["version"], got["trained"], got["t"]) == (7, 7000, 123.5)
    store.r.set(store.key("critic:ckpt"), b"\x93\x01")
    with pytest.raises(CodecError, match="critic checkpoint"):
        store.load_checkpoint("critic")


# -- jobs in flight ----------------------------------------------------------------------------------
def test_inflight_started_and_forget(store: Store) -> None:
    store.add_inflight("j1", {"kind": "es", "version": 1, "seed": 5, "deadline": 9.5})
    pipe = store.r.pipeline()
    store.add_inflight("j2", {"kind": "rl", "version": 2, "seed": 6}, pipe=pipe)
    assert not store.r.hexists(store.key("inflight"), "j2")
    pipe.execute()
    assert store.r.hexists(store.key("inflight"), "j2") and not store.r.hexists(store.key("inflight"), "j3")
    assert store.inflight() == {"j1": {"kind": "es", "version": 1, "seed": 5, "deadline": 9.5},
                                "j2": {"kind": "rl", "version": 2, "seed": 6}}
    mark_started(store, "j1", "w1", "host-a", 4242)
    started = store.started()
    assert set(started) == {"j1"} and started["j1"]["worker"] == "w1" and started["j1"]["pid"] == 4242
    assert started["j1"]["host"] == "host-a" and started["j1"]["t"] > 0

    # Malformed entries are dropped (and deleted), the rest is kept.
    store.r.hset(store.key("inflight"), "junk", b"\xc1")
    store.r.hset(store.key("started"), "junk", pickle.dumps({"a": 1}))
    assert set(store.inflight()) == {"j1", "j2"} and set(store.started()) == {"j1"}
    assert not store.r.hexists(store.key("inflight"), "junk")
    assert not store.r.hexists(store.key("started"), "junk")

    store.forget_jobs(["j1"])
    assert set(store.inflight()) == {"j2"} and store.started() == {}
    store.forget_jobs([])
    assert set(store.inflight()) == {"j2"}


# -- workers and runs --------------------------------------------------------------------------------
def test_live_workers_prunes_expired_heartbeats(client) -> None:
    client.sadd(WORKERS_KEY, "alive", "dying", "never")
    client.hset(WORKER_KEY.format(name="alive"), mapping={"host": "a", "pid": 1})
    client.expire(WORKER_KEY.format(name="alive"), 60)
    client.hset(WORKER_KEY.format(name="dying"), mapping={"host": "b", "pid": 2})
    client.expire(WORKER_KEY.format(name="dying"), 1)
    got = live_workers(client)
    assert set(got) == {"alive", "dying"} and got["alive"] == {"host": "a", "pid": "1"}
    assert {m.decode() for m in client.smembers(WORKERS_KEY)} == {"alive", "dying"}  # "never" pruned
    deadline = time.monotonic() + 5
    while client.exists(WORKER_KEY.format(name="dying")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(live_workers(client)) == {"alive"}
    assert {m.decode() for m in client.smembers(WORKERS_KEY)} == {"alive"}
    client.delete(WORKERS_KEY, WORKER_KEY.format(name="alive"))
    assert live_workers(client) == {}


def test_worker_heartbeat_is_written_aged_and_removed(client) -> None:
    worker_beat(client, "w9", {"host": "h", "pid": 7})
    assert live_workers(client) == {"w9": {"host": "h", "pid": "7"}}
    [age] = worker_ages(client, ["w9"])
    assert 0.0 <= age <= WORKER_TTL
    assert worker_ages(client, ["nobody"]) == [None] and worker_ages(client, []) == []
    worker_gone(client, "w9")
    assert live_workers(client) == {} and not client.exists(WORKER_KEY.format(name="w9"))
    assert not client.sismember(WORKERS_KEY, "w9")


def test_history_from_an_entry_on_or_the_newest(store: Store) -> None:
    for i in range(5):
        store.append_history({"i": i})
    store.r.xadd(store.key("history"), {"d": b"\xc1"})  # malformed: skipped by every read
    rows = store.history()
    assert [h["i"] for _, h in rows] == [0, 1, 2, 3, 4]
    assert [h["i"] for _, h in store.history(count=2)] == [0, 1]
    assert [h["i"] for _, h in store.history(after=rows[3][0])] == [3, 4]
    assert [h["i"] for _, h in store.history(count=3, newest=True)] == [3, 4]  # the malformed one was newest
    with pytest.raises(ValueError, match="history"):
        store.read_stream("history")


def test_delete_removes_every_key_of_the_run_and_nothing_else(client) -> None:
    stores = {}
    for run in ("r1", "r10", "r1-b"):  # prefixes of each other, but distinct runs
        s = Store(client, run)
        cfg = make_cfg(run, replay_capacity=500)
        s.write_config(cfg)
        s.publish_dist(1, np.zeros(cfg.actor_dim), np.ones(cfg.actor_dim))
        s.append_episode(episode(5, cfg), job="j")
        s.append_result({"job": "j", "kind": "es", "version": 1, "seed": 1})
        s.put_individual("j", np.zeros(cfg.actor_dim), ttl=60)
        s.publish_critic(1, {"w": np.zeros(2, np.float32)})
        s.save_checkpoint("critic", {"v": 1})
        s.add_inflight("j", {"kind": "es"})
        mark_started(s, "j", "w", "h", 1)
        stores[run] = s
    client.sadd(WORKERS_KEY, "w1")
    client.hset(WORKER_KEY.format(name="w1"), "pid", 1)
    client.set("unrelated", "1")
    before = {k.decode() for k in client.keys("*")}
    r1_keys = {k for k in before if k.startswith("aesrl:r1:")}
    assert len(r1_keys) >= 11  # config state dist:1 replay replay:index results ind:j critic ckpt inflight started

    n = stores["r1"].delete()
    assert n == len(r1_keys)
    after = {k.decode() for k in client.keys("*")}
    assert after == before - r1_keys
    assert not stores["r1"].exists()
    assert {r for r, _ in list_runs(client)} == {"r10", "r1-b"}
    assert stores["r10"].config().run_id == "r10" and stores["r1-b"].state()["steps"] == 5
    assert client.zscore(RUNS_KEY, "r1") is None
    assert Store(client, "r1").delete() == 0  # deleting again is harmless
