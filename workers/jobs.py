"""The RQ job functions: evaluate one ES or RL individual of a run and report (the job protocol of
docs/architecture.md).

Jobs carry only small JSON arguments (run, job, kind, version, seed, spec_hash, rl_steps); the
parameters come from Redis. Per-process state (environments, networks, replay mirror, critic)
is kept between jobs, which is why these run on a SimpleWorker.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import traceback
from typing import Any

import numpy as np
import redis

from aesrl_queue import codec, noise
from aesrl_queue.codec import CodecError
from aesrl_queue.config import load_config_blob
from aesrl_queue.optimizers import needs_critic_daemon
from aesrl_queue.store import Store, decode_dist
from workers.replica import ReplicaReader, reader_for

log = logging.getLogger(__name__)

# The only functions an AesrlWorker will run (see workers.worker.AllowlistJob).
ALLOWED_FUNCTIONS = ("workers.jobs.evaluate", "workers.jobs.noop")

# Set by AesrlWorker so results and heartbeats name the worker; plain callers get host:pid.
WORKER_NAME = f"{socket.gethostname()}:{os.getpid()}"

class JobRejected(RuntimeError):
    """The job cannot be evaluated here (spec mismatch, missing data); reported as a failed result."""


class _RunContext:
    """What one worker process keeps for one run between jobs."""

    def __init__(self, client: redis.Redis, run: str) -> None:
        from aesrl_queue.numpy_actor import NetSpec  # torch-free: ES-only workers never import torch

        self.store = Store(client, run)
        # Reads of immutable or versioned data go to a local replica when AESRL_READ_URL names one.
        self.reader: ReplicaReader | None = reader_for(client)
        if self.reader is not None:
            self.store._config = load_config_blob(self.reader.config_blob(self.store))
        self.cfg = self.store.config()
        cfg = self.cfg
        self.spec_hash = cfg.spec_hash  # a property that hashes the spec: once per run, not per job
        # The replay's readers are the critic and RL jobs: a run without them stores no transitions.
        self.keeps_replay = needs_critic_daemon(cfg)
        self.spec = NetSpec.from_config(cfg)
        self.actor = self.spec.make_numpy_actor()
        self.mirror = None  # obs-only replay mirror, built on the first RL job
        self.mirror_last = "0-0"
        self.critic = None
        self.critic_version = -1
        self.critic_named = 0  # critic version the primary named at the start of the job (replica reads)
        self.touched = time.monotonic()

    def begin(self, job: str, info: bytes) -> tuple[int, np.ndarray, np.ndarray] | None:
        """Start `job` on the primary: (version, μ, var) of the version it uses, None if no longer wanted."""
        store = self.store
        started = store.start_job(job, info)
        if not started:
            return None
        version = int(started[0])
        self.critic_named = int(started[1] or 0)
        if self.reader is None:
            mu, var = store.dist_blobs(version) or (None, None)
        else:
            mu, var = self.reader.dist(store, version)
        return (version, *decode_dist(version, mu, var, self.cfg.actor_dim))

    def read_current_mu(self) -> tuple[int, np.ndarray] | None:
        """The current version and its μ (from the replica when there is one: possibly a little older)."""
        got = self.store.read_current_mu() if self.reader is None else self.reader.read(self.store.read_current_mu)
        if not got or got[1] is None:
            return None
        return int(got[0]), codec.decode_array(got[1], size=self.cfg.actor_dim, what="current mu")

    # -- replay mirror ----------------------------------------------------------------------------
    def sync_mirror(self, device: str = "cpu") -> int:
        """Append the replay entries stored since the last job (incremental, obs only)."""
        from aesrl_queue.td3 import ReplayBuffer

        if self.mirror is None:
            self.mirror = ReplayBuffer(self.cfg.obs_dim, self.cfg.act_dim, self.cfg.replay_capacity,
                                       device=device, obs_only=True)
        added = 0
        while True:
            if self.reader is None:
                rows = self.store.read_stream("replay", self.mirror_last, count=500)
            else:
                rows = self.reader.read(lambda c: self.store.read_stream("replay", self.mirror_last, count=500, client=c),
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

    def torch_spec(self):
        """The spec with the torch builders (RL jobs only: ES-only workers never import torch)."""
        from aesrl_queue.nets import NetSpec

        return NetSpec.from_config(self.spec)

    def load_critic(self, device: str):
        version = self.store.critic_version() if self.reader is None else self.critic_named
        if version <= 0:
            raise JobRejected("no critic has been published yet; RL jobs need one")
        if version != self.critic_version:
            if self.reader is None:
                got = self.store.read_critic()
            else:
                got = self.reader.critic(self.store, at_least=version)
                got = (got[0], codec.unpack(got[1], what="critic weights"))
            if got is None:
                raise JobRejected("critic weights are missing")
            version, weights = got
            from aesrl_queue.learners import learner_class

            critic = learner_class(self.cfg.learner).critic_for_actor(self.torch_spec(), weights, device)
            self.critic, self.critic_version = critic, version
        return self.critic


    def train(self, z: np.ndarray, seed: int, steps: int) -> np.ndarray:
        """An RL job's individual: z after `steps` actor steps against the run's critic, on states
        of the replay. Seeded by the job seed alone, so a job evaluated again trains the same actor."""
        import torch

        from aesrl_queue.learners import learner_class
        from aesrl_queue.td3 import train_actor

        device = _device()
        critic = self.load_critic(device)
        self.sync_mirror(device)
        if self.mirror is None or len(self.mirror) < self.cfg.batch_size:
            raise JobRejected(f"replay holds {0 if self.mirror is None else len(self.mirror)} states, "
                              f"fewer than a batch of {self.cfg.batch_size}")
        gen = torch.Generator().manual_seed(seed % (2**63))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed % (2**31))
            z = train_actor(z, self.torch_spec(), critic, lambda n: self.mirror.sample(n, generator=gen)["obs"],
                            steps=max(1, steps), batch_size=self.cfg.batch_size, lr=self.cfg.actor_lr,
                            device=device, betas=learner_class(self.cfg.learner).betas)
        if not np.all(np.isfinite(z)):
            raise JobRejected("RL training produced non-finite parameters")
        return z

    def evaluate_mean(self, kind: str, version: int, mu: np.ndarray, seed: int) -> tuple[float, int, int]:
        """(f(μ), the version of that μ, its steps) for the scheduler's update rule.

        Paired (the default): the μ the individual was drawn from, already in memory, first from the
        individual's own start state, so that f(z) − f(μ) measures the policy and not the start.
        Unpaired (the paper): an ES job evaluates the μ it read at its start, an RL job, which trained
        for seconds meanwhile, the mean as it is now, from other start states."""
        from aesrl_queue.rollout import run_episodes

        cfg = self.cfg
        got = (version, mu) if kind == "es" or cfg.mean_eval_paired else self.read_current_mu()
        if not got or got[1] is None:
            return float("nan"), -1, 0
        self.actor.set_params(got[1])
        eval_seed = seed if cfg.mean_eval_paired else seed + 1
        ev = run_episodes(cfg.env_id, self.actor, k=cfg.mean_eval_episodes, seed=eval_seed % (2**31),
                          store=False, env_kwargs=cfg.env_kwargs)
        return float(np.mean(ev.returns)), int(got[0]), int(sum(ev.lengths))

_CONTEXTS: dict[tuple[int, str], _RunContext] = {}


def _context(client: redis.Redis, run: str) -> _RunContext:
    key = (id(client), run)
    ctx = _CONTEXTS.get(key)
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
) -> dict[str, Any]:
    """Evaluate one individual of `run` and append its result to the run's results stream."""
    client = _connection()
    return run_job(client, run, job, kind, version, seed, spec_hash, rl_steps, random_actions)


