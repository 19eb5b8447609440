"""The algorithm registry is the one place that says what each --algo runs: its entries agree with
RunConfig's fields, aesrl's defaults are RunConfig's declarations, and nothing else names an algorithm."""

from __future__ import annotations

import dataclasses
import math
import subprocess
from pathlib import Path

import pytest

from aesrl_queue.algorithms import ALGOS, PAPER, REGISTRY, algorithm, applies_to, register
from aesrl_queue.config import LEARNER_DEFAULTS, ConfigError, RunConfig, field_docs
from aesrl_queue.optimizers import make_optimizer, needs_critic_daemon, needs_workers, rl_target

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {name for name, *_ in field_docs()}


def test_every_setting_applies_to_some_algorithm_and_every_listed_field_is_a_setting() -> None:
    for spec in REGISTRY.values():
        assert spec.fields <= SETTINGS, (spec.name, spec.fields - SETTINGS)
        assert set(spec.defaults) <= SETTINGS, spec.name
    assert {name for name in SETTINGS if not applies_to(name)} == set()
    assert ALGOS == ("aesrl", "es", "opo", "acemrl", "cemrl", "pcemrl", "td3")


def test_what_runconfig_declares_is_what_aesrl_runs() -> None:
    declared = RunConfig()
    # HalfCheetah's preset is empty: what --algo aesrl runs there is the declarations themselves with its
    # learner's own settings (crossq-sac's networks)
    learner = LEARNER_DEFAULTS[declared.learner]
    assert declared.learner == "crossq-sac" and learner["hidden"] == (256, 256)
    for env in ("HalfCheetah-v5", "Hopper-v5"):
        ran = RunConfig.from_preset(env, algo="aesrl")
        assert dataclasses.replace(ran, env_id=declared.env_id) == dataclasses.replace(declared, **learner)
    assert algorithm("aesrl").defaults == {}
    for name in set(REGISTRY) - {"aesrl"}:  # the others run the paper's values where aesrl departs
        cfg = RunConfig.from_preset("Hopper-v5", algo=name).validate()
        own = {"es_antithetic": True} if name == "es" else {}  # ES alone's pairs (its own default)
        assert {k: getattr(cfg, k) for k in PAPER} == {**PAPER, **own}, name


def test_the_learner_and_executor_of_each_algorithm() -> None:
    assert [n for n, a in REGISTRY.items() if a.learner] == ["aesrl", "opo", "acemrl", "cemrl", "pcemrl", "td3"]
    assert applies_to("critic_lr") == ("aesrl", "opo", "acemrl", "cemrl", "pcemrl", "td3")
    assert [n for n, a in REGISTRY.items() if a.executor == "process"] == ["td3"]
    cfgs = {n: RunConfig.from_preset("Pendulum-v1", algo=n, hidden=(4,)).resolve() for n in ALGOS}
    assert [n for n in ALGOS if needs_workers(cfgs[n])] == list(ALGOS[:-1])
    assert [n for n in ALGOS if needs_critic_daemon(cfgs[n])] == ["aesrl", "opo", "acemrl", "cemrl", "pcemrl"]
    assert [rl_target(cfgs[n]) for n in ALGOS[:-1]] == [0.9, 0.0, 0.5, 0.5, 0.5, 0.5]
    assert math.isnan(rl_target(cfgs["td3"]))
    for name in ALGOS[:-1]:
        opt = make_optimizer(cfgs[name], __import__("numpy").zeros(cfgs[name].actor_dim, dtype="float32"))
        assert type(opt).__name__ == algorithm(name).optimizer.split(":")[1]
    with pytest.raises(ValueError, match="no queue optimizer"):
        make_optimizer(cfgs["td3"], None)


def test_a_switch_of_another_algorithm_is_refused_naming_the_ones_it_applies_to() -> None:
    with pytest.raises(ConfigError, match="^critic_shift: applies to --algo aesrl, not 'es'$"):
        RunConfig.from_preset("Hopper-v5", algo="es", critic_shift=True).validate()
    with pytest.raises(ConfigError, match="^es_antithetic: applies to --algo aesrl and es, not 'opo'$"):
        RunConfig.from_preset("Hopper-v5", algo="opo", es_antithetic=True).validate()


def test_a_config_that_names_td3_start_steps_still_loads() -> None:
    """td3_start_steps and initial_steps were one concept, random actions before learning starts."""
    assert RunConfig.from_dict({"algo": "td3", "initial_steps": 2000, "td3_start_steps": 300}).initial_steps == 300
    assert RunConfig.from_dict({"algo": "aesrl", "initial_steps": 2000, "td3_start_steps": 300}).initial_steps == 2000
    assert RunConfig.from_preset("Pendulum-v1", algo="td3", td3_start_steps=400).initial_steps == 400


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="registered already"):
        register("es", executor="queue", optimizer="x:Y", learner=False, tells="result")


def test_no_code_outside_the_registry_branches_on_an_algorithm_name() -> None:
    """`algo == "..."` / `algo in (...)` outside aesrl_queue/algorithms.py: at most 5 (name checks)."""
    found = subprocess.run(["git", "grep", "-n", "-E", r"algo['\"]?\]?\)? (==|!=|in|not in) ", "--",
                            "aesrl_queue", "workers", "scheduler", "cli", ":!aesrl_queue/algorithms.py"],
                           cwd=ROOT, capture_output=True, text=True)
    if found.returncode == 128:  # not a git checkout
        return
    assert len(found.stdout.splitlines()) <= 5, found.stdout
