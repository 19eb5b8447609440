"""Diagonal Gaussian search distributions with ask/tell: AES-RL, (1+1)-ES, asynchronous and synchronous CEM.
They know nothing of Redis or clocks; their state() is plain data that a restart loads back.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from typing import Any

import numpy as np

from aesrl_queue import kernels, noise
from aesrl_queue.fitness import FitnessScale
from aesrl_queue.rules import (
    AESRL_VAR_RULES,
    MEAN_RULES,
    VAR_FLOOR,
    SuccessRule,
    update_ratio,
    variance_n,
)

DISTRIBUTIONS = ("aesrl", "opo", "acem", "cem")
AESRL_MEAN_RULES = MEAN_RULES  # one-plus-one included: the distribution also runs (1+1) steps


def _real(name: str, value: Any, *, positive: bool = False, nonnegative: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {out}")
    if positive and out <= 0:
        raise ValueError(f"{name} must be > 0, got {out}")
    if nonnegative and out < 0:
        raise ValueError(f"{name} must be >= 0, got {out}")
    return out


def _int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _vector(name: str, value: Any, dim: int | None = None) -> np.ndarray:
    """A finite 1-D float32 copy of `value` (of length `dim` when given)."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
    if dim is not None and arr.shape != (dim,):
        raise ValueError(f"{name} must have shape ({dim},), got {arr.shape}")
    with np.errstate(over="ignore"):  # out-of-range values become inf and are rejected just below
        out = np.array(arr, dtype=np.float32, copy=True)
    if not np.all(np.isfinite(out)):
        raise ValueError(f"{name} must be finite (and within float32 range)")
    return out


def _log_weights(k: int) -> np.ndarray:
    """CEM weights w_i ∝ log((k + 1)/i), i = 1..k, summing to 1."""
    w = np.log((k + 1) / np.arange(1, k + 1))
    return w / w.sum()


def _elite(fitness: np.ndarray, k: int) -> np.ndarray:
    # Stable sort on −f: among equal fitnesses the earlier entry ranks first.
    return np.argsort(-fitness, kind="stable")[:k]


