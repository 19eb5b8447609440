"""The job: evaluate one ES or RL individual of a run (the job protocol of docs/architecture.md).

`play` is the job itself, a function of explicit inputs (`JobInputs`: the config, the μ/var the
individual is drawn from, the critic, a source of replay states) that returns what it computed
(`Outcome`: returns, f(μ), the episodes to store, an RL job's trained individual). It reads and
writes nothing else, so an in-process executor calls it as RQ's path does.

`evaluate` is RQ's entry point and the tests': it reads the job's inputs from Redis (the primary, or
its host's replica through one reader, workers/replica.py), calls `play`, and writes the outcome with `finish_job`. Jobs carry only
small JSON arguments (run, job, kind, version, seed, spec_hash, rl_steps, random_actions, and mean_eval
false where the job plays no μ episode). What is
dear to rebuild per job (environments, networks, the replay mirror, the critic) is kept per process
in a `_RunContext`, which is why jobs run on a SimpleWorker.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import redis

from aesrl_queue import codec, noise
from aesrl_queue.codec import CodecError
from aesrl_queue.config import RunConfig
from aesrl_queue.connection import FANOUT_ENV, fanout_client, fanout_url
from aesrl_queue.optimizers import needs_critic_daemon
from aesrl_queue.store import (
    CURRENT,
    FANOUT_FIELD,
    OBS,
    REPLAY,
    Fanout,
    Store,
    decode_dist,
    individual_ttl,
    policy_name,
    run_token,
    same_run,
)
from workers.replica import ReplicaReader, reader_for

if TYPE_CHECKING:
    from aesrl_queue.numpy_actor import NumpyActor

log = logging.getLogger(__name__)

# The only functions an AesrlWorker will run (see workers.worker.AllowlistJob).
ALLOWED_FUNCTIONS = ("workers.jobs.evaluate", "workers.jobs.noop")

# Set by AesrlWorker so results and heartbeats name the worker; plain callers get host:pid.
WORKER_NAME = f"{socket.gethostname()}:{os.getpid()}"


class JobRejected(RuntimeError):
    """The job cannot be evaluated here (spec mismatch, missing data); reported as a failed result."""


# -- the job -------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Seeds:
    """Every seed a job uses, derived from its one seed here and nowhere else.

    The same seed gives the same individual, the same training and the same start states, so a job
    evaluated again (replaced, or rebuilt by the scheduler from version and seed) computes the same."""

    noise: int  # ε of z = μ + σ·ε (noise.rebuild; the scheduler rebuilds z from the same seed)
    start: int  # the start state of the individual's episode (and of its antithetic mirror's)
    mean_start: int  # the start state of μ's episode: the individual's (paired) or the next one (unpaired)
    torch: int  # torch's global generator while the actor trains (RL)
    sampler: int  # the generator that draws the replay batches the actor trains on (RL)

    @classmethod
    def of(cls, seed: int, paired: bool) -> Seeds:
        start = seed % (2**31)
        return cls(noise=seed, start=start, mean_start=start if paired else (seed + 1) % (2**31),
                   torch=seed % (2**31), sampler=seed % (2**63))


@dataclasses.dataclass
class JobInputs:
    """Everything a job computes from. `critic`, `sample_states` and `device` matter to RL jobs only,
    `current_mu` to an RL job of an unpaired run (its f(μ) is μ as it is once training is done)."""

    cfg: RunConfig
    kind: str  # "es" or "rl"
    seed: int
    version: int  # the version of μ/var the individual is drawn from
    mu: np.ndarray | None  # None for an RL job of the daemon's actor (rl_steps_max 0): it draws nothing
    var: np.ndarray | None
    rl_steps: int = 0
    random_actions: bool = False
    critic: Any = None  # the critic module the actor trains against (`critic_module`)
    sample_states: Callable[[int, Any], Any] | None = None  # (n, torch generator) -> n replay states
    current_mu: Callable[[], tuple[int, np.ndarray] | None] | None = None
    device: str = "cpu"
    mean_eval: bool = True  # False: the job plays no μ episode (the CEM-RL loops' other members)


@dataclasses.dataclass
class Outcome:
    """What a job computed. `transitions` is the individual's episode (with its mirror's, antithetic),
    `mean_transitions` μ's episodes (None when no μ episode ran): both are data for the replay."""

    fitness: float
    length: int
    f_mu: float
    f_mu_version: int
    eval_steps: int  # the steps of μ's episodes
    transitions: dict[str, np.ndarray]
    mean_transitions: dict[str, np.ndarray] | None
    z: np.ndarray | None = None  # RL: the trained individual
    extra: dict[str, float] = dataclasses.field(default_factory=dict)  # mirror_fitness/len; policy

    @property
    def result(self) -> dict[str, Any]:
        """The fields of the result entry that the job computed."""
        return {"fitness": self.fitness, "len": self.length, "f_mu": self.f_mu, "f_mu_version": self.f_mu_version,
                "eval_steps": self.eval_steps, **self.extra}


