"""rl_steps_max 0: the critic daemon trains an actor of its own on the learner alone's schedule and RL
jobs play its policy's draws.

A quick aesrl run with crossq-sac (real `aesrl-queue run` processes: embedded Redis, scheduler, critic
daemon, RQ workers); then its Redis data, read from a copy of the run folder."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from aesrl_queue.config import ConfigError, RunConfig
from bench import learning


def quick_run(tmp, **more):
    settings = {"algo": "aesrl", "learner": "crossq-sac", "rl_steps_max": 0, "critic_shift": False, **more}
    protocol = {**learning.QUICK, "budget_steps": 4_000, "algos": {"aesrl": settings}}
    folder, cfg_file = tmp / "aesrl-s1", tmp / "aesrl-s1.config.json"
    cfg_file.write_text(json.dumps({"env_id": "Pendulum-v1", **learning.cell_settings("aesrl", protocol)}))
    done = subprocess.run(learning.cell_command("Pendulum-v1", "aesrl", 1, protocol, folder, cfg_file),
                          cwd=learning.ROOT, env=learning.cell_env(protocol), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return folder


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    return quick_run(tmp_path_factory.mktemp("daemon-actor"))


def test_with_antithetic_pairs_no_job_plays_mu(tmp_path) -> None:
    """es_antithetic with the daemon's actor: f(μ) comes from the pairs alone, every interaction is
    stored, and the RL individuals are judged against the pairs' newest estimate."""
    folder = quick_run(tmp_path, es_antithetic=True)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["rl_applied"] > 0 and summary["es_applied"] > 0 and summary["failed"] == 0
    assert summary["interactions"] == summary["steps"]
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["type"] == "mu_eval"]
    assert evals and all(r["eval_steps"] == 0 for r in evals)
    told = [r for r in records if r["type"] == "update" and r["kind"] == "rl" and not r["random"]]
    pairs = {r["f_mu"] for r in records if r["type"] == "update" and r["kind"] == "es" and not r["random"]}
    # an RL individual's reference is an antithetic pair's mean (or, before the first pair, its own return)
    assert told and all(r["f_ref"] in pairs or r["f_ref"] == r["f_z"] for r in told)


def test_the_daemon_publishes_its_actor_and_rl_jobs_play_it(finished) -> None:
    from aesrl_queue.connection import connect
    from aesrl_queue.nets import get_flat
    from aesrl_queue.redis_server import folder_copy
    from aesrl_queue.store import Store
    from workers.critic import CriticDaemon
    from workers.jobs import JobInputs, critic_module, play

    with folder_copy(finished) as server:
        client = connect(server.url)
        store = Store(client, finished.name)
        cfg = store.config()
        summary = json.loads((finished / "summary.json").read_text())
        assert summary["rl_applied"] > 0 and summary["failed"] == 0
        assert store.state_field("critic_target", cast=str) == "actor"
        version, weights = store.read_critic()
        ckpt = store.load_checkpoint("critic")
        # the published actor is the daemon's actor itself, trained a step per step stored after the random phase
        assert ckpt["version"] == version and ckpt["total_it"] >= 3
        np.testing.assert_array_equal(weights["actor"], ckpt["actor"])
        # ... with the log-std network it draws with, and nothing else: RL jobs train no actor, the critic
        # stays in the daemon
        assert sorted(weights) == ["actor", "log_std"]
        np.testing.assert_array_equal(weights["log_std"], ckpt["log_std"])
        assert 0 < store.state_field("critic_steps") <= summary["steps"] - cfg.initial_steps
        # RL results name the version of the actor they played, and a copy of it as their individual
        rl = [f for _, f in client.xrange(store.key("results")) if f[b"kind"] == b"rl" and f[b"status"] == b"ok"]
        assert rl and all(1 <= int(f[b"policy"]) <= version for f in rl)
        # ... restored with its Adam state by a daemon that starts again
        daemon = CriticDaemon(client, client, finished.name, device="cpu", cuda_graph=False)
        assert daemon.restore()
        assert daemon.agent.total_it == ckpt["total_it"]
        np.testing.assert_array_equal(get_flat(daemon.agent.actor), weights["actor"])
        # an RL job's individual is that actor, whatever μ it was drawn from
        mu, var = store.read_dist(store.current_version())
        critic = critic_module(cfg, weights)
        out = play(JobInputs(cfg, "rl", 12345, store.current_version(), mu, var, rl_steps=0, critic=critic))
        np.testing.assert_array_equal(out.z, weights["actor"])
        # its episode is a draw of the policy, the same for the same seed, not the actor's deterministic play
        again = play(JobInputs(cfg, "rl", 12345, store.current_version(), mu, var, rl_steps=0, critic=critic))
        np.testing.assert_array_equal(again.transitions["act"], out.transitions["act"])
        actor = cfg_actor(cfg, weights["actor"])
        assert not np.allclose(actor.act(out.transitions["obs"]), out.transitions["act"], atol=1e-3)
        # it reads no μ: the scheduler, which holds μ, measures how far the actor is from it
        assert "dist_after" not in out.extra
    updates = [json.loads(line) for line in (finished / "metrics.jsonl").read_text().splitlines()]
    dists = [r["dist_after"] for r in updates if r["type"] == "update" and r["kind"] == "rl" and not r["random"]]
    assert dists and all(d is not None and np.isfinite(d) and d > 0 for d in dists)


