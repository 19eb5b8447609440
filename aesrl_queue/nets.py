"""Actor and twin-critic networks (torch), flat parameter vectors; the numpy actor is in numpy_actor.

The flat float32 layout here (parameters() order, row-major weights) is the one every job and blob uses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# The torch-free parts live in numpy_actor (workers of ES-only runs never import torch); the
# dependency goes one way only: numpy_actor knows nothing of this module.
from aesrl_queue import numpy_actor
from aesrl_queue.numpy_actor import (  # noqa: F401
    ACTIVATIONS,
    LEAKY_SLOPE,
    NumpyActor,
    _check_activation,
    _check_hidden,
    _leaky_inplace,
    _relu_inplace,
    _tanh_inplace,
    actor_param_count,
)


def _torch_activation(name: str):
    if name == "tanh":
        return torch.tanh
    if name == "relu":
        return F.relu
    return _leaky_relu


def _leaky_relu(x: torch.Tensor) -> torch.Tensor:
    return F.leaky_relu(x, LEAKY_SLOPE)


def _mlp(sizes: Sequence[int]) -> nn.ModuleList:
    return nn.ModuleList(nn.Linear(i, o) for i, o in zip(sizes[:-1], sizes[1:], strict=True))


def _mlp_forward(layers: nn.ModuleList, act, x: torch.Tensor) -> torch.Tensor:
    """x through `layers` with `act` between them (none after the last)."""
    last = len(layers) - 1
    # Iterate instead of slicing: a ModuleList slice builds a new module on every call.
    for i, layer in enumerate(layers):
        x = layer(x)
        if i < last:
            x = act(x)
    return x


class Actor(nn.Module):
    """Deterministic policy: MLP with a configurable hidden activation and a max_action·tanh output."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        max_action: float,
        hidden: Sequence[int] = (400, 300),
        activation: str = "tanh",
    ) -> None:
        super().__init__()
        self.obs_dim, self.act_dim = int(obs_dim), int(act_dim)
        self.max_action = float(max_action)
        self.hidden = _check_hidden(hidden)
        self.activation = _check_activation(activation)
        self.layers = _mlp((self.obs_dim, *self.hidden, self.act_dim))
        self._act = _torch_activation(activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.max_action * torch.tanh(self.pre_tanh(obs))

    def pre_tanh(self, obs: torch.Tensor) -> torch.Tensor:
        """The last layer's output before the squashing tanh (a SAC-style learner's Gaussian mean)."""
        return _mlp_forward(self.layers, self._act, obs)


class Critic(nn.Module):
    """TD3 twin critics Q1, Q2 on concat(s, a); two independent MLPs with one scalar output each."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (400, 300),
        activation: str = "leaky_relu",
    ) -> None:
        super().__init__()
        self.obs_dim, self.act_dim = int(obs_dim), int(act_dim)
        self.hidden = _check_hidden(hidden)
        self.activation = _check_activation(activation)
        sizes = (self.obs_dim + self.act_dim, *self.hidden, 1)
        self.head1 = _mlp(sizes)
        self.head2 = _mlp(sizes)
        self._act = _torch_activation(activation)

    def _head(self, layers: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
        return _mlp_forward(layers, self._act, x)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs, act], dim=-1)
        return self._head(self.head1, x), self._head(self.head2, x)

    def q1(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """Q1 only: the actor's objective, so Q2 is not computed."""
        return self._head(self.head1, torch.cat([obs, act], dim=-1))


# -- flat parameter vectors -------------------------------------------------------------------


def param_count(module: nn.Module) -> int:
    """Number of scalars in module.parameters()."""
    return sum(p.numel() for p in module.parameters())


def get_flat(module: nn.Module) -> np.ndarray:
    """All parameters as one float32 vector, in module.parameters() order, weights row-major."""
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
        return flat.to(device="cpu", dtype=torch.float32).numpy().copy()


def set_flat(module: nn.Module, flat: np.ndarray) -> None:
    """Load a vector written by get_flat; rejects a wrong length or non-finite values."""
    arr = np.asarray(flat, dtype=np.float32).reshape(-1)
    expected = param_count(module)
    if arr.size != expected:
        raise ValueError(f"flat parameter vector has length {arr.size}, expected {expected}")
    if not np.isfinite(arr).all():
        raise ValueError(f"flat parameter vector has {int((~np.isfinite(arr)).sum())} non-finite values")
    src = torch.from_numpy(arr)
    pos = 0
    with torch.no_grad():
        for p in module.parameters():
            n = p.numel()
            p.copy_(src[pos:pos + n].view_as(p))
            pos += n


def init_actor_params(
    obs_dim: int,
    act_dim: int,
    max_action: float,
    hidden: Sequence[int],
    activation: str,
    seed: int,
) -> np.ndarray:
    """PyTorch-default-initialised actor parameters, reproducible for a seed.

    The global torch RNG is forked, so callers' random streams are left untouched.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        actor = Actor(obs_dim, act_dim, max_action, hidden, activation)
    return get_flat(actor)


@dataclasses.dataclass(frozen=True)
class NetSpec(numpy_actor.NetSpec):
    """The run's network spec with the torch builders (the actor, the twin critic, μ₀)."""

    def make_actor(self, device: str | torch.device = "cpu") -> Actor:
        return Actor(self.obs_dim, self.act_dim, self.max_action, self.hidden, self.activation).to(device)

    def make_critic(self, device: str | torch.device = "cpu") -> Critic:
        return Critic(self.obs_dim, self.act_dim, self.critic_hidden, self.critic_activation).to(device)

    def init_actor_params(self, seed: int) -> np.ndarray:
        return init_actor_params(self.obs_dim, self.act_dim, self.max_action, self.hidden, self.activation, seed)