class Distribution:
    """Shared parts: float32 mean and var, a version counting their changes, sampling, persistence."""

    kind = ""
    PARAMS: tuple[str, ...] = ()

    def __init__(self, mu: Any, var_init: float) -> None:
        self.mean = _vector("mu", mu)
        self.var_init = _real("var_init", var_init, positive=True)
        self.var = np.full(self.mean.shape, self.var_init, dtype=np.float32)
        self.version = 0

    @property
    def dim(self) -> int:
        return int(self.mean.size)

    def sample(self, seed: int) -> np.ndarray:
        """z = mean + sqrt(var)·ε(seed) (`noise.sample`)."""
        return noise.sample(self.mean, self.var, seed)

    def _commit(self, mean: np.ndarray, var: np.ndarray) -> bool:
        """Store a proposed mean and var; bump the version iff either changed. Raises before storing
        anything if the proposal is not finite (only an overflow can cause that)."""
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var))):
            raise ValueError(f"{self.kind}: the update would make the mean or the variance non-finite")
        changed = not (np.array_equal(mean, self.mean) and np.array_equal(var, self.var))
        if changed:
            self.mean, self.var = mean, var
            self.version += 1
        return changed

    # -- persistence ------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """The settings (not the state) of this distribution."""
        return {"kind": self.kind, "dim": self.dim, "var_init": self.var_init}

    def state(self, arrays: bool = True) -> dict[str, Any]:
        """Everything needed to continue after a restart, as plain data (arrays are copies).

        arrays=False leaves out mean and var (for callers that store those elsewhere: no copies)."""
        out = {"kind": self.kind, "version": self.version}
        if arrays:
            out.update(mean=self.mean.copy(), var=self.var.copy())
        return out

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore `state()`; validates everything before changing anything."""
        if not isinstance(state, dict):
            raise ValueError(f"state must be a dict, got {type(state).__name__}")
        if state.get("kind") != self.kind:
            raise ValueError(f"state is of kind {state.get('kind')!r}, this distribution is {self.kind!r}")
        missing = sorted({"mean", "var", "version"} - set(state))
        if missing:
            raise ValueError(f"state lacks {', '.join(missing)}")
        mean = _vector("state mean", state["mean"], self.dim)
        var = _vector("state var", state["var"], self.dim)
        if not np.all(var > 0):
            raise ValueError("state var must be > 0 everywhere")
        version = _int("state version", state["version"], 0)
        extra = self._check_extra_state(state)
        self.mean, self.var, self.version = mean, var, version
        self._load_extra_state(extra)

    def _check_extra_state(self, state: dict[str, Any]) -> Any:
        return None

    def _load_extra_state(self, extra: Any) -> None:
        pass


class AsyncDistribution(Distribution):
    """A distribution updated from one result at a time: tell(z, f(z), f(μ)) -> p."""

    def _check_result(self, z: Any, f_z: Any, f_mu: Any) -> tuple[np.ndarray, float, float]:
        return _vector("z", z, self.dim), _real("f_z", f_z), _real("f_mu", f_mu)

    def tell(self, z: Any, f_z: float, f_mu: float) -> float:
        """Apply one evaluated individual; return the update ratio p. Invalid input raises
        ValueError and leaves the distribution unchanged."""
        raise NotImplementedError


class AesrlDistribution(AsyncDistribution):
    """AES-RL: μ ← (1 − p)·μ + p·z with p from a mean rule, then a Welford variance step.

    `r` is the fitness scale: a number (fixed) or "adaptive" (a robust spread of recent f(z) − f(μ),
    `fitness.FitnessScale`). The scale is part of the state, so a restart continues with the same r.
    """

    kind = "aesrl"
    PARAMS = ("mean_rule", "var_rule", "r", "negative_ratio", "positive_ratio", "fixed_n", "var_init", "var_floor")

    def __init__(
        self,
        mu: Any,
        mean_rule: str = "baseline-relative",
        var_rule: str = "adaptive",
        r: float | str | None = None,
        negative_ratio: float = 0.0,
        positive_ratio: float = 1.0,
        fixed_n: float = 10.0,
        var_init: float = 1e-3,
        var_floor: float = VAR_FLOOR,
    ) -> None:
        if mean_rule not in AESRL_MEAN_RULES:
            raise ValueError(f"unknown mean_rule {mean_rule!r}; allowed: {', '.join(AESRL_MEAN_RULES)}")
        if var_rule not in AESRL_VAR_RULES:
            hint = " (the success rule is the 'opo' distribution)" if var_rule == "success-rule" else ""
            raise ValueError(f"unknown var_rule {var_rule!r}; allowed: {', '.join(AESRL_VAR_RULES)}{hint}")
        self.scale: FitnessScale | None = None
        if isinstance(r, str):
            if r != "adaptive":
                raise ValueError(f"r must be a positive number or 'adaptive', got {r!r}")
            self.scale = FitnessScale(r)
            r = self.scale.r
        elif r is None:
            if mean_rule != "one-plus-one":
                raise ValueError(f"r (the fitness scale) is required for mean_rule {mean_rule!r}")
        else:
            r = _real("r", r, positive=True)
        super().__init__(mu, var_init)
        self.mean_rule = mean_rule
        self.var_rule = var_rule
        self.r = r
        self.r_mode = self.scale.mode if self.scale is not None else "fixed"
        self.negative_ratio = _real("negative_ratio", negative_ratio, nonnegative=True)
        self.positive_ratio = _real("positive_ratio", positive_ratio, positive=True)
        if self.positive_ratio > 1:
            raise ValueError(f"positive_ratio must be in (0, 1], got {self.positive_ratio}")
        self.fixed_n = _real("fixed_n", fixed_n, positive=True)
        self.var_floor = _real("var_floor", var_floor, nonnegative=True)

    def describe(self) -> dict[str, Any]:
        return super().describe() | {
            "mean_rule": self.mean_rule,
            "var_rule": self.var_rule,
            "r": self.r_mode if self.scale is not None else self.r,
            "negative_ratio": self.negative_ratio,
            "positive_ratio": self.positive_ratio,
            "fixed_n": self.fixed_n,
            "var_floor": self.var_floor,
        }

    def tell(self, z: Any, f_z: float, f_mu: float) -> float:
        return self.tell_step(z, f_z, f_mu)[0]

    def tell_step(self, z: Any, f_z: float, f_mu: float,
                  scale_step: bool = True) -> tuple[float, kernels.StepOut | None]:
        """`tell`, also returning the compiled kernel's one-pass outputs (μ', var', σ', changed,
        ||μ' − μ||) when it ran the step, else None: the optimizer hands σ' and the move on to the
        scheduler instead of having them computed a second time.

        `scale_step=False` judges the individual on the current fitness scale without adding its gap
        to the scale's window (an RL individual: only ES gaps set r, `fitness.FitnessScale`)."""
        fn = kernels.compiled()
        plain = kernels.plain_vector(z, self.dim) if fn is not None else None
        if plain is None:
            z, f_z, f_mu = self._check_result(z, f_z, f_mu)  # a checked float32 copy
        else:
            z, f_z, f_mu = plain, _real("f_z", f_z), _real("f_mu", f_mu)  # the kernel checks z is finite
            if self.scale is not None and not np.all(np.isfinite(z)):  # before the scale counts it
                raise ValueError("z must be finite (and within float32 range)")
        if self.scale is not None:  # inputs are valid: this result now counts towards the scale
            r_now = self.scale.update(f_z, f_mu) if scale_step else self.scale.judge()
            self.r = self.scale.r if r_now is None else r_now
            if r_now is None:  # too few gaps to know their spread: recorded, μ stays
                return 0.0, None
        # one-plus-one ignores r; pass a harmless placeholder rather than None
        r = 1.0 if self.r is None else self.r
        p = update_ratio(self.mean_rule, f_z, f_mu, r, self.negative_ratio, self.positive_ratio)
        if p == 0.0:
            if plain is not None and self.scale is None and not np.all(np.isfinite(z)):
                raise ValueError("z must be finite (and within float32 range)")
            return p, None
        n = variance_n(self.var_rule, p, self.fixed_n)
        if fn is not None:
            step = kernels.aesrl_step(self.mean, self.var, z, p, n, self.var_floor, fn)
            if step.changed:
                self.mean, self.var = step.mean, step.var
                self.version += 1
            return p, step
        mean, var = _aesrl_step(self.mean, self.var, z, p, n, self.var_floor)
        self._commit(mean, var)
        return p, None

    def state(self, arrays: bool = True) -> dict[str, Any]:
        out = super().state(arrays)
        if self.scale is not None:
            out["scale"] = self.scale.state()
        return out

    def _check_extra_state(self, state: dict[str, Any]) -> Any:
        if self.scale is None or "scale" not in state:  # a state written before the scale existed
            return None
        probe = FitnessScale(self.scale.mode, window=self.scale.window, min_gaps=self.scale.min_gaps)
        probe.load_state(state["scale"])
        return probe

    def _load_extra_state(self, extra: Any) -> None:
        if extra is not None:
            self.scale = extra
            self.r = extra.r


