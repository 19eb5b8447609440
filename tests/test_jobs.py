"""The job as one function of explicit inputs (workers/jobs.py `play`): called in this process with no
Redis, it computes what the worker traces of tests/data/golden.json recorded through RQ's path."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests import golden
from tests.test_golden import close

RECORDED = json.loads(golden.DATA.read_text())["worker"]
SEED = 1234


def _inputs(algo: str, kind: str, **kw):
    from workers.jobs import JobInputs

    # the traces of aesrl's jobs that play μ or train an RL sample are recorded at its first defaults
    cfg = golden.config(algo, run_id=f"golden-w-{kind}", **(golden.FIRST if algo == "aesrl" else {}))
    mu = np.linspace(-0.4, 0.4, cfg.actor_dim, dtype=np.float32)
    var = np.full(cfg.actor_dim, 1e-2, dtype=np.float32)
    return JobInputs(cfg, kind, SEED, 0, mu, var, **kw)


def test_seeds_are_derived_once_from_the_job_seed() -> None:
    from workers.jobs import Seeds

    s = Seeds.of(2**63 + 5, paired=True)
    assert (s.noise, s.start, s.mean_start, s.torch, s.sampler) == (2**63 + 5, 5, 5, 5, 5)
    u = Seeds.of(2**31 - 1, paired=False)
    assert (u.start, u.mean_start) == (2**31 - 1, 0)  # the next start state, wrapped


@pytest.mark.parametrize(("name", "algo", "random_actions"), [("es", "aesrl", False), ("random", "aesrl", True),
                                                             ("es-antithetic", "es", False)])
def test_an_es_job_played_in_process_computes_the_recorded_result(name, algo, random_actions) -> None:
    from workers.jobs import play

    out = play(_inputs(algo, "es", random_actions=random_actions))
    want = RECORDED[name]
    got = {"fitness": out.fitness, "len": out.length, "f_mu": out.f_mu, "f_mu_version": out.f_mu_version,
           "eval_steps": out.eval_steps, **out.extra}
    assert close(got, {k: want[k] for k in got}), (got, want)
    assert out.z is None and out.transitions["rew"].shape[0] == out.length + out.extra.get("mirror_len", 0)
    if name == "es-antithetic":
        assert out.mean_transitions is None  # the pair's mean is f(μ): no μ episode
    else:  # μ's episode, kept: its rewards sum to f(μ)
        assert len(out.mean_transitions["rew"]) == out.eval_steps
        assert close(float(out.mean_transitions["rew"].astype(np.float64).sum()), out.f_mu)


def test_an_rl_job_played_in_process_trains_the_recorded_individual() -> None:
    """The critic and the replay states given as plain inputs (as an in-process executor gives them)."""
    import torch

    from aesrl_queue.nets import NetSpec, get_flat
    from aesrl_queue.td3 import ReplayBuffer
    from workers.jobs import critic_module, play

    inp = _inputs("aesrl", "rl", rl_steps=25)
    cfg = inp.cfg
    torch.manual_seed(2)
    weights = {"critic": get_flat(NetSpec.from_config(cfg).make_critic("cpu"))}
    states = ReplayBuffer(cfg.obs_dim, cfg.act_dim, 1000, obs_only=True)
    rng = np.random.default_rng(4)
    states.add_batch(rng.standard_normal((64, cfg.obs_dim)).astype(np.float32))  # the traces' seed episode
    inp.critic = critic_module(cfg, weights)
    inp.sample_states = lambda n, gen: states.sample(n, generator=gen)["obs"]
    out = play(inp)
    want = RECORDED["rl"]
    assert close(golden.fingerprint(out.z), want["individual"])
    assert close([out.fitness, out.f_mu], [want["fitness"], want["f_mu"]])
    assert np.linalg.norm(out.z.astype(np.float64) - inp.mu) > 0  # training moved it (the scheduler reports how far)
    # played again from the same inputs: the same individual, to the bit
    again = play(inp)
    assert np.array_equal(again.z, out.z) and again.fitness == out.fitness


def _run_es_job(client, algo: str, **kw):
    """One ES job of the worker traces through RQ's entry point, on a run of `algo`: (result, state, replay)."""
    from aesrl_queue.store import Store, decode_result
    from workers import jobs

    cfg = golden.config(algo, run_id=f"jobs-{algo}-{int(10 * kw.get('rl_ratio', 1))}", **kw)
    store = Store(client, cfg.run_id)
    store.write_config(cfg)
    store.publish_dist(0, np.linspace(-0.4, 0.4, cfg.actor_dim, dtype=np.float32),
                       np.full(cfg.actor_dim, 1e-2, dtype=np.float32))
    store.set_state(version=0)
    job = f"{cfg.run_id}-j1"
    store.add_inflight(job, {"kind": "es", "version": 0, "seed": SEED, "n": 1})
    jobs._CONTEXTS.clear()
    jobs.evaluate(cfg.run_id, job, "es", 0, SEED, cfg.spec_hash, client=client)
    jobs._CONTEXTS.clear()
    (entry_id, fields), = client.xrange(store.key("results"))
    replay = [(f[b"job"].decode(), store.decode_episode(i, f)) for i, f in client.xrange(store.key("replay"))]
    return decode_result(entry_id, fields), store.state(), replay


def test_mus_episode_enters_the_replay_and_counts_as_stored_steps(client) -> None:
    """A run with a critic stores the f(μ) episode as an entry of its own after the individual's, and
    counts it in `steps`: every interaction of the job is a stored step."""
    res, st, replay = _run_es_job(client, "aesrl", **golden.FIRST)  # single ES individuals, a μ episode each
    assert [name for name, _ in replay] == [res.job, f"{res.job}:mu"]
    assert [len(ep["rew"]) for _, ep in replay] == [res.length, res.eval_steps] == [200, 200]
    assert close(float(replay[1][1]["rew"].astype(np.float64).sum()), res.f_mu)  # μ's own episode
    assert st["steps"] == st["interactions"] == st["replay_held"] == res.steps == res.interactions == 400


def test_a_run_without_a_critic_counts_mus_episode_as_interactions_only(client) -> None:
    """aesrl with rl_ratio 0 keeps no replay (nothing would read it): nothing is stored, and μ's
    episode is an interaction, not a stored step, as before."""
    res, st, replay = _run_es_job(client, "aesrl", **{**golden.FIRST, "rl_ratio": 0.0})
    assert replay == [] and res.eval_steps == 200
    assert (st["steps"], st["interactions"]) == (res.steps, res.interactions) == (200, 400)
