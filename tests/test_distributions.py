"""Search distributions: exact single updates, laws that hold for any input, persistence, toy runs.
The toy problem is f(z) = −||z − target||², small enough to keep the whole file fast.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aesrl_queue import noise
from aesrl_queue.distributions import DISTRIBUTIONS, AsyncDistribution, make_distribution
from aesrl_queue.rules import AESRL_VAR_RULES, FITNESS_MEAN_RULES

FLOOR32 = np.float32(1e-5)
TARGET = np.full(4, 0.3)


def fitness(z: np.ndarray) -> float:
    """Quadratic toy problem with its optimum at TARGET."""
    return -float(np.sum((np.asarray(z, dtype=np.float64) - TARGET) ** 2))


def list_variants() -> list[str]:
    """Every asynchronous distribution this file checks: "aesrl:<mean rule>/<var rule>", "opo", "acem"."""
    aesrl = [f"aesrl:{m}/{v}" for m in FITNESS_MEAN_RULES for v in AESRL_VAR_RULES]
    return [*aesrl, "opo", "acem"]


def make_variant(variant: str, mu: Any, **params: Any) -> AsyncDistribution:
    """The distribution a `list_variants()` name stands for."""
    if variant in ("opo", "acem"):
        return make_distribution(variant, mu, **params)  # type: ignore[return-value]
    kind, _, rules = variant.partition(":")
    mean_rule, _, var_rule = rules.partition("/")
    if kind != "aesrl" or not mean_rule or not var_rule:
        raise ValueError(f"unknown variant {variant!r}; allowed: {', '.join(list_variants())}")
    clash = sorted({"mean_rule", "var_rule"} & set(params))
    if clash:
        raise ValueError(f"variant {variant!r} already sets {', '.join(clash)}")
    return make_distribution("aesrl", mu, mean_rule=mean_rule, var_rule=var_rule, **params)  # type: ignore[return-value]


def variant_params(variant: str) -> dict[str, Any]:
    if variant in ("opo", "acem"):
        return {}
    # b = −r must lie below the toy fitnesses (≈ −0.4) or the absolute rule never moves.
    return {"r": 1.0 if "absolute" in variant else 0.05}


def snapshot(dist: Any) -> dict[str, Any]:
    return {"mean": dist.mean.copy(), "var": dist.var.copy(), "version": dist.version, "state": dist.state()}


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    np.testing.assert_array_equal(a["mean"], b["mean"])
    np.testing.assert_array_equal(a["var"], b["var"])
    assert a["version"] == b["version"]
    assert a["state"].keys() == b["state"].keys()
    for key, value in a["state"].items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, b["state"][key])
        else:
            assert value == b["state"][key]


def as_decoded(state: dict[str, Any]) -> dict[str, Any]:
    """What a msgpack round trip hands back: read-only arrays, lists for tuples."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, np.ndarray):
            value = np.frombuffer(value.tobytes(), dtype=value.dtype).reshape(value.shape)
        elif isinstance(value, tuple):
            value = list(value)
        out[key] = value
    return out


# -- construction --------------------------------------------------------------------------------


def test_make_distribution_validation() -> None:
    mu = np.zeros(3)
    with pytest.raises(ValueError) as err:
        make_distribution("cma-es", mu)
    assert "cma-es" in str(err.value) and all(name in str(err.value) for name in DISTRIBUTIONS)
    with pytest.raises(ValueError, match="sigma_init"):
        make_distribution("aesrl", mu, r=1.0, sigma_init=1e-3)
    with pytest.raises(ValueError, match="r .*required"):
        make_distribution("aesrl", mu)
    with pytest.raises(ValueError, match="r must be > 0"):
        make_distribution("aesrl", mu, r=0.0)
    with pytest.raises(ValueError, match="opo"):
        make_distribution("aesrl", mu, r=1.0, var_rule="success-rule")
    with pytest.raises(ValueError, match="mean_rule"):
        make_distribution("aesrl", mu, r=1.0, mean_rule="rank")
    for bad_mu in (np.zeros((2, 2)), np.zeros(0), np.array([0.0, np.nan])):
        with pytest.raises(ValueError, match="mu"):
            make_distribution("opo", bad_mu)
    make_distribution("aesrl", mu, mean_rule="one-plus-one")  # r not needed


def test_initial_state_and_sample() -> None:
    mu = np.array([1.0, 2.0, 3.0])
    dist = make_distribution("aesrl", mu, r=10.0)
    mu[0] = 99.0  # the distribution holds its own copy
    assert dist.dim == 3 and dist.version == 0
    np.testing.assert_array_equal(dist.mean, np.array([1.0, 2.0, 3.0], dtype=np.float32))
    np.testing.assert_array_equal(dist.var, np.full(3, 1e-3, dtype=np.float32))
    assert dist.mean.dtype == dist.var.dtype == np.float32
    np.testing.assert_array_equal(dist.sample(5), noise.sample(dist.mean, dist.var, 5))


