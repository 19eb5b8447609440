"""The learners (aesrl_queue/learners.py): each trains its critic, publishes what an RL job rebuilds,
and resumes from its checkpoint to the same bits; CrossQ's critic normalises (s, a) and (s', a')
together and has no target copies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aesrl_queue.config import LEARNER_DEFAULTS, ConfigError, RunConfig
from aesrl_queue.learners import Agent, BatchRenorm, CrossQSACLearner, learner_class
from aesrl_queue.nets import NetSpec, get_flat
from aesrl_queue.td3 import train_actor

SPEC = NetSpec(obs_dim=4, act_dim=2, max_action=1.0, hidden=(16, 16), critic_hidden=(32, 32),
               critic_activation="relu")
KW = {"lr": 1e-3, "gamma": 0.99, "tau": 0.005, "policy_noise": 0.2, "noise_clip": 0.5}


def _batch(n: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, SPEC.obs_dim, generator=g)
    act = torch.rand(n, SPEC.act_dim, generator=g) * 2 - 1
    # a reward the critic can learn: a function of the state and action
    rew = obs[:, 0] - act[:, 0] ** 2
    return {"obs": obs, "act": act, "rew": rew, "next_obs": torch.randn(n, SPEC.obs_dim, generator=g),
            "done": torch.zeros(n)}


@pytest.mark.parametrize("name", ["td3", "crossq", "crossq-sac"])
def test_each_learner_lowers_its_loss_and_resumes_bit_for_bit(name) -> None:
    torch.manual_seed(0)
    cls = learner_class(name)
    learner = cls(SPEC, **KW)
    if name == "crossq-sac":  # α near 0: the target's entropy term, a fresh draw each step, would hide the fit
        learner.log_alpha.data.fill_(-20.0)
    actor = SPEC.make_actor()
    batch = _batch()
    first = [learner.critic_step(batch, actor).tolist()[0] for _ in range(5)]
    saved = learner.state()
    rest = [learner.critic_step(batch, actor).tolist()[0] for _ in range(200)]
    assert np.mean(rest[-10:]) < 0.5 * np.mean(first)
    # a learner restored from the checkpoint takes the same steps as the one that went on
    again = cls(SPEC, **KW)
    again.load_state(saved)
    torch.manual_seed(1)
    a = [learner.critic_step(batch, actor).tolist()[0] for _ in range(3)]
    learner.load_state(saved)
    torch.manual_seed(1)
    b = [again.critic_step(batch, actor).tolist()[0] for _ in range(3)]
    assert a != rest[:3]
    torch.manual_seed(1)
    c = [learner.critic_step(batch, actor).tolist()[0] for _ in range(3)]
    assert b == c


@pytest.mark.parametrize("name", ["td3", "crossq", "crossq-sac"])
def test_an_rl_job_rebuilds_the_published_critic(name) -> None:
    torch.manual_seed(0)
    cls = learner_class(name)
    learner = cls(SPEC, **KW)
    actor = SPEC.make_actor()
    for _ in range(20):
        learner.critic_step(_batch(seed=_), actor)
    obs, act = torch.randn(8, SPEC.obs_dim), torch.rand(8, SPEC.act_dim)
    with torch.no_grad():
        want = learner.actor_critic().q1(obs, act)
        got = cls.critic_for_actor(SPEC, learner.weights(), "cpu").q1(obs, act)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # the job's actor climbs it with the learner's Adam
    flat = get_flat(actor)
    new = train_actor(flat, SPEC, cls.critic_for_actor(SPEC, learner.weights(), "cpu"),
                      lambda n: torch.randn(n, SPEC.obs_dim), steps=10, batch_size=16, betas=cls.betas)
    assert not np.array_equal(new, flat)


def test_crossq_normalises_both_halves_together_and_evaluates_on_running_statistics() -> None:
    torch.manual_seed(0)
    learner = learner_class("crossq")(SPEC, **KW)
    critic = learner.critic
    assert not hasattr(learner, "critic_target")
    brn = critic.head1[0]
    assert isinstance(brn, BatchRenorm)
    batch = _batch()
    batch["next_obs"] = batch["next_obs"] + 10.0  # next states far from the states
    learner.critic_step(batch, SPEC.make_actor())
    # the input layer's running mean moved toward the mean of s and s' together (about 5 in obs dims)
    assert 0.03 < float(brn.running_mean[: SPEC.obs_dim].mean()) < 0.07
    assert float(brn.steps) == 1.0
    assert not critic.training  # left in evaluation mode: an actor step changes no statistics
    stats = [b.clone() for b in critic.buffers()]
    learner.actor_critic().q1(batch["obs"], batch["act"]).sum()
    assert all(torch.equal(a, b) for a, b in zip(stats, critic.buffers(), strict=True))


def test_batch_renorm_is_batch_norm_through_its_warmup_and_clips_after() -> None:
    brn = BatchRenorm(3, warmup=10)
    x = torch.randn(256, 3) * 5 + 2
    y = brn(x)  # step 0: r = 1, d = 0, plain batch norm
    torch.testing.assert_close(y.mean(0), torch.zeros(3), atol=1e-4, rtol=0)
    brn.steps.fill_(10.0)
    y = brn(x)  # still warming up (10 steps): plain batch norm, whatever the running statistics
    torch.testing.assert_close(y.std(0), torch.ones(3), atol=1e-2, rtol=0)
    brn.running_var.fill_(1.0)
    brn.running_mean.zero_()
    y = brn(x)  # past the warm-up: r clipped to 3 (batch std 5 against running 1): the output's spread is 3
    assert 2.5 < float(y.std(0).mean()) < 3.5


@pytest.mark.parametrize("name", ["td3", "crossq", "crossq-sac"])
def test_the_agent_takes_a_policy_step_every_policy_delay(name) -> None:
    torch.manual_seed(0)
    agent = Agent(SPEC, name, lr=1e-3)
    actor0 = agent.actor_params()
    delay = learner_class(name).policy_delay
    for i in range(1, delay):
        assert "actor_loss" not in agent.train_step(_batch(seed=i))
    np.testing.assert_array_equal(agent.actor_params(), actor0)
    assert "actor_loss" in agent.train_step(_batch(seed=delay))
    assert not np.array_equal(agent.actor_params(), actor0)
    assert (agent.actor_target is None) == name.startswith("crossq")


@pytest.mark.parametrize("name", ["td3", "crossq", "crossq-sac"])
def test_the_agent_publishes_its_learners_average_of_the_actor_and_resumes_it(name) -> None:
    torch.manual_seed(0)
    agent = Agent(SPEC, name, lr=1e-3)
    rate = learner_class(name).publish_average
    assert (rate > 0) == (name == "crossq-sac")  # the stochastic learner's deterministic actor swings
    avg = get_flat(agent.actor).astype(np.float64)
    for i in range(1, 4 * agent.policy_freq + 1):
        agent.train_step(_batch(seed=i))
        if i % agent.policy_freq == 0:  # after each policy step: avg <- (1 - rate) avg + rate actor
            avg += rate * (get_flat(agent.actor) - avg)
    published = agent.actor_params()
    if rate == 0:
        np.testing.assert_array_equal(published, get_flat(agent.actor))
    else:
        assert not np.array_equal(published, get_flat(agent.actor))
        np.testing.assert_allclose(published, avg, rtol=0, atol=1e-6)
    # a resumed agent publishes the same average and goes on to the same bits
    again = Agent(SPEC, name, lr=1e-3)
    again.load_state(agent.state())
    np.testing.assert_array_equal(again.actor_params(), published)
    for a in (agent, again):
        torch.manual_seed(5)
        for i in range(agent.policy_freq):
            a.train_step(_batch(seed=100 + i))
    np.testing.assert_array_equal(again.actor_params(), agent.actor_params())


def test_the_learner_setting_is_validated_and_brings_its_defaults() -> None:
    cfg = RunConfig.from_preset("HalfCheetah-v5", algo="td3", learner="crossq")
    assert cfg.critic_hidden == LEARNER_DEFAULTS["crossq"]["critic_hidden"] == (2048, 2048)
    assert RunConfig.from_preset("HalfCheetah-v5", algo="td3", learner="crossq", critic_hidden=(64, 64)).critic_hidden == (64, 64)
    # an environment preset's network sizes win over the learner's (Pendulum: actor 64-64, critic 256-256)
    pend = RunConfig.from_preset("Pendulum-v1", algo="td3", learner="crossq")
    assert pend.critic_hidden == (256, 256) and pend.critic_lr == LEARNER_DEFAULTS["crossq"]["critic_lr"]
    with pytest.raises(ConfigError, match="learner"):
        RunConfig.from_preset("Pendulum-v1", algo="td3", learner="sac").validate()
    with pytest.raises(ConfigError, match="trains no critic"):
        RunConfig.from_preset("Pendulum-v1", algo="es", learner="crossq").validate()
    sac = RunConfig.from_preset("HalfCheetah-v5", algo="td3", learner="crossq-sac").resolve()
    assert sac.hidden == (256, 256) and sac.activation == "relu" and sac.critic_hidden == (256, 256)
    # a td3 run keeps the spec hash it always had; another learner's critic is another spec
    plain = RunConfig.from_preset("Pendulum-v1", algo="aesrl", learner="td3").resolve()
    other = RunConfig.from_preset("Pendulum-v1", algo="aesrl", learner="crossq",
                                  critic_hidden=plain.critic_hidden, critic_activation=plain.critic_activation,
                                  critic_lr=plain.critic_lr, actor_lr=plain.actor_lr).resolve()
    assert plain.spec_hash != other.spec_hash


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["td3", "crossq"])
def test_a_step_captured_as_a_cuda_graph_computes_what_the_eager_step_does(name) -> None:
    """The critic daemon's CUDA path: one critic step captured and replayed gives the eager step's
    losses and weights (target noise off, so both draw nothing)."""
    dev = "cuda"
    kw = {**KW, "policy_noise": 0.0}
    batch = {k: v.to(dev) for k, v in _batch().items()}
    torch.manual_seed(0)
    eager = learner_class(name)(SPEC, device=dev, capturable=True, **kw)
    captured = learner_class(name)(SPEC, device=dev, capturable=True, **kw)
    captured.load_state(eager.state())
    actor = SPEC.make_actor(dev)
    want = [eager.critic_step(batch, actor).tolist() for _ in range(8)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    got = []
    with torch.cuda.stream(side):
        got += [captured.critic_step(batch, actor).tolist() for _ in range(3)]
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    captured.opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        out = captured.critic_step(batch, actor)
    for _ in range(5):
        graph.replay()
        got.append(out.tolist())
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(get_flat(captured.critic), get_flat(eager.critic), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["td3", "crossq", "crossq-sac"])
def test_the_baseline_agent_trains_from_captured_graphs_on_cuda(name) -> None:
    from aesrl_queue.td3 import ReplayBuffer

    torch.manual_seed(0)
    agent = Agent(SPEC, name, lr=1e-3, device="cuda", capturable=True)
    if name == "crossq-sac":  # α near 0: the target's entropy term would hide the TD fit measured below
        agent.learner.log_alpha.data.fill_(-20.0)
    replay = ReplayBuffer(SPEC.obs_dim, SPEC.act_dim, 1000, device="cuda")
    b = _batch(500)
    replay.add_batch(*(b[k].numpy() for k in ("obs", "act", "rew", "next_obs", "done")))
    actor0 = agent.actor_params()
    critic = agent.learner.critic
    probe = {k: v.to("cuda") for k, v in b.items()}

    def td_loss() -> float:
        with torch.no_grad():
            critic.eval()
            q1, _ = critic(probe["obs"], probe["act"])
            return float(((q1.squeeze(1) - probe["rew"]) ** 2).mean())  # γ·Q' is small next to r here

    before = td_loss()
    for _ in range(300):
        agent.graph_step(replay, 64)
    assert agent.total_it == 300 and len(agent._graphs) == 2
    assert not np.array_equal(agent.actor_params(), actor0)
    assert td_loss() < before


def test_crossq_sac_draws_a_squashed_gaussian_around_the_flat_actor_and_tunes_its_temperature() -> None:
    """The policy's mean is the flat actor's pre-tanh output (the deterministic actor ES perturbs and
    workers run is its tanh); log π is the tanh-transformed Gaussian's; α moves toward the target
    entropy; the learner's log-std network and α resume from the checkpoint."""
    torch.manual_seed(0)
    learner = CrossQSACLearner(SPEC, **KW)
    actor = SPEC.make_actor()
    obs = torch.randn(512, SPEC.obs_dim)
    noise = torch.zeros(512, SPEC.act_dim)
    act, _ = learner.sample(actor, obs, noise)
    torch.testing.assert_close(act, actor(obs))  # no noise: the deterministic actor
    act, logp = learner.sample(actor, obs)
    base = torch.distributions.Normal(actor.pre_tanh(obs), learner.log_std(obs).exp())
    want = torch.distributions.TransformedDistribution(base, [torch.distributions.TanhTransform()])
    torch.testing.assert_close(logp.squeeze(1), want.log_prob(act.clamp(-1 + 1e-6, 1 - 1e-6)).sum(-1),
                               atol=5e-3, rtol=1e-3)
    # a policy far wider than the target entropy allows (-act_dim): α falls
    opt = torch.optim.Adam(actor.parameters(), lr=1e-3)
    for i in range(30):
        learner.critic_step(_batch(seed=i), actor)
        learner.actor_step(actor, opt, obs[:64])
    assert float(learner.log_alpha) < 0.0
    saved = learner.state()
    again = CrossQSACLearner(SPEC, **KW)
    again.load_state(saved)
    assert float(again.log_alpha) == float(learner.log_alpha)
    torch.testing.assert_close(again.log_std(obs), learner.log_std(obs), rtol=0, atol=0)
    # the critic daemon's learner (no actor of its own) moves the log-std and α with each critic step,
    # never the target actor (μ) it draws around
    daemon = CrossQSACLearner(SPEC, **KW)
    mu = get_flat(actor)
    std0 = get_flat(daemon.log_std)
    for i in range(5):
        daemon.critic_step(_batch(seed=i), actor)
    assert not np.array_equal(get_flat(daemon.log_std), std0) and float(daemon.log_alpha) != 0.0
    np.testing.assert_array_equal(get_flat(actor), mu)
    # the baseline's behaviour action is a draw, inside the bounds
    rng = np.random.default_rng(0)
    draws = np.array([learner.explore(actor, obs[0], rng) for _ in range(50)])
    assert draws.shape == (50, SPEC.act_dim) and np.abs(draws).max() <= 1.0 and draws.std(0).min() > 0.01


