"""The fitness scale: fixed or adaptive (robust spread of f(z) − f(μ)); its state survives a restart."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aesrl_queue.distributions import make_distribution
from aesrl_queue.fitness import MAD_TO_STD, FitnessScale
from aesrl_queue.rules import update_ratio


def test_fixed_scale_never_moves() -> None:
    s = FitnessScale("fixed", r=2000.0)
    assert [s.update(f, 0.0) for f in (-1e6, 0.0, 5.0, 1e9)] == [2000.0] * 4
    assert not s.adapts


def test_adaptive_scale_is_the_robust_spread_of_the_gaps() -> None:
    s = FitnessScale("adaptive", window=5, min_gaps=5)
    gaps = [10.0, -20.0, 30.0, -40.0, 50.0]
    for g in gaps:
        r = s.update(100.0 + g, 100.0)
    assert r == pytest.approx(MAD_TO_STD * 30.0)  # median 10; deviations 0, 30, 20, 50, 40
    # One huge RL gap moves the spread by one rank, not by its size.
    r_after = s.update(1e6, 0.0)
    assert r_after == pytest.approx(MAD_TO_STD * 50.0)  # -20, 30, -40, 50, 1e6: median 30
    # The window slides: the oldest gaps leave.
    for g in (1.0, 3.0, 1.0, 3.0, 2.0):
        r = s.update(g, 0.0)
    assert r == pytest.approx(MAD_TO_STD * 1.0)


def test_gaps_that_agree_give_a_small_scale_even_far_from_zero() -> None:
    """Early on most individuals are ~300 below μ: their spread, not their size, is the scale, so
    they get p = 0 while one that beats μ gets p near 1."""
    s = FitnessScale("adaptive", window=100)
    rng = np.random.default_rng(1)
    for g in rng.normal(-300.0, 50.0, size=100):
        s.update(g, 0.0)
    assert 30.0 < s.r < 70.0  # the spread, 50 (a MAD of 100 samples)
    assert update_ratio("baseline-relative", -300.0, 0.0, s.r) == 0.0
    assert update_ratio("baseline-relative", 300.0, 0.0, s.r) > 0.85


def test_adaptive_scale_follows_the_size_of_the_gaps_not_of_the_returns() -> None:
    """At fixed r = 2000 a gap of 300 gives p ≈ 0.5 (no selection); the adaptive r separates it."""
    rng = np.random.default_rng(0)
    s = FitnessScale("adaptive", window=100)
    for g in rng.normal(0.0, 300.0, size=100):
        s.update(-200.0 + g, -200.0)
    assert 200.0 < s.r < 450.0
    assert update_ratio("baseline-relative", 100.0, -200.0, 2000.0) == pytest.approx(0.535, abs=0.01)
    assert update_ratio("baseline-relative", -500.0, -200.0, 2000.0) == pytest.approx(0.459, abs=0.01)
    assert update_ratio("baseline-relative", 100.0, -200.0, s.r) > 0.6
    assert update_ratio("baseline-relative", -650.0, -200.0, s.r) == 0.0


def test_zero_gaps_keep_r_positive() -> None:
    s = FitnessScale("adaptive", min_gaps=1)
    assert s.update(5.0, 5.0) > 0


def test_no_move_until_the_spread_of_the_gaps_is_known() -> None:
    """A first RL individual 300 below μ must not set r to its own gap (p would be 0.25)."""
    s = FitnessScale("adaptive", min_gaps=5)
    assert [s.update(g, 0.0) for g in (-300.0, 10.0, -20.0, 30.0)] == [None] * 4
    assert not s.ready and s.update(-40.0, 0.0) == pytest.approx(MAD_TO_STD * 30.0) and s.ready
    d = make_distribution("aesrl", np.zeros(3, np.float32), r="adaptive")
    z = np.full(3, 0.5, np.float32)
    assert [d.tell(z, g, 0.0) for g in (-300.0, 10.0, 20.0, 30.0)] == [0.0] * 4
    assert d.version == 0 and np.all(d.mean == 0)
    assert d.tell(z, 40.0, 0.0) > 0.5 and d.version == 1


@pytest.mark.parametrize("bad", [dict(mode="nope"), dict(mode="fixed"), dict(mode="fixed", r=-1.0),
                                 dict(mode="auto"), dict(window=0), dict(min_gaps=0),
                                 dict(window=3, min_gaps=4)])
def test_bad_settings_are_rejected(bad) -> None:
    with pytest.raises(ValueError):
        FitnessScale(**bad)


def test_state_round_trip_and_rejects_garbage() -> None:
    s = FitnessScale("adaptive", window=4, min_gaps=2)
    for g in (1.0, -3.0, 7.0):
        s.update(g, 0.0)
    t = FitnessScale("adaptive", window=4, min_gaps=2)
    t.load_state(s.state())
    assert t.r == s.r and t.update(2.0, 0.0) == s.update(2.0, 0.0)
    for bad in ({"mode": "auto", "seen": []}, {"mode": "adaptive", "seen": [math.inf]},
                {"mode": "adaptive", "seen": [], "r": 0.0}, "x"):
        with pytest.raises(ValueError):
            t.load_state(bad)  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e4, 1e4), st.floats(-1e4, 1e4)), min_size=1, max_size=30),
       st.integers(0, 2**31 - 1))
def test_distribution_with_adaptive_r_resumes_identically(results, seed) -> None:
    """state() → load_state() of an AES-RL distribution → the same r, p and μ for what follows."""
    rng = np.random.default_rng(seed)
    mu0 = rng.normal(size=6).astype(np.float32)
    a = make_distribution("aesrl", mu0, r="adaptive")
    half = len(results) // 2
    for f_z, f_mu in results[:half]:
        a.tell(a.sample(int(rng.integers(2**31))), f_z, f_mu)
    b = make_distribution("aesrl", mu0, r="adaptive")
    b.load_state(a.state())
    for f_z, f_mu in results[half:]:
        z = a.sample(int(rng.integers(2**31)))
        assert a.tell(z, f_z, f_mu) == b.tell(z, f_z, f_mu)
        assert a.r == b.r
    assert np.array_equal(a.mean, b.mean) and np.array_equal(a.var, b.var)


def test_rejected_result_does_not_enter_the_scale() -> None:
    d = make_distribution("aesrl", np.zeros(4, np.float32), r="adaptive")
    d.tell(np.ones(4, np.float32) * 0.01, 10.0, 0.0)
    before = d.scale.state()
    with pytest.raises(ValueError):
        d.tell(np.array([0, 0, math.nan, 0], np.float32), 50.0, 0.0)
    with pytest.raises(ValueError):
        d.tell(np.zeros(4, np.float32), math.inf, 0.0)
    assert d.scale.state() == before


def test_judged_gaps_do_not_set_the_scale() -> None:
    """An RL individual is judged on the spread of ES gaps without adding its own gap to them."""
    s = FitnessScale("adaptive", window=100, min_gaps=3)
    s.update(10.0, 0.0)
    assert s.judge() is None  # one gap: not ready, and judging adds none
    s.update(-40.0, 0.0)
    r = s.update(30.0, 0.0)  # 10, -40, 30: MAD 20 around the median 10
    assert r == pytest.approx(1.4826 * 20.0) and s.judge() == r
    state = s.state()
    assert s.judge() == r and s.state() == state
