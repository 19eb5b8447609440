"""What an optimizer and the scheduler loop hand each other: job specs out, evaluated individuals in,
update records back. Plain data only; nothing here knows Redis, RQ, threads or clocks.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A job spec (what `ask` returns) is a plain dict:
#   {"kind": "es" | "rl", "version": int, "seed": int, "n": int, "rl_steps": int, "random": bool,
#    "extra": {...}}   # extra: fields kept with the in-flight entry (generation, member)
JobSpec = dict[str, Any]


def job_seed(run_seed: int, n: int) -> int:
    """The seed of the n-th job of a run: fixed by (run seed, n), so a restart re-derives it."""
    digest = hashlib.sha256(f"{run_seed}:{n}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def generation_seed(run_seed: int, g: int) -> int:
    """The seed of generation g's antithetic population: fixed by (run seed, g), so a restart re-derives it."""
    digest = hashlib.sha256(f"{run_seed}:generation:{g}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def job_id(run_id: str, n: int) -> str:
    """The RQ job id of a run's n-th job (numbering continues across restarts)."""
    return f"{run_id}-j{n}"


def finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class Evaluated:
    """One evaluated individual as the loop hands it to `tell`: z rebuilt (ES) or downloaded (RL)."""

    job: str
    kind: str  # "es" or "rl"
    version: int  # the distribution version the individual was drawn from
    seed: int
    z: np.ndarray
    fitness: float
    length: int
    f_mu: float = math.nan  # the job's estimate of f(μ_version_of_f_mu)
    f_mu_version: int = -1
    f_mu_length: float = 0.0  # mean episode length behind f_mu (fitness_shift subtracts per step)
    steps: int = -1  # the run's stored steps after this episode (-1: unknown)
    interactions: int = -1
    random: bool = False  # a random-action episode (the random phase)
    worker: str = ""
    duration: float = 0.0
    rl_steps: int = 0
    dist_before: float = math.nan
    dist_after: float = math.nan
    rl_trained: int = 0  # actor steps an RL job trained (rl_action_limit may stop it before rl_steps)
    rl_from: int = 0  # rl_actor: which stored actor the RL job continued (0: a fresh sample)
    rl_t: float = math.nan  # rl_line: the reported point μ + t·(z − μ) (NaN: z itself, no line)
    enqueued_at: float = 0.0
    ind: str = ""  # RL: the key of the stored trained individual (opaque here; the loop reads it back)
    # an antithetic ES job (es_antithetic): μ − σ·ε, its return and episode length; f_mu is the pair's mean
    mirror_z: np.ndarray | None = None
    mirror_fitness: float = math.nan
    mirror_length: int = 0
    # a single ES individual told with pair_shift: the μ it was drawn from (the loop has it to rebuild z)
    mean_drawn: np.ndarray | None = None
    # action_noise: f_z and f_mu were both measured under action noise of this std (0: none); f_mu is
    # then this individual's reference only, not an estimate of the run's f(μ)
    f_mu_noise: float = 0.0
    # rl_eval_pairs: z and μ were run from `pairs` start states; z's mean return and episode length over
    # them (f_mu is μ's mean over the same states). 1: the stored episode alone
    pairs: int = 1
    pairs_fitness: float = math.nan
    pairs_length: float = 0.0


@dataclass
class Update:
    """What one `tell` asks the loop to write, in the same transaction as the result's consumption."""

    version: int  # the distribution version after this tell
    moved: bool = False  # a new version: publish mean/var as dist:{version}
    mean: np.ndarray | None = None  # the new version's arrays when moved (not copies: do not modify)
    var: np.ndarray | None = None
    std: np.ndarray | None = None  # sqrt(var) of the new version when already computed, else None
    history: dict[str, Any] | None = None  # one history entry (the loop adds nothing but clocks)
    best: dict[str, Any] | None = None  # a new best individual: params, fitness, job, kind, version, steps
    applied: bool = True  # counts as an applied result (results_applied, {kind}_applied)
    extra: dict[str, Any] = field(default_factory=dict)


class OwnsDistribution:
    """What the loop reads of an optimizer's search distribution (`self.dist`): version, μ, var."""

    dist: Any

    @property
    def version(self) -> int:
        return self.dist.version

    @property
    def mean(self) -> np.ndarray:
        return self.dist.mean

    @property
    def var(self) -> np.ndarray:
        return self.dist.var


class OptimizerFailed(RuntimeError):
    """The run cannot go on (e.g. a generation lost more than half its members)."""
