"""Tests of aesrl_queue.rollout and aesrl_queue.envs: episode shapes, seeding, bad data, env lookup.

Uses HalfCheetah-v5 and Pendulum-v1 from gymnasium and the project's own Aesrl* test envs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import aesrl_queue.envs  # noqa: F401
from aesrl_queue.nets import NetSpec
from aesrl_queue.rollout import Episodes, NonFiniteError, env_dims, get_env, run_episodes

REPO = Path(__file__).resolve().parents[1]


def _actor(env_id: str, seed: int = 0, hidden=(8, 8), **env_kwargs):
    obs_dim, act_dim, max_action, _ = env_dims(env_id, **env_kwargs)
    spec = NetSpec(obs_dim, act_dim, max_action, hidden=hidden)
    na = spec.make_numpy_actor()
    na.set_params(spec.init_actor_params(seed))
    return na


def test_env_dims():
    assert env_dims("HalfCheetah-v5") == (17, 6, 1.0, 1000)
    assert env_dims("Pendulum-v1") == (3, 1, 2.0, 200)
    assert env_dims("AesrlNull-v0") == (3, 1, 2.0, 50)
    assert env_dims("AesrlNull-v0", episode_len=7) == (3, 1, 2.0, 7)


def test_halfcheetah_episode():
    ep = run_episodes("HalfCheetah-v5", _actor("HalfCheetah-v5"), k=1, seed=0)
    assert isinstance(ep, Episodes)
    assert ep.lengths == [1000] and ep.steps == 1000 and len(ep.returns) == 1
    tr = ep.transitions
    assert tr is not None
    assert tr["obs"].shape == (1000, 17) and tr["next_obs"].shape == (1000, 17)
    assert tr["act"].shape == (1000, 6) and tr["rew"].shape == (1000,) and tr["done"].shape == (1000,)
    assert all(v.dtype == np.float32 for v in tr.values())
    # Truncated by the time limit, never terminated: stored as not-done.
    assert not tr["done"].any()
    np.testing.assert_array_equal(tr["obs"][1:], tr["next_obs"][:-1])
    assert float(tr["rew"].sum(dtype=np.float64)) == pytest.approx(ep.returns[0], rel=1e-4, abs=1e-3)
    assert np.abs(tr["act"]).max() <= 1.0


def test_pendulum_episode_and_determinism():
    na = _actor("Pendulum-v1", seed=1)
    ep = run_episodes("Pendulum-v1", na, seed=3)
    assert ep.lengths == [200]
    assert ep.transitions["obs"].shape == (200, 3) and ep.transitions["act"].shape == (200, 1)
    assert np.abs(ep.transitions["act"]).max() <= 2.0
    again = run_episodes("Pendulum-v1", na, seed=3)
    assert again.returns == ep.returns
    np.testing.assert_array_equal(again.transitions["act"], ep.transitions["act"])
    other = run_episodes("Pendulum-v1", na, seed=4)
    assert other.returns != ep.returns


def test_random_actions():
    a = run_episodes("Pendulum-v1", None, seed=5, random_actions=True)
    b = run_episodes("Pendulum-v1", None, seed=5, random_actions=True)
    c = run_episodes("Pendulum-v1", None, seed=6, random_actions=True)
    np.testing.assert_array_equal(a.transitions["act"], b.transitions["act"])
    assert not np.array_equal(a.transitions["act"], c.transitions["act"])
    assert np.abs(a.transitions["act"]).max() <= 2.0
    # Null env's reward is -sum(a^2)/10 of the stored actions.
    n = run_episodes("AesrlNull-v0", None, seed=1, random_actions=True)
    acts = n.transitions["act"].astype(np.float64)
    np.testing.assert_allclose(n.transitions["rew"], -(acts**2).sum(axis=1) / 10, rtol=1e-6)
    with pytest.raises(ValueError, match="actor"):
        run_episodes("AesrlNull-v0", None)


def test_k_episodes_and_no_store():
    na = _actor("AesrlNull-v0")
    ep = run_episodes("AesrlNull-v0", na, k=3, seed=0)
    assert len(ep.returns) == 3 and ep.lengths == [50, 50, 50] and ep.steps == 150
    assert ep.transitions["obs"].shape == (150, 3)
    # Null is deterministic, so all three episodes are the same.
    assert ep.returns[0] == ep.returns[1] == ep.returns[2]
    ev = run_episodes("AesrlNull-v0", na, k=3, seed=0, store=False)
    assert ev.transitions is None and ev.returns == ep.returns
    short = run_episodes("AesrlNull-v0", na, k=2, env_kwargs={"episode_len": 7})
    assert short.lengths == [7, 7]


def test_terminating_env_marks_done():
    # Hopper falls over quickly under a random actor: its last transition is a termination.
    ep = run_episodes("Hopper-v5", None, seed=0, random_actions=True)
    assert ep.lengths[0] < 1000
    done = ep.transitions["done"]
    assert done[-1] == 1.0 and done[:-1].sum() == 0.0


@pytest.mark.parametrize("where", ["reward", "obs"])
def test_nan_env_raises(where):
    with pytest.raises(NonFiniteError, match="step 5") as exc:
        run_episodes("AesrlNaN-v0", _actor("AesrlNaN-v0"), seed=0, env_kwargs={"where": where})
    assert isinstance(exc.value, ValueError)


def test_unknown_env_id():
    with pytest.raises(ValueError, match="NoSuchEnv-v3"):
        run_episodes("NoSuchEnv-v3", None, random_actions=True)
    with pytest.raises(ValueError, match="NoSuchEnv-v3"):
        env_dims("NoSuchEnv-v3")
    with pytest.raises(ValueError, match="'not an id'"):
        get_env("not an id")


def test_unsupported_spaces():
    with pytest.raises(ValueError, match="action space"):
        env_dims("CartPole-v1")


def test_get_env_caches():
    assert get_env("AesrlNull-v0") is get_env("AesrlNull-v0")
    assert get_env("AesrlNull-v0", episode_len=9) is not get_env("AesrlNull-v0")


def test_sleep_env():
    na = _actor("AesrlSleep-v0", episode_len=5, mean_s=0.05, sigma=0.0)
    t0 = time.perf_counter()
    ep = run_episodes("AesrlSleep-v0", na, k=2, env_kwargs={"episode_len": 5, "mean_s": 0.05, "sigma": 0.0})
    assert time.perf_counter() - t0 >= 0.1
    assert ep.lengths == [5, 5]
    # Lognormal durations: fixed by (seed kwarg, reset seed), different across reset seeds.
    env = gym.make("AesrlSleep-v0", mean_s=1.0, sigma=0.5, seed=3).unwrapped
    durations = []
    for s in (1, 1, 2):
        env.reset(seed=s)
        durations.append(env.episode_duration)
    assert durations[0] == durations[1] != durations[2]
    assert all(d > 0 for d in durations)


def test_null_env_in_fresh_process():
    code = (
        "import aesrl_queue.rollout, gymnasium\n"
        "env = gymnasium.make('AesrlNull-v0')\n"
        "obs, _ = env.reset(seed=0)\n"
        "assert obs.shape == (3,)\n"
        "ep = aesrl_queue.rollout.run_episodes('AesrlNull-v0', None, random_actions=True, seed=0)\n"
        "assert ep.lengths == [50]\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