def test_list_variants() -> None:
    variants = list_variants()
    assert len(variants) == 10 and len(set(variants)) == 10
    assert "aesrl:baseline-relative/adaptive" in variants and "opo" in variants and "acem" in variants
    assert sum(v.startswith("aesrl:") for v in variants) == 8
    with pytest.raises(ValueError, match="variant"):
        make_variant("aesrl:baseline-relative", np.zeros(2), r=1.0)


@pytest.mark.parametrize("variant", list_variants())
def test_variant_runs_on_quadratic(variant: str) -> None:
    dist = make_variant(variant, np.zeros(4), **variant_params(variant))
    start = np.linalg.norm(dist.mean - TARGET)
    for seed in range(50):
        z = dist.sample(seed)
        p = dist.tell(z, fitness(z), fitness(dist.mean))
        assert math.isfinite(p)
        assert np.all(np.isfinite(dist.mean)) and np.all(dist.var > 0)
    assert dist.version > 0
    if variant == "aesrl:baseline-relative/adaptive":
        assert np.linalg.norm(dist.mean - TARGET) < start


# -- exact single updates ------------------------------------------------------------------------


def test_aesrl_exact_tell() -> None:
    dist = make_distribution("aesrl", np.zeros(2), r=100.0)
    z = np.array([1.0, 2.0])
    p = dist.tell(z, 100.0, 100.0)  # Δ = 0: p = 0.5, adaptive n = 1
    assert p == 0.5
    np.testing.assert_array_equal(dist.mean, np.array([0.5, 1.0], dtype=np.float32))
    # n = 1: var = (z − μ_old)(z − μ_new) = [1·0.5, 2·1]
    np.testing.assert_array_equal(dist.var, np.array([0.5, 2.0], dtype=np.float32))
    assert dist.version == 1


def test_aesrl_fixed_n_exact_tell() -> None:
    dist = make_distribution(
        "aesrl", np.zeros(1), mean_rule="fixed-linear", var_rule="fixed", r=10.0, fixed_n=4.0
    )
    p = dist.tell(np.array([2.0]), 5.0, 0.0)  # p = 0.5, μ_new = 1
    assert p == 0.5
    np.testing.assert_array_equal(dist.mean, np.array([1.0], dtype=np.float32))
    np.testing.assert_allclose(dist.var, [1e-3 + (2.0 * 1.0 - 1e-3) / 4.0], rtol=1e-6)


def test_aesrl_p_zero_changes_nothing() -> None:
    dist = make_distribution("aesrl", np.zeros(3), r=10.0)
    before = snapshot(dist)
    assert dist.tell(np.ones(3), -20.0, 0.0) == 0.0  # Δ < −r
    assert_same(before, snapshot(dist))


def test_opo_tells() -> None:
    dist = make_distribution("opo", np.zeros(2))
    z = np.array([0.5, -0.5])
    assert dist.tell(z, 1.0, 0.0) == 1.0  # success: μ ← z, rate 1/1 > 0.2: var / 0.99
    np.testing.assert_array_equal(dist.mean, z.astype(np.float32))
    np.testing.assert_array_equal(dist.var, np.full(2, np.float32(1e-3 / 0.99)))
    assert dist.version == 1
    assert dist.tell(np.zeros(2), -1.0, 0.0) == 0.0  # failure: μ stays; rate 1/2 still > 0.2
    np.testing.assert_array_equal(dist.mean, z.astype(np.float32))
    np.testing.assert_array_equal(dist.var, np.full(2, np.float32(np.float32(1e-3 / 0.99) / 0.99)))
    assert dist.version == 2
    assert dist.state()["success_history"] == [True, False]


def test_opo_var_floor_and_version() -> None:
    dist = make_distribution("opo", np.zeros(2), var_init=1e-5)
    for _ in range(3):
        dist.tell(np.ones(2), -1.0, 0.0)
    # Failures shrink var, but the floor holds it; (μ, var) did not change, so neither did the version.
    np.testing.assert_array_equal(dist.var, np.full(2, FLOOR32))
    assert dist.version == 0