def play(inp: JobInputs, actor: NumpyActor | None = None) -> Outcome:
    """The job, top to bottom: seeds → rebuild → train (RL) → episode → f(μ). `actor` is a numpy
    actor of the run's spec to reuse (one is made when None)."""
    from aesrl_queue.rollout import run_episodes

    cfg, kind = inp.cfg, inp.kind
    if actor is None:
        from aesrl_queue.numpy_actor import NetSpec

        actor = NetSpec.from_config(cfg).make_numpy_actor()
    seeds = Seeds.of(inp.seed, cfg.mean_eval_paired)
    # es_antithetic: the job also plays μ − σ·ε from the same start state and stores both episodes;
    # their mean return estimates f(μ) (the first-order terms cancel), so no episode is spent on μ
    antithetic = kind == "es" and cfg.es_antithetic and not inp.random_actions
    extra: dict[str, float] = {}
    behaviour = actor
    if kind == "rl" and cfg.rl_steps_max == 0:  # the critic daemon's own actor, as it published it
        z = daemon_actor(inp.critic, cfg.actor_dim)
        behaviour = PolicyDraws(actor, inp.critic, cfg, np.random.default_rng(seeds.sampler))
    else:
        individual = noise.rebuild(inp.mu, seeds.noise, var=inp.var, antithetic=antithetic)
        z = individual.z
    if kind == "rl" and cfg.rl_steps_max:
        z = train(cfg, z, inp.critic, inp.sample_states, seeds, inp.rl_steps, inp.device)
    actor.set_params(z)
    ep = run_episodes(cfg.env_id, None if inp.random_actions else behaviour, k=1, seed=seeds.start,
                      random_actions=inp.random_actions, store=True, env_kwargs=cfg.env_kwargs)
    fitness, length, transitions = float(ep.returns[0]), int(ep.lengths[0]), ep.transitions
    if antithetic:
        actor.set_params(individual.mirror)
        ep2 = run_episodes(cfg.env_id, actor, k=1, seed=seeds.start, store=True, env_kwargs=cfg.env_kwargs)
        extra.update(mirror_fitness=float(ep2.returns[0]), mirror_len=int(ep2.lengths[0]))
        transitions = {k: np.concatenate([v, ep2.transitions[k]]) for k, v in transitions.items()}
        return Outcome(fitness, length, f_mu=0.5 * (fitness + extra["mirror_fitness"]), f_mu_version=inp.version,
                       eval_steps=0, transitions=transitions, mean_transitions=None, extra=extra)
    # Paired (the default): the μ the individual was drawn from, from the individual's own start
    # state, so that f(z) − f(μ) measures the policy and not the start. Unpaired (the paper): an ES
    # job the μ it read at its start, an RL job, which trained for seconds meanwhile, μ as it is now.
    if (cfg.es_antithetic and cfg.rl_steps_max == 0) or not inp.mean_eval:
        # every episode is an individual's: f(μ) comes from the antithetic pairs alone (the newest), or
        # from the one member of the generation that plays μ (the CEM-RL loops)
        z = z if kind == "rl" else None
        return Outcome(fitness, length, math.nan, -1, 0, transitions, None, z, extra)
    mean = (inp.version, inp.mu) if kind == "es" or cfg.mean_eval_paired else inp.current_mu()
    f_mu, mean_ep = evaluate_mean(cfg, actor, None if mean is None else mean[1], seeds.mean_start)
    z = z if kind == "rl" else None
    if mean_ep is None:  # an unpaired run whose current μ could not be read
        return Outcome(fitness, length, f_mu, -1, 0, transitions, None, z, extra)
    return Outcome(fitness, length, f_mu, f_mu_version=int(mean[0]), eval_steps=mean_ep.steps,
                   transitions=transitions, mean_transitions=mean_ep.transitions, z=z, extra=extra)


