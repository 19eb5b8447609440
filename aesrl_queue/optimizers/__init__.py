"""One ask/tell optimizer per queue algorithm (pycma/Nevergrad style): `make_optimizer(cfg, mu0)` or
`load_optimizer(cfg, state)`. They own every number of their algorithm; the scheduler loop moves bytes.
Which optimizer an algorithm uses, with which options, is its entry in aesrl_queue/algorithms.py:

    aesrl, es, opo, acemrl  -> aesrl.AesrlOptimizer  (asynchronous: tell after every result)
    cemrl, pcemrl           -> cem.CemOptimizer      (synchronous: tell once per generation)
    td3                     -> no optimizer: scheduler/td3_baseline.py trains in one process
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from aesrl_queue.algorithms import algorithm, names
from aesrl_queue.config import RunConfig
from aesrl_queue.optimizers.aesrl import AesrlOptimizer, uses_rl
from aesrl_queue.optimizers.base import (
    Fitness,
    Individual,
    JobSpec,
    OptimizerFailed,
    Reference,
    Update,
    generation_seed,
    job_id,
    job_seed,
)
from aesrl_queue.optimizers.cem import CemOptimizer

ASYNC_ALGOS = names(executor="queue", tells="result")
SYNC_ALGOS = names(executor="queue", tells="generation")
QUEUE_ALGOS = names(executor="queue")  # the algorithms that evaluate on RQ workers

Optimizer = AesrlOptimizer | CemOptimizer


def make_optimizer(cfg: RunConfig, mu0: np.ndarray) -> Optimizer:
    """A new optimizer for `cfg.algo` (its registry entry names it), centred on the initial actor parameters `mu0`."""
    spec = algorithm(cfg.algo)
    if spec.optimizer is None:
        raise ValueError(f"algo {cfg.algo!r} has no queue optimizer; use one of {', '.join(QUEUE_ALGOS)}")
    module, _, cls = spec.optimizer.partition(":")
    return getattr(importlib.import_module(module), cls)(cfg, mu0)


def load_optimizer(cfg: RunConfig, state: dict[str, Any]) -> Optimizer:
    """An optimizer restored from `state()` plus "mean" and "var" (the arrays of its version)."""
    return make_optimizer(cfg, state["mean"]).load_state(state)


def rl_target(cfg: RunConfig) -> float:
    """The RL share an algorithm aims at: ρ* of the P controller, half of each CEM generation, none
    for es; td3 has no ES/RL split (NaN)."""
    share = algorithm(cfg.algo).rl_share
    return float(cfg.rl_ratio) if share is None else share


def needs_workers(cfg: RunConfig) -> bool:
    """Whether a run evaluates on RQ workers (td3 runs in the scheduler process)."""
    return algorithm(cfg.algo).executor == "queue"


def needs_critic_daemon(cfg: RunConfig) -> bool:
    """Whether a run needs `aesrl-queue critic start`: never for td3 and es, always for the CEM-RL loops."""
    spec = algorithm(cfg.algo)
    return spec.executor == "queue" and spec.learner and (spec.rl_share is not None or uses_rl(cfg))


__all__ = ["ASYNC_ALGOS", "QUEUE_ALGOS", "SYNC_ALGOS", "AesrlOptimizer", "CemOptimizer", "Fitness", "Individual",
           "JobSpec", "Optimizer", "OptimizerFailed", "Reference", "Update", "generation_seed", "job_id", "job_seed", "load_optimizer",
           "make_optimizer", "needs_critic_daemon", "needs_workers", "rl_target", "uses_rl"]
