"""The deterministic virtual executor: a run of N workers in one process, in virtual time.

`aesrl-queue run --virtual-workers N` and `train(..., virtual_workers=N)` run the real scheduler loop
(scheduler/loop.py, with its optimizer), the real job function (workers.jobs.evaluate, through `run_held_job`
below) and the real critic daemon's learner (workers/critic.py) against an embedded Redis, so every
Store, job and learner code path is the one a real run takes. What differs is only who decides when
things happen: a heap of virtual times instead of RQ workers and the wall clock.

- A job starts when a virtual worker is free and the job has reached it (publish_latency_s after the
  commit that dispatched it; RL jobs first, in dispatch order, as an RQ worker takes them). It runs
  at once, for real, from what Redis holds then: the μ version current at its start, the critic
  published by then, the replay stored by then. What it reports (its episode and its result, the one
  Store.finish_job call) is held and made at its virtual completion: start + its duration under the
  cost model (aesrl_queue/cost_model.py), + result_latency_s.
- Results are told in virtual completion order; ties of time are broken by the order in which the
  events were made, which the same seed and cost model reproduce.
- The critic trains chunk after chunk, each n / learner_steps_per_s + publish_latency_s long, n as the
  daemon picks it (CriticDaemon.next_chunk), with the replay as of the chunk's start; it does nothing
  before critic_start_s (its process's start-up) after the run's start or resume.
- The scheduler's clock is the virtual one: the pace of publications (PUBLISH_HZ; jobs refilled in
  between draw on the last published version), the critic wait and its polls (every 50 ms while it waits for something, 500 ms while slots are free) run in virtual time.
  It tells one result at a time, tell_s each; a result that arrives meanwhile waits its turn.

The run folder is an ordinary one (config.json, metrics.jsonl, policy.npz, summary.json, the embedded
Redis's AOF in redis/) plus virtual.json: workers, cost model, virtual and wall seconds, resumes. In
metrics.jsonl `t` and `elapsed` are virtual seconds since the start, `worker` is the virtual worker
("virtual-3") and `duration` the job's virtual duration, so that the same seed and cost model give
the same file, byte for byte.

It resumes as an ordinary run does (`run --resume FOLDER`, `load(folder).resume()`), from what its
Redis holds: the optimizer's last commit, the results reported and not yet told (told first), the
critic's last checkpoint (every CRITIC_CHECKPOINT_S virtual seconds) and the virtual clock (state
`virtual_s`, written after every event). The jobs in flight at the stop, whose reports died with the
process, run again from their dispatched arguments (kept beside their in-flight entries), as queued
RQ jobs are taken again after a restart. What the process held and Redis does not (the event heap,
the critic's chunk in progress, its optimizer steps since its checkpoint and its random stream) is
not restored, so a resumed run continues the interrupted one but is not the uninterrupted run: the
records up to the stop are the same, those after it differ.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aesrl_queue.algorithms import algorithm
from aesrl_queue.codec import json_default
from aesrl_queue.config import ConfigError, RunConfig
from aesrl_queue.connection import connect
from aesrl_queue.cost_model import CostModel
from aesrl_queue.local import write_run_folder
from aesrl_queue.metrics import MetricsWriter
from aesrl_queue.optimizers import QUEUE_ALGOS, needs_critic_daemon
from aesrl_queue.redis_server import RedisServer
from aesrl_queue.store import Store, VirtualJobs, individual_ttl
from scheduler.loop import Scheduler

log = logging.getLogger(__name__)

VIRTUAL_FILE = "virtual.json"
# The scheduler loop's waits where nothing arrives (scheduler/loop.py `_loop`): 50 ms while its critic gate
# holds jobs for something outside (a critic), else 500 ms.
POLL_WAITING_S = 0.05
POLL_S = 0.5
# The critic's torch seed, apart from the run seed's other uses (a daemon process starts from torch's
# fixed default seed; here the daemon shares a process with the jobs, so its generator is its own).
CRITIC_SEED_OFFSET = 7919
# Events at one virtual time run in this order (then in the order they were made).
ORDER = {"free": 0, "arrive": 1, "result": 2, "commit": 3, "poll": 4, "critic": 5}
# Virtual seconds between checkpoints of the critic (the daemon's default, in wall seconds, is the same).
CRITIC_CHECKPOINT_S = 10.0


class VirtualRunError(RuntimeError):
    """A virtual run could not go on (its jobs keep failing); the message says why."""


# -- the job function, held ------------------------------------------------------------------------------
@dataclass
class HeldJob:
    """One job that has run: what it would have written at its end, kept until its virtual completion."""

    job: str
    kind: str
    rl_steps: int
    env_steps: int = 0
    failed: str = ""  # the failure's text, for a failed job
    report: Callable[[str, float], str | None] = field(default=lambda worker, duration: None, repr=False)


def run_held_job(client, kwargs: dict[str, Any]) -> HeldJob:
    """Run one job now through the job function's public entry (workers.jobs.evaluate, with the
    arguments the scheduler gave it and this client) and hold its report: the one call that ends a job,
    Store.finish_job (Store.append_result for a failed job), is recorded instead of made.
    `report(worker, duration)` makes it later, with the virtual worker's name and duration in the
    result; it returns the result's entry id. An RL job's trained individual (ind:{job}, with a
    wall-clock TTL) is written again then.

    The one place that knows how the job is called. workers.jobs.play (the job as a function of
    explicit inputs, returning an Outcome) lets this hold the Outcome instead of a Store call, once
    the writing of an Outcome takes the duration as an argument rather than timing it itself."""
    from workers import jobs

    calls: list[tuple[Callable, tuple, dict]] = []
    real_finish, real_append = Store.finish_job, Store.append_result

    def hold_finish(store, transitions, job, result, **kw):
        calls.append((real_finish, (store, transitions, job, dict(result)), kw))
        return ""

    def hold_append(store, fields, **kw):
        calls.append((real_append, (store, dict(fields)), kw))
        return ""

    held = HeldJob(job=kwargs["job"], kind=kwargs["kind"], rl_steps=int(kwargs.get("rl_steps", 0)))
    Store.finish_job, Store.append_result = hold_finish, hold_append
    try:
        jobs.evaluate(**kwargs, client=client)
    except Exception as exc:  # noqa: BLE001 - the job reported its failure (held); the run tells it
        held.failed = f"{type(exc).__name__}: {exc}"
    finally:
        Store.finish_job, Store.append_result = real_finish, real_append
    if len(calls) != 1:
        raise VirtualRunError(f"job {held.job} reported {len(calls)} times (once expected); "
                              f"{held.failed or 'it was no longer in flight'}")
    fn, args, kw = calls[0]
    store, result = args[0], args[-1]
    if fn is real_finish:  # every step it played: its episodes, μ's (stored as `more`, or only counted)
        episodes = [args[1], *(tr for _, tr in kw.get("more", ()))]
        held.env_steps = sum(int(tr["rew"].shape[0]) for tr in episodes) + int(kw.get("extra_interactions", 0))
    individual = None
    if result.get("ind"):
        individual = store.get_individual(result["ind"])
    ttl = individual_ttl(store.config())

    def report(worker: str, duration: float) -> str | None:
        result.update(worker=worker, duration=duration)
        if individual is not None:
            store.put_individual(result["job"], individual, ttl=ttl)
        entry = fn(*args, **kw)
        VirtualJobs(store).drop([held.job])  # reported: a resume does not run it again
        return entry

    held.report = report
    return held


def forget_job_context(client, run_id: str) -> None:
    """Drop the job function's per-process state of this run on this client (replay mirror, critic, actor),
    which it keys by the client's id: a later virtual run in this process may get a client at the same
    address and must not find this run's mirror."""
    from workers import jobs

    getattr(jobs, "_CONTEXTS", {}).pop((id(client), run_id), None)


