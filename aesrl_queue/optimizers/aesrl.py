"""The asynchronous optimizers (AES-RL and its ES-only, (1+1)-ES and ACEM-RL relatives), ask/tell style:
every number of the algorithm lives here, and nothing of Redis, RQ, threads or clocks.

`ask` hands out job specs and tags each RL or ES with the P controller; `tell` applies one evaluated
individual the moment it arrives and returns what the scheduler must write. One object per run:

    opt = AesrlOptimizer(cfg, mu0)              # or AesrlOptimizer(cfg, mu).load_state(saved)
    specs = opt.ask(4, steps=0, inflight=0, rl=False)  # rl: the loop's critic gate says a critic is ready
    update = opt.tell(individual, fitness, reference)   # -> Update(version, moved, history, best, ...)

What it owns: the search distribution (μ, var and, for AES-RL, the fitness scale r), the P controller
and the job numbering, the f(μ) each individual is compared with, the `rl_steps` window, the random
phase (random-action results are not told when r adapts), and the best individual.
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Any

import numpy as np

from aesrl_queue import kernels, noise
from aesrl_queue.algorithms import algorithm
from aesrl_queue.config import RunConfig
from aesrl_queue.controller import RLController
from aesrl_queue.distributions import make_distribution
from aesrl_queue.optimizers.base import (
    Fitness,
    Individual,
    JobSpec,
    OwnsDistribution,
    Reference,
    Update,
    finite,
    job_seed,
)

# An RL job trains as many actor steps as the last 10 evaluated episodes stored (the paper's window),
# at most rl_steps_max.
RL_STEPS_WINDOW = 10


def uses_rl(cfg: RunConfig) -> bool:
    """Whether a run makes RL jobs (and so needs a critic): an algorithm with a learner, rl_ratio > 0."""
    return algorithm(cfg.algo).learner and cfg.rl_ratio > 0


# The distribution an asynchronous algorithm's entry names, with its settings from the config.
_DISTRIBUTIONS = {
    "aesrl": lambda cfg: dict(mean_rule=cfg.mean_rule, var_rule=cfg.var_rule, r=cfg.fitness_scale,
                              negative_ratio=cfg.negative_ratio, positive_ratio=cfg.positive_ratio,
                              fixed_n=cfg.fixed_n, var_init=cfg.var_init, var_floor=cfg.var_floor),
    "opo": lambda cfg: dict(var_init=cfg.var_init, var_floor=cfg.var_floor),
    "acem": lambda cfg: dict(var_init=cfg.var_init),
}


def build_distribution(cfg: RunConfig, mu: np.ndarray):
    """The search distribution an asynchronous algorithm uses, from its registry entry and the config."""
    name = algorithm(cfg.algo).options.get("distribution")
    if name not in _DISTRIBUTIONS:
        raise ValueError(f"algo {cfg.algo!r} has no asynchronous distribution")
    if name == "aesrl":
        kernels.compiled()  # load (or compile, once per machine) its update before the first result
    return make_distribution(name, mu, **_DISTRIBUTIONS[name](cfg))


class AesrlOptimizer(OwnsDistribution):
    """One asynchronous run: ask jobs, tell results one at a time (update after every result)."""

    def __init__(self, cfg: RunConfig, mu0: np.ndarray) -> None:
        self.cfg = cfg
        self.rl = uses_rl(cfg)
        self.dist = build_distribution(cfg, mu0)
        self.controller = RLController(target=cfg.rl_ratio if self.rl else 0.0, gain=cfg.rl_gain,
                                       initial_steps=cfg.initial_steps)
        self.dispatched = 0  # jobs asked so far: job n has seed job_seed(cfg.seed, n)
        self.events: list[tuple[str, dict[str, Any]]] = []  # AES-RL reports none (OwnsDistribution)
        self.f_mu, self.f_mu_version = math.nan, -1  # the newest estimate of f(μ) reported by a job
        self.f_mu_len = 0.0  # the mean episode length behind it (fitness_shift)
        self.best = -math.inf  # best f(z) so far (random-action episodes included)
        self.best_kept = -math.inf  # best f(z) of a non-random individual (the one kept for export)
        self.recent_lens: deque[int] = deque(maxlen=RL_STEPS_WINDOW)
        # the episodes one job stores: an antithetic pair; else the individual's and, in a run that keeps
        # a replay (its critic reads μ's episodes too), its f(μ) episodes
        spec = algorithm(cfg.algo)
        keeps_replay = spec.learner and (spec.rl_share is not None or self.rl)
        self.episodes_per_job = 2 if cfg.es_antithetic else 1 + (cfg.mean_eval_episodes if keeps_replay else 0)
        self.told = 0  # results passed to the distribution
        self.last_p: dict[str, float] = {}
        self._sigma: tuple[int, float, float, float] | None = None  # (version, mean, min, max) of sqrt(var)

    # -- what the loop reads ---------------------------------------------------------------------
    def done(self, steps: int) -> bool:
        return steps >= self.cfg.total_steps

    def fields(self) -> dict[str, Any]:
        """The run's state-hash fields this optimizer owns (written with every commit)."""
        out = {"version": self.version, "f_mu": self.f_mu, "f_mu_version": self.f_mu_version,
               "best_fitness": self.best, "n_rl": self.controller.n_rl, "n_es": self.controller.n_es,
               "dispatched": self.dispatched}
        r = getattr(self.dist, "r", None)
        if r is not None:
            out["r_used"] = r
        out.update({f"last_p_{kind}": p for kind, p in self.last_p.items()})
        return out

    # -- ask -------------------------------------------------------------------------------------
    def job_steps(self) -> float:
        """The steps one job is expected to store: its episodes at the recent mean length (before any
        episode is known, full-length ones)."""
        mean_len = ((sum(self.recent_lens) / len(self.recent_lens)) if self.recent_lens
                    else max(1, self.cfg.max_episode_steps))
        return mean_len * self.episodes_per_job

    def room(self, n: int, steps: int, inflight: int) -> int:
        """How many of `n` new jobs the budget has room for, given the stored steps and the jobs in
        flight: none whose episodes would certainly overshoot it."""
        cfg = self.cfg
        job_steps = self.job_steps()
        if n <= 0 or steps + inflight * job_steps >= cfg.total_steps:
            return 0
        return min(n, math.ceil((cfg.total_steps - steps) / job_steps - inflight))

    def ask(self, n: int, steps: int, inflight: int, rl: bool) -> list[JobSpec]:
        """Up to `n` new jobs (fewer near the end of the budget), given the stored steps and the jobs
        in flight; the P controller tags each RL or ES when `rl` (the loop's critic gate says a critic
        is ready: scheduler/critic_gate.py), else all are ES."""
        cfg = self.cfg
        n = self.room(n, steps, inflight)
        rl = rl and self.rl
        specs = []
        random_phase = self.rl and steps < cfg.initial_steps
        if random_phase:
            # the random jobs in flight count towards initial_steps, each as a full episode: the ones
            # that came back are the short ones (they end first), so a mean of the returned lengths
            # undercounts those still out. Without it every slot filled before initial_steps are stored
            # goes out random: N workers store up to N × (1 + queued) random episodes
            n = min(n, max(0, math.ceil((cfg.initial_steps - steps) / cfg.max_episode_steps - inflight)))
        rl_steps = min(cfg.rl_steps_max, sum(self.recent_lens) or cfg.max_episode_steps)
        for _ in range(n):
            self.dispatched += 1
            seed = job_seed(cfg.seed, self.dispatched)
            # No critic yet: ES only, and uncounted, so the controller does not start with a backlog
            # of ES dispatches that it would then repay with a burst of RL jobs.
            kind = self.controller.choose(steps, random.Random(seed).random()) if rl else "es"
            specs.append({"kind": kind, "version": self.version, "seed": seed, "n": self.dispatched,
                          "rl_steps": rl_steps if kind == "rl" else 0, "random": random_phase})
        return specs

    # -- tell ------------------------------------------------------------------------------------
    def tell(self, ind: Individual, fit: Fitness, ref: Reference) -> Update:
        """Apply one evaluated individual: what its episode returned, and the job's f(μ) estimate.

        Invalid input raises ValueError and changes nothing."""
        cfg, dist = self.cfg, self.dist
        pair = ind.mirror_z is not None
        if pair and not finite(fit.mirror_value):
            raise ValueError(f"the antithetic partner of {ind.job} has return {fit.mirror_value}")
        f_mu, f_mu_version, f_mu_len = self.f_mu, self.f_mu_version, self.f_mu_len
        if finite(ref.value) and ref.version >= f_mu_version:  # a pair's: its episodes' mean return, length
            f_mu, f_mu_version = ref.value, ref.version
            f_mu_len = 0.5 * (fit.length + fit.mirror_length) if pair else ref.length
        f_z, f_ref = self._judged(ind, fit, ref, f_mu, f_mu_len)
        # A random-action episode says nothing about z: with an adaptive scale it neither moves μ nor
        # enters the scale (the paper's fixed r lets it move μ, as the official code does).
        scale = getattr(dist, "scale", None)
        told = not (ind.random and scale is not None and scale.adapts)
        mean_before, version_before = dist.mean, dist.version
        # (the value told, z, the return) per individual: one, or an antithetic pair, the worse first
        # (under the default rules it leaves μ where it is; the better one then moves μ from there)
        members = [(f_z, ind.z, fit.value)]
        if pair:
            members = sorted([members[0], (cfg.judged(fit.mirror_value, fit.mirror_length), ind.mirror_z,
                                           fit.mirror_value)], key=lambda m: m[0])
        tellees = [(f_i, z_i) for f_i, z_i, _ in members]
        if cfg.pair_shift and ind.kind == "es" and ind.version != dist.version and (pair or ind.drawn_from is not None):
            # drawn from an older μ: tell the offsets σ·ε from that μ, added to the current one. Told as
            # they are, z − μ_now also holds how far μ moved meanwhile, and the variance takes it
            offset = noise.Individual(ind.z, ind.mirror_z, ind.drawn_from).offset(dist.mean)
            tellees = [(f_i, (z_i + offset).astype(np.float32)) for f_i, z_i in tellees]
        step = None
        p = p_loser = 0.0
        for f_i, z_i in tellees if told else ():
            p_loser = p
            if hasattr(dist, "tell_step"):  # only ES gaps set the adaptive r (fitness.FitnessScale)
                p, step_i = dist.tell_step(z_i, f_i, f_ref, scale_step=ind.kind != "rl")
                step = step_i if step_i is not None else step
            else:
                p = dist.tell(z_i, f_i, f_ref)
            p = float(p)
            self.told += 1
        self.f_mu, self.f_mu_version, self.f_mu_len = f_mu, f_mu_version, f_mu_len
        self.last_p[ind.kind] = p
        self.recent_lens.extend([int(fit.length), int(fit.mirror_length)] if pair else [int(fit.length)])
        told_best, z_best, f_best = members[-1]  # the better of a pair (the individual itself otherwise)
        self.best = max(self.best, f_best)
        moved = dist.version != version_before
        std = (step.std if step is not None else noise.scale(dist.mean, dist.var)[1]) if moved else None
        entry = self._entry(ind, fit, p, f_ref, f_z, told, std, version_before,
                            step.moved if step is not None else float(np.linalg.norm(dist.mean - mean_before)))
        if pair:  # the entry describes the better of the pair; the worse one's return and p beside it
            entry.update(f_z=f_best, delta=told_best - f_ref, f_pair_worse=members[0][2], p_pair_worse=p_loser,
                         mirror_won=z_best is ind.mirror_z)
        best = None
        if not ind.random and f_best > self.best_kept:
            self.best_kept = f_best
            best = {"params": z_best, "fitness": f_best, "job": ind.job, "kind": ind.kind, "version": dist.version,
                    "steps": ind.steps}
        return Update(version=dist.version, moved=moved, mean=dist.mean if moved else None,
                      var=dist.var if moved else None, std=std, history=entry, best=best)

    def _judged(self, ind: Individual, fit: Fitness, ref: Reference, f_mu: float, f_mu_len: float) -> tuple[float, float]:
        """(f(z), the f(μ) it is compared with), both as the rule compares them (less fitness_shift).

        The reference: an antithetic pair's mean, both from one start state; with paired evaluation,
        the job's own estimate of the μ it was drawn from, on the same start state; else the newest
        estimate (the paper)."""
        shaped = self.cfg.judged
        f_z = shaped(fit.value, fit.length)
        if ind.mirror_z is not None:
            return f_z, 0.5 * (f_z + shaped(fit.mirror_value, fit.mirror_length))
        if self.cfg.mean_eval_paired and finite(ref.value) and ref.version == ind.version:
            return f_z, shaped(ref.value, ref.length)
        return f_z, (shaped(f_mu, f_mu_len) if finite(f_mu) else f_z)

    def _entry(self, ind: Individual, fit: Fitness, p: float, f_ref: float, f_z: float, told: bool,
               std: np.ndarray | None, version_before: int, moved: float) -> dict[str, Any]:
        """The history entry of one tell (f_ref and delta as the rule saw them: less fitness_shift)."""
        sigma = self._sigma_stats(std)
        return {"job": ind.job, "kind": ind.kind, "steps": ind.steps, "interactions": ind.interactions,
                "version": self.dist.version, "p": p, "f_z": fit.value, "f_mu": self.f_mu, "len": fit.length,
                "sigma_mean": sigma[1], "sigma_min": sigma[2], "sigma_max": sigma[3], "moved": moved,
                "random": bool(ind.random), "f_ref": f_ref, "delta": f_z - f_ref,
                "r": getattr(self.dist, "r", None), "told": told,
                # how many updates were told while this individual ran (drawn from an older μ)
                "lag": version_before - ind.version}

    def _sigma_stats(self, std: np.ndarray | None) -> tuple[int, float, float, float]:
        """Mean, min and max of sqrt(var) for the history, computed once per version."""
        if self._sigma is None or self._sigma[0] != self.version:
            if std is None:
                std = noise.scale(self.dist.mean, self.dist.var)[1]
            self._sigma = (self.version, float(std.mean()), float(std.min()), float(std.max()))
        return self._sigma

    def lost(self, job: str, retry: bool = True) -> Update | None:
        """A job that will not report: its slot is simply asked again."""
        return None

    def reconcile(self, inflight: set[str]) -> None:
        """After a restart: nothing to do (in-flight jobs are the loop's)."""

    def needs_individuals(self) -> dict[str, int]:
        return {}

    def provide(self, member: int, z: np.ndarray | None) -> None:
        raise KeyError(member)

    # -- persistence -----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Plain data, without μ/var (the scheduler stores those as dist:{version})."""
        return {"algo": self.cfg.algo, "dist": self.dist.state(arrays=False), "controller": self.controller.state(),
                "dispatched": self.dispatched, "f_mu": self.f_mu, "f_mu_version": self.f_mu_version,
                "f_mu_len": self.f_mu_len, "best": self.best, "best_kept": self.best_kept, "recent_lens": list(self.recent_lens),
                "told": self.told, "last_p": dict(self.last_p)}

    def load_state(self, state: dict[str, Any]) -> AesrlOptimizer:
        """Restore `state()` plus "mean" and "var" (the arrays of its version); returns self."""
        if state.get("algo") != self.cfg.algo:
            raise ValueError(f"optimizer state is of algo {state.get('algo')!r}, the run is {self.cfg.algo!r}")
        dist_state = dict(state["dist"], mean=state["mean"], var=state["var"])
        self.dist.load_state(dist_state)
        self.controller.load_state(state["controller"])
        self.dispatched = int(state["dispatched"])
        self.f_mu, self.f_mu_version = float(state["f_mu"]), int(state["f_mu_version"])
        self.f_mu_len = float(state.get("f_mu_len", 0.0))
        self.best, self.best_kept = float(state["best"]), float(state["best_kept"])
        self.recent_lens = deque((int(x) for x in state["recent_lens"]), maxlen=RL_STEPS_WINDOW)
        self.told = int(state["told"])
        self.last_p = {str(k): float(v) for k, v in state.get("last_p", {}).items()}
        self._sigma = None
        return self
