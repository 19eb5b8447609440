"""What the scheduler loop (scheduler/loop.py) does with RQ and Redis besides telling results:
dispatching jobs, reading results, finding lost jobs, and caching μ/σ of recent versions.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections import deque
from typing import Any

import numpy as np
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from aesrl_queue import kernels, noise
from aesrl_queue.codec import CodecError
from aesrl_queue.config import RunConfig
from aesrl_queue.optimizers.base import job_id
from aesrl_queue.store import (
    QUEUE_ES,
    QUEUE_RL,
    WORKER_TTL,
    Result,
    Store,
    decode_result,
    live_workers,
    rq_failure_text,
    rq_job_status,
)

log = logging.getLogger(__name__)

JOB_FUNCTION = "workers.jobs.evaluate"  # by name only: the scheduler never imports worker code


PLAIN_WORKER_HINT = "plain rq worker: use -w workers.AesrlWorker"
PLAIN_WORKER_CAUSE = ("jobs fail with DeserializationError: a plain `rq worker` (pickle serializer) took them; "
                      "start workers with `rq worker -w workers.AesrlWorker -u URL aesrl-rl aesrl-es` "
                      "(or `aesrl-queue worker`)")

# What to do about a failing job, by what its error text contains: (markers, what to do, a few words).
ADVICE = (
    (("spec_hash",), "the workers run other code or another environment version than the scheduler: give "
     "them the scheduler's and restart them", "update the workers"),
    (("ModuleNotFoundError", "ImportError", "No module named", "NameNotFound", "NamespaceNotFound",
      "DependencyNotInstalled"),
     "the workers cannot import the environment or a package it needs: install it where they run (a custom "
     "env's module must be importable there, docs/guide.md §6) and restart them", "install it on the workers"),
)
ADVICE_ELSE = ("the traceback is in the scheduler's log and the worker's (`aesrl-queue run`: RUN/logs/); fix "
               "its cause and restart the workers: the run goes on where it is", "traceback in the logs")


def failure_cause(text: str) -> tuple[str, str, str]:
    """(key, cause, hint) of a failed job from its error text or RQ's exc_string: the cause is the
    exception's last line and what to do, the hint both in a few words (the progress line); the
    key is the last line without numbers (job ids, pids), the same for every failure of one cause."""
    if "DeserializationError" in text or "UnpicklingError" in text:
        return "plain worker", PLAIN_WORKER_CAUSE, PLAIN_WORKER_HINT
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    last = lines[-1][:300] if lines else "unknown error"
    todo, short = next(((todo, short) for markers, todo, short in ADVICE if any(m in text for m in markers)),
                       ADVICE_ELSE)
    return re.sub(r"\d+", "#", last), f"jobs fail with {last}: {todo}", f"jobs fail: {last[:60]} ({short})"


class FailureBreaker:
    """Stops refilling slots after `after` failures in a row (no success between), and puts the cause
    of failing jobs on the run's problem line (scheduler/problems.py).

    A job that fails on every worker, or workers that cannot run our jobs at all (a plain `rq
    worker`), would otherwise be refilled and fail again for ever. The cause is shown from the first
    failure, per job kind: RL jobs that fail while ES jobs succeed (no torch on the workers) stay
    shown until an RL job succeeds. While open, one probe job is let through every `probe_every`
    seconds, and the first success closes the breaker.
    """

    def __init__(self, store: Store, after: int = 4, probe_every: float = 30.0) -> None:
        from scheduler.problems import ProblemLine

        self.store = store
        self.line = ProblemLine(store)  # also shows a missing critic (the loop feeds it)
        self.after = after
        self.probe_every = probe_every
        self.causes: dict[str, tuple[str, str, str]] = {}  # job kind -> (key, cause, hint) of its last failure
        self.streak = 0
        self.open = False
        self._probe_at = 0.0

    @property
    def cause(self) -> str | None:
        return next((c[1] for c in self.causes.values()), None)

    def failure(self, text: str, workers: int = 0, kind: str = "") -> None:
        key, cause, hint = failure_cause(text)
        if self.causes.get(kind, ("",))[0] != key:
            if all(c[0] != key for c in self.causes.values()):
                log.warning("run %s: %s\n%s", self.store.run_id, cause, text.strip()[-1500:])
            self.causes[kind] = (key, cause, hint)
            self._show()
        self.streak += 1
        if not self.open and self.streak >= max(self.after, workers):
            self.open = True
            self._probe_at = time.monotonic()
            log.error("run %s: %d jobs in a row failed (%s); no more jobs are queued, one probe job every %.0fs "
                      "until one succeeds", self.store.run_id, self.streak, cause, self.probe_every)
            self.store.set_state(breaker=f"open after {self.streak} failures in a row; one probe job every "
                                         f"{self.probe_every:.0f}s")

    def success(self, kind: str = "") -> None:
        self.streak = 0
        if self.open:
            log.warning("run %s: a job succeeded again; queueing jobs as before", self.store.run_id)
            self.open = False
            self.store.set_state(breaker="")
        if self.causes.pop(kind, None) is not None:
            self._show()

    def _show(self) -> None:
        latest = next(reversed(self.causes.values()), None)
        self.line.set("jobs", None if latest is None else latest[1:])

    def limit(self, target: int, inflight: int) -> int:
        """The in-flight target allowed: `target` when closed; while open, one more job (a probe)
        every probe_every seconds, else none."""
        if not self.open:
            return target
        now = time.monotonic()
        if now - self._probe_at >= self.probe_every:
            self._probe_at = now
            return min(target, inflight + 1)
        return min(target, inflight)


class Dispatcher:
    """Enqueue evaluation jobs and track them until their results are applied or they are lost."""

    def __init__(self, client: redis.Redis, store: Store, cfg: RunConfig) -> None:
        self.r = client
        self.store = store
        self.cfg = cfg
        self.queues = {
            "rl": Queue(QUEUE_RL, connection=client, serializer=JSONSerializer),
            "es": Queue(QUEUE_ES, connection=client, serializer=JSONSerializer),
        }
        self.inflight: dict[str, dict[str, Any]] = store.inflight()
        self.durations: dict[str, deque] = {"es": deque(maxlen=50), "rl": deque(maxlen=50)}
        self._workers_seen_at = 0.0
        self._workers: dict[str, dict[str, str]] = {}
        self._last_check = 0.0
        self.noise_ahead = NoiseAhead(cfg.actor_dim)
        self.breaker = FailureBreaker(store)
        self.spec_hash = cfg.spec_hash  # a property that hashes the spec: once, not per job

    # -- workers -------------------------------------------------------------------------------
    def workers(self, max_age: float = 1.0) -> dict[str, dict[str, str]]:
        now = time.monotonic()
        if now - self._workers_seen_at > max_age:
            self._workers = live_workers(self.r)
            self._workers_seen_at = now
        return self._workers

    def target_inflight(self) -> int:
        n = max(1, len(self.workers()))
        return self.breaker.limit(n * (1 + self.cfg.queued_per_worker), len(self.inflight))

    # -- dispatch --------------------------------------------------------------------------------
    def enqueue(self, specs: list[dict[str, Any]], state_fields: dict[str, Any] | None = None,
                incr: dict[str, int] | None = None, pipe=None) -> list[str]:
        """Enqueue jobs described by specs (kind, version, seed, n, rl_steps, random, extra...).

        The in-flight entries, counters and RQ jobs go in one MULTI/EXEC, so a crash never leaves
        a job on a queue that the scheduler does not know of.
        """
        if not specs:
            return []
        cfg = self.cfg
        own = pipe is None  # else the caller's MULTI/EXEC carries the jobs with its other writes
        if own:
            pipe = self.r.pipeline(transaction=True)
        now = time.time()
        by_queue: dict[str, list] = {"rl": [], "es": []}
        ids = []
        for spec in specs:
            jid = job_id(cfg.run_id, spec["n"])
            ids.append(jid)
            info = {"kind": spec["kind"], "version": int(spec["version"]), "seed": int(spec["seed"]),
                    "n": int(spec["n"]), "enqueued_at": now, "rl_steps": int(spec.get("rl_steps", 0)),
                    "random": bool(spec.get("random", False))}
            info.update(spec.get("extra", {}))
            self.store.add_inflight(jid, info, pipe=pipe)
            self.inflight[jid] = info
            kwargs = {"run": cfg.run_id, "job": jid, "kind": spec["kind"], "version": int(spec["version"]),
                      "seed": int(spec["seed"]), "spec_hash": self.spec_hash,
                      "rl_steps": int(spec.get("rl_steps", 0)), "random_actions": bool(spec.get("random", False))}
            by_queue[spec["kind"]].append(Queue.prepare_data(
                JOB_FUNCTION, kwargs=kwargs, timeout=cfg.job_timeout, result_ttl=cfg.result_ttl,
                failure_ttl=cfg.failure_ttl, ttl=cfg.job_timeout * 4, job_id=jid,
                description=f"{cfg.run_id} {spec['kind']} #{spec['n']}",
            ))
        for kind, datas in by_queue.items():
            if datas:
                self.queues[kind].enqueue_many(datas, pipeline=pipe)
        if state_fields:
            self.store.set_state(pipe=pipe, **state_fields)
        for name, amount in (incr or {}).items():
            self.store.incr(name, amount, pipe=pipe)
        if own:
            pipe.execute()
        for jid, spec in zip(ids, specs, strict=True):
            if spec["kind"] == "es":
                self.noise_ahead.submit(jid, int(spec["seed"]))
        return ids

    # -- results ---------------------------------------------------------------------------------
    def read(self, after: str, block_ms: int, blocking_client: redis.Redis,
             count: int = 200) -> list[tuple[str, Result | None, str]]:
        """(entry id, decoded result or None, error) for up to `count` entries after `after`."""
        out = []
        for entry_id, fields in self.store.read_stream("results", after, count=count, block_ms=block_ms,
                                                         client=blocking_client):
            try:
                res = decode_result(entry_id, fields)
                out.append((entry_id, res, ""))
            except CodecError as exc:
                out.append((entry_id, None, str(exc)))
                continue
            if res.job in self.inflight:  # the circuit breaker counts what our jobs report
                if res.ok:
                    self.breaker.success(res.kind)
                else:
                    self.breaker.failure(res.error or "unknown error", len(self._workers), res.kind)
        return out

    def individual(self, res: Result, dists: DistCache) -> noise.Individual:
        """The evaluated parameters: rebuilt from (version, seed) for ES (with the mirror of an
        antithetic job, one with a finite mirror_fitness), downloaded for RL (whose μ it leaves unread:
        the version may be gone by the time a long RL job reports).

        An ES job's ε was usually computed at dispatch (NoiseAhead); else `rebuild` computes it."""
        if res.kind == "rl":
            if not res.ind:
                raise CodecError(f"RL result of {res.job} names no individual key")
            return noise.Individual(self.store.get_individual(res.ind), None, None)
        mu, std = dists.get_std(res.version)
        return noise.rebuild(mu, res.seed, std=std, antithetic=math.isfinite(res.mirror_fitness),
                             eps=self.noise_ahead.take(res.job, res.seed), perturb=kernels.perturbation)

    def note_duration(self, kind: str, seconds: float) -> None:
        if math.isfinite(seconds) and seconds > 0:
            self.durations[kind].append(seconds)

    def deadline(self, kind: str) -> float:
        if self.cfg.job_deadline > 0:
            return self.cfg.job_deadline
        d = self.durations[kind]
        if not d:
            # Nothing seen of this kind yet (an RL job can take minutes where ES takes a second).
            return float(self.cfg.job_timeout)
        # Generous: a dead worker is caught by its heartbeat; the deadline catches a hung job.
        return min(float(self.cfg.job_timeout), max(120.0, 4.0 * max(d)))

    # -- lost jobs -------------------------------------------------------------------------------
    def find_lost(self, every: float = 1.0) -> list[tuple[str, str]]:
        """In-flight jobs that will not report: dead worker, past deadline, failed or vanished in RQ."""
        now_m = time.monotonic()
        if now_m - self._last_check < every or not self.inflight:
            return []
        self._last_check = now_m
        now = time.time()
        started = self.store.started()
        workers = self.workers(max_age=0.5)
        lost: list[tuple[str, str]] = []
        unstarted = []
        for job, info in self.inflight.items():
            st = started.get(job)
            if st is not None:
                age = now - float(st.get("t", now))
                if st.get("worker") not in workers and age > WORKER_TTL:
                    lost.append((job, f"worker {st.get('worker')} on {st.get('host')} stopped heartbeating"))
                elif age > self.deadline(info.get("kind", "es")):
                    lost.append((job, f"running for {age:.0f}s, past its deadline"))
            elif now - float(info.get("enqueued_at", now)) > 10.0:
                unstarted.append(job)
        rq_failed: list[str] = []
        if unstarted:
            pipe = self.r.pipeline(transaction=False)
            for job in unstarted:
                rq_job_status(pipe, job)
                queue = self.queues.get(self.inflight[job].get("kind", "es"), self.queues["es"])
                pipe.lpos(queue.key, job)
            replies = pipe.execute()
            for i, job in enumerate(unstarted):
                status, pos = replies[2 * i], replies[2 * i + 1]
                status = status.decode() if isinstance(status, bytes) else status
                info = self.inflight[job]
                waited = now - float(info.get("enqueued_at", now))
                if status == "queued" and pos is None and waited > 10.0 + WORKER_TTL:
                    # Taken off the queue by a worker (RQ moves it aside first) that never started
                    # it: the worker died or lost its network in between. RQ still says "queued".
                    lost.append((job, "dequeued by a worker that never started it"))
                elif status is None:
                    lost.append((job, "its RQ job vanished"))
                elif status in ("failed", "stopped", "canceled"):
                    lost.append((job, f"RQ marked it {status}"))
                    if status == "failed":
                        rq_failed.append(job)
                elif status in ("started", "finished") and waited > 10.0 + WORKER_TTL:
                    # RQ started it but the job never registered with us: the worker died early.
                    lost.append((job, f"RQ says {status} but the job never started here"))
                elif waited > self.cfg.job_timeout * 4:
                    lost.append((job, f"queued for {waited:.0f}s"))
        for job in rq_failed:
            self.breaker.failure(rq_failure_text(self.r, job), len(workers), self.inflight[job].get("kind", ""))
        return lost

    def release(self, jobs: list[str]) -> None:
        """Stop tracking jobs in memory (their Redis entries go with `forget` or `store.forget_jobs`)."""
        for job in jobs:
            self.inflight.pop(job, None)
        self.noise_ahead.drop(jobs)

    def forget(self, jobs: list[str], pipe=None) -> None:
        self.release(jobs)
        self.store.forget_jobs(jobs, pipe=pipe)


