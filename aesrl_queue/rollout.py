"""Episode rollouts of a numpy actor in a cached gymnasium environment, with transitions for the replay.

Torch-free on purpose: workers and the scheduler import it to read env dimensions and run episodes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

import aesrl_queue.envs  # noqa: F401  (registers the Aesrl* test environments)

if TYPE_CHECKING:
    from aesrl_queue.nets import NumpyActor

log = logging.getLogger(__name__)

TRANSITION_KEYS = ("obs", "act", "rew", "next_obs", "done")

# Buffer size for environments that declare no episode limit; grown by doubling when needed.
_DEFAULT_ROWS = 1000

_ENV_CACHE: dict[tuple[str, str], gym.Env] = {}
_LIMIT_CACHE: dict[int, int | None] = {}


class NonFiniteError(ValueError):
    """An environment produced a NaN or infinite reward or observation."""


def _cache_key(env_id: str, kwargs: dict[str, Any]) -> tuple[str, str]:
    # repr of the sorted items: kwargs values need not be hashable (lists, dicts from configs).
    return env_id, repr(sorted(kwargs.items()))


def get_env(env_id: str, **kwargs: Any) -> gym.Env:
    """The process's environment for (env_id, kwargs), created on first use and then reused.

    Creating a MuJoCo env costs tens of milliseconds, more than a short job's episodes.
    """
    key = _cache_key(env_id, kwargs)
    env = _ENV_CACHE.get(key)
    if env is None:
        try:
            env = gym.make(env_id, **kwargs)
        except gym.error.Error as exc:
            # Unregistered, misspelt, malformed or missing its package (e.g. mujoco).
            raise ValueError(
                f"cannot make environment {env_id!r}: {exc}. Hint: check the name and version against "
                f"gymnasium's registry (e.g. 'HalfCheetah-v5', 'Pendulum-v1'), or name your own as "
                f"'package.module:EnvName-v0'"
            ) from exc
        _ENV_CACHE[key] = env
        log.debug("created environment %s %s", env_id, kwargs or "")
    return env


def _episode_limit(env: gym.Env) -> int | None:
    """Maximum episode length: the TimeLimit wrapper's, else the env's own episode_len, else the spec's."""
    cached = _LIMIT_CACHE.get(id(env), -1)
    if cached != -1:
        return cached
    limit = None
    e: Any = env
    while isinstance(e, gym.Wrapper):
        if isinstance(e, gym.wrappers.TimeLimit):
            limit = int(e._max_episode_steps)
            break
        e = e.env
    if limit is None:
        own = getattr(env.unwrapped, "episode_len", None)
        if isinstance(own, int) and own > 0:
            limit = own
        elif env.spec is not None and env.spec.max_episode_steps:
            limit = int(env.spec.max_episode_steps)
    _LIMIT_CACHE[id(env)] = limit
    return limit


def alive_bonus(env_id: str, **env_kwargs: Any) -> float:
    """The reward an environment pays per step for staying alive (0 where it pays none).

    Gymnasium's MuJoCo locomotion tasks keep it as `_healthy_reward` (Hopper, Walker2d, Ant: 1,
    Humanoid: 5, or the healthy_reward keyword they were made with)."""
    value = getattr(get_env(env_id, **env_kwargs).unwrapped, "_healthy_reward", 0.0)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    return value if np.isfinite(value) and value > 0 else 0.0


def env_dims(env_id: str, **env_kwargs: Any) -> tuple[int, int, float, int]:
    """(obs_dim, act_dim, max_action, max_episode_steps) of an environment.

    The actor needs a flat Box observation and a symmetric Box action with one bound for all
    dimensions (its output is max_action·tanh); anything else is rejected with the reason.
    """
    env = get_env(env_id, **env_kwargs)
    obs_space, act_space = env.observation_space, env.action_space
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise ValueError(
            f"{env_id}: observation space {obs_space} is not supported; the actor needs a flat Box "
            f"(wrap the env with gymnasium.wrappers.FlattenObservation)"
        )
    if not isinstance(act_space, gym.spaces.Box) or len(act_space.shape) != 1:
        raise ValueError(f"{env_id}: action space {act_space} is not supported; the actor needs a 1-D continuous Box")
    low, high = np.asarray(act_space.low, np.float64), np.asarray(act_space.high, np.float64)
    if not (np.isfinite(high).all() and np.isfinite(low).all()):
        raise ValueError(f"{env_id}: action bounds must be finite, got low={low} high={high}")
    if not np.allclose(low, -high) or not np.allclose(high, high[0]) or high[0] <= 0:
        raise ValueError(
            f"{env_id}: action space must be symmetric with one bound for every dimension "
            f"(the actor outputs max_action·tanh), got low={low} high={high}; rescale it with "
            f"gymnasium.wrappers.RescaleAction"
        )
    limit = _episode_limit(env)
    if limit is None:
        raise ValueError(
            f"{env_id}: the environment has no episode limit; pass max_episode_steps in the env kwargs"
        )
    return int(obs_space.shape[0]), int(act_space.shape[0]), float(high[0]), int(limit)


