"""Queue overhead of aesrl-queue against raw RQ, measured on one private Redis in one run.

No-op jobs/s (SimpleWorker, AesrlWorker), end-to-end results/s of a real Scheduler run, the
scheduler's time per applied result by part, and the bytes each job moves. Table + bench/results/overhead.json.

Usage: python bench/overhead.py [--quick] [--workers W] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before numpy/torch load their thread pools

import numpy as np  # noqa: E402
import redis  # noqa: E402
import rq  # noqa: E402
from rq import Queue  # noqa: E402
from rq.serializers import JSONSerializer  # noqa: E402
from rq.utils import str_to_date  # noqa: E402

from aesrl_queue.codec import json_default  # noqa: E402
from aesrl_queue.config import RunConfig  # noqa: E402
from aesrl_queue.connection import connect  # noqa: E402
from aesrl_queue.procs import ProcessGroup  # noqa: E402
from aesrl_queue.redis_server import RedisServer, find_redis_server  # noqa: E402
from aesrl_queue.store import live_workers, rq_job_key, rq_results_key  # noqa: E402
from bench import rawkeys  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "overhead.json"
NOOP = "workers.jobs.noop"
TARGET_E2E_RATIO = 0.90  # issue 46: end-to-end results/s at least 0.9x raw SimpleWorker no-op jobs/s, same run
TARGET_APPLY_MS = 2.0  # issue: median scheduler apply at 129k parameters
TARGET_ES_RESULT_BYTES = 1024  # issue: an ES result entry under 1 KB
# Actor sizes for the apply timing: HalfCheetah-v5 dims (obs 17, act 6) with these hidden layers.
APPLY_SIZES = (("10k", (64, 128)), ("129k", (400, 300)), ("1M", (1000, 1000)))

MODES = {
    #            no-op jobs, e2e steps, applies per size (10k, 129k, 1M), breakdown applies, warm-up
    "quick": {"repeats": 1, "jobs": 600, "steps": 300, "applies": (60, 60, 12), "breakdown": (30, 30, 8), "warm": 3},
    "full": {"repeats": 2, "jobs": 3000, "steps": 2500, "applies": (400, 400, 120), "breakdown": (200, 200, 60), "warm": 10},
}


# -- child processes ------------------------------------------------------------------------------------
def child_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("AESRL_REDIS_URL", None)
    return env


class Children(ProcessGroup):
    """Every subprocess this benchmark starts (aesrl_queue.procs: own session, dies with the benchmark)."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__(log_dir, env=child_env(), cwd=ROOT)

    def stop(self, procs: list[subprocess.Popen], grace: float = 2.0) -> list[str]:
        return super().stop(grace=grace, only=procs)


def proc_cpu_s(pid: int) -> float:
    """user+system CPU seconds of a live process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """user+system CPU seconds of every child this process has waited for."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def redis_counters(client: redis.Redis) -> tuple[float, int]:
    """(Redis server CPU seconds, commands processed) so far."""
    cpu = client.info("cpu")
    stats = client.info("stats")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), int(stats["total_commands_processed"])


# -- results table ---------------------------------------------------------------------------------------
class Rows:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, name: str, measure: str, value: float | None, unit: str, reference: float | None = None,
            ref_label: str = "", note: str = "") -> None:
        ratio = None
        if value is not None and reference not in (None, 0) and math.isfinite(value):
            ratio = value / reference
        self.rows.append({"name": name, "measure": measure, "value": value, "unit": unit, "reference": reference,
                          "reference_is": ref_label, "ratio": ratio, "note": note})

    def get(self, name: str) -> float | None:
        for r in self.rows:
            if r["name"] == name:
                return r["value"]
        return None


