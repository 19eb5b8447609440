"""The cost model of the virtual executor (aesrl_queue/virtual.py): how long, in virtual seconds, a job,
a result's trip and a critic chunk take. A JSON file holds one; `aesrl-queue calibrate` measures one on
this machine for a run's config and writes it.

    {"env_step_s": 5e-05, "actor_step_s": 0.002, "learner_steps_per_s": 1000.0,
     "result_latency_s": 0.002, "publish_latency_s": 0.005, "job_overhead_s": 0.005, "tell_s": 0.00065,
     "worker_gap_s": 0.0, "duration_spread": 0.0}

A job takes job_overhead_s + env_step_s × (environment steps it played: its episode or antithetic
pair and its f(μ) episodes) + actor_step_s × (its RL actor steps). Its result reaches the scheduler
result_latency_s after the job ends. A commit's new μ version and the jobs it dispatches reach the
workers publish_latency_s after the commit; the critic spends a chunk's steps / learner_steps_per_s on a
chunk and publish_latency_s on publishing its weights, one after the other, as the daemon does. The
scheduler is one server: it spends tell_s on each result, and a result that arrives while it is busy
waits its turn, which bounds a run's results per second by 1 / tell_s. A worker takes its next job
worker_gap_s after its last one ended (an RQ worker's dequeue and the job's setup, which a job's
measured `duration` leaves out; on 2 shared cores real workers spend 10-30 ms there per Pendulum job).
With duration_spread s > 0 each job's duration is that times a lognormal factor of mean 1 and
coefficient of variation s, drawn from the run's seed and the job's id (the same run again gives the
same factors): real workers' durations spread (on 2 shared cores, by 0.25-0.65 of their mean).
The critic daemon publishes nothing and trains nothing before critic_start_s after the run's start (or
its resume): a real daemon is a process of its own that needs seconds to start (1.5-2.0 s on an H200
host), and what the run does in them (the random phase ends, RL jobs wait) depends on it.

`calibrate` measures the pieces one at a time with one core each. With `workers` it also runs a short
real `es` run of the config's environment and actor with that many worker processes and fits the
model to it (cli/launch.py, `fit_to_workers`): the job durations scaled to the real ones (the machine as loaded by
those workers), worker_gap_s read off that run, and duration_spread the spread of its jobs' durations over
the model's for their steps (an episode's length is the job's own, not a spread). Both are 0 without it.
critic_start_s is not measured there: `critic_start` reads it off a real run of the default.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

# What the fields mean, for the file and for `aesrl-queue calibrate`'s output.
FIELDS = {
    "env_step_s": "seconds per environment step of a job (the actor's forward pass included)",
    "actor_step_s": "seconds per actor gradient step of an RL job",
    "learner_steps_per_s": "critic gradient steps per second of the learner",
    "result_latency_s": "seconds from a job's end until the scheduler reads its result",
    "publish_latency_s": "seconds from a publication (μ version and its jobs, critic weights) until workers see it",
    "job_overhead_s": "seconds a job spends besides its steps (start, reads, the result's write)",
    "tell_s": "seconds of the scheduler's loop per result (its tell and its share of the commits)",
    "worker_gap_s": "seconds a worker spends between two jobs, outside both (dequeue, set-up)",
    "duration_spread": "coefficient of variation of a job's duration (a seeded lognormal factor; 0: exact)",
    "critic_start_s": "seconds from a run's start (or resume) until its critic daemon can publish (process "
                      "start, imports, the learner built)",
}


class CostModelError(ValueError):
    """A cost-model file that cannot be used; the message names the field."""


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Virtual durations. The defaults are nominal (a MuJoCo-sized environment on one CPU core per
    worker, a GPU learner), not a measurement: calibrate for a machine."""

    env_step_s: float = 5e-5
    actor_step_s: float = 2e-3
    learner_steps_per_s: float = 1000.0
    result_latency_s: float = 2e-3
    publish_latency_s: float = 5e-3
    job_overhead_s: float = 5e-3
    # the loop thread's 0.45-0.66 ms per ES result at 1,000 results/s (docs/scaling.md): ~1,550 results/s
    tell_s: float = 6.5e-4
    worker_gap_s: float = 0.0
    duration_spread: float = 0.0
    critic_start_s: float = 0.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise CostModelError(f"{f.name}: must be a finite number >= 0, got {value!r}")
        if self.learner_steps_per_s <= 0:
            raise CostModelError("learner_steps_per_s: must be above 0")

    def job_seconds(self, env_steps: int, actor_steps: int) -> float:
        return self.job_overhead_s + self.env_step_s * env_steps + self.actor_step_s * actor_steps

    def spread(self, seed: int, job: str) -> float:
        """The factor of a job's duration: 1 without duration_spread, else lognormal with mean 1 and
        coefficient of variation duration_spread, a function of the run's seed and the job's id."""
        if self.duration_spread <= 0:
            return 1.0
        import zlib

        import numpy as np

        sigma = math.sqrt(math.log1p(self.duration_spread ** 2))
        z = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(job.encode()), 47]).standard_normal()
        return float(math.exp(sigma * z - sigma * sigma / 2))

    def chunk_seconds(self, learner_steps: int) -> float:
        """A critic chunk: its steps, then the publication of its weights."""
        return learner_steps / self.learner_steps_per_s + self.publish_latency_s

    def to_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        """The model of a dict; keys other than the fields (a calibration's notes) are ignored, a
        missing field takes its default."""
        if not isinstance(data, dict):
            raise CostModelError(f"a cost model is a JSON object of {', '.join(FIELDS)}")
        return cls(**{k: data[k] for k in FIELDS if k in data})

    @classmethod
    def load(cls, path: str | os.PathLike) -> CostModel:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise CostModelError(f"cost model {path}: {exc}") from None
        return cls.from_dict(data)

    def save(self, path: str | os.PathLike, notes: dict[str, Any] | None = None) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**self.to_dict(), **({"notes": notes} if notes else {})}, indent=2) + "\n")
        return path