def run_job(
    client: redis.Redis,
    run: str,
    job: str,
    kind: str,
    version: int,
    seed: int,
    spec_hash: str,
    rl_steps: int = 0,
    random_actions: bool = False,
) -> dict[str, Any]:
    t0 = time.monotonic()
    base = {"job": job, "kind": kind, "version": int(version), "seed": int(seed), "worker": WORKER_NAME,
            "spec_hash": spec_hash}
    store = None
    try:
        if kind not in ("es", "rl"):
            raise JobRejected(f"job kind {kind!r} is not es/rl")
        ctx = _context(client, run)
        store = ctx.store
        if spec_hash != ctx.spec_hash:
            raise JobRejected(
                f"spec_hash {spec_hash} of the job does not match run {run}'s {ctx.cfg.spec_hash}: "
                "the worker and the scheduler disagree on environment or network shape"
            )
        return _evaluate(ctx, base, kind, int(seed), int(rl_steps), bool(random_actions), t0)
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


def _evaluate(ctx: _RunContext, base: dict, kind: str, seed: int, rl_steps: int, random_actions: bool,
              t0: float) -> dict[str, Any]:
    """Rebuild the individual, train it (RL), run its episode, estimate f(μ), store and report."""
    from aesrl_queue.rollout import run_episodes

    cfg, store, job = ctx.cfg, ctx.store, base["job"]
    info = codec.pack({"worker": WORKER_NAME, "host": socket.gethostname(), "pid": os.getpid(), "t": time.time()})
    started = ctx.begin(job, info)
    if started is None:
        log.info("job %s is no longer in flight (replaced or run over); skipped", job)
        return {"job": job, "skipped": True}
    version, mu, var = started
    base["version"] = version
    # es_antithetic: the job also evaluates μ − σ·ε from the same start state and stores both
    # episodes; their mean return estimates f(μ) (the first-order terms cancel), so no episode is
    # spent on μ alone
    antithetic = kind == "es" and cfg.es_antithetic and not random_actions
    individual = noise.rebuild(mu, seed, var=var, antithetic=antithetic)
    z, ind_key, extra = individual.z, "", {}
    if kind == "rl":
        z = ctx.train(z, seed, rl_steps)
        ind_key = store.put_individual(job, z, ttl=max(600, cfg.job_timeout))
        extra["dist_after"] = float(np.linalg.norm(z.astype(np.float64) - mu))
    start_state = seed % (2**31)
    ctx.actor.set_params(z)
    ep = run_episodes(cfg.env_id, None if random_actions else ctx.actor, k=1, seed=start_state,
                      random_actions=random_actions, store=True, env_kwargs=cfg.env_kwargs)
    fitness, length, transitions = float(ep.returns[0]), int(ep.lengths[0]), ep.transitions
    mirror = {}
    if antithetic:
        ctx.actor.set_params(individual.mirror)
        ep2 = run_episodes(cfg.env_id, ctx.actor, k=1, seed=start_state, store=True, env_kwargs=cfg.env_kwargs)
        mirror = {"mirror_fitness": float(ep2.returns[0]), "mirror_len": int(ep2.lengths[0])}
        transitions = {k: np.concatenate([v, ep2.transitions[k]]) for k, v in transitions.items()}
        f_mu, f_mu_version, eval_steps = 0.5 * (fitness + mirror["mirror_fitness"]), version, 0
    else:
        f_mu, f_mu_version, eval_steps = ctx.evaluate_mean(kind, version, mu, seed)
    fields = dict(base, status="ok", fitness=fitness, len=length, f_mu=f_mu, f_mu_version=f_mu_version,
                  ind=ind_key, eval_steps=eval_steps, duration=time.monotonic() - t0, **mirror, **extra)
    store.finish_job(transitions, job, fields, extra_interactions=eval_steps, keep=ctx.keeps_replay)
    return {"job": job, "fitness": fitness, "len": length, "f_mu": f_mu, **mirror}