def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.1f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def render(rows: list[dict[str, Any]]) -> str:
    head = ("measure", "value", "unit", "reference", "ratio")
    body = []
    for r in rows:
        ref = _fmt(r["reference"])
        if r["reference_is"] and r["reference"] is not None:
            ref = f"{ref} ({r['reference_is']})"
        body.append((r["measure"], _fmt(r["value"]), r["unit"], ref,
                     "-" if r["ratio"] is None else f"{r['ratio']:.3f}"))
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    line = lambda cells: " | ".join(  # noqa: E731
        c.ljust(w) if i in (0, 2, 3) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    sep = "-+-".join("-" * w for w in widths)
    return "\n".join([line(head), sep, *(line(b) for b in body)])


# -- 0. round-trip context ---------------------------------------------------------------------------------
def bench_rtt(client: redis.Redis, n: int) -> dict[str, float]:
    """Median HMGET round trip with Redis hot, and right after ~10 ms of CPU work in this process.

    The second is what the scheduler's in-apply round trips see (it computes, then asks Redis); on a
    VM whose idle vCPU must be woken it can be far slower than the first.
    """
    key = "bench:rtt"
    client.hset(key, mapping={"steps": 1, "interactions": 2})
    hot, cold = [], []
    for _ in range(n):
        t = time.perf_counter()
        client.hmget(key, ["steps", "interactions"])
        hot.append(time.perf_counter() - t)
    x = np.ones(50_000)
    for _ in range(n):
        end = time.perf_counter() + 0.010
        while time.perf_counter() < end:
            np.sqrt(x)
        t = time.perf_counter()
        client.hmget(key, ["steps", "interactions"])
        cold.append(time.perf_counter() - t)
    client.delete(key)
    return {"hot_ms": 1e3 * float(np.median(hot)), "after_cpu_ms": 1e3 * float(np.median(cold)),
            "after_cpu_p90_ms": 1e3 * float(np.percentile(cold, 90))}


# -- 1. raw RQ reference ---------------------------------------------------------------------------------
def bench_noop(client: redis.Redis, url: str, kids: Children, worker_class: str, tag: str, n_jobs: int,
               n_workers: int) -> dict[str, Any]:
    """N no-op jobs enqueued with enqueue_many, drained by W `rq worker --burst` processes."""
    qname = f"bench-noop-{tag}"
    q = Queue(qname, connection=client, serializer=JSONSerializer)
    ids = [f"{qname}-{i}" for i in range(n_jobs)]
    t0 = time.perf_counter()
    for lo in range(0, n_jobs, 500):
        q.enqueue_many([Queue.prepare_data(NOOP, kwargs={"run": "bench", "job": jid}, timeout=60, result_ttl=600,
                                           failure_ttl=600, job_id=jid) for jid in ids[lo:lo + 500]])
    enqueue_s = time.perf_counter() - t0
    cmd = [sys.executable, "-m", "rq.cli", "worker", "-w", worker_class, "--serializer", "json", "--burst",
           "-u", url, "--logging_level", "WARNING"]
    # CPU of a worker that starts, finds its queue empty and exits: subtracted from the drain's CPU.
    c0 = children_cpu_s()
    p = kids.start(f"noop-{tag}-startup", [*cmd, f"{qname}-empty"])
    try:
        p.wait(60)
    finally:
        kids.stop([p])
    startup_cpu = children_cpu_s() - c0
    cmd.append(qname)
    cpu0, cmd0 = redis_counters(client)
    ccpu0 = children_cpu_s()
    t0 = time.perf_counter()
    procs = [kids.start(f"noop-{tag}-{i}", cmd) for i in range(n_workers)]
    try:
        deadline = time.monotonic() + max(60.0, n_jobs / 20)
        for i, p in enumerate(procs):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{worker_class} burst workers did not drain {n_jobs} jobs in time:\n"
                                   f"{kids.log_tail(f'noop-{tag}-{i}')}") from None
    finally:
        kids.stop(procs)
    wall = time.perf_counter() - t0
    worker_cpu = children_cpu_s() - ccpu0 - n_workers * startup_cpu
    cpu1, cmd1 = redis_counters(client)
    pipe = client.pipeline(transaction=False)
    for jid in ids:
        pipe.hmget(rq_job_key(jid), ["status", "started_at", "ended_at", "worker_name"])
    starts, ends, done = [], [], 0
    per_worker: dict[bytes, list[float]] = {}
    for status, started, ended, worker in pipe.execute():
        if status == b"finished" and started and ended:
            done += 1
            starts.append(str_to_date(started).timestamp())
            ends.append(str_to_date(ended).timestamp())
            w = per_worker.setdefault(worker, [math.inf, -math.inf])
            w[0], w[1] = min(w[0], ends[-1]), max(w[1], ends[-1])
    if done < n_jobs:
        raise RuntimeError(f"only {done} of {n_jobs} no-op jobs finished under {worker_class}:\n"
                           f"{kids.log_tail(f'noop-{tag}-0')}")
    span = max(ends) - min(starts)
    # Throughput while every worker was up: from the latest first-job *end* (a plain SimpleWorker
    # imports workers.jobs - numpy, msgpack - inside its first job; AesrlWorker at start-up; workers
    # start up to seconds apart) to the earliest last-job end. Whole span when the overlap is short.
    lo, hi = max(w[0] for w in per_worker.values()), min(w[1] for w in per_worker.values())
    in_window = sum(1 for e in ends if lo < e <= hi)
    all_busy = len(per_worker) == n_workers and hi - lo > 0.25 * span and in_window >= 50
    rate = in_window / (hi - lo) if all_busy else n_jobs / span
    return {"jobs": n_jobs, "rate": rate, "rate_span": n_jobs / span, "all_busy_window": all_busy,
            "workers_seen": len(per_worker), "window_s": hi - lo, "span_s": span, "wall_s": wall, "enqueue_rate": n_jobs / enqueue_s,
            "redis_cpu_ms_per_job": 1e3 * (cpu1 - cpu0) / n_jobs, "redis_cmds_per_job": (cmd1 - cmd0) / n_jobs,
            "worker_cpu_ms_per_job": 1e3 * max(0.0, worker_cpu) / n_jobs, "startup_cpu_s": startup_cpu,
            "sample_job": ids[0]}