def cfg_actor(cfg, flat):
    from aesrl_queue.nets import NetSpec

    actor = NetSpec.from_config(cfg).make_numpy_actor()
    actor.set_params(flat)
    return actor


def test_rl_steps_max_0_is_refused_where_no_daemon_trains_an_actor() -> None:
    with pytest.raises(ConfigError, match="rl_steps_max"):
        RunConfig(env_id="Pendulum-v1", algo="cemrl", learner="crossq-sac", rl_steps_max=0).validate()
    with pytest.raises(ConfigError, match="rl_steps_max"):
        RunConfig(env_id="Pendulum-v1", rl_steps_max=-1).validate()


def test_a_deterministic_learners_actor_is_played_with_expl_noise() -> None:
    """td3 (and crossq) have no policy to draw from: an RL job plays the daemon's actor plus Gaussian noise
    of expl_noise times the action bound, clipped to the bounds, as the `td3` baseline explores."""
    import torch

    from aesrl_queue.learners import Agent
    from aesrl_queue.nets import NetSpec, get_flat
    from workers.jobs import JobInputs, critic_module, play

    cfg = RunConfig.from_preset("Pendulum-v1", algo="aesrl", learner="td3", hidden=(8, 8), critic_hidden=(16, 16),
                                seed=5, run_id="draws").resolve()
    torch.manual_seed(2)
    agent = Agent(NetSpec.from_config(cfg), "td3")
    weights = agent.policy_weights()
    assert sorted(weights) == ["actor"] and np.array_equal(weights["actor"], get_flat(agent.actor))  # no log-std
    mu = np.zeros(cfg.actor_dim, dtype=np.float32)
    out = play(JobInputs(cfg, "rl", 777, 0, mu, np.full_like(mu, 1e-3), rl_steps=0, critic=critic_module(cfg, weights)))
    np.testing.assert_array_equal(out.z, weights["actor"])
    act, obs = out.transitions["act"], out.transitions["obs"]
    noise = act - cfg_actor(cfg, weights["actor"]).act(obs)
    inside = np.abs(act) < cfg.max_action  # where the clip did not bind
    assert np.all(np.abs(act) <= cfg.max_action) and inside.mean() > 0.5
    assert np.std(noise[inside]) == pytest.approx(cfg.expl_noise * cfg.max_action, rel=0.25)


