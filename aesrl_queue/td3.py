"""TD3 building blocks shared by the learners (aesrl_queue.learners), the RL jobs and the TD3 baseline.

Critic/actor update steps, target updates, actor training from a flat vector, a replay buffer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from aesrl_queue.nets import Critic, NetSpec, get_flat, set_flat

log = logging.getLogger(__name__)

BATCH_KEYS = ("obs", "act", "rew", "next_obs", "done")


def pick_device(requested: str | torch.device | None) -> torch.device:
    """The torch device of a critic daemon or TD3 run: "auto" (or none) is CUDA where torch sees one."""
    if requested in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(requested)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but torch sees no CUDA device here; use --device cpu")
    return dev


def warm_up_torch() -> None:
    """Pay torch's lazy imports (torch._dynamo on the first optimizer, ~2 s) now.

    Call it in a worker's parent process before it forks job processes, so no job pays it.
    """
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([p], lr=1e-3)
    p.grad = torch.zeros(1)
    opt.step()


def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target ← (1 − tau)·target + tau·source, parameter by parameter."""
    with torch.no_grad():
        for tp, sp in zip(target.parameters(), source.parameters(), strict=True):
            tp.lerp_(sp, tau)


def hard_update(target: nn.Module, source: nn.Module) -> None:
    """target ← source."""
    with torch.no_grad():
        for tp, sp in zip(target.parameters(), source.parameters(), strict=True):
            tp.copy_(sp)


