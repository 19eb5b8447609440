"""Tests of aesrl_queue.td3: critic and actor steps learn, TD3's policy delay, the replay ring buffer.

Tiny networks and fixed seeds keep every test fast and deterministic on CPU.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import numpy as np
import pytest
import torch

from aesrl_queue import td3
from aesrl_queue.learners import Agent
from aesrl_queue.nets import NetSpec, get_flat, set_flat
from aesrl_queue.td3 import (
    ReplayBuffer,
    critic_update,
    hard_update,
    soft_update,
    train_actor,
)
from tests.conftest import ROOT, child_env, wait_for

SPEC = NetSpec(obs_dim=4, act_dim=2, max_action=1.0, hidden=(16, 16), critic_hidden=(32, 32))


def actor_update(actor, critic, actor_opt, obs) -> float:
    """One actor step of an RL job (the step train_actor repeats); returns the loss."""
    return float(td3._actor_step(actor, critic, actor_opt, obs).item())


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(old)


def _batch(n: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(n, SPEC.obs_dim, generator=g),
        "act": torch.rand(n, SPEC.act_dim, generator=g) * 2 - 1,
        "rew": torch.randn(n, generator=g),
        "next_obs": torch.randn(n, SPEC.obs_dim, generator=g),
        "done": (torch.rand(n, generator=g) < 0.1).float(),
    }


def test_critic_update_lowers_td_loss():
    critic = SPEC.make_critic()
    critic_target = copy.deepcopy(critic).requires_grad_(False)
    target_actor = SPEC.make_actor().requires_grad_(False)
    opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
    batch = _batch()
    actor_before = get_flat(target_actor)
    losses = []
    for _ in range(200):
        stats = critic_update(critic, critic_target, opt, target_actor, batch, max_action=SPEC.max_action)
        assert set(stats) == {"loss", "q1_mean"}
        losses.append(stats["loss"])
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    # The target critic followed the critic, the target actor was not touched.
    assert not np.array_equal(get_flat(critic_target), get_flat(SPEC.make_critic()))
    np.testing.assert_array_equal(get_flat(target_actor), actor_before)


def test_critic_update_target_is_td3():
    # With tau=0 and lr=0 the step leaves everything as is, so the returned loss must equal
    # a hand-computed TD3 loss using the same target-policy noise.
    critic = SPEC.make_critic()
    critic_target = SPEC.make_critic()
    target_actor = SPEC.make_actor()
    opt = torch.optim.SGD(critic.parameters(), lr=0.0)
    batch = _batch(32)
    gamma, noise, clip, max_action = 0.9, 0.2, 0.5, 1.0
    stats = critic_update(critic, critic_target, opt, target_actor, batch, gamma=gamma, tau=0.0,
                          policy_noise=noise, noise_clip=clip, max_action=max_action,
                          generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        eps = torch.randn(batch["act"].shape, generator=torch.Generator().manual_seed(5))
        na = (target_actor(batch["next_obs"]) + (eps * noise).clamp(-clip, clip)).clamp(-max_action, max_action)
        t1, t2 = critic_target(batch["next_obs"], na)
        y = batch["rew"][:, None] + gamma * (1 - batch["done"][:, None]) * torch.min(t1, t2)
        q1, q2 = critic(batch["obs"], batch["act"])
        expected = ((q1 - y) ** 2).mean() + ((q2 - y) ** 2).mean()
    assert stats["loss"] == pytest.approx(float(expected), rel=1e-5)
    assert stats["q1_mean"] == pytest.approx(float(q1.mean()), rel=1e-5, abs=1e-6)


def test_actor_update_raises_q1_and_leaves_critic_alone():
    critic = SPEC.make_critic()
    actor = SPEC.make_actor()
    opt = torch.optim.Adam(actor.parameters(), lr=1e-3)
    obs = torch.randn(128, SPEC.obs_dim, generator=torch.Generator().manual_seed(1))
    critic_before = get_flat(critic)
    with torch.no_grad():
        q_before = critic.q1(obs, actor(obs)).mean().item()
    for _ in range(50):
        loss = actor_update(actor, critic, opt, obs)
        assert isinstance(loss, float)
    with torch.no_grad():
        q_after = critic.q1(obs, actor(obs)).mean().item()
    assert q_after > q_before
    np.testing.assert_array_equal(get_flat(critic), critic_before)
    assert all(p.grad is None for p in critic.parameters())


def test_actor_update_with_frozen_critic():
    critic = SPEC.make_critic().requires_grad_(False)
    actor = SPEC.make_actor()
    before = get_flat(actor)
    actor_update(actor, critic, torch.optim.Adam(actor.parameters(), lr=1e-3), torch.randn(16, SPEC.obs_dim))
    assert not np.array_equal(get_flat(actor), before)


def test_train_actor_returns_new_vector():
    critic = SPEC.make_critic().requires_grad_(False)
    flat = SPEC.init_actor_params(seed=0)
    rng = np.random.default_rng(0)
    calls = []

    def sample_obs(n: int) -> np.ndarray:
        calls.append(n)
        return rng.normal(size=(n, SPEC.obs_dim)).astype(np.float32)

    new = train_actor(flat, SPEC, critic, sample_obs, steps=20, batch_size=32)
    assert new.dtype == np.float32 and new.shape == flat.shape
    assert not np.array_equal(new, flat)
    assert calls == [32] * 20
    # A sampler may hand back tensors too; zero steps return the input.
    same = train_actor(flat, SPEC, critic, lambda n: torch.zeros(n, SPEC.obs_dim), steps=0)
    np.testing.assert_array_equal(same, flat)
    with pytest.raises(ValueError, match="shape"):
        train_actor(flat, SPEC, critic, lambda n: np.zeros((n, 3), np.float32), steps=1)


def test_td3_agent_policy_delay():
    agent = Agent(SPEC, "td3", policy_freq=2)
    agent.critic, agent.critic_target = agent.learner.critic, agent.learner.critic_target
    batch = _batch()
    actor0, critic0 = get_flat(agent.actor), get_flat(agent.critic)
    actor_t0, critic_t0 = get_flat(agent.actor_target), get_flat(agent.critic_target)
    s1 = agent.train_step(batch)
    assert "loss" in s1 and "actor_loss" not in s1
    np.testing.assert_array_equal(get_flat(agent.actor), actor0)
    np.testing.assert_array_equal(get_flat(agent.actor_target), actor_t0)
    np.testing.assert_array_equal(get_flat(agent.critic_target), critic_t0)
    assert not np.array_equal(get_flat(agent.critic), critic0)
    s2 = agent.train_step(batch)
    assert "actor_loss" in s2
    assert not np.array_equal(get_flat(agent.actor), actor0)
    assert not np.array_equal(get_flat(agent.actor_target), actor_t0)
    assert not np.array_equal(get_flat(agent.critic_target), critic_t0)


def test_soft_and_hard_update():
    a, b = SPEC.make_actor(), SPEC.make_actor()
    fa, fb = get_flat(a), get_flat(b)
    soft_update(a, b, 0.25)
    np.testing.assert_allclose(get_flat(a), 0.75 * fa + 0.25 * fb, rtol=1e-6, atol=1e-7)
    hard_update(a, b)
    np.testing.assert_array_equal(get_flat(a), fb)


def _rows(start: int, n: int, obs_dim: int = 3, act_dim: int = 2):
    idx = np.arange(start, start + n, dtype=np.float32)
    obs = np.repeat(idx[:, None], obs_dim, axis=1)
    return obs, np.repeat(idx[:, None], act_dim, axis=1), idx, obs + 0.5, np.zeros(n, np.float32)


def test_replay_ring_wraps():
    rb = ReplayBuffer(3, 2, capacity=5)
    rb.add_batch(*_rows(0, 3))
    assert len(rb) == 3
    rb.add_batch(*_rows(3, 4))  # rows 3..6; 5 and 6 overwrite 0 and 1
    assert len(rb) == 5 and rb.total_added == 7
    stored = sorted(rb._data["rew"].tolist())
    assert stored == [2.0, 3.0, 4.0, 5.0, 6.0]
    rb.add_batch(*_rows(10, 12))  # more than capacity: only the newest 5 survive
    assert sorted(rb._data["rew"].tolist()) == [17.0, 18.0, 19.0, 20.0, 21.0]
    s = rb.sample(64, generator=torch.Generator().manual_seed(0))
    assert s["obs"].shape == (64, 3) and s["act"].shape == (64, 2) and s["next_obs"].shape == (64, 3)
    assert s["rew"].shape == (64,) and s["done"].shape == (64,)
    # Rows stay aligned across keys.
    assert torch.equal(s["obs"][:, 0], s["rew"]) and torch.equal(s["next_obs"][:, 0], s["rew"] + 0.5)
    s2 = rb.sample(64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(s["obs"], s2["obs"])


def test_replay_sample_in_graph_draws_aligned_rows_from_the_first_size_rows_only():
    # The critic daemon's CUDA-graph sampler: the size is a tensor updated in place as the buffer grows.
    rb = ReplayBuffer(3, 2, capacity=50)
    rb.add_batch(*_rows(0, 10))
    size = torch.tensor(4.0)
    torch.manual_seed(0)
    s = rb.sample_in_graph(4000, size)
    assert s["obs"].shape == (4000, 3) and s["rew"].shape == (4000,)
    assert set(s["rew"].tolist()) == {0.0, 1.0, 2.0, 3.0}  # all of the first four rows, none after
    assert torch.equal(s["obs"][:, 0], s["rew"]) and torch.equal(s["next_obs"][:, 0], s["rew"] + 0.5)
    size.fill_(float(len(rb)))
    assert set(rb.sample_in_graph(4000, size)["rew"].tolist()) == set(map(float, range(10)))


def test_replay_validation():
    rb = ReplayBuffer(3, 2, capacity=5)
    with pytest.raises(ValueError, match="empty"):
        rb.sample(4)
    obs, act, rew, nxt, done = _rows(0, 2)
    with pytest.raises(ValueError, match="act"):
        rb.add_batch(obs, act[:, :1], rew, nxt, done)
    with pytest.raises(ValueError, match="required"):
        rb.add_batch(obs)
    rew[0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        rb.add_batch(obs, act, rew, nxt, done)
    assert len(rb) == 0
    rb.add_batch(obs, act, np.zeros((2, 1), np.float32), nxt, done[:, None])  # (N, 1) columns accepted
    assert len(rb) == 2


def test_replay_obs_only():
    rb = ReplayBuffer(3, 2, capacity=4, obs_only=True)
    obs = _rows(0, 6)[0]
    rb.add_batch(obs)
    assert len(rb) == 4 and set(rb._data) == {"obs"}
    out = rb.sample_obs(10)
    assert isinstance(out, np.ndarray) and out.shape == (10, 3) and out.dtype == np.float32
    assert set(out[:, 0].tolist()) <= {2.0, 3.0, 4.0, 5.0}
    assert set(rb.sample(5)) == {"obs"}
    rb.add_batch(*_rows(0, 2))  # full transitions are accepted; only obs is kept
    assert len(rb) == 4


def test_td3_agent_trains_from_replay():
    rb = ReplayBuffer(SPEC.obs_dim, SPEC.act_dim, capacity=100)
    b = _batch(100)
    rb.add_batch(*(b[k].numpy() for k in ("obs", "act", "rew", "next_obs", "done")))
    agent = Agent(SPEC, "td3", lr=1e-3)
    g = torch.Generator().manual_seed(0)
    losses = [agent.train_step(rb.sample(32, generator=g))["loss"] for _ in range(100)]
    assert all(np.isfinite(losses))
    flat = get_flat(agent.actor)
    set_flat(agent.actor_target, flat)
    np.testing.assert_array_equal(agent.actor_params(), flat)


def test_warm_up_torch_pays_the_lazy_imports_and_draws_no_random_numbers():
    """In a fresh interpreter the first optimizer step imports torch._dynamo; warming up does it
    before a worker forks, and leaves torch's random stream where it was (jobs stay bit-exact)."""
    code = ("import sys, torch\n"
            "from aesrl_queue.td3 import warm_up_torch\n"
            "assert 'torch._dynamo' not in sys.modules\n"
            "state = torch.get_rng_state()\n"
            "warm_up_torch()\n"
            "assert 'torch._dynamo' in sys.modules\n"
            "assert torch.equal(torch.get_rng_state(), state)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr


def test_critic_daemon_with_critic_shift_learns_the_rewards_less_the_shift(client) -> None:
    """critic_shift: the daemon's critic step on an episode equals a plain daemon's on the same episode
    with every reward shift_per_step lower, and differs from the plain daemon's on the original."""
    from aesrl_queue.config import RunConfig
    from aesrl_queue.store import Store
    from workers.critic import CriticDaemon

    def daemon(run: str, shifted: bool, rew_offset: float) -> CriticDaemon:
        cfg = RunConfig.from_preset("AesrlNull-v0", run_id=run, fitness_shift=2.0, critic_shift=shifted,
                                    batch_size=32).resolve().validate()
        store = Store(client, run)
        assert store.write_config(cfg)
        n = 64
        base = np.arange(n, dtype=np.float32) / n
        store.append_episode({
            "obs": np.repeat(base[:, None], cfg.obs_dim, axis=1), "act": np.repeat(-base[:, None], cfg.act_dim, axis=1),
            "rew": base + rew_offset, "next_obs": np.repeat(base[:, None] + 0.1, cfg.obs_dim, axis=1),
            "done": (np.arange(n) == n - 1).astype(np.float32)}, job=f"{run}-j")
        torch.manual_seed(5)  # the same initial critic, target and target policy in every daemon
        d = CriticDaemon(client, client, run)
        assert d.sync() == n
        torch.manual_seed(6)  # the same target-policy noise
        d.train_chunk(3)
        return d

    shifted = get_flat(daemon("cs-shifted", True, 0.0).learner.critic)
    by_hand = get_flat(daemon("cs-by-hand", False, -2.0).learner.critic)
    plain = get_flat(daemon("cs-plain", False, 0.0).learner.critic)
    np.testing.assert_allclose(shifted, by_hand, rtol=0, atol=1e-6)
    assert np.abs(shifted - plain).max() > 1e-3


def test_critic_shift_applies_to_aesrl_only() -> None:
    from aesrl_queue.config import ConfigError, RunConfig

    # aesrl's default: its learner's own actor learns the environment's rewards, as the learner alone does
    assert RunConfig.from_preset("Hopper-v5").validate().critic_shift is False
    assert RunConfig.from_preset("Hopper-v5", critic_shift=True).validate().critic_shift is True
    for algo in ("es", "cemrl", "td3"):
        assert RunConfig.from_preset("Hopper-v5", algo=algo).validate().critic_shift is False
        with pytest.raises(ConfigError, match="^critic_shift: applies to --algo aesrl, not"):
            RunConfig.from_preset("Hopper-v5", algo=algo, critic_shift=True).validate()
    # with no RL jobs there is no critic, and the setting changes nothing
    assert RunConfig.from_preset("Hopper-v5", critic_shift=True, rl_ratio=0.0).validate().critic_shift is True
    with pytest.raises(ConfigError, match="^critic_shift: must be true or false"):
        RunConfig.from_preset("Hopper-v5", critic_shift="yes").validate()


def test_a_slow_critic_publishes_chunks_that_take_a_quarter_of_critic_wait(client) -> None:
    """The scheduler takes a critic whose steps have not moved for critic_wait for a stopped one and
    opens the lag gate; so a daemon whose critic_chunk would take longer than that at its measured rate
    publishes smaller chunks. critic_wait 0.04 s makes any critic below 100 000 steps/s that slow."""
    import threading

    from aesrl_queue.config import RunConfig
    from aesrl_queue.store import Store
    from workers.critic import CriticDaemon

    run = "slowcritic"
    cfg = RunConfig.from_preset("AesrlNull-v0", run_id=run, batch_size=32, critic_chunk=1000,
                                critic_wait=0.04).resolve().validate()
    store = Store(client, run)
    assert store.write_config(cfg)
    n = 64
    store.append_episode({"obs": np.zeros((n, cfg.obs_dim), np.float32), "act": np.zeros((n, cfg.act_dim), np.float32),
                          "rew": np.ones(n, np.float32), "next_obs": np.zeros((n, cfg.obs_dim), np.float32),
                          "done": (np.arange(n) == n - 1).astype(np.float32)}, job=f"{run}-j")
    store.set_state(steps=1_000_000)  # no limit from the stored steps
    stop = threading.Event()
    daemon = CriticDaemon(client, client, run, device="cpu", stop_event=stop)
    worker = threading.Thread(target=daemon.run, daemon=True)
    worker.start()
    try:
        wait_for(lambda: store.state_field("critic_version") >= 4, 300, what="four critic versions")
    finally:
        stop.set()
        worker.join(120)
    version, trained = store.state_field("critic_version"), store.state_field("critic_steps")
    rate = float(store.state().get("critic_steps_per_s", 0))
    # the first chunk, at no measured rate, is critic_chunk; the later ones are capped by the rate
    assert rate > 0 and trained < version * cfg.critic_chunk, (version, trained, rate)