# -- the scheduler loop, on the virtual clock ---------------------------------------------------------------
class _HeldQueue:
    """Stands in for one RQ queue of the dispatcher: the jobs the loop dispatches are handed to the
    executor, and their arguments kept in Redis in the commit's transaction, beside the in-flight
    entries the commit writes as always (a resume runs again those that never reported)."""

    def __init__(self, kind: str, sink: list[tuple[str, dict[str, Any]]], store: Store) -> None:
        self.kind, self.sink, self.store = kind, sink, store

    def enqueue_many(self, datas, pipeline=None) -> list:
        kwargs = [dict(d.kwargs) for d in datas]
        VirtualJobs(self.store).hold(kwargs, pipe=pipeline)
        self.sink.extend((self.kind, k) for k in kwargs)
        return []


class VirtualScheduler(Scheduler):
    """scheduler/loop.py's Scheduler with the virtual clock, N virtual workers' slots and no RQ: jobs
    go to the executor, none is ever lost, and the counters are read whenever asked for (a re-read
    paced by the wall clock would make the run depend on the machine's speed)."""

    def __init__(self, client, cfg: RunConfig, clock: Callable[[], float], slots: int) -> None:
        super().__init__(client, client, cfg)
        self.clock = clock
        self.slots = slots
        self.dispatched: list[tuple[str, dict[str, Any]]] = []

    def setup(self) -> None:
        super().setup()
        self.dispatch.queues = {kind: _HeldQueue(kind, self.dispatched, self.store) for kind in ("rl", "es")}
        self.dispatch.slots = lambda: self.slots
        self.breaker.limit = lambda target, inflight: target
        self.inflight.find_lost = lambda live_workers, every=1.0: []

    def _counters(self, max_age: float = 1.0) -> dict[str, int]:
        return super()._counters(max_age=-math.inf)


