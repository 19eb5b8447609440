"""Dispatching: the run's RQ queues, the live workers (how many slots to keep busy), and `enqueue`,
which queues jobs and registers them in flight (scheduler/inflight.py) in one MULTI/EXEC.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from aesrl_queue.config import RunConfig
from aesrl_queue.optimizers.base import job_id
from aesrl_queue.store import QUEUE_ES, QUEUE_RL, live_workers
from scheduler.inflight import InFlight

JOB_FUNCTION = "workers.jobs.evaluate"  # by name only: the scheduler never imports worker code
QUEUES = {"rl": QUEUE_RL, "es": QUEUE_ES}  # job kind -> RQ queue (workers listen on the RL queue first)


class Dispatcher:
    """Enqueue evaluation jobs on RQ; `inflight` registers them (it is handed in: the loop owns it)."""

    def __init__(self, client: redis.Redis, cfg: RunConfig, inflight: InFlight) -> None:
        self.r = client
        self.store = inflight.store
        self.cfg = cfg
        self.inflight = inflight
        self.queues = {kind: Queue(name, connection=client, serializer=JSONSerializer) for kind, name in QUEUES.items()}
        self._workers_seen_at = 0.0
        self._workers: dict[str, dict[str, str]] = {}
        self.spec_hash = cfg.spec_hash  # a property that hashes the spec: once, not per job

    @staticmethod
    def queue_key(kind: str) -> str:
        """The Redis list of the RQ queue that jobs of `kind` wait on."""
        return Queue.redis_queue_namespace_prefix + QUEUES[kind]

    # -- workers -------------------------------------------------------------------------------
    def workers(self, max_age: float = 1.0) -> dict[str, dict[str, str]]:
        now = time.monotonic()
        if now - self._workers_seen_at > max_age:
            self._workers = live_workers(self.r)
            self._workers_seen_at = now
        return self._workers

    def slots(self) -> int:
        """Jobs to keep in flight: one running and queued_per_worker waiting per live worker."""
        return max(1, len(self.workers())) * (1 + self.cfg.queued_per_worker)

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
            self.inflight.add(jid, info, pipe)
            kwargs = {"run": cfg.run_id, "job": jid, "kind": spec["kind"], "version": int(spec["version"]),
                      "seed": int(spec["seed"]), "spec_hash": self.spec_hash,
                      "rl_steps": int(spec.get("rl_steps", 0)), "random_actions": bool(spec.get("random", False))}
            if not spec.get("mean", True):
                kwargs["mean_eval"] = False  # only then: the job arguments of every other job stay as they were
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
        return ids