def acem_expected(
    mu: np.ndarray, zs: np.ndarray, fs: np.ndarray, damp: float
) -> tuple[np.ndarray, np.ndarray]:
    w = np.log(6.0 / np.arange(1, 6))
    w /= w.sum()
    elite = zs[np.argsort(-fs, kind="stable")[:5]].astype(np.float64)
    mean = mu + (w @ elite - mu) / 10.0
    var = (w @ (elite - mu) ** 2) / 5.0 + damp
    return mean.astype(np.float32), var.astype(np.float32)


def test_acem_waits_for_a_full_window_then_updates_every_tell() -> None:
    rng = np.random.default_rng(3)
    dist = make_distribution("acem", np.zeros(3))
    zs = rng.normal(size=(12, 3)).astype(np.float32)
    fs = rng.normal(size=12)
    for i in range(9):
        assert dist.tell(zs[i], fs[i], 0.0) == 0.0
    np.testing.assert_array_equal(dist.mean, np.zeros(3, dtype=np.float32))
    np.testing.assert_array_equal(dist.var, np.full(3, 1e-3, dtype=np.float32))
    assert dist.version == 0
    assert dist.tell(zs[9], fs[9], 0.0) == pytest.approx(0.1)
    mean, var = acem_expected(np.zeros(3), zs[:10], fs[:10], 1e-3)
    np.testing.assert_allclose(dist.mean, mean, rtol=1e-6)
    np.testing.assert_allclose(dist.var, var, rtol=1e-6)
    assert dist.version == 1
    tau = 0.9**0.1
    damp = tau * 1e-3 + (1 - tau) * 1e-5
    assert dist.state()["damp"] == pytest.approx(damp, rel=1e-12)
    # The 11th result pushes the 1st out of the window.
    mu1 = dist.mean.astype(np.float64)
    dist.tell(zs[10], fs[10], 0.0)
    mean, var = acem_expected(mu1, zs[1:11], fs[1:11], damp)
    np.testing.assert_allclose(dist.mean, mean, rtol=1e-6)
    np.testing.assert_allclose(dist.var, var, rtol=1e-6)
    assert dist.version == 2


def test_acem_ties_keep_the_oldest() -> None:
    dist = make_distribution("acem", np.zeros(1), damp_init=0.0)
    for i in range(10):
        dist.tell(np.array([float(i)]), 1.0, 0.0)
    w = np.log(6.0 / np.arange(1, 6))
    w /= w.sum()
    expected_mean = (w @ np.arange(5.0)) / 10.0
    np.testing.assert_allclose(dist.mean, [expected_mean], rtol=1e-6)


# -- synchronous CEM ------------------------------------------------------------------------------


def test_cem_ask_antithetic() -> None:
    dist = make_distribution("cem", np.array([1.0, -2.0, 0.5]))
    seeds, pop = dist.ask(6, seed=10)
    assert pop.shape == (6, 3) and pop.dtype == np.float32
    assert len(seeds) == 6 and seeds[0::2] == seeds[1::2] and len(set(seeds)) == 3
    for j in range(3):
        np.testing.assert_allclose(pop[2 * j] + pop[2 * j + 1], 2 * dist.mean, atol=1e-6)
        plus, minus = noise.antithetic_pair(dist.mean, dist.var, seeds[2 * j])
        np.testing.assert_array_equal(pop[2 * j], plus)
        np.testing.assert_array_equal(pop[2 * j + 1], minus)
    again_seeds, again = dist.ask(6, seed=10)
    assert again_seeds == seeds
    np.testing.assert_array_equal(again, pop)
    odd_seeds, odd = dist.ask(3, seed=10)
    assert len(set(odd_seeds)) == 3
    np.testing.assert_array_equal(odd[1], noise.sample(dist.mean, dist.var, odd_seeds[1]))


def test_cem_tell_exact() -> None:
    dist = make_distribution("cem", np.zeros(2))
    pop = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, -1.0]])
    assert dist.tell(pop, np.array([1.0, 3.0, 2.0, 0.0])) is None
    # Elite (K = 2): member 1 then member 2, weights ∝ log(3/1), log(3/2).
    w1, w2 = math.log(3.0), math.log(1.5)
    w1, w2 = w1 / (w1 + w2), w2 / (w1 + w2)
    np.testing.assert_allclose(dist.mean, [2 * w2, w1 + 2 * w2], rtol=1e-6)
    np.testing.assert_allclose(dist.var, [(4 * w2) / 2 + 1e-3, (w1 + 4 * w2) / 2 + 1e-3], rtol=1e-6)
    assert dist.version == 1
    assert dist.state()["damp"] == pytest.approx(0.95 * 1e-3 + 0.05 * 1e-5, rel=1e-12)


