"""The one RNG of the project: a standard-normal perturbation rebuilt bit for bit from (seed, dim).
Workers draw z = μ + sqrt(var)·ε from it and the scheduler rebuilds the same z from the seed alone,
both through `rebuild`.

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


_U64 = np.uint64
_ONE_BITS = _U64(0x3FF0000000000000)  # exponent bits of 1.0
_MANTISSA = _U64(0x000FFFFFFFFFFFFF)
_SIGN_SHIFT = _U64(63)
_SQRT_TWO = 2 * _SQRT_HALF  # exact: the test "2m < sqrt(1/2)·2" of step 3, on m' = 2m
_HALF_ULP_OF_ONE = 2.0**-53
# Pairs are transformed in chunks that stay in cache: the same arithmetic element by element, so
# the chunk size changes the speed (about 2.5x at 129k parameters) but never a bit of the output.
_CHUNK_PAIRS = 16384


def _horner(coeffs: tuple[float, ...], t: np.ndarray, out: np.ndarray) -> np.ndarray:
    out.fill(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        np.multiply(out, t, out=out)
        np.add(out, c, out=out)
    return out


def _box_muller(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """Step 3 for contiguous float64 uniforms a, b; writes (ρ·cos θ, ρ·sin θ) rows into out (n, 2).

    Only exact operations are added to the documented ones: bit masks instead of frexp (a is a
    normal double in (0, 1)), multiplication by 1, 0.5 or 2, and sign flips by xor of the sign bit.
    """
    bits = a.view(_U64)
    m = ((bits & _MANTISSA) | _ONE_BITS).view(np.float64)  # m' = 2m in [1, 2), a = m'·2^(E-1023)
    big = m >= _SQRT_TWO  # frexp's m >= sqrt(1/2): keep m = m'/2, e = E - 1022; else m = m', e = E - 1023
    e = ((bits >> _U64(52)).astype(np.int64) - 1023 + big).astype(np.float64)
    m *= 1.0 - 0.5 * big
    s = m - 1.0
    m += 1.0
    s /= m
    t = np.multiply(s, s, out=m)
    p = _horner(_ATANH_COEFFS, t, np.empty_like(s))
    s *= 2.0
    p *= s
    e *= _LN2
    e += p
    e *= -2.0
    rho = np.sqrt(e, out=e)

    x = b * 4.0
    q = np.rint(x)
    x -= q
    x *= _HALF_PI
    t = np.multiply(x, x, out=t)
    sin_x = _horner(_SIN_COEFFS, t, p)
    sin_x *= x
    cos_x = _horner(_COS_COEFFS, t, s)
    quadrant = q.astype(np.int64).view(_U64)
    cb, sb = cos_x.view(_U64), sin_x.view(_U64)
    swap = cb ^ sb
    swap &= _U64(0) - (quadrant & _U64(1))  # odd quadrants exchange cos x and sin x
    cb ^= swap
    sb ^= swap
    cb ^= (((quadrant + _U64(1)) >> _U64(1)) & _U64(1)) << _SIGN_SHIFT  # cos θ < 0 in quadrants 1, 2
    sb ^= ((quadrant >> _U64(1)) & _U64(1)) << _SIGN_SHIFT  # sin θ < 0 in quadrants 2, 3
    np.multiply(rho, cos_x, out=out[:, 0])
    np.multiply(rho, sin_x, out=out[:, 1])


def uniforms(seed: int, count: int) -> np.ndarray:
    """Steps 1-2 of the module's algorithm: `count` float64 uniforms in (0, 1) from `seed`."""
    words = np.random.PCG64(_check_seed(seed)).random_raw(count)
    # ((w >> 12) + 0.5)·2^-52, computed exactly as (1 + (w >> 12)·2^-52) − 1 + 2^-53: the bit pattern
    # of 1.0 with w's top 52 bits as mantissa, then two exact subtractions (Sterbenz) and additions.
    np.right_shift(words, _U64(12), out=words)
    np.bitwise_or(words, _ONE_BITS, out=words)
    u = words.view(np.float64)
    u -= 1.0
    u += _HALF_ULP_OF_ONE
    return u


