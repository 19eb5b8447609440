"""AES-RL update rules as pure functions: the mean's update ratio p, the variance step, the success rule.
No state beyond numbers and numpy arrays, so that every loop (async, sync, tests) shares them exactly.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

import numpy as np

# Every rule `update_ratio` and `variance_n` know (the one source of these names).
MEAN_RULES = ("one-plus-one", "fixed-linear", "fixed-sigmoid", "baseline-absolute", "baseline-relative")
VAR_RULES = ("fixed", "adaptive", "success-rule")
# The ones a run of --algo aesrl/es selects: one-plus-one and the success rule are --algo opo.
FITNESS_MEAN_RULES = tuple(rule for rule in MEAN_RULES if rule != "one-plus-one")
AESRL_VAR_RULES = ("fixed", "adaptive")

# Below this p the step is too small to say anything about the spread (official code: n = 0).
P_MIN_VAR_UPDATE = 1e-3
VAR_FLOOR = 1e-5

# p depends only on the ratios of f(z), f(μ) and r, so values this large are rescaled by a power of
# two (exact) before differences such as f(z) − f(μ) could overflow to inf and turn p into NaN.
_RESCALE_ABOVE = 2.0**1000
_RESCALE_BY = 2.0**-64


def _check_rule(rule: str, allowed: tuple[str, ...], what: str) -> None:
    if rule not in allowed:
        raise ValueError(f"unknown {what} {rule!r}; allowed: {', '.join(allowed)}")


def _finite(name: str, value: float) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {out}")
    return out


def _sigmoid(x: float) -> float:
    # exp of a large positive argument overflows; only ever exponentiate a non-positive number.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def update_ratio(rule: str, f_z: float, f_mu: float, r: float, negative_ratio: float = 0.0,
                 positive_ratio: float = 1.0) -> float:
    """The mean's update ratio p of `rule` (docs/algorithms.md); μ_new = (1 − p)·μ + p·z.

    `positive_ratio` is the paper's p_positive (its Eqs. 7, 8 and 10): it scales the p of a better
    individual under fixed-linear and fixed-sigmoid, and every p of baseline-relative, so that μ moves
    at most that share of the way to even the best individual. 1.0 is the published code, which has
    no such parameter; `baseline-absolute` ignores it.

    `r` is the fitness scale (for `baseline-absolute` the baseline is b = −r); `one-plus-one` ignores
    it. `p` is in [0, 1] for every rule except `fixed-linear` with `negative_ratio` > 0, where a worse
    individual gives a negative p (μ moves away from z), as in the published code.

    `baseline-absolute` when f(μ) < b < f(z): the published formula divides by a denominator that can
    be zero or negative there; since z beats both the baseline and the mean, p = 1 (the clipped value
    of every positive-denominator case, and no division by zero).
    """
    _check_rule(rule, MEAN_RULES, "mean rule")
    f_z = _finite("f_z", f_z)
    f_mu = _finite("f_mu", f_mu)
    if rule == "one-plus-one":
        return 1.0 if f_z > f_mu else 0.0
    r = _finite("r", r)
    if r <= 0:
        raise ValueError(f"r must be > 0 for mean rule {rule!r}, got {r}")
    negative_ratio = _finite("negative_ratio", negative_ratio)
    if negative_ratio < 0:
        raise ValueError(f"negative_ratio must be >= 0, got {negative_ratio}")
    positive_ratio = _finite("positive_ratio", positive_ratio)
    if not 0 < positive_ratio <= 1:
        raise ValueError(f"positive_ratio must be in (0, 1], got {positive_ratio}")
    p = _ratio(rule, f_z, f_mu, r, negative_ratio)
    # Eq. 10 scales every p of baseline-relative (its "positive" side is f(z) >= f(μ) − r, where p > 0);
    # Eqs. 7-8 scale fixed-linear and fixed-sigmoid where f(z) > f(μ); Eq. 9 (baseline-absolute) has none.
    if rule == "baseline-relative" or (rule != "baseline-absolute" and f_z > f_mu):
        p *= positive_ratio
    return p


def _ratio(rule: str, f_z: float, f_mu: float, r: float, negative_ratio: float) -> float:
    if max(abs(f_z), abs(f_mu), r) > _RESCALE_ABOVE:
        f_z, f_mu, r = f_z * _RESCALE_BY, f_mu * _RESCALE_BY, r * _RESCALE_BY

    delta = f_z - f_mu
    if rule == "fixed-linear":
        p = min(max(delta / r, -1.0), 1.0)
        return p * negative_ratio if delta < 0 else p
    if rule == "fixed-sigmoid":
        return _sigmoid(delta / r)
    if rule == "baseline-absolute":
        b = -r
        if f_z < b:
            return 0.0
        above_z, above_mu = f_z - b, f_mu - b
        denom = above_z + above_mu
        if above_mu < 0 or denom <= 0:
            return 1.0 if above_z > 0 else 0.0
        return min(max(above_z / denom, 0.0), 1.0)
    # baseline-relative: the baseline b = f(μ) − r moves with the mean.
    if delta < -r:
        return 0.0
    return min(max((delta + r) / (delta + 2.0 * r), 0.0), 1.0)


def variance_n(rule: str, p: float, fixed_n: float = 10) -> float:
    """The Welford denominator n of variance rule `rule` for update ratio `p`; 0.0 means "no update".

    `success-rule` always gives 0.0: it changes the variance multiplicatively (`SuccessRule`).
    """
    _check_rule(rule, VAR_RULES, "variance rule")
    p = _finite("p", p)
    if p < P_MIN_VAR_UPDATE or rule == "success-rule":
        return 0.0
    if rule == "fixed":
        fixed_n = _finite("fixed_n", fixed_n)
        if fixed_n <= 0:
            raise ValueError(f"fixed_n must be > 0, got {fixed_n}")
        return fixed_n
    return max((1.0 - p) / p, 1.0)


def welford_variance(
    var: np.ndarray,
    z: np.ndarray,
    mu_old: np.ndarray,
    mu_new: np.ndarray,
    n: float,
    floor: float = VAR_FLOOR,
) -> np.ndarray:
    """var + ((z − μ_old)·(z − μ_new) − var)/n elementwise, floored at `floor`, as float32.

    Computed in float64 and rounded once to float32 (the stored precision); the floor is applied
    after rounding, so every element is >= float32(floor). n <= 0 returns an unchanged copy.
    """
    arrays = {"var": var, "z": z, "mu_old": mu_old, "mu_new": mu_new}
    shapes = {name: np.shape(a) for name, a in arrays.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"welford_variance needs arrays of one shape, got {shapes}")
    n = _finite("n", n)
    floor = _finite("floor", floor)
    if floor < 0:
        raise ValueError(f"floor must be >= 0, got {floor}")
    if n <= 0:
        return np.array(var, dtype=np.float32, copy=True)
    v, x, m0, m1 = (np.asarray(a, dtype=np.float64) for a in (var, z, mu_old, mu_new))
    out = (v + ((x - m0) * (x - m1) - v) / n).astype(np.float32)
    return np.maximum(out, np.float32(floor))


class SuccessRule:
    """(1+1)-ES variance factor from the success rate over a true sliding window of outcomes.

    The official code stops appending once its deque holds `window` outcomes, so the rate freezes
    after the first `window` tells; here the window keeps sliding (deque with maxlen).
    """

    def __init__(self, window: int = 10, target: float = 0.2, factor: float = 0.99) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        target = _finite("target", target)
        if not 0.0 <= target < 1.0:
            raise ValueError(f"target must be in [0, 1), got {target}")
        factor = _finite("factor", factor)
        if not 0.0 < factor <= 1.0:
            raise ValueError(f"factor must be in (0, 1], got {factor}")
        self.window = window
        self.target = target
        self.factor = factor
        self._outcomes: deque[bool] = deque(maxlen=window)

    @property
    def rate(self) -> float:
        """Share of successes among the outcomes in the window (0.0 when empty)."""
        return sum(self._outcomes) / len(self._outcomes) if self._outcomes else 0.0

    def update(self, success: bool) -> float:
        """Record one outcome; return the factor to multiply the variance by (1/factor or factor)."""
        self._outcomes.append(bool(success))
        return 1.0 / self.factor if self.rate > self.target else self.factor

    def state(self) -> list[bool]:
        """The outcomes in the window, oldest first."""
        return list(self._outcomes)

    def load_state(self, outcomes: Iterable[bool]) -> None:
        """Restore the window from `state()`; a window longer than `self.window` is rejected."""
        items = list(outcomes)
        if len(items) > self.window:
            raise ValueError(f"success history holds {len(items)} outcomes, more than window={self.window}")
        if not all(isinstance(x, bool | np.bool_) for x in items):
            raise ValueError("success history must hold only bools")
        self._outcomes = deque((bool(x) for x in items), maxlen=self.window)