# -- the critic daemon, on the virtual clock ----------------------------------------------------------------
class VirtualCritic:
    """workers/critic.py's CriticDaemon driven chunk by chunk in virtual time: a chunk starts when the
    previous one is published (or, when the daemon waited for stored steps, when they arrive), trains
    at its start on the replay as of then, and is published cost.chunk_seconds(n) later."""

    def __init__(self, client, cfg: RunConfig, cost: CostModel, on_publish: Callable[[float], Any],
                 now: float = 0.0) -> None:
        import torch

        from workers.critic import CriticDaemon

        self.cfg, self.cost, self.on_publish = cfg, cost, on_publish
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed + CRITIC_SEED_OFFSET)
            self.daemon = CriticDaemon(client, client, cfg.run_id, device="cpu", cuda_graph=False,
                                       checkpoint_every=math.inf)
            self.rng = torch.get_rng_state()  # the daemon's own stream of the global generator
        self.daemon.restore()  # a resumed run's critic: its last checkpoint
        # the daemon's process start-up: it publishes nothing and trains nothing before then
        self.up_at = now + cost.critic_start_s
        self.free_at = self.up_at  # when the learner may start its next chunk
        self.checkpointed_at = now
        self.held: tuple[float, dict[str, float]] | None = None  # (publication time, stats) of the chunk trained

    def advance(self, t: float) -> None:
        """Publish every chunk that ends by `t`, and train every chunk that starts by `t`; the daemon's
        untrained actor is published at `t` when the random phase has ended by then, as the daemon does;
        nothing happens before the daemon is up (`up_at`, when the executor wakes it)."""
        d = self.daemon
        if t < self.up_at:
            return
        if self.held is None and d.publish_first_actor():
            self._stamp(t)
            self.on_publish(t)
        while True:
            if self.held is not None:
                at, stats = self.held
                if at > t:
                    return
                self.held = None
                d.publish(stats)
                self._stamp(at)
                if at - self.checkpointed_at >= CRITIC_CHECKPOINT_S:
                    d.checkpoint()  # for a resume; it changes nothing in this run
                    self.checkpointed_at = at
                self.on_publish(at)
            d.sync()
            n = d.next_chunk(self.cost.learner_steps_per_s)
            if not n:
                self.free_at = t  # idle: the next chunk starts no earlier than what comes next
                return
            d.refresh_target_policy()
            self.held = (self.free_at + self.cost.chunk_seconds(n), self._train(n))

    def _stamp(self, at: float) -> None:
        """After a publication at `at`: the daemon stamps it with the wall clock and its measured rate
        (here the virtual clock and the model's), and the learner is free from then."""
        self.daemon.store.set_state(critic_updated_at=at, critic_steps_per_s=self.cost.learner_steps_per_s)
        self.free_at = at

    def _train(self, n: int) -> dict[str, float]:
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.rng)
            stats = self.daemon.train_chunk(n)
            self.rng = torch.get_rng_state()
        return stats


