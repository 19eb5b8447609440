"""The seeded perturbation that workers and scheduler must rebuild identically.
Includes a cross-process byte comparison and a regression pin of the algorithm's first values.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aesrl_queue.noise import antithetic_pair, derive_seeds, perturbation, sample, uniforms

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_same_seed_same_vector() -> None:
    a = perturbation(42, 1001)
    b = perturbation(42, 1001)
    assert a.dtype == np.float32 and a.shape == (1001,)
    assert a.tobytes() == b.tobytes()


def test_different_seeds_differ() -> None:
    vectors = [perturbation(seed, 64) for seed in range(20)]
    assert len({v.tobytes() for v in vectors}) == 20


def test_prefix_stable_and_empty() -> None:
    # Pairs are generated in order, so a shorter vector is a prefix of a longer one.
    np.testing.assert_array_equal(perturbation(9, 5), perturbation(9, 6)[:5])
    np.testing.assert_array_equal(perturbation(9, 6), perturbation(9, 100)[:6])
    assert perturbation(9, 0).shape == (0,)


def test_regression_pin_first_values() -> None:
    # Regression pin: computed once from this implementation. A change here means every stored
    # (version, seed) pair would rebuild a different individual; change the pin only on purpose.
    expected = np.array(
        [-0.7009952068328857, 1.5720235109329224, -0.3007841110229492, -0.6020076870918274], dtype=np.float32
    )
    np.testing.assert_array_equal(perturbation(12345, 4), expected)


def test_standard_normal_statistics() -> None:
    eps = perturbation(2024, 1_000_000).astype(np.float64)
    assert abs(eps.mean()) < 0.005
    assert abs(eps.std() - 1.0) < 0.005
    assert abs(np.mean(eps**4) - 3.0) < 0.05  # Gaussian kurtosis, not just any unit-variance law
    assert np.mean(np.abs(eps) > 1.96) == pytest.approx(0.05, abs=0.002)


def test_matches_textbook_box_muller() -> None:
    # The hand-written ln/cos/sin agree with the math library to float32 precision.
    u = uniforms(77, 20_000)
    rho = np.sqrt(-2.0 * np.log(u[0::2]))
    reference = np.empty(20_000)
    reference[0::2] = rho * np.cos(2 * np.pi * u[1::2])
    reference[1::2] = rho * np.sin(2 * np.pi * u[1::2])
    np.testing.assert_allclose(perturbation(77, 20_000), reference, rtol=0, atol=1e-6)


def test_uniforms_strictly_inside_unit_interval() -> None:
    u = uniforms(3, 100_000)
    assert u.min() > 0.0 and u.max() < 1.0


def test_identical_in_another_process() -> None:
    code = (
        "import sys; from aesrl_queue.noise import perturbation; "
        "sys.stdout.buffer.write(perturbation(12345, 1000).tobytes())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, check=True, timeout=60
    ).stdout
    assert out == perturbation(12345, 1000).tobytes()


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, True, "3", None])
def test_bad_seed(seed: object) -> None:
    with pytest.raises(ValueError, match="seed"):
        perturbation(seed, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize("dim", [-1, 2.0, False])
def test_bad_dim(dim: object) -> None:
    with pytest.raises(ValueError, match="dim"):
        perturbation(1, dim)  # type: ignore[arg-type]


def test_numpy_int_seed_and_largest_seed() -> None:
    np.testing.assert_array_equal(perturbation(np.int64(5), 4), perturbation(5, 4))
    assert perturbation(2**63 - 1, 3).shape == (3,)


def test_sample_and_antithetic_pair() -> None:
    mu = np.array([0.0, 1.0, -2.0, 3.0, 0.5], dtype=np.float32)
    var = np.array([1.0, 0.25, 4.0, 0.0, 1e-3], dtype=np.float32)
    eps = perturbation(11, 5)
    z = sample(mu, var, 11)
    assert z.dtype == np.float32
    np.testing.assert_array_equal(z, mu + np.sqrt(var) * eps)
    plus, minus = antithetic_pair(mu, var, 11)
    np.testing.assert_array_equal(plus, z)
    np.testing.assert_array_equal(minus, mu - np.sqrt(var) * eps)
    np.testing.assert_allclose(plus + minus, 2 * mu, atol=1e-6)
    with pytest.raises(ValueError, match="shape"):
        sample(mu, var[:4], 1)
    with pytest.raises(ValueError, match="var"):
        sample(mu, -var, 1)


def test_derive_seeds() -> None:
    seeds = derive_seeds(8, 6)
    assert seeds == derive_seeds(8, 6)
    assert len(set(seeds)) == 6
    assert all(isinstance(s, int) and 0 <= s < 2**63 for s in seeds)
    assert derive_seeds(8, 3) == seeds[:3]


def _reference_perturbation(seed: int, dim: int) -> np.ndarray:
    """The module docstring's algorithm written out plainly (frexp, np.choose, no chunks).

    The module computes the same numbers with bit tricks and cache-sized chunks for speed; this
    is the oracle that keeps the fast version honest, bit for bit.
    """
    import math

    def horner(coeffs, t):
        acc = np.full_like(t, coeffs[-1])
        for c in reversed(coeffs[:-1]):
            acc = acc * t + c
        return acc

    atanh = tuple(1 / (2 * j + 1) for j in range(12))
    sin_c = tuple((-1) ** j / math.factorial(2 * j + 1) for j in range(10))
    cos_c = tuple((-1) ** j / math.factorial(2 * j) for j in range(10))
    pairs = (dim + 1) // 2
    words = np.random.PCG64(seed).random_raw(2 * pairs)
    u = ((words >> np.uint64(12)).astype(np.float64) + 0.5) * 2.0**-52
    a, b = u[0::2], u[1::2]
    m, e = np.frexp(a)
    low = m < 0.7071067811865476
    m = np.where(low, m * 2.0, m)
    e = np.where(low, e - 1, e).astype(np.float64)
    s = (m - 1.0) / (m + 1.0)
    rho = np.sqrt(-2.0 * (e * 0.6931471805599453 + (2.0 * s) * horner(atanh, s * s)))
    x4 = 4.0 * b
    q = np.rint(x4)
    x = (x4 - q) * 1.5707963267948966
    t = x * x
    sin_x, cos_x = x * horner(sin_c, t), horner(cos_c, t)
    quadrant = q.astype(np.int64) & 3
    cos_t = np.choose(quadrant, (cos_x, -sin_x, -cos_x, sin_x))
    sin_t = np.choose(quadrant, (sin_x, cos_x, -sin_x, -cos_x))
    out = np.empty(2 * pairs)
    out[0::2], out[1::2] = rho * cos_t, rho * sin_t
    return out[:dim].astype(np.float32)


@pytest.mark.parametrize("dim", [0, 1, 2, 3, 7, 32768, 32769, 32770, 65537, 129306])
def test_fast_path_is_bit_identical_to_the_plain_algorithm(dim: int) -> None:
    rng = np.random.default_rng(dim)
    for seed in [0, 2**63 - 1, *(int(s) for s in rng.integers(0, 2**63 - 1, size=3))]:
        fast, plain = perturbation(seed, dim), _reference_perturbation(seed, dim)
        assert fast.dtype == np.float32 and fast.shape == plain.shape == (dim,)
        assert np.array_equal(fast.view(np.uint32), plain.view(np.uint32)), seed