def train(cfg: RunConfig, z: np.ndarray, critic: Any, sample_states: Callable[[int, Any], Any] | None,
          seeds: Seeds, steps: int, device: str = "cpu") -> np.ndarray:
    """z after `steps` (at least one) actor steps against `critic`'s Q1, on batches of replay states
    drawn by `sample_states(n, generator)`; seeded by the job's seeds alone, so a job evaluated again
    trains the same actor."""
    import torch

    from aesrl_queue.learners import learner_class
    from aesrl_queue.nets import NetSpec
    from aesrl_queue.td3 import train_actor

    if critic is None or sample_states is None:
        raise JobRejected("an RL job needs a critic and replay states")
    gen = torch.Generator().manual_seed(seeds.sampler)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seeds.torch)
        z = train_actor(z, NetSpec.from_config(cfg), critic, lambda n: sample_states(n, gen), steps=max(1, steps),
                        batch_size=cfg.batch_size, lr=cfg.actor_lr, device=device,
                        betas=learner_class(cfg.learner).betas)
    if not np.all(np.isfinite(z)):
        raise JobRejected("RL training produced non-finite parameters")
    return z


@dataclasses.dataclass
class DaemonPolicy:
    """What the critic daemon publishes when it trains its own actor (rl_steps_max 0): the actor's flat
    parameters and, for a stochastic learner, its log-std network's. An RL job plays it; no torch."""

    actor: np.ndarray
    log_std: np.ndarray | None = None


def daemon_actor(critic: Any, size: int) -> np.ndarray:
    """The actor the critic daemon trains and publishes (rl_steps_max 0)."""
    actor = critic.actor if isinstance(critic, DaemonPolicy) else None
    if actor is None:
        raise JobRejected("the published weights carry no actor (rl_steps_max 0 wants the daemon's)")
    z = codec.check_array(actor, what="daemon actor").reshape(-1)
    if z.size != size:
        raise JobRejected(f"the daemon's actor has {z.size} parameters, the run's actor {size}")
    return z.astype(np.float32, copy=True)


class PolicyDraws:
    """The daemon's actor played as the learner alone explores (rl_steps_max 0), in numpy (no torch). A
    stochastic learner (crossq-sac), whose daemon publishes a log-std network with the actor: each action
    a draw tanh(m + σ·ε)·max_action around the actor's pre-squash output m, σ from that network. A
    deterministic one (td3, crossq), which publishes the actor alone: the actor's action plus Gaussian
    noise of expl_noise·max_action, clipped to the bounds, as the `td3` baseline explores."""

    def __init__(self, actor: NumpyActor, critic: Any, cfg: RunConfig, rng: np.random.Generator) -> None:
        from aesrl_queue.numpy_actor import LOG_STD_MAX, LOG_STD_MIN, NetSpec

        flat = critic.log_std if isinstance(critic, DaemonPolicy) else None
        self.stochastic = flat is not None
        self.mean, self.rng, self.act_dim = actor, rng, actor.act_dim
        self.obs_dim, self.noise = actor.obs_dim, cfg.expl_noise * actor.max_action
        if self.stochastic:
            self.std = NetSpec.from_config(cfg).make_numpy_actor()
            self.std.set_params(flat)
            self.bounds, self._ls = (LOG_STD_MIN, LOG_STD_MAX), np.empty(actor.act_dim, dtype=np.float32)

    def act(self, obs: np.ndarray, out: np.ndarray) -> np.ndarray:
        self.mean.act(obs, out=out)
        if not self.stochastic:
            out += self.rng.normal(0.0, self.noise, size=self.act_dim)
            return np.clip(out, -self.mean.max_action, self.mean.max_action, out=out)
        self.std.act(obs, out=self._ls)
        pre, log_std = self.mean.pre_squash, np.clip(self.std.pre_squash, *self.bounds)
        out[...] = np.tanh(pre + np.exp(log_std) * self.rng.standard_normal(self.act_dim)) * self.mean.max_action
        return out


def evaluate_mean(cfg: RunConfig, actor: NumpyActor, mu: np.ndarray | None, start: int):
    """(f(μ), μ's episodes) over `mean_eval_episodes` episodes, the first from `start`; (NaN, None)
    when there is no μ to evaluate. The episodes' transitions are kept: they are data for the replay."""
    from aesrl_queue.rollout import run_episodes

    if mu is None:
        return float("nan"), None
    actor.set_params(mu)
    ev = run_episodes(cfg.env_id, actor, k=cfg.mean_eval_episodes, seed=start, store=True, env_kwargs=cfg.env_kwargs)
    return float(np.mean(ev.returns)), ev


