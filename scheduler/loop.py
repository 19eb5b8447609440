"""The asynchronous AES-RL scheduler: owns μ/var and counters, tags each new job ES or RL with the
P controller, and applies every result exactly once the moment it arrives (DESIGN.md §4).

It keeps its state in Redis so that a restart with the same run id continues where it stopped.
"""

from __future__ import annotations

import logging
import math
import random
import signal
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import redis

from aesrl_queue import codec, kernels
from aesrl_queue.codec import CodecError
from aesrl_queue.config import RunConfig
from aesrl_queue.connection import wait_until_reachable, without_retries
from aesrl_queue.controller import RLController
from aesrl_queue.distributions import make_distribution
from aesrl_queue.nets import init_actor_params
from aesrl_queue.store import Result, Store
from scheduler.common import Dispatcher, DistCache, finite, job_seed, pack_dist_state

log = logging.getLogger(__name__)

ASYNC_ALGOS = ("aesrl", "es", "opo", "acemrl")


def build_distribution(cfg: RunConfig, mu: np.ndarray):
    """The search distribution an asynchronous algorithm uses, from the config."""
    if cfg.algo in ("aesrl", "es"):
        return make_distribution("aesrl", mu, mean_rule=cfg.mean_rule, var_rule=cfg.var_rule, r=cfg.fitness_scale,
                                 negative_ratio=cfg.negative_ratio, fixed_n=cfg.fixed_n,
                                 var_init=cfg.var_init, var_floor=cfg.var_floor, r_window=cfg.r_window,
                                 r_factor=cfg.r_factor)
    if cfg.algo == "opo":
        return make_distribution("opo", mu, var_init=cfg.var_init, var_floor=cfg.var_floor)
    if cfg.algo == "acemrl":
        return make_distribution("acem", mu, var_init=cfg.var_init)
    raise ValueError(f"algo {cfg.algo!r} has no asynchronous distribution; use one of {', '.join(ASYNC_ALGOS)}")


def uses_rl(cfg: RunConfig) -> bool:
    return cfg.algo != "es" and cfg.rl_ratio > 0


