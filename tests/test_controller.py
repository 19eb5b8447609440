"""The P controller that mixes RL and ES jobs: exact probabilities, initial phase, long-run share.
No RNG inside the controller: the tests feed it uniform draws.
"""

from __future__ import annotations

import numpy as np
import pytest

from aesrl_queue.controller import RLController, rl_probability


@pytest.mark.parametrize(
    ("n_rl", "n_es", "target", "gain", "p"),
    [
        (1, 1, 0.5, 50.0, 0.5),
        (1, 1, 0.1, 50.0, 0.0),  # 0.5 − 50·0.4 < 0
        (10, 90, 0.1, 50.0, 0.5),  # on target
        (11, 89, 0.1, 50.0, 0.0),  # 1 % above target: 0.5 − 0.5
        (49, 51, 0.5, 50.0, 1.0),  # 1 % below target: 0.5 + 0.5
        (3, 1, 0.5, 0.0, 0.5),  # no gain: a coin flip
        (99, 101, 0.5, 10.0, 0.55),  # 0.5 − 10·(0.495 − 0.5)
    ],
)
def test_rl_probability(n_rl: int, n_es: int, target: float, gain: float, p: float) -> None:
    assert rl_probability(n_rl, n_es, target, gain) == pytest.approx(p, abs=1e-12)


def test_rl_probability_target_zero_means_no_rl() -> None:
    # The bare formula would give 0.5 − 50/1001 > 0 here.
    assert rl_probability(1, 1000, 0.0) == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target": -0.1},
        {"target": 1.1},
        {"target": float("nan")},
        {"gain": -1.0},
        {"gain": float("inf")},
        {"n_rl": -1},
        {"n_rl": 0, "n_es": 0},
        {"n_es": 1.5},
    ],
)
def test_rl_probability_validation(kwargs: dict) -> None:
    args = {"n_rl": 1, "n_es": 1, "target": 0.5, "gain": 50.0} | kwargs
    with pytest.raises(ValueError):
        rl_probability(**args)


def test_controller_validation() -> None:
    with pytest.raises(ValueError, match="target"):
        RLController(target=2.0)
    with pytest.raises(ValueError, match="gain"):
        RLController(gain=-3.0)
    controller = RLController(initial_steps=0)
    for u in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match="u must be"):
            controller.choose(5, u)
    with pytest.raises(ValueError, match="stored_steps"):
        controller.choose(-1, 0.5)


def test_no_rl_during_initial_phase_and_nothing_counted() -> None:
    controller = RLController(target=0.5, initial_steps=10_000)
    assert all(controller.choose(steps, 0.0) == "es" for steps in range(0, 10_000, 7))
    assert controller.state() == {"n_rl": 1, "n_es": 1}
    assert controller.choose(10_000, 0.0) == "rl"  # p = 0.5 at 1/1
    assert controller.state() == {"n_rl": 2, "n_es": 1}


def test_dispatches_are_counted() -> None:
    controller = RLController(target=0.5, initial_steps=0)
    assert controller.choose(0, 0.9) == "es"  # u > p = 0.5
    assert controller.state() == {"n_rl": 1, "n_es": 2}
    assert controller.probability() == 1.0  # share 1/3 is far below 0.5
    assert controller.choose(0, 0.999) == "rl"


def test_target_zero_never_rl() -> None:
    controller = RLController(target=0.0, initial_steps=0)
    assert all(controller.choose(10**6, u) == "es" for u in np.linspace(0.0, 0.999, 5000))
    assert controller.n_rl == 1


@pytest.mark.parametrize("target", [0.5, 0.1])
def test_rl_share_converges_to_target(target: float) -> None:
    rng = np.random.default_rng(1234)
    controller = RLController(target=target, initial_steps=0)
    for u in rng.random(20_000):
        controller.choose(50_000, float(u))
    share = controller.n_rl / (controller.n_rl + controller.n_es)
    assert share == pytest.approx(target, abs=0.01)


def test_state_round_trip() -> None:
    rng = np.random.default_rng(7)
    first = RLController(target=0.3, initial_steps=0)
    for u in rng.random(100):
        first.choose(1, float(u))
    second = RLController(target=0.3, initial_steps=0)
    second.load_state(first.state())
    draws = rng.random(100)
    assert [first.choose(1, float(u)) for u in draws] == [second.choose(1, float(u)) for u in draws]
    with pytest.raises(ValueError):
        second.load_state({"n_rl": -1, "n_es": 3})
    with pytest.raises(ValueError):
        second.load_state({"n_rl": 2})
