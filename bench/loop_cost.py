"""The scheduler's CPU per result at HalfCheetah's size, without workers: the real Scheduler against a
real Redis, fed results as fast as it takes them, so the loop's own cost is measured alone and
repeatably (bench/scale.py measures it inside a whole simulated cluster, where 2 cores are shared).

Each round, `--batch` in-flight ES jobs are started with the workers' start script and finished with
their finish script (a 1000-step episode of HalfCheetah's shapes), then the loop reads and applies
them, `--per-read` results per XREAD (0: all at once; 1: the loop woken for every result, as a loop
that waits between results is) and commits once. A round lasts 0.1 s, so at the scheduler's 10
commits a second a batch of B stands for B·10 results/s. Measured per result: the loop thread's CPU
(read + tell + commit), the ε thread's CPU, Redis's command time by command (INFO commandstats; the
start and finish scripts are the workers') and its command thread's CPU (commands and socket I/O,
/proc/PID/schedstat). `--replicas H` starts H host replicas (redis-server --replicaof the primary, as
`aesrl-queue worker` does on each host): Redis's replication sends them every write, and the jobs
read μ/var from them instead of the primary; what they cost the primary with no results (their
acknowledgements) is measured first, per host and second. Last, RQ's own Redis cost per
job: the enqueue and an AesrlWorker's dequeue and bookkeeping of no-op jobs. `--profile` prints the
loop thread's top functions (cProfile, by the thread's CPU time).

Batch 100 is the 1,000 results/s the scaling targets name: the last lines add up what one primary's
Redis and the scheduler spend per result there.

Usage: python bench/loop_cost.py [--batch 10,100] [--per-read 0,1] [--results 1500] [--replicas 4] [--algo aesrl] [--profile] [--out PATH]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from aesrl_queue import codec  # noqa: E402
from aesrl_queue.config import RunConfig  # noqa: E402
from aesrl_queue.connection import connect  # noqa: E402
from aesrl_queue.optimizers import needs_critic_daemon  # noqa: E402
from aesrl_queue.redis_server import RedisServer  # noqa: E402
from aesrl_queue.store import Store, dist_name, worker_beat  # noqa: E402
from scheduler.loop import PUBLISH_HZ, Scheduler  # noqa: E402
from workers.worker import HEARTBEAT_EVERY, RQ_HEARTBEAT_EVERY  # noqa: E402


def main_thread_cpu_s(pid: int) -> float:
    """CPU seconds of a process's main thread, to the nanosecond (/proc/PID/schedstat): for Redis, its
    command thread, which also does the socket I/O."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


COMMIT_HZ = PUBLISH_HZ  # the scheduler's commits a second: one commit per round stands for 1/COMMIT_HZ s
IDLE_S = 3.0  # seconds the replicas' fixed cost is measured over, before any result

HIDDEN = (423, 300)  # 129,193 parameters with obs 3 / act 1: HalfCheetah's 400-300 actor (bench/scale.py)
EP_LEN, EP_OBS, EP_ACT = 1000, 17, 6


def _episode() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"obs": rng.standard_normal((EP_LEN, EP_OBS), np.float32),
            "act": rng.uniform(-1, 1, (EP_LEN, EP_ACT)).astype(np.float32),
            "rew": rng.standard_normal(EP_LEN).astype(np.float32),
            "next_obs": rng.standard_normal((EP_LEN, EP_OBS), np.float32), "done": np.zeros(EP_LEN, np.float32)}


def commandstats(client) -> dict[str, tuple[int, int]]:
    """{command: (calls, usec)} of the server so far."""
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for k, v in client.info("commandstats").items()}