def test_cem_tell_validation_leaves_state() -> None:
    dist = make_distribution("cem", np.zeros(2))
    before = snapshot(dist)
    with pytest.raises(ValueError):
        dist.tell(np.zeros((4, 3)), np.zeros(4))
    with pytest.raises(ValueError):
        dist.tell(np.zeros((4, 2)), np.zeros(3))
    with pytest.raises(ValueError):
        dist.tell(np.zeros((4, 2)), np.array([0.0, np.nan, 1.0, 2.0]))
    with pytest.raises(ValueError):
        dist.tell(np.zeros((1, 2)), np.zeros(1))  # elite of n // 2 = 0
    assert_same(before, snapshot(dist))


def test_cem_state_round_trip() -> None:
    first = make_distribution("cem", np.zeros(3))
    second = make_distribution("cem", np.zeros(3))
    rng = np.random.default_rng(0)
    _, pop = first.ask(10, seed=1)
    first.tell(pop, rng.normal(size=10))
    second.load_state(as_decoded(first.state()))
    for gen in range(3):
        seeds_a, pop_a = first.ask(10, seed=gen)
        seeds_b, pop_b = second.ask(10, seed=gen)
        assert seeds_a == seeds_b
        fit = rng.normal(size=10)
        first.tell(pop_a, fit)
        second.tell(pop_b, fit)
    assert_same(snapshot(first), snapshot(second))


# -- persistence of the async kinds --------------------------------------------------------------

ASYNC_KINDS = ["aesrl:baseline-relative/adaptive", "aesrl:fixed-linear/fixed", "opo", "acem"]


def feed(dist: AsyncDistribution, seeds: range) -> None:
    for seed in seeds:
        z = dist.sample(seed)
        dist.tell(z, fitness(z), fitness(dist.mean))


@pytest.mark.parametrize("variant", ASYNC_KINDS)
def test_state_round_trip_continues_identically(variant: str) -> None:
    params = variant_params(variant)
    first = make_variant(variant, np.zeros(4), **params)
    feed(first, range(15))
    second = make_variant(variant, np.zeros(4), **params)
    second.load_state(as_decoded(first.state()))
    assert_same(snapshot(first), snapshot(second))
    feed(first, range(15, 40))
    feed(second, range(15, 40))
    assert_same(snapshot(first), snapshot(second))


@pytest.mark.parametrize("variant", ASYNC_KINDS)
def test_load_state_rejects_mismatch_and_changes_nothing(variant: str) -> None:
    dist = make_variant(variant, np.zeros(4), **variant_params(variant))
    feed(dist, range(12))
    before = snapshot(dist)
    good = dist.state()
    bad_states = [
        good | {"kind": "cem"},
        good | {"mean": np.zeros(5, dtype=np.float32)},
        good | {"var": np.zeros(4, dtype=np.float32)},
        good | {"version": -1},
        {k: v for k, v in good.items() if k != "var"},
    ]
    for bad in bad_states:
        with pytest.raises(ValueError):
            dist.load_state(bad)
        assert_same(before, snapshot(dist))


# -- laws that hold for any input (hypothesis) ---------------------------------------------------

DIM = 3
finite = st.floats(-1e3, 1e3, allow_nan=False)
vectors = hnp.arrays(np.float32, DIM, elements=st.floats(-100, 100, width=32))
fitnesses = st.floats(-1e4, 1e4, allow_nan=False)
scales = st.floats(1e-3, 1e4, allow_nan=False)
segment_rules = st.sampled_from(
    ["one-plus-one", "fixed-linear", "fixed-sigmoid", "baseline-absolute", "baseline-relative"]
)
var_rules = st.sampled_from(["fixed", "adaptive"])


@settings(max_examples=300, deadline=None)
@given(
    mu=vectors,
    z=vectors,
    f_z=fitnesses,
    f_mu=fitnesses,
    r=scales,
    mean_rule=segment_rules,
    var_rule=var_rules,
)
def test_mean_stays_on_segment_and_var_above_floor(
    mu: np.ndarray, z: np.ndarray, f_z: float, f_mu: float, r: float, mean_rule: str, var_rule: str
) -> None:
    dist = make_distribution("aesrl", mu, mean_rule=mean_rule, var_rule=var_rule, r=r)
    before = snapshot(dist)
    p = dist.tell(z, f_z, f_mu)
    assert 0.0 <= p <= 1.0
    assert np.all(dist.mean >= np.minimum(mu, z)) and np.all(dist.mean <= np.maximum(mu, z))
    assert np.all(dist.var >= FLOOR32)
    if p == 0.0:
        assert_same(before, snapshot(dist))