@dataclasses.dataclass
class Episodes:
    """Returns and lengths of k episodes, and their transitions when stored.

    transitions: obs, act, next_obs (N, dim) and rew, done (N,), all float32; done is 1.0 only on
    termination (a time-limit truncation is 0.0, so the critic bootstraps through it).
    """

    returns: list[float]
    lengths: list[int]
    transitions: dict[str, np.ndarray] | None = None

    @property
    def steps(self) -> int:
        return int(sum(self.lengths))


class _Buffers:
    """Preallocated float32 rows for one call; grown by doubling only for envs without a limit."""

    def __init__(self, rows: int, obs_dim: int, act_dim: int) -> None:
        self.obs = np.empty((rows, obs_dim), dtype=np.float32)
        self.act = np.empty((rows, act_dim), dtype=np.float32)
        self.rew = np.empty(rows, dtype=np.float32)
        self.next_obs = np.empty((rows, obs_dim), dtype=np.float32)
        self.done = np.empty(rows, dtype=np.float32)

    @property
    def rows(self) -> int:
        return self.rew.shape[0]

    def grow(self) -> None:
        for name in TRANSITION_KEYS:
            old = getattr(self, name)
            new = np.empty((2 * old.shape[0], *old.shape[1:]), dtype=np.float32)
            new[: old.shape[0]] = old
            setattr(self, name, new)


_SCRATCH: dict[tuple[int, int, int], _Buffers] = {}


def _check_obs(env_id: str, next_obs: np.ndarray, ep: int) -> None:
    """Raise NonFiniteError naming the first step of an episode whose observation is NaN/inf."""
    if np.isfinite(next_obs).all():
        return
    bad = int(np.argmax(~np.isfinite(next_obs).all(axis=1)))
    raise NonFiniteError(
        f"{env_id}: non-finite observation at step {bad + 1} of episode {ep + 1}: {next_obs[bad]}"
    )


def run_episodes(
    env_id: str,
    actor: NumpyActor | None,
    k: int = 1,
    seed: int | None = None,
    random_actions: bool = False,
    store: bool = True,
    env_kwargs: dict[str, Any] | None = None,
) -> Episodes:
    """Run k episodes of a deterministic actor (or of uniform random actions) in the cached env.

    The first episode resets with seed; later ones continue the env's RNG. random_actions seeds
    the action space with seed. A NaN/inf reward or observation raises NonFiniteError.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if actor is None and not random_actions:
        raise ValueError("run_episodes needs an actor unless random_actions=True")
    env = get_env(env_id, **(env_kwargs or {}))
    obs_dim = int(env.observation_space.shape[0])
    act_dim = int(env.action_space.shape[0])
    if actor is not None and not random_actions and (actor.obs_dim, actor.act_dim) != (obs_dim, act_dim):
        raise ValueError(
            f"actor dims (obs {actor.obs_dim}, act {actor.act_dim}) do not match {env_id} (obs {obs_dim}, act {act_dim})"
        )
    limit = _episode_limit(env)
    per_episode = limit if limit is not None else _DEFAULT_ROWS
    if store:
        buf = _Buffers(k * per_episode, obs_dim, act_dim)
    else:
        # Evaluation episodes are not returned: reuse one scratch set per env and shape.
        skey = (id(env), per_episode, k)
        buf = _SCRATCH.get(skey)
        if buf is None:
            buf = _SCRATCH[skey] = _Buffers(k * per_episode, obs_dim, act_dim)
    if random_actions and seed is not None:
        env.action_space.seed(seed)

    step = env.step
    sample = env.action_space.sample
    act_fn = None if random_actions else actor.act
    isfinite = math.isfinite
    returns: list[float] = []
    lengths: list[int] = []
    n = 0
    for ep in range(k):
        obs0, _ = env.reset(seed=seed if ep == 0 else None)
        if not np.isfinite(obs0).all():
            raise NonFiniteError(f"{env_id}: non-finite observation at reset of episode {ep + 1}: {obs0}")
        start = n
        obs = obs0
        ep_ret = 0.0
        t = 0
        while True:
            if n >= buf.rows:
                buf.grow()
            a = buf.act[n]
            if act_fn is None:
                a[...] = sample()
            else:
                act_fn(obs, out=a)
            obs, r, terminated, truncated, _ = step(a)
            t += 1
            if not isfinite(r):
                # A bad observation earlier in the episode is the likelier cause: name it first.
                _check_obs(env_id, buf.next_obs[start:n], ep)
                raise NonFiniteError(f"{env_id}: non-finite reward {r} at step {t} of episode {ep + 1}")
            ep_ret += r
            buf.rew[n] = r
            buf.next_obs[n] = obs
            buf.done[n] = 1.0 if terminated else 0.0
            n += 1
            if terminated or truncated or (limit is not None and t >= limit):
                break
        # Checking observations once per episode, vectorised, costs far less than per step;
        # the episode's data is discarded either way.
        _check_obs(env_id, buf.next_obs[start:n], ep)
        # obs[t] is next_obs[t-1] within an episode; fill them in one copy instead of per step.
        buf.obs[start] = obs0
        buf.obs[start + 1:n] = buf.next_obs[start:n - 1]
        returns.append(float(ep_ret))
        lengths.append(t)

    transitions = None
    if store:
        transitions = {name: getattr(buf, name)[:n] for name in TRANSITION_KEYS}
    return Episodes(returns=returns, lengths=lengths, transitions=transitions)
