"""The fitness scale: fixed, adaptive (robust spread of f(z) − f(μ)) and auto; its state survives a restart."""

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


def test_auto_is_the_spread_of_the_fitnesses() -> None:
    s = FitnessScale("auto")
    vals = [1.0, 2.0, 3.0, 4.0]
    for v in vals:
        r = s.update(v, 0.0)
    assert r == pytest.approx(float(np.std(vals)))


@pytest.mark.parametrize("bad", [dict(mode="nope"), dict(mode="fixed"), dict(mode="fixed", r=-1.0),
                                 dict(window=0), dict(factor=0.0), dict(factor=math.nan), dict(min_gaps=0),
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
    a = make_distribution("aesrl", mu0, r="adaptive", r_window=8)
    half = len(results) // 2
    for f_z, f_mu in results[:half]:
        a.tell(a.sample(int(rng.integers(2**31))), f_z, f_mu)
    b = make_distribution("aesrl", mu0, r="adaptive", r_window=8)
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


def test_lent_gaps_make_the_scale_ready_early_and_are_left_out_once_it_has_its_own() -> None:
    """r_lend_rl: gaps that do not set r (RL individuals under r_kinds "es") count towards the scale
    while it has fewer than min_gaps of its own; a gap judged without lending only waits."""
    s = FitnessScale("adaptive", window=100, min_gaps=3)
    assert s.update(10.0, 0.0) is None
    assert s.judge(500.0, 0.0) is None  # not lent: recorded nowhere, the scale is not ready
    assert s.judge(-40.0, 0.0, lend=True) is None  # 2 gaps: still too few
    r = s.judge(30.0, 0.0, lend=True)  # 10, -40, 30: MAD 20 around the median 10
    assert r == pytest.approx(1.4826 * 20.0)
    assert not s.ready  # its own gaps are still one
    # a gap that sets the scale is judged on the mixed spread too while it is short of its own
    assert s.update(12.0, 0.0) == pytest.approx(1.4826 * 10.0)  # 10, 12, -40, 30: median 11, MAD 10
    # the state carries the lent gaps; a restarted scale judges as this one does
    t = FitnessScale("adaptive", window=100, min_gaps=3)
    t.load_state(s.state())
    assert t.judge(0.0, 0.0) == pytest.approx(s.judge(0.0, 0.0))
    assert s.update(14.0, 0.0) == pytest.approx(1.4826 * 2.0)  # own gaps 10, 12, 14: lent ones left out
    assert s.judge(900.0, 0.0, lend=True) == pytest.approx(1.4826 * 2.0)  # and no more are lent
    t.load_state({"mode": "adaptive", "r": 1.0, "seen": [1.0]})  # a state from before lending
    assert t.judge(0.0, 0.0) is None
