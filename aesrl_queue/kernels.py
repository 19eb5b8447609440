"""Fused loops for the scheduler's per-result update, compiled with numba when it is installed.

The AES-RL step (docs/algorithms.md) written as numpy expressions makes about twenty passes over
vectors of the actor's size; at 129k parameters that is ~1.5 ms per result inside the scheduler,
where other work has pushed the arrays out of cache between results. One compiled loop reads
μ, var and z once and writes μ', var' and σ' = sqrt(var') once: ~0.2 ms.

The compiled loop computes exactly what `distributions._aesrl_step` computes (the reference,
also the fallback when numba is missing or AESRL_NO_NUMBA=1): the same float64 operations in the
same order, each rounded the same way, with no fused multiply-add (numba emits none without
fastmath). tests/test_kernels.py compares the two bit for bit.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from typing import Any, NamedTuple

import numpy as np

from aesrl_queue import noise

log = logging.getLogger(__name__)

ENV_DISABLE = "AESRL_NO_NUMBA"

OK, BAD_INPUT, NOT_FINITE = 0, 1, 2


class Kernels(NamedTuple):
    step: Any  # the AES-RL step
    distance: Any  # ||a − b||₂, a statistic for the history
    box_muller: Any  # step 3-4 of noise.perturbation


class StepOut(NamedTuple):
    mean: np.ndarray  # μ' (float32, new array)
    var: np.ndarray  # var' (float32, new array; var itself when the variance step is skipped)
    std: np.ndarray  # sqrt(var') in float32, as noise.scale computes it
    changed: bool  # μ' != μ or var' != var anywhere
    moved: float  # ||μ' − μ||₂


_lock = threading.Lock()
_compiled: Any = None  # None: not tried yet; False: unavailable


def _build(cache: bool = True) -> Any:
    import numba  # noqa: PLC0415 (a second or so at first use, only in processes that tell)

    # No early exit and no floating-point sum in this loop: either would keep LLVM from
    # vectorising it (a strict float sum cannot be reordered), ~7x slower. Problems are OR-ed
    # into flags and reported after the loop; the outputs are fresh arrays, thrown away then.
    @numba.njit(cache=cache, nogil=True, error_model="numpy")
    def aesrl_step(mu, var, z, p, n, floor, clip, mean_out, var_out, std_out):  # pragma: no cover (compiled)
        q = 1.0 - p
        f32_floor = np.float32(floor)
        changed = False
        bad_z = False
        bad_out = False
        for i in range(mu.shape[0]):
            zi = np.float64(z[i])
            m = np.float64(mu[i])
            t = m * q
            t = t + zi * p
            if clip:
                lo = min(m, zi)
                hi = max(m, zi)
                t = min(max(t, lo), hi)
            m32 = np.float32(t)
            mean_out[i] = m32
            v32 = var[i]
            if n > 0:
                v = np.float64(v32)
                w = (zi - m) * (zi - np.float64(m32))
                w = w - v
                w = w / n
                w = w + v
                w32 = np.float32(w)
                bad_out |= not np.isfinite(w32)  # before the floor: max() need not keep a NaN
                v32 = max(w32, f32_floor)
                var_out[i] = v32
            std_out[i] = np.sqrt(v32)
            bad_z |= not np.isfinite(zi)
            bad_out |= not np.isfinite(m32)
            changed |= (m32 != mu[i]) or (v32 != var[i])
        if bad_z:
            return BAD_INPUT, False
        if bad_out:
            return NOT_FINITE, False
        return OK, changed

    # A statistic for the history, not part of the update: summed in any order.
    @numba.njit(cache=cache, nogil=True, fastmath=True)
    def distance(a, b):  # pragma: no cover (compiled)
        s = 0.0
        for i in range(a.shape[0]):
            d = np.float64(a[i]) - np.float64(b[i])
            s += d * d
        return np.sqrt(s)

    sqrt_two, ln2, half_pi = 2 * noise._SQRT_HALF, noise._LN2, noise._HALF_PI
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11 = noise._ATANH_COEFFS
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9 = noise._SIN_COEFFS
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9 = noise._COS_COEFFS
    two52 = 2.0**52
    mantissa, one_bits, sign = np.uint64(0x000FFFFFFFFFFFFF), np.uint64(0x3FF0000000000000), np.uint64(1 << 63)

    # Steps 3-4 of the algorithm in noise.py's docstring, as the numpy version computes them (bit masks
    # for frexp, the polynomials in Horner form, sign flips by the sign bit): one IEEE rounding per
    # operation and no fused multiply-add (numba emits none without fastmath). No branch and no call
    # in the loop, so LLVM vectorises it: ~0.5 ms for 129k values, against ~2 ms for the same
    # arithmetic written with frexp and a branch per quadrant. tests/test_kernels.py checks the
    # outputs bit for bit against the numpy version.
    @numba.njit(cache=cache, nogil=True, error_model="numpy")
    def pairs(u, out):  # pragma: no cover (compiled); all in one loop body: a helper call stops LLVM
        for j in range(out.shape[0] // 2):
            a = u[2 * j]
            b = u[2 * j + 1]
            bits = np.float64(a).view(np.uint64)
            m = np.uint64((bits & mantissa) | one_bits).view(np.float64)  # m' = 2m in [1, 2)
            big = m >= sqrt_two  # frexp's m >= sqrt(1/2): m = m'/2, e = E - 1022; else m = m', e = E - 1023
            e = np.float64(np.int64(bits >> np.uint64(52)) - 1023 + np.int64(big))
            m = m * (1.0 - 0.5 * np.float64(big))
            s = (m - 1.0) / (m + 1.0)
            t = s * s
            p = ((((((((((a11 * t + a10) * t + a9) * t + a8) * t + a7) * t + a6) * t + a5) * t + a4) * t + a3) * t
                  + a2) * t + a1) * t + a0
            rho = np.sqrt((e * ln2 + p * (s * 2.0)) * -2.0)
            x = b * 4.0
            q = (x + two52) - two52  # round half to even: np.rint exactly, for x in [0, 4]
            x = (x - q) * half_pi
            t = x * x
            sn = (((((((((s9 * t + s8) * t + s7) * t + s6) * t + s5) * t + s4) * t + s3) * t + s2) * t + s1) * t
                  + s0) * x
            cs = ((((((((c9 * t + c8) * t + c7) * t + c6) * t + c5) * t + c4) * t + c3) * t + c2) * t + c1) * t + c0
            quadrant = np.uint64(np.int64(q))
            odd = (quadrant & np.uint64(1)) != np.uint64(0)
            c_th = sn if odd else cs  # odd quadrants exchange cos x and sin x
            s_th = cs if odd else sn
            c_bits = np.float64(c_th).view(np.uint64) ^ (((quadrant + np.uint64(1)) >> np.uint64(1)) & np.uint64(1)) * sign
            s_bits = np.float64(s_th).view(np.uint64) ^ ((quadrant >> np.uint64(1)) & np.uint64(1)) * sign
            out[2 * j] = np.float32(rho * np.uint64(c_bits).view(np.float64))
            out[2 * j + 1] = np.float32(rho * np.uint64(s_bits).view(np.float64))

    @numba.njit(cache=cache, nogil=True, error_model="numpy")
    def box_muller(u, out):  # pragma: no cover (compiled)
        dim = out.shape[0]
        pairs(u, out[: dim - dim % 2])
        if dim % 2 == 1:  # the last pair's first value
            last = np.empty(2, np.float32)
            pairs(u[dim - 1: dim + 1], last)
            out[dim - 1] = last[0]

    return Kernels(aesrl_step, distance, box_muller)


def compiled() -> Kernels | None:
    """The compiled kernels, or None when numba is missing, disabled or fails to compile."""
    global _compiled
    if _compiled is None:
        with _lock:
            if _compiled is None:
                if os.environ.get(ENV_DISABLE, "").strip() not in ("", "0"):
                    _compiled = False
                else:
                    _compiled = False
                    for cache in (True, False):  # no writable cache folder: compile in memory
                        try:
                            fns = _build(cache)
                            with warnings.catch_warnings():  # a read-only cache folder is not an error
                                warnings.simplefilter("ignore")
                                _warm(fns)
                            _compiled = fns
                            break
                        except ImportError as exc:
                            log.info("numba is not installed (%s); the scheduler uses the numpy update", exc)
                            break
                        except Exception as exc:  # a numba that cannot compile (or cache) here
                            log.warning("numba failed (cache=%s): %s", cache, exc)
    return _compiled or None


def _warm(fns: Kernels) -> None:
    a = np.zeros(2, np.float32)
    fns.step(a, a + 1, a, 0.5, 2.0, 0.0, True, np.empty(2, np.float32), np.empty(2, np.float32),
             np.empty(2, np.float32))
    fns.distance(a, a)
    fns.box_muller(noise.uniforms(1, 2), np.empty(2, np.float32))


def perturbation(seed: int, dim: int, fn: Kernels | None = None) -> np.ndarray:
    """`noise.perturbation(seed, dim)`, the same bits, with the compiled Box-Muller when there is one.

    For the scheduler (workers keep the numpy version and never load numba)."""
    fns = fn or compiled()
    if fns is None:
        return noise.perturbation(seed, dim)
    dim = noise.check_dim(dim)
    pairs = (dim + 1) // 2
    out = np.empty(dim, dtype=np.float32)
    fns.box_muller(noise.uniforms(seed, 2 * pairs), out)
    return out


def aesrl_step(mu: np.ndarray, var: np.ndarray, z: np.ndarray, p: float, n: float, floor: float,
               fn: Any = None) -> StepOut | None:
    """The AES-RL step in one pass, or None when there is no compiled loop (use the numpy one).

    `mu`, `var`, `z` must be contiguous float32 vectors of one length. Raises ValueError when z is
    not finite or the result would not be finite; nothing is changed in that case."""
    fns = fn or compiled()
    if fns is None:
        return None
    step, distance = fns.step, fns.distance
    mean_out = np.empty_like(mu)
    var_out = np.empty_like(var) if n > 0 else var
    std_out = np.empty_like(var)
    status, changed = step(mu, var, z, float(p), float(n), float(floor), bool(0.0 <= p <= 1.0),
                           mean_out, var_out, std_out)
    if status == BAD_INPUT:
        raise ValueError("z must be finite (and within float32 range)")
    if status == NOT_FINITE:
        raise ValueError("aesrl: the update would make the mean or the variance non-finite")
    return StepOut(mean_out, var_out, std_out, bool(changed), float(distance(mean_out, mu)))


def plain_vector(value: Any, dim: int) -> np.ndarray | None:
    """`value` itself when it is already a contiguous float32 vector of length `dim`, else None."""
    if (isinstance(value, np.ndarray) and value.dtype == np.float32 and value.shape == (dim,)
            and value.flags.c_contiguous):
        return value
    return None
