"""The algorithm registry: one entry per `--algo`, saying what runs it, with which defaults, and which
settings apply to it. Code elsewhere asks the entry (`algorithm(cfg.algo)`); it does not test the name.

Like gymnasium's `register(id, entry_point, kwargs)`: the optimizer is named by "module:Class" and
imported when a run makes one, so this module imports nothing of the project and config.py can read it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

# Settings every algorithm reads.
COMMON = frozenset({"env_id", "algo", "run_id", "seed", "total_steps", "initial_steps", "hidden", "activation",
                    "mean_eval_episodes", "history_max", "env_kwargs"})
# Settings of the algorithms whose individuals are evaluated by jobs on RQ workers.
QUEUE = frozenset({"var_init", "mean_eval_paired", "job_timeout", "result_ttl", "failure_ttl",
                   "queued_per_worker", "job_deadline"})
# Settings of the algorithms that train a critic (the learner: td3 or crossq) on the replay.
LEARNER = frozenset({"learner", "critic_hidden", "critic_activation", "actor_lr", "critic_lr", "batch_size", "gamma", "tau",
                     "policy_noise", "noise_clip", "replay_capacity"})
# ... and of those among them whose critic is a daemon that RL jobs train against.
CRITIC_DAEMON = frozenset({"rl_steps_max", "critic_chunk", "critic_wait"})
# The AES-RL distribution (aesrl, es) and the P controller's ES/RL mix (aesrl, opo, acemrl).
AESRL_RULES = frozenset({"mean_rule", "var_rule", "r", "negative_ratio", "positive_ratio", "fixed_n", "var_floor",
                         "fitness_shift", "es_antithetic", "pair_shift"})
CONTROLLER = frozenset({"rl_ratio", "rl_gain", "critic_lag"})

# Settings that switch a behaviour on, with the value that leaves it off: RunConfig.validate refuses
# one that is on for an algorithm it does not apply to (a field of another algorithm's config).
SWITCHES: Mapping[str, Any] = MappingProxyType({"fitness_shift": 0, "critic_shift": False, "es_antithetic": False,
                                                "pair_shift": False})

# RunConfig declares aesrl's values. These are the paper's, which every other algorithm runs: TD3, the
# official code's RL job length, no fitness shift, single ES individuals and ρ* 0.5.
PAPER = MappingProxyType({"rl_steps_max": 10_000, "fitness_shift": 0.0, "critic_shift": False, "learner": "td3",
                          "es_antithetic": False, "rl_ratio": 0.5})


@dataclass(frozen=True)
class Algorithm:
    """One `--algo`: what runs it and with which settings."""

    name: str
    executor: str  # "queue": jobs on RQ workers told by scheduler/loop.py; "process": all in the scheduler process
    optimizer: str | None  # "module:Class" of its ask/tell optimizer (queue), None for a process executor
    options: Mapping[str, Any]  # keyword arguments of the optimizer: the distribution, serial dispatch
    defaults: Mapping[str, Any]  # applied over the environment's preset; options given win over both
    fields: frozenset[str]  # the settings that apply (every other one is ignored by this algorithm)
    learner: bool  # trains a critic with TD3 on the replay, so RL individuals can climb its Q
    tells: str  # "result": after every result (asynchronous), "generation", or "step" (td3)
    # the share of RL individuals it aims at: a number, or None for the P controller's rl_ratio
    rl_share: float | None = None
    # the critic trains only the steps the scheduler asks for between generations (state critic_request)
    critic_on_request: bool = False
    summary: str = ""

    def applies(self, name: str) -> bool:
        return name in self.fields


REGISTRY: dict[str, Algorithm] = {}


def register(name: str, *, executor: str, optimizer: str | None = None, options: Mapping[str, Any] | None = None,
             defaults: Mapping[str, Any] | None = None, fields: frozenset[str] = frozenset(), learner: bool,
             tells: str, rl_share: float | None = None, critic_on_request: bool = False, summary: str = "") -> Algorithm:
    """Add an algorithm. `fields` are its own settings beside COMMON, QUEUE (executor "queue") and
    LEARNER (learner); `defaults` start from the paper's values (PAPER) unless it is aesrl."""
    if name in REGISTRY:
        raise ValueError(f"algorithm {name!r} is registered already")
    if executor not in ("queue", "process") or (executor == "queue") != (optimizer is not None):
        raise ValueError(f"{name}: a queue algorithm names its optimizer, a process one none")
    own = COMMON | fields | (QUEUE if executor == "queue" else frozenset()) | (LEARNER if learner else frozenset())
    base = {} if name == "aesrl" else dict(PAPER)
    entry = Algorithm(name=name, executor=executor, optimizer=optimizer, options=MappingProxyType(dict(options or {})),
                      defaults=MappingProxyType({**base, **(defaults or {})}), fields=frozenset(own),
                      learner=learner, tells=tells, rl_share=rl_share, critic_on_request=critic_on_request,
                      summary=summary)
    REGISTRY[name] = entry
    return entry


