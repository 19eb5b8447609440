"""The compiled AES-RL step gives the bits of the numpy reference, and the scheduler really uses it."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from aesrl_queue import kernels
from aesrl_queue.distributions import AesrlDistribution, _aesrl_step

CASES = [(0.5, 2.0), (0.01, 101.0), (1.0, 0.0), (-0.3, 10.0), (0.999, 1.001), (1.7, 5.0), (0.25, 1e6), (0.0001, 0.5)]


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def test_numba_is_there_and_compiles() -> None:
    """numba is a dependency: without it the scheduler falls back to a ~7x slower update, silently."""
    assert kernels.compiled() is not None


@pytest.mark.parametrize("dim", [1, 7, 4096, 129306])
def test_kernel_matches_the_numpy_reference_bit_for_bit(dim: int) -> None:
    rng = np.random.default_rng(dim)
    for p, n in CASES:
        mu = rng.standard_normal(dim).astype(np.float32)
        var = (rng.random(dim) * 1e-2 + 1e-9).astype(np.float32)
        var[::3] = 1e-12  # below the floor after the step: the floor must apply the same way
        z = (mu + rng.standard_normal(dim) * 0.1).astype(np.float32)
        z[::5] = mu[::5]  # z = μ on some coordinates: nothing moves there
        ref_mean, ref_var = _aesrl_step(mu, var, z, p, n, 1e-8)
        out = kernels.aesrl_step(mu, var, z, p, n, 1e-8)
        assert np.array_equal(bits(out.mean), bits(ref_mean)), (dim, p, n)
        assert np.array_equal(bits(out.var), bits(ref_var)), (dim, p, n)
        assert np.array_equal(bits(out.std), bits(np.sqrt(ref_var))), (dim, p, n)
        changed = not (np.array_equal(ref_mean, mu) and np.array_equal(ref_var, var))
        assert out.changed == changed
        assert out.moved == pytest.approx(float(np.linalg.norm(ref_mean.astype(np.float64) - mu)), rel=1e-9, abs=1e-12)
        assert out.mean is not mu and (out.var is not var or n <= 0)


def test_kernel_reports_no_change_when_nothing_moves() -> None:
    mu = np.linspace(-1, 1, 100).astype(np.float32)
    var = np.full(100, 1e-3, np.float32)
    out = kernels.aesrl_step(mu, var, mu.copy(), 0.5, 0.0, 1e-8)
    assert not out.changed and out.moved == 0.0


@pytest.mark.parametrize("where", [0, 57, 99])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_kernel_rejects_a_non_finite_z(where: int, bad: float) -> None:
    mu = np.zeros(100, np.float32)
    var = np.full(100, 1e-3, np.float32)
    z = np.ones(100, np.float32)
    z[where] = bad
    with pytest.raises(ValueError, match="z must be finite"):
        kernels.aesrl_step(mu, var, z, 0.5, 2.0, 1e-8)


def test_kernel_rejects_an_overflowing_update() -> None:
    mu = np.full(10, 3e38, np.float32)
    var = np.full(10, 1e-3, np.float32)
    z = np.full(10, -3e38, np.float32)
    with pytest.raises(ValueError, match="non-finite"):
        kernels.aesrl_step(mu, var, z, -1.0, 2.0, 1e-8)  # μ' = 2μ − z overflows float32
    with pytest.raises(ValueError, match="non-finite"):
        kernels.aesrl_step(np.zeros(10, np.float32), var, z, 0.5, 1e-300, 1e-8)  # var' overflows


def run_tells(dist: AesrlDistribution, seed: int) -> list[tuple]:
    rng = np.random.default_rng(seed)
    log = []
    for i in range(60):
        z = dist.mean + rng.standard_normal(dist.dim).astype(np.float32) * np.sqrt(dist.var)
        if i % 7 == 3:
            z = z.astype(np.float64)  # not a plain float32 vector: the checked-copy path
        if i % 11 == 5:
            z = np.asarray(z)[::-1].copy()[::-1]  # a copy, same values
        f_z = float(rng.normal(0.0, 1.0))
        try:
            p = dist.tell(z, f_z, 0.0)
        except ValueError as exc:
            p = str(exc)
        log.append((p, dist.version, bits(dist.mean).tobytes(), bits(dist.var).tobytes()))
    bad = dist.mean.copy()
    bad[3] = np.nan
    for f_z in (-5.0, 5.0):  # p = 0 and p > 0: both must reject a non-finite z
        with pytest.raises(ValueError):
            dist.tell(bad, f_z, 0.0)
    log.append((dist.version, bits(dist.mean).tobytes()))
    return log


@pytest.mark.parametrize("rules", [("baseline-relative", "adaptive"), ("fixed-sigmoid", "fixed"), ("baseline-absolute", "adaptive")])
def test_distribution_tells_the_same_with_and_without_numba(monkeypatch, rules) -> None:
    mu0 = np.random.default_rng(1).standard_normal(3000).astype(np.float32)

    def make() -> AesrlDistribution:
        return AesrlDistribution(mu0, mean_rule=rules[0], var_rule=rules[1], r=1.0, var_init=1e-2)

    fast = make()
    with_kernel = run_tells(fast, 5)
    _p, step = make().tell_step(mu0 + 0.1, 1.0, 0.0)
    assert step is None or isinstance(step, kernels.StepOut)
    monkeypatch.setattr(kernels, "_compiled", False)
    slow = make()
    assert run_tells(slow, 5) == with_kernel
    assert make().tell_step(mu0 + 0.1, 1.0, 0.0)[1] is None


def test_environment_switch_turns_the_kernel_off() -> None:
    env = dict(os.environ, AESRL_NO_NUMBA="1")
    out = subprocess.run([sys.executable, "-c", "from aesrl_queue import kernels; print(kernels.compiled())"],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "None"


@pytest.mark.parametrize("dim", [0, 1, 2, 3, 113, 4096, 32769, 129306])
def test_compiled_noise_matches_the_numpy_noise_bit_for_bit(dim: int) -> None:
    """The scheduler rebuilds ES individuals with the compiled Box-Muller, workers with numpy: one ε."""
    from aesrl_queue import noise

    seeds = [0, 1, 2**31 - 1, 2**62 + 12345, 2**63 - 1, *range(7, 7000, 997)]
    for seed in seeds:
        ref = noise.perturbation(seed, dim)
        got = kernels.perturbation(seed, dim)
        assert got.dtype == np.float32 and got.shape == (dim,)
        assert np.array_equal(bits(got), bits(ref)), (seed, dim)
    mirrored = noise.mirrored(seeds[3])
    assert np.array_equal(bits(noise.job_noise(mirrored, dim, kernels.perturbation)), bits(noise.job_noise(mirrored, dim)))


def test_compiled_noise_covers_every_quadrant_and_both_log_branches() -> None:
    """Uniforms that hit each quadrant of θ (and q = 4) and both sides of the frexp test, exactly."""
    k = kernels.compiled()
    a = np.array([2.0**-53, 0.7071067811865476 / 2, 0.70710678118654757, 0.5, 0.9999999999999999, 0.25, 0.3, 0.8])
    b = np.array([0.0625, 0.125, 0.3, 0.375, 0.5, 0.625, 0.875, 0.99999999])
    u = np.empty(2 * a.size)
    u[0::2], u[1::2] = a, b
    out = np.empty(2 * a.size, np.float32)
    k.box_muller(u, out)
    ref = np.empty((a.size, 2))
    from aesrl_queue import noise

    noise._box_muller(a.copy(), b.copy(), ref)
    assert np.array_equal(bits(out), bits(ref.astype(np.float32).reshape(-1)))


def test_compiled_noise_rejects_what_the_numpy_noise_rejects() -> None:
    for seed, dim in ((-1, 4), (2**64, 4), (1.5, 4), (True, 4), (3, -1), (3, 2.0)):
        with pytest.raises(ValueError):
            kernels.perturbation(seed, dim)
