"""The proportional controller that tags each new individual RL or ES to hold the RL share near a target.
Pure counting: the caller supplies the uniform draw and the number of stored steps.
"""

from __future__ import annotations

import math
import numbers
from typing import Any


def _check_target_gain(target: float, gain: float) -> tuple[float, float]:
    try:
        target, gain = float(target), float(gain)
    except (TypeError, ValueError):
        raise ValueError(f"target and gain must be real numbers, got {target!r} and {gain!r}") from None
    if not (math.isfinite(target) and 0.0 <= target <= 1.0):
        raise ValueError(f"target (the RL share ρ*) must be in [0, 1], got {target}")
    if not (math.isfinite(gain) and gain >= 0.0):
        raise ValueError(f"gain (K_rl) must be finite and >= 0, got {gain}")
    return target, gain


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def rl_probability(n_rl: int, n_es: int, target: float, gain: float = 50.0) -> float:
    """clip(0.5 − gain·(n_rl/(n_rl + n_es) − target), 0, 1), the chance that the next job is RL.

    target == 0 gives 0.0: the bare formula would still hand out RL jobs once ES dominates enough,
    which is not what a user asking for no RL expects.
    """
    target, gain = _check_target_gain(target, gain)
    n_rl, n_es = _check_count("n_rl", n_rl), _check_count("n_es", n_es)
    if n_rl + n_es == 0:
        raise ValueError("n_rl + n_es must be > 0")
    if target == 0.0:
        return 0.0
    share = n_rl / (n_rl + n_es)
    return min(max(0.5 - gain * (share - target), 0.0), 1.0)


class RLController:
    """Cumulative dispatch counters and the RL/ES choice of the official P controller."""

    def __init__(self, target: float = 0.5, gain: float = 50.0, initial_steps: int = 10_000) -> None:
        self.target, self.gain = _check_target_gain(target, gain)
        self.initial_steps = _check_count("initial_steps", initial_steps)
        # Both start at 1 as in the official code, so the share is defined from the first dispatch.
        self.n_rl = 1
        self.n_es = 1

    def probability(self) -> float:
        """Chance that the next job after the initial phase is RL."""
        return rl_probability(self.n_rl, self.n_es, self.target, self.gain)

    def choose(self, stored_steps: int, u: float) -> str:
        """Tag the next job "rl" or "es", given the stored steps so far and a uniform u in [0, 1).

        During the initial phase the answer is "es" and, as in the official code, nothing is counted.
        """
        stored_steps = _check_count("stored_steps", stored_steps)
        u = float(u)
        if not 0.0 <= u < 1.0:  # also rejects NaN
            raise ValueError(f"u must be a uniform draw in [0, 1), got {u}")
        if stored_steps < self.initial_steps:
            return "es"
        p = self.probability()
        # p > 0 first: with p == 0 the official `u <= p` would still pick RL for u == 0.0.
        if p > 0.0 and u <= p:
            self.n_rl += 1
            return "rl"
        self.n_es += 1
        return "es"

    def state(self) -> dict[str, int]:
        return {"n_rl": self.n_rl, "n_es": self.n_es}

    def load_state(self, state: dict[str, Any]) -> None:
        n_rl = _check_count("n_rl", state.get("n_rl"))
        n_es = _check_count("n_es", state.get("n_es"))
        if n_rl + n_es == 0:
            raise ValueError("n_rl + n_es must be > 0")
        self.n_rl, self.n_es = n_rl, n_es
