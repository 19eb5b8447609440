"""One ask/tell optimizer per queue algorithm (pycma/Nevergrad style): `make_optimizer(cfg, mu0)` or
`load_optimizer(cfg, state)`. They own every number of their algorithm; the scheduler loop moves bytes.

    aesrl, es, opo, acemrl  -> aesrl.AesrlOptimizer  (asynchronous: tell after every result)
    cemrl, pcemrl           -> cem.CemOptimizer      (synchronous: tell once per generation)
    td3                     -> no optimizer: scheduler/td3_baseline.py trains in one process
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from aesrl_queue.config import RunConfig
from aesrl_queue.optimizers import aesrl, cem
from aesrl_queue.optimizers.aesrl import AesrlOptimizer, uses_rl
from aesrl_queue.optimizers.base import (
    Evaluated,
    JobSpec,
    OptimizerFailed,
    Update,
    generation_seed,
    job_id,
    job_seed,
)
from aesrl_queue.optimizers.cem import CemOptimizer

ASYNC_ALGOS = aesrl.ALGOS
SYNC_ALGOS = cem.ALGOS
QUEUE_ALGOS = ASYNC_ALGOS + SYNC_ALGOS  # the algorithms that evaluate on RQ workers

Optimizer = AesrlOptimizer | CemOptimizer


def make_optimizer(cfg: RunConfig, mu0: np.ndarray) -> Optimizer:
    """A new optimizer for `cfg.algo`, centred on the initial actor parameters `mu0`."""
    if cfg.algo in ASYNC_ALGOS:
        return AesrlOptimizer(cfg, mu0)
    if cfg.algo in SYNC_ALGOS:
        return CemOptimizer(cfg, mu0)
    raise ValueError(f"algo {cfg.algo!r} has no queue optimizer; use one of {', '.join(QUEUE_ALGOS)}")


def load_optimizer(cfg: RunConfig, state: dict[str, Any]) -> Optimizer:
    """An optimizer restored from `state()` plus "mean" and "var" (the arrays of its version)."""
    return make_optimizer(cfg, state["mean"]).load_state(state)


def rl_target(cfg: RunConfig) -> float:
    """The RL share an algorithm aims at: ρ* of the P controller, half of each CEM generation, none
    for es; td3 has no ES/RL split (NaN)."""
    if cfg.algo == "es":
        return 0.0
    if cfg.algo in SYNC_ALGOS:
        return 0.5
    if cfg.algo == "td3":
        return math.nan
    return float(cfg.rl_ratio)


def needs_workers(cfg: RunConfig) -> bool:
    """TD3 runs in the scheduler process; every other algorithm evaluates on RQ workers."""
    return cfg.algo != "td3"


def needs_critic_daemon(cfg: RunConfig) -> bool:
    """Whether a run needs `aesrl-queue critic start`: never for td3 and es, always for the CEM-RL loops."""
    if cfg.algo == "td3":
        return False
    if cfg.algo in SYNC_ALGOS:
        return True
    return uses_rl(cfg)


__all__ = ["ASYNC_ALGOS", "QUEUE_ALGOS", "SYNC_ALGOS", "AesrlOptimizer", "CemOptimizer", "Evaluated", "JobSpec",
           "Optimizer", "OptimizerFailed", "Update", "generation_seed", "job_id", "job_seed", "load_optimizer",
           "make_optimizer", "needs_critic_daemon", "needs_workers", "rl_target", "uses_rl"]
