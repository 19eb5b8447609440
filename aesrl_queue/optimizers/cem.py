"""The synchronous CEM-RL baselines, ask/tell style: `cemrl` asks one member at a time, `pcemrl` a whole
generation at once; both tell the distribution once per generation, when every member is back.
One member a generation, the first ES member, plays μ's episode for the run's f(μ) (as the official
P-CEM-RL measures μ once a generation): the rank-based tell does not use f(μ), and every member
playing it would spend half the budget's interactions on μ, half of them on repeated start states.

A generation: `population` antithetic members (the + halves first, then their mirrors, as the
official code orders them); once the random phase is over the first half are RL members, with the
critic trained before them (docs/decisions.md). Every member is one ordinary (version, seed) job.
The state is plain data: after a restart the ES members already back are rebuilt from their seeds
and the RL members from their stored individuals (`needs_individuals` / `provide`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from aesrl_queue import noise
from aesrl_queue.algorithms import algorithm
from aesrl_queue.config import RunConfig
from aesrl_queue.distributions import make_distribution
from aesrl_queue.optimizers.base import (
    Fitness,
    Individual,
    JobSpec,
    OptimizerFailed,
    OwnsDistribution,
    Reference,
    Update,
    finite,
    generation_seed,
    job_id,
)

MAX_TRIES = 3  # dispatches of one member (lost or failed jobs) before the generation goes on without it


def build_cem(cfg: RunConfig, mu: np.ndarray):
    # The official aes-rl code decays damp by cemrl_tau = 0.90 per generation; the original CEM-RL
    # (and our docs/algorithms.md) use 0.95.
    return make_distribution("cem", mu, elite=cfg.population // 2, antithetic=True, var_init=cfg.var_init,
                             damp_init=1e-3, damp_limit=1e-5, damp_tau=0.95)


class CemOptimizer(OwnsDistribution):
    """CEM-RL (`cemrl`: serial, one job in flight) and P-CEM-RL (`pcemrl`: a generation at once)."""

    def __init__(self, cfg: RunConfig, mu0: np.ndarray) -> None:
        options = algorithm(cfg.algo).options
        if "serial" not in options:
            raise ValueError(f"algo {cfg.algo!r} does not run generations of CEM")
        self.cfg = cfg
        self.serial = bool(options["serial"])  # cemrl: one member at a time; pcemrl: a generation at once
        self.dist = build_cem(cfg, mu0)
        self.gen: dict[str, Any] | None = None  # the open generation (plain data)
        self.generation = 0  # index of the next generation to start
        self.prev_gen_steps = 0  # episode steps of the last generation told (the critic's training budget)
        self.critic_request = 0  # total critic steps asked of the daemon (critic_on_request)
        self.dispatched = 0
        self.n_rl = self.n_es = 1
        self.f_mu, self.best, self.best_kept = math.nan, -math.inf, -math.inf
        self.f_mu_version = -1  # the version f_mu measured (the newest generation's μ episode)
        self.no_critic_gen = -1  # generation in which the critic did not come; its RL members run as ES
        self._z: dict[int, np.ndarray] = {}  # member index -> evaluated parameters (this generation)
        self._need: dict[str, int] = {}  # jobs whose stored individual to fetch after a restart -> member
        self.events: list[tuple[str, dict[str, Any]]] = []  # for the loop's log (OwnsDistribution)

    def done(self, steps: int) -> bool:
        """The budget is spent and no generation is open (a generation is always finished)."""
        return self.gen is None and steps >= self.cfg.total_steps

    def fields(self) -> dict[str, Any]:
        out = {"version": self.version, "generation": self.generation, "prev_gen_steps": self.prev_gen_steps,
               "critic_request": self.critic_request, "dispatched": self.dispatched, "n_rl": self.n_rl,
               "n_es": self.n_es, "best_fitness": self.best}
        if finite(self.f_mu):
            out.update(f_mu=self.f_mu, f_mu_version=self.f_mu_version)
        return out

    # -- ask -------------------------------------------------------------------------------------
    def _pending(self, steps: int) -> list[int]:
        """The members not yet out, of the open generation, or of a new one while the budget lasts."""
        if self.gen is None:
            if steps >= self.cfg.total_steps:
                return []
            self._start_generation(steps)
        return [i for i, m in enumerate(self.gen["members"]) if not m["job"] and not m["done"] and not m["dropped"]]

    def critic_need(self, steps: int, inflight: int) -> tuple[str, int] | None:
        """What the RL member(s) the next `ask` dispatches need of the critic: ("steps", n), the critic's
        trained steps reaching n (critic_on_request: the steps are requested here, once, and written
        with the next commit as critic_request), or ("version", 1), a published critic; None when the
        next ask dispatches no RL member. The loop's critic gate waits for it (scheduler/critic_gate.py)."""
        pending = self._pending(steps)
        if self.serial:
            pending = [] if inflight else pending[:1]
        members = self.gen["members"] if self.gen else []
        if self.no_critic_gen == self.generation or not any(members[i]["kind"] == "rl" for i in pending):
            return None
        m = members[pending[0]] if self.serial else members[0]  # P-CEM-RL: all critic training before the generation
        if not self.cfg.critic_on_request:
            return "version", 1
        self.critic_request += m["critic"]  # asked once, even across restarts
        m["critic"] = 0
        return "steps", self.critic_request

    def ask(self, n: int, steps: int, inflight: int, rl: bool) -> list[JobSpec]:
        """Members to dispatch now: cemrl the next one once nothing is in flight, pcemrl every member
        not yet out. `n` (free worker slots) is not a limit: a generation is dispatched whole. The loop
        asks once the critic is ready for its RL members (`critic_need`); `rl` False: it did not come,
        and this generation's RL members run as ES members, untrained."""
        pending = self._pending(steps)
        if not pending or (self.serial and inflight):
            return []
        if self.serial:
            pending = pending[:1]
        if not rl:
            self.no_critic_gen = self.gen["g"]
        specs = []
        for i in pending:
            m = self.gen["members"][i]
            kind = "es" if self.no_critic_gen == self.gen["g"] else m["kind"]
            m["kind"] = kind
            self.dispatched += 1
            m["job"] = job_id(self.cfg.run_id, self.dispatched)
            m["tries"] += 1
            if kind == "rl":
                self.n_rl += 1
            else:
                self.n_es += 1
            specs.append({"kind": kind, "version": self.version, "seed": m["seed"], "n": self.dispatched,
                          "rl_steps": self.gen["rl_steps"] if kind == "rl" else 0, "random": m["random"],
                          "mean": self.gen.get("mean_member", i) == i,
                          "extra": {"generation": self.gen["g"], "member": i}})
        return specs

    def _start_generation(self, steps: int) -> None:
        cfg = self.cfg
        g = self.generation
        seeds, _pop = self.dist.ask(cfg.population, generation_seed(cfg.seed, g))
        pair_seeds = seeds[0::2]
        # The official order: the + member of every pair first, then the mirrors; RL takes the first half.
        member_seeds = [*pair_seeds, *[noise.mirrored(s) for s in pair_seeds]]
        prev_steps = self.prev_gen_steps
        rl_phase = steps >= max(cfg.initial_steps, cfg.batch_size) and prev_steps > 0
        n_rl = cfg.population // 2 if rl_phase else 0
        members = [{"kind": "rl" if i < n_rl else "es", "seed": int(seed), "job": "", "tries": 0, "done": False,
                    "dropped": False, "random": steps < cfg.initial_steps, "critic": 0}
                   for i, seed in enumerate(member_seeds)]
        if n_rl and cfg.critic_on_request:
            if self.serial:
                # CEM-RL: critic steps before each RL member (the official interleaving).
                per = max(1, prev_steps // n_rl)
                for m in members[:n_rl]:
                    m["critic"] = per
            else:
                members[0]["critic"] = prev_steps  # P-CEM-RL: all critic training before the generation
        # μ's episode goes with the first ES member: its job is short, so f(μ) comes early in the generation
        self.gen = {"g": g, "version": self.version, "members": members, "steps_at_start": steps,
                    "rl_steps": min(cfg.rl_steps_max, prev_steps or cfg.max_episode_steps), "mean_member": n_rl}
        self._z = {}
        self.events.append(("generation", {"g": g, "version": self.version, "rl": n_rl, "es": cfg.population - n_rl,
                                           "steps": steps}))

    # -- tell ------------------------------------------------------------------------------------
    def _member_of(self, job: str) -> int | None:
        for i, m in enumerate(self.gen["members"] if self.gen else []):
            if m["job"] == job:
                return i
        return None

    def tell(self, ind: Individual, fit: Fitness, ref: Reference) -> Update:
        """Record one member's result; the last member of a generation updates the distribution."""
        i = self._member_of(ind.job)
        if i is None:
            raise ValueError(f"job {ind.job} is no member of the open generation")
        if ind.version != self.version:
            # The barrier makes this impossible unless someone else moved the run's version.
            raise ValueError(f"job {ind.job} used version {ind.version}, generation {self.gen['g']} is version "
                             f"{self.version}")
        m = self.gen["members"][i]
        m.update(done=True, fitness=float(fit.value), len=int(fit.length))
        if finite(ref.value) and ref.version == self.version:
            m["f_mu"] = float(ref.value)
        self._z[i] = ind.z
        self.best = max(self.best, fit.value)
        f_mus = [mm["f_mu"] for mm in self.gen["members"] if mm["done"] and "f_mu" in mm]
        if f_mus:  # else the newest generation's f(μ) stands, with its version
            self.f_mu, self.f_mu_version = float(np.mean(f_mus)), self.version
        g = self.gen["g"]
        told = all(mm["done"] or mm["dropped"] for mm in self.gen["members"])
        mean_before = self.dist.mean
        update = self._tell_generation() if told else Update(version=self.version)
        sigma = np.sqrt(self.dist.var)
        update.history = {
            "job": ind.job, "kind": ind.kind, "steps": ind.steps, "interactions": ind.interactions,
            "version": self.version, "p": 0.0, "f_z": fit.value, "f_mu": self.f_mu, "len": fit.length,
            "sigma_mean": float(sigma.mean()), "sigma_min": float(sigma.min()),
            "sigma_max": float(sigma.max()), "moved": float(np.linalg.norm(self.dist.mean - mean_before)),
            "random": bool(ind.random), "generation": g, "member": i, "told": told}
        if not ind.random and fit.value > self.best_kept:
            self.best_kept = fit.value
            update.best = {"params": ind.z, "fitness": fit.value, "job": ind.job, "kind": ind.kind,
                           "version": self.version, "steps": ind.steps}
        return update

    def _tell_generation(self) -> Update:
        """Update the distribution from the members that returned and close the generation."""
        members = self.gen["members"]
        done = [i for i, m in enumerate(members) if m["done"]]
        pop = np.stack([self._z[i] for i in done])
        fits = np.array([members[i]["fitness"] for i in done], dtype=np.float64)
        self.dist.tell(pop, fits)
        self.prev_gen_steps = sum(int(members[i]["len"]) for i in done)
        self.events.append(("told", {"g": self.gen["g"], "best": float(fits.max()), "mean": float(fits.mean()),
                                     "version": self.version}))
        self.generation = self.gen["g"] + 1
        self.gen, self._z = None, {}
        return Update(version=self.version, moved=True, mean=self.dist.mean, var=self.dist.var)

    def lost(self, job: str, retry: bool = True) -> Update | None:
        """A member's job will not report: dispatch the member again, or drop it after MAX_TRIES (or
        when retrying cannot help). A generation whose remaining members are all dropped is told
        with those that returned; an Update is returned then."""
        i = self._member_of(job)
        if i is None:
            return None
        m = self.gen["members"][i]
        m["job"] = ""
        if not retry or m["tries"] >= MAX_TRIES:
            m["dropped"] = True
            self.events.append(("dropped", {"member": i, "g": self.gen["g"], "tries": m["tries"]}))
        members = self.gen["members"]
        if not all(mm["done"] or mm["dropped"] for mm in members):
            return None
        if sum(mm["done"] for mm in members) < self.cfg.population // 2:
            raise OptimizerFailed(f"run {self.cfg.run_id}: generation {self.gen['g']} lost more than half its "
                                  "members")
        update = self._tell_generation()
        update.applied = False
        return update

    # -- restart ---------------------------------------------------------------------------------
    def reconcile(self, inflight: set[str]) -> None:
        """After a restart: members whose job was forgotten meanwhile are dispatched again."""
        for m in self.gen["members"] if self.gen else []:
            if m["job"] and not m["done"] and m["job"] not in inflight:
                m["job"] = ""

    def needs_individuals(self) -> dict[str, int]:
        """The jobs of RL members that returned before a restart -> member: the loop reads the
        individual each job stored and hands it to `provide`."""
        return dict(self._need)

    def provide(self, member: int, z: np.ndarray | None) -> None:
        """The stored individual of an RL member, or None when it is gone: the member runs again."""
        m = self.gen["members"][member]
        self._need.pop(m["job"], None)
        if z is None:
            self.events.append(("gone", {"member": member, "g": self.gen["g"]}))
            m.update(done=False, job="")
            m.pop("f_mu", None)
        else:
            self._z[member] = np.asarray(z, dtype=np.float32)

    # -- persistence -----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Plain data, without μ/var (stored as dist:{version}) and without the members' parameters."""
        return {"algo": self.cfg.algo, "dist": self.dist.state(arrays=False), "gen": self.gen,
                "generation": self.generation, "prev_gen_steps": self.prev_gen_steps,
                "critic_request": self.critic_request, "dispatched": self.dispatched, "n_rl": self.n_rl,
                "n_es": self.n_es, "f_mu": self.f_mu, "f_mu_version": self.f_mu_version, "best": self.best,
                "best_kept": self.best_kept, "no_critic_gen": self.no_critic_gen}

    def load_state(self, state: dict[str, Any]) -> CemOptimizer:
        """Restore `state()` plus "mean" and "var"; rebuilds the ES members already back from their
        seeds, and lists the RL members' stored individuals for `provide`. Returns self."""
        if state.get("algo") != self.cfg.algo:
            raise ValueError(f"optimizer state is of algo {state.get('algo')!r}, the run is {self.cfg.algo!r}")
        self.dist.load_state(dict(state["dist"], mean=state["mean"], var=state["var"]))
        gen = state["gen"]
        self.gen = None if gen is None else {**gen, "members": [dict(m) for m in gen["members"]]}
        for name in ("generation", "prev_gen_steps", "critic_request", "dispatched", "n_rl", "n_es",
                     "no_critic_gen"):
            setattr(self, name, int(state[name]))
        self.f_mu, self.best, self.best_kept = float(state["f_mu"]), float(state["best"]), float(state["best_kept"])
        self.f_mu_version = int(state.get("f_mu_version", self.version if finite(self.f_mu) else -1))
        self._z, self._need = {}, {}
        for i, m in enumerate(self.gen["members"] if self.gen else []):
            if not m["done"]:
                continue
            if m["kind"] == "rl":
                self._need[m["job"]] = i
            else:
                self._z[i] = noise.sample(self.dist.mean, self.dist.var, m["seed"])
        return self
