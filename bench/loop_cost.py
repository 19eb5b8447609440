"""The scheduler's CPU per result at HalfCheetah's size, without workers: the real Scheduler against a
real Redis, fed results as fast as it takes them, so the loop's own cost is measured alone and
repeatably (bench/scale.py measures it inside a whole simulated cluster, where 2 cores are shared).

Each round, `--batch` in-flight ES jobs are started with the workers' start script and finished with
their finish script (a 1000-step episode of HalfCheetah's shapes), then the loop reads and applies
them as one batch: at 10 commits a second a batch of B is B·10 results/s. Measured per result:
the loop thread's CPU (read + tell + commit), the ε thread's CPU (the rest of the process), and Redis's
command time split by command (INFO commandstats; the start and finish scripts are the workers').
`--profile` prints the loop thread's top functions (cProfile). Last, RQ's own Redis cost per job: the
enqueue and a SimpleWorker's dequeue and bookkeeping of no-op jobs.

Usage: python bench/loop_cost.py [--batch 10,100] [--results 600] [--algo aesrl] [--profile] [--out PATH]
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
from aesrl_queue.store import Store, worker_beat  # noqa: E402
from scheduler.loop import Scheduler  # noqa: E402

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


def measure(url: str, algo: str, batch: int, results: int, workers: int, profile: bool) -> dict:
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
    ep = _episode()
    keep = needs_critic_daemon(cfg)  # an ES-only run stores no transitions
    info = codec.pack({"worker": "w0", "host": "bench", "pid": 0, "t": time.time()})
    rng = np.random.default_rng(1)
    prof = cProfile.Profile() if profile else None
    loop_s = proc_s = 0.0
    done = 0
    redis_tot: dict[str, tuple[int, int]] = {}
    n = 0
    while done < results + batch * 2:
        for i in range(workers):  # heartbeats expire: keep them fresh, or the loop shrinks what it keeps in flight
            worker_beat(client, f"w{i}", {"host": "bench", "pid": 0})
        jobs = [j for j, i in sched.dispatch.inflight.items() if i["kind"] == "es"][:batch]
        warm = done >= batch * 2  # two rounds of warm-up
        start = commandstats(client) if warm else None  # the workers' start and finish scripts included
        for job in jobs:
            got = store.start_job(job, info)
            store.dist_blobs(int(got[0]))  # a host without a relay reads μ/var from the primary
            fields = {"job": job, "kind": "es", "version": int(got[0]), "seed": int(sched.dispatch.inflight[job]["seed"]),
                      "worker": "w0", "spec_hash": cfg.spec_hash, "status": "ok", "fitness": float(rng.standard_normal()),
                      "len": EP_LEN, "f_mu": float(rng.standard_normal()), "f_mu_version": int(got[0]), "ind": "",
                      "eval_steps": 0, "duration": 1.0}
            store.finish_job(ep, job, fields, keep=keep)  # as a worker of this run does
        for job in jobs:  # the ε the loop computes ahead while the jobs run (they ran above)
            sched.dispatch.noise_ahead.wait(job)
        t_thread, t_proc = time.thread_time(), time.process_time()
        if prof and warm:
            prof.enable()
        now[0] += 1.0
        got = sched.dispatch.read(sched.last_id, 10, sched.rb)
        sched.apply(got)
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
            n += len(got)
        done += len(got)
    # The ε of the jobs is computed on the background thread while they run: its CPU is not inside
    # the timed window above, so it is timed here on this thread, as the same function.
    from aesrl_queue import kernels, noise
    t = time.thread_time()
    for s in range(20):
        noise.job_noise(s, cfg.actor_dim, kernels.perturbation)
    eps_ms = (time.thread_time() - t) / 20 * 1e3
    redis_by = {k: (calls / n, usec / n / 1e3) for k, (calls, usec) in redis_tot.items() if calls}
    sched.dispatch.noise_ahead.close()
    out = {"algo": algo, "batch": batch, "results": n, "dim": cfg.actor_dim,
           "loop_ms_per_result": 1e3 * loop_s / n, "eps_ms_per_result": eps_ms,
           "redis_ms_per_result": sum(v[1] for v in redis_by.values()),
           "redis_calls_per_result": sum(v[0] for v in redis_by.values()), "redis_by_command": redis_by}
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(os.environ.get("LOOP_COST_SORT", "tottime")).print_stats(25)
        out["profile"] = s.getvalue()
    client.close()
    return out


def rq_cost(url: str, jobs: int = 300) -> dict:
    """Redis's side of RQ itself per job: enqueue (as the scheduler batches it) and a SimpleWorker's
    dequeue and bookkeeping of a no-op job (workers.jobs.noop), result_ttl as the run config sets it."""
    import redis
    from rq import Queue, SimpleWorker

    cfg = RunConfig()
    client = redis.Redis.from_url(url)
    queue = Queue("loop-cost-rq", connection=client)
    datas = [Queue.prepare_data("workers.jobs.noop", kwargs={"job": f"j{i}"}, timeout=cfg.job_timeout,
                                result_ttl=cfg.result_ttl, failure_ttl=cfg.failure_ttl, ttl=cfg.job_timeout * 4,
                                job_id=f"loop-cost-rq-{i}") for i in range(jobs)]
    a = commandstats(client)
    queue.enqueue_many(datas)
    b = commandstats(client)
    SimpleWorker([queue], connection=client).work(burst=True, logging_level="WARNING")
    c = commandstats(client)

    def per_job(x, y):
        keys = [k for k in y if k != "info"]
        return (sum(y[k][0] - x.get(k, (0, 0))[0] for k in keys) / jobs,
                sum(y[k][1] - x.get(k, (0, 0))[1] for k in keys) / jobs / 1e3)

    (enq_calls, enq_ms), (work_calls, work_ms) = per_job(a, b), per_job(b, c)
    return {"enqueue_calls": enq_calls, "enqueue_ms": enq_ms, "worker_calls": work_calls, "worker_ms": work_ms}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="10,100", help="results per commit, comma-separated")
    ap.add_argument("--results", type=int, default=600)
    ap.add_argument("--workers", type=int, default=128)
    ap.add_argument("--algo", default="aesrl", choices=("aesrl", "es"))
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "loop_cost.json",
                    help="where the rows are written ('' for nowhere)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(directory=Path(tmp)).start()
        try:
            rows = [measure(server.url, args.algo, int(b), args.results, args.workers, args.profile)
                    for b in args.batch.split(",")]
            rq = rq_cost(server.url)
        finally:
            server.stop()
    print(f"{'batch':>6} {'results':>8} {'loop ms':>8} {'ε ms':>6} {'redis ms':>9} {'redis calls':>12}")
    for r in rows:
        print(f"{r['batch']:>6} {r['results']:>8} {r['loop_ms_per_result']:>8.3f} {r['eps_ms_per_result']:>6.3f} "
              f"{r['redis_ms_per_result']:>9.3f} {r['redis_calls_per_result']:>12.1f}")
        top = sorted(r["redis_by_command"].items(), key=lambda kv: -kv[1][1])[:8]
        print("        redis: " + ", ".join(f"{k} {c:.1f}×/{ms:.3f} ms" for k, (c, ms) in top))
        if "profile" in r:
            print(r["profile"])
    if str(args.out):
        args.out.write_text(json.dumps({"benchmark": "loop_cost", "rows": [{k: v for k, v in r.items() if k != "profile"}
                                                                           for r in rows], "rq": rq,
                                        "machine": {"cores": os.cpu_count(), "loadavg": os.getloadavg()}},
                                       indent=1) + "\n")
    print(f"RQ itself, per job: enqueue {rq['enqueue_calls']:.0f} commands / {rq['enqueue_ms']:.3f} ms of Redis; "
          f"a worker's dequeue and bookkeeping {rq['worker_calls']:.0f} commands / {rq['worker_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
