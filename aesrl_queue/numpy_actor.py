"""The torch-free half of the networks: the numpy actor that rollouts run, and the spec of a run's nets.

Workers of ES-only runs import only this (no torch: ~55 MB and <1 s per process instead of ~230 MB
and several seconds), which is what lets dozens of worker processes share one machine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

ACTIVATIONS = ("tanh", "relu", "leaky_relu")

# torch's default slope for F.leaky_relu / nn.LeakyReLU, which the official code uses.
LEAKY_SLOPE = 0.01

# The bounds SAC's implementations clamp a squashed Gaussian policy's log-std to (the torch learner and
# the numpy player of its draws use these).
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def _check_activation(name: str) -> str:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; expected one of {', '.join(ACTIVATIONS)}")
    return name


def _check_hidden(hidden: Sequence[int]) -> tuple[int, ...]:
    out = tuple(int(h) for h in hidden)
    if not out or any(h <= 0 for h in out):
        raise ValueError(f"hidden must be a non-empty list of positive layer sizes, got {hidden!r}")
    return out


def actor_param_count(obs_dim: int, act_dim: int, hidden: Sequence[int]) -> int:
    """Length of an actor's flat vector, computed without building torch modules."""
    sizes = (int(obs_dim), *_check_hidden(hidden), int(act_dim))
    return sum(i * o + o for i, o in zip(sizes[:-1], sizes[1:], strict=True))


# -- numpy actor for rollouts -----------------------------------------------------------------


def _tanh_inplace(h: np.ndarray, scratch: np.ndarray) -> None:
    np.tanh(h, out=h)


def _relu_inplace(h: np.ndarray, scratch: np.ndarray) -> None:
    np.maximum(h, 0.0, out=h)


def _leaky_inplace(h: np.ndarray, scratch: np.ndarray) -> None:
    np.multiply(h, np.float32(LEAKY_SLOPE), out=scratch)
    np.maximum(h, scratch, out=h)