def measure(url: str, algo: str, batch: int, results: int, workers: int, profile: bool, redis_pid: int,
            replicas: list[str], per_read: int = 0) -> dict:
    cfg = RunConfig.from_preset("AesrlSleep-v0", run_id=f"loop-cost-{algo}-{batch}", hidden=HIDDEN, algo=algo,
                                r=1.0, rl_ratio=0.0, initial_steps=0, total_steps=10**12, mean_eval_episodes=1,
                                env_kwargs={"episode_len": EP_LEN, "mean_s": 0.0}).resolve()
    client = connect(url)
    for i in range(workers):  # heartbeats: the loop keeps about two jobs in flight per live worker
        worker_beat(client, f"w{i}", {"host": "bench", "pid": 0})
    sched = Scheduler(client, connect(url, blocking=True), cfg)
    now = [0.0]
    sched.clock = lambda: now[0]  # one commit per round: the round stands for 1/PUBLISH_HZ seconds
    store = Store(client, cfg.run_id)
    sched.setup()
    sched.apply([])
    try:
        time.sleep(1.0)  # the replicas receive the run's first version
        c0 = main_thread_cpu_s(redis_pid)
        time.sleep(IDLE_S)
        idle_ms_per_s = 1e3 * (main_thread_cpu_s(redis_pid) - c0) / IDLE_S  # the replicas' acknowledgements, no results
        ep = _episode()
        keep = needs_critic_daemon(cfg)  # an ES-only run stores no transitions
        info = codec.pack({"worker": "w0", "host": "bench", "pid": 0, "t": time.time()})
        rng = np.random.default_rng(1)
        prof = cProfile.Profile(time.thread_time) if profile else None  # CPU time: this thread's, not the waits
        loop_s = proc_s = redis_cpu_s = wall_s = beat_s = 0.0
        done = beats = 0
        redis_tot: dict[str, tuple[int, int]] = {}
        n = 0
        rounds = 0
        while done < results + batch * 2:
            rounds += 1
            round_at = time.monotonic()  # a round takes 1/COMMIT_HZ s, so replicas see versions at the real rate
            beat0 = main_thread_cpu_s(redis_pid)
            for i in range(workers):  # heartbeats expire: keep them fresh, or the loop shrinks what it keeps in flight
                worker_beat(client, f"w{i}", {"host": "bench", "pid": 0})
            beat_s += main_thread_cpu_s(redis_pid) - beat0
            beats += workers
            jobs = [j for j, i in sched.inflight.items() if i["kind"] == "es"][:batch]
            warm = done >= batch * 2  # two rounds of warm-up
            start = commandstats(client) if warm else None  # the workers' start and finish scripts included
            cpu0, wall0 = main_thread_cpu_s(redis_pid), time.monotonic()
            for job in jobs:
                got = store.start_job(job, info)
                if not replicas:
                    store.dist_blobs(int(got[0]))  # a host without a replica reads μ/var from the primary
                fields = {"job": job, "kind": "es", "version": int(got[0]), "seed": int(sched.inflight[job]["seed"]),
                          "worker": "w0", "spec_hash": cfg.spec_hash, "status": "ok", "fitness": float(rng.standard_normal()),
                          "len": EP_LEN, "f_mu": float(rng.standard_normal()), "f_mu_version": int(got[0]), "ind": "",
                          "eval_steps": 0, "duration": 1.0}
                store.finish_job(ep, job, fields, keep=keep)  # as a worker of this run does
            for job in jobs:  # the ε the loop computes ahead while the jobs run (they ran above)
                sched.inflight.noise.wait(job)
            t_thread, t_proc = time.thread_time(), time.process_time()
            if prof and warm:
                prof.enable()
            now[0] += 1.0
            got = []
            while len(got) < len(jobs):  # the round's results, `per_read` per XREAD (all at once when 0)
                part = sched.results.read(sched.last_id, 10, count=per_read or 200)
                if not part:
                    break
                sched.apply(part)
                got += part
            if prof and warm:
                prof.disable()
            if warm:
                end = commandstats(client)
                for k, (calls, usec) in end.items():
                    if k != "info":
                        c0, u0 = start.get(k, (0, 0))
                        c1, u1 = redis_tot.get(k, (0, 0))
                        redis_tot[k] = (c1 + calls - c0, u1 + usec - u0)
                loop_s += time.thread_time() - t_thread
                proc_s += time.process_time() - t_proc
                redis_cpu_s += main_thread_cpu_s(redis_pid) - cpu0
                wall_s += time.monotonic() - wall0
                n += len(got)
            done += len(got)
            time.sleep(max(0.0, round_at + 1 / COMMIT_HZ - time.monotonic()))
        # The ε of the jobs is computed on the background thread while they run: its CPU is not inside
        # the timed window above, so it is timed here on this thread, as the same function.
        from aesrl_queue import kernels, noise
        t = time.thread_time()
        for s in range(20):
            noise.job_noise(s, cfg.actor_dim, kernels.perturbation)
        eps_ms = (time.thread_time() - t) / 20 * 1e3
        redis_by = {k: (calls / n, usec / n / 1e3) for k, (calls, usec) in redis_tot.items() if calls}
        last = store.key(dist_name(sched.published))  # the last version reaches every host (10 s at most)
        locals_ = [connect(local) for local in replicas]
        deadline = time.monotonic() + 10.0
        while not all(c.exists(last) for c in locals_) and time.monotonic() < deadline:
            time.sleep(0.05)
        copied = [int(bool(c.exists(last))) for c in locals_]
        for c in locals_:
            c.close()
    finally:
        pass  # the replicas are the caller's
    sched.inflight.close()
    out = {"algo": algo, "batch": batch, "per_read": per_read, "results": n, "dim": cfg.actor_dim,
           "loop_ms_per_result": 1e3 * loop_s / n, "eps_ms_per_result": eps_ms,
           "redis_ms_per_result": sum(v[1] for v in redis_by.values()),
           "redis_calls_per_result": sum(v[0] for v in redis_by.values()), "redis_by_command": redis_by,
           "redis_ms_per_beat": 1e3 * beat_s / beats, "host_replicas": len(replicas), "replica_has_last": copied,
           "versions": sched.opt.version, "published": sched.published, "rounds": rounds, "replica_idle_ms_per_s_per_host": idle_ms_per_s / max(1, len(replicas)),
           # the replicas' idle cost during the rounds is not per result: it is counted per second below
           "redis_cpu_ms_per_result": 1e3 * max(0.0, redis_cpu_s - idle_ms_per_s / 1e3 * wall_s) / n}
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(os.environ.get("LOOP_COST_SORT", "tottime")).print_stats(25)
        if os.environ.get("LOOP_COST_CALLERS"):
            pstats.Stats(prof, stream=s).print_callers(os.environ["LOOP_COST_CALLERS"])
        out["profile"] = s.getvalue()
    client.close()
    return out