def _aesrl_step(mu: np.ndarray, var: np.ndarray, z: np.ndarray, p: float, n: float,
                floor: float) -> tuple[np.ndarray, np.ndarray]:
    """μ' = (1 − p)·μ + p·z (clipped to [μ, z] when 0 ≤ p ≤ 1) and `rules.welford_variance`, in
    float64 rounded once to float32: the same numbers as those formulas, bit for bit, computed with
    in-place operations. The reference for `kernels.aesrl_step` (one compiled pass, ~7x faster)
    and the path taken when numba is missing."""
    mu64 = mu.astype(np.float64)
    z64 = z.astype(np.float64)
    mean = np.multiply(mu64, 1.0 - p)
    tmp = np.multiply(z64, p)
    mean += tmp
    if 0.0 <= p <= 1.0:
        # The exact value lies on [μ, z]; keep float64 rounding from stepping past an end.
        np.minimum(mu64, z64, out=tmp)
        np.maximum(mean, tmp, out=mean)
        np.maximum(mu64, z64, out=tmp)
        np.minimum(mean, tmp, out=mean)
    mean32 = mean.astype(np.float32)
    if not n > 0:
        return mean32, var
    # var + ((z − μ)·(z − μ') − var)/n, floored
    diff = np.subtract(z64, mu64, out=mu64)
    np.subtract(z64, mean32, out=z64)
    diff *= z64
    v64 = var.astype(np.float64)
    diff -= v64
    diff /= n
    diff += v64
    out = diff.astype(np.float32)
    np.maximum(out, np.float32(floor), out=out)
    return mean32, out


