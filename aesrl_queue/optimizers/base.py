"""What an optimizer and the scheduler loop hand each other: job specs out, (individual, fitness,
reference) in, update records back. Plain data only; nothing here knows Redis, RQ, threads or clocks.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A job spec (what `ask` returns) is a plain dict:
#   {"kind": "es" | "rl", "version": int, "seed": int, "n": int, "rl_steps": int, "random": bool,
#    "mean": bool, "extra": {...}}   # extra: fields kept with the in-flight entry (generation, member)
# "mean" (optional, true when absent): whether the job plays μ's episodes for the f(μ) it reports, where
# the run's settings have it play them at all; the CEM-RL loops play them in one member a generation.
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
class Individual:
    """One individual `ask` handed out, back with its parameters: z rebuilt (ES) or downloaded (RL).
    `tell(individual, fitness, reference)` takes it with what its episode returned."""

    job: str
    kind: str  # "es" or "rl"
    version: int  # the distribution version the individual was drawn from
    z: np.ndarray
    random: bool = False  # a random-action episode (the random phase)
    mirror_z: np.ndarray | None = None  # an antithetic ES job (es_antithetic): its mirror μ − σ·ε
    # the μ the individual was drawn from (μ of `version`, float32), where the loop has it: pair_shift
    # measures an ES individual's offset from it (`noise.Individual.offset`)
    drawn_from: np.ndarray | None = None
    steps: int = -1  # the run's stored steps after its episode (-1: unknown), for the history
    interactions: int = -1


@dataclass
class Fitness:
    """What an individual's episode returned: its return and length (and its antithetic mirror's)."""

    value: float
    length: int
    mirror_value: float = math.nan
    mirror_length: int = 0


@dataclass
class Reference:
    """The job's estimate of f(μ), the fitness an individual is compared with: its value, the version of
    μ it is of, and the mean episode length behind it (fitness_shift subtracts per step)."""

    value: float = math.nan
    version: int = -1
    length: float = 0.0


@dataclass
class Update:
    """What one `tell` asks the loop to write, in the same transaction as the result's consumption."""

    version: int  # the distribution version after this tell
    moved: bool = False  # a new version: publish mean/var as dist:{version}
    mean: np.ndarray | None = None  # the new version's arrays when moved (not copies: do not modify)
    var: np.ndarray | None = None
    std: np.ndarray | None = None  # sqrt(var) of the new version when already computed, else None
    # one history entry; the loop adds when (t) and the job's own facts (worker, duration, rl_steps, dispatched_at)
    history: dict[str, Any] | None = None
    best: dict[str, Any] | None = None  # a new best individual: params, fitness, job, kind, version, steps
    applied: bool = True  # counts as an applied result (results_applied, {kind}_applied)
    extra: dict[str, Any] = field(default_factory=dict)


class OwnsDistribution:
    """What the loop reads of an optimizer's search distribution (`self.dist`): version, μ, var; and
    `events`, what happened inside it worth a log line, as (name, numbers) for the loop to word."""

    dist: Any
    events: list[tuple[str, dict[str, Any]]]

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