class DistCache:
    """μ/var of recent versions, in memory, for rebuilding ES individuals from (version, seed)."""

    def __init__(self, store: Store, keep: int = 16) -> None:
        self.store = store
        self.keep = keep
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._std: dict[int, np.ndarray] = {}

    def put(self, version: int, mu: np.ndarray, var: np.ndarray, std: np.ndarray | None = None) -> None:
        """Cache a version; `std`, when given, must be sqrt(var) in float32 (saves computing it)."""
        self._cache[version] = (mu, var)
        if std is None:
            self._std.pop(version, None)
        else:
            self._std[version] = std

    def get(self, version: int) -> tuple[np.ndarray, np.ndarray]:
        got = self._cache.get(version)
        if got is None:
            got = self.store.read_dist(version)
            self._cache[version] = got
        return got

    def get_std(self, version: int) -> tuple[np.ndarray, np.ndarray]:
        """(μ, sqrt(var)) as float32, the square root computed once per version."""
        mu, var = self.get(version)
        std = self._std.get(version)
        if std is None:
            mu32, std = noise.scale(mu, var)
            self._std[version] = std
            return mu32, std
        return np.asarray(mu, dtype=np.float32), std

    def prune(self, current: int, referenced: set[int]) -> list[int]:
        """Drop versions nobody refers to (keeping the newest `keep`); return those dropped."""
        dropped = []
        for v in sorted(self._cache):
            if v == current or v in referenced or v > current - self.keep:
                continue
            del self._cache[v]
            self._std.pop(v, None)
            dropped.append(v)
        return dropped


