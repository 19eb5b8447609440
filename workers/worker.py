"""`AesrlWorker`: the RQ worker class that users start with `rq worker -w workers.AesrlWorker`.

A SimpleWorker (no fork per job: torch state, environments and the replay mirror persist; CUDA
works) that only deserializes JSON, only runs functions from `workers.jobs`, uses one torch
thread, and heartbeats every couple of seconds so the scheduler sees a dead worker at once.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
import threading
import time

import redis
from rq.exceptions import DeserializationError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from rq.utils import now
from rq.worker import SimpleWorker, WorkerStatus

from aesrl_queue.connection import backoff_retry, use_packer, wait_until_reachable, warn_if_open
from aesrl_queue.store import QUEUE_ES, QUEUE_RL, Store, worker_beat, worker_gone
from workers import jobs, replica

log = logging.getLogger(__name__)

# AesrlWorker overrides RQ 3's worker internals (each override below names the RQ 3.0.0 code it
# depends on): under RQ 2 every job fails, and RQ 4 may change any of them, so both are refused.
RQ_REQUIRED = (3, 0)
RQ_BELOW = (4, 0)
RQ_RANGE = "rq>=3.0,<4"

HEARTBEAT_EVERY = 2.0  # seconds; the key lives WORKER_TTL seconds
RQ_HEARTBEAT_EVERY = 5.0  # seconds between refreshes of RQ's own worker key (see heartbeat)


class AllowlistJob(Job):
    """A Job that refuses to call anything but the functions of `workers.jobs`.

    JSON removes pickle's code execution, but RQ would still import and call any dotted name a
    Redis writer stores in a job; this closes that door (and callbacks, which resolve the same way).
    A job class is an RQ extension point (`rq worker --job-class`, the worker's job_class); the
    check reads RQ 3.0.0's Job.func, func_name, instance and the callback names Job.create stores in
    _success/_failure/_stopped_callback_name (rq/job.py), which the job's callback properties
    would import.
    """

    @property
    def func(self):
        if self.instance is not None or self.func_name not in jobs.ALLOWED_FUNCTIONS:
            raise PermissionError(
                f"refusing to run {self.func_name!r}: an AesrlWorker only runs {', '.join(jobs.ALLOWED_FUNCTIONS)}"
            )
        for name in ("_success_callback_name", "_failure_callback_name", "_stopped_callback_name"):
            if getattr(self, name, None):
                raise PermissionError(f"refusing job {self.id}: callbacks are not allowed ({name})")
        return super().func


class UnsupportedRQ(SystemExit):
    """The installed RQ cannot run an AesrlWorker: `rq worker` prints the one line and exits 1."""


def rq_problem(version: str | None = None) -> str | None:
    """Why this RQ (the installed one, or `version`) cannot run an AesrlWorker; None when it can."""
    if version is None:
        import rq

        version = rq.__version__
    parts = []
    for piece in (version.split(".") + ["0"])[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    if RQ_REQUIRED <= tuple(parts) < RQ_BELOW:
        return None
    why = "it overrides RQ 3's worker internals"
    if tuple(parts) >= RQ_BELOW:
        why += f", which RQ {parts[0]} may have changed; it was written for RQ 3"
    return f"rq {version} is installed; an AesrlWorker needs {RQ_RANGE} ({why}): pip install '{RQ_RANGE}'"


def _limit_threads() -> bool:
    """One torch thread. torch is imported by the first RL job that trains an actor only (a worker of ES jobs and
    needs its ~180 MB and seconds of start-up); until then the environment variables, which torch
    reads when it is imported, do the job. True once torch itself was told."""
    n = int(os.environ.get("AESRL_TORCH_THREADS", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    os.environ.setdefault("MKL_NUM_THREADS", str(n))
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    torch.set_num_threads(n)
    return True


def _log_like_rq() -> None:
    """`rq worker` sets up logging for RQ's own logger only: give this project's loggers a handler
    too, or their lines (Redis outages, refused jobs) reach stderr without time or level."""
    if logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    for name in ("aesrl_queue", "workers"):
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)


class AesrlWorker(SimpleWorker):
    """SimpleWorker + JSON + allowlist + one torch thread + a fast heartbeat."""

    def __init__(self, queues=None, *args, **kwargs):
        problem = rq_problem()
        if problem:  # refuse at once: with an older RQ every job would fail in perform_job
            raise UnsupportedRQ(f"error: {problem}")
        self._rq_beat: tuple[float, int] | None = None  # (when, TTL) of the last refresh of RQ's worker key
        kwargs["serializer"] = JSONSerializer
        kwargs["job_class"] = AllowlistJob
        if not queues:
            queues = [QUEUE_RL, QUEUE_ES]
        super().__init__(queues, *args, **kwargs)
        # Ride out a short Redis restart inside a job (~9 s of backoff) instead of failing at once.
        self.connection.set_retry(backoff_retry())
        # `rq worker -u URL` made this client: send RL individuals and episodes without a copy.
        use_packer(self.connection)
        self._torch_limited = _limit_threads()
        _log_like_rq()
        warn_if_open(self.connection)  # a password in `-u URL` that the server does not ask for
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        self._current: dict[str, str] = {}
        self._jobs_done = 0
        self._started_at = time.time()
        jobs.WORKER_NAME = self.name

    # -- heartbeat ------------------------------------------------------------------------------
    def _beat(self) -> None:
        fields = {
            "name": self.name, "host": socket.gethostname(), "pid": os.getpid(),
            "queues": ",".join(q.name for q in self.queues), "jobs_done": self._jobs_done,
            "started_at": self._started_at, "last_seen": time.time(),
            "job": self._current.get("job", ""), "kind": self._current.get("kind", ""),
            "run": self._current.get("run", ""),
            # reads meant for the host's replica that went to the primary (`status` sums them per host)
            "fallbacks": replica.fallbacks(),
        }
        worker_beat(self.connection, self.name, fields)

    def _heartbeat_loop(self) -> None:
        failures = 0
        while not self._hb_stop.wait(HEARTBEAT_EVERY):
            try:
                self._beat()
                if failures:
                    log.info("heartbeat to Redis restored after %d failed attempts", failures)
                failures = 0
            except Exception as exc:  # Redis down for a moment: keep trying, say so once
                failures += 1
                if failures == 1:
                    log.warning("heartbeat failed (%s); retrying every %.0fs", exc, HEARTBEAT_EVERY)

    def work(self, *args, **kwargs):
        # Worker.work(burst, ...) is RQ's documented entry point (rq/worker/base.py in 3.0.0; `rq
        # worker` calls it); wrapped whole, with its arguments passed through, not reimplemented.
        try:
            self._beat()
        except Exception as exc:
            log.warning("first heartbeat failed: %s", exc)
        self._check_replica()
        self._hb_thread = threading.Thread(target=self._heartbeat_loop, name="aesrl-heartbeat", daemon=True)
        self._hb_thread.start()
        try:
            return super().work(*args, **kwargs)
        finally:
            self._hb_stop.set()
            try:
                worker_gone(self.connection, self.name)
            except Exception:  # Redis gone at shutdown: the key expires on its own
                pass

    def _check_replica(self) -> None:
        """Say at start-up whether $AESRL_READ_URL names a replica that jobs can read from."""
        try:
            reader = replica.reader_for(self.connection)
            if reader.replica is not None:
                info = reader.check()
                log.info("worker %s reads run data from replica %s (link %s)", self.name,
                         replica.redact(reader.url), info.get("master_link_status"))
        except Exception as exc:  # still works: every read falls back to the primary
            log.warning("worker %s: %s; reads go to the primary when the replica cannot answer", self.name, exc)

    # -- RQ internals this class overrides ----------------------------------------------------------
    # RQ documents worker subclasses (`rq worker -w`), job classes, serializers, exception handlers
    # and the work() arguments, but no hook for the two things below: riding out a Redis outage in
    # RQ's own bookkeeping, and writing that bookkeeping in fewer round trips. Exception handlers and
    # job callbacks run only after RQ's bookkeeping for the job succeeded, so they cannot catch an
    # outage in it, and callbacks are refused by AllowlistJob. Each override keeps RQ's signature and
    # calls RQ's method; each names the RQ 3.0.0 code it depends on. rq_problem refuses RQ 4.

    # Redis outages. RQ's work loop (BaseWorker.work, rq/worker/base.py) quits on any Redis error
    # outside dequeue_job_and_maintain_ttl, which retries on its own. A worker serves for hours and
    # must outlive a Redis restart: wait for Redis, say so, and tell the scheduler about the job the
    # outage interrupted so that its slot is refilled at once (not after the job deadline).
    def execute_job(self, job, queue):
        # BaseWorker.execute_job(job, queue) is the method RQ leaves to worker classes
        # (rq/worker/base.py); SimpleWorker.execute_job (rq/worker/worker_classes.py) runs
        # prepare_execution, perform_job and set_state(IDLE), all of RQ's per-job Redis writes.
        try:
            kwargs = job.kwargs if isinstance(job.kwargs, dict) else {}
        except DeserializationError:  # not JSON (a planted pickle): RQ fails the job; we go on
            kwargs = {}
        # The heartbeat thread publishes this within HEARTBEAT_EVERY; no extra round trip per job
        # (the scheduler learns that the job started from the job's own start script).
        self._current = {"job": str(kwargs.get("job", job.id)), "kind": str(kwargs.get("kind", "")),
                         "run": str(kwargs.get("run", ""))}
        try:
            try:
                return super().execute_job(job, queue)
            finally:
                self._jobs_done += 1
                self._current = {}
                if not self._torch_limited:
                    self._torch_limited = _limit_threads()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._wait_for_redis(exc, f"worker {self.name} (job {job.id} interrupted)")
            self._report_interrupted(job, exc)
            try:
                self.set_state(WorkerStatus.IDLE)
            except (redis.ConnectionError, redis.TimeoutError):
                pass

    def check_for_suspension(self, burst: bool):
        # BaseWorker.check_for_suspension(burst) (rq/worker/base.py), called first in each turn of
        # BaseWorker.work's loop, outside the loop's Redis retries.
        try:
            return super().check_for_suspension(burst)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._wait_for_redis(exc, f"worker {self.name}")

    def run_maintenance_tasks(self):
        # BaseWorker.run_maintenance_tasks() (rq/worker/base.py), called by BaseWorker.work's loop
        # outside its Redis retries, every maintenance_interval.
        try:
            return super().run_maintenance_tasks()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._wait_for_redis(exc, f"worker {self.name} (maintenance skipped)")

    # RQ's own bookkeeping, in fewer round trips. A SimpleWorker refreshes its RQ worker key (HSET +
    # 2 EXPIRE, one round trip each) three times per job and writes state "idle" twice; that is 11 of
    # its ~21 round trips per job. Here the refresh is pipelined, skipped when the same TTL was set
    # less than RQ_HEARTBEAT_EVERY seconds ago (the key lives worker_ttl + 60 s, 480 s by default),
    # and sent with the "idle" state that follows a job; "idle" is not written again when it is what
    # this worker last wrote. What RQ stores is the same; `last_heartbeat` is at most
    # RQ_HEARTBEAT_EVERY seconds old instead of a job old (tests/test_worker_rq.py compares the
    # records and the commands).
    def heartbeat(self, timeout=None, pipeline=None):
        # BaseWorker.heartbeat(timeout, pipeline) (rq/worker/base.py): HSET last_heartbeat and EXPIRE
        # of the worker key and its executions key. BaseWorker.work calls it after each job and
        # dequeue_job_and_maintain_ttl before and after each dequeue, without a pipeline;
        # prepare_job_execution and maintain_heartbeats pass theirs, which is always honoured.
        ttl = timeout or self.worker_ttl + 60
        if pipeline is not None:
            super().heartbeat(timeout, pipeline)
            self._rq_beat = (time.monotonic(), ttl)
            return
        if not self._rq_beat_due(ttl):
            return
        try:
            pipe = self.connection.pipeline(transaction=False)
            super().heartbeat(timeout, pipe)
            pipe.execute()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._wait_for_redis(exc, f"worker {self.name}")
            return self.heartbeat(timeout)
        self._rq_beat = (time.monotonic(), ttl)

    def _rq_beat_due(self, ttl: int) -> bool:
        at, last_ttl = self._rq_beat or (-math.inf, None)
        return last_ttl != ttl or time.monotonic() - at >= RQ_HEARTBEAT_EVERY

    def handle_execution_ended(self, job, queue, heartbeat_ttl):
        # BaseWorker.handle_execution_ended(job, queue, heartbeat_ttl) (rq/worker/base.py) sets
        # job.ended_at and writes the job's last_heartbeat in a round trip of its own. On success
        # BaseWorker._finalize_success calls it just before handle_job_success, whose transaction
        # saves the job hash whole (Job._handle_success -> Job.save, rq/job.py), last_heartbeat
        # included; so only a failed or stopped job needs RQ's write.
        if job.get_status(refresh=False) in (JobStatus.FAILED, JobStatus.STOPPED):
            return super().handle_execution_ended(job, queue, heartbeat_ttl)
        job.ended_at = job.last_heartbeat = now()

    def set_state(self, state, pipeline=None):
        # BaseWorker.set_state(state, pipeline) (rq/worker/base.py): HSET state and self._state.
        # "idle" comes from SimpleWorker.execute_job after each job and from
        # dequeue_job_and_maintain_ttl before each dequeue, both without a pipeline.
        if pipeline is not None or state != WorkerStatus.IDLE:
            return super().set_state(state, pipeline)
        if state == getattr(self, "_state", None):
            return
        # Back to idle after a job: the refresh that RQ's loop asks for next rides along.
        try:
            pipe = self.connection.pipeline(transaction=False)
            super().set_state(state, pipe)
            if self._rq_beat_due(self.worker_ttl + 60):
                self.heartbeat(pipeline=pipe)
            pipe.execute()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._wait_for_redis(exc, f"worker {self.name}")
            self._state = self._rq_beat = None  # neither reached Redis: send both again
            return self.set_state(state)

    def _wait_for_redis(self, exc: BaseException, what: str) -> None:
        if not wait_until_reachable(self.connection, what, exc):
            raise exc

    def _report_interrupted(self, job, exc: BaseException) -> None:
        kw = job.kwargs if isinstance(job.kwargs, dict) else {}
        if job.func_name != "workers.jobs.evaluate" or not kw.get("run") or not kw.get("job"):
            return
        try:
            Store(self.connection, str(kw["run"])).append_result({
                "job": kw["job"], "kind": kw.get("kind", ""), "version": int(kw.get("version", 0)),
                "seed": int(kw.get("seed", 0)), "spec_hash": kw.get("spec_hash", ""), "worker": self.name,
                "rl_steps": int(kw.get("rl_steps", 0)), "status": "failed",
                "error": f"Redis became unreachable during the job: {exc}"[:2000],
            })
        except Exception as report_exc:  # the run is gone or unreadable: its scheduler finds the job lost
            log.warning("could not report the interrupted job %s: %s", job.id, report_exc)