@settings(max_examples=100, deadline=None)
@given(mu=vectors, z=vectors, f_mu=fitnesses, r=scales, excess=st.floats(1e-6, 1e4))
def test_p_zero_leaves_everything(
    mu: np.ndarray, z: np.ndarray, f_mu: float, r: float, excess: float
) -> None:
    dist = make_distribution("aesrl", mu, r=r)  # baseline-relative: p = 0 when Δ < −r
    before = snapshot(dist)
    assert dist.tell(z, f_mu - r * (1 + excess) - 1e-9, f_mu) == 0.0
    assert_same(before, snapshot(dist))


@settings(max_examples=100, deadline=None)
@given(
    variant=st.sampled_from(list_variants()),
    history=st.lists(st.tuples(vectors, fitnesses, fitnesses), max_size=12),
    bad=st.sampled_from(["nan_f_z", "inf_f_mu", "short_z", "long_z", "nan_z", "2d_z", "huge_z"]),
)
def test_invalid_tell_raises_and_changes_nothing(
    variant: str, history: list[tuple[np.ndarray, float, float]], bad: str
) -> None:
    dist = make_variant(variant, np.zeros(DIM), **variant_params(variant))
    for z, f_z, f_mu in history:
        dist.tell(z, f_z, f_mu)
    before = snapshot(dist)
    z, f_z, f_mu = np.ones(DIM), 1.0, 0.0
    if bad == "nan_f_z":
        f_z = float("nan")
    elif bad == "inf_f_mu":
        f_mu = float("inf")
    elif bad == "short_z":
        z = np.ones(DIM - 1)
    elif bad == "long_z":
        z = np.ones(DIM + 1)
    elif bad == "nan_z":
        z = np.array([0.0, np.nan, 0.0])
    elif bad == "2d_z":
        z = np.ones((1, DIM))
    else:
        z = np.array([0.0, 1e39, 0.0])  # finite in float64, inf as float32
    with pytest.raises(ValueError):
        dist.tell(z, f_z, f_mu)
    assert_same(before, snapshot(dist))


@pytest.mark.parametrize("dim", [1, 7, 4096, 129306])
def test_fast_aesrl_step_matches_the_plain_formulas(dim: int) -> None:
    """The in-place update of AesrlDistribution.tell gives the bits of the documented formulas."""
    from aesrl_queue.distributions import _aesrl_step
    from aesrl_queue.rules import welford_variance

    rng = np.random.default_rng(dim)
    for p, n in [(0.5, 2.0), (0.01, 101.0), (1.0, 0.0), (-0.3, 10.0), (0.999, 1.001), (1.7, 5.0)]:
        mu = rng.standard_normal(dim).astype(np.float32)
        var = (rng.random(dim) * 1e-2 + 1e-9).astype(np.float32)
        z = (mu + rng.standard_normal(dim) * 0.1).astype(np.float32)
        mu64, z64 = mu.astype(np.float64), z.astype(np.float64)
        plain = (1.0 - p) * mu64 + p * z64
        if 0.0 <= p <= 1.0:
            plain = np.clip(plain, np.minimum(mu64, z64), np.maximum(mu64, z64))
        plain = plain.astype(np.float32)
        plain_var = welford_variance(var, z, mu, plain, n, 1e-8) if n > 0 else var
        fast, fast_var = _aesrl_step(mu, var, z, p, n, 1e-8)
        assert np.array_equal(fast.view(np.uint32), plain.view(np.uint32)), (p, n)
        assert np.array_equal(fast_var.view(np.uint32), np.asarray(plain_var).view(np.uint32)), (p, n)


def test_a_result_told_without_scale_step_is_judged_on_r_but_does_not_move_it() -> None:
    """RL individuals (scale_step=False): their gaps do not enter the adaptive scale's window."""
    from aesrl_queue.rules import update_ratio

    d = make_distribution("aesrl", np.zeros(3), r="adaptive", var_init=1e-2)
    for i, gap in enumerate([-2.0, -1.0, 0.0, 1.0, 2.0]):
        d.tell(np.full(3, 0.01 * i, dtype=np.float32), 100.0 + gap, 100.0)
    r = d.r
    assert d.scale.ready and 1.0 < r < 3.0
    p, _ = d.tell_step(np.full(3, 0.5, dtype=np.float32), 100.0 - 0.5 * r, 100.0, scale_step=False)
    assert d.r == r and len(d.scale._seen) == 5  # judged on r, not counted in it
    assert p == pytest.approx(update_ratio("baseline-relative", 100.0 - 0.5 * r, 100.0, r))
    d.tell_step(np.full(3, 0.5, dtype=np.float32), 100.0 - 800.0, 100.0)  # counted: the spread grows
    assert len(d.scale._seen) == 6 and d.r > r