def check_dim(dim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim < 0:
        raise ValueError(f"dim must be an int >= 0, got {dim!r}")
    return int(dim)


def perturbation(seed: int, dim: int) -> np.ndarray:
    """`dim` float32 standard normals from `seed`, identical on every machine (see module docstring)."""
    seed = _check_seed(seed)
    pairs = (check_dim(dim) + 1) // 2
    u = uniforms(seed, 2 * pairs).reshape(pairs, 2)
    out = np.empty((pairs, 2), dtype=np.float32)
    buf = np.empty((min(_CHUNK_PAIRS, pairs), 2), dtype=np.float64)
    for i in range(0, pairs, _CHUNK_PAIRS):
        j = min(pairs, i + _CHUNK_PAIRS)
        chunk = buf[: j - i]
        _box_muller(np.ascontiguousarray(u[i:j, 0]), np.ascontiguousarray(u[i:j, 1]), chunk)
        out[i:j] = chunk  # the one rounding to float32 of step 4
    return out.reshape(-1)[:dim]


def derive_seeds(seed: int, count: int) -> list[int]:
    """`count` seeds in [0, 2**63) derived from `seed` (the top 63 bits of its PCG64 words)."""
    if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
        raise ValueError(f"count must be an int >= 0, got {count!r}")
    words = np.random.PCG64(_check_seed(seed)).random_raw(int(count))
    return [int(w) for w in words >> np.uint64(1)]


def scale(mu: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(μ, σ) of a version as float32, σ = sqrt(var) rounded once: what `rebuild` takes."""
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


def job_noise(seed: int, dim: int, perturb=perturbation) -> np.ndarray:
    """The signed ε of a job seed: ε(seed), or −ε(s) for seed = mirrored(s). Depends on no μ/var,
    so a scheduler can compute it while the job runs and hand it to `rebuild` later.
    `perturb` computes ε(s); the scheduler passes the compiled `kernels.perturbation` (same bits)."""
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and SEED_LIMIT <= seed < 2 * SEED_LIMIT:
        return np.negative(perturb(int(seed) - SEED_LIMIT, dim))
    return perturb(seed, dim)


class Individual:
    """An ES individual rebuilt from its version's (μ, σ) and its job seed: z = μ + σ·ε, and for an
    antithetic job its mirror μ − σ·ε (else None)."""

    __slots__ = ("z", "mirror", "mean")

    def __init__(self, z: np.ndarray, mirror: np.ndarray | None, mean: np.ndarray | None) -> None:
        self.z, self.mirror, self.mean = z, mirror, mean

    def offset(self, mean_now: np.ndarray) -> np.ndarray:
        """What moves the individual (and its mirror) to the same place around `mean_now` as around the
        μ it was drawn from (float64; pair_shift): mean_now − μ, where the centre of a pair is the
        midpoint of z and its mirror."""
        centre = self.mean if self.mirror is None else 0.5 * (self.z.astype(np.float64) + self.mirror)
        return mean_now.astype(np.float64) - centre


def rebuild(mu: np.ndarray, seed: int, *, var: np.ndarray | None = None, std: np.ndarray | None = None,
            antithetic: bool = False, eps: np.ndarray | None = None, perturb=perturbation) -> Individual:
    """The individual of job `seed` drawn from (μ, var): the only place one is built from a seed.

    A worker passes `var`; the scheduler passes `std` (float32 sqrt(var), from `scale`, cached per
    version) and, when it computed it ahead, `eps` (`job_noise` of the seed). Either way z and the
    mirror are the same bits: μ + σ·ε and μ + σ·(−ε) in float32 (adding −x is subtracting x)."""
    if std is None:
        mu, std = scale(mu, var)
    else:
        mu = np.asarray(mu, dtype=np.float32)
    if eps is None or eps.size != mu.size:
        eps = job_noise(seed, mu.size, perturb)
    eps = eps.reshape(mu.shape)
    mirror = mu + std * np.negative(eps) if antithetic else None
    return Individual(mu + std * eps, mirror, mu)


def sample(mu: np.ndarray, var: np.ndarray, seed: int) -> np.ndarray:
    """z = μ + sqrt(var)·ε(seed) in float32 (`rebuild`'s z).

    A seed s + 2**63 (see `mirrored`) gives μ − sqrt(var)·ε(s) (adding −x is subtracting x, bit
    for bit), so the synchronous CEM loops can hand out antithetic pairs as plain (version, seed) jobs.
    """
    return rebuild(mu, seed, var=var).z


def antithetic_pair(mu: np.ndarray, var: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(μ + sqrt(var)·ε, μ − sqrt(var)·ε) for one ε(seed), in float32."""
    mu32, std = scale(mu, var)
    step = std * perturbation(seed, mu32.size).reshape(mu32.shape)
    return mu32 + step, mu32 - step
