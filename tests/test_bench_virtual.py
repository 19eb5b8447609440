"""bench/virtual.py's validate statistics: the two-sample KS statistic, lag quantiles and histogram, and
the worker gap read off a real run (the runs themselves: bench/virtual.py validate, docs/performance.md §9)."""

from __future__ import annotations

import math

import pytest

from bench.virtual import histogram, ks, quantiles, worker_gap


def test_ks_statistic():
    assert ks([0, 1, 2, 3], [0, 1, 2, 3]) == (0.0, 1.0)
    d, p = ks([0] * 50 + [1] * 50, [1] * 50 + [2] * 50)
    assert d == 0.5 and p < 1e-3
    d, p = ks([0, 1, 1, 2], [1, 2, 2, 3])  # F_a(1) = 3/4 against F_b(1) = 1/4
    assert d == 0.5 and 0.05 < p <= 1.0
    assert all(math.isnan(x) for x in ks([], [1]))


def test_lag_quantiles_and_histogram():
    lags = list(range(10)) + [40]
    q = quantiles(lags)
    assert q["p10"] == 1 and q["p50"] == 5 and q["p99"] == 40
    h = histogram(lags)
    assert h["0"] == h["1"] == round(1 / 11, 3) and h["4-7"] == round(4 / 11, 3) and h["32+"] == round(1 / 11, 3)
    assert sum(h.values()) == pytest.approx(1.0, abs=0.01)


def test_worker_gap_is_the_cycle_less_the_duration():
    # 2 workers, a result every 0.05 s, jobs of 0.06 s: each worker's cycle is 0.1 s, 0.04 s outside its jobs
    metrics = [{"type": "update", "random": i < 2, "t": 0.05 * i, "duration": 0.06} for i in range(12)]
    assert worker_gap(metrics, 2) == pytest.approx(0.04)
    assert worker_gap(metrics, 1) == 0.0  # never below 0