def critic_module(cfg: RunConfig, weights: dict[str, Any], device: str = "cpu"):
    """What an RL job uses, built from the weights the critic daemon publishes: the critic it trains
    against, or (rl_steps_max 0, the weights hold "actor") the daemon's policy it plays."""
    if "actor" in weights:
        log_std = weights.get("log_std")
        return DaemonPolicy(np.asarray(weights["actor"], dtype=np.float32),
                            None if log_std is None else np.asarray(log_std, dtype=np.float32))
    from aesrl_queue.learners import learner_class
    from aesrl_queue.nets import NetSpec

    return learner_class(cfg.learner).critic_for_actor(NetSpec.from_config(cfg), weights, device)


# -- the RQ path: inputs from Redis, the result to Redis ---------------------------------------------------
class _RunContext:
    """What one worker process keeps for one run between jobs, and how it reads a job's inputs."""

    def __init__(self, client: redis.Redis, run: str) -> None:
        from aesrl_queue.numpy_actor import NetSpec  # torch-free: ES-only workers never import torch

        self.store = Store(client, run)
        self.cfg = self.store.config()
        # A run with a fan-out instance (its state names it) keeps there what hosts read: versions,
        # critic, the replay's observations (docs/decisions.md); this process must be given its URL.
        named = self.store.state_field(FANOUT_FIELD, cast=str, default=None)
        fan = fanout_client() if named else None
        if named and fan is None:
            raise JobRejected(f"run {run} keeps what hosts read on its fan-out instance {named}: give the "
                              f"workers its URL (aesrl-queue worker --fanout-url, or ${FANOUT_ENV})")
        self.fan = None if fan is None else Fanout(self.store, fan)
        # Reads of immutable or versioned data go through one reader: the host's replica when
        # AESRL_READ_URL names one (with a bounded wait, then the fan-out instance, or without one the
        # primary), else the fan-out instance or the primary. The config is read from the primary: a
        # few KB once per run, never an earlier run's of the same id. A process whose host replica
        # follows a fan-out instance reads a run without one from the primary alone.
        if fan is not None:
            self.reader: ReplicaReader = reader_for(fan)
        else:
            self.reader = ReplicaReader(client, None) if fanout_url() else reader_for(client)
        self.token = run_token(self.store.config()).encode()  # what this run's versions and critic carry
        cfg = self.cfg
        self.spec_hash = cfg.spec_hash  # a property that hashes the spec: once per run, not per job
        # The replay's readers are the critic and RL jobs: a run without them stores no transitions.
        self.keeps_replay = needs_critic_daemon(cfg)
        self.actor = NetSpec.from_config(cfg).make_numpy_actor()
        self.mirror = None  # obs-only replay mirror, built on the first RL job
        self.mirror_last = "0-0"
        self.critic = None
        self.critic_version = -1
        self.critic_named = 0  # critic version the primary named at the start of the job
        self.touched = time.monotonic()

    def inputs(self, job: str, kind: str, seed: int, rl_steps: int, random_actions: bool,
               mean_eval: bool = True) -> JobInputs | None:
        """Start `job` and read what it computes from; None if the job is no longer wanted."""
        info = codec.pack({"worker": WORKER_NAME, "host": socket.gethostname(), "pid": os.getpid(), "t": time.time()})
        # an RL job of the daemon's actor plays that actor: μ/var (2 × the actor's bytes) stay unread
        started = self.begin(job, info, dist=not (kind == "rl" and self.cfg.rl_steps_max == 0))
        if started is None:
            return None
        version, mu, var = started
        inp = JobInputs(self.cfg, kind, seed, version, mu, var, rl_steps, random_actions,
                        current_mu=self.read_current_mu, mean_eval=mean_eval)
        if kind == "rl":
            # an RL job that trains uses torch, a device and replay states; one that plays the daemon's
            # actor needs none of them
            inp.device = _device() if self.cfg.rl_steps_max else "cpu"
            inp.critic = self.load_critic(inp.device)
            if self.cfg.rl_steps_max:
                inp.sample_states = self.replay_states(inp.device)
        return inp

    def begin(self, job: str, info: bytes, dist: bool = True) -> tuple[int, np.ndarray | None, np.ndarray | None] | None:
        """Start `job` on the primary: (version, μ, var) of the version it uses (μ and var None without
        `dist`: a job that draws nothing from them), None if no longer wanted."""
        store = self.store
        started = store.start_job(job, info)
        if not started:
            return None
        version = int(started[0])
        self.critic_named = int(started[1] or 0)
        tag = started[2] if len(started) > 2 else None
        if tag is not None and not same_run(tag, self.token):  # the run was started over under this id
            raise StaleContext(store.run_id)
        if not dist:
            return version, None, None
        mu, var = self.reader.dist(store, version, tag=tag)
        return (version, *decode_dist(version, mu, var, self.cfg.actor_dim))

    def read_current_mu(self) -> tuple[int, np.ndarray] | None:
        """The current version and its μ (from the replica when there is one: possibly a little older)."""
        store = self.store
        got = self.reader.read(store.read_current_mu if self.fan is None
                               else lambda c: store.read_current_mu(c, pointer=CURRENT))
        if not got or got[1] is None:
            return None
        return int(got[0]), codec.decode_array(got[1], size=self.cfg.actor_dim, what="current mu")

    def replay_states(self, device: str) -> Callable[[int, Any], Any]:
        """The replay states an RL job trains on: the mirror, brought up to date, sampled uniformly."""
        self.sync_mirror(device)
        held = 0 if self.mirror is None else len(self.mirror)
        if held < self.cfg.batch_size:
            raise JobRejected(f"replay holds {held} states, fewer than a batch of {self.cfg.batch_size}")
        mirror = self.mirror
        return lambda n, gen: mirror.sample(n, generator=gen)["obs"]

    def sync_mirror(self, device: str = "cpu") -> int:
        """Append the replay entries stored since the last job (incremental, obs only)."""
        from aesrl_queue.td3 import ReplayBuffer

        if self.mirror is None:
            self.mirror = ReplayBuffer(self.cfg.obs_dim, self.cfg.act_dim, self.cfg.replay_capacity,
                                       device=device, obs_only=True)
        added = 0
        stream = REPLAY if self.fan is None else OBS  # a fan-out instance holds the observations alone
        while True:
            rows = self.reader.read(lambda c: self.store.read_stream(stream, self.mirror_last, count=500, client=c),
                                    append_only=True)
            if not rows:
                return added
            for entry_id, fields in rows:
                self.mirror_last = entry_id
                try:
                    ep = self.store.decode_episode(entry_id, fields, obs_only=True)
                except CodecError as exc:
                    log.warning("skipping a malformed replay entry: %s", exc)
                    continue
                self.mirror.add_batch(ep["obs"])
                added += len(ep["obs"])

    def load_critic(self, device: str):
        """The published critic (the one the primary named, through the reader), rebuilt when its version moved."""
        version = self.critic_named
        if version <= 0:
            raise JobRejected("no critic has been published yet; RL jobs need one")
        if version != self.critic_version:
            try:
                version, blob = self.reader.critic(self.store, at_least=version, tag=self.token)
            except CodecError:
                raise JobRejected("critic weights are missing") from None
            weights = codec.unpack(blob, what="critic weights")
            for k, v in weights.items():
                codec.check_array(v, what=f"critic weight {k}")
            self.critic, self.critic_version = critic_module(self.cfg, weights, device), version
        return self.critic

    def finish(self, job: str, base: dict[str, Any], out: Outcome, t0: float) -> None:
        """Store the job's episodes and append its result, in one atomic step. A run that keeps a
        replay stores μ's episodes as their own entry after the individual's, and counts them as
        stored steps; a run without one stores nothing and counts μ's steps as interactions only."""
        cfg, store = self.cfg, self.store
        ind_key = ""
        if out.z is not None:
            # the daemon's actor (rl_steps_max 0) as it published it: copied inside Redis from the daemon's
            # key of the version this job played, uploaded only when that version is gone
            copy_of = policy_name(self.critic_version) if cfg.rl_steps_max == 0 else None
            if copy_of is not None:
                out.extra["policy"] = self.critic_version
            ind_key = store.put_individual(job, out.z, ttl=individual_ttl(cfg), copy_of=copy_of)
        fields = dict(base, status="ok", **out.result, ind=ind_key, duration=time.monotonic() - t0)
        more = [(f"{job}:mu", out.mean_transitions)] if self.keeps_replay and out.mean_transitions is not None else []
        store.finish_job(out.transitions, job, fields, extra_interactions=0 if self.keeps_replay else out.eval_steps,
                         keep=self.keeps_replay, more=more)
        if self.fan is not None and self.keeps_replay and cfg.rl_steps_max:
            # The observations RL jobs sample (those that train: the daemon's own actor samples none), after
            # the result: a job that dies between the two leaves fewer states to sample, never a result
            # counted twice.
            try:
                self.fan.append_obs([(job, out.transitions), *more])
            except (redis.RedisError, OSError) as exc:
                log.warning("job %s: its observations did not reach the fan-out instance: %s", job, exc)