class OpoDistribution(AsyncDistribution):
    """(1+1)-ES: μ ← z when f(z) > f(μ); var scaled by the success rule over a sliding window.

    The version moves on every tell except when var sits at the floor and μ stays: then (μ, var)
    did not change, and the version counts changes of (μ, var), not tells.
    """

    kind = "opo"
    PARAMS = ("var_init", "var_floor", "window", "success_target", "factor")

    def __init__(
        self,
        mu: Any,
        var_init: float = 1e-3,
        var_floor: float = VAR_FLOOR,
        window: int = 10,
        success_target: float = 0.2,
        factor: float = 0.99,
    ) -> None:
        super().__init__(mu, var_init)
        self.var_floor = _real("var_floor", var_floor, nonnegative=True)
        self.success = SuccessRule(window=window, target=success_target, factor=factor)

    def describe(self) -> dict[str, Any]:
        return super().describe() | {
            "var_floor": self.var_floor,
            "window": self.success.window,
            "success_target": self.success.target,
            "factor": self.success.factor,
        }

    def tell(self, z: Any, f_z: float, f_mu: float) -> float:
        z, f_z, f_mu = self._check_result(z, f_z, f_mu)
        p = update_ratio("one-plus-one", f_z, f_mu, 1.0)
        mean = z if p == 1.0 else self.mean
        saved = self.success.state()
        factor = self.success.update(p == 1.0)
        var = np.maximum(
            (self.var.astype(np.float64) * factor).astype(np.float32), np.float32(self.var_floor)
        )
        try:
            self._commit(mean, var)
        except ValueError:
            self.success.load_state(saved)
            raise
        return p

    def state(self, arrays: bool = True) -> dict[str, Any]:
        return super().state(arrays) | {"success_history": self.success.state()}

    def _check_extra_state(self, state: dict[str, Any]) -> Any:
        history = state.get("success_history")
        if not isinstance(history, list | tuple):
            raise ValueError("state success_history must be a list of bools")
        probe = SuccessRule(self.success.window, self.success.target, self.success.factor)
        probe.load_state(history)
        return probe

    def _load_extra_state(self, extra: Any) -> None:
        self.success = extra