class AsyncScheduler:
    """One run's asynchronous loop. `run()` returns when the budget is reached or stop() is called."""

    def __init__(self, client: redis.Redis, blocking_client: redis.Redis, cfg: RunConfig,
                 stop_event: threading.Event | None = None, drain_timeout: float | None = None) -> None:
        self.r = client
        self.rb = blocking_client
        # The apply's MULTI/EXEC must never be resent (a resend after a lost reply would apply a
        # batch twice); a dropped link raises instead and run() resumes from what Redis holds.
        self.r_once = without_retries(client)
        self.cfg = cfg
        self.store = Store(client, cfg.run_id)
        self.stop_event = stop_event or threading.Event()
        self.drain_timeout = drain_timeout
        self.dists = DistCache(self.store)
        self.rng = random.Random()
        self._warned_no_critic = 0.0
        self._critic_wait_since: float | None = None
        self._kept: set[int] = set()  # superseded versions still in Redis because a job uses them
        self._to_delete: list[str] = []  # dist:{v} keys found unreferenced, deleted with the next write
        # Stored steps/interactions as last seen: results carry the counters after their episode
        # was stored, so the loop needs no read per result; refreshed from Redis when idle.
        self._steps = 0
        self._interactions = 0
        self._counts_read_at = 0.0
        self._critic_ready = False
        self._told = 0  # results passed to the distribution's tell (this process)
        if cfg.algo in ("aesrl", "es"):
            kernels.compiled()  # load (or compile, once per machine) the update before the first result

    # -- set-up and restart ------------------------------------------------------------------------
    def setup(self) -> None:
        cfg, store = self.cfg, self.store
        created = store.write_config(cfg)
        if not created:
            self.cfg = cfg = store.config()
        state = store.state()
        if state["version"] == 0 and not self.r.exists(store.key("dist:0")):
            mu0 = init_actor_params(cfg.obs_dim, cfg.act_dim, cfg.max_action, tuple(cfg.hidden), cfg.activation,
                                    seed=cfg.seed)
            self.dist = build_distribution(cfg, mu0)
            pipe = self.r.pipeline()
            store.publish_dist(0, self.dist.mean, self.dist.var, pipe=pipe)
            store.set_state(pipe=pipe, version=0, f_mu=math.nan, f_mu_version=-1, n_rl=1, n_es=1,
                            best_fitness=-math.inf, last_result_id="0-0", started_at=time.time(),
                            status="running", recent_lens=codec.pack([]).hex(), updated_at=time.time())
            pipe.set(store.key("dist_state"), pack_dist_state(self.dist.state()))
            pipe.execute()
            log.info("run %s: created μ₀ (%d parameters) and var₀ = %g", cfg.run_id, cfg.actor_dim, cfg.var_init)
        else:
            self._restore(state)
        self.dispatch = Dispatcher(self.r, store, cfg)
        state = store.state()
        self.version = state["version"]
        self.last_id = state.get("last_result_id", "0-0") or "0-0"
        self.f_mu = state.get("f_mu", math.nan)
        self.f_mu_version = state.get("f_mu_version", -1)
        self.best = state.get("best_fitness", -math.inf)
        self._dispatched = int(state.get("dispatched", 0))  # only this loop writes it
        # Counters only this loop writes: kept here and written as values with the rest of the
        # state (one HSET per batch instead of an HINCRBY per counter and result).
        self._applied = {name: int(state.get(name, 0)) for name in ("results_applied", "es_applied", "rl_applied")}
        self._batch_state: dict[str, Any] | None = None
        self._batch_forget: list[str] = []
        self._steps, self._interactions = int(state.get("steps", 0)), int(state.get("interactions", 0))
        # The best non-random individual's parameters are kept in `best` for `aesrl-queue export --which best`.
        self.best_kept = float(self.r.hget(store.key("best"), "fitness") or "-inf")
        self.controller = RLController(target=cfg.rl_ratio if uses_rl(cfg) else 0.0, gain=cfg.rl_gain,
                                       initial_steps=cfg.initial_steps)
        self.controller.load_state({"n_rl": max(1, state.get("n_rl", 1)), "n_es": max(1, state.get("n_es", 1))})
        try:
            self.recent_lens = deque(codec.unpack(bytes.fromhex(state.get("recent_lens", "")), expect_map=False),
                                     maxlen=cfg.rl_steps_window)
        except (CodecError, ValueError):
            self.recent_lens = deque(maxlen=cfg.rl_steps_window)
        self.dists.put(self.version, self.dist.mean.copy(), self.dist.var.copy())
        # Superseded versions left in Redis by an earlier incarnation are deleted once unreferenced.
        for key in self.r.scan_iter(match=store.key("dist:*"), count=1000):
            v = int(key.decode().rsplit(":", 1)[1])
            if v != self.version:
                self._kept.add(v)
        store.set_status("running")

    def _restore(self, state: dict[str, Any]) -> None:
        cfg, store = self.cfg, self.store
        version = state["version"]
        mu, var = store.read_dist(version)
        self.dist = build_distribution(cfg, mu)
        extra = codec.unpack(self.r.get(store.key("dist_state")), what="dist_state")
        extra.update({"mean": mu, "var": var, "version": version})
        self.dist.load_state(extra)
        log.info("run %s: resumed at version %d, %d steps stored, %d results applied", cfg.run_id, version,
                 state["steps"], state["results_applied"])

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> str:
        self.setup()
        while True:
            try:
                return self._loop()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                # Redis was away for longer than the clients' own retries. This process may hold
                # state that never reached Redis (a write that did not land): wait, then carry on
                # from what Redis holds, exactly as a restarted scheduler does.
                if not wait_until_reachable(self.r, f"scheduler of run {self.cfg.run_id}", exc, self.stop_event):
                    return "stopped"
                self.dispatch.noise_ahead.close()
                self.dists = DistCache(self.store)  # may hold versions that never reached Redis
                self.setup()

    def _loop(self) -> str:
        cfg = self.cfg
        drain_started = None
        status = "running"
        while True:
            if self.stop_event.is_set():
                self.store.set_status("stopped")
                log.info("run %s: stopped on request; in-flight jobs stay registered for a restart", cfg.run_id)
                return "stopped"
            steps = self._stored_steps()
            if status == "running" and steps >= cfg.total_steps:
                status = "draining"
                drain_started = time.monotonic()
                self.store.set_status("draining")
                log.info("run %s: budget of %d steps reached; draining %d jobs", cfg.run_id, cfg.total_steps,
                         len(self.dispatch.inflight))
            if status == "running":
                self._fill(steps)
            elif not self.dispatch.inflight or (
                time.monotonic() - drain_started > (self.drain_timeout or self.dispatch.deadline("rl"))
            ):
                left = list(self.dispatch.inflight)
                self.dispatch.forget(left)
                self._flush_deletes()
                self.dispatch.noise_ahead.close()
                self.store.set_state(status="finished", finished_at=time.time(), updated_at=time.time())
                log.info("run %s: finished (%d jobs abandoned at the end)", cfg.run_id, len(left))
                return "finished"
            batch = self.dispatch.read(self.last_id, 500, self.rb)
            if batch:
                # Every result read together is applied in one MULTI/EXEC, with the jobs that refill
                # the freed slots: one round trip per batch, and μ/var published once per batch.
                self._apply_batch(batch, refill=status == "running")
            self._replace_lost()

    def _stored_steps(self, max_age: float = 1.0) -> int:
        """Stored env steps: from the results seen, re-read from Redis at most every `max_age` s."""
        now = time.monotonic()
        if now - self._counts_read_at > max_age:
            steps, inter = self.r.hmget(self.store.key("state"), ["steps", "interactions"])
            self._steps = max(self._steps, int(steps or 0))
            self._interactions = max(self._interactions, int(inter or 0))
            self._counts_read_at = now
        return self._steps

    def _critic_published(self) -> bool:
        if not self._critic_ready:
            self._critic_ready = self.store.critic_version() > 0
        return self._critic_ready

    def _fill(self, steps: int, pipe=None) -> None:
        cfg = self.cfg
        want = self.dispatch.target_inflight() - len(self.dispatch.inflight)
        if want <= 0:
            return
        # Do not start jobs whose episodes would certainly overshoot the budget.
        mean_len = (sum(self.recent_lens) / len(self.recent_lens)) if self.recent_lens else 1
        if steps + len(self.dispatch.inflight) * mean_len >= cfg.total_steps:
            return
        rl_ready = uses_rl(cfg) and self._critic_published()
        # A critic cannot train before the replay holds a batch: never wait for one before that,
        # even when the random phase is shorter (initial_steps 0 would otherwise wait critic_wait).
        if uses_rl(cfg) and not rl_ready and steps >= max(cfg.initial_steps, cfg.batch_size):
            # The random phase is over but no critic exists yet: hold new jobs for a while rather
            # than spend the budget on ES alone (a critic daemon needs seconds to start and train).
            now = time.monotonic()
            if self._critic_wait_since is None:
                self._critic_wait_since = now
                log.info("run %s: initial phase over; waiting up to %.0fs for the first critic", cfg.run_id,
                         cfg.critic_wait)
            if now - self._critic_wait_since < cfg.critic_wait:
                return
        state_n = self._dispatched
        specs, incr = [], {"dispatched": 0, "n_rl": 0, "n_es": 0}
        for i in range(want):
            n = state_n + i + 1
            seed = job_seed(cfg.seed, n)
            u = random.Random(seed).random()
            kind = "es"
            if rl_ready:
                before = (self.controller.n_rl, self.controller.n_es)
                kind = self.controller.choose(steps, u)
                incr["n_rl"] += self.controller.n_rl - before[0]
                incr["n_es"] += self.controller.n_es - before[1]
            else:
                # No critic yet: ES only, and uncounted, so the controller does not start with a
                # backlog of ES dispatches that it would then repay with a burst of RL jobs.
                self._maybe_warn_no_critic(steps)
            rl_steps = min(cfg.rl_steps_max, sum(self.recent_lens) or cfg.max_episode_steps) if kind == "rl" else 0
            specs.append({"kind": kind, "version": self.version, "seed": seed, "n": n, "rl_steps": rl_steps,
                          "random": uses_rl(cfg) and steps < cfg.initial_steps})
            incr["dispatched"] += 1
        counts = {"dispatched": self._dispatched + incr["dispatched"], "n_rl": self.controller.n_rl,
                  "n_es": self.controller.n_es}
        if self._batch_state is not None:  # inside _apply_batch: one state HSET at its end
            self._batch_state.update(counts)
            self.dispatch.enqueue(specs, pipe=pipe)
        else:
            self.dispatch.enqueue(specs, state_fields=counts, pipe=pipe)
        self._dispatched = counts["dispatched"]

    def _maybe_warn_no_critic(self, steps: int) -> None:
        if uses_rl(self.cfg) and steps >= self.cfg.initial_steps:
            now = time.monotonic()
            if now - self._warned_no_critic > 60:
                self._warned_no_critic = now
                log.warning("run %s: %d steps stored but no critic published yet — is `aesrl-queue critic start "
                            "--run %s` running? dispatching ES jobs meanwhile", self.cfg.run_id, steps,
                            self.cfg.run_id)

    # -- applying one result -----------------------------------------------------------------------
    def _skip(self, entry_id: str, counter: str | None, job: str | None, why: str, pipe) -> None:
        """Record that an entry was consumed without changing μ/var (still exactly once)."""
        if counter:
            self.store.incr(counter, 1, pipe=pipe)
        if job:
            self._finished(job)
        self._batch_state.update(last_result_id=entry_id, updated_at=time.time())
        self.last_id = entry_id
        if why:
            log.warning("run %s: %s", self.cfg.run_id, why)

    def _apply(self, entry_id: str, res: Result | None, err: str) -> None:
        """Apply one result on its own (a batch of one, without refilling)."""
        self._apply_batch([(entry_id, res, err)], refill=False)

    def _apply_batch(self, batch: list[tuple[str, Result | None, str]], refill: bool) -> None:
        """Apply results in stream order and commit them in one MULTI/EXEC (all or none: a crash
        before EXEC leaves last_result_id before the batch, and a restart re-applies all of it)."""
        pipe = self.r_once.pipeline()
        if self._to_delete:
            pipe.delete(*self._to_delete)
            self._to_delete = []
        published = self.version
        # State fields and finished jobs of the whole batch, written once each below.
        self._batch_state, self._batch_forget = {}, []
        try:
            refs_at = self._queue_batch(batch, refill, published, pipe)
        finally:
            self._batch_state, self._batch_forget = None, []
        replies = pipe.execute()
        if refs_at is not None:
            self._drop_unreferenced(replies[refs_at], previous=published)

    def _finished(self, job: str) -> None:
        """A job of the batch is done: out of memory at once (a second result of it in this batch is
        then stale), out of Redis with the batch's one HDEL per hash."""
        self.dispatch.release([job])
        self._batch_forget.append(job)

    def _queue_batch(self, batch: list[tuple[str, Result | None, str]], refill: bool, published: int,
                     pipe) -> int | None:
        """Queue the batch's writes on `pipe`; the index of the HVALS refs reply, if μ/var moved."""
        told_before = self._told
        for entry_id, res, err in batch:
            self._apply_one(entry_id, res, err, pipe)
        refs_at = None
        if self.version != published:
            # Only the batch's last version is ever current in Redis, so only it is published.
            self.store.publish_dist(self.version, self.dist.mean, self.dist.var, pipe=pipe)
            pipe.set(self.store.key("dist_state"), pack_dist_state(self.dist.state(arrays=False)))
            refs_at = len(pipe)
            pipe.hvals(self.store.key("refs"))
        elif self._told != told_before and getattr(self.dist, "scale", None) is not None:
            # μ/var stayed but the adaptive scale saw new gaps: its state rides in the same EXEC.
            pipe.set(self.store.key("dist_state"), pack_dist_state(self.dist.state(arrays=False)))
        self.store.forget_jobs(self._batch_forget, pipe=pipe)
        if refill and self._steps < self.cfg.total_steps:
            self._fill(self._steps, pipe=pipe)
        if self._batch_state:
            self.store.set_state(pipe=pipe, **self._batch_state)
        return refs_at

    def _apply_one(self, entry_id: str, res: Result | None, err: str, pipe) -> None:
        cfg = self.cfg
        if res is None:
            return self._skip(entry_id, "rejected", None, f"malformed result {entry_id} rejected: {err}", pipe)
        if res.job not in self.dispatch.inflight:
            return self._skip(entry_id, "stale", None, f"result of {res.job} ({res.kind}) is not in flight "
                              "(replaced or from an earlier run); dropped", pipe)
        if not res.ok:
            return self._skip(entry_id, "failed", res.job, f"job {res.job} failed on {res.worker}: "
                              f"{res.error.splitlines()[0] if res.error else '?'}", pipe)
        if res.spec_hash != self.dispatch.spec_hash:
            return self._skip(entry_id, "rejected", res.job, f"result of {res.job} has spec_hash {res.spec_hash}, "
                              f"the run has {cfg.spec_hash}; rejected", pipe)
        if not finite(res.fitness) or res.length <= 0:
            return self._skip(entry_id, "rejected", res.job, f"result of {res.job} has fitness {res.fitness} "
                              f"and length {res.length}; rejected", pipe)
        try:
            z = self.dispatch.individual(res, self.dists)
        except CodecError as exc:
            return self._skip(entry_id, "rejected", res.job, f"individual of {res.job} unusable: {exc}", pipe)
        self.dispatch.note_duration(res.kind, res.duration)

        if finite(res.f_mu) and res.f_mu_version >= self.f_mu_version:
            self.f_mu, self.f_mu_version = res.f_mu, res.f_mu_version
        # The f(μ) this individual is compared with: with paired evaluation, the job's own estimate
        # of the μ it was drawn from, on the same start state; else the newest estimate (the paper).
        if cfg.mean_eval_paired and finite(res.f_mu) and res.f_mu_version == res.version:
            f_ref = res.f_mu
        else:
            f_ref = self.f_mu if finite(self.f_mu) else res.fitness
        mean_before = self.dist.mean
        info = self.dispatch.inflight.get(res.job, {})
        version_before = self.dist.version
        # A random-action episode says nothing about z: with an adaptive scale it neither moves μ nor
        # enters the scale (the paper's fixed r lets it move μ, as the official code does).
        scale = getattr(self.dist, "scale", None)
        told = not (info.get("random") and scale is not None and scale.mode == "adaptive")
        try:
            p = float(self.dist.tell(z, res.fitness, f_ref)) if told else 0.0
        except ValueError as exc:
            return self._skip(entry_id, "rejected", res.job, f"tell rejected {res.job}: {exc}", pipe)
        if told:
            self._told += 1
        changed = self.dist.version != version_before
        new_version = self.version + 1 if changed else self.version
        self.recent_lens.append(res.length)
        self.best = max(self.best, res.fitness)
        step = getattr(self.dist, "last_step", None)  # the compiled AES-RL step's outputs, if it ran
        if changed:
            if step is not None:  # fresh arrays that nothing else holds, and σ' computed with them
                self.dists.put(new_version, step.mean, step.var, std=step.std)
            else:
                self.dists.put(new_version, self.dist.mean.copy(), self.dist.var.copy())
        sigma = self.dists.get_std(new_version)[1]
        self._steps = max(self._steps, res.steps)
        self._interactions = max(self._interactions, res.interactions)

        fields = dict(version=new_version, f_mu=self.f_mu, f_mu_version=self.f_mu_version, best_fitness=self.best,
                      last_result_id=entry_id, updated_at=time.time(),
                      recent_lens=codec.pack(list(self.recent_lens)).hex(),
                      last_p_rl=p if res.kind == "rl" else None, last_p_es=p if res.kind == "es" else None)
        r_used = getattr(self.dist, "r", None)
        if r_used is not None:
            fields["r_used"] = r_used
        self._applied["results_applied"] += 1
        self._applied[f"{res.kind}_applied"] += 1
        fields.update(self._applied)
        self._batch_state.update((k, v) for k, v in fields.items() if v is not None)
        self._finished(res.job)
        if res.steps < 0:  # a result from a worker that does not report the counters
            self._stored_steps(max_age=0.0)
        entry = {"job": res.job, "kind": res.kind, "steps": self._steps, "interactions": self._interactions,
                 "version": new_version, "p": p, "f_z": res.fitness,
                 "f_mu": self.f_mu, "len": res.length, "t": time.time(), "worker": res.worker,
                 "sigma_mean": float(sigma.mean()), "sigma_min": float(sigma.min()), "sigma_max": float(sigma.max()),
                 "moved": step.moved if step is not None else float(np.linalg.norm(self.dist.mean - mean_before)),
                 "duration": res.duration,
                 "random": bool(info.get("random", False)), "rl_steps": res.rl_steps,
                 # diagnostics: the reference f(μ), the scale, and how far an RL job moved its individual
                 "f_ref": f_ref, "delta": res.fitness - f_ref, "r": r_used, "told": told,
                 "dist_before": res.dist_before, "dist_after": res.dist_after}
        pipe.xadd(self.store.key("history"), {"d": codec.pack(entry)}, maxlen=cfg.history_max)
        if not entry["random"] and res.fitness > self.best_kept:
            self.best_kept = res.fitness
            pipe.hset(self.store.key("best"), mapping={"params": codec.encode_array(z), "fitness": res.fitness,
                                                       "job": res.job, "kind": res.kind, "version": new_version,
                                                       "steps": entry["steps"]})
        self.last_id = entry_id
        self.version = new_version

    def _drop_unreferenced(self, ref_values: list | None = None, previous: int | None = None) -> None:
        """Mark superseded dist:{v} keys that no running job uses for deletion (bounded Redis memory).

        `ref_values` are the values of `refs` read in the same transaction as the new version; the
        DEL rides on the next write. Safe: a job only ever starts on the current version."""
        if ref_values is None:
            ref_values = self.r.hvals(self.store.key("refs"))
        refs = {int(v) for v in ref_values if v is not None}
        self.dists.prune(self.version, refs)
        self._kept.add(self.version - 1 if previous is None else previous)
        gone = [v for v in self._kept if v not in refs and v != self.version]
        if gone:
            self._to_delete.extend(self.store.key(f"dist:{v}") for v in gone)
            self._kept.difference_update(gone)

    def _flush_deletes(self) -> None:
        if self._to_delete:
            self.r.delete(*self._to_delete)
            self._to_delete = []

    def _replace_lost(self) -> None:
        lost = self.dispatch.find_lost()
        if not lost:
            return
        pipe = self.r.pipeline()
        self.dispatch.forget([job for job, _ in lost], pipe=pipe)
        self.store.incr("replaced", len(lost), pipe=pipe)
        pipe.execute()
        for job, why in lost:
            log.warning("run %s: job %s lost (%s); its slot is refilled", self.cfg.run_id, job, why)


def install_signal_handlers(stop_event: threading.Event) -> None:
    """SIGINT/SIGTERM set the stop event (a second one raises KeyboardInterrupt)."""
    def handler(signum, frame):
        if stop_event.is_set():
            raise KeyboardInterrupt
        stop_event.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
