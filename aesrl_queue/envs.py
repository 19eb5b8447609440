"""Cheap test and simulation environments, registered with gymnasium on import.

AesrlNull-v0 (no CPU cost), AesrlSleep-v0 (timed episodes that sleep) and AesrlNaN-v0 (bad data).

Also the environments a user registered in the process that called `aesrl_queue.train`: it hands
their registrations to its child processes in $AESRL_ENVS (JSON: id -> gymnasium.register keyword
arguments, entry point as "module:Class"), and every process that imports this module registers
them, so that the workers it started make the same environment.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

OBS_DIM = 3
ACT_DIM = 1
MAX_ACTION = 2.0


class NullEnv(gym.Env):
    """obs dim 3, act dim 1 in [-2, 2], fixed-length episodes, reward −Σa²/10; does ~nothing.

    The obs is (t/episode_len, last action, 1): deterministic, so rollouts are reproducible.
    Episodes end by truncation at episode_len steps (terminated is never set).
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, episode_len: int = 50) -> None:
        if int(episode_len) < 1:
            raise ValueError(f"episode_len must be >= 1, got {episode_len}")
        self.episode_len = int(episode_len)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(OBS_DIM,), dtype=np.float32)
        self.action_space = spaces.Box(-MAX_ACTION, MAX_ACTION, shape=(ACT_DIM,), dtype=np.float32)
        self._t = 0

    def _obs(self, a: float) -> np.ndarray:
        return np.array([self._t / self.episode_len, a, 1.0], dtype=np.float32)

    def _reward(self, action: np.ndarray) -> float:
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        return -float(np.dot(a, a)) / 10.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(0.0), {}

    def step(self, action: np.ndarray):
        self._t += 1
        reward = self._reward(action)
        a0 = float(np.asarray(action).reshape(-1)[0])
        return self._obs(a0), reward, False, self._t >= self.episode_len, {}


class SleepEnv(NullEnv):
    """Like AesrlNull-v0, but each episode takes wall time drawn at reset and slept at its last step.

    The duration is lognormal with mean mean_s and log-std sigma (fixed mean_s when sigma == 0);
    the draw comes from an RNG seeded by `seed`, re-seeded from (seed, reset seed) on a seeded
    reset so that a job's seed fixes its duration on any machine. Sleeping once per episode keeps
    it free of CPU cost and of per-step timer granularity.
    """

    def __init__(self, episode_len: int = 50, mean_s: float = 0.1, sigma: float = 0.0, seed: int = 0) -> None:
        super().__init__(episode_len)
        if not (math.isfinite(mean_s) and mean_s >= 0):
            raise ValueError(f"mean_s must be a finite number >= 0, got {mean_s}")
        if not (math.isfinite(sigma) and sigma >= 0):
            raise ValueError(f"sigma must be a finite number >= 0, got {sigma}")
        self.mean_s, self.sigma, self.seed = float(mean_s), float(sigma), int(seed)
        self._dur_rng = np.random.default_rng(self.seed)
        self.episode_duration = 0.0

    def _draw(self) -> float:
        if self.sigma == 0.0 or self.mean_s == 0.0:
            return self.mean_s
        # mu chosen so that E[duration] = mean_s.
        mu = math.log(self.mean_s) - 0.5 * self.sigma**2
        return float(self._dur_rng.lognormal(mu, self.sigma))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._dur_rng = np.random.default_rng([self.seed, int(seed) & 0xFFFFFFFFFFFFFFFF])
        self.episode_duration = self._draw()
        return super().reset(seed=seed, options=options)

    def step(self, action: np.ndarray):
        out = super().step(action)
        if self._t == self.episode_len and self.episode_duration > 0:
            time.sleep(self.episode_duration)
        return out


class NaNEnv(NullEnv):
    """Like AesrlNull-v0, but step nan_step (1-based) returns a NaN reward, or a NaN observation with where="obs"."""

    def __init__(self, episode_len: int = 50, nan_step: int = 5, where: str = "reward") -> None:
        super().__init__(episode_len)
        if where not in ("reward", "obs"):
            raise ValueError(f"where must be 'reward' or 'obs', got {where!r}")
        self.nan_step, self.where = int(nan_step), where

    def step(self, action: np.ndarray):
        obs, reward, terminated, truncated, info = super().step(action)
        if self._t == self.nan_step:
            if self.where == "reward":
                reward = float("nan")
            else:
                obs[1] = np.nan
        return obs, reward, terminated, truncated, info


ENV_IDS = {
    "AesrlNull-v0": "aesrl_queue.envs:NullEnv",
    "AesrlSleep-v0": "aesrl_queue.envs:SleepEnv",
    "AesrlNaN-v0": "aesrl_queue.envs:NaNEnv",
}


ENVS_VAR = "AESRL_ENVS"


def register_envs() -> None:
    """Register the project's environments, and those of $AESRL_ENVS, once per process (safe to call again)."""
    for env_id, entry_point in ENV_IDS.items():
        if env_id not in gym.registry:
            # No max_episode_steps: the envs truncate themselves at their episode_len kwarg,
            # which a fixed TimeLimit could not follow.
            gym.register(id=env_id, entry_point=entry_point)
    try:
        handed = json.loads(os.environ.get(ENVS_VAR) or "{}")
    except ValueError:
        handed = {}
    for env_id, kwargs in handed.items() if isinstance(handed, dict) else ():
        if env_id not in gym.registry and isinstance(kwargs, dict):
            gym.register(id=env_id, **kwargs)


register_envs()
