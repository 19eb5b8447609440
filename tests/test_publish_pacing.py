"""Publish pacing of the scheduler loop: results that come faster than publish_hz are told at once but
committed (μ/var published, last_result_id moved) together, and a scheduler that dies before that
commit leaves them to be told again by its successor, exactly once. The pace never idles a worker:
while a commit waits, each read refills the freed slots with jobs on the last published version, and
a commit that publishes nothing (a synchronous generation's member) is not held at all."""

from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest

from aesrl_queue import codec
from aesrl_queue.config import RunConfig
from aesrl_queue.connection import connect
from aesrl_queue.nets import init_actor_params
from aesrl_queue.optimizers import ASYNC_ALGOS, Fitness, Individual, Reference, make_optimizer
from aesrl_queue.store import Store, worker_beat
from scheduler.loop import Scheduler, asked_state

EPISODE_LEN = 20


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _config(run_id: str, algo: str = "es") -> RunConfig:
    return RunConfig.from_preset("AesrlSleep-v0", algo=algo, run_id=run_id, hidden=(8, 8), seed=5,
                                 env_kwargs={"episode_len": EPISODE_LEN, "mean_s": 0.0}, total_steps=10_000,
                                 queued_per_worker=3, rl_ratio=0.0).resolve()


def _scheduler(url: str, cfg: RunConfig, publish_hz: float) -> tuple[Scheduler, FakeClock]:
    sched = Scheduler(connect(url), connect(url, blocking=True), cfg, publish_hz=publish_hz)
    clock = FakeClock()
    sched.clock = clock
    sched.setup()
    return sched, clock


def _results(client, cfg: RunConfig, sched: Scheduler, n: int) -> list[str]:
    """Start the first `n` jobs in flight and append a made-up result of each (ES; antithetic where the
    run's jobs are)."""
    store = Store(client, cfg.run_id)
    rng = np.random.default_rng(11)
    entries = []
    for job, info in sorted(sched.inflight.items(), key=lambda kv: int(kv[1]["n"]))[:n]:
        got = store.start_job(job, codec.pack({"worker": "pacing-w", "host": "h", "pid": 0, "t": time.time()}))
        steps = (2 if cfg.es_antithetic else 1) * EPISODE_LEN
        ep = {"obs": np.zeros((steps, cfg.obs_dim), np.float32), "act": np.zeros((steps, cfg.act_dim), np.float32),
              "rew": np.zeros(steps, np.float32), "next_obs": np.zeros((steps, cfg.obs_dim), np.float32),
              "done": np.zeros(steps, np.float32)}
        fields = {"job": job, "kind": "es", "version": int(got[0]), "seed": int(info["seed"]), "worker": "pacing-w",
                  "spec_hash": cfg.spec_hash, "status": "ok", "fitness": float(rng.normal()), "len": EPISODE_LEN,
                  "f_mu": 0.0, "f_mu_version": int(got[0]), "eval_steps": 0, "duration": 1.0}
        if cfg.es_antithetic:
            fields.update(mirror_fitness=float(rng.normal()), mirror_len=EPISODE_LEN)
        entries.append(store.finish_job(ep, job, fields))
    return entries


def _queued(client, store: Store) -> set[str]:
    """Job ids on the run's queues (RQ's lists), as the workers would find them."""
    return {j.decode() for name in ("rq:queue:aesrl-es", "rq:queue:aesrl-rl") for j in client.lrange(name, 0, -1)
            if j.decode().startswith(store.run_id)}


def _published(client, store: Store) -> tuple[int, str, int, str]:
    state = store.state()
    mu, var = client.hmget(store.key(f"dist:{state['version']}"), ["mu", "var"])
    return (state["version"], hashlib.sha256(mu + b"|" + var).hexdigest(), state["results_applied"],
            state["last_result_id"])


def test_fast_results_are_committed_together_at_the_paced_rate(redis_url, client):
    worker_beat(client, "pacing-w", {"host": "h", "pid": 0})
    cfg = _config("pacing-fast")
    store = Store(client, cfg.run_id)
    sched, clock = _scheduler(redis_url, cfg, publish_hz=10.0)
    sched.apply([])  # the first jobs
    before = _published(client, store)
    entries = _results(client, cfg, sched, 3)
    sched.apply(sched.results.read(sched.last_id, 10))  # the first result commits at once
    first = _published(client, store)
    assert first[2] == 3 and first[3] == entries[-1] and first[0] > before[0]
    more = _results(client, cfg, sched, 3)
    clock.t += 0.06  # within the pacing interval: told, not committed
    sched.apply(sched.results.read(sched.last_id, 10))
    assert sched.last_id == more[-1] and sched.opt.version > first[0]
    assert _published(client, store) == first
    clock.t += 0.05
    sched.apply([])
    version, _digest, applied, last = _published(client, store)
    assert (version, applied, last) == (sched.opt.version, 6, more[-1])
    assert len(store.history()) == 6