class AcemDistribution(AsyncDistribution):
    """Rank-based asynchronous CEM (ACEM-RL): a 1/N step toward the weighted elite of the last N results."""

    kind = "acem"
    PARAMS = ("window", "elite", "var_init", "damp_init", "damp_limit", "tau")

    def __init__(
        self,
        mu: Any,
        window: int = 10,
        elite: int = 5,
        var_init: float = 1e-3,
        damp_init: float = 1e-3,
        damp_limit: float = 1e-5,
        tau: float = 0.9,
    ) -> None:
        super().__init__(mu, var_init)
        self.window = _int("window", window, 1)
        self.elite = _int("elite", elite, 1)
        if self.elite > self.window:
            raise ValueError(f"elite ({self.elite}) must be <= window ({self.window})")
        self.damp_init = _real("damp_init", damp_init, nonnegative=True)
        self.damp_limit = _real("damp_limit", damp_limit, nonnegative=True)
        self.tau = _real("tau", tau)
        if not 0.0 <= self.tau <= 1.0:
            raise ValueError(f"tau must be in [0, 1], got {self.tau}")
        # The official per-generation τ spread over the N results of one "generation".
        self.tau_per_result = self.tau ** (1.0 / self.window)
        self.damp = self.damp_init
        self._buffer: deque[tuple[np.ndarray, float]] = deque(maxlen=self.window)
        self._weights = _log_weights(self.elite)

    def describe(self) -> dict[str, Any]:
        return super().describe() | {
            "window": self.window,
            "elite": self.elite,
            "damp_init": self.damp_init,
            "damp_limit": self.damp_limit,
            "tau": self.tau,
        }

    def tell(self, z: Any, f_z: float, f_mu: float) -> float:
        z, f_z, f_mu = self._check_result(z, f_z, f_mu)
        entries = [*self._buffer, (z, f_z)][-self.window :]
        if len(entries) < self.window:
            self._buffer.append((z, f_z))
            return 0.0
        zs = np.stack([e[0] for e in entries]).astype(np.float64)
        fs = np.array([e[1] for e in entries], dtype=np.float64)
        elite = zs[_elite(fs, self.elite)]
        mu_old = self.mean.astype(np.float64)
        m_star = self._weights @ elite
        mean = (mu_old + (m_star - mu_old) / self.window).astype(np.float32)
        var = ((self._weights @ (elite - mu_old) ** 2) / self.elite + self.damp).astype(np.float32)
        self._commit(mean, var)
        self._buffer.append((z, f_z))
        self.damp = self.tau_per_result * self.damp + (1.0 - self.tau_per_result) * self.damp_limit
        return 1.0 / self.window

    def state(self, arrays: bool = True) -> dict[str, Any]:
        zs = np.stack([e[0] for e in self._buffer]) if self._buffer else np.zeros((0, self.dim), np.float32)
        return super().state(arrays) | {
            "damp": self.damp,
            "buffer_z": zs,
            "buffer_f": [e[1] for e in self._buffer],
        }

    def _check_extra_state(self, state: dict[str, Any]) -> Any:
        damp = _real("state damp", state.get("damp"), nonnegative=True)
        zs = np.asarray(state.get("buffer_z"))
        fs = state.get("buffer_f")
        if not isinstance(fs, list | tuple | np.ndarray) or len(fs) > self.window:
            raise ValueError(f"state buffer_f must be a list of at most {self.window} fitnesses")
        if zs.ndim != 2 or zs.shape != (len(fs), self.dim):
            raise ValueError(f"state buffer_z must have shape ({len(fs)}, {self.dim}), got {zs.shape}")
        entries = [
            (_vector("state buffer_z row", row, self.dim), _real("state buffer_f", f))
            for row, f in zip(zs, fs, strict=True)
        ]
        return damp, entries

    def _load_extra_state(self, extra: Any) -> None:
        self.damp, entries = extra
        self._buffer = deque(entries, maxlen=self.window)