def algorithm(name: str) -> Algorithm:
    """The entry of `name`; KeyError naming the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {name!r}; known: {', '.join(REGISTRY)}") from None


def names(**where: Any) -> tuple[str, ...]:
    """The registered names, in registration order, whose entries have the given attribute values."""
    return tuple(n for n, a in REGISTRY.items() if all(getattr(a, k) == v for k, v in where.items()))


def applies_to(field_name: str) -> tuple[str, ...]:
    """The algorithms a setting applies to."""
    return tuple(n for n, a in REGISTRY.items() if a.applies(field_name))


def uses_critic(name: str) -> bool:
    """Whether algorithm `name` trains a critic (False for a name this version does not know)."""
    return name in REGISTRY and REGISTRY[name].learner


_AESRL_OPTIMIZER = "aesrl_queue.optimizers.aesrl:AesrlOptimizer"
_CEM_OPTIMIZER = "aesrl_queue.optimizers.cem:CemOptimizer"

register("aesrl", executor="queue", optimizer=_AESRL_OPTIMIZER, options={"distribution": "aesrl"},
         fields=AESRL_RULES | CONTROLLER | CRITIC_DAEMON | {"critic_shift", "expl_noise"}, learner=True, tells="result",
         # aesrl's defaults are RunConfig's declarations; docs/decisions.md has the evidence of each
         summary="AES-RL: the paper's asynchronous ES + RL, with crossq-sac and this project's departures")
register("es", executor="queue", optimizer=_AESRL_OPTIMIZER, options={"distribution": "aesrl"},
         fields=AESRL_RULES, learner=False, tells="result", rl_share=0.0,
         # a fixed σ of 0.1, the fixed-linear rule, antithetic pairs told as offsets, a quarter step:
         # ES alone (docs/decisions.md, "es")
         defaults={"var_init": 1e-2, "var_floor": 1e-2, "mean_rule": "fixed-linear", "es_antithetic": True,
                   "positive_ratio": 0.25, "pair_shift": True},
         summary="the AES-RL distribution without RL individuals")
# opo and acemrl's RL jobs train against the critic, which trails the replay by at most 5 000 steps (aesrl's
# 1 000 counts from the end of the random phase, where its daemon trains an actor of its own)
LAG_5000 = {"critic_lag": 5000}
register("opo", executor="queue", optimizer=_AESRL_OPTIMIZER, options={"distribution": "opo"},
         fields=CONTROLLER | CRITIC_DAEMON | {"var_floor"}, learner=True, tells="result", defaults=LAG_5000,
         summary="(1+1)-ES with the 1/5 success rule, with RL individuals")
register("acemrl", executor="queue", optimizer=_AESRL_OPTIMIZER, options={"distribution": "acem"},
         fields=CONTROLLER | CRITIC_DAEMON, learner=True, tells="result", defaults=LAG_5000,
         summary="asynchronous CEM-RL: a window of single individuals")
# The CEM-RL baselines and td3 take their official code's configs (KyunghyunLee/aes-rl).
register("cemrl", executor="queue", optimizer=_CEM_OPTIMIZER, options={"serial": True},
         fields=CRITIC_DAEMON | {"population"}, learner=True, tells="generation", rl_share=0.5,
         critic_on_request=True, defaults={"batch_size": 100, "replay_capacity": 1_000_000},
         summary="CEM-RL: one member at a time, the critic trained between members")
register("pcemrl", executor="queue", optimizer=_CEM_OPTIMIZER, options={"serial": False},
         fields=CRITIC_DAEMON | {"population", "parallel_critic"}, learner=True, tells="generation", rl_share=0.5,
         critic_on_request=True, defaults={"batch_size": 256, "replay_capacity": 1_000_000},
         summary="P-CEM-RL: a generation at once, the critic trained before it (or while it runs)")
register("td3", executor="process", learner=True, tells="step", rl_share=math.nan,
         fields=frozenset({"expl_noise", "td3_eval_every"}),
         defaults={"hidden": (256, 256), "critic_hidden": (256, 256), "actor_lr": 3e-4, "critic_lr": 3e-4,
                   "batch_size": 256, "replay_capacity": 1_000_000, "mean_eval_episodes": 5,
                   "initial_steps": 10_000},
         summary="TD3 in the scheduler process (scheduler/td3_baseline.py)")

ALGOS = tuple(REGISTRY)