def test_a_scheduler_dying_before_its_commit_leaves_the_results_to_its_successor(redis_url, client):
    worker_beat(client, "pacing-w", {"host": "h", "pid": 0})
    outcome = {}
    for name, crash in (("pacing-ref", False), ("pacing-crash", True)):
        cfg = _config(name)
        store = Store(client, cfg.run_id)
        sched, clock = _scheduler(redis_url, cfg, publish_hz=10.0)
        sched.apply([])
        sched.published_at = clock.t  # a version was just published: the next one is held
        _results(client, cfg, sched, 4)
        sched.apply(sched.results.read(sched.last_id, 10))
        assert store.state()["results_applied"] == 0
        # the 4 freed slots are refilled before the commit (the first 4 stay listed: this test starts jobs
        # without taking them off RQ's queue)
        assert len(_queued(client, store)) == 8
        if crash:  # gone without its commit; a new scheduler resumes from what Redis holds
            sched.inflight.close()
            sched, clock = _scheduler(redis_url, cfg, publish_hz=10.0)
            batch = sched.results.read(sched.last_id, 10)
            assert len(batch) == 4
            sched.apply(batch)
        else:
            clock.t += 0.1
            sched.apply([])
        # the refilled jobs report too: in flight for the successor as well, none stale
        clock.t += 0.2
        _results(client, cfg, sched, 4)
        sched.apply(sched.results.read(sched.last_id, 10))
        sched.inflight.close()
        state = store.state()
        # job numbers only: a successor that numbered its jobs from the last commit would reuse #5-#8
        numbers = sorted(int(info["n"]) for info in sched.inflight.values())
        outcome[name] = (*_published(client, store)[:3], len(store.history()), state["stale"], numbers)
    assert outcome["pacing-crash"] == outcome["pacing-ref"]
    assert outcome["pacing-ref"][2] == 8 and outcome["pacing-ref"][3] == 8 and outcome["pacing-ref"][4] == 0
    assert outcome["pacing-ref"][5] == [9, 10, 11, 12]


def test_a_held_commit_still_refills_the_freed_slots_from_the_published_version(redis_url, client):
    worker_beat(client, "pacing-w", {"host": "h", "pid": 0})
    cfg = _config("pacing-refill")
    store = Store(client, cfg.run_id)
    sched, clock = _scheduler(redis_url, cfg, publish_hz=10.0)
    sched.apply([])  # 4 jobs: one worker, 3 queued behind it
    _results(client, cfg, sched, 3)
    sched.apply(sched.results.read(sched.last_id, 10))  # committed and published at once
    first = _published(client, store)
    assert first[0] > 0 and first[2] == 3
    queued = _queued(client, store)
    more = _results(client, cfg, sched, 3)
    clock.t += 0.02  # well within the pacing interval: the commit waits ...
    sched.apply(sched.results.read(sched.last_id, 10))
    assert _published(client, store) == first and sched.opt.version > first[0]
    # ... but the three free slots are not: three new jobs wait on the queue, drawn from the published version
    new = _queued(client, store) - queued
    assert len(new) == 3 and len(sched.inflight) == 4
    assert {int(sched.inflight[j]["version"]) for j in new} == {first[0]}
    assert len(client.hkeys(store.key("inflight"))) == 7, "settled jobs leave inflight with their commit only"
    clock.t += 0.1
    sched.apply([])
    version, _digest, applied, last = _published(client, store)
    assert (version, applied, last) == (sched.opt.version, 6, more[-1])
    assert len(client.hkeys(store.key("inflight"))) == 4
    sched.inflight.close()


def test_a_commit_that_publishes_nothing_is_not_held(redis_url, client):
    """cemrl's members return one at a time and move μ only at the generation's end: each one is committed
    at once and the next member goes out on the same read, however fast they come."""
    worker_beat(client, "pacing-w", {"host": "h", "pid": 0})
    cfg = _config("pacing-cem", algo="cemrl")
    store = Store(client, cfg.run_id)
    sched, clock = _scheduler(redis_url, cfg, publish_hz=10.0)
    sched.apply([])
    version = sched.opt.version
    for i in range(3):
        assert len(sched.inflight) == 1
        entry = _results(client, cfg, sched, 1)[-1]
        clock.t += 0.001
        sched.apply(sched.results.read(sched.last_id, 10))
        assert store.state()["last_result_id"] == entry, f"member {i} waited for the pace"
        assert len(sched.inflight) == 1, f"no member follows member {i}"
    assert sched.opt.version == version
    sched.inflight.close()


@pytest.mark.parametrize("algo", sorted(ASYNC_ALGOS))
def test_ask_and_tell_change_disjoint_parts_of_the_optimizer_state(algo):
    """What a refill saves (the state last committed, with asked_state over it) is a state the optimizer
    was in, only if ask changes nothing but asked_state's parts and tell none of them."""
    cfg = RunConfig.from_preset("AesrlSleep-v0", algo=algo, run_id=f"split-{algo}", hidden=(8, 8), seed=5,
                                initial_steps=0, total_steps=10_000).resolve()
    mu0 = init_actor_params(cfg.obs_dim, cfg.act_dim, cfg.max_action, tuple(cfg.hidden), cfg.activation, seed=cfg.seed)
    opt = make_optimizer(cfg, mu0)
    rng = np.random.default_rng(3)
    for _ in range(6):
        before = opt.state()
        specs = opt.ask(2, steps=100, inflight=0, rl=True)
        assert specs
        after = opt.state()
        changed = {k for k in after if codec.pack(after[k]) != codec.pack(before[k])}
        assert changed <= set(asked_state(opt)), f"ask changed {changed - set(asked_state(opt))}"
        assert {k: codec.pack(after[k]) for k in asked_state(opt)} == {
            k: codec.pack(v) for k, v in asked_state(opt).items()}
        for spec in specs:
            asked = asked_state(opt)
            z = (opt.mean + 0.1 * rng.standard_normal(opt.mean.shape)).astype(np.float32)
            opt.tell(Individual(job=f"j{spec['n']}", kind=spec["kind"], version=spec["version"], z=z, steps=100,
                                interactions=200),
                     Fitness(float(rng.normal()), EPISODE_LEN), Reference(float(rng.normal()), spec["version"]))
            assert codec.pack(asked_state(opt)) == codec.pack(asked), "tell changed what asks own"
    assert opt.told > 0
