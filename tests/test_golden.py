"""Default behaviour is pinned: every algorithm's optimizer, the TD3 agent and the worker's job function
give, bit for bit, what tests/data/golden.json recorded (tests/golden.py says how it is made)."""

from __future__ import annotations

import json

import pytest

from tests import golden

RECORDED = json.loads(golden.DATA.read_text())


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
    assert golden.td3_trace() == RECORDED["td3"]


def test_worker_jobs_match_the_recorded_ones(client) -> None:
    got = golden.worker_traces(client)
    assert set(got) == set(RECORDED["worker"])
    for name, want in RECORDED["worker"].items():
        assert got[name] == want, f"worker job {name}: {got[name]} != {want}"
