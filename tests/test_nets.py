"""Tests of aesrl_queue.nets: torch and numpy actors agree, flat vectors round-trip, init is seeded.

No Redis, no environments; the 400-300 nets appear only in the forward-equality check.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from aesrl_queue.nets import (
    Actor,
    Critic,
    NetSpec,
    NumpyActor,
    actor_param_count,
    get_flat,
    init_actor_params,
    param_count,
    set_flat,
)


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def _random_actor(obs_dim, act_dim, max_action, hidden, activation, seed):
    actor = Actor(obs_dim, act_dim, max_action, hidden, activation)
    rng = np.random.default_rng(seed)
    # Larger than default-init weights so the output tanh is exercised away from zero.
    set_flat(actor, rng.normal(0.0, 0.3, param_count(actor)).astype(np.float32))
    return actor


@pytest.mark.parametrize(
    "hidden, activation",
    [((400, 300), "tanh"), ((8, 8), "tanh"), ((8, 8), "relu"), ((8, 8), "leaky_relu")],
)
def test_numpy_actor_matches_torch(hidden, activation):
    obs_dim, act_dim, max_action = 17, 6, 2.5
    actor = _random_actor(obs_dim, act_dim, max_action, hidden, activation, seed=1)
    na = NumpyActor(obs_dim, act_dim, max_action, hidden, activation)
    na.set_params(get_flat(actor))
    obs = np.random.default_rng(2).normal(0.0, 2.0, (64, obs_dim)).astype(np.float32)
    with torch.no_grad():
        ref = actor(torch.from_numpy(obs)).numpy()
    # Batched.
    out = na.act(obs)
    assert out.shape == (64, act_dim) and out.dtype == np.float32
    assert _rel_err(out, ref) < 1e-5
    # One observation at a time, float64 input as gymnasium gives it, with and without out=.
    buf = np.empty(act_dim, dtype=np.float32)
    for i in range(16):
        one = na.act(obs[i].astype(np.float64))
        assert one.shape == (act_dim,) and one.dtype == np.float32
        assert _rel_err(one, ref[i]) < 1e-5
        assert na.act(obs[i], out=buf) is buf
        assert _rel_err(buf, ref[i]) < 1e-5
    assert np.abs(out).max() <= max_action


def test_numpy_actor_params_round_trip_and_checks():
    actor = _random_actor(5, 2, 1.0, (8, 8), "tanh", seed=3)
    flat = get_flat(actor)
    na = NumpyActor(5, 2, 1.0, (8, 8))
    with pytest.raises(RuntimeError):
        na.act(np.zeros(5))
    na.set_params(flat)
    # the loaded weights, back in flat layout (torch's (out, in) row-major weight, then the bias)
    back = np.concatenate([p for wt, b in zip(na._wt, na._b, strict=True) for p in (wt.T.reshape(-1), b)])
    np.testing.assert_array_equal(back, flat)
    with pytest.raises(ValueError, match=rf"length 3.*expected {flat.size}"):
        na.set_params(flat[:3])
    bad = flat.copy()
    bad[0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        na.set_params(bad)
    with pytest.raises(ValueError):
        na.act(np.zeros(4))


def test_get_set_flat_round_trip():
    actor = Actor(4, 2, 1.0, (8, 8))
    flat = get_flat(actor)
    assert flat.dtype == np.float32 and flat.shape == (param_count(actor),)
    new = np.arange(flat.size, dtype=np.float32) / flat.size
    set_flat(actor, new)
    np.testing.assert_array_equal(get_flat(actor), new)
    # Layout: first layer's weight (out, in) row-major, then its bias.
    w0 = actor.layers[0].weight.detach().numpy()
    np.testing.assert_array_equal(w0.reshape(-1), new[: w0.size])
    critic = Critic(4, 2, (8, 8))
    cflat = get_flat(critic) + 1.0
    set_flat(critic, cflat)
    np.testing.assert_array_equal(get_flat(critic), cflat)


def test_set_flat_rejects_wrong_length_and_non_finite():
    actor = Actor(4, 2, 1.0, (8, 8))
    n = param_count(actor)
    with pytest.raises(ValueError) as exc:
        set_flat(actor, np.zeros(n + 1, dtype=np.float32))
    assert str(n + 1) in str(exc.value) and str(n) in str(exc.value)
    bad = np.zeros(n, dtype=np.float32)
    bad[-1] = np.inf
    before = get_flat(actor)
    with pytest.raises(ValueError, match="non-finite"):
        set_flat(actor, bad)
    np.testing.assert_array_equal(get_flat(actor), before)


@pytest.mark.parametrize("obs_dim, act_dim, hidden", [(17, 6, (400, 300)), (3, 1, (8, 8)), (376, 17, (256, 256)), (5, 2, (7,))])
def test_actor_param_count(obs_dim, act_dim, hidden):
    assert actor_param_count(obs_dim, act_dim, hidden) == param_count(Actor(obs_dim, act_dim, 1.0, hidden))


def test_halfcheetah_actor_dim():
    # 17*400+400 + 400*300+300 + 300*6+6
    assert actor_param_count(17, 6, (400, 300)) == 129_306


def test_init_actor_params_seeded():
    a = init_actor_params(17, 6, 1.0, (8, 8), "tanh", seed=7)
    b = init_actor_params(17, 6, 1.0, (8, 8), "tanh", seed=7)
    c = init_actor_params(17, 6, 1.0, (8, 8), "tanh", seed=8)
    assert a.dtype == np.float32 and a.size == actor_param_count(17, 6, (8, 8))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # PyTorch default init: uniform within ±1/sqrt(fan_in) for the first layer.
    w0 = a[: 17 * 8]
    assert np.abs(w0).max() <= 1 / np.sqrt(17) + 1e-6


def test_init_actor_params_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    init_actor_params(3, 1, 1.0, (8, 8), "tanh", seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_critic_shapes():
    critic = Critic(5, 2, (8, 8))
    s, a = torch.randn(10, 5), torch.randn(10, 2)
    q1, q2 = critic(s, a)
    assert q1.shape == (10, 1) and q2.shape == (10, 1)
    assert torch.allclose(critic.q1(s, a), q1)
    assert not torch.allclose(q1, q2)


def test_unknown_activation_rejected():
    with pytest.raises(ValueError, match="activation"):
        Actor(3, 1, 1.0, (8,), "gelu")
    with pytest.raises(ValueError, match="activation"):
        NetSpec(3, 1, 1.0, activation="sigmoid")


def test_netspec_builds_everything():
    spec = NetSpec(obs_dim=17, act_dim=6, max_action=1, hidden=[8, 8], critic_hidden=[16, 16])
    assert spec.hidden == (8, 8) and isinstance(spec.max_action, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.obs_dim = 3  # type: ignore[misc]
    actor, critic, na = spec.make_actor(), spec.make_critic(), spec.make_numpy_actor()
    assert param_count(actor) == spec.actor_dim == na.dim
    assert critic.hidden == (16, 16) and critic.activation == "leaky_relu"
    assert actor.activation == "tanh"
    assert spec == NetSpec.from_config(dataclasses.asdict(spec))
    assert hash(spec) == hash(NetSpec.from_config(dataclasses.asdict(spec)))
    np.testing.assert_array_equal(spec.init_actor_params(1), init_actor_params(17, 6, 1.0, (8, 8), "tanh", 1))