def test_a_job_that_plays_the_daemons_policy_imports_no_torch_and_uploads_no_actor(redis_url) -> None:
    """An RL job of rl_steps_max 0 reads the published policy (actor and log-std, no critic) and plays
    its draws in numpy: a worker that runs only such jobs and ES jobs never loads torch. Its individual
    is a copy, made inside Redis, of the actor the daemon keeps for that version (the job uploads less
    than the actor's bytes); when that version is gone the job uploads its own copy."""
    script = """
import sys
import numpy as np
from aesrl_queue.config import RunConfig
from aesrl_queue.connection import connect
from aesrl_queue.store import Store
from workers.jobs import evaluate

client = connect(sys.argv[1])
cfg = RunConfig.from_preset("Pendulum-v1", algo="aesrl", run_id="no-torch").resolve()
assert cfg.rl_steps_max == 0 and cfg.learner == "crossq-sac"
store = Store(client, cfg.run_id)
store.write_config(cfg)
rng = np.random.default_rng(0)
mu = (0.1 * rng.standard_normal(cfg.actor_dim)).astype(np.float32)
store.publish_dist(0, mu, np.full_like(mu, 1e-2))
store.set_state(version=0)
policy = {"actor": (0.1 * rng.standard_normal(cfg.actor_dim)).astype(np.float32),
          "log_std": (0.1 * rng.standard_normal(cfg.actor_dim)).astype(np.float32)}
store.publish_critic(1, policy)
store.put_policy(1, policy["actor"], ttl=600)
from aesrl_queue.store import policy_name
received = []
for job in ("no-torch-j1", "no-torch-j2", "no-torch-j3"):  # j1 loads the scripts and reads the config
    if job.endswith("3"):
        client.delete(store.individual_key(policy_name(1)))  # gone: the job uploads its own copy
    store.add_inflight(job, {"kind": "rl", "version": 0, "seed": 99, "n": 1})
    before = client.info("stats")["total_net_input_bytes"]
    evaluate(cfg.run_id, job, "rl", 0, 99, cfg.spec_hash, rl_steps=0, client=client)
    received.append(client.info("stats")["total_net_input_bytes"] - before)
    res = client.xrange(store.key("results"))[-1][1]
    assert res[b"status"] == b"ok", res
    assert res[b"ind"].decode() == store.individual_key(job)
    np.testing.assert_array_equal(store.get_individual(res[b"ind"].decode()), policy["actor"])
actor_bytes = policy["actor"].nbytes
assert received[1] < actor_bytes < received[2] and received[2] - received[1] > 0.95 * actor_bytes, (received, actor_bytes)
print("torch" in sys.modules)
"""
    from conftest import child_env

    done = subprocess.run([sys.executable, "-c", script, redis_url], cwd=learning.ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_the_scheduler_reads_each_published_actor_once(client) -> None:
    """RL results that played the daemon's actor of one version are told that actor, read once from the
    daemon's key of it; a version whose key is gone (and not read before) is read from the result's copy."""
    from aesrl_queue.store import Result, Store, policy_name
    from scheduler.dists import DistCache
    from scheduler.results import PolicyCache, individual

    cfg = RunConfig.from_preset("Pendulum-v1", algo="aesrl", run_id="policy-cache").resolve()
    store = Store(client, cfg.run_id)
    store.write_config(cfg)
    actors = {v: np.full(cfg.actor_dim, v, dtype=np.float32) for v in (1, 2)}
    for v, a in actors.items():
        store.put_policy(v, a, ttl=600)
    gets = lambda: client.info("commandstats").get("cmdstat_get", {}).get("calls", 0)  # noqa: E731
    policies, dists = PolicyCache(store), DistCache(store)

    def told(job: str, version: int) -> np.ndarray:
        res = Result(job=job, kind="rl", status="ok", version=0, seed=1, fitness=0.0, length=1, f_mu=0.0,
                     f_mu_version=0, ind=store.put_individual(job, actors[version], 600, copy_of=policy_name(version)),
                     worker="w", spec_hash="", error="", eval_steps=0, duration=0.0, policy=version)
        return individual(res, None, dists, store, policies).z

    before = gets()
    for i in range(5):
        np.testing.assert_array_equal(told(f"j{i}", 1), actors[1])
    assert gets() - before == 1
    z = told("j5", 2)
    client.delete(store.individual_key(policy_name(2)))
    z[:] = -1  # the caller's copy: the cache keeps its own
    np.testing.assert_array_equal(told("j6", 2), actors[2])
    assert policies.get(3) is None
    store.put_individual("j7", actors[1], ttl=600)  # version 3 was never kept: the result's own copy is told
    res = Result(job="j7", kind="rl", status="ok", version=0, seed=1, fitness=0.0, length=1, f_mu=0.0, f_mu_version=0,
                 ind=store.individual_key("j7"), worker="w", spec_hash="", error="", eval_steps=0, duration=0.0,
                 policy=3)
    np.testing.assert_array_equal(individual(res, None, dists, store, policies).z, actors[1])
