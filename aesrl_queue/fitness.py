"""The fitness scale r of AES-RL's mean rules: fixed, or adapted to the run while it learns.

The mean rules turn the gap Δ = f(z) − f(μ) between an individual and the mean into an update ratio
p through Δ/r. A fixed r (the paper gives one per environment) only separates good individuals from
bad ones when Δ is of the order of r: early in a HalfCheetah run Δ is a few hundred against
r = 2000, so every individual gets p ≈ 0.5 and μ averages the last individuals with no selection.

`FitnessScale("adaptive")` (the default) sets r to a robust spread of the recent gaps instead:

    r = 1.4826 · median(|Δ_i − median(Δ)|) over the last R_WINDOW gaps (current included)

and `update` returns None (no move of μ) until `min_gaps` gaps are known: one gap says nothing of
their spread, and a first RL individual far below μ would otherwise set r to its own gap and pull μ
a quarter of the way towards itself.

This is the median absolute deviation (MAD) of the gaps, scaled to equal their standard deviation when they
are normal. One RL individual that beats μ by thousands, or a broken ES individual far below it,
moves it by one rank, not by its size (the reviewers of the paper point out that rank-like
statistics are the robust choice). It is a spread around the gaps' median, not around 0: early in a
run most individuals are worse than μ (gaps of −300 ± 50, say), and a scale of their size (~450)
would give each of them p ≈ 0.3; their spread (~75) gives them p = 0. The scale follows the run: it
shrinks while the gaps agree and grows as returns do.

Only ES individuals' gaps set it (`update`); RL individuals are judged on it (`judge`) without
widening it: on Hopper's plateau a window of ES gaps near 0 and RL gaps near −800 has a spread of
hundreds, under which an RL individual a few hundred below μ would still get p > 0.

No Redis, no clocks: `state()` is plain data that a restarted scheduler loads back.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

SCALE_MODES = ("adaptive", "fixed")
MAD_TO_STD = 1.4826  # 1/Φ⁻¹(3/4): the MAD of N(m, s²) is s/1.4826
MIN_SCALE = 1e-6  # r must stay > 0 even when every gap so far is 0 (a deterministic, flat start)
# Gaps the adaptive r is computed from: enough for a median to ignore a few outliers, few enough to
# follow a run whose returns grow by thousands (docs/algorithms.md, "fitness scale")
R_WINDOW = 100
MIN_GAPS = 5  # gaps known before r means anything (one gap says nothing of their spread)


def _median(values: list[float]) -> float:
    vals = sorted(values)
    n = len(vals)
    return vals[n // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2])


class FitnessScale:
    """The r a mean rule should use now; `update(f_z, f_mu)` records one result and returns it."""

    def __init__(self, mode: str = "adaptive", r: float | None = None, window: int = R_WINDOW,
                 min_gaps: int = MIN_GAPS) -> None:
        if mode not in SCALE_MODES:
            raise ValueError(f"unknown fitness scale {mode!r}; allowed: {', '.join(SCALE_MODES)}")
        if mode == "fixed":
            if r is None or not (isinstance(r, int | float) and math.isfinite(r) and r > 0):
                raise ValueError(f"a fixed fitness scale needs r > 0, got {r!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        if isinstance(min_gaps, bool) or not isinstance(min_gaps, int) or not 1 <= min_gaps <= window:
            raise ValueError(f"min_gaps must be an int in [1, window], got {min_gaps!r}")
        self.mode = mode
        self.min_gaps = min_gaps if mode == "adaptive" else 1
        self.window = window
        self.r = float(r) if r is not None else 1.0
        self._seen: deque[float] = deque(maxlen=self.window)

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
        self._seen.append(f_z - f_mu)
        centre = _median(self._seen)
        self.r = max(MIN_SCALE, MAD_TO_STD * _median([abs(v - centre) for v in self._seen]))
        return self.judge()

    def judge(self) -> float | None:
        """The r to judge an individual whose gap does not set the scale; None while too few gaps are known."""
        return self.r if self.ready else None

    # -- persistence ----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"mode": self.mode, "r": self.r, "seen": list(self._seen)}

    def load_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("mode") != self.mode:
            raise ValueError(f"fitness scale state is not of mode {self.mode!r}: {state!r:.80}")
        seen = state.get("seen", [])
        r = state.get("r", self.r)
        if not isinstance(seen, list | tuple) or not all(isinstance(v, int | float) and math.isfinite(v) for v in seen):
            raise ValueError("fitness scale state 'seen' must be a list of finite numbers")
        if not (isinstance(r, int | float) and math.isfinite(r) and r > 0):
            raise ValueError(f"fitness scale state r must be > 0, got {r!r}")
        if self.mode != "fixed":
            self.r = float(r)
        self._seen = deque((float(v) for v in seen), maxlen=self.window)
