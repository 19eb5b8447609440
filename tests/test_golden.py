"""Default behaviour is pinned: every algorithm's optimizer, the TD3 agent and the worker's job function
give what tests/data/golden.json recorded (tests/golden.py says how it is made): bit for bit, except
what torch computes, which is compared to within float32 rounding (MKL rounds differently on Intel and
AMD processors)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests import golden

RECORDED = json.loads(golden.DATA.read_text())
# Float32 rounding carried through a dozen training steps moves these numbers by ~1.3e-7 of their value
# (measured with torch's kernels for other processors: ATEN_CPU_CAPABILITY, MKL_CBWR), and OpenBLAS's
# kernels (OPENBLAS_CORETYPE) move a 200-step Pendulum return by ~1e-9 of it. Changes of behaviour move
# them by more: policy_noise +1 % the TD3 loss by 3e-5, gamma +0.01 % by 1.5e-6; tau +1 % (3e-7) is
# within what rounding across processors can do, so this cannot see it.
RTOL, ATOL = 1e-6, 1e-7


def close(got, want) -> bool:
    """Equal, with floats and fingerprints (lists of floats) to within RTOL/ATOL."""
    if isinstance(want, dict):
        return isinstance(got, dict) and set(got) == set(want) and all(close(got[k], w) for k, w in want.items())
    if isinstance(want, list):
        return (isinstance(got, list) and len(got) == len(want)
                and all(close(g, w) for g, w in zip(got, want, strict=True)))
    if isinstance(want, float) and isinstance(got, float):
        return math.isclose(got, want, rel_tol=RTOL, abs_tol=ATOL)
    return got == want


@pytest.mark.parametrize("algo", golden.QUEUE_ALGOS)
def test_optimizer_trace_matches_the_recorded_one(algo) -> None:
    got = golden.optimizer_trace(algo)
    want = RECORDED["optimizers"][algo]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"{algo}: result {i} differs: {g} != {w}"
    assert want[-1]["version"] > 0  # the trace moves μ, so it pins the update rule


def test_aesrl_trace_with_a_survival_bonus_matches_the_recorded_one() -> None:
    assert golden.optimizer_trace("aesrl", env=golden.HOPPER) == RECORDED["hopper"]["aesrl"]


def test_td3_trace_matches_the_recorded_one() -> None:
    got = golden.td3_trace()
    assert close(got, RECORDED["td3"]), f"{got} != {RECORDED['td3']}"
    assert not close(got[1:], RECORDED["td3"][:-1])  # the trace moves: a stuck agent would not match it


def test_worker_jobs_match_the_recorded_ones(client) -> None:
    got = golden.worker_traces(client)
    assert set(got) == set(RECORDED["worker"])
    for name, want in RECORDED["worker"].items():
        # what a matrix product computed (the returns, f(μ), a played episode, torch's training) to
        # within rounding; the lengths, counts and versions, and a random episode's digest, exactly
        exact = {k: v for k, v in want.items() if not isinstance(v, float | list)}
        assert {k: got[name].get(k) for k in exact} == exact, f"worker job {name}: {got[name]} != {want}"
        assert close(got[name], want), f"worker job {name}: {got[name]} != {want}"
    assert isinstance(RECORDED["worker"]["random"]["transitions"], str)  # random actions: compared bit for bit


def test_a_run_without_a_critic_stores_no_transitions_and_computes_the_same(client) -> None:
    """The es job of the worker traces, run as its run runs it: the recorded result, its steps counted,
    and nothing stored in the replay (nothing would read it)."""
    import workers.jobs
    from aesrl_queue.store import Store

    cfg = golden.config("es", run_id="golden-w-es-plain")
    store = Store(client, cfg.run_id)
    store.write_config(cfg)
    dim = cfg.actor_dim
    store.publish_dist(0, np.linspace(-0.4, 0.4, dim, dtype=np.float32), np.full(dim, 1e-2, dtype=np.float32))
    store.set_state(version=0)
    job = f"{cfg.run_id}-j1"
    store.add_inflight(job, {"kind": "es", "version": 0, "seed": 1234, "n": 1})
    workers.jobs._CONTEXTS.clear()
    workers.jobs.evaluate(cfg.run_id, job, "es", 0, 1234, cfg.spec_hash, client=client)
    (_, res), = client.xrange(store.key("results"))
    want = RECORDED["worker"]["es-antithetic"]
    assert close(float(res[b"fitness"]), want["fitness"]) and close(float(res[b"mirror_fitness"]), want["mirror_fitness"])
    assert client.xlen(store.key("replay")) == 0
    assert store.state()["steps"] == want["len"] + want["mirror_len"] == int(res[b"steps"])


def test_worker_jobs_match_under_another_blas_kernel() -> None:
    """The worker traces hold on another OpenBLAS kernel too (OPENBLAS_CORETYPE, which some machines
    set): its episodes differ from the default kernel's in the ninth digit."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OPENBLAS_CORETYPE": "Prescott", "OPENBLAS_L2_SIZE": "512"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"{__file__}::test_worker_jobs_match_the_recorded_ones"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