# -- metrics in virtual time --------------------------------------------------------------------------------
class VirtualMetrics(MetricsWriter):
    """metrics.jsonl with `t` and `elapsed` in virtual seconds: the executor sets `now` before each poll
    (after every event, and at every critic publication).

    A resumed run keeps the file's complete records (their virtual times are nowhere else) and writes
    after them: `kept(path)` reads how many updates and which critic version the file holds, and the
    records that Redis gives again for those are not written twice."""

    now = 0.0
    kept_updates = 0
    kept_critic = 0
    _updates = 0
    _quiet = False

    def keep(self, kept_updates: int, kept_critic: int) -> None:
        self.kept_updates, self.kept_critic = kept_updates, kept_critic

    @staticmethod
    def kept(path: Path) -> tuple[int, int]:
        """Cut the file after its last complete record; (update records, last critic version) in it."""
        if not path.is_file():
            return 0, 0
        text = path.read_text()
        if not text.endswith("\n"):
            text = text[:text.rfind("\n") + 1]
            path.write_text(text)
        updates = critic = 0
        for line in text.splitlines():
            rec = json.loads(line)
            if rec.get("type") == "update":
                updates += 1
            elif rec.get("type") == "critic":
                critic = max(critic, int(rec.get("critic_version") or 0))
        return updates, critic

    def _write(self, rec: dict[str, Any]) -> None:
        kind = rec.get("type")
        if kind == "update":
            self._updates += 1
            self._quiet = self._updates <= self.kept_updates
        if (self._quiet and kind in ("update", "mu_eval")) or (
                kind == "critic" and int(rec.get("critic_version") or 0) <= self.kept_critic):
            return  # in the file already
        rec["t"] = rec["elapsed"] = round(self.now, 6)
        super()._write(rec)