class CemDistribution(Distribution):
    """Synchronous CEM (CEM-RL, P-CEM-RL): ask a population, tell all its fitnesses at once."""

    kind = "cem"
    PARAMS = ("elite", "antithetic", "var_init", "damp_init", "damp_limit", "damp_tau")

    def __init__(
        self,
        mu: Any,
        elite: int | None = None,
        antithetic: bool = True,
        var_init: float = 1e-3,
        damp_init: float = 1e-3,
        damp_limit: float = 1e-5,
        damp_tau: float = 0.95,
    ) -> None:
        super().__init__(mu, var_init)
        self.elite = None if elite is None else _int("elite", elite, 1)
        if not isinstance(antithetic, bool):
            raise ValueError(f"antithetic must be a bool, got {antithetic!r}")
        self.antithetic = antithetic
        self.damp_init = _real("damp_init", damp_init, nonnegative=True)
        self.damp_limit = _real("damp_limit", damp_limit, nonnegative=True)
        self.damp_tau = _real("damp_tau", damp_tau)
        if not 0.0 <= self.damp_tau <= 1.0:
            raise ValueError(f"damp_tau must be in [0, 1], got {self.damp_tau}")
        self.damp = self.damp_init

    def describe(self) -> dict[str, Any]:
        return super().describe() | {
            "elite": self.elite,
            "antithetic": self.antithetic,
            "damp_init": self.damp_init,
            "damp_limit": self.damp_limit,
            "damp_tau": self.damp_tau,
        }

    def ask(self, n: int, seed: int) -> tuple[list[int], np.ndarray]:
        """n members and the seed each was built from. Antithetic when n is even (and `antithetic`):
        members 2j and 2j+1 share seeds[2j] == seeds[2j+1] and are μ + σε and μ − σε."""
        n = _int("n", n, 1)
        if self.antithetic and n % 2 == 0:
            pair_seeds = noise.derive_seeds(seed, n // 2)
            rows = [row for s in pair_seeds for row in noise.antithetic_pair(self.mean, self.var, s)]
            seeds = [s for s in pair_seeds for _ in range(2)]
        else:
            seeds = noise.derive_seeds(seed, n)
            rows = [noise.sample(self.mean, self.var, s) for s in seeds]
        return seeds, np.stack(rows)

    def tell(self, population: Any, fitnesses: Any) -> None:
        """Replace μ and var by the weighted elite of a whole evaluated population."""
        pop = np.asarray(population)
        fit = np.asarray(fitnesses)
        if pop.dtype.kind not in "fiu" or pop.ndim != 2 or pop.shape[1] != self.dim:
            raise ValueError(f"population must be a real array of shape (n, {self.dim}), got {pop.shape}")
        n = pop.shape[0]
        if fit.dtype.kind not in "fiu" or fit.shape != (n,):
            raise ValueError(f"fitnesses must be a real array of shape ({n},), got {fit.shape}")
        pop = pop.astype(np.float64)
        fit = fit.astype(np.float64)
        if not (np.all(np.isfinite(pop)) and np.all(np.isfinite(fit))):
            raise ValueError("population and fitnesses must be finite")
        k = n // 2 if self.elite is None else self.elite
        if not 1 <= k <= n:
            raise ValueError(f"elite size {k} must be in [1, {n}] for a population of {n}")
        weights = _log_weights(k)
        elite = pop[_elite(fit, k)]
        mu_old = self.mean.astype(np.float64)
        mean = (weights @ elite).astype(np.float32)
        var = ((weights @ (elite - mu_old) ** 2) / k + self.damp).astype(np.float32)
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var))):
            raise ValueError("cem: the update would make the mean or the variance non-finite")
        # Every generation is a new distribution, even in the unlikely case the numbers repeat.
        self.mean, self.var = mean, var
        self.version += 1
        self.damp = self.damp_tau * self.damp + (1.0 - self.damp_tau) * self.damp_limit

    def state(self, arrays: bool = True) -> dict[str, Any]:
        return super().state(arrays) | {"damp": self.damp}

    def _check_extra_state(self, state: dict[str, Any]) -> Any:
        return _real("state damp", state.get("damp"), nonnegative=True)

    def _load_extra_state(self, extra: Any) -> None:
        self.damp = extra


_CLASSES: dict[str, type[Distribution]] = {
    "aesrl": AesrlDistribution,
    "opo": OpoDistribution,
    "acem": AcemDistribution,
    "cem": CemDistribution,
}


def make_distribution(name: str, mu: Any, **params: Any) -> Distribution:
    """A new distribution of kind `name` ("aesrl", "opo", "acem", "cem") centred on `mu`."""
    cls = _CLASSES.get(name)
    if cls is None:
        raise ValueError(f"unknown distribution {name!r}; allowed: {', '.join(DISTRIBUTIONS)}")
    unknown = sorted(set(params) - set(cls.PARAMS))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for {name!r}; allowed: {', '.join(cls.PARAMS)}"
        )
    return cls(mu, **params)