class NoiseAhead:
    """Computes the ε of dispatched ES jobs on a background thread while the jobs run.

    An ES result names only (version, seed); rebuilding z = μ_v + σ_v·ε(seed) is dominated by ε
    (about 1 ms at 129k parameters), which depends on the seed alone. Starting it at dispatch
    takes it off the path from result to update. Bounded: at most `max_bytes` of ε held.
    """

    # Below this many parameters ε costs less than handing it to a thread (and the thread would
    # compete for the GIL with the loop): it is computed when the result arrives.
    MIN_DIM = 16384

    def __init__(self, dim: int, max_bytes: int = 256 << 20) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.dim = dim
        self.limit = max(0, max_bytes // max(1, 4 * dim)) if dim >= self.MIN_DIM else 0
        # ε is numpy's PCG64 words and the compiled Box-Muller, both outside the GIL: threads on the
        # cores the loop leaves spread it (~1 ms a job at 129k parameters; 1,000 results/s need ~1 core).
        threads = max(1, min(4, (os.cpu_count() or 1) - 1))
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="aesrl-noise") if self.limit else None
        self._futures: dict[str, Any] = {}

    def submit(self, job: str, seed: int) -> None:
        if self._pool is not None and len(self._futures) < self.limit:
            self._futures[job] = (seed, self._pool.submit(noise.job_noise, seed, self.dim,
                                                                   kernels.perturbation))

    def take(self, job: str, seed: int) -> np.ndarray | None:
        """ε of `job` if it was computed for this very seed, else None."""
        got = self._futures.pop(job, None)
        if got is None:
            return None
        ahead_seed, fut = got
        if ahead_seed != seed:
            fut.cancel()
            return None
        try:
            return fut.result()
        except Exception:  # a bad seed: the caller recomputes and gets the error there
            return None

    def wait(self, job: str) -> None:
        """Block until ε of `job` is computed (benchmarks use this to time the apply alone)."""
        got = self._futures.get(job)
        if got is not None:
            got[1].exception()

    def drop(self, jobs) -> None:
        for job in jobs:
            got = self._futures.pop(job, None)
            if got is not None:
                got[1].cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._futures.clear()