def test_the_daemons_temperature_settles_where_mu_is_saturated() -> None:
    """With no actor of its own (the critic daemon) crossq-sac tunes α on the Gaussian's entropy before
    the squash: a μ whose pre-tanh output is far out (tanh at ±1) leaves the squashed policy below the
    target entropy at any width, and α tuned on that grows every step; on the Gaussian's it falls."""
    torch.manual_seed(0)
    daemon = CrossQSACLearner(SPEC, **KW)
    mu = SPEC.make_actor()
    with torch.no_grad():
        mu.layers[-1].weight.mul_(0.1)
        mu.layers[-1].bias.fill_(6.0)
    obs = _batch()["obs"]
    assert float(mu.pre_tanh(obs).abs().min()) > 3.0
    for i in range(100):
        daemon.critic_step(_batch(seed=i), mu)
    assert float(daemon.log_alpha) < -0.05
    # the same μ with the whole policy's entropy (the baseline's SAC step, where the mean trains too): α grows
    baseline = CrossQSACLearner(SPEC, **KW, delayed_targets=True)
    opt = torch.optim.Adam(mu.parameters(), lr=0.0)  # the mean held: only the entropy the squash leaves counts
    for i in range(100):
        baseline.critic_step(_batch(seed=i), mu)
        baseline.actor_step(mu, opt, obs)
    assert float(baseline.log_alpha) > 0.05
