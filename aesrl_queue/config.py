"""The run configuration: one object with documented defaults, per-environment presets, validation.

A config is written once to Redis; its `spec_hash` travels with every job so a worker never
evaluates a policy under the wrong environment or network shape.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
import time
import tomllib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from aesrl_queue.algorithms import ALGOS, PAPER, REGISTRY, SWITCHES, algorithm, applies_to
from aesrl_queue.numpy_actor import ACTIVATIONS, actor_param_count
from aesrl_queue.rules import AESRL_VAR_RULES, FITNESS_MEAN_RULES

# The learners' names and settings, kept torch-free here (aesrl_queue.learners builds them).
LEARNER_DEFAULTS: dict[str, dict[str, Any]] = {
    "td3": {},
    # CrossQ's published critic: 2048-2048 ReLU at lr 1e-3 (its actor lr too)
    "crossq": {"critic_hidden": (2048, 2048), "critic_activation": "relu", "critic_lr": 1e-3, "actor_lr": 1e-3},
    # CrossQ's critic at 256-256 with SAC's squashed Gaussian actor (256-256 ReLU, as CrossQ's): at that size
    # it scores in the published range at 100k steps alone (development seeds 1-3, docs/performance.md §8)
    # and trains ~19× as fast per CPU core as at 2048-2048 (bench/results/learners-micro-cpu.json)
    "crossq-sac": {"critic_hidden": (256, 256), "critic_activation": "relu", "critic_lr": 1e-3, "actor_lr": 1e-3,
                   "hidden": (256, 256), "activation": "relu"},
}
LEARNERS = tuple(LEARNER_DEFAULTS)

# The mean and variance rules a run selects (aesrl_queue/rules.py defines them); these two names
# stay for cli/main.py, which imports them from here.
MEAN_RULES = FITNESS_MEAN_RULES
VAR_RULES = AESRL_VAR_RULES
RUN_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Names whose key prefix aesrl:{name}: would overlap the global keys of store.py (aesrl:worker:*, ...).
RESERVED_RUN_IDS = ("runs", "workers", "worker")


class ConfigError(ValueError):
    """A config field is invalid; `field` names it."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


def _setting(default: Any, help: str, departure: bool = False) -> Any:
    """A field a user sets: its default, a one-line help text, and whether it is this project's
    departure from the paper's setting (`field_docs` lists them; `aesrl-queue config show` prints them)."""
    meta = {"help": help, "departure": departure}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


def _derived(default: Any, help: str) -> Any:
    """A value resolve() reads off the environment: not a setting."""
    return field(default=default, metadata={"help": help, "derived": True})