def rq_cost(url: str, redis_pid: int, jobs: int = 1000) -> dict:
    """Redis's side of RQ itself per job: enqueue (as the scheduler batches it) and the workers'
    dequeue and bookkeeping of a no-op job (workers.jobs.noop) by `AesrlWorker`, the SimpleWorker that
    `aesrl-queue worker` runs, result_ttl as the run config sets it."""
    import redis
    from rq import Queue
    from rq.serializers import JSONSerializer

    from workers.worker import AesrlWorker

    cfg = RunConfig()
    client = redis.Redis.from_url(url)
    queue = Queue("loop-cost-rq", connection=client, serializer=JSONSerializer)
    datas = [Queue.prepare_data("workers.jobs.noop", kwargs={"job": f"j{i}"}, timeout=cfg.job_timeout,
                                result_ttl=cfg.result_ttl, failure_ttl=cfg.failure_ttl, ttl=cfg.job_timeout * 4,
                                job_id=f"loop-cost-rq-{i}") for i in range(jobs)]
    a, cpu_a = commandstats(client), main_thread_cpu_s(redis_pid)
    queue.enqueue_many(datas)
    b, cpu_b = commandstats(client), main_thread_cpu_s(redis_pid)
    AesrlWorker([queue], connection=client).work(burst=True, logging_level="WARNING")
    c, cpu_c = commandstats(client), main_thread_cpu_s(redis_pid)

    def per_job(x, y):
        keys = [k for k in y if k != "info"]
        return (sum(y[k][0] - x.get(k, (0, 0))[0] for k in keys) / jobs,
                sum(y[k][1] - x.get(k, (0, 0))[1] for k in keys) / jobs / 1e3)

    (enq_calls, enq_ms), (work_calls, work_ms) = per_job(a, b), per_job(b, c)
    return {"enqueue_calls": enq_calls, "enqueue_ms": enq_ms, "worker_calls": work_calls, "worker_ms": work_ms,
            "enqueue_cpu_ms": 1e3 * (cpu_b - cpu_a) / jobs, "worker_cpu_ms": 1e3 * (cpu_c - cpu_b) / jobs}