_CONTEXTS: dict[tuple[int, str], _RunContext] = {}


class StaleContext(Exception):
    """The run this process keeps a context for was deleted and started over under the same id."""


def _context(client: redis.Redis, run: str, fresh: bool = False) -> _RunContext:
    key = (id(client), run)
    ctx = None if fresh else _CONTEXTS.get(key)
    if ctx is None:
        # Keep few runs' state per process: a shared pool of workers may serve several runs.
        if len(_CONTEXTS) >= 4:
            oldest = min(_CONTEXTS, key=lambda k: _CONTEXTS[k].touched)
            del _CONTEXTS[oldest]
        ctx = _CONTEXTS[key] = _RunContext(client, run)
    ctx.touched = time.monotonic()
    return ctx


def _connection() -> redis.Redis:
    from rq import get_current_job

    job = get_current_job()
    if job is not None:
        return job.connection
    from aesrl_queue.connection import connect

    return connect()


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def noop(run: str = "", job: str = "") -> dict[str, Any]:
    """A job that does nothing: the reference for queue-overhead benchmarks."""
    return {"job": job}


def evaluate(
    run: str,
    job: str,
    kind: str,
    version: int,
    seed: int,
    spec_hash: str,
    rl_steps: int = 0,
    random_actions: bool = False,
    client: redis.Redis | None = None,
    mean_eval: bool = True,
) -> dict[str, Any]:
    """Evaluate one individual of `run` and append its result to the run's results stream (RQ's entry
    point; `client` is RQ's connection unless given). A job that fails is reported as a failed result
    and raises, so that RQ records it failed too."""
    t0 = time.monotonic()
    base = {"job": job, "kind": kind, "version": int(version), "seed": int(seed), "worker": WORKER_NAME,
            "spec_hash": spec_hash}
    client = client or _connection()
    store = None
    try:
        if kind not in ("es", "rl"):
            raise JobRejected(f"job kind {kind!r} is not es/rl")
        ctx = _context(client, run)
        if spec_hash != ctx.spec_hash and run_token(Store(client, run).config()).encode() != ctx.token:
            ctx = _context(client, run, fresh=True)  # the run was started over under this id
        store = ctx.store
        if spec_hash != ctx.spec_hash:
            raise JobRejected(
                f"spec_hash {spec_hash} of the job does not match run {run}'s {ctx.cfg.spec_hash}: "
                "the worker and the scheduler disagree on environment or network shape"
            )
        try:
            inp = ctx.inputs(job, kind, int(seed), int(rl_steps), bool(random_actions), bool(mean_eval))
        except StaleContext:  # started over under this id: its config, versions and critic are its own
            log.info("run %s was started over; reading its config again", run)
            ctx = _context(client, run, fresh=True)
            store = ctx.store
            inp = ctx.inputs(job, kind, int(seed), int(rl_steps), bool(random_actions), bool(mean_eval))
        if inp is None:
            log.info("job %s is no longer in flight (replaced or run over); skipped", job)
            return {"job": job, "skipped": True}
        base["version"] = inp.version
        out = play(inp, ctx.actor)
        ctx.finish(job, base, out, t0)
        return {"job": job, "fitness": out.fitness, "len": out.length, "f_mu": out.f_mu, **out.extra}
    except Exception as exc:
        log.warning("job %s of run %s failed: %s", job, run, exc)
        if store is None:
            try:
                store = Store(client, run)
                store.config()
            except Exception:  # the run itself is unreadable: nothing to report to
                raise exc from None
        fields = dict(base, status="failed", error=f"{type(exc).__name__}: {exc}"[:2000],
                      duration=time.monotonic() - t0)
        if not isinstance(exc, JobRejected | CodecError | ValueError):
            fields["error"] += "\n" + traceback.format_exc(limit=5)[-1500:]
        store.append_result(fields)
        raise
