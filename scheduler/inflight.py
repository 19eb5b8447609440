"""The jobs in flight, in one place: what the loop dispatched and has not settled yet.

`InFlight` holds, per job, its in-flight entry (kind, version, seed, n, enqueued_at, rl_steps,
random, extra) as Redis's `inflight` hash holds it, the ε computed ahead for an ES job
(scheduler/noise_ahead.py), and how long jobs of each kind took (their deadline). A job enters with
`add` (in the MULTI/EXEC that queues it), leaves memory with `settle` (its result) or `release` (lost
or abandoned), and leaves Redis with the commit's `Store.forget_jobs`. `find_lost` names the jobs that
will not report.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import redis

from aesrl_queue.config import RunConfig
from aesrl_queue.store import WORKER_TTL, Store, rq_failure_text, rq_job_status
from scheduler.noise_ahead import NoiseAhead


class InFlight(Mapping):
    """job id -> in-flight entry, loaded from Redis at set-up; the loop's only record of its jobs."""

    def __init__(self, client: redis.Redis, store: Store, cfg: RunConfig, queue_keys: dict[str, str]) -> None:
        self.r = client
        self.store = store
        self.cfg = cfg
        self.queue_keys = queue_keys  # kind -> the RQ queue's list key (a job taken off it is dequeued)
        self.jobs: dict[str, dict[str, Any]] = store.inflight()
        self.noise = NoiseAhead(cfg.actor_dim)
        self.durations: dict[str, deque] = {"es": deque(maxlen=50), "rl": deque(maxlen=50)}
        self._last_check = 0.0

    def __getitem__(self, job: str) -> dict[str, Any]:
        return self.jobs[job]

    def __iter__(self) -> Iterator[str]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    # -- in and out ----------------------------------------------------------------------------------
    def add(self, job: str, info: dict[str, Any], pipe) -> None:
        """Register a job in `pipe` (the MULTI/EXEC that queues it) and in memory; an ES job's ε starts now."""
        self.store.add_inflight(job, info, pipe=pipe)
        self.jobs[job] = info
        if info["kind"] == "es":
            self.noise.submit(job, int(info["seed"]))

    def settle(self, job: str, seed: int) -> tuple[dict[str, Any], np.ndarray | None] | None:
        """A job reported: (its entry, its ε if computed ahead for `seed`), out of memory at once (a second
        result of it is then stale); None when it is not in flight. Its Redis entry goes with the commit."""
        if job not in self.jobs:
            return None
        return self.jobs.pop(job), self.noise.take(job, seed)

    def note_duration(self, kind: str, seconds: float) -> None:
        """How long a job that was told took (its kind's deadline follows the longest of the last 50)."""
        if math.isfinite(seconds) and seconds > 0:
            self.durations[kind].append(seconds)

    def release(self, jobs: list[str]) -> None:
        """Stop tracking jobs in memory (their Redis entries go with `forget` or the commit's `forget_jobs`)."""
        for job in jobs:
            self.jobs.pop(job, None)
        self.noise.drop(jobs)

    def forget(self, jobs: list[str], pipe=None) -> None:
        self.release(jobs)
        self.store.forget_jobs(jobs, pipe=pipe)

    def close(self) -> None:
        """Stop computing ε ahead (the loop ends, or throws its memory away after an outage)."""
        self.noise.close()

    # -- lost jobs -----------------------------------------------------------------------------------
    def deadline(self, kind: str) -> float:
        if self.cfg.job_deadline > 0:
            return self.cfg.job_deadline
        d = self.durations[kind]
        if not d:
            # Nothing seen of this kind yet (an RL job can take minutes where ES takes a second).
            return float(self.cfg.job_timeout)
        # Generous: a dead worker is caught by its heartbeat; the deadline catches a hung job.
        return min(float(self.cfg.job_timeout), max(120.0, 4.0 * max(d)))

    def find_lost(self, live_workers: Callable[..., dict[str, Any]], every: float = 1.0) -> list[tuple[str, str, str]]:
        """(job, why, RQ's failure text or "") of in-flight jobs that will not report: dead worker,
        past deadline, failed or vanished in RQ. Checked at most every `every` seconds;
        `live_workers(max_age)` names the workers that heartbeat (Dispatcher.workers)."""
        now_m = time.monotonic()
        if now_m - self._last_check < every or not self.jobs:
            return []
        self._last_check = now_m
        now = time.time()
        started = self.store.started()
        workers = live_workers(max_age=0.5)
        lost: list[tuple[str, str, str]] = []
        unstarted = []
        for job, info in self.jobs.items():
            st = started.get(job)
            if st is not None:
                age = now - float(st.get("t", now))
                if st.get("worker") not in workers and age > WORKER_TTL:
                    lost.append((job, f"worker {st.get('worker')} on {st.get('host')} stopped heartbeating", ""))
                elif age > self.deadline(info.get("kind", "es")):
                    lost.append((job, f"running for {age:.0f}s, past its deadline", ""))
            elif now - float(info.get("enqueued_at", now)) > 10.0:
                unstarted.append(job)
        if unstarted:
            pipe = self.r.pipeline(transaction=False)
            for job in unstarted:
                rq_job_status(pipe, job)
                pipe.lpos(self.queue_keys.get(self.jobs[job].get("kind", "es"), self.queue_keys["es"]), job)
            replies = pipe.execute()
            for i, job in enumerate(unstarted):
                status, pos = replies[2 * i], replies[2 * i + 1]
                status = status.decode() if isinstance(status, bytes) else status
                why = self._unstarted(status, pos, now - float(self.jobs[job].get("enqueued_at", now)))
                if why:
                    lost.append((job, why, rq_failure_text(self.r, job) if status == "failed" else ""))
        return lost

    def _unstarted(self, status: str | None, pos: int | None, waited: float) -> str:
        """Why a job that never started here is lost (RQ's status, its queue position), or ""."""
        if status == "queued" and pos is None and waited > 10.0 + WORKER_TTL:
            # Taken off the queue by a worker (RQ moves it aside first) that never started
            # it: the worker died or lost its network in between. RQ still says "queued".
            return "dequeued by a worker that never started it"
        if status is None:
            return "its RQ job vanished"
        if status in ("failed", "stopped", "canceled"):
            return f"RQ marked it {status}"
        if status in ("started", "finished") and waited > 10.0 + WORKER_TTL:
            # RQ started it but the job never registered with us: the worker died early.
            return f"RQ says {status} but the job never started here"
        if waited > self.cfg.job_timeout * 4:
            return f"queued for {waited:.0f}s"
        return ""