def resolve(cost_model: CostModel | dict | str | os.PathLike | None) -> CostModel:
    """A CostModel from what `train(cost_model=...)` and `run --cost-model` accept: a model, a dict, a
    file, or None for the nominal defaults."""
    if cost_model is None:
        return CostModel()
    if isinstance(cost_model, CostModel):
        return cost_model
    if isinstance(cost_model, dict):
        return CostModel.from_dict(cost_model)
    return CostModel.load(cost_model)


# -- calibration ------------------------------------------------------------------------------------
def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def calibrate(cfg, env_steps: int = 3000, actor_steps: int = 60, learner_steps: int = 60,
              round_trips: int = 30) -> tuple[CostModel, dict[str, Any]]:
    """Measure a cost model for `cfg` (a resolved RunConfig) on this machine, with one torch thread as a
    worker has: the environment with the run's actor, RL actor steps and critic steps of the run's
    learner on its network sizes (on CUDA when torch sees one, replayed as a captured CUDA graph as the
    critic daemon trains there), and the round trips of a result and of a μ version through an
    embedded Redis. Returns the model and notes (what was measured, and how)."""
    import numpy as np
    import torch

    from aesrl_queue import codec
    from aesrl_queue.connection import connect
    from aesrl_queue.learners import capture_step, learner_class, make_learner
    from aesrl_queue.nets import NetSpec, init_actor_params
    from aesrl_queue.redis_server import RedisServer
    from aesrl_queue.rollout import run_episodes
    from aesrl_queue.store import Store
    from aesrl_queue.td3 import ReplayBuffer, pick_device, train_actor

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        spec = NetSpec.from_config(cfg)
        mu = init_actor_params(cfg.obs_dim, cfg.act_dim, cfg.max_action, tuple(cfg.hidden), cfg.activation,
                               seed=cfg.seed)
        actor = spec.make_numpy_actor()
        actor.set_params(mu)
        # the environment: whole episodes of μ until env_steps are played
        run_episodes(cfg.env_id, actor, k=1, seed=0, store=True, env_kwargs=cfg.env_kwargs)  # warm-up
        played, t0, i = 0, time.perf_counter(), 1
        while played < env_steps:
            ep = run_episodes(cfg.env_id, actor, k=1, seed=i, store=True, env_kwargs=cfg.env_kwargs)
            played += int(sum(ep.lengths))
            i += 1
        env_step_s = (time.perf_counter() - t0) / played

        # the learner and the RL jobs' actor steps, on a replay of random transitions
        device = pick_device(None)
        rng = np.random.default_rng(0)
        n = max(cfg.batch_size * 4, 1024)
        replay = ReplayBuffer(cfg.obs_dim, cfg.act_dim, n, device=device)
        replay.add_batch(rng.standard_normal((n, cfg.obs_dim)).astype(np.float32),
                         rng.uniform(-1, 1, (n, cfg.act_dim)).astype(np.float32),
                         rng.standard_normal(n).astype(np.float32),
                         rng.standard_normal((n, cfg.obs_dim)).astype(np.float32), np.zeros(n, np.float32))
        learner = make_learner(cfg, spec, device)
        target = spec.make_actor(device)
        gen = torch.Generator().manual_seed(0)

        def critic_steps(k: int) -> None:
            for _ in range(k):
                learner.critic_step(replay.sample(cfg.batch_size, generator=gen), target)
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        critic_steps(5)
        t0 = time.perf_counter()
        critic_steps(learner_steps)
        learner_rate = eager_rate = learner_steps / (time.perf_counter() - t0)
        if device.type == "cuda":  # the daemon replays its step as a CUDA graph there: time that
            learner = make_learner(cfg, spec, device, capturable=True)
            size = torch.full((), float(n), device=device)
            graph = capture_step(lambda: learner.critic_step(replay.sample_in_graph(cfg.batch_size, size), target),
                                 device, learner.opt)
            graph.replay()
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            for _ in range(learner_steps * 10):
                graph.replay()
            torch.cuda.synchronize(device)
            learner_rate = learner_steps * 10 / (time.perf_counter() - t0)

        critic = learner_class(cfg.learner).critic_for_actor(spec, learner.weights(), "cpu")
        obs = rng.standard_normal((n, cfg.obs_dim)).astype(np.float32)

        def actor_run(k: int) -> None:
            train_actor(mu, spec, critic, lambda b: obs[rng.integers(0, n, b)], steps=k,
                        batch_size=cfg.batch_size, lr=cfg.actor_lr, device="cpu",
                        betas=learner_class(cfg.learner).betas)

        actor_run(5)
        t0 = time.perf_counter()
        actor_run(actor_steps)
        actor_step_s = (time.perf_counter() - t0) / actor_steps

        # the round trips: a result appended and read back; a μ version published and read back
        with RedisServer() as server:
            client = connect(server.url)
            store = Store(client, "calibrate")
            store.write_config(cfg)
            var = np.full_like(mu, cfg.var_init)
            result = {"job": "calibrate-j1", "kind": "es", "status": "ok", "fitness": 0.0, "len": 1000}

            def result_trip() -> None:
                store.append_result(result)
                store.read_stream("results", count=1)

            version = [0]

            def publish_trip() -> None:
                version[0] += 1
                store.publish_dist(version[0], mu, var)
                store.dist_blobs(version[0])

            result_latency = _median_seconds(result_trip, round_trips)
            publish_latency = _median_seconds(publish_trip, round_trips)
            blob = len(codec.encode_array(mu))
            client.close()
    finally:
        torch.set_num_threads(threads)
    model = CostModel(env_step_s=env_step_s, actor_step_s=actor_step_s, learner_steps_per_s=learner_rate,
                      result_latency_s=result_latency, publish_latency_s=publish_latency,
                      job_overhead_s=2 * result_latency + publish_latency, tell_s=CostModel.tell_s)
    notes = {"env_id": cfg.env_id, "learner": cfg.learner, "hidden": list(cfg.hidden),
             "critic_hidden": list(cfg.critic_hidden), "batch_size": cfg.batch_size, "learner_device": str(device),
             "learner_path": "a captured CUDA graph, as the daemon" if device.type == "cuda" else "eager",
             "learner_steps_per_s_eager": eager_rate,
             "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"), "host": os.uname().nodename,
             "env_steps": played, "actor_steps": actor_steps, "learner_steps": learner_steps,
             "mu_bytes": blob, "how": "latencies are loopback round trips to an embedded Redis; "
                                       "job_overhead_s is two result trips and one μ read; tell_s is not "
                                       "measured: docs/scaling.md's loop thread at 1,000 results/s"}
    return model, notes