def at_rate(row: dict, rq: dict) -> dict:
    """What one primary's Redis and the scheduler spend per result at the row's rate (batch · COMMIT_HZ
    results/s, every host replica receiving every write): the CPU of Redis's command thread for the jobs' scripts,
    the scheduler's commands, the replication stream and the workers' RQ bookkeeping, plus the replicas'
    fixed cost per second spread over the results and the heartbeats of a worker per result and second
    (1 s jobs); the scheduler's loop thread, and ε beside it."""
    rate = row["batch"] * COMMIT_HZ
    fixed = row["replica_idle_ms_per_s_per_host"] * row["host_replicas"] / rate if row["host_replicas"] else 0.0
    # rate·1 s workers with 1 s jobs, each beating every HEARTBEAT_EVERY s (ours) and RQ_HEARTBEAT_EVERY s (RQ's)
    beats = row["redis_ms_per_beat"] * (1 / HEARTBEAT_EVERY + 1 / RQ_HEARTBEAT_EVERY)
    redis_ms = row["redis_cpu_ms_per_result"] + rq["worker_cpu_ms"] + fixed + beats
    return {"results_per_s": rate, "redis_ms": redis_ms, "redis_cores": redis_ms * rate / 1e3,
            "loop_ms": row["loop_ms_per_result"], "loop_cores": row["loop_ms_per_result"] * rate / 1e3,
            "eps_cores": row["eps_ms_per_result"] * rate / 1e3}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="10,100", help="results per commit, comma-separated")
    ap.add_argument("--results", type=int, default=1500)
    ap.add_argument("--workers", type=int, default=128)
    ap.add_argument("--algo", default="aesrl", choices=("aesrl", "es"))
    ap.add_argument("--replicas", type=int, default=4, help="host replicas following the primary (0: jobs read the primary)")
    ap.add_argument("--per-read", default="0,1",
                    help="results per XREAD, comma-separated: 0 reads a round's results at once, 1 wakes the loop for "
                         "every result (a loop that waits between results at high rates)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "loop_cost.json"),
                    help="where the rows are written ('' for nowhere)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(directory=Path(tmp) / "primary").start()
        locals_ = [RedisServer(directory=Path(tmp) / f"host{h}", extra_args=["--replicaof", "127.0.0.1", str(server.port)]).start()
                   for h in range(args.replicas)]
        try:
            rows = [measure(server.url, args.algo, int(b), args.results, args.workers, args.profile, server.proc.pid,
                            [s.url for s in locals_], int(k)) for k in args.per_read.split(",")
                    for b in args.batch.split(",")]
            rq = rq_cost(server.url, server.proc.pid)
        finally:
            for s in [server, *locals_]:
                s.stop()
    for r in rows:
        r["at_rate"] = at_rate(r, rq)
    print(f"{'batch':>6} {'per read':>8} {'results':>8} {'loop ms':>8} {'ε ms':>6} {'redis ms':>9} {'redis cpu ms':>13} "
          f"{'redis calls':>12}")
    for r in rows:
        print(f"{r['batch']:>6} {r['per_read'] or r['batch']:>8} {r['results']:>8} {r['loop_ms_per_result']:>8.3f} {r['eps_ms_per_result']:>6.3f} "
              f"{r['redis_ms_per_result']:>9.3f} {r['redis_cpu_ms_per_result']:>13.3f} {r['redis_calls_per_result']:>12.1f}")
        top = sorted(r["redis_by_command"].items(), key=lambda kv: -kv[1][1])[:8]
        print("        redis: " + ", ".join(f"{k} {c:.1f}×/{ms:.3f} ms" for k, (c, ms) in top))
        if "profile" in r:
            print(r["profile"])
    if args.out:
        Path(args.out).write_text(json.dumps({"benchmark": "loop_cost", "rows": [{k: v for k, v in r.items() if k != "profile"}
                                                                           for r in rows], "rq": rq, "commit_hz": COMMIT_HZ,
                                        "machine": {"cores": os.cpu_count(), "loadavg": os.getloadavg()}},
                                       indent=1) + "\n")
    print(f"RQ itself, per job: enqueue {rq['enqueue_calls']:.0f} commands / {rq['enqueue_ms']:.3f} ms of Redis "
          f"({rq['enqueue_cpu_ms']:.3f} ms CPU); a worker's dequeue and bookkeeping {rq['worker_calls']:.0f} commands / "
          f"{rq['worker_ms']:.3f} ms ({rq['worker_cpu_ms']:.3f} ms CPU)")
    if rows and rows[0]["host_replicas"]:
        print(f"{rows[0]['host_replicas']} host replicas cost the primary {rows[0]['replica_idle_ms_per_s_per_host']:.2f} ms "
              "of CPU per host and second with no results")
    for r in rows:
        a = r["at_rate"]
        print(f"at {a['results_per_s']:.0f} results/s ({r['batch']} per commit, {r['per_read'] or r['batch']} per read, "
              f"{r['host_replicas']} host replicas): Redis "
              f"{a['redis_ms']:.3f} ms CPU per result ({a['redis_cores']:.2f} cores), the scheduler's loop thread "
              f"{a['loop_ms']:.3f} ms ({a['loop_cores']:.2f} cores) and ε {a['eps_cores']:.2f} cores beside it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
