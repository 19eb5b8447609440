"""Exact values of the AES-RL mean rules, variance rules, Welford step and success rule.
Every expected number here is computed by hand from the paper's equations (docs/algorithms.md).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from aesrl_queue.rules import (
    MEAN_RULES,
    VAR_RULES,
    SuccessRule,
    update_ratio,
    variance_n,
    welford_variance,
)


def test_rule_names() -> None:
    assert MEAN_RULES == (
        "one-plus-one",
        "fixed-linear",
        "fixed-sigmoid",
        "baseline-absolute",
        "baseline-relative",
    )
    assert VAR_RULES == ("fixed", "adaptive", "success-rule")


# -- mean rules ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("f_z", "f_mu", "p"), [(1.0, 0.0, 1.0), (0.0, 0.0, 0.0), (-1.0, 0.0, 0.0)])
def test_one_plus_one(f_z: float, f_mu: float, p: float) -> None:
    assert update_ratio("one-plus-one", f_z, f_mu, 100.0) == p


def test_one_plus_one_ignores_r() -> None:
    assert update_ratio("one-plus-one", 2.0, 1.0, 0.0) == 1.0
    assert update_ratio("one-plus-one", 2.0, 1.0, float("nan")) == 1.0


@pytest.mark.parametrize(
    ("delta", "negative_ratio", "p"),
    [
        (5.0, 0.0, 0.5),
        (10.0, 0.0, 1.0),
        (20.0, 0.0, 1.0),  # clipped at 1
        (0.0, 0.0, 0.0),
        (-5.0, 0.0, 0.0),  # negative moves off by default
        (-5.0, 0.5, -0.25),  # published behaviour: p < 0 moves μ away from z
        (-20.0, 0.5, -0.5),  # clipped at −1 before the ratio
    ],
)
def test_fixed_linear(delta: float, negative_ratio: float, p: float) -> None:
    assert update_ratio("fixed-linear", 100.0 + delta, 100.0, 10.0, negative_ratio) == p


def test_fixed_sigmoid() -> None:
    assert update_ratio("fixed-sigmoid", 7.0, 7.0, 3.0) == 0.5
    assert update_ratio("fixed-sigmoid", 3.0, 0.0, 3.0) == pytest.approx(
        1.0 / (1.0 + math.exp(-1.0)), rel=1e-15
    )
    assert update_ratio("fixed-sigmoid", -3.0, 0.0, 3.0) == pytest.approx(
        1.0 / (1.0 + math.exp(1.0)), rel=1e-15
    )


def test_fixed_sigmoid_huge_delta_does_not_overflow() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert update_ratio("fixed-sigmoid", 1e308, 0.0, 1e-3) == 1.0
        assert update_ratio("fixed-sigmoid", -1e308, 0.0, 1e-3) == 0.0
        assert update_ratio("fixed-sigmoid", 1e308, -1e308, 1.0) == 1.0


@pytest.mark.parametrize(
    ("f_z", "f_mu", "p"),
    [
        (-150.0, 0.0, 0.0),  # below the baseline b = −100
        (0.0, 0.0, 0.5),  # 100 / (100 + 100)
        (100.0, -50.0, 0.8),  # 200 / (200 + 50)
        (0.0, -120.0, 1.0),  # f(μ) < b: 100 / (100 − 20) = 1.25, clipped to 1
        (-90.0, -200.0, 1.0),  # f(μ) < b with a negative denominator: documented choice p = 1
        (-100.0, -100.0, 0.0),  # f(z) = f(μ) = b: zero denominator
        (-100.0, 50.0, 0.0),  # f(z) exactly at the baseline
    ],
)
def test_baseline_absolute(f_z: float, f_mu: float, p: float) -> None:
    assert update_ratio("baseline-absolute", f_z, f_mu, 100.0) == p


@pytest.mark.parametrize(
    ("delta", "p"),
    [(-150.0, 0.0), (-100.0, 0.0), (-50.0, 1 / 3), (0.0, 0.5), (100.0, 2 / 3), (500.0, 6 / 7)],
)
def test_baseline_relative(delta: float, p: float) -> None:
    assert update_ratio("baseline-relative", 1000.0 + delta, 1000.0, 100.0) == p


def test_huge_fitnesses_give_a_number_not_nan() -> None:
    assert update_ratio("baseline-relative", 1.5e308, -1.5e308, 1.0) == 1.0
    assert update_ratio("baseline-absolute", 1e308, 1e308, 1e308) == 0.5
    assert update_ratio("fixed-linear", -1.5e308, 1.5e308, 1.0, 0.5) == -0.5


def test_unknown_mean_rule_names_rule_and_allowed() -> None:
    with pytest.raises(ValueError) as err:
        update_ratio("rank-based", 1.0, 0.0, 1.0)
    message = str(err.value)
    assert "rank-based" in message
    assert all(rule in message for rule in MEAN_RULES)


@pytest.mark.parametrize("rule", [rule for rule in MEAN_RULES if rule != "one-plus-one"])
@pytest.mark.parametrize("r", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_r_rejected(rule: str, r: float) -> None:
    with pytest.raises(ValueError, match="r must be"):
        update_ratio(rule, 1.0, 0.0, r)


@pytest.mark.parametrize("rule", MEAN_RULES)
@pytest.mark.parametrize(("f_z", "f_mu"), [(float("nan"), 0.0), (0.0, float("inf")), (float("-inf"), 0.0)])
def test_non_finite_fitness_rejected(rule: str, f_z: float, f_mu: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        update_ratio(rule, f_z, f_mu, 1.0)


def test_negative_ratio_must_be_non_negative() -> None:
    with pytest.raises(ValueError, match="negative_ratio"):
        update_ratio("fixed-linear", 0.0, 1.0, 1.0, -0.5)


@pytest.mark.parametrize(
    ("rule", "f_z", "f_mu", "r", "p"),
    [
        ("fixed-linear", 105.0, 100.0, 10.0, 0.25),  # 0.5 · 0.5
        ("fixed-linear", 130.0, 100.0, 10.0, 0.5),  # clipped at 1, then halved: μ never jumps onto z
        ("fixed-linear", 95.0, 100.0, 10.0, 0.0),  # worse: negative_ratio's side, untouched
        ("fixed-sigmoid", 100.0, 100.0, 3.0, 0.5),  # Δ = 0 is not "better": unscaled
        ("fixed-sigmoid", 103.0, 100.0, 3.0, 0.5 / (1.0 + math.exp(-1.0))),
        ("baseline-relative", 100.0, 100.0, 10.0, 0.25),  # Eq. 10 scales every p above the baseline
        ("baseline-relative", 95.0, 100.0, 10.0, 0.5 * 5.0 / 15.0),
        ("baseline-relative", 85.0, 100.0, 10.0, 0.0),
        ("baseline-absolute", 50.0, 30.0, 10.0, 60.0 / 100.0),  # no p_positive in Eq. 9
    ],
)
def test_positive_ratio_scales_the_move_towards_a_better_individual(rule, f_z, f_mu, r, p) -> None:
    assert update_ratio(rule, f_z, f_mu, r, positive_ratio=0.5) == pytest.approx(p, rel=1e-12)


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5, float("nan")])
def test_positive_ratio_must_be_in_zero_one(bad: float) -> None:
    with pytest.raises(ValueError, match="positive_ratio"):
        update_ratio("fixed-linear", 2.0, 1.0, 1.0, positive_ratio=bad)


# -- variance rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", VAR_RULES)
@pytest.mark.parametrize("p", [0.0, 5e-4, 0.000999, -0.3])
def test_variance_n_no_update_for_small_p(rule: str, p: float) -> None:
    assert variance_n(rule, p) == 0.0


@pytest.mark.parametrize(("p", "n"), [(0.25, 3.0), (0.5, 1.0), (0.7, 1.0), (1.0, 1.0), (0.001, 999.0)])
def test_variance_n_adaptive(p: float, n: float) -> None:
    assert variance_n("adaptive", p) == pytest.approx(n, rel=1e-12)


def test_variance_n_fixed_and_success_rule() -> None:
    assert variance_n("fixed", 0.3) == 10.0
    assert variance_n("fixed", 0.3, fixed_n=4) == 4.0
    assert variance_n("success-rule", 0.9) == 0.0


def test_variance_n_validation() -> None:
    with pytest.raises(ValueError) as err:
        variance_n("cma", 0.5)
    assert "cma" in str(err.value) and all(rule in str(err.value) for rule in VAR_RULES)
    with pytest.raises(ValueError, match="fixed_n"):
        variance_n("fixed", 0.5, fixed_n=0)
    with pytest.raises(ValueError, match="finite"):
        variance_n("adaptive", float("nan"))


# -- Welford step --------------------------------------------------------------------------------


def test_welford_exact() -> None:
    var = np.array([1.0, 2.0], dtype=np.float32)
    z = np.array([3.0, 0.0], dtype=np.float32)
    mu_old = np.array([1.0, 0.0], dtype=np.float32)
    mu_new = np.array([2.0, 0.0], dtype=np.float32)
    # [1 + (2·1 − 1)/2, 2 + (0·0 − 2)/2]
    out = welford_variance(var, z, mu_old, mu_new, 2.0)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.array([1.5, 1.0], dtype=np.float32))


def test_welford_n_one_replaces_variance() -> None:
    # n = 1 discards the old variance: var_new = (z − μ_old)(z − μ_new).
    out = welford_variance(np.array([5.0]), np.array([4.0]), np.array([0.0]), np.array([2.0]), 1.0)
    np.testing.assert_array_equal(out, np.array([8.0], dtype=np.float32))


def test_welford_floor() -> None:
    var = np.array([1e-3, 1e-3], dtype=np.float32)
    z = mu = np.array([0.5, -0.5], dtype=np.float32)
    out = welford_variance(var, z, mu, mu, 1.0)
    np.testing.assert_array_equal(out, np.full(2, 1e-5, dtype=np.float32))
    out = welford_variance(var, z, mu, mu, 1.0, floor=1e-4)
    np.testing.assert_array_equal(out, np.full(2, 1e-4, dtype=np.float32))


@pytest.mark.parametrize("n", [0.0, -1.0])
def test_welford_no_update_returns_copy(n: float) -> None:
    var = np.array([1e-7, 2.0], dtype=np.float32)  # below the floor on purpose: not touched
    out = welford_variance(var, var, var, var, n)
    np.testing.assert_array_equal(out, var)
    assert out is not var


def test_welford_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="shape"):
        welford_variance(np.ones(3), np.ones(3), np.ones(2), np.ones(3), 1.0)


# -- success rule --------------------------------------------------------------------------------

GROW, SHRINK = 1 / 0.99, 0.99


def test_success_rule_sliding_window_differs_from_frozen_official_window() -> None:
    rule = SuccessRule()
    factors = [rule.update(False) for _ in range(10)]
    assert factors == [SHRINK] * 10
    # Window now holds 10 failures. Three successes: 1/10, 2/10 (not > 0.2), then 3/10 > 0.2.
    # The official code froze its history at the first 10 outcomes (all failures) and would
    # answer SHRINK here for ever.
    assert [rule.update(True) for _ in range(3)] == [SHRINK, SHRINK, GROW]
    # The successes slide out again: 3/10 for 7 more failures, then 2/10.
    assert [rule.update(False) for _ in range(8)] == [GROW] * 7 + [SHRINK]
    assert rule.state() == [True, True] + [False] * 8


def test_success_rule_partial_window_and_persistence() -> None:
    rule = SuccessRule()
    assert rule.update(True) == GROW  # 1/1
    assert rule.update(False) == GROW  # 1/2
    assert [rule.update(False) for _ in range(3)] == [GROW, GROW, SHRINK]  # 1/3, 1/4, 1/5
    saved = rule.state()
    assert saved == [True, False, False, False, False]
    other = SuccessRule()
    other.load_state(saved)
    assert other.state() == saved
    assert [other.update(True) for _ in range(3)] == [rule.update(True) for _ in range(3)]


def test_success_rule_validation() -> None:
    rule = SuccessRule(window=3)
    with pytest.raises(ValueError, match="window"):
        rule.load_state([True] * 4)
    with pytest.raises(ValueError, match="bools"):
        rule.load_state([1, 0])
    with pytest.raises(ValueError, match="window"):
        SuccessRule(window=0)
    with pytest.raises(ValueError, match="factor"):
        SuccessRule(factor=1.5)
