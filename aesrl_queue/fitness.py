"""The fitness scale r of AES-RL's mean rules: fixed, or adapted to the run while it learns.

The mean rules turn the gap Δ = f(z) − f(μ) between an individual and the mean into an update ratio
p through Δ/r. A fixed r (the paper gives one per environment) only separates good individuals from
bad ones when Δ is of the order of r: early in a HalfCheetah run Δ is a few hundred against
r = 2000, so every individual gets p ≈ 0.5 and μ averages the last individuals with no selection.

`FitnessScale("adaptive")` (the default) sets r to a robust spread of the recent gaps instead:

    r = factor · 1.4826 · median(|Δ_i − median(Δ)|) over the last `window` gaps (current included)

and `update` returns None (no move of μ) until `min_gaps` gaps are known: one gap says nothing of
their spread, and a first RL individual far below μ would otherwise set r to its own gap and pull μ
a quarter of the way towards itself.

the median absolute deviation (MAD) of the gaps, scaled to equal their standard deviation when they
are normal. One RL individual that beats μ by thousands, or a broken ES individual far below it,
moves it by one rank, not by its size (the reviewers of the paper point out that rank-like
statistics are the robust choice). It is a spread around the gaps' median, not around 0: early in a
run most individuals are worse than μ (gaps of −300 ± 50, say), and a scale of their size (~450)
would give each of them p ≈ 0.3; their spread (~75) gives them p = 0. The scale follows the run: it
shrinks while the gaps agree and grows as returns do.

`FitnessScale("auto")` is the older estimate kept for comparison: the standard deviation of the
last 1000 fitnesses (not gaps), which mixes progress over time into the scale.

No Redis, no clocks: `state()` is plain data that a restarted scheduler loads back.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

SCALE_MODES = ("adaptive", "auto", "fixed")
MAD_TO_STD = 1.4826  # 1/Φ⁻¹(3/4): the MAD of N(m, s²) is s/1.4826
MIN_SCALE = 1e-6  # r must stay > 0 even when every gap so far is 0 (a deterministic, flat start)
AUTO_WINDOW = 1000


def _median(values: list[float]) -> float:
    vals = sorted(values)
    n = len(vals)
    return vals[n // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2])


class FitnessScale:
    """The r a mean rule should use now; `update(f_z, f_mu)` records one result and returns it."""

    def __init__(self, mode: str = "adaptive", r: float | None = None, window: int = 100,
                 factor: float = 1.0, min_gaps: int = 5) -> None:
        if mode not in SCALE_MODES:
            raise ValueError(f"unknown fitness scale {mode!r}; allowed: {', '.join(SCALE_MODES)}")
        if mode == "fixed":
            if r is None or not (isinstance(r, int | float) and math.isfinite(r) and r > 0):
                raise ValueError(f"a fixed fitness scale needs r > 0, got {r!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        if not (isinstance(factor, int | float) and math.isfinite(factor) and factor > 0):
            raise ValueError(f"factor must be > 0, got {factor!r}")
        if isinstance(min_gaps, bool) or not isinstance(min_gaps, int) or not 1 <= min_gaps <= window:
            raise ValueError(f"min_gaps must be an int in [1, window], got {min_gaps!r}")
        self.mode = mode
        self.min_gaps = min_gaps if mode == "adaptive" else 1
        self.window = window if mode == "adaptive" else AUTO_WINDOW
        self.factor = float(factor)
        self.r = float(r) if r is not None else 1.0
        self._seen: deque[float] = deque(maxlen=self.window)
        # gaps of individuals that do not set r (RL ones under r_kinds = "es"), lent to the scale only
        # while it has fewer than min_gaps of its own (`judge(..., lend=True)`)
        self._lent: deque[float] = deque(maxlen=self.min_gaps)

    @property
    def adapts(self) -> bool:
        return self.mode != "fixed"

    @property
    def ready(self) -> bool:
        """Enough gaps are known for r to mean something."""
        return self.mode == "fixed" or len(self._seen) >= self.min_gaps

    def update(self, f_z: float, f_mu: float) -> float | None:
        """Record one evaluated individual (f(z) and the f(μ) it is compared with); return r, or None
        while fewer than `min_gaps` gaps are known (the individual must not move μ then)."""
        if self.mode == "fixed":
            return self.r
        self._seen.append(f_z - f_mu if self.mode == "adaptive" else f_z)
        self.r = self._scale(self._seen)
        return self._judging_r()

    def judge(self, f_z: float, f_mu: float, lend: bool = False) -> float | None:
        """The r to judge an individual whose gap does not set the scale; None while too few gaps are known.

        `lend`: while the scale has fewer than `min_gaps` gaps of its own, this gap counts towards it
        (and the scale is then the spread of its own and the lent gaps); once it has enough, lent gaps
        are left out. With 1000-step episodes and half the jobs RL ones, five ES gaps take ~10 jobs."""
        if lend and not self.ready and self.mode == "adaptive":
            self._lent.append(f_z - f_mu)
        return self._judging_r()

    def _judging_r(self) -> float | None:
        if self.ready:
            return self.r
        if self._lent and len(self._seen) + len(self._lent) >= self.min_gaps:
            return self._scale([*self._seen, *self._lent])
        return None

    def _scale(self, values) -> float:
        vals = list(values)
        if self.mode == "auto":
            if len(vals) < 2:
                return self.r
            mean = sum(vals) / len(vals)
            return max(MIN_SCALE, math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals)))
        centre = _median(vals)
        return max(MIN_SCALE, self.factor * MAD_TO_STD * _median([abs(v - centre) for v in vals]))

    # -- persistence ----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"mode": self.mode, "r": self.r, "seen": list(self._seen), "lent": list(self._lent)}

    def load_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("mode") != self.mode:
            raise ValueError(f"fitness scale state is not of mode {self.mode!r}: {state!r:.80}")
        seen = state.get("seen", [])
        lent = state.get("lent", [])  # absent in states written before lending existed
        r = state.get("r", self.r)
        for name, vals in (("seen", seen), ("lent", lent)):
            if not isinstance(vals, list | tuple) or not all(
                    isinstance(v, int | float) and math.isfinite(v) for v in vals):
                raise ValueError(f"fitness scale state {name!r} must be a list of finite numbers")
        if not (isinstance(r, int | float) and math.isfinite(r) and r > 0):
            raise ValueError(f"fitness scale state r must be > 0, got {r!r}")
        if self.mode != "fixed":
            self.r = float(r)
        self._seen = deque((float(v) for v in seen), maxlen=self.window)
        self._lent = deque((float(v) for v in lent), maxlen=self.min_gaps)