@dataclass
class RunConfig:
    """Every setting of a run. The defaults are what `--algo aesrl` runs: the paper's and the official
    code's, except the fields marked as departures (docs/decisions.md says why each one departs).
    Another algorithm's entry in aesrl_queue/algorithms.py holds what it runs differently."""

    env_id: str = _setting("HalfCheetah-v5", "gymnasium environment id")
    algo: str = _setting("aesrl", f"algorithm: {', '.join(ALGOS)}")
    run_id: str = _setting("", "name of the run in Redis (empty: generated from env, algo and time)")
    seed: int = _setting(0, "run seed: μ₀ and every job seed derive from it")
    total_steps: int = _setting(1_000_000, "budget of stored transitions (the paper's x-axis)")
    # search distribution (aesrl, es)
    mean_rule: str = _setting("baseline-relative", f"mean update rule: {', '.join(FITNESS_MEAN_RULES)}")
    var_rule: str = _setting("adaptive", f"variance update rule: {', '.join(AESRL_VAR_RULES)}")
    r: float | str = _setting("adaptive", "fitness scale of the mean rule: 'adaptive' (robust spread of recent "
                                          "f(z) − f(μ) of ES individuals), 'paper' (the paper's r), or a number",
                              departure=True)
    negative_ratio: float = _setting(0.0, "fixed-linear only: weight of negative moves")
    positive_ratio: float = _setting(1.0, "the paper's p_positive: share of p kept for a better individual")
    fitness_shift: float | str = _setting(
        "alive", "aesrl, es: amount per step subtracted from the returns the rule compares: 'alive' (the "
             "environment's survival bonus), a number, or 0 (the paper)", departure=True)
    critic_shift: bool = _setting(False, "aesrl with RL jobs that train (rl_steps_max > 0): the critic learns the "
                                         "rewards less that same amount per step")
    fixed_n: float = _setting(10.0, "fixed variance rule: n")
    var_init: float = _setting(1e-3, "initial variance (not a standard deviation)")
    var_floor: float = _setting(1e-5, "lowest variance")
    # ES/RL mix (P controller)
    rl_ratio: float = _setting(0.9, "target share ρ* of RL individuals (the paper: 0.5)", departure=True)
    rl_gain: float = _setting(50.0, "gain K_rl of the P controller")
    initial_steps: int = _setting(10_000, "stored steps of random actions before learning starts (the first RL "
                                          "job; td3's first update)")
    # networks
    hidden: tuple[int, ...] = _setting((400, 300), "actor hidden layer sizes")
    activation: str = _setting("tanh", f"actor activation: {', '.join(ACTIVATIONS)}")
    critic_hidden: tuple[int, ...] = _setting((400, 300), "critic hidden layer sizes")
    critic_activation: str = _setting("leaky_relu", f"critic activation: {', '.join(ACTIVATIONS)}")
    # the off-policy learner (critic daemon, RL jobs, td3) and RL jobs
    learner: str = _setting("crossq-sac", "off-policy learner of the critic and the RL jobs: crossq-sac, crossq, "
                                          "td3 (the paper's)", departure=True)
    actor_lr: float = _setting(1e-3, "actor learning rate")
    critic_lr: float = _setting(1e-3, "critic learning rate")
    batch_size: int = _setting(256, "TD3 batch size")
    gamma: float = _setting(0.99, "discount")
    tau: float = _setting(0.005, "target network update rate")
    policy_noise: float = _setting(0.2, "TD3 target policy smoothing noise")
    noise_clip: float = _setting(0.5, "TD3 target policy noise clip")
    rl_steps_max: int = _setting(0, "0: the critic daemon trains an actor of its own and an RL job plays it "
                                    "and returns it as its individual; n > 0: an RL job trains a sample of "
                                    "N(μ, σ²) for at most n actor steps (the paper: the sum of the last 10 "
                                    "episode lengths)", departure=True)
    critic_chunk: int = _setting(1000, "critic steps between publications")
    # the scheduler holds new jobs after the random phase while the critic trails its schedule (critic_due)
    # by more than this, and within it dispatches no more jobs than the room left holds, so that RL jobs play
    # (or train against) a learner that has seen the data; the published code (0) relies on a GPU critic
    # keeping up
    critic_lag: int = _setting(1000, "most steps the critic may trail its schedule by, a step per stored step "
                                     "(0: never wait)", departure=True)
    replay_capacity: int = _setting(200_000, "transitions the replay keeps")
    # paired: the first f(μ) episode starts from the individual's start state, so f(z) − f(μ) measures
    # the change of policy, not the luck of the start (the paper: 5 episodes, unpaired)
    mean_eval_episodes: int = _setting(1, "episodes of μ each job runs for the f(μ) it reports", departure=True)
    mean_eval_paired: bool = _setting(True, "f(μ) from the individual's own start state", departure=True)
    es_antithetic: bool = _setting(True, "aesrl, es: an ES job evaluates z and its mirror μ − σ·ε and takes "
                                         "their mean as f(μ)", departure=True)
    pair_shift: bool = _setting(False, "aesrl, es: an ES individual drawn from an older μ moves the current μ "
                                       "by its offset from the μ it was drawn from", departure=True)
    # synchronous baselines
    population: int = _setting(10, "cemrl, pcemrl: population (even: antithetic pairs)")
    parallel_critic: bool = _setting(False, "pcemrl: train the critic while the generation's jobs run")
    # TD3 baseline
    expl_noise: float = _setting(0.1, "td3: exploration noise (fraction of the action bound)")
    td3_eval_every: int = _setting(5000, "td3: env steps between evaluations of the deterministic actor")
    # runtime
    job_timeout: int = _setting(900, "seconds RQ lets one job run")
    # not 0: RQ 3 deletes such a job and its executions at the end with ~7 more commands per job
    result_ttl: int = _setting(60, "seconds RQ keeps a finished job (results go to the run's own stream)")
    failure_ttl: int = _setting(3600, "seconds RQ keeps a failed job for inspection")
    critic_wait: float = _setting(120.0, "seconds to hold jobs after the random phase until a critic exists")
    queued_per_worker: int = _setting(1, "jobs waiting in the queue per live worker")
    job_deadline: float = _setting(0.0, "seconds from start after which a job is replaced (0: automatic)")
    history_max: int = _setting(100_000, "entries kept in the history stream")
    env_kwargs: dict[str, Any] = _setting({}, "keyword arguments of gymnasium.make")
    # filled by resolve() from the environment
    obs_dim: int = _derived(0, "observation size")
    act_dim: int = _derived(0, "action size")
    max_action: float = _derived(0.0, "action bound")
    max_episode_steps: int = _derived(0, "episode limit")
    shift_per_step: float = _derived(0.0, "fitness_shift as a number ('alive' read off the environment)")
    actor_dim: int = _derived(0, "actor parameter count")
    created_at: float = _derived(0.0, "wall-clock time the run was created")

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_preset(cls, env_id: str, **overrides: Any) -> RunConfig:
        """The preset of `env_id` with `overrides` applied on top."""
        values: dict[str, Any] = {"env_id": env_id}
        values.update(preset_for(env_id))
        # The algorithm's own settings win over the environment preset; options win over both.
        algo = overrides.get("algo") or cls.algo  # the class default when --algo is not given
        values.update(REGISTRY[algo].defaults if algo in REGISTRY else {})
        # a learner's own settings (crossq's wide critic) win over the algorithm's, not over the network sizes
        # an environment's preset sets (the simulation environments' 8-8 actors, Pendulum's 64-64)
        preset = preset_for(env_id)
        learner = LEARNER_DEFAULTS.get(overrides.get("learner") or values.get("learner") or cls.learner, {})
        values.update({k: v for k, v in learner.items() if k not in preset})
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls._from_values(values)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        """A config from a table of fields as a run stored it. A field the table lacks takes its declared
        default, except aesrl's departures (PAPER): a run stored before them ran the paper's values."""
        return cls._from_values({**PAPER, **values})

    @classmethod
    def _from_values(cls, values: dict[str, Any]) -> RunConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in values.items() if k != "spec_hash"}
        for old, (new, readers) in FOLDED_FIELDS.items():
            if old in values:  # a config of a version that had it
                value = values.pop(old)
                if values.get("algo") in readers:
                    values[new] = value
        unknown = sorted(set(values) - known)
        for name in unknown:
            if name in REMOVED_FIELDS:
                raise ConfigError(name, f"this field was removed: {REMOVED_FIELDS[name]}; delete it from the config")
        if unknown:
            near = difflib.get_close_matches(unknown[0], sorted(known), n=1, cutoff=0.75)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(unknown[0], f"unknown field{hint}; known fields: {', '.join(sorted(known))}")
        cfg = cls(**values)
        for name in ("hidden", "critic_hidden"):
            val = getattr(cfg, name)
            if isinstance(val, str):
                val = parse_sizes(name, val)
            setattr(cfg, name, tuple(val) if isinstance(val, list | tuple) else val)
        return cfg

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> RunConfig:
        """Load a TOML or JSON file (a flat table of fields); `env_id` selects the preset."""
        path = Path(path)
        kind = "TOML" if path.suffix == ".toml" else "JSON"
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("file", f"cannot read {path}: {exc}") from None
        try:
            data = tomllib.loads(text) if kind == "TOML" else json.loads(text)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError("file", f"{path} is not valid {kind}: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError("file", f"{path} must hold a table of fields, not a {type(data).__name__}")
        data.update({k: v for k, v in overrides.items() if v is not None})
        env_id = data.pop("env_id", None)
        if env_id is None:
            raise ConfigError("env_id", f"{path} does not name an environment")
        return cls.from_preset(env_id, **data)

    # -- validation ---------------------------------------------------------------------------
    def validate(self) -> RunConfig:
        """Raise ConfigError naming the first bad field; return self when all is well."""
        def need(cond: bool, name: str, msg: str) -> None:
            if not cond:
                raise ConfigError(name, msg)

        def real(val: Any) -> bool:  # a finite int or float, not a bool
            return isinstance(val, int | float) and not isinstance(val, bool) and math.isfinite(val)

        def integer(val: Any) -> bool:  # an int, not a bool
            return isinstance(val, int) and not isinstance(val, bool)

        need(isinstance(self.env_id, str) and bool(self.env_id), "env_id", "must name a gymnasium environment")
        need(self.algo in ALGOS, "algo", f"{self.algo!r} is not one of {', '.join(ALGOS)}")
        need(self.learner in LEARNERS, "learner", f"{self.learner!r} is not one of {', '.join(LEARNERS)}")
        need(self.learner == "td3" or REGISTRY[self.algo].learner, "learner",
             f"--algo {self.algo} trains no critic; a learner applies to "
             f"{', '.join(n for n, a in REGISTRY.items() if a.learner)}")
        need(self.mean_rule in MEAN_RULES, "mean_rule", f"{self.mean_rule!r} is not one of {', '.join(MEAN_RULES)}")
        need(self.var_rule in VAR_RULES, "var_rule", f"{self.var_rule!r} is not one of {', '.join(VAR_RULES)}")
        need(self.r != "auto", "r", "'auto' was removed; use 'adaptive', 'paper' or a number")
        if self.r not in R_MODES:
            need(real(self.r) and self.r > 0, "r", f"must be a positive number or one of {', '.join(R_MODES)}, got {self.r!r}")
        need(isinstance(self.mean_eval_paired, bool), "mean_eval_paired", "must be true or false")
        need(isinstance(self.es_antithetic, bool), "es_antithetic", "must be true or false")
        need(isinstance(self.pair_shift, bool), "pair_shift", "must be true or false")
        if self.run_id:
            need(bool(RUN_ID_RE.match(self.run_id)), "run_id", "use 1-64 letters, digits, '_' or '-'")
            need(self.run_id not in RESERVED_RUN_IDS, "run_id",
                 f"{self.run_id!r} is reserved (its keys would mix with aesrl:{self.run_id}*)")
        for name in ("total_steps", "batch_size", "critic_chunk",
                     "replay_capacity", "mean_eval_episodes", "population", "td3_eval_every", "job_timeout",
                     "failure_ttl", "history_max"):
            val = getattr(self, name)
            need(integer(val) and val > 0, name, f"must be a positive integer, got {val!r}")
        for name in ("initial_steps", "queued_per_worker", "seed", "result_ttl", "critic_lag", "rl_steps_max"):
            val = getattr(self, name)
            need(integer(val) and val >= 0, name, f"must be a non-negative integer, got {val!r}")
        entry = REGISTRY.get(self.algo)
        need(self.rl_steps_max != 0 or entry is None or (entry.tells == "result" and entry.learner), "rl_steps_max",
             "0 (the critic daemon's own actor) needs an asynchronous algorithm with a critic: "
             f"{', '.join(n for n, a in REGISTRY.items() if a.tells == 'result' and a.learner)}")
        for name in ("var_init", "var_floor", "actor_lr", "critic_lr", "fixed_n"):
            val = getattr(self, name)
            need(real(val) and val > 0, name, f"must be a positive number, got {val!r}")
        for name in ("rl_ratio", "gamma", "tau", "negative_ratio"):
            val = getattr(self, name)
            need(real(val) and 0.0 <= val <= 1.0, name, f"must be in [0, 1], got {val!r}")
        for name in ("rl_gain", "policy_noise", "noise_clip", "expl_noise", "job_deadline", "critic_wait"):
            val = getattr(self, name)
            need(real(val) and val >= 0, name, f"must be >= 0, got {val!r}")
        if self.fitness_shift not in SHIFT_MODES:
            need(real(self.fitness_shift) and self.fitness_shift >= 0, "fitness_shift",
                 f"must be a number >= 0 or {' or '.join(map(repr, SHIFT_MODES))}, got {self.fitness_shift!r}")
        need(isinstance(self.critic_shift, bool), "critic_shift", "must be true or false")
        # A switch that is on for an algorithm it does not apply to is a field of another algorithm's
        # config (opo's success rule would count every antithetic pair as one success in two, acemrl
        # ranks a window of single individuals, es has no critic to shift).
        spec = algorithm(self.algo)
        for name, off in SWITCHES.items():
            users = applies_to(name)
            need(getattr(self, name) == off or spec.applies(name), name,
                 f"applies to --algo {' and '.join(users)}, not {self.algo!r}")
        need(real(self.positive_ratio) and 0.0 < self.positive_ratio <= 1.0, "positive_ratio",
             f"must be in (0, 1], got {self.positive_ratio!r}")
        need(self.var_floor <= self.var_init, "var_floor", "must not exceed var_init")
        need(self.population >= 2 and self.population % 2 == 0, "population", "must be an even number >= 2 (antithetic pairs)")
        for name in ("hidden", "critic_hidden"):
            val = getattr(self, name)
            need(isinstance(val, tuple) and len(val) >= 1 and all(integer(h) and h > 0 for h in val),
                 name, f"must be a list of positive layer sizes, got {val!r}")
        for name in ("activation", "critic_activation"):
            val = getattr(self, name)
            need(val in ACTIVATIONS, name, f"{val!r} is not one of {', '.join(ACTIVATIONS)}")
        need(isinstance(self.env_kwargs, dict), "env_kwargs", "must be a table of keyword arguments")
        return self

    def resolve(self) -> RunConfig:
        """Validate, read the dimensions off the environment, and fill run_id and created_at.

        r = "paper" becomes the paper's number for the environment (an error where it gives none)."""
        self.validate()
        if self.r == "paper":
            self.r = self.fitness_scale
        from aesrl_queue.rollout import env_dims  # torch-free: validation stays fast

        try:
            obs_dim, act_dim, max_action, max_steps = env_dims(self.env_id, **self.env_kwargs)
        except (ValueError, ImportError) as exc:  # unknown id; "module:Env-v0" whose module is missing
            raise ConfigError("env_id", str(exc)) from None
        except TypeError as exc:  # the environment does not take these keyword arguments
            raise ConfigError("env_kwargs", f"{self.env_id}: {exc}") from None
        self.obs_dim, self.act_dim, self.max_action = int(obs_dim), int(act_dim), float(max_action)
        self.max_episode_steps = int(max_steps)
        if self.fitness_shift == "alive":
            from aesrl_queue.rollout import alive_bonus

            self.shift_per_step = float(alive_bonus(self.env_id, **self.env_kwargs))
        else:
            self.shift_per_step = float(self.fitness_shift)
        self.actor_dim = actor_param_count(self.obs_dim, self.act_dim, self.hidden)
        if not self.run_id:
            self.run_id = new_run_id(self.env_id, self.algo)
        if not self.created_at:
            self.created_at = time.time()
        return self

    # -- identity -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["hidden"] = list(self.hidden)
        out["critic_hidden"] = list(self.critic_hidden)
        out["spec_hash"] = self.spec_hash
        return out

    @property
    def spec_hash(self) -> str:
        """Hash of what a worker must agree on to evaluate a job: env, dims, networks, protocol.

        Cached: hashed again only when one of those fields changed (resolve() fills the dims)."""
        key = (self.env_id, repr(self.env_kwargs), self.obs_dim, self.act_dim, self.max_action, tuple(self.hidden),
               self.activation, tuple(self.critic_hidden), self.critic_activation, self.learner)
        cached = self.__dict__.get("_spec_hash")
        if cached is not None and cached[0] == key:
            return cached[1]
        value = self._hash_spec()
        self.__dict__["_spec_hash"] = (key, value)
        return value

    def _hash_spec(self) -> str:
        spec = {
            "protocol": 1,
            "env_id": self.env_id,
            "env_kwargs": self.env_kwargs,
            "obs_dim": self.obs_dim,
            "act_dim": self.act_dim,
            "max_action": self.max_action,
            "hidden": list(self.hidden),
            "activation": self.activation,
            "critic_hidden": list(self.critic_hidden),
            "critic_activation": self.critic_activation,
        }
        if self.learner != "td3":  # the critic's kind; td3 runs keep the hash they always had
            spec["learner"] = self.learner
        blob = msgpack.packb(spec, use_bin_type=True)
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def critic_on_request(self) -> bool:
        """CEM-RL, and P-CEM-RL without parallel_critic: the critic trains between generations only."""
        spec = algorithm(self.algo)
        return spec.critic_on_request and not (spec.applies("parallel_critic") and self.parallel_critic)

    def judged(self, ret: float, length: float) -> float:
        """A return as the update rules compare it: less shift_per_step for each step (fitness_shift)."""
        return ret - self.shift_per_step * length if self.shift_per_step else ret

    @property
    def fitness_scale(self) -> float | str:
        """What the AES-RL distribution takes as r: a number or "adaptive" ("paper" resolved)."""
        if self.r == "paper":
            paper = paper_r(self.env_id)
            if paper is None:
                raise ConfigError("r", f"the paper gives no fitness scale for {self.env_id} (it has one for "
                                       f"{', '.join(PAPER_R)}); pass a number or 'adaptive'")
            return paper
        return self.r if isinstance(self.r, str) else float(self.r)


def critic_due(cfg: RunConfig, steps: int) -> int:
    """The critic steps due once `steps` are stored: one per stored step, counted from the end of the
    random phase where the critic daemon trains an actor of its own (rl_steps_max 0), as the learner
    alone trains, and from the first step otherwise."""
    return max(0, steps - cfg.initial_steps) if cfg.rl_steps_max == 0 else steps


def critic_too_far_behind(cfg: RunConfig, steps: int, critic_steps: int) -> bool:
    """Whether the critic trails its schedule (`critic_due`) by more than `critic_lag` after the random
    phase, the condition under which the scheduler holds new jobs (and `run`'s progress line says so)."""
    return bool(cfg.critic_lag) and steps >= cfg.initial_steps and \
        critic_due(cfg, steps) - critic_steps > cfg.critic_lag


def parse_sizes(name: str, text: str) -> tuple[int, ...]:
    """Layer sizes from "400,300" (or "400x300"); ConfigError naming `name` otherwise."""
    try:
        sizes = tuple(int(x) for x in text.replace("x", ",").split(",") if x.strip())
    except ValueError:
        raise ConfigError(name, f"expected layer sizes such as '400,300', got {text!r}") from None
    if not sizes:
        raise ConfigError(name, f"expected layer sizes such as '400,300', got {text!r}")
    return sizes


def new_run_id(env_id: str, algo: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9]", "", env_id.split("-")[0])[:16] or "env"
    return f"{stem}-{algo}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


R_MODES = ("adaptive", "paper")
SHIFT_MODES = ("alive",)
# The fixed fitness scale r the paper gives per environment (its appendix), by env-id stem; selected
# with r = "paper". Pendulum is not in the paper: 200 is this project's old preset, kept selectable.
PAPER_R: dict[str, float] = {"HalfCheetah": 2000.0, "Hopper": 600.0, "Walker2d": 800.0, "Ant": 960.0,
                             "Humanoid": 960.0, "Swimmer": 48.0, "Pendulum": 200.0}

# Per-environment presets (the paper's settings). Keys are env-id stems; v4 and v5 share them.
_PRESETS: dict[str, dict[str, Any]] = {
    "Humanoid": {"hidden": (256, 256), "critic_hidden": (256, 256), "actor_lr": 3e-4, "critic_lr": 3e-4},
    "Swimmer": {"rl_ratio": 0.1},
    # Not in the paper: a fast sanity check. Returns lie in about [-1600, -100]; 200-step episodes,
    # so fewer random steps and smaller networks make it learn in minutes on two cores.
    "Pendulum": {"initial_steps": 2000, "total_steps": 40_000, "hidden": (64, 64), "critic_hidden": (256, 256)},
    # Simulation environments of this project (tests and benchmarks).
    "AesrlNull": {"initial_steps": 0, "total_steps": 10_000, "hidden": (8, 8), "critic_hidden": (16, 16)},
    "AesrlSleep": {"initial_steps": 0, "total_steps": 10_000, "hidden": (8, 8), "critic_hidden": (16, 16)},
    "AesrlNaN": {"initial_steps": 0, "total_steps": 10_000, "hidden": (8, 8), "critic_hidden": (16, 16)},
}
# Fields of earlier versions, taken out of the product (docs/decisions.md, "tried and not adopted"):
# a config that names one fails with this reason instead of a list of the known fields.
REMOVED_FIELDS: dict[str, str] = {
    "r_kinds": "the adaptive r is always the spread of ES individuals' gaps",
    "r_lend_rl": "RL gaps never count towards the fitness scale",
    "r_window": "the adaptive r's window is fitness.R_WINDOW (100 gaps)",
    "r_factor": "the adaptive r is the robust spread itself",
    "rl_action_limit": "RL jobs train all their steps",
    "random_cap": "the random jobs in flight always count towards initial_steps",
    "action_noise": "ES episodes run the deterministic actor",
    "rl_jump": "RL individuals follow the mean rule",
    "rl_actor": "every RL job trains a fresh sample of N(μ, σ²)",
    "rl_line": "an RL job evaluates its trained individual alone",
    "rl_line_store": "an RL job stores its individual's episode alone",
    "rl_eval_pairs": "an RL individual is judged on one start state",
    "rl_var_update": "an RL individual always updates the variance (the paper)",
    "critic_lag_room": "dispatch is always capped by the room under critic_lag",
    "rl_steps_window": "rl_steps is the sum of the last 10 episode lengths (the paper)",
}
# Fields of earlier versions whose value another field now holds: (that field, the algorithms that read
# the old one). A config that names one still loads, with its value moved for those algorithms.
FOLDED_FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "td3_start_steps": ("initial_steps", ("td3",)),
}