# -- fitting to a real run ---------------------------------------------------------------------------------
def measured_updates(metrics: list[dict[str, Any]], kind: str | None = None) -> list[dict[str, Any]]:
    """A run's update records after its random phase that carry a measured duration (of `kind`, or any)."""
    return [u for u in metrics if u.get("type") == "update" and not u.get("random")
            and isinstance(u.get("duration"), int | float) and (kind is None or u.get("kind") == kind)]


def critic_rates(metrics: list[dict[str, Any]]) -> list[float]:
    """The learner steps per second a run's critic records measured (those that measured one)."""
    return [float(r["critic_steps_per_s"]) for r in metrics if r.get("type") == "critic"
            and isinstance(r.get("critic_steps_per_s"), int | float) and r["critic_steps_per_s"] > 0]


def duration_ratios(metrics: list[dict[str, Any]], model: CostModel) -> list[float]:
    """Each measured `es` job's real duration over `model`'s for the steps it played (the run's
    interactions counter before and after its tell), in the order of that counter."""
    ratios, before = [], None
    for u in sorted(measured_updates(metrics, "es"), key=lambda u: u.get("interactions") or 0):
        played = (u.get("interactions") or 0) - before if before is not None else None
        before = u.get("interactions") or 0
        if played and played > 0 and u["duration"] > 0:
            ratios.append(u["duration"] / model.job_seconds(played, 0))
    return ratios