def critic_step(
    critic: Critic,
    critic_target: Critic,
    critic_opt: torch.optim.Optimizer,
    target_actor: nn.Module,
    batch: dict[str, torch.Tensor],
    gamma: float,
    tau: float,
    policy_noise: float,
    noise_clip: float,
    max_action: float,
    update_target: bool,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """critic_update's step, returning [loss, mean Q1] as a tensor on the device: no host sync, so a
    CUDA graph can capture it (the critic daemon does)."""
    obs, act, next_obs = batch["obs"], batch["act"], batch["next_obs"]
    # Rewards and dones may come as (B,) or (B, 1); the critic's outputs are (B, 1).
    rew = batch["rew"].reshape(-1, 1)
    done = batch["done"].reshape(-1, 1)
    with torch.no_grad():
        noise = torch.randn(act.shape, generator=generator, device=act.device, dtype=act.dtype)
        # Not scaled by max_action, as in the official code (matters for Humanoid, max_action 0.4).
        noise = (noise * policy_noise).clamp_(-noise_clip, noise_clip)
        next_act = (target_actor(next_obs) + noise).clamp_(-max_action, max_action)
        tq1, tq2 = critic_target(next_obs, next_act)
        y = rew + gamma * (1.0 - done) * torch.min(tq1, tq2)
    q1, q2 = critic(obs, act)
    loss = F.mse_loss(q1, y) + F.mse_loss(q2, y)
    critic_opt.zero_grad(set_to_none=True)
    loss.backward()
    critic_opt.step()
    if update_target:
        soft_update(critic_target, critic, tau)
    return torch.stack([loss.detach(), q1.detach().mean()])


def critic_update(
    critic: Critic,
    critic_target: Critic,
    critic_opt: torch.optim.Optimizer,
    target_actor: nn.Module,
    batch: dict[str, torch.Tensor],
    gamma: float = 0.99,
    tau: float = 0.005,
    policy_noise: float = 0.2,
    noise_clip: float = 0.5,
    max_action: float = 1.0,
    update_target: bool = True,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """One TD3 critic step; returns {"loss", "q1_mean"}.

    y = r + γ(1 − done)·min(Q1', Q2')(s', clamp(π'(s') + clip(N(0, policy_noise)), ±max_action)),
    loss = MSE(Q1, y) + MSE(Q2, y). critic_target is then soft-updated with tau unless
    update_target is False (the TD3 baseline delays it to its policy steps).
    """
    stats = critic_step(
        critic, critic_target, critic_opt, target_actor, batch, gamma, tau,
        policy_noise, noise_clip, max_action, update_target, generator,
    )
    # One host sync for both numbers (matters on a GPU).
    loss, q1_mean = stats.tolist()
    return {"loss": loss, "q1_mean": q1_mean}


def _actor_step(actor: nn.Module, critic: Critic, actor_opt: torch.optim.Optimizer, obs: torch.Tensor) -> torch.Tensor:
    # a stochastic learner's job critic (SACJobCritic) gives its own loss; TD3's and CrossQ's, -Q1
    loss = critic.actor_loss(actor, obs) if hasattr(critic, "actor_loss") else -critic.q1(obs, actor(obs)).mean()
    params = [p for p in actor.parameters() if p.requires_grad]
    # Gradients w.r.t. the actor only: nothing accumulates on the critic, whether or not its
    # parameters require grad, and autograd skips the critic's weight gradients entirely.
    grads = torch.autograd.grad(loss, params)
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    actor_opt.step()
    return loss.detach()


def train_actor(
    flat_params: np.ndarray,
    spec: NetSpec,
    critic: Critic,
    sample_obs: Callable[[int], np.ndarray | torch.Tensor],
    steps: int,
    batch_size: int = 256,
    lr: float = 1e-3,
    device: str | torch.device = "cpu",
    betas: tuple[float, float] = (0.9, 0.999),
) -> np.ndarray:
    """Train an actor from flat_params against a fixed critic's Q1 with a fresh Adam (an RL job; the
    learner gives the critic and Adam's betas).

    The critic is moved to device and left with requires_grad as it was. Returns float32 params.
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    device = torch.device(device)
    actor = spec.make_actor()
    set_flat(actor, flat_params)
    actor.to(device)
    critic.to(device)
    opt = torch.optim.Adam(actor.parameters(), lr=lr, betas=betas)
    loss = None
    for step in range(steps):
        obs = sample_obs(batch_size)
        # A tensor (e.g. from a replay buffer already on the device) skips the numpy round trip.
        if isinstance(obs, torch.Tensor):
            obs_t = obs.to(device=device, dtype=torch.float32)
        else:
            obs_t = torch.from_numpy(np.asarray(obs, dtype=np.float32)).to(device)
        if obs_t.ndim != 2 or obs_t.shape[1] != spec.obs_dim:
            raise ValueError(
                f"sample_obs({batch_size}) returned shape {tuple(obs_t.shape)}, expected (N, {spec.obs_dim})"
            )
        loss = _actor_step(actor, critic, opt, obs_t)
        if step == 0:
            log.debug("train_actor: first loss %.4g", float(loss))
    flat = get_flat(actor)
    if not np.isfinite(flat).all():
        raise ValueError(f"train_actor produced non-finite parameters after {steps} steps")
    if loss is not None:
        log.debug("train_actor: %d steps, last loss %.4g", steps, float(loss))
    return flat


class ReplayBuffer:
    """Ring buffer of transitions as torch tensors on one device, sampled uniformly.

    obs_only=True stores states alone, for RL workers that only need s to train an actor.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        capacity: int,
        device: str | torch.device = "cpu",
        obs_only: bool = False,
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.obs_dim, self.act_dim = int(obs_dim), int(act_dim)
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self.obs_only = bool(obs_only)
        self._pos = 0  # next row to write
        self._size = 0
        self.total_added = 0
        shapes = {"obs": (self.obs_dim,)}
        if not self.obs_only:
            shapes.update(act=(self.act_dim,), rew=(), next_obs=(self.obs_dim,), done=())
        self._data = {
            k: torch.zeros((self.capacity, *s), dtype=torch.float32, device=self.device) for k, s in shapes.items()
        }

    def __len__(self) -> int:
        return self._size

    def _check(self, name: str, arr: np.ndarray, n: int, shape: tuple[int, ...]) -> np.ndarray:
        a = np.ascontiguousarray(arr, dtype=np.float32)
        if a.shape != (n, *shape):
            # A (N, 1) reward/done column is accepted as (N,).
            if shape == () and a.shape == (n, 1):
                a = a.reshape(n)
            else:
                raise ValueError(f"replay add_batch: {name} has shape {a.shape}, expected {(n, *shape)}")
        if not np.isfinite(a).all():
            raise ValueError(f"replay add_batch: {name} has non-finite values")
        return a

    def add_batch(
        self,
        obs: np.ndarray,
        act: np.ndarray | None = None,
        rew: np.ndarray | None = None,
        next_obs: np.ndarray | None = None,
        done: np.ndarray | None = None,
    ) -> None:
        """Append N rows, overwriting the oldest once full; in obs_only mode only obs is used."""
        n = int(np.shape(obs)[0]) if np.ndim(obs) >= 1 else -1
        if n < 0:
            raise ValueError("replay add_batch: obs must be an (N, obs_dim) array")
        given = {"obs": obs, "act": act, "rew": rew, "next_obs": next_obs, "done": done}
        rows = {}
        for k, t in self._data.items():
            if given[k] is None:
                raise ValueError(f"replay add_batch: {k} is required unless obs_only=True")
            rows[k] = self._check(k, given[k], n, tuple(t.shape[1:]))
        if n == 0:
            return
        self.total_added += n
        if n > self.capacity:
            # Only the newest `capacity` rows would survive anyway.
            rows = {k: v[-self.capacity:] for k, v in rows.items()}
            n = self.capacity
        first = min(n, self.capacity - self._pos)
        for k, t in self._data.items():
            src = torch.from_numpy(rows[k])
            t[self._pos:self._pos + first].copy_(src[:first])
            if first < n:
                t[:n - first].copy_(src[first:])
        self._pos = (self._pos + n) % self.capacity
        self._size = min(self._size + n, self.capacity)

    def _indices(self, batch_size: int, generator: torch.Generator | None) -> torch.Tensor:
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        if generator is None:
            return torch.randint(0, self._size, (batch_size,), device=self.device)
        idx = torch.randint(0, self._size, (batch_size,), generator=generator, device=generator.device)
        return idx.to(self.device)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Uniform sample with replacement: obs, act, rew (B,), next_obs, done (B,) — or obs only."""
        idx = self._indices(batch_size, generator)
        return {k: t.index_select(0, idx) for k, t in self._data.items()}

    def sample_in_graph(self, batch_size: int, size: torch.Tensor) -> dict[str, torch.Tensor]:
        """Uniform sample of the first `size` rows (a 0-d float tensor on the buffer's device) with no host
        sync: what a step captured in a CUDA graph can replay while the buffer grows (the storage is
        allocated at full capacity, so its addresses never change; update `size` in place)."""
        idx = torch.minimum((torch.rand(batch_size, device=self.device) * size).long(), size.long() - 1)
        return {k: t.index_select(0, idx) for k, t in self._data.items()}

    def sample_obs(self, n: int, generator: torch.Generator | None = None) -> np.ndarray:
        """n states as a float32 numpy array (for train_actor's sample_obs)."""
        idx = self._indices(n, generator)
        return self._data["obs"].index_select(0, idx).cpu().numpy()


def to_numpy(obj: Any) -> Any:
    """Tensors to numpy arrays (copies), recursively (optimizer state → msgpack-able)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy().copy()  # a CPU tensor would share its memory with the live state
    if isinstance(obj, dict):
        return {k: to_numpy(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_numpy(v) for v in obj]
    return obj


def to_tensors(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj)).to(device)
    if isinstance(obj, dict):
        return {k: to_tensors(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_tensors(v, device) for v in obj]
    return obj
