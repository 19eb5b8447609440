"""The scheduler loop of every queue algorithm (aesrl, es, opo, acemrl, cemrl, pcemrl): it moves bytes
between Redis and one ask/tell optimizer of aesrl_queue/optimizers, and reads top to bottom:

    read results -> rebuild z -> tell -> ask -> one MULTI/EXEC, never resent: either the commit
    (history, version, state, refill) or, while a new version waits for its publication slot (at most
    PUBLISH_HZ a second), the refill alone (new jobs, drawn from the last published version)

Restart, Redis outages, lost jobs and bad input are handled here once, for every algorithm. All the
state lives in Redis (docs/architecture.md), so a restart with the same run id continues where it
stopped, and so does this process after an outage: it throws its memory away and reloads.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from typing import Any

import redis

from aesrl_queue.algorithms import algorithm
from aesrl_queue.codec import CodecError
from aesrl_queue.config import RunConfig
from aesrl_queue.connection import client_url, wait_until_reachable, without_retries
from aesrl_queue.nets import init_actor_params
from aesrl_queue.optimizers import (
    ASYNC_ALGOS,
    QUEUE_ALGOS,
    Fitness,
    Individual,
    OptimizerFailed,
    Reference,
    Update,
    load_optimizer,
    make_optimizer,
    uses_rl,
)
from aesrl_queue.optimizers.base import finite
from aesrl_queue.store import FANOUT_FIELD, Fanout, Result, Store, announce, incarnation_token
from scheduler.breaker import FailureBreaker
from scheduler.critic_gate import make_gate
from scheduler.dispatch import Dispatcher
from scheduler.dists import DistCache
from scheduler.inflight import InFlight
from scheduler.results import PolicyCache, ResultReader, decode, distance, individual

log = logging.getLogger(__name__)

__all__ = ["ASYNC_ALGOS", "QUEUE_ALGOS", "Scheduler", "make_scheduler", "uses_rl"]

COUNTERS = ("steps", "interactions", "critic_version", "critic_steps")  # state fields others write
# Versions of μ/var published per second, at most. Every result is still told as it arrives; a
# commit that would publish a new version sooner than 1/PUBLISH_HZ after the last one waits, its
# results in memory with last_result_id, so a restart tells them again. Each worker host's replica
# receives every published version (1.03 MB at 129k parameters): 10 a second caps that at ~10
# MB/s per host, and a run below 10 results/s (up to ~10 workers with 1 s jobs) commits every result
# at once, as it would unpaced (docs/scaling.md). The pace never holds a worker back: while a commit
# waits, each read still refills the free slots with jobs on the last published version (_refill).
PUBLISH_HZ = 10.0
# Seconds between tries to bring a fan-out instance that failed a write back in line with the primary.
FANOUT_RETRY_S = 5.0


# How the loop words an optimizer's events (name -> level, %-format of its numbers).
OPTIMIZER_EVENTS = {
    "generation": (logging.INFO, "generation %(g)d (version %(version)d): %(rl)d RL + %(es)d ES members, "
                                 "%(steps)d steps stored"),
    "told": (logging.INFO, "generation %(g)d told (best f(z) %(best).1f, mean %(mean).1f) -> version %(version)d"),
    "dropped": (logging.WARNING, "member %(member)d of generation %(g)d dropped after %(tries)d tries"),
    "gone": (logging.WARNING, "RL member %(member)d of generation %(g)d is gone; evaluating it again"),
}


class _Pending:
    """What told results ask to be written, held until the next commit."""

    def __init__(self) -> None:
        self.results = 0
        self.forget: list[str] = []
        self.incr: collections.Counter[str] = collections.Counter()
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] | None = None  # only the last best of a commit is kept
        self.moved: Update | None = None  # the last update that made a new version
        # keys of the RL individuals told since the last commit: deleted by it where nothing reads them
        # again (a restart re-tells only what comes after the commit), so that neither the primary nor
        # a host's replica keeps 0.5 MB per RL result for the key's TTL
        self.individuals: list[str] = []

    def note(self, update: Update | None) -> None:
        """Hold what one tell (or a lost job) asks to be written: its history entry, a new best, a new version."""
        if update is None:
            return
        if update.moved:
            self.moved = update
        if update.history is not None:
            self.history.append(update.history)
        if update.best is not None:
            self.best = update.best


class Scheduler:
    """One run of a queue algorithm. `run()` returns "finished", "stopped" or "failed"."""

    def __init__(self, client: redis.Redis, blocking_client: redis.Redis, cfg: RunConfig,
                 stop_event: threading.Event | None = None, drain_timeout: float | None = None,
                 publish_hz: float = PUBLISH_HZ, fanout: redis.Redis | None = None) -> None:
        self.r = client
        self.rb = blocking_client
        # The apply's MULTI/EXEC must never be resent (a resend after a lost reply would apply a
        # batch twice); a dropped link raises instead and run() resumes from what Redis holds.
        self.r_once = without_retries(client)
        self.cfg = cfg
        self.store = Store(client, cfg.run_id)
        # The fan-out instance the hosts' replicas follow (docs/decisions.md), None: the primary serves
        # them. Its keys are written outside the commit's transaction, tagged per incarnation (`tag`).
        self.fan = Fanout(self.store, fanout) if fanout is not None else None
        self.tag: str | None = None  # what published versions carry: the run token, or with a fan-out an incarnation's
        self.fan_behind = False  # a fan-out write failed: a commit copies the current version again (_fanout_sync)
        self.fan_retry_at = 0.0  # not before this (self.clock): each try against a dead instance costs its retries
        # Only an optimizer that tells each result at once never reads an RL individual again; one
        # that tells generations keeps its members' keys in its state until the generation closes.
        self.drop_individuals = algorithm(cfg.algo).tells == "result"
        self.announcing = True  # False once the Redis user turns out not to be allowed the channel
        self.stop_event = stop_event or threading.Event()
        self.drain_timeout = drain_timeout
        self.publish_hz = publish_hz  # 0: publish after every read, however fast results come
        self.clock = time.monotonic  # paces publications, times the critic gate's waits (tests, virtual.py)
        # Whether free slots are refilled between commits. Only where ask and tell change disjoint parts
        # of the optimizer's state (the asynchronous optimizer: ask numbers and tags jobs, tell moves the
        # distribution), so that the refill can save the state last committed with what asks changed
        # since. A synchronous generation (cemrl, pcemrl) is asked from the version its last member
        # publishes, and its members' records change on both sides: it refills with its commits.
        self.refills_between = algorithm(cfg.algo).tells == "result"

    @property
    def version(self) -> int:
        return self.opt.version

    # -- set-up: a new run, a restart, or the way back from an outage -------------------------------
    def setup(self) -> None:
        cfg, store = self.cfg, self.store
        if not store.write_config(cfg):
            self.cfg = cfg = store.config()
        if algorithm(cfg.algo).executor != "queue":
            raise ValueError(f"algo {cfg.algo!r} does not run on the queue; use make_scheduler")
        self.tag = incarnation_token(cfg) if self.fan is not None else None
        saved = store.load_checkpoint("optimizer")
        if saved is None:
            mu0 = init_actor_params(cfg.obs_dim, cfg.act_dim, cfg.max_action, tuple(cfg.hidden), cfg.activation,
                                    seed=cfg.seed)
            self.opt = make_optimizer(cfg, mu0)
            if self.fan is not None:  # a run's earlier namesake may have left observations there
                self._to_fanout(self.fan.delete)
            now = time.time()
            pipe = self.r.pipeline()
            store.publish_dist(self.opt.version, self.opt.mean, self.opt.var, pipe=pipe, tag=self.tag)
            store.save_checkpoint("optimizer", self.opt.state(), pipe=pipe)
            store.set_state(pipe=pipe, **{"f_mu_version": -1, **self.opt.fields()}, last_result_id="0-0",
                            started_at=now, status="running", updated_at=now)
            pipe.execute()
            log.info("run %s: created μ₀ (%d parameters) and var₀ = %g for %s", cfg.run_id, cfg.actor_dim,
                     cfg.var_init, cfg.algo)
        else:
            version = int(saved["dist"]["version"])
            mu, var = store.read_dist(version)
            self.opt = load_optimizer(cfg, {**saved, "mean": mu, "var": var})
        state = store.state()
        if saved is not None:
            log.info("run %s: resumed at version %d, %d steps stored, %d results applied", cfg.run_id,
                     self.opt.version, state["steps"], state["results_applied"])
        queues = {kind: Dispatcher.queue_key(kind) for kind in ("rl", "es")}
        self.inflight = InFlight(self.r, store, cfg, queues)  # the one record of the jobs in flight
        self.dispatch = Dispatcher(self.r, cfg, self.inflight)
        self.results = ResultReader(store, self.rb)
        self.breaker = FailureBreaker(store)
        self.gate = make_gate(cfg, self.opt)  # when RL jobs may be asked for; its clocks restart with the process
        # What a synchronous generation needs back: members whose job was forgotten run again, and
        # the trained parameters of RL members that already returned come from their stored individuals.
        self.opt.reconcile(set(self.inflight))
        for job, member in self.opt.needs_individuals().items():
            try:
                z = store.get_individual(job)
            except CodecError as exc:
                log.warning("run %s: stored individual of %s unusable (%s)", cfg.run_id, job, exc)
                z = None
            self.opt.provide(member, z)
        self.last_id = state.get("last_result_id", "0-0") or "0-0"
        # Counters only this loop writes: kept here, written as values with every commit.
        self.applied = {name: int(state.get(name, 0)) for name in ("results_applied", "es_applied", "rl_applied")}
        self.counts = {name: int(state.get(name, 0)) for name in COUNTERS}
        self.counts_read_at = 0.0
        self.written: dict[str, Any] = {}  # the optimizer's fields as last committed
        self.dists = DistCache(store)
        self.policies = PolicyCache(store)
        self.dists.put(self.opt.version, self.opt.mean.copy(), self.opt.var.copy())
        # Superseded versions left in Redis by an earlier incarnation are deleted once unreferenced.
        self.kept = {v for v in store.dist_versions() if v != self.opt.version}
        self.to_delete: list[int] = []
        self.pending = _Pending()  # anything told before an outage is told again from last_result_id
        self.published = self.opt.version  # the version current in Redis
        self.published_at = -math.inf  # when the last commit that published a new version ran (self.clock)
        self.checkpoint = self.opt.state()  # the optimizer's state as last committed
        fanout = None if self.fan is None else client_url(self.fan.r)  # workers of the run need it named
        named = {FANOUT_FIELD: fanout} if fanout or FANOUT_FIELD in state else {}  # None: now without one
        store.set_state(status="running", updated_at=time.time(), **named)
        if self.fan is not None:
            self._fanout_sync()

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
                self.inflight.close()
                if not wait_until_reachable(self.r, f"scheduler of run {self.cfg.run_id}", exc, self.stop_event):
                    return "stopped"
                self.setup()
            except OptimizerFailed as exc:
                self.inflight.close()
                log.error("%s; see the failed results (`aesrl-queue status`)", exc)
                self.store.set_state(status="failed", updated_at=time.time())
                return "failed"

    def _loop(self) -> str:
        cfg = self.cfg
        draining_since = None
        first = True  # the first read does not wait: the first jobs go out at once
        while True:
            if self.stop_event.is_set():
                self._flush()
                self.inflight.close()
                self.store.set_state(status="stopped", updated_at=time.time())
                log.info("run %s: stopped on request; in-flight jobs stay registered for a restart", cfg.run_id)
                return "stopped"
            steps = self._counters()["steps"]
            if draining_since is None and self.opt.done(steps):
                draining_since = time.monotonic()
                self.store.set_state(status="draining", updated_at=time.time())
                log.info("run %s: budget of %d steps reached; draining %d jobs", cfg.run_id, cfg.total_steps,
                         len(self.inflight))
            if draining_since is not None and (not self.inflight or time.monotonic() - draining_since
                                               > (self.drain_timeout or self.inflight.deadline("rl"))):
                return self._finish()
            # Block long only while results are due and the optimizer waits for nothing else.
            block = 500 if self.inflight and not self.gate.waiting else 50
            if first:
                block, first = 1, False
            if self.opt.version != self.published:  # a held version: wake up when it may be published
                block = max(1, min(block, math.ceil(1e3 * (self._next_publish() - self.clock()))))
            self.apply(self.results.read(self.last_id, block), refill=draining_since is None)

    def apply(self, batch: list[tuple[str, dict]], refill: bool = True) -> None:
        """Tell the batch's results in stream order; then commit (see _commit), unless that would
        publish a new version sooner than 1/publish_hz after the last one: then only refill the
        slots the batch freed (see _refill), and the commit waits for a later read."""
        for entry_id, fields in batch:
            self._tell(entry_id, fields)
            self.pending.results += 1
            self.last_id = entry_id
        if self.opt.version == self.published or self.clock() >= self._next_publish():
            self._commit(refill)
        elif refill:
            self._refill()
        self._say()

    def _say(self) -> None:
        """Log what the optimizer reported since the last call (CEM's generations, dropped members)."""
        while self.opt.events:
            name, numbers = self.opt.events.pop(0)
            level, text = OPTIMIZER_EVENTS[name]
            log.log(level, "run %s: %s", self.cfg.run_id, text % numbers)

    def _next_publish(self) -> float:
        return self.published_at + (1.0 / self.publish_hz if self.publish_hz > 0 else 0.0)

    def _flush(self) -> None:
        """Commit the results told since the last commit, now (at a stop and at the end)."""
        if self.pending.results:
            self._commit(refill=False, lost=False)

    def _commit(self, refill: bool = True, lost: bool = True) -> None:
        """Replace lost jobs, ask for the free slots, and write what the told results ask for in one
        MULTI/EXEC (all or none: a crash before EXEC leaves last_result_id before every result told
        since the last commit, and a restart tells all of them again)."""
        store, opt, pending = self.store, self.opt, self.pending
        published = self.published
        for job, why, failure in self.inflight.find_lost(self.dispatch.workers) if lost else ():
            if failure:
                self.breaker.failure(failure, len(self.dispatch.workers()), self.inflight[job].get("kind", ""))
            log.warning("run %s: job %s lost (%s); it is asked again", self.cfg.run_id, job, why)
            self.inflight.release([job])
            pending.forget.append(job)
            pending.incr["replaced"] += 1
            pending.note(opt.lost(job, retry=True))
        specs = self._ask() if refill else []
        self.breaker.line.critic(self.gate.problem)  # a missing critic, with the command to start one
        fields = opt.fields()
        if not (pending.results or pending.forget or specs or self.to_delete or not _same(fields, self.written)):
            return
        if self.fan_behind and self.clock() >= self.fan_retry_at:
            self._fanout_sync()
        pipe = self.r_once.pipeline()
        dropped = self.to_delete
        store.drop_dists(dropped, pipe=pipe)
        self.to_delete = []
        self._record(pending, pipe)
        refs_at = None
        if opt.version != published:
            # Only the last version is ever current in Redis, so only it is published.
            refs_at = len(pipe) + 1
            store.publish_dist(opt.version, opt.mean, opt.var, pipe=pipe, read_refs=True, tag=self.tag)
            if self.fan is not None:  # before the commit names it: a job that learns it finds its bytes there
                self._to_fanout(lambda: self.fan.publish_dist(opt.version, opt.mean, opt.var, self.tag))
        checkpoint = opt.state()
        store.save_checkpoint("optimizer", checkpoint, pipe=pipe)
        store.forget_jobs(pending.forget, pipe=pipe)
        if pending.individuals:
            pipe.unlink(*pending.individuals)
        self.dispatch.enqueue(specs, pipe=pipe)
        for name, amount in pending.incr.items():
            store.incr(name, amount, pipe=pipe)
        store.set_state(pipe=pipe, **fields, **self.applied, last_result_id=self.last_id, updated_at=time.time())
        replies = pipe.execute()
        self.written = fields
        self.checkpoint = checkpoint
        if opt.version != published:
            self.published_at = self.clock()
        self.published = opt.version
        self.pending = _Pending()
        if refs_at is not None:
            self._drop_unreferenced(replies[refs_at], previous=published)
            self._announce(opt.version, dropped)
        elif dropped and self.fan is not None:
            self._to_fanout(lambda: self.fan.drop(dropped))

    def _announce(self, version: int, dropped: list[int] = ()) -> None:
        """Announce a published version to the jobs waiting for it on their hosts' replicas (with a
        fan-out instance: name it current there and drop what the commit dropped, then announce it); a
        user whose ACL lacks the channel (`&aesrl:*`) is told once, and jobs then look every 0.1 s."""
        if self.fan is not None:
            self._to_fanout(lambda: self.fan.make_current(version, dropped, announce=self.announcing))
            return
        if not self.announcing:
            return
        try:
            announce(self.store, version)
        except redis.exceptions.NoPermissionError as exc:
            self._not_announcing(exc)
        except redis.RedisError as exc:  # the commit went through; a missed announcement only delays
            log.debug("announcement of version %d failed: %s", version, exc)

    def _not_announcing(self, exc: Exception) -> None:
        self.announcing = False
        log.warning("run %s: versions are not announced (%s): allow the channels &aesrl:* to this "
                    "Redis user (docs/security.md); jobs waiting for a version look every 0.1 s", self.cfg.run_id, exc)

    def _to_fanout(self, write) -> None:
        """A write to the fan-out instance, outside the primary's transaction. One that fails leaves the
        run going (jobs cannot read what is missing there and fail; they are asked again), and no
        write is tried until a commit FANOUT_RETRY_S later copies the current version from the primary
        again (_fanout_sync)."""
        if self.fan_behind:
            return
        try:
            write()
        except redis.exceptions.NoPermissionError as exc:  # PUBLISH, the last command of make_current
            self._not_announcing(exc)
        except (redis.RedisError, OSError) as exc:
            log.warning("run %s: the fan-out instance failed a write (%s); trying again in %g s",
                        self.cfg.run_id, exc, FANOUT_RETRY_S)
            self.fan_behind = True
            self.fan_retry_at = self.clock() + FANOUT_RETRY_S

    def _fanout_sync(self) -> None:
        """The fan-out instance as the primary is (at setup, and after a failed write): the current
        version copied with its tag, no version the primary lacks (one written before a commit that
        failed), the current version named and announced."""
        self.fan_behind = False
        self._to_fanout(lambda: (self.fan.copy_dist(self.published), self.fan.sweep(set(self.store.dist_versions())),
                                 self.fan.make_current(self.published, announce=self.announcing)))

    def _refill(self) -> None:
        """Ask for the free slots and enqueue the jobs now, while the told results wait for their commit.

        The jobs name the last published version, the one a worker's start script hands them. One
        MULTI/EXEC, never resent, carries the RQ jobs, their in-flight entries and the optimizer's
        state as last committed with what asks changed since (the job numbering and the RL/ES
        counts): a restart then tells the held results again from last_result_id, on the distribution
        they were told to, and numbers its jobs after these. Nothing else moves: no history, no
        version, no settled job leaves `inflight` before the commit that applies its result."""
        if not self.refills_between:
            return
        specs = self._ask()
        if not specs:
            return
        for spec in specs:
            spec["version"] = self.published
        pipe = self.r_once.pipeline()
        self.dispatch.enqueue(specs, pipe=pipe)
        self.store.save_checkpoint("optimizer", {**self.checkpoint, **asked_state(self.opt)}, pipe=pipe)
        pipe.execute()

    # -- one result --------------------------------------------------------------------------------
    def _tell(self, entry_id: str, fields: dict) -> None:
        """Decode one stream entry, check it, rebuild its individual and tell it; every entry is consumed
        exactly once.

        Straight down: the entry decoded, the verdict on it, the job's in-flight entry taken
        (`InFlight.settle`), the tell, and what it asks to be written held in `self.pending` for the
        next commit."""
        res, err = decode(entry_id, fields)
        ours = res is not None and res.job in self.inflight
        if ours:  # the circuit breaker counts what our jobs report
            self._breaker_hears(res)
        why = refusal(entry_id, res, err, ours, self.dispatch.spec_hash)
        if why is None:
            info, eps = self.inflight.settle(res.job, res.seed)
            try:
                ind = individual(res, eps, self.dists, self.store, self.policies)
                update = self.opt.tell(*self._evaluated(res, info, ind))
            except CodecError as exc:
                why = ("rejected", f"individual of {res.job} unusable: {exc}", True)
            except ValueError as exc:
                why = ("rejected", f"tell rejected {res.job}: {exc}", True)
        if why is None:
            self._told(res, info, update, distance(res, ind, self.dists))
        else:
            self._refuse(res.job if ours else None, *why)

    def _told(self, res: Result, info: dict[str, Any], update: Update, dist_after: float) -> None:
        """Hold what a told result asks to be written, with what the job itself reported beside what
        the optimizer made of it; count it as applied."""
        if update.history is not None:
            update.history.update(t=time.time(), worker=res.worker, duration=res.duration,
                                  rl_steps=int(info.get("rl_steps", 0)),
                                  dispatched_at=float(info.get("enqueued_at", 0.0)))
            if res.kind == "rl":
                update.history["dist_after"] = dist_after
        if update.applied:
            self.applied["results_applied"] += 1
            self.applied[f"{res.kind}_applied"] += 1
        self.pending.forget.append(res.job)  # out of Redis with the commit's one HDEL per hash
        self.pending.note(update)
        if res.kind == "rl" and self.drop_individuals and res.ind == self.store.individual_key(res.job):
            self.pending.individuals.append(res.ind)  # its own key only, whatever a result names

    def _breaker_hears(self, res: Result) -> None:
        if res.ok:
            self.breaker.success(res.kind)
        else:
            self.breaker.failure(res.error or "unknown error", len(self.dispatch.workers(max_age=math.inf)), res.kind)

    def _evaluated(self, res: Result, info: dict[str, Any], ind) -> tuple[Individual, Fitness, Reference]:
        """What the optimizer is told of one checked result: (individual, fitness, reference). The run's
        counters are updated from it."""
        self.inflight.note_duration(res.kind, res.duration)
        # Results carry the counters after their episode was stored: no read per result.
        if res.steps < 0:  # a worker that does not report them
            self._counters(max_age=0.0)
        self.counts["steps"] = max(self.counts["steps"], res.steps)
        self.counts["interactions"] = max(self.counts["interactions"], res.interactions)
        return (Individual(job=res.job, kind=res.kind, version=res.version, z=ind.z, random=bool(info.get("random", False)),
                           mirror_z=ind.mirror, drawn_from=ind.mean, steps=self.counts["steps"],
                           interactions=self.counts["interactions"]),
                Fitness(res.fitness, res.length, res.mirror_fitness, res.mirror_len),
                Reference(res.f_mu, res.f_mu_version, res.eval_steps / max(1, self.cfg.mean_eval_episodes)))

    def _refuse(self, job: str | None, counter: str, why: str, retry: bool) -> None:
        """A result not told: counted and logged; its job, when it is ours, settled and asked again
        (`retry`) or given up (the optimizer's `lost`)."""
        self.pending.incr[counter] += 1
        log.warning("run %s: %s", self.cfg.run_id, why)
        if job is not None:
            self.inflight.release([job])  # out of memory at once: a second result of it in this batch is stale
            self.pending.forget.append(job)  # out of Redis with the commit's one HDEL per hash
            self.pending.note(self.opt.lost(job, retry))

    def _record(self, pending: _Pending, pipe) -> None:
        """Queue the held history entries and best individual; cache the newest version's μ/σ (jobs
        start only on published versions, so the ones between commits are never asked for)."""
        update = pending.moved
        if update is not None:
            if update.std is not None:  # fresh arrays that nothing else holds, and σ' computed with them
                self.dists.put(update.version, update.mean, update.var, std=update.std)
            else:
                self.dists.put(update.version, update.mean.copy(), update.var.copy())
        for entry in pending.history:
            self.store.append_history(entry, pipe=pipe)
        if pending.best is not None:
            self.store.keep_best(pending.best, pipe=pipe)

    # -- asking --------------------------------------------------------------------------------------
    def _ask(self) -> list[dict[str, Any]]:
        """Jobs for the free slots: the critic gate asks the optimizer, RL jobs only once a critic is ready."""
        counts = self._counters(max_age=0.05 if self.gate.waiting else 1.0)
        want = self.breaker.limit(self.dispatch.slots(), len(self.inflight)) - len(self.inflight)
        return self.gate.ask(want, counts["steps"], len(self.inflight), counts["critic_version"], counts["critic_steps"],
                             self.clock())

    def _counters(self, max_age: float = 1.0) -> dict[str, int]:
        """Stored steps and the critic's progress: from the results seen, re-read at most every `max_age` s."""
        now = time.monotonic()
        if now - self.counts_read_at > max_age:
            for name, value in self.store.counters(COUNTERS).items():
                self.counts[name] = max(self.counts[name], value)
            self.counts_read_at = now
        return self.counts

    # -- versions and the end ------------------------------------------------------------------------
    def _drop_unreferenced(self, ref_values: list, previous: int) -> None:
        """Mark superseded dist:{v} keys that no running job uses for deletion (bounded Redis memory).

        `ref_values` are the values of `refs` read in the same transaction as the new version; the
        DEL rides on the next commit. Safe: a job only ever starts on the current version."""
        refs = {int(v) for v in ref_values if v is not None}
        self.dists.prune(self.opt.version, refs)
        self.kept.add(previous)
        gone = [v for v in self.kept if v not in refs and v != self.opt.version]
        if gone:
            self.to_delete.extend(gone)
            self.kept.difference_update(gone)

    def _finish(self) -> str:
        self._flush()
        self._say()
        left = list(self.inflight)
        self.inflight.forget(left)
        self.store.drop_dists(self.to_delete)
        if self.fan is not None:
            self._to_fanout(lambda: self.fan.drop(self.to_delete))
        self.to_delete = []
        self.inflight.close()
        self.store.set_state(status="finished", finished_at=time.time(), updated_at=time.time())
        log.info("run %s: finished at version %d (%d jobs abandoned at the end)", self.cfg.run_id, self.opt.version,
                 len(left))
        return "finished"


def make_scheduler(client: redis.Redis, blocking_client: redis.Redis, cfg: RunConfig,
                   stop_event: threading.Event | None = None, device: str | None = "auto",
                   fanout: redis.Redis | None = None):
    """The scheduler of any --algo: this loop for the queue algorithms (with `fanout`, the fan-out
    instance the hosts follow), the one-process TD3 for td3 (which trains on `device`: "auto" is CUDA
    where torch sees one, and has no workers to fan out to)."""
    if algorithm(cfg.algo).executor == "process":
        from scheduler.td3_baseline import TD3Baseline

        return TD3Baseline(client, cfg, stop_event=stop_event, device=device)
    return Scheduler(client, blocking_client, cfg, stop_event=stop_event, fanout=fanout)


def refusal(entry_id: str, res: Result | None, err: str, ours: bool, spec_hash: str) -> tuple[str, str, bool] | None:
    """Why a stream entry is not told, as (counter, message, retry), or None when it is to be told:
    malformed, not in flight (`ours`), failed, of other code (spec_hash), or not a finite return."""
    if res is None:
        return "rejected", f"malformed result {entry_id} rejected: {err}", True
    if not ours:
        return "stale", f"result of {res.job} ({res.kind}) is not in flight (replaced or from an earlier run); dropped", True
    if not res.ok:
        return "failed", f"job {res.job} failed on {res.worker}: {res.error.splitlines()[0] if res.error else '?'}", True
    if res.spec_hash != spec_hash:
        return "rejected", f"result of {res.job} has spec_hash {res.spec_hash}, the run has {spec_hash}; rejected", False
    if not finite(res.fitness) or res.length <= 0:
        return "rejected", f"result of {res.job} has fitness {res.fitness} and length {res.length}; rejected", False
    return None


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal field dicts, NaN equal to NaN (f(μ) is NaN until the first estimate)."""
    if a.keys() != b.keys():
        return False
    return all(_same_value(a[k], b[k]) for k in a)


def _same_value(x: Any, y: Any) -> bool:
    return x is y or x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))


def asked_state(opt) -> dict[str, Any]:
    """The parts of an asynchronous optimizer's state (AesrlOptimizer.state) that `ask` changes and
    `tell` does not: the job numbering and the P controller's dispatch counts. Read from the
    attributes, not state(), which copies the whole distribution (ACEM-RL's buffer of individuals).
    tests/test_publish_pacing.py checks, for every asynchronous algorithm, that ask changes nothing
    else and tell neither of these."""
    return {"dispatched": opt.dispatched, "controller": opt.controller.state()}