# -- 2. end to end ---------------------------------------------------------------------------------------
def wait_workers(client: redis.Redis, n: int, kids: Children, names: list[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(live_workers(client)) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n} AesrlWorkers did not heartbeat within {timeout}s:\n{kids.log_tail(names[0])}")
        time.sleep(0.1)


def bench_e2e(client: redis.Redis, blocking: redis.Redis, url: str, kids: Children, steps: int,
              n_workers: int) -> dict[str, Any]:
    """A real Scheduler (in a thread of this process) with W `rq worker -w workers.AesrlWorker` children."""
    from aesrl_queue.procs import worker_command
    from scheduler.loop import Scheduler

    cfg = RunConfig.from_preset("AesrlNull-v0", algo="es", rl_ratio=0.0, total_steps=steps, hidden=(8, 8),
                                env_kwargs={"episode_len": 1}, mean_eval_episodes=1,
                                run_id=f"bench-e2e-{uuid.uuid4().hex[:6]}").resolve()
    names = [f"e2e-worker-{i}" for i in range(n_workers)]
    send = redis.connection.AbstractConnection.send_packed_command
    procs = [kids.start(n, worker_command(url)) for n in names]
    try:
        wait_workers(client, n_workers, kids, names)
        stop = threading.Event()
        sched = Scheduler(client, blocking, cfg, stop_event=stop, drain_timeout=30.0)
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["status"] = sched.run()
            except BaseException as exc:  # reported by the main thread
                box["error"] = exc

        sends = [0]

        def counted(self, *a, **k):  # only the scheduler thread talks to Redis from here during the run
            sends[0] += 1
            return send(self, *a, **k)

        wcpu0 = sum(proc_cpu_s(p.pid) for p in procs)
        rcpu0, cmd0 = redis_counters(client)
        redis.connection.AbstractConnection.send_packed_command = counted
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        th = threading.Thread(target=target, name="bench-scheduler", daemon=True)
        th.start()
        th.join(max(60.0, steps / 10))
        wall = time.perf_counter() - t0
        sched_cpu = time.process_time() - cpu0
        redis.connection.AbstractConnection.send_packed_command = send
        sched_sends = sends[0]
        rcpu1, cmd1 = redis_counters(client)
        wcpu = sum(proc_cpu_s(p.pid) for p in procs) - wcpu0
        if th.is_alive():
            stop.set()
            th.join(10)
            raise RuntimeError(f"the scheduler did not finish {steps} steps in time:\n{kids.log_tail(names[0])}")
        if "error" in box:
            raise RuntimeError(f"the scheduler failed: {box['error']!r}") from box["error"]
    finally:
        redis.connection.AbstractConnection.send_packed_command = send
        kids.stop(procs)
    store = sched.store
    state = store.state()
    hist = [h for _, h in store.history()]
    ts = [float(h["t"]) for h in hist]
    n = len(hist)
    applied = int(state["results_applied"])
    span = (ts[-1] - ts[0]) if n >= 2 else float("nan")
    # Steady state: drop the first 10% (first jobs build the worker's per-run context).
    k0 = n // 10
    steady = (n - 1 - k0) / (ts[-1] - ts[k0]) if n - k0 >= 2 else float("nan")
    durations = sorted(float(h["duration"]) for h in hist)
    job_ids = [h["job"] for h in hist]
    return {
        "run_id": cfg.run_id, "status": box.get("status"), "applied": applied, "history": n,
        "rate_hist": (n - 1) / span, "rate_steady": steady, "rate_wall": applied / wall, "wall_s": wall,
        "steps": int(state["steps"]), "failed": int(state["failed"]), "rejected": int(state["rejected"]),
        "stale": int(state["stale"]), "replaced": int(state["replaced"]),
        "job_body_ms_median": 1e3 * durations[len(durations) // 2] if durations else float("nan"),
        "sched_cpu_ms_per_result": 1e3 * sched_cpu / max(1, applied),
        "worker_cpu_ms_per_result": 1e3 * wcpu / max(1, applied),
        "redis_cpu_ms_per_result": 1e3 * (rcpu1 - rcpu0) / max(1, applied),
        "redis_cmds_per_result": (cmd1 - cmd0) / max(1, applied),
        "sched_round_trips_per_result": sched_sends / max(1, applied),
        "sample_job": job_ids[len(job_ids) // 2] if job_ids else None, "prefix": store.prefix,
    }


# -- 3. scheduler apply time -------------------------------------------------------------------------------
class PartTimer:
    """Wraps callables on instances so that their time inside _apply is summed per part."""

    def __init__(self) -> None:
        self.active = False
        self.acc: dict[str, float] = {}

    def wrap(self, obj: Any, attr: str, part: str) -> None:
        fn = getattr(obj, attr)

        def timed(*a, **k):
            if not self.active:
                return fn(*a, **k)
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.acc[part] = self.acc.get(part, 0.0) + time.perf_counter() - t

        setattr(obj, attr, timed)

    def wrap_pipeline(self, client: redis.Redis, part: str) -> None:
        make = client.pipeline

        def pipeline(*a, **k):
            p = make(*a, **k)
            self.wrap(p, "execute", part)
            return p

        client.pipeline = pipeline


PARTS = (
    ("rebuild", "rebuild z: μ_v + σ_v·ε, ε computed at dispatch"),
    ("tell", "dist.tell (mean/var update, float64)"),
    ("encode", "encode μ/var blobs (store.publish_dist into the pipeline)"),
    ("hmget", "HMGET steps (only for results without counters)"),
    ("exec", "MULTI/EXEC: HSET dist:{v} μ/var, state, history, HVALS refs"),
    ("drop", "_drop_unreferenced (DEL rides on the next EXEC)"),
    ("cache", "DistCache.put (copies μ/var)"),
)


def es_result_fields(cfg: RunConfig, job: str, version: int, seed: int, fitness: float, f_mu: float,
                     length: int, steps: int = -1) -> dict[str, Any]:
    """The fields a worker's ES job writes to the results stream (workers/jobs.py play; the
    counters `steps`/`interactions` are added by store.finish_job's script)."""
    out = {"job": job, "kind": "es", "version": version, "seed": seed, "worker": "benchhost:12345",
           "spec_hash": cfg.spec_hash, "rl_steps": 0, "status": "ok", "fitness": fitness, "len": length,
           "f_mu": f_mu, "f_mu_version": version, "ind": "", "eval_steps": length,
           "duration": 1.2345678901234567, "train_time": 0.0}
    if steps >= 0:
        out.update(steps=steps, interactions=2 * steps)
    return out


def entry_bytes(fields: dict) -> int:
    return sum(len(k) + len(v) for k, v in fields.items())


def bench_apply(client: redis.Redis, blocking: redis.Redis, label: str, hidden: tuple[int, ...], n_apply: int,
                n_breakdown: int, warm: int) -> dict[str, Any]:
    from aesrl_queue import kernels, noise
    from aesrl_queue.optimizers.base import job_seed
    from scheduler.loop import Scheduler

    # A fixed r and baseline-relative (not es's adaptive scale and fixed-linear): every result then
    # moves μ and var, the path whose cost this measures.
    cfg = RunConfig.from_preset("HalfCheetah-v5", algo="es", rl_ratio=0.0, hidden=hidden, r=2000.0,
                                mean_rule="baseline-relative",
                                run_id=f"bench-apply-{label}-{uuid.uuid4().hex[:6]}").resolve()
    sched = Scheduler(client, blocking, cfg, publish_hz=0)  # the cost of one result's whole commit
    sched.setup()
    store, dim = sched.store, cfg.actor_dim
    rng = np.random.default_rng(0)
    counter = [0]
    cpu_times: list[float] = []

    def one(timer: PartTimer | None) -> float:
        counter[0] += 1
        n = counter[0]
        seed = job_seed(cfg.seed, n)
        version = sched.version
        [job] = sched.dispatch.enqueue([{"kind": "es", "version": version, "seed": seed, "n": n}],
                                       incr={"dispatched": 1})
        rawkeys.set_ref(store, job, version)  # what the worker's start-job script records
        # Fitness near f(μ): with r = 2000, p ≈ 0.5 so every apply moves μ (the expensive path).
        store.append_result(es_result_fields(cfg, job, version, seed, float(1000 + 50 * rng.standard_normal()),
                                             1000.0, 1000, steps=1000 * n), extra_interactions=1000)
        [(entry_id, fields)] = sched.results.read(sched.last_id, None)
        # A real job runs for milliseconds to seconds, long enough for the scheduler's background
        # thread to finish ε of its seed (noise_ahead); here the result is immediate, so wait for it.
        sched.inflight.noise.wait(job)
        if timer is not None:
            timer.active = True
        c = time.thread_time()
        t = time.perf_counter()
        sched.apply([(entry_id, fields)], refill=False)
        dt = time.perf_counter() - t
        cpu_times.append(time.thread_time() - c)
        if timer is not None:
            timer.active = False
        if sched.last_id != entry_id or job in sched.inflight:
            raise RuntimeError(f"_apply did not consume {entry_id} of {job}")
        return dt

    for _ in range(warm):
        one(None)
    v0 = sched.version
    cpu_times.clear()
    times = np.array([one(None) for _ in range(n_apply)]) * 1e3
    cpu = np.array(cpu_times) * 1e3
    moved = sched.version - v0

    timer = PartTimer()
    import scheduler.loop
    import scheduler.results

    timer.wrap(scheduler.loop, "individual", "rebuild")  # the loop calls scheduler.results.individual by this name
    timer.wrap(sched.opt.dist, "tell_step", "tell")
    timer.wrap(sched.store, "publish_dist", "encode")
    timer.wrap(client, "hmget", "hmget")
    timer.wrap_pipeline(sched.r_once, "exec")  # the apply's MULTI/EXEC goes through the no-retry client
    timer.wrap(sched, "_drop_unreferenced", "drop")
    timer.wrap(sched.dists, "put", "cache")
    parts: dict[str, list[float]] = {p: [] for p, _ in PARTS}
    totals = []
    for _ in range(n_breakdown):
        timer.acc = {}
        totals.append(one(timer) * 1e3)
        for p, _ in PARTS:
            parts[p].append(timer.acc.get(p, 0.0) * 1e3)
    del client.hmget, sched.r_once.pipeline  # back to the class methods
    scheduler.loop.individual = scheduler.results.individual

    mu, var = sched.opt.mean, sched.opt.var
    t = time.perf_counter()
    reps = max(3, n_breakdown // 4)
    for i in range(reps):
        kernels.perturbation(i, dim)  # what the scheduler runs (compiled Box-Muller)
    perturb_ms = (time.perf_counter() - t) / reps * 1e3
    t = time.perf_counter()
    for i in range(reps):
        noise.perturbation(i, dim)  # what a worker runs (numpy, no numba there): the same bits
    perturb_numpy_ms = (time.perf_counter() - t) / reps * 1e3

    # Bytes: the dist:{v} blobs a job downloads, an ES job hash and result entry, an RL job and ind:{job}.
    mu_len, var_len = rawkeys.dist_sizes(store, sched.version)
    hist_entry = rawkeys.last_entry(store, "history")
    es_entry = rawkeys.last_entry(store, "results")
    counter[0] += 1
    rl_job = sched.dispatch.enqueue([{"kind": "rl", "version": sched.version, "seed": job_seed(cfg.seed, counter[0]),
                                      "n": counter[0], "rl_steps": 10_000}])[0]
    z = noise.sample(mu, var, 1)
    ind_key = store.put_individual(rl_job, z, ttl=600)
    rl_fields = dict(es_result_fields(cfg, rl_job, sched.version, 1, 1000.0, 1000.0, 1000), kind="rl",
                     rl_steps=10_000, ind=ind_key, train_time=12.345678901234567)
    rl_entry_id = store.append_result(rl_fields)
    rl_entry = rawkeys.result_entry(store, rl_entry_id)
    episode = {"obs": rng.standard_normal((1000, cfg.obs_dim)), "act": rng.uniform(-1, 1, (1000, cfg.act_dim)),
               "rew": rng.standard_normal(1000), "next_obs": rng.standard_normal((1000, cfg.obs_dim)),
               "done": np.zeros(1000)}
    store.append_episode(episode, rl_job)
    replay_entry = rawkeys.last_entry(store, "replay")
    queued_es = f"{cfg.run_id}-j{counter[0] - 1}"  # last ES job: its result was applied, its RQ job still queued
    out = {
        "label": label, "hidden": list(hidden), "dim": dim, "n": n_apply, "moved": moved,
        "median_ms": float(np.median(times)), "p99_ms": float(np.percentile(times, 99)),
        "cpu_median_ms": float(np.median(cpu)),
        "mean_ms": float(times.mean()), "max_ms": float(times.max()),
        "breakdown_mean_ms": {p: float(np.mean(v)) for p, v in parts.items()},
        "breakdown_total_mean_ms": float(np.mean(totals)), "perturbation_ms": perturb_ms,
        "perturbation_numpy_ms": perturb_numpy_ms,
        "mu_bytes": mu_len, "var_bytes": var_len, "history_entry_bytes": entry_bytes(hist_entry),
        "es_result_entry_bytes": entry_bytes(es_entry), "rl_result_entry_bytes": entry_bytes(rl_entry),
        "ind_bytes": client.strlen(ind_key), "replay_entry_bytes": entry_bytes(replay_entry),
        "replay_expected_bytes": 4 * 1000 * (2 * cfg.obs_dim + cfg.act_dim + 2),
        "es_job_queued": job_hash_bytes(client, queued_es), "rl_job_queued": job_hash_bytes(client, rl_job),
        "prefix": store.prefix,
    }
    store.delete()
    return out


def job_hash_bytes(client: redis.Redis, job_id: str) -> dict[str, Any]:
    key = rq_job_key(job_id)
    fields = client.hgetall(key)
    if not fields:
        return {"total": None, "data": None, "memory": None, "fields": 0}
    return {"total": entry_bytes(fields), "data": len(fields.get(b"data", b"")),
            "memory": client.memory_usage(key), "fields": len(fields),
            "results_stream": stream_bytes(client, rq_results_key(job_id))}


def stream_bytes(client: redis.Redis, key: str) -> int | None:
    rows = client.xrange(key)
    return sum(entry_bytes(f) for _, f in rows) if rows else None


# -- main ------------------------------------------------------------------------------------------------
def machine(client: redis.Redis) -> dict[str, Any]:
    try:
        import hiredis

        hi = getattr(hiredis, "__version__", "yes")
    except ImportError:
        hi = None
    return {
        "cores": os.cpu_count(), "platform": platform.platform(), "machine": platform.machine(),
        "python": platform.python_version(), "rq": rq.__version__, "redis_py": redis.__version__, "hiredis": hi,
        "numpy": np.__version__, "redis_server": client.info("server")["redis_version"],
        "redis_server_binary": find_redis_server(), "date": datetime.now().isoformat(timespec="seconds"),
        "loadavg_start": list(os.getloadavg()),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = MODES["quick" if args.quick else "full"]
    n_jobs = args.jobs or mode["jobs"]
    reps = args.repeats or mode["repeats"]
    steps = args.steps or mode["steps"]
    w = args.workers
    rows = Rows()
    notes: list[str] = []
    t_start = time.perf_counter()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = round(time.perf_counter() - t_start, 2)
    with tempfile.TemporaryDirectory(prefix="aesrl-bench-") as tmp:
        kids = Children(Path(tmp))
        server = RedisServer(directory=Path(tmp) / "redis")
        try:
            server.start()
            client = connect(server.url)
            blocking = connect(server.url, blocking=True)
            info = machine(client)
            print(f"machine: {info['cores']} cores, {info['platform']}, python {info['python']}, rq {info['rq']}, "
                  f"redis-py {info['redis_py']} (hiredis {info['hiredis']}), redis-server {info['redis_server']}; "
                  f"{w} workers; mode {'quick' if args.quick else 'full'}", flush=True)

            rtt = bench_rtt(client, 40 if args.quick else 150)
            rows.add("redis_rtt_hot", "Redis HMGET round trip, back to back (median)", rtt["hot_ms"], "ms")
            rows.add("redis_rtt_after_cpu", "Redis HMGET round trip after 10 ms of CPU work (median)",
                     rtt["after_cpu_ms"], "ms", rtt["hot_ms"], "back to back")

            phase("start")
            simples, aesrls, e2es = [], [], []
            for rep in range(reps):
                # Interleaved, so that a burst of load from elsewhere on the machine hits every kind alike.
                print(f"[1/3] rep {rep + 1}/{reps}: raw RQ, {n_jobs} no-op jobs on {w} burst workers "
                      f"(SimpleWorker, AesrlWorker)", flush=True)
                simples.append(bench_noop(client, server.url, kids, "rq.worker.SimpleWorker", f"simple{rep}", n_jobs, w))
                aesrls.append(bench_noop(client, server.url, kids, "workers.AesrlWorker", f"aesrl{rep}", n_jobs, w))
                print(f"[1/3] rep {rep + 1}/{reps}: end to end, Scheduler on AesrlNull-v0 episode_len=1, "
                      f"{steps} steps, {w} AesrlWorkers", flush=True)
                e = bench_e2e(client, blocking, server.url, kids, steps, w)
                # Job hashes live result_ttl (60 s): measure the sample now.
                e["finished_job_hash"] = job_hash_bytes(client, e["sample_job"]) if e["sample_job"] else {}
                e2es.append(e)
                print(f"      SimpleWorker {simples[-1]['rate']:.0f} jobs/s, AesrlWorker {aesrls[-1]['rate']:.0f} "
                      f"jobs/s, ours {e['rate_hist']:.0f} results/s", flush=True)
            simple = max(simples, key=lambda r: r["rate"])
            aesrl = max(aesrls, key=lambda r: r["rate"])
            e2e = max(e2es, key=lambda r: r["rate_hist"])
            ref = simple["rate"]
            best = f"best of {reps}" if reps > 1 else ""
            rows.add("raw_simpleworker_noop", f"raw RQ: no-op jobs/s, {w} SimpleWorker {best}".strip(), ref, "jobs/s",
                     note="jobs ended while all workers were up / that window (RQ job hash timestamps)")
            rows.add("raw_aesrlworker_noop", f"raw RQ: no-op jobs/s, {w} AesrlWorker {best}".strip(), aesrl["rate"],
                     "jobs/s", ref, "SimpleWorker")
            raw_cpu = simple["worker_cpu_ms_per_job"] + simple["redis_cpu_ms_per_job"]
            rows.add("raw_simpleworker_cpu_ms", "raw: CPU per no-op job, workers + Redis, SimpleWorker", raw_cpu, "ms",
                     note="worker CPU minus start-up (a burst worker on an empty queue)")
            rows.add("raw_aesrlworker_cpu_ms", "raw: CPU per no-op job, workers + Redis, AesrlWorker",
                     aesrl["worker_cpu_ms_per_job"] + aesrl["redis_cpu_ms_per_job"], "ms", raw_cpu, "SimpleWorker")
            rows.add("raw_enqueue_many", "enqueue_many: no-op jobs/s (producer)", simple["enqueue_rate"], "jobs/s")
            rows.add("raw_simpleworker_redis_cmds", "Redis commands per no-op job, SimpleWorker",
                     simple["redis_cmds_per_job"], "cmds/job")
            rows.add("raw_aesrlworker_redis_cmds", "Redis commands per no-op job, AesrlWorker",
                     aesrl["redis_cmds_per_job"], "cmds/job", simple["redis_cmds_per_job"], "SimpleWorker")
            phase("raw_e2e_done")
            rows.add("e2e_results_per_s", f"ours: results applied/s (first..last history entry) {best}".strip(), e2e["rate_hist"],
                     "results/s", ref, "raw SimpleWorker no-op",
                     note=f"target ratio >= {TARGET_E2E_RATIO}")
            rows.add("e2e_results_per_s_vs_aesrl_noop", "ours: results applied/s vs AesrlWorker no-op",
                     e2e["rate_hist"], "results/s", aesrl["rate"], "AesrlWorker no-op")
            rows.add("e2e_results_per_s_steady", "ours: results/s, steady state (last 90%)", e2e["rate_steady"],
                     "results/s", ref, "raw SimpleWorker no-op")
            rows.add("e2e_results_per_s_wall", "ours: results/s over the whole run (incl. start, drain)",
                     e2e["rate_wall"], "results/s", ref, "raw SimpleWorker no-op")
            rows.add("e2e_job_body_ms", "ours: job function body, median (worker-side duration)",
                     e2e["job_body_ms_median"], "ms", 1e3 * w / ref, "raw no-op ms/job per worker")
            e2e_cpu = e2e["worker_cpu_ms_per_result"] + e2e["sched_cpu_ms_per_result"] + e2e["redis_cpu_ms_per_result"]
            rows.add("e2e_cpu_ms", "ours: CPU per result, workers + scheduler + Redis", e2e_cpu, "ms", raw_cpu,
                     "raw SimpleWorker no-op")
            rows.add("e2e_cpu_bound_ceiling", f"ours: CPU-bound ceiling on {os.cpu_count()} cores (cores / CPU per result)",
                     1e3 * (os.cpu_count() or 1) / e2e_cpu, "results/s", ref, "raw SimpleWorker no-op")
            rows.add("e2e_worker_cpu_ms", "ours: worker CPU per result (all workers)", e2e["worker_cpu_ms_per_result"],
                     "ms", simple["worker_cpu_ms_per_job"], "raw SimpleWorker no-op")
            rows.add("e2e_scheduler_cpu_ms", "ours: scheduler CPU per result", e2e["sched_cpu_ms_per_result"], "ms")
            rows.add("e2e_redis_cpu_ms", "ours: Redis CPU per result", e2e["redis_cpu_ms_per_result"], "ms",
                     simple["redis_cpu_ms_per_job"], "raw SimpleWorker no-op")
            rows.add("e2e_scheduler_round_trips", "ours: scheduler round trips (socket writes) per result",
                     e2e["sched_round_trips_per_result"], "RTT/result")
            rows.add("e2e_redis_cmds", "ours: Redis commands per result", e2e["redis_cmds_per_result"], "cmds/job",
                     simple["redis_cmds_per_job"], "raw SimpleWorker no-op")
            if e2e["failed"] or e2e["rejected"] or e2e["replaced"]:
                notes.append(f"e2e run had failed={e2e['failed']} rejected={e2e['rejected']} "
                             f"replaced={e2e['replaced']} stale={e2e['stale']}")
            finished_es = e2e["finished_job_hash"]
            noop_hash = job_hash_bytes(client, simple["sample_job"])
            e2e_result = client.xrange(e2e["prefix"] + "results", count=1)
            e2e_replay = client.xrange(e2e["prefix"] + "replay", count=1)

            print("[2/3] scheduler _apply time per ES result (HalfCheetah-v5 dims)", flush=True)
            applies = []
            for (label, hidden), n_apply, n_bd in zip(APPLY_SIZES, mode["applies"], mode["breakdown"], strict=True):
                a = bench_apply(client, blocking, label, hidden, n_apply, n_bd, mode["warm"])
                applies.append(a)
                print(f"      {label}: {a['dim']:,} params, median {a['median_ms']:.2f} ms, p99 {a['p99_ms']:.2f} ms",
                      flush=True)
            for a in applies:
                lab, tgt = a["label"], (TARGET_APPLY_MS if a["label"] == "129k" else None)
                rows.add(f"apply_{lab}_median", f"apply, {a['dim']:,} params: median of {a['n']}", a["median_ms"],
                         "ms", tgt, "target" if tgt else "")
                rows.add(f"apply_{lab}_p99", f"apply, {a['dim']:,} params: p99", a["p99_ms"], "ms")
                rows.add(f"apply_{lab}_cpu_median", f"apply, {a['dim']:,} params: scheduler-thread CPU, median",
                         a["cpu_median_ms"], "ms", tgt, "target" if tgt else "")
            for a in applies:
                lab, total = a["label"], a["breakdown_total_mean_ms"]
                rows.add(f"apply_{lab}_part_total", f"apply {lab}: mean, instrumented pass", total, "ms")
                named = 0.0
                for part, desc in PARTS:
                    v = a["breakdown_mean_ms"][part]
                    named += v
                    rows.add(f"apply_{lab}_part_{part}", f"  {lab} {desc}", v, "ms", total, "share of mean")
                rows.add(f"apply_{lab}_part_other", f"  {lab} other (σ stats, norm, state fields, pack)",
                         total - named, "ms", total, "share of mean")
                rows.add(f"apply_{lab}_perturbation", f"  {lab} ε per ES job in the scheduler (compiled; thread when >= 16k)",
                         a["perturbation_ms"], "ms", total, "share of mean")
                rows.add(f"apply_{lab}_perturbation_numpy", f"  {lab} ε per job in a worker (numpy, same bits)",
                         a["perturbation_numpy_ms"], "ms", a["perturbation_ms"], "compiled")

            phase("apply_done")
            print("[3/3] bytes per job", flush=True)
            mid = applies[1]
            rows.add("bytes_es_job_hash_queued", "ES job: rq:job hash, queued (sum of fields)",
                     mid["es_job_queued"]["total"], "B")
            rows.add("bytes_es_job_data_field", "ES job: rq:job `data` field (zlib JSON args)",
                     mid["es_job_queued"]["data"], "B")
            rows.add("bytes_es_job_memory_usage", "ES job: MEMORY USAGE rq:job, queued", mid["es_job_queued"]["memory"],
                     "B")
            if finished_es and finished_es.get("total") is not None:
                rows.add("bytes_es_job_hash_finished", "ES job: rq:job hash after success (e2e run)",
                         finished_es["total"], "B", noop_hash["total"], "no-op job hash")
                rows.add("bytes_es_job_rq_result", "ES job: RQ's own rq:results stream entry (e2e run)",
                         finished_es.get("results_stream"), "B", noop_hash.get("results_stream"), "no-op")
            rows.add("bytes_es_result_entry", "ES result: results-stream entry (fields+values)",
                     mid["es_result_entry_bytes"], "B", TARGET_ES_RESULT_BYTES, "target")
            if e2e_result:
                rows.add("bytes_es_result_entry_e2e", "ES result entry as written by a worker (e2e)",
                         entry_bytes(e2e_result[0][1]), "B", TARGET_ES_RESULT_BYTES, "target")
            rows.add("bytes_rl_job_hash_queued", "RL job: rq:job hash, queued", mid["rl_job_queued"]["total"], "B",
                     mid["es_job_queued"]["total"], "ES job hash")
            rows.add("bytes_rl_result_entry", "RL result: results-stream entry", mid["rl_result_entry_bytes"], "B",
                     TARGET_ES_RESULT_BYTES, "ES target")
            for a in applies:
                p = a["dim"]
                rows.add(f"bytes_rl_ind_{a['label']}", f"RL upload ind:{{job}}, {p:,} params", a["ind_bytes"], "B",
                         4 * p, "4 x params")
            for a in applies:
                p = a["dim"]
                rows.add(f"bytes_mu_var_download_{a['label']}", f"μ+var download at job start, {p:,} params",
                         a["mu_bytes"] + a["var_bytes"], "B", 8 * p, "8 x params")
                rows.add(f"bytes_mu_eval_download_{a['label']}", f"  + current μ after training (RL jobs only), {p:,}",
                         a["mu_bytes"], "B", 8 * p, "8 x params")
                rows.add(f"bytes_dist_publish_{a['label']}", f"scheduler HSET dist:{{v}} per applied result, {p:,}",
                         a["mu_bytes"] + a["var_bytes"], "B", 8 * p, "8 x params")
            rows.add("bytes_history_entry", "history entry per applied result", mid["history_entry_bytes"], "B")
            rows.add("bytes_replay_episode_1000", "replay XADD, 1000-step HalfCheetah episode", mid["replay_entry_bytes"],
                     "B", mid["replay_expected_bytes"], "4 x 1000 x (2·obs+act+2)")
            if e2e_replay:
                rows.add("bytes_replay_episode_e2e", "replay XADD, 1-step AesrlNull episode (e2e)",
                         entry_bytes(e2e_replay[0][1]), "B")
        finally:
            kids.kill_all()
            server.cleanup()

    notes += [
        "raw rates: jobs that ended while every burst worker was up, over that window (from each worker's "
        "first job end to the first worker's last job end, RQ job hashes' ended_at/worker_name), so worker "
        "start-up and first-job imports are excluded; ours: first..last applied "
        "result (history 't'), workers started and heartbeating before the scheduler starts. Best of the "
        "interleaved repeats for each.",
        "what our job does that a no-op does not: Lua start-job (HEXISTS inflight, HMGET dist μ+var, 2 HSET); "
        "noise.sample of z; one env episode (1 step here) and one μ evaluation episode on the μ read at start; "
        "one Lua finish-job (XADD transitions to replay, HINCRBY x3, RPUSH index, XADD result with the "
        "counters). The scheduler per batch of results: XREAD, _apply (z = μ_v + σ_v·ε, ε compiled, on a "
        "background thread from 16k parameters; tell; one MULTI/EXEC with HSET dist:{v}, one state HSET, "
        "history XADD per result, HDEL of the finished jobs, HVALS refs, deferred DEL and the refill jobs); "
        "steps come from the results, re-read once a second.",
        "AesrlWorker keeps RQ's records as SimpleWorker does but refreshes RQ's worker key at most every 5 s "
        "and in the same round trip as the idle state (SimpleWorker: HSET + 2 EXPIRE, one round trip each, "
        "three times per job): 10 round trips per no-op job instead of 21. The issue's reference is raw "
        "SimpleWorker; the row 'vs AesrlWorker no-op' is the cost of the scheduler and the job protocol alone.",
        f"the scheduler runs in a thread of this process (Scheduler.run), workers are "
        f"`{' '.join(['rq', 'worker', '-w', 'workers.AesrlWorker', '-u', 'URL', 'aesrl-rl', 'aesrl-es'])}`; "
        f"with {w} workers and queued_per_worker=1 there are {2 * w} jobs in flight.",
        "apply: one ES job in flight at a time; every result has p ≈ 0.5 (fitness near f(μ), r = 2000) so μ "
        "and var move and a new dist:{v} is published on every apply, the expensive path; breakdown parts "
        "are means of an instrumented second pass (wrappers add ~1 µs per part).",
        "per ES job a worker downloads μ+var of its version (8 B/param) and evaluates f(μ) on that μ; an RL "
        "job also reads the current μ after training (4 B/param) and uploads its individual (4 B/param).",
    ]
    info["loadavg_end"] = list(os.getloadavg())
    if info["loadavg_start"][0] > 0.5 * (os.cpu_count() or 1):
        notes.insert(0, f"WARNING: the machine was busy before this run (1-min load {info['loadavg_start'][0]:.1f} "
                        f"on {os.cpu_count()} cores): other processes share the CPU and inflate every time here.")
    return {
        "benchmark": "overhead", "mode": "quick" if args.quick else "full", "workers": w, "jobs": n_jobs,
        "repeats": reps,
        "steps": steps, "machine": info, "rows": rows.rows, "notes": notes,
        "details": {"raw_simpleworker": simples, "raw_aesrlworker": aesrls, "e2e": e2es, "apply": applies,
                    "finished_es_job": finished_es, "noop_job": noop_hash},
        "targets": {"e2e_ratio": TARGET_E2E_RATIO, "apply_129k_median_ms": TARGET_APPLY_MS,
                    "es_result_bytes": TARGET_ES_RESULT_BYTES},
        "elapsed_s": time.perf_counter() - t_start, "phases_s": phases,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes; finishes in under a minute")
    ap.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)),
                    help="rq worker processes for the no-op and end-to-end runs (default: cores, at most 4)")
    ap.add_argument("--jobs", type=int, default=0, help="no-op jobs per raw run (default by mode)")
    ap.add_argument("--steps", type=int, default=0, help="step budget of the end-to-end run (default by mode)")
    ap.add_argument("--repeats", type=int, default=0,
                    help="interleaved repeats of the raw and end-to-end runs; the best of each is reported "
                         "(default: 1 quick, 2 full)")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON results path (default: bench/results/overhead.json; --quick: a temporary folder)")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="aesrl-bench-")) / DEFAULT_OUT.name if args.quick else DEFAULT_OUT
    # SIGTERM ends the run through the finally blocks, which kill every child and Redis.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run(args)
    result["max_rss_mb"] = max(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024
    print()
    print(render(result["rows"]))
    m = result["machine"]
    print(f"\nmachine: {m['cores']} cores, {m['platform']}, python {m['python']}, rq {m['rq']}, redis-py "
          f"{m['redis_py']} (hiredis {m['hiredis']}), numpy {m['numpy']}, redis-server {m['redis_server']}")
    for n in result["notes"]:
        print(f"- {n}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=json_default))
    print(f"\nwrote {args.out} ({result['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
