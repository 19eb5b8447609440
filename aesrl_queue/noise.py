"""The one RNG of the project: a standard-normal perturbation rebuilt bit for bit from (seed, dim).
Workers sample z = μ + sqrt(var)·ε from it and the scheduler rebuilds the same z from the seed alone.

Algorithm of `perturbation(seed, dim)`, enough to reimplement it elsewhere:

1. Words. k = ceil(dim/2) pairs; w[0..2k-1] = `numpy.random.PCG64(seed).random_raw(2k)`, the raw
   uint64 outputs of numpy's PCG64 (PCG XSL-RR 128/64) seeded through `SeedSequence(seed)`. numpy
   keeps bit-generator streams stable across versions; its `Generator.normal` code carries no such
   promise, which is why it is not used.
2. Uniforms. u[i] = ((w[i] >> 12) + 0.5)·2^-52, exact in float64 and strictly inside (0, 1). The top
   52 bits are used, not 53: with 53 the +0.5 would round and could give exactly 1.0.
3. Box-Muller, float64. For pair j, with a = u[2j], b = u[2j+1]: ρ = sqrt(−2·ln a), θ = 2π·b,
   out[2j] = ρ·cos θ, out[2j+1] = ρ·sin θ. ln, cos and sin are evaluated with +, −, ×, ÷ and sqrt
   only (each correctly rounded by IEEE 754, one rounding per operation, no fused multiply-add),
   because the math libraries behind numpy differ in the last bit between CPUs and platforms:
   - ln a: (m, e) = frexp(a), a = m·2^e with m in [0.5, 1); if m < 0.7071067811865476 then m ← 2m,
     e ← e − 1. s = (m − 1)/(m + 1), t = s·s; P = Horner in t of c_0..c_11 with c_j the double
     nearest 1/(2j + 1), i.e. P = (((c_11·t + c_10)·t + c_9)·t ... )·t + c_0;
     ln a = e·0.6931471805599453 + (2·s)·P.
   - θ: x4 = 4·b, q = round-half-even(x4), f = x4 − q (exact, in [−0.5, 0.5]),
     x = f·1.5707963267948966, t = x·x; S = Horner in t of the doubles nearest (−1)^j/(2j+1)!
     for j = 0..9, sin x = x·S; cos x = Horner in t of the doubles nearest (−1)^j/(2j)! for
     j = 0..9. With q mod 4 = 0, 1, 2, 3: (cos θ, sin θ) = (cos x, sin x), (−sin x, cos x),
     (−cos x, −sin x), (sin x, −cos x).
   ρ·cos θ and ρ·sin θ are single products.
4. Output: out[0..dim-1], each rounded to the nearest float32.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

SEED_LIMIT = 2**63

_SQRT_HALF = 0.7071067811865476
_LN2 = 0.6931471805599453
_HALF_PI = 1.5707963267948966
_TWO_POW_M52 = 2.0**-52
# int/int true division in Python is correctly rounded, so these are "the double nearest" exactly.
_ATANH_COEFFS = tuple(1 / (2 * j + 1) for j in range(12))
_SIN_COEFFS = tuple((-1) ** j / math.factorial(2 * j + 1) for j in range(10))
_COS_COEFFS = tuple((-1) ** j / math.factorial(2 * j) for j in range(10))


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be an int in [0, 2**63), got {seed!r}")
    return int(seed)


def _horner(coeffs: tuple[float, ...], t: np.ndarray) -> np.ndarray:
    acc = np.full_like(t, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = acc * t + c
    return acc


def _ln(a: np.ndarray) -> np.ndarray:
    m, e = np.frexp(a)
    low = m < _SQRT_HALF
    m = np.where(low, m * 2.0, m)
    e = np.where(low, e - 1, e).astype(np.float64)
    s = (m - 1.0) / (m + 1.0)
    return e * _LN2 + (2.0 * s) * _horner(_ATANH_COEFFS, s * s)


def _cos_sin_2pi(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x4 = 4.0 * b
    q = np.rint(x4)
    x = (x4 - q) * _HALF_PI
    t = x * x
    sin_x = x * _horner(_SIN_COEFFS, t)
    cos_x = _horner(_COS_COEFFS, t)
    quadrant = q.astype(np.int64) & 3
    cos_t = np.choose(quadrant, (cos_x, -sin_x, -cos_x, sin_x))
    sin_t = np.choose(quadrant, (sin_x, cos_x, -sin_x, -cos_x))
    return cos_t, sin_t


def uniforms(seed: int, count: int) -> np.ndarray:
    """Steps 1-2 of the module's algorithm: `count` float64 uniforms in (0, 1) from `seed`."""
    words = np.random.PCG64(_check_seed(seed)).random_raw(count)
    return ((words >> np.uint64(12)).astype(np.float64) + 0.5) * _TWO_POW_M52


def perturbation(seed: int, dim: int) -> np.ndarray:
    """`dim` float32 standard normals from `seed`, identical on every machine (see module docstring)."""
    seed = _check_seed(seed)
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim < 0:
        raise ValueError(f"dim must be an int >= 0, got {dim!r}")
    pairs = (int(dim) + 1) // 2
    u = uniforms(seed, 2 * pairs)
    rho = np.sqrt(-2.0 * _ln(u[0::2]))
    cos_t, sin_t = _cos_sin_2pi(u[1::2])
    out = np.empty(2 * pairs, dtype=np.float64)
    out[0::2] = rho * cos_t
    out[1::2] = rho * sin_t
    return out[:dim].astype(np.float32)


def derive_seeds(seed: int, count: int) -> list[int]:
    """`count` seeds in [0, 2**63) derived from `seed` (the top 63 bits of its PCG64 words)."""
    if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
        raise ValueError(f"count must be an int >= 0, got {count!r}")
    words = np.random.PCG64(_check_seed(seed)).random_raw(int(count))
    return [int(w) for w in words >> np.uint64(1)]


def _scale(mu: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu32 = np.asarray(mu, dtype=np.float32)
    var32 = np.asarray(var, dtype=np.float32)
    if mu32.shape != var32.shape:
        raise ValueError(f"mu and var must have one shape, got {mu32.shape} and {var32.shape}")
    if not np.all(var32 >= 0):  # also catches NaN
        raise ValueError("var must be >= 0 everywhere")
    return mu32, np.sqrt(var32)


def mirrored(seed: int) -> int:
    """The job seed of the antithetic partner of `seed`: sample(μ, var, mirrored(s)) = μ − sqrt(var)·ε(s)."""
    return _check_seed(seed) + SEED_LIMIT


def sample(mu: np.ndarray, var: np.ndarray, seed: int) -> np.ndarray:
    """z = μ + sqrt(var)·ε(seed) in float32: the only place an individual is built from a seed.

    A seed s + 2**63 (see `mirrored`) gives μ − sqrt(var)·ε(s), so the synchronous CEM loops can
    hand out antithetic pairs as plain (version, seed) jobs.
    """
    mu32, std = _scale(mu, var)
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and SEED_LIMIT <= seed < 2 * SEED_LIMIT:
        return mu32 - std * perturbation(int(seed) - SEED_LIMIT, mu32.size).reshape(mu32.shape)
    eps = perturbation(seed, mu32.size).reshape(mu32.shape)
    return mu32 + std * eps


def antithetic_pair(mu: np.ndarray, var: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(μ + sqrt(var)·ε, μ − sqrt(var)·ε) for one ε(seed), in float32."""
    mu32, std = _scale(mu, var)
    step = std * perturbation(seed, mu32.size).reshape(mu32.shape)
    return mu32 + step, mu32 - step