def field_docs() -> list[tuple[str, Any, str, bool]]:
    """(name, default, help, departure) of every setting of RunConfig, in declaration order."""
    out = []
    for f in dataclasses.fields(RunConfig):
        if f.metadata.get("derived"):
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        out.append((f.name, default, f.metadata["help"], bool(f.metadata.get("departure"))))
    return out


PAPER_ENVS = ("HalfCheetah", "Hopper", "Walker2d", "Ant", "Humanoid", "Swimmer")


def _stem(env_id: str) -> str:
    return env_id.split(":")[-1].split("-")[0]


def preset_for(env_id: str) -> dict[str, Any]:
    """Preset overrides for an env id such as 'Hopper-v5' or 'Hopper-v4' (empty when unknown)."""
    return dict(_PRESETS.get(_stem(env_id), {}))


def paper_r(env_id: str) -> float | None:
    """The paper's fitness scale for `env_id` (None for an environment it does not cover)."""
    return PAPER_R.get(_stem(env_id))


def load_config_blob(blob: bytes) -> RunConfig:
    """Decode a config written by the store, checking its spec_hash."""
    from aesrl_queue.codec import CodecError, unpack

    data = unpack(blob, what="config")
    stored_hash = data.pop("spec_hash", None)
    try:
        cfg = RunConfig.from_dict(data)
    except (TypeError, ConfigError) as exc:
        raise CodecError(f"config: {exc}") from None
    if stored_hash != cfg.spec_hash:
        raise CodecError(f"config: spec_hash {stored_hash!r} does not match its content ({cfg.spec_hash})")
    return cfg