class NumpyActor:
    """The Actor's forward pass in float32 numpy: ~3× faster than torch for one observation.

    Weights are stored transposed (in, out) so that a 1-D observation is a single x @ W per layer,
    written into preallocated buffers; so one instance serves one thread. set_params reuses the
    arrays, so a process can keep one instance and load each job's parameters into it.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        max_action: float,
        hidden: Sequence[int] = (400, 300),
        activation: str = "tanh",
    ) -> None:
        self.obs_dim, self.act_dim = int(obs_dim), int(act_dim)
        self.max_action = np.float32(max_action)
        self.hidden = _check_hidden(hidden)
        self.activation = _check_activation(activation)
        self.sizes = (self.obs_dim, *self.hidden, self.act_dim)
        self.dim = actor_param_count(self.obs_dim, self.act_dim, self.hidden)
        pairs = list(zip(self.sizes[:-1], self.sizes[1:], strict=True))
        self._wt = [np.zeros((i, o), dtype=np.float32) for i, o in pairs]
        self._b = [np.zeros(o, dtype=np.float32) for _, o in pairs]
        # Per-layer output buffers for the 1-D path, plus a scratch buffer for leaky_relu.
        self._in = np.zeros(self.obs_dim, dtype=np.float32)
        self._h = [np.zeros(o, dtype=np.float32) for _, o in pairs]
        self._scratch = [np.zeros(o, dtype=np.float32) for o in self.hidden]
        # The 1-D path walks these tuples: one tuple unpack per layer, no attribute lookups.
        self._hidden_plan = list(zip(self._wt[:-1], self._b[:-1], self._h[:-1], self._scratch, strict=True))
        self._last_plan = (self._wt[-1], self._b[-1], self._h[-1])
        self._act_inplace = {"tanh": _tanh_inplace, "relu": _relu_inplace, "leaky_relu": _leaky_inplace}[
            self.activation
        ]
        self._loaded = False

    def set_params(self, flat: np.ndarray) -> None:
        """Load a flat vector in the torch Actor's get_flat layout."""
        arr = np.asarray(flat, dtype=np.float32).reshape(-1)
        if arr.size != self.dim:
            raise ValueError(f"flat parameter vector has length {arr.size}, expected {self.dim}")
        if not np.isfinite(arr).all():
            raise ValueError(f"flat parameter vector has {int((~np.isfinite(arr)).sum())} non-finite values")
        pos = 0
        for wt, b in zip(self._wt, self._b, strict=True):
            n_in, n_out = wt.shape
            # torch stores weight as (out, in) row-major; keep the transpose contiguous.
            wt[...] = arr[pos:pos + n_out * n_in].reshape(n_out, n_in).T
            pos += n_out * n_in
            b[...] = arr[pos:pos + n_out]
            pos += n_out
        self._loaded = True

    @property
    def pre_squash(self) -> np.ndarray:
        """The last 1-D `act`'s output before tanh and max_action (a view, overwritten by the next call):
        the mean of a squashed Gaussian policy whose deterministic actor this is."""
        return self._h[-1]

    def act(self, obs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Action for a 1-D observation (or rows of a 2-D batch), computed in float32.

        out, when given for a 1-D observation, receives the action (no new array is made).
        """
        if not self._loaded:
            raise RuntimeError("NumpyActor.act called before set_params")
        obs = np.asarray(obs)
        if obs.ndim == 1:
            if obs.shape[0] != self.obs_dim:
                raise ValueError(f"observation has {obs.shape[0]} values, expected {self.obs_dim}")
            x = self._in
            x[...] = obs
            act_inplace = self._act_inplace
            for wt, b, h, scratch in self._hidden_plan:
                np.dot(x, wt, out=h)
                np.add(h, b, out=h)
                act_inplace(h, scratch)
                x = h
            wt, b, h = self._last_plan
            np.dot(x, wt, out=h)
            np.add(h, b, out=h)
            x = h
            if out is None:
                out = np.empty(self.act_dim, dtype=np.float32)
            np.tanh(x, out=out)
            np.multiply(out, self.max_action, out=out)
            return out
        if obs.ndim != 2 or obs.shape[1] != self.obs_dim:
            raise ValueError(f"observation batch has shape {obs.shape}, expected (N, {self.obs_dim})")
        x = obs.astype(np.float32, copy=False)
        n = len(self._wt)
        for i in range(n):
            x = x @ self._wt[i]  # a new array: the caller's obs is never written
            x += self._b[i]
            if i < n - 1:
                self._act_inplace(x, np.empty_like(x))
        np.tanh(x, out=x)
        x *= self.max_action
        if out is not None:
            out[...] = x
            return out
        return x

    __call__ = act


# -- one spec for every network of a run -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NetSpec:
    """Everything needed to build a run's nets: the numpy actor here, the torch actor and critic
    through aesrl_queue.nets (`nets.NetSpec` is this spec with those builders)."""

    obs_dim: int
    act_dim: int
    max_action: float
    hidden: tuple[int, ...] = (400, 300)
    activation: str = "tanh"
    critic_hidden: tuple[int, ...] = (400, 300)
    critic_activation: str = "leaky_relu"

    def __post_init__(self) -> None:
        # Lists arrive from msgpack/JSON configs; tuples keep the spec hashable and comparable.
        object.__setattr__(self, "obs_dim", int(self.obs_dim))
        object.__setattr__(self, "act_dim", int(self.act_dim))
        object.__setattr__(self, "max_action", float(self.max_action))
        object.__setattr__(self, "hidden", _check_hidden(self.hidden))
        object.__setattr__(self, "critic_hidden", _check_hidden(self.critic_hidden))
        _check_activation(self.activation)
        _check_activation(self.critic_activation)
        if self.obs_dim <= 0 or self.act_dim <= 0:
            raise ValueError(f"obs_dim and act_dim must be positive, got {self.obs_dim}, {self.act_dim}")
        if not (np.isfinite(self.max_action) and self.max_action > 0):
            raise ValueError(f"max_action must be a positive finite number, got {self.max_action}")

    @classmethod
    def from_config(cls, cfg: object) -> NetSpec:
        """Build from any object or mapping with the same field names (e.g. a RunConfig)."""
        names = [f.name for f in dataclasses.fields(cls)]
        if isinstance(cfg, dict):
            return cls(**{k: cfg[k] for k in names if k in cfg})
        return cls(**{k: getattr(cfg, k) for k in names if hasattr(cfg, k)})

    @property
    def actor_dim(self) -> int:
        return actor_param_count(self.obs_dim, self.act_dim, self.hidden)

    def make_numpy_actor(self) -> NumpyActor:
        return NumpyActor(self.obs_dim, self.act_dim, self.max_action, self.hidden, self.activation)