def ratio_spread(ratios: list[float]) -> float:
    """The coefficient of variation of `duration_ratios`: the spread of durations that the steps a job
    plays do not explain (an episode's length is the job's own, which the virtual executor already
    gives it; Walker2d-v5's falls make raw durations spread more, `duration_spread`)."""
    return variation(ratios)


def variation(values: list[float]) -> float:
    """The coefficient of variation of `values` (the sample standard deviation over the mean); 0 for
    fewer than 3 values."""
    if len(values) < 3:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) / mean


def duration_spread(metrics: list[dict[str, Any]]) -> float:
    """The coefficient of variation of a real run's job durations (after the random phase), the mean of
    its job kinds' weighted by their results."""
    total, n = 0.0, 0
    for kind in ("es", "rl"):
        d = [float(u["duration"]) for u in measured_updates(metrics, kind)]
        if len(d) > 2:
            total, n = total + len(d) * variation(d), n + len(d)
    return total / n if n else 0.0


def worker_gap(metrics: list[dict[str, Any]], workers: int) -> float:
    """A real run's mean time per job of a worker outside the job's measured duration, read off an `es`
    run (an aesrl run's workers also wait for its critic). Where the results name their worker: each
    worker's span from its first result to its last, less the durations of the jobs after its first,
    over its jobs after its first, pooled over the workers; each worker's own durations cancel, so the
    estimate carries only the jitter of the tells. Otherwise: the mean cycle of a worker (workers × the
    span of the results after the random phase / their number) less the mean duration, whose sampling
    error is the spread of the durations over the square root of their number."""
    ups = measured_updates(metrics)
    if len(ups) < 2:
        return 0.0
    by_worker: dict[str, list[dict[str, Any]]] = {}
    for u in ups:
        if u.get("worker"):
            by_worker.setdefault(str(u["worker"]), []).append(u)
    if by_worker and sum(len(v) for v in by_worker.values()) == len(ups):
        outside, gaps = 0.0, 0
        for own in by_worker.values():
            own.sort(key=lambda u: u["t"])
            outside += own[-1]["t"] - own[0]["t"] - sum(u["duration"] for u in own[1:])
            gaps += len(own) - 1
        return max(0.0, outside / gaps) if gaps else 0.0
    cycle = workers * (ups[-1]["t"] - ups[0]["t"]) / (len(ups) - 1)
    return max(0.0, cycle - sum(u["duration"] for u in ups) / len(ups))


# A critic's first publication this soon after the random phase ended answers the phase's end, not the
# daemon's start-up: a waiting daemon reads the stored steps at least every 200 ms (workers/critic.py).
STARTED_WAITING_S = 0.25


def critic_start(metrics: list[dict[str, Any]], initial_steps: int) -> float | None:
    """A real run's critic start-up: the elapsed seconds of its critic's first publication, where the
    random phase had ended before it (the daemon publishes its untrained actor as soon as it is up and
    initial_steps are stored: a later publication is its start-up). None where the random phase ended
    last or within STARTED_WAITING_S before it (the daemon was up and waiting for it: its start-up is
    hidden in the phase; real HalfCheetah-v5 runs on 2 cores publish 6 ms after the phase ends) or the
    run published no critic."""
    first = next((r for r in metrics if r.get("type") == "critic" and isinstance(r.get("elapsed"), int | float)), None)
    ended = next((u for u in metrics if u.get("type") == "update" and (u.get("steps") or 0) >= initial_steps
                  and isinstance(u.get("elapsed"), int | float)), None)
    if first is None or ended is None or ended["elapsed"] + STARTED_WAITING_S >= first["elapsed"]:
        return None
    return float(first["elapsed"])