# -- the executor -----------------------------------------------------------------------------------------
class VirtualRun:
    """One virtual run: `run()` runs it to its budget and writes the run folder; returns the summary.
    `VirtualRun.resumed(folder)` is the run of a virtual run folder, to continue it."""

    def __init__(self, cfg: RunConfig, workers: int, cost: CostModel | None = None, out_dir: str | os.PathLike = "runs",
                 run_dir: str | os.PathLike | None = None, say: Callable[[str], Any] = log.info,
                 progress_every: float = 10.0, resume: Callable[[Store], tuple[RunConfig, list[str]]] | None = None,
                 facts: dict[str, Any] | None = None) -> None:
        if algorithm(cfg.algo).executor != "queue":
            raise ConfigError("algo", f"{cfg.algo} trains in one process without workers; --virtual-workers "
                                      f"applies to {', '.join(QUEUE_ALGOS)}")
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ConfigError("virtual_workers", f"must be a positive integer, got {workers!r}")
        self.cfg, self.workers, self.cost = cfg, workers, cost or CostModel()
        self.run_dir = Path(run_dir) if run_dir is not None else Path(out_dir) / cfg.run_id
        self.say = say
        self.progress_every = progress_every  # wall seconds between progress lines (printing only)
        # N workers, each with queued_per_worker jobs waiting for it, as the real dispatcher keeps
        self._slots = workers * (1 + cfg.queued_per_worker)
        self.now = 0.0
        self.metrics: VirtualMetrics | None = None
        self.summary: dict[str, Any] | None = None
        self.events = 0
        # a resume: `resume(store) -> (cfg, notes)` checks the stored run (raises to refuse); `facts` are
        # the folder's virtual.json
        self.resume, self.facts = resume, dict(facts or {})
        self._started = False

    @classmethod
    def resumed(cls, run_dir: str | os.PathLike, resume: Callable[[Store], tuple[RunConfig, list[str]]] | None = None,
                say: Callable[[str], Any] = log.info) -> VirtualRun:
        """The run of a virtual run folder (its virtual.json: workers and cost model; its config.json), to
        continue with `run()`; `resume(store)` may change the budget. VirtualRunError if it is none."""
        run_dir = Path(run_dir)
        try:
            facts = json.loads((run_dir / VIRTUAL_FILE).read_text())
            cfg = RunConfig.from_dict(json.loads((run_dir / "config.json").read_text()))
        except (OSError, ValueError) as exc:
            raise VirtualRunError(f"{run_dir} is not a virtual run folder: {exc}") from None
        if not (run_dir / "redis").is_dir():
            raise VirtualRunError(f"{run_dir} keeps no Redis data (redis/): a virtual run of an earlier version "
                                  "does not resume; run it again with a larger --steps (the same seed and cost "
                                  "model give the same run)")
        return cls(cfg, int(facts["workers"]), CostModel.from_dict(facts["cost_model"]), run_dir=run_dir, say=say,
                   resume=resume or (lambda store: (store.config(), [])), facts=facts)

    # -- events --
    def _push(self, t: float, kind: str, payload: Any = None) -> None:
        heapq.heappush(self._heap, (t, ORDER[kind], next(self._seq), kind, payload))

    def _clock(self) -> float:
        return self.now

    def run(self) -> dict[str, Any]:
        import torch

        cfg = self.cfg
        data = self.run_dir / "redis"
        if self.resume is None and data.exists():
            raise VirtualRunError(f"{self.run_dir} holds a run's Redis data already: resume it "
                                  f"(run --resume {self.run_dir}) or delete the folder")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        server = RedisServer(directory=data, appendonly=True).start()
        client = connect(server.url)
        threads = torch.get_num_threads()
        # one thread, as every worker process has (OMP_NUM_THREADS=1): the same kernels, the same bits
        torch.set_num_threads(1)
        wall0 = time.monotonic()
        status = "failed"
        try:
            forget_job_context(client, cfg.run_id)
            status = self._run(client)
        finally:
            torch.set_num_threads(threads)
            forget_job_context(client, cfg.run_id)
            try:
                if self.metrics is not None:
                    self.metrics.now = self.now
                    self.metrics.close()
                store = Store(client, self.cfg.run_id)
                if self._started and store.exists():  # not a resume refused before it read its clock
                    if store.status() in ("running", "draining"):
                        store.set_state(status="stopped", updated_at=time.time())
                    summary = write_run_folder(self.run_dir, store)
                    self.summary = self._record(summary, time.monotonic() - wall0)
            finally:
                client.close()
                server.stop()
        return self.summary or {"status": status}

    def _write_facts(self, **more: Any) -> dict[str, Any]:
        """virtual.json: what makes the folder a virtual run (written at the start, so that a stopped run
        resumes with its workers and cost model, and again at the end)."""
        facts = {"virtual": True, "workers": self.workers, "slots": self._slots, "cost_model": self.cost.to_dict(),
                 "virtual_s": round(self.now, 6), "wall_s": self.facts.get("wall_s", 0.0),
                 "events": self.facts.get("events", 0), "resumes": self.facts.get("resumes", []),
                 "time": "t and elapsed in metrics.jsonl are virtual seconds since the start", **more}
        path = self.run_dir / VIRTUAL_FILE
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(facts, indent=2) + "\n")
        os.replace(tmp, path)
        return facts

    def _record(self, summary: dict[str, Any], wall_s: float) -> dict[str, Any]:
        """virtual.json, and the virtual facts in summary.json (elapsed_s in virtual seconds); wall seconds
        and events add up over a run's incarnations."""
        facts = self._write_facts(wall_s=round(self.facts.get("wall_s", 0.0) + wall_s, 1),
                                  events=self.facts.get("events", 0) + self.events)
        summary = {**summary, "elapsed_s": round(self.now, 1), "virtual": facts}
        path = self.run_dir / "summary.json"
        path.write_text(json.dumps(summary, indent=2, default=json_default))
        return summary

    def _start(self, client, store: Store) -> None:
        """A new run: its config; a resume: the stored run checked, its budget, its virtual clock."""
        cfg = self.cfg
        if self.resume is None:
            if not store.write_config(cfg):
                raise VirtualRunError(f"run {cfg.run_id} already exists in the virtual run's Redis")
        else:
            if not store.exists():
                raise VirtualRunError(f"the Redis data in {self.run_dir / 'redis'} holds no run {cfg.run_id!r}")
            cfg, notes = self.resume(store)
            for note in notes:
                self.say(f"resume: {note}")
            if cfg.total_steps != store.config().total_steps:
                store.replace_config(cfg)
            self.cfg = cfg
            st = store.state()
            self.now = float(st.get("virtual_s") or 0.0)
            store.set_state(finished_at=None)
            self.facts["resumes"] = [*self.facts.get("resumes", []), {
                "virtual_s": round(self.now, 6), "steps": int(st.get("steps", 0)), "total_steps": cfg.total_steps,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]
            self.say(f"resuming virtual run {cfg.run_id} at virtual {self.now:,.3f} s, {st.get('steps', 0):,} of "
                     f"{cfg.total_steps:,} steps")
        (self.run_dir / "config.json").write_text(json.dumps(self.cfg.to_dict(), indent=2, default=json_default))
        self._write_facts()
        self._started = True

    def _run(self, client) -> str:
        store = Store(client, self.cfg.run_id)
        self._start(client, store)
        cfg, cost = self.cfg, self.cost
        sched = VirtualScheduler(client, cfg, self._clock, self._slots)
        sched.setup()
        path = self.run_dir / "metrics.jsonl"
        kept = VirtualMetrics.kept(path) if self.resume is not None else (0, 0)
        self.metrics = metrics = VirtualMetrics(client, cfg.run_id, path, append=self.resume is not None)
        metrics.keep(*kept)
        metrics.now = self.now

        def published(at: float) -> None:
            metrics.now = at
            metrics.poll()

        critic = VirtualCritic(client, cfg, cost, published, now=self.now) if needs_critic_daemon(cfg) else None
        self._heap: list = []
        self._seq = itertools.count()
        if critic is not None and critic.up_at > self.now:
            self._push(critic.up_at, "critic")  # the daemon is up: it looks at the run then
        free = list(range(self.workers))  # idle virtual workers (lowest first)
        queues: dict[str, deque] = {"rl": deque(), "es": deque()}
        commits: set[float] = set()  # times of the publication wake-ups in the heap
        poll_at: list[float | None] = [None]  # the poll event in the heap (one at a time)
        draining = False
        busy_until = self.now  # the scheduler tells one result at a time, tell_s each
        failures = 0
        said = time.monotonic()

        def dispatched() -> None:
            for kind, kwargs in sched.dispatched:
                self._push(self.now + cost.publish_latency_s, "arrive", (kind, kwargs))
            sched.dispatched.clear()

        def start_jobs() -> None:
            while free and (queues["rl"] or queues["es"]):
                kwargs = (queues["rl"] or queues["es"]).popleft()
                slot = heapq.heappop(free)
                held = run_held_job(client, kwargs)
                seconds = cost.job_seconds(held.env_steps, max(1, held.rl_steps) if held.kind == "rl" else 0)
                seconds *= cost.spread(cfg.seed, held.job)
                self._push(self.now + seconds + cost.worker_gap_s, "free", slot)
                self._push(self.now + seconds + cost.result_latency_s, "result", (held, slot, seconds))

        if self.resume is not None:
            # what was reported and not yet told is told first (as a restarted loop reads from
            # last_result_id); the jobs still in flight never reported: they run again, in dispatch order
            while batch := sched.results.read(sched.last_id, None):
                sched.apply(batch, refill=False)
            held = VirtualJobs(store).all()
            VirtualJobs(store).drop([job for job in held if job not in sched.inflight])
            lost = [job for job in sched.inflight if job not in held]
            if lost:
                raise VirtualRunError(f"jobs in flight without their arguments, which cannot run again: {lost[:5]}")
            for job in sorted(sched.inflight, key=lambda j: int(sched.inflight[j]["n"])):
                self._push(self.now + cost.publish_latency_s, "arrive", (held[job]["kind"], held[job]))
            if sched.inflight:
                self.say(f"resume: {len(sched.inflight)} jobs in flight at the stop run again")
        sched.apply([], refill=True)  # the first jobs (a resume's: for the free slots)
        dispatched()
        saved_at = None  # the virtual time last written to Redis
        put_back_at = None  # the time of the last event, when it was a result put back to wait for the scheduler
        while True:
            if sched.opt.version != sched.published and sched._next_publish() not in commits:
                # a new version waits for its publication slot: the loop wakes then, as the real one does
                commits.add(sched._next_publish())
                self._push(sched._next_publish(), "commit")
            if poll_at[0] is None and not draining and len(sched.inflight) < self._slots:
                # free slots: the loop looks again after its read's timeout, as the real one does
                poll_at[0] = self.now + (POLL_WAITING_S if sched.gate.waiting else POLL_S)
                self._push(poll_at[0], "poll")
            if not self._heap:  # a loop with free slots always has a poll ahead: only a drained run ends here
                raise VirtualRunError(f"nothing left to happen at virtual {self.now:.3f} s with "
                                      f"{len(sched.inflight)} jobs in flight")
            t, _, _, kind, payload = heapq.heappop(self._heap)
            self.now = t
            self.events += 1
            if kind == "result" and busy_until > t and put_back_at == t:
                # another result waiting for the scheduler at the instant the last one was put back: nothing
                # has happened since, so the critic, the metrics and the state have nothing new to read.
                # (When N jobs end together, N - 1 wait and each tell puts every waiting one back: N² / 2
                # events, which must not cost a Redis round trip each.)
                self._push(busy_until, "result", payload)
                continue
            put_back_at = None
            if kind == "commit":
                commits.discard(t)
            elif kind == "poll":
                poll_at[0] = None
            if critic is not None:
                critic.advance(t)
            if kind == "arrive":
                queues[payload[0]].append(payload[1])
                start_jobs()
            elif kind == "free":
                heapq.heappush(free, payload)
                start_jobs()
            elif kind == "result" and busy_until > t:
                self._push(busy_until, "result", payload)  # the scheduler is telling another result
                put_back_at = t
            elif kind == "result":
                busy_until = t + cost.tell_s
                held, slot, seconds = payload
                held.report(f"virtual-{slot}", seconds)
                failures = failures + 1 if held.failed else 0
                if failures > max(20, 2 * self._slots):
                    raise VirtualRunError(f"{failures} jobs in a row failed; the last: {held.failed}")
                sched.apply(sched.results.read(sched.last_id, None), refill=not draining)
            elif kind != "critic":  # commit, poll: what the loop does when its read times out
                sched.apply([], refill=not draining)
            dispatched()
            metrics.now = t
            metrics.poll()
            if t != saved_at:  # the virtual clock, for a resume
                store.set_state(virtual_s=repr(t))
                saved_at = t
            if not draining and sched.opt.done(sched._counters()["steps"]):
                draining = True
                store.set_state(status="draining")
            if draining and not sched.inflight:
                break
            if time.monotonic() - said >= self.progress_every:
                said = time.monotonic()
                self._progress(store)
        sched._finish()
        return "finished"

    def _progress(self, store: Store) -> None:
        st = store.state()
        f_mu = st.get("f_mu")
        shown = f"{f_mu:.1f}" if isinstance(f_mu, float) and math.isfinite(f_mu) else "-"
        self.say(f"virtual {self.now:,.1f} s  {st['steps']:,}/{self.cfg.total_steps:,} steps  f(μ) {shown}  "
                 f"v{st.get('version', 0)}  critic v{st.get('critic_version', 0)}  {self.events:,} events")


def run_virtual(cfg: RunConfig, workers: int, cost: CostModel | None = None, out_dir: str | os.PathLike = "runs",
                say: Callable[[str], Any] = log.info) -> VirtualRun:
    """Run `cfg` on `workers` virtual workers under `cost` (the nominal CostModel when None); the run,
    its folder written (`.run_dir`, `.summary`)."""
    run = VirtualRun(cfg, workers, cost, out_dir=out_dir, say=say)
    run.run()
    return run
