"""How far one scheduler and one Redis primary carry a run: 8 → 256 simulated workers, each host reading the
primary directly, or through the replica that `aesrl-queue worker` starts on each host
(workers/host_replica.py: redis-server --replicaof the primary, with a password of its own).

A simulated worker is a real AesrlWorker (RQ's own dequeue and bookkeeping, heartbeats) in a thread;
its job does every Redis call of an ES job (the start script, μ/var download — from a replica when
one is given —, an episode of HalfCheetah's size stored, the result) and sleeps instead of
computing, so that many fit on a small machine. The scheduler is the real `aesrl-queue scheduler
start` on a 129k-parameter actor. Per point: results/s applied, CPU of scheduler, Redis, replicas
and workers, and the primary's network bytes. Prints a table, writes bench/results/scale.json.

Usage: python bench/scale.py [--quick] [--workers 8,16,...] [--episode-s 1.0] [--out PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import platform
import signal
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

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import redis  # noqa: E402
from rq.job import Job  # noqa: E402
from rq.timeouts import BaseDeathPenalty  # noqa: E402

from aesrl_queue import codec  # noqa: E402
from aesrl_queue.config import RunConfig  # noqa: E402
from aesrl_queue.redis_server import RedisServer, find_redis_server  # noqa: E402
from aesrl_queue.store import OBS, REPLAY, Fanout, Store, individual_ttl, live_workers, policy_name  # noqa: E402
from bench.overhead import Children, proc_cpu_s  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "scale.json"
# obs 3 (AesrlSleep-v0), act 1: 3·423+423 + 423·300+300 + 300+1 = 129,193 parameters, the size of
# HalfCheetah's 400-300 actor (129,306): μ and var are 1.03 MB per version.
HIDDEN = (423, 300)
ACTOR_PARAMS = 4 * HIDDEN[0] + HIDDEN[0] * HIDDEN[1] + 2 * HIDDEN[1] + 1
# The stored episode has HalfCheetah's shapes (obs 17, act 6, 1000 steps: 168 KB), although the
# simulated environment is AesrlSleep-v0: what matters to Redis is the bytes.
EP_OBS, EP_ACT = 17, 6
# The job shape the hosts simulate, as run settings. "default": the defaults' (an ES job plays z and its
# mirror and stores both episodes; an RL job plays the critic daemon's published actor and log-std, reads no
# μ/var, critic or replay, and its individual is copied inside Redis). "trains": the first defaults' (single
# ES individuals with f(μ) in the result, RL jobs that read the critic and the replay's observations and train
# an individual they upload), the shape of the rows measured before the default changed.
SHAPES: dict[str, dict[str, Any]] = {
    "default": {},
    "trains": {"es_antithetic": False, "rl_steps_max": 2000, "learner": "td3", "critic_lag": 5000},
}


def shape_setting(shape: str, name: str) -> Any:
    """The RunConfig setting `name` under `shape`: its override, else RunConfig's default."""
    if name in SHAPES[shape]:
        return SHAPES[shape][name]
    return next(f.default for f in dataclasses.fields(RunConfig) if f.name == name)


MODES = {
    # ES-only worker counts without / with a replica per host; the same for the RL mix; seconds.
    "quick": {"workers": (8, 32, 128), "replicas": (128,), "rl_workers": (), "rl_replicas": (),
              "warm": 1.0, "window": 3.0},
    "full": {"workers": (8, 32, 128, 256), "replicas": (32, 64, 128, 256),
             "rl_workers": (8, 32, 64), "rl_replicas": (32, 64, 128), "warm": 4.0, "window": 10.0},
}
CRITIC_PARAMS = 260_402  # HalfCheetah's twin 400-300 critics; critic + target: 2.08 MB per version
KNEE_EFFICIENCY = 0.8  # the knee: the first point below 80% of the ideal W / job seconds
GBE_MBPS = 117.0  # what one 1 Gbit/s link carries in TCP payload, MB/s
LINKS = {"1 GbE": GBE_MBPS, "10 GbE": 10 * GBE_MBPS}
JOB_SECONDS = (1.0, 5.0)  # the job times the capacity table is computed for


# == simulated worker host (a child process: `scale.py _host ...`) =========================================
class NoDeathPenalty(BaseDeathPenalty):
    """RQ's SIGALRM timeout cannot run outside the main thread; a 1-second sleep needs none."""

    def setup_death_penalty(self) -> None:
        pass

    def cancel_death_penalty(self) -> None:
        pass


_EPISODE: dict[int, dict[str, np.ndarray]] = {}
_LOCAL = threading.local()


def _episode(length: int) -> dict[str, np.ndarray]:
    if length not in _EPISODE:
        rng = np.random.default_rng(0)
        _EPISODE[length] = dict(obs=rng.standard_normal((length, EP_OBS), np.float32),
                                act=rng.uniform(-1, 1, (length, EP_ACT)).astype(np.float32),
                                rew=rng.standard_normal(length).astype(np.float32),
                                next_obs=rng.standard_normal((length, EP_OBS), np.float32),
                                done=np.zeros(length, np.float32))
    return _EPISODE[length]


def simulated_evaluate(client: redis.Redis, episode_s: float, episode_len: int, train_s: float, run: str, job: str,
                       kind: str, version: int, seed: int, spec_hash: str, rl_steps: int = 0,
                       random_actions: bool = False, mean_eval: bool = True) -> dict[str, Any]:
    """An ES or RL job's Redis traffic (as workers.jobs does it) with sleeps where episodes and training run;
    one that fails is reported as a failed result and raises, as workers.jobs.evaluate does."""
    from workers import jobs

    t0 = time.monotonic()
    # One run context per simulated worker, as each real worker process keeps one (workers.jobs caches
    # only a few per process: shared by 32 threads they would be rebuilt, replay mirror and all, per job).
    ctx = getattr(_LOCAL, "ctx", None)
    if ctx is None or ctx.store.run_id != run:
        ctx = _LOCAL.ctx = jobs._RunContext(client, run)
    try:
        return _simulated_job(ctx, episode_s, episode_len, train_s, job, kind, seed, spec_hash, rl_steps, t0)
    except Exception as exc:  # reported failed, as workers.jobs.evaluate reports it: the scheduler asks again
        ctx.store.append_result({"job": job, "kind": kind, "version": version, "seed": seed, "spec_hash": spec_hash,
                                 "worker": threading.current_thread().name, "status": "failed",
                                 "error": f"{type(exc).__name__}: {exc}"[:2000], "duration": time.monotonic() - t0})
        raise


def _simulated_job(ctx, episode_s: float, episode_len: int, train_s: float, job: str, kind: str, seed: int,
                   spec_hash: str, rl_steps: int, t0: float) -> dict[str, Any]:
    info = codec.pack({"worker": threading.current_thread().name, "t": time.time()})
    cfg = ctx.cfg
    plays = kind == "rl" and cfg.rl_steps_max == 0  # the default's RL job: it plays the daemon's actor
    started = ctx.begin(job, info, dist=not plays)  # the start script; μ/var from the replica or the primary
    if started is None:
        return {"job": job, "skipped": True}
    version, mu, _var = started
    rng = np.random.default_rng(seed)
    ind_key, f_mu, f_mu_version, more = "", float(0.25 * rng.standard_normal()), version, {}
    episode = _episode(episode_len)
    if plays:  # the published policy (actor and log-std), read once per version as workers.jobs reads it
        ctx.load_critic("cpu")
        f_mu, f_mu_version, more["policy"] = math.nan, -1, ctx.critic_version
    elif kind == "rl":
        _rl_reads(ctx)
        time.sleep(train_s * float(rng.uniform(0.8, 1.2)))
        ind_key = ctx.store.put_individual(job, mu, ttl=individual_ttl(cfg))  # any finite vector of the right size
    elif cfg.es_antithetic:  # z and its mirror: both episodes stored, their mean is f(μ)
        episode = _episode(2 * episode_len)
        more.update(mirror_fitness=float(rng.standard_normal()), mirror_len=episode_len)
    time.sleep(episode_s * len(episode["rew"]) / episode_len * float(rng.uniform(0.8, 1.2)))
    if kind == "rl" and not plays:
        got = ctx.read_current_mu()
        f_mu_version = got[0] if got else -1
    if plays:  # copied inside Redis from the daemon's key of that version (uploaded only when it is gone)
        ind_key = ctx.store.put_individual(job, np.zeros(cfg.actor_dim, np.float32), ttl=individual_ttl(cfg),
                                           copy_of=policy_name(ctx.critic_version))
    # A fitness around a fixed level: baseline-relative then moves μ for ~83% of the results.
    fields = {"job": job, "kind": kind, "version": version, "seed": seed, "worker": threading.current_thread().name,
              "spec_hash": spec_hash, "rl_steps": rl_steps, "status": "ok", "fitness": float(rng.standard_normal()),
              "len": episode_len, "f_mu": f_mu, "f_mu_version": f_mu_version,
              "ind": ind_key, "eval_steps": 0, "duration": time.monotonic() - t0, "train_time": train_s, **more}
    ctx.store.finish_job(episode, job, fields, keep=ctx.keeps_replay)  # as workers.jobs does
    if ctx.fan is not None and ctx.keeps_replay and cfg.rl_steps_max:  # the observations RL jobs sample
        ctx.fan.append_obs([(job, episode)])
    return {"job": job}


def _rl_reads(ctx) -> None:
    """What an RL job reads before training: the critic when its version changed, the replay entries
    stored since this process's last RL job (whole entries, as the replay mirror reads them)."""
    store, reader = ctx.store, ctx.reader
    version = store.critic_version() if reader is None else ctx.critic_named
    if version != ctx.critic_version:
        if reader is None:
            store.critic_blob()
        else:
            reader.critic(store, at_least=version)
        ctx.critic_version = version
    stream = REPLAY if ctx.fan is None else OBS
    while True:
        if reader is None:
            rows = store.read_stream(stream, ctx.mirror_last, count=500)
        else:
            rows = reader.read(lambda c: store.read_stream(stream, ctx.mirror_last, count=500, client=c))
        if not rows:
            return
        ctx.mirror_last = rows[-1][0]


class SimJob(Job):
    """Runs the simulated job in place of workers.jobs.evaluate (and nothing else)."""

    sim = (1.0, 1000, 1.0)

    @property
    def func(self):
        if self.func_name != "workers.jobs.evaluate":
            raise PermissionError(f"refusing to run {self.func_name!r}")
        return functools.partial(simulated_evaluate, self.connection, *SimJob.sim)


def read_stats(path: Path) -> dict[str, int]:
    """A stats file a simulated host keeps (empty before its first write)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def host_main(args: argparse.Namespace) -> None:
    """One simulated host: `--threads` AesrlWorkers in threads of this process."""
    import workers.worker as ww

    ww._limit_threads = lambda: None  # the simulated job never runs torch
    import aesrl_queue.numpy_actor  # noqa: F401 - what the first job would import (before heartbeats start)
    if args.read_url:
        os.environ["AESRL_READ_URL"] = args.read_url
    if args.fanout_url:
        from aesrl_queue.connection import FANOUT_ENV

        os.environ[FANOUT_ENV] = args.fanout_url

    SimJob.sim = (args.episode_s, args.episode_len, args.train_s)

    class SimWorker(ww.AesrlWorker):
        death_penalty_class = NoDeathPenalty

        def __init__(self, *a, **k) -> None:
            super().__init__(*a, **k)
            self.job_class = SimJob
            for q in self.queues:
                q.job_class = SimJob

        def _install_signal_handlers(self) -> None:  # only the main thread may; it exits on SIGTERM
            pass

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    for i in range(args.threads):
        name = f"{args.prefix}-w{i}"
        conn = redis.Redis.from_url(args.url, socket_connect_timeout=5, socket_keepalive=True)
        w = SimWorker(connection=conn, name=name)
        threading.Thread(target=w.work, kwargs={"logging_level": "WARNING"}, name=name, daemon=True).start()
    from workers import replica

    out = Path(args.stats) if args.stats else None
    while True:  # the host's reads from its copy and from the primary (its workers' readers summed)
        if out is not None:
            total = {"replica": 0, "waited": 0, "primary": 0, "errors": 0}
            for reader in list(replica._READERS.values()):
                for k in total:
                    total[k] += reader.stats[k]
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(total))
            tmp.replace(out)
        time.sleep(0.1 if out is not None else 3600)


# == measurement ============================================================================================
def _sum(counts) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def _run_bytes(client: redis.Redis, prefix: str) -> int:
    return sum(client.memory_usage(k, samples=0) or 0 for k in client.scan_iter(match=prefix + "*", count=1000))


def command_usec(client: redis.Redis) -> dict[str, int]:
    """Microseconds each command has taken on this server so far (INFO commandstats)."""
    return {k.removeprefix("cmdstat_"): int(v["usec"]) for k, v in client.info("commandstats").items()}


def box_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int, tid: int) -> float:
    """user+system CPU seconds of one thread of a live process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def net_bytes(client: redis.Redis) -> dict[str, int]:
    s = client.info("stats")
    return {"in": int(s["total_net_input_bytes"]), "out": int(s["total_net_output_bytes"]),
            "repl_out": int(s.get("total_net_repl_output_bytes", 0))}


class Point:
    """One scale point: a fresh primary (+ replicas), hosts of simulated workers, a scheduler."""

    def __init__(self, workers: int, copy: str, rl_share: float, args: argparse.Namespace, tmp: Path) -> None:
        """`copy`: what each host reads the run's data from: "" (the primary), "replica" (its host replica of
        the primary) or "fanout" (its host replica of a fan-out instance beside the primary)."""
        self.n, self.copy, self.rl_share, self.args = workers, copy, rl_share, args
        self.tmp = tmp / f"w{workers}-rl{rl_share:g}-{copy or 'plain'}"
        self.tmp.mkdir(parents=True)
        self.kids = Children(self.tmp)
        self.servers: list[RedisServer] = []
        self.host_replicas: list = []
        self.stop = threading.Event()
        self.daemon_bytes = 0  # what the critic stand-in read of the replay (RL mix)

    def run(self) -> dict[str, Any]:
        try:
            return self._run()
        finally:
            self.stop.set()
            self.kids.kill_all()
            for h in self.host_replicas:
                h.stop_event.set()
            for s in self.servers:
                s.cleanup()

    def _run(self) -> dict[str, Any]:
        args = self.args
        primary = RedisServer(directory=self.tmp / "primary", extra_args=[
            "--repl-diskless-sync-delay", "0", "--repl-backlog-size", "256mb",
            "--client-output-buffer-limit", "replica 1gb 512mb 60", "--maxclients", "20000"]).start()
        self.servers.append(primary)
        client = redis.Redis.from_url(primary.url, socket_timeout=30)
        fan = None  # the fan-out instance (copy "fanout"): what the hosts' replicas follow instead of the primary
        if self.copy == "fanout":
            fan = RedisServer(directory=self.tmp / "fanout", extra_args=[
                "--repl-diskless-sync-delay", "0", "--repl-backlog-size", "256mb",
                "--client-output-buffer-limit", "replica 1gb 512mb 60", "--maxclients", "20000"]).start()
            self.servers.append(fan)
        fan_client = redis.Redis.from_url(fan.url, socket_timeout=30) if fan else None
        redises = [primary] + ([fan] if fan else [])
        n_hosts = max(1, math.ceil(self.n / args.per_host))
        sizes = [self.n // n_hosts + (1 if h < self.n % n_hosts else 0) for h in range(n_hosts)]
        reps: list[RedisServer] = []
        if self.copy:
            from workers.host_replica import HostReplica

            for h in range(n_hosts):  # what `aesrl-queue worker` starts on each host (its supervisor too)
                host = HostReplica((fan or primary).url, directory=self.tmp / f"{self.copy}{h}").start()
                self.host_replicas.append(host)
                self.servers.append(host.server)
                reps.append(host.server)
        hosts = []
        for h, size in enumerate(sizes):
            cmd = [sys.executable, str(Path(__file__).resolve()), "_host", "--url", primary.url, "--threads", str(size),
                   "--prefix", f"h{h}", "--episode-s", str(args.episode_s), "--episode-len", str(args.episode_len),
                   "--train-s", str(args.train_s)]
            if reps:
                cmd += ["--read-url", reps[h].url, "--stats", str(self.tmp / f"host{h}.json")]
            if fan:
                cmd += ["--fanout-url", fan.url]
            hosts.append(self.kids.start(f"host{h}", cmd))
        # The scheduler starts beside them: it sizes the jobs in flight by the heartbeats it sees.
        run_id = f"scale-{self.n}-{uuid.uuid4().hex[:6]}"
        cfg_file = self.tmp / "run.json"
        cfg_file.write_text(json.dumps({
            "env_id": "AesrlSleep-v0", "algo": "aesrl", "rl_ratio": self.rl_share, "hidden": list(HIDDEN), "r": 1.0,
            "env_kwargs": {"episode_len": args.episode_len, "mean_s": args.episode_s}, "total_steps": 10**12,
            "mean_eval_episodes": 1, "initial_steps": 0,
            **SHAPES[args.shape],
        }))
        if self.rl_share > 0:  # a stand-in for the critic daemon: new weights every critic_every seconds
            threading.Thread(target=self._publish_critic, args=(primary.url, run_id, fan.url if fan else None),
                             daemon=True).start()
        sched = self.kids.start("scheduler", [sys.executable, "-m", "cli.main", "--log-level", "WARNING",
                                              "scheduler", "start", "--redis-url", primary.url, "--config",
                                              str(cfg_file), "--run-id", run_id]
                                + (["--fanout-url", fan.url] if fan else []))
        deadline = time.monotonic() + 60 + self.n / 4
        while len(live_workers(client)) < self.n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.n} simulated workers did not heartbeat:\n{self.kids.log_tail('host0')}")
            time.sleep(0.2)
        for rep in reps if self.copy in ("replica", "fanout") else ():
            rc = redis.Redis.from_url(rep.url)
            while rc.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise RuntimeError("a replica did not sync")
                time.sleep(0.1)
        store = Store(client, run_id)
        # Warm-up: about one job per worker (each builds its run context on its first); with RL jobs about
        # four, so that nearly every worker has mirrored the replay once (a process's first RL job
        # downloads the whole stream, up to 34 MB at HalfCheetah's capacity: a one-off, not the steady state).
        want = self.n * (4 if self.rl_share > 0 else 1)
        deadline = time.monotonic() + 60 + 5 * args.episode_s + want / 5
        while not store.exists() or store.state_field("results_applied") < want:
            if sched.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the scheduler stopped or stalled at {store.state_field('results_applied')} of "
                                   f"{want} results:\n{self.kids.log_tail('scheduler')}\n"
                                   + "\n".join(self.kids.log_tail(f"host{h}") for h in range(len(hosts))))
            time.sleep(0.1)
        time.sleep(args.warm)

        rep_clients = [redis.Redis.from_url(r.url) for r in reps]

        def snap() -> dict[str, Any]:
            st = store.state()
            rep_stats = [c.info("stats") for c in rep_clients]
            return {"t": time.monotonic(), "applied": st["results_applied"], "version": st["version"],
                    "failed": int(st.get("failed", 0)),
                    "sched": proc_cpu_s(sched.pid), "sched_loop": thread_cpu_s(sched.pid, sched.pid),
                    "redis": sum(proc_cpu_s(r.proc.pid) for r in redises), "primary": proc_cpu_s(primary.proc.pid),
                    "replicas": sum(proc_cpu_s(r.proc.pid) for r in reps),
                    "hosts": sum(proc_cpu_s(h.pid) for h in hosts), "box": box_busy_s(),
                    "net": _sum(net_bytes(c) for c in [client] + ([fan_client] if fan_client else [])),
                    "fan_net": net_bytes(fan_client) if fan_client else {"in": 0, "out": 0, "repl_out": 0},
                    "usec": {name: command_usec(c) for name, c in (("primary", client), ("fanout", fan_client)) if c},
                    "cmds": int(client.info("stats")["total_commands_processed"]), "daemon": self.daemon_bytes,
                    "copies": int(client.info("commandstats").get("cmdstat_copy", {}).get("calls", 0)),
                    "rep_hits": sum(int(x["keyspace_hits"]) for x in rep_stats),
                    "rep_misses": sum(int(x["keyspace_misses"]) for x in rep_stats),
                    "fallbacks": sum(read_stats(self.tmp / f"host{h}.json").get("primary", 0) for h in range(len(reps)))}

        # The versions the scheduler publishes (commits that moved μ), seen by polling the state every 5 ms.
        seen = {"changes": 0}

        def watch() -> None:
            last = store.current_version()
            while not done.is_set():
                v = store.current_version()
                seen["changes"] += v != last
                last = v
                time.sleep(0.005)

        done = threading.Event()
        watcher = threading.Thread(target=watch, daemon=True)
        a = snap()
        watcher.start()
        time.sleep(args.window)
        done.set()
        b = snap()
        if sched.poll() is not None:
            raise RuntimeError(f"the scheduler exited during the window:\n{self.kids.log_tail('scheduler')}")
        dt = b["t"] - a["t"]
        applied = b["applied"] - a["applied"]
        hist = [h for _, h in store.history(count=max(1, applied), newest=True)]
        durations = sorted(float(h.get("duration", 0.0)) for h in hist)
        net = {k: (b["net"][k] - a["net"][k]) for k in a["net"]}
        rate = applied / dt
        # a job's mean seconds: an antithetic ES job plays two episodes, an RL job of the default's shape
        # trains nothing
        es_s = args.episode_s * (2 if shape_setting(args.shape, "es_antithetic") else 1)
        rl_s = args.episode_s + (args.train_s if shape_setting(args.shape, "rl_steps_max") else 0.0)
        share = sum(1 for h in hist if h.get("kind") == "rl") / max(1, len(hist))
        ideal = self.n / ((1 - share) * es_s + share * rl_s)
        per = max(1, applied)
        # the critic stand-in's replay reads leave the primary for the daemon's host, not the workers'
        daemon = b["daemon"] - a["daemon"]
        net["out"] -= daemon
        return {
            "workers": self.n, "replicas": len(reps), "copy": self.copy or "none", "hosts": n_hosts,
            "shape": args.shape, "rl_share_target": self.rl_share, "rl_share": share,
            "daemon_MB_per_result": daemon / per / 1e6,
            # RL individuals copied inside the primary from the daemon's published actor (the default's shape)
            "copies_per_rl_result": (b["copies"] - a["copies"]) / max(1, share * applied),
            # failed results the scheduler counted in the window (asked again): a read miss shows here
            "failed_per_result": (b["failed"] - a["failed"]) / per,
            "results_per_s": rate, "ideal_per_s": ideal,
            "efficiency": rate / ideal, "versions_per_result": (b["version"] - a["version"]) / per,
            "published_per_s": seen["changes"] / dt,
            "job_s_median": durations[len(durations) // 2] if durations else math.nan,
            "scheduler_cores": (b["sched"] - a["sched"]) / dt, "redis_cores": (b["redis"] - a["redis"]) / dt,
            "replica_cores": (b["replicas"] - a["replicas"]) / dt, "worker_cores": (b["hosts"] - a["hosts"]) / dt,
            "box_cores": (b["box"] - a["box"]) / dt,
            # Everything else on the machine (other users' processes): the measurement's noise floor.
            "other_cores": max(0.0, (b["box"] - a["box"] - sum(b[k] - a[k] for k in ("sched", "redis", "replicas",
                                                                                      "hosts"))) / dt),
            "scheduler_ms_per_result": 1e3 * (b["sched"] - a["sched"]) / per,
            "redis_ms_per_result": 1e3 * (b["redis"] - a["redis"]) / per,  # with a fan-out instance: both
            "primary_ms_per_result": 1e3 * (b["primary"] - a["primary"]) / per,
            # What the fan-out instance sends per result to each host (its replication stream, fallbacks).
            "fanout_out_MB_per_result_per_host": (b["fan_net"]["out"] - a["fan_net"]["out"]) / per / 1e6 / n_hosts,
            # The loop's own thread (the ε of ES jobs runs on a background thread beside it).
            "scheduler_loop_ms_per_result": 1e3 * (b["sched_loop"] - a["sched_loop"]) / per,
            "net_in_MBps": net["in"] / dt / 1e6, "net_out_MBps": net["out"] / dt / 1e6,
            "net_repl_out_MBps": net["repl_out"] / dt / 1e6,
            "out_MB_per_result": net["out"] / per / 1e6, "in_MB_per_result": net["in"] / per / 1e6,
            "redis_cmds_per_result": (b["cmds"] - a["cmds"]) / per, "window_s": dt, "applied": applied,
            # Replica reads that found their key / polls that did not yet (a job waiting for its version).
            "replica_hits_per_result": (b["rep_hits"] - a["rep_hits"]) / per,
            "replica_misses_per_result": (b["rep_misses"] - a["rep_misses"]) / per,
            # Reads the workers meant for their host's copy that went to the primary (lag, errors, bypass).
            "fallbacks_per_result": (b["fallbacks"] - a["fallbacks"]) / per,
            # What the primary (and the fan-out instance) send per result for each host's copy of the run
            # (replica) and its workers, or, without a copy, for all of the host's workers together.
            "out_MB_per_result_per_host": net["out"] / per / 1e6 / n_hosts,
            # Of that, the replication stream to the host replicas (Redis's own count of it).
            "repl_MB_per_result_per_host": net["repl_out"] / per / 1e6 / max(1, len(reps)),
            "loadavg": list(os.getloadavg()),
            # Where each instance's command time went (INFO commandstats: the commands' own execution, not
            # the reading and writing of sockets nor replication), µs per result, the eight largest.
            "command_us_per_result": {name: dict(sorted(((k, round((v - a["usec"][name].get(k, 0)) / per, 1))
                                                         for k, v in b["usec"][name].items()),
                                                        key=lambda kv: -kv[1])[:8]) for name in b["usec"]},
            # What the busiest host replica holds at the end of the window (this run's keys and RQ's).
            "replica_used_MB": max((c.info("memory")["used_memory"] / 1e6 for c in rep_clients), default=0.0),
            # Of it, the run's own keys (MEMORY USAGE of each key under its prefix) on the busiest host: the
            # rest is Redis's own, RQ's records (a replica of the primary) and the replies being sent.
            "replica_run_MB": max((_run_bytes(c, store.prefix) / 1e6 for c in rep_clients), default=0.0),
        }


    def _publish_critic(self, url: str, run_id: str, fan_url: str | None = None) -> None:
        """A stand-in for the critic daemon: it publishes what the daemon publishes every critic_every
        seconds and reads the replay stream as the daemon mirrors it (its bytes counted in
        self.daemon_bytes: they go to the daemon's host, not to the workers' hosts)."""
        store = Store(redis.Redis.from_url(url), run_id)
        fan = Fanout(store, redis.Redis.from_url(fan_url)) if fan_url else None
        plays = not shape_setting(self.args.shape, "rl_steps_max")
        # The daemon publishes once the random phase's steps are stored: after the scheduler's set-up, which
        # empties the run's keys on a fan-out instance (an earlier namesake's). A stand-in that published
        # before it would see its first version deleted there while the primary names it.
        while not self.stop.is_set():
            with contextlib.suppress(codec.CodecError):
                if store.status() == "running":
                    cfg = store.config()
                    size, ttl = cfg.actor_dim, individual_ttl(cfg)
                    break
            self.stop.wait(0.1)
        if plays:  # the daemon's policy: the actor and crossq-sac's log-std network (the actor's shape)
            weights = {"actor": np.zeros(size, np.float32), "log_std": np.zeros(size, np.float32)}
        else:
            weights = {"critic": np.zeros(CRITIC_PARAMS, np.float32),
                       "critic_target": np.zeros(CRITIC_PARAMS, np.float32)}
        version, last, due = 0, "0-0", 0.0
        while not self.stop.is_set():
            with contextlib.suppress(redis.RedisError):
                while rows := store.read_stream(REPLAY, last, count=500):
                    last = rows[-1][0]
                    self.daemon_bytes += sum(len(v) for _, f in rows for v in f.values())
                if time.monotonic() >= due:
                    due, version = time.monotonic() + self.args.critic_every, version + 1
                    # What the daemon writes: the weights, its actor for RL jobs to copy, and in the state
                    # its version and a step count that keeps up with the replay (no job is held for it).
                    if fan is not None:  # weights to the fan-out instance, the primary names the version
                        fan.publish_critic(version, weights)
                    pipe = store.r.pipeline()
                    store.publish_critic(version, None if fan is not None else weights, pipe=pipe)
                    if plays:
                        store.put_policy(version, weights["actor"], ttl=ttl, pipe=pipe)
                    store.set_state(pipe=pipe, critic_version=version, critic_steps=10**12)
                    pipe.execute()
            self.stop.wait(0.1)


# == report =================================================================================================
COLUMNS = (
    ("workers", "workers", "{:d}"), ("replicas", "repl", "{:d}"),
    ("rl_share", "RL", "{:.0%}"),
    ("results_per_s", "results/s", "{:.1f}"),
    ("efficiency", "of ideal", "{:.0%}"), ("scheduler_cores", "sched cores", "{:.2f}"),
    ("redis_cores", "redis cores", "{:.2f}"), ("replica_cores", "repl cores", "{:.2f}"),
    ("worker_cores", "worker cores", "{:.2f}"), ("other_cores", "other cores", "{:.2f}"),
    ("net_out_MBps", "out MB/s", "{:.1f}"), ("net_in_MBps", "in MB/s", "{:.1f}"),
    ("out_MB_per_result", "out MB/res", "{:.2f}"), ("scheduler_ms_per_result", "sched ms/res", "{:.2f}"),
    ("scheduler_loop_ms_per_result", "loop ms/res", "{:.2f}"), ("redis_ms_per_result", "redis ms/res", "{:.2f}"),
    ("fallbacks_per_result", "fallbacks/res", "{:.2f}"), ("failed_per_result", "failed/res", "{:.2f}"),
    ("job_s_median", "job s", "{:.2f}"),
)


def render(rows: list[dict[str, Any]]) -> str:
    head = [c[1] for c in COLUMNS]
    body = [[fmt.format(r[k]) if isinstance(r.get(k), int | float) and math.isfinite(r[k]) else "-"
             for k, _h, fmt in COLUMNS] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    lines = [" | ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)), "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(c.rjust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    return "\n".join(lines)


def find_knee(rows: list[dict[str, Any]], cores: int, rl_share: float = 0.0) -> dict[str, Any]:
    """The first point (no replicas, this RL share) below KNEE_EFFICIENCY of ideal, what ran out there, and
    the ceiling of each part were it on a machine of its own (from the busiest point's costs per result)."""
    plain = [r for r in rows if r.get("copy", "none") == "none" and r["rl_share_target"] == rl_share]
    if not plain:
        return {"workers": None, "bottleneck": "no points without replicas", "why": "", "ceilings": {}}
    best = max(plain, key=lambda r: r["results_per_s"])
    # One core each: the scheduler's loop and Redis's command thread are single-threaded.
    ceilings = {"scheduler (1 core)": 1e3 / max(1e-9, best["scheduler_ms_per_result"]),
                "redis primary (1 core)": 1e3 / max(1e-9, best["redis_ms_per_result"]),
                "primary's 1 GbE link": GBE_MBPS / max(1e-9, best["out_MB_per_result"], best["in_MB_per_result"])}
    first = min(ceilings, key=ceilings.get)
    out = {"peak_results_per_s": best["results_per_s"], "peak_at_workers": best["workers"], "ceilings": ceilings,
           "first_limit_on_own_machines": first}
    knee = next((r for r in plain if r["efficiency"] < KNEE_EFFICIENCY), None)
    if knee is None:
        return {**out, "workers": None, "bottleneck": "none reached",
                "why": f"every point kept ≥{KNEE_EFFICIENCY:.0%} of the ideal W/job-seconds"}
    ours = {"scheduler": knee["scheduler_cores"], "redis": knee["redis_cores"],
            "simulated workers": knee["worker_cores"]}
    if knee["box_cores"] >= 0.9 * cores:
        biggest = max(ours, key=ours.get)
        others = knee["box_cores"] - sum(ours.values()) - knee["replica_cores"]
        name = f"this machine's {cores} CPU cores"
        why = (f"{knee['box_cores']:.2f} of {cores} cores busy at {knee['workers']} workers: scheduler "
               f"{ours['scheduler']:.2f}, Redis {ours['redis']:.2f}, simulated workers {ours['simulated workers']:.2f}, "
               f"other processes {max(0.0, others):.2f}; the largest of ours is the {biggest}")
    elif knee["scheduler_cores"] >= 0.85:
        name, why = "scheduler", f"the scheduler used {knee['scheduler_cores']:.2f} cores (one loop thread)"
    elif knee["redis_cores"] >= 0.85:
        name, why = "redis", f"Redis used {knee['redis_cores']:.2f} cores (one command thread)"
    else:
        name, why = "unclear", "no part near a full core and the machine not saturated"
    return {**out, "workers": knee["workers"], "bottleneck": name, "why": why}


def at_rate_model(loop: dict[str, Any]) -> dict[str, Any] | None:
    """Per-second costs of the scheduler's loop thread and Redis's command thread at r results/s, from
    bench/loop_cost.py's two batch sizes (B results per commit at COMMIT_HZ commits/s; the rows that
    read one result per XREAD where there are some, the loop's dearest way to take them): each costs
    a + F/B per result, a per result and F per commit, so a·r + F·COMMIT_HZ ms per second; Redis also
    pays the host replicas' acknowledgements per host and second. None without two rows that ran with
    host replicas."""
    rows = [r for r in loop.get("rows", []) if r.get("host_replicas")]
    if any(r.get("per_read") == 1 for r in rows):  # the loop woken for every result: its dearest case
        rows = [r for r in rows if r.get("per_read") == 1]
    rows = sorted(rows, key=lambda r: r["batch"])
    if len(rows) < 2 or loop.get("rq") is None:
        return None
    lo, hi = rows[0], rows[-1]
    hz = loop.get("commit_hz", 10)

    def fit(c_lo: float, c_hi: float) -> tuple[float, float]:
        per_commit = (c_lo - c_hi) / (1 / lo["batch"] - 1 / hi["batch"])
        return max(1e-9, c_hi - per_commit / hi["batch"]), max(0.0, per_commit)

    def redis(r: dict[str, Any]) -> float:  # per result, the replicas' fixed cost left out
        a = r["at_rate"]
        return a["redis_ms"] - r["replica_idle_ms_per_s_per_host"] * r["host_replicas"] / a["results_per_s"]

    loop_a, loop_f = fit(lo["loop_ms_per_result"], hi["loop_ms_per_result"])
    redis_a, redis_f = fit(redis(lo), redis(hi))
    return {"hz": hz, "loop": (loop_a, loop_f), "redis": (redis_a, redis_f), "eps_ms": hi["eps_ms_per_result"],
            "replica_ms_per_s": hi["replica_idle_ms_per_s_per_host"], "batches": [lo["batch"], hi["batch"]]}


def capacity(rows: list[dict[str, Any]], loop: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Workers one primary carries, per mix and set-up, on each link and job time: the results/s that
    the first of the link, Redis's command thread and the scheduler's loop thread allows, from the
    busiest point of that mix and set-up that kept up (≥ KNEE_EFFICIENCY of ideal; the busiest point
    when none did), times the job seconds.

    The link: the primary's egress per result measured at that point (a host replica receives every
    write of the run: versions, episodes, individuals, RQ's bookkeeping), so per result. The scheduler: its loop thread is single-threaded; the ε of ES jobs
    runs on threads beside it, and the cores those need at the allowed rate are reported with it.

    With `loop` (bench/loop_cost.py's JSON), an ES run with host replicas takes the scheduler's and Redis's
    costs from `at_rate_model` instead: measured at 100 and 1,000 results/s without workers around,
    where a simulated cluster on this machine's 2 cores reaches only its knee."""
    model = at_rate_model(loop) if loop else None
    out = []
    for share in sorted({r["rl_share_target"] for r in rows}):
        for copy in ("none", "replica"):
            pts = [r for r in rows if r["rl_share_target"] == share and r.get("copy", "none") == copy]
            if not pts:
                continue
            kept = [r for r in pts if r["efficiency"] >= KNEE_EFFICIENCY]
            best = max(kept or pts, key=lambda r: r["results_per_s"])
            hosts = best["hosts"]
            fixed = 0.0
            per_result = max(1e-9, best["out_MB_per_result"])
            loop_ms = best.get("scheduler_loop_ms_per_result", best["scheduler_ms_per_result"])
            beside_ms = max(0.0, best["scheduler_ms_per_result"] - loop_ms)
            use_model = model is not None and share == 0 and copy == "replica"
            for link, mbps in LINKS.items():
                limits = {"link": max(0.0, mbps - fixed) / per_result,
                          "redis": 1e3 / max(1e-9, best["redis_ms_per_result"]),
                          "scheduler": 1e3 / max(1e-9, loop_ms)}
                if use_model:
                    (la, lf), (ra, rf) = model["loop"], model["redis"]
                    limits["scheduler"] = max(0.0, 1e3 - lf * model["hz"]) / la
                    limits["redis"] = max(0.0, 1e3 - rf * model["hz"] - model["replica_ms_per_s"] * hosts) / ra
                first = min(limits, key=limits.get)
                r_max = limits[first]
                out.append({"rl_share": share, "copy": copy, "hosts": hosts, "link": link,
                            "at_workers": best["workers"], "out_MB_per_result": best["out_MB_per_result"],
                            "fixed_MBps": fixed, "MB_per_result": per_result,
                            "out_MB_per_result_per_host_there": (fixed + r_max * per_result) / max(1e-9, r_max) / hosts,
                            "results_per_s": r_max, "bound_by": first, "limits": limits,
                            "scheduler_other_cores": (model["eps_ms"] if use_model else beside_ms) * r_max / 1e3,
                            "costs_from": "loop_cost" if use_model else "scale point",
                            "workers": {f"{t:g}s": int(r_max * t) for t in JOB_SECONDS}})
    return out


def render_capacity(cap: list[dict[str, Any]]) -> str:
    lines = ["workers one primary carries (the costs of the busiest point of each set-up that kept up; the\n"
             "scheduler's loop thread on one core, its ε threads needing the cores given; egress per result\n"
             "and host at that rate):"]
    for c in cap:
        mix = "ES" if c["rl_share"] == 0 else f"AES-RL {c['rl_share']:.0%}"
        setup = f"{c['hosts']} hosts" + (f", a {c['copy']} each" if c["copy"] != "none" else ", no copy")
        jobs = ", ".join(f"{n} with {t} jobs" for t, n in c["workers"].items())
        lines.append(f"  {mix:11s} {setup:24s} {c['link']:6s}: {c['results_per_s']:6.0f} results/s "
                     f"(bound by {c['bound_by']}; {c['out_MB_per_result_per_host_there']:.3f} MB/result/host; "
                     f"+{c['scheduler_other_cores']:.1f} cores for ε"
                     f"{'; scheduler and Redis from loop_cost' if c.get('costs_from') == 'loop_cost' else ''}) -> {jobs}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = MODES["quick" if args.quick else "full"]

    def counts_of(given: str | None, default) -> list[int]:
        if given is None:
            return list(default)
        return [int(x) for x in given.split(",") if x.strip()]

    points = [(n, "", 0.0) for n in counts_of(args.workers, mode["workers"])]
    points += [(n, "replica", 0.0) for n in counts_of(args.replica_workers, mode["replicas"])]
    points += [(n, "", args.rl_share) for n in counts_of(args.rl_workers, mode["rl_workers"])]
    points += [(n, "replica", args.rl_share) for n in counts_of(args.rl_replica_workers, mode["rl_replicas"])]
    points += [(n, "fanout", 0.0) for n in counts_of(args.fanout_workers, ())]
    points += [(n, "fanout", args.rl_share) for n in counts_of(args.rl_fanout_workers, ())]
    args.warm = mode["warm"] if args.warm is None else args.warm
    args.window = mode["window"] if args.window is None else args.window
    rows = []
    load_start = list(os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="aesrl-scale-") as tmp:
        for n, copy, share in points:
            t = time.monotonic()
            row = Point(n, copy, share, args, Path(tmp)).run()
            row["point_s"] = time.monotonic() - t
            rows.append(row)
            print(f"  {n:4d} workers{f' + {copy}s' if copy else ''}{f', RL {share:.0%}' if share else ''}: "
                  f"{row['results_per_s']:.1f} results/s ({row['efficiency']:.0%} of ideal) in {row['point_s']:.0f}s",
                  file=sys.stderr, flush=True)
    cores = os.cpu_count() or 1
    return {
        "benchmark": "scale", "mode": "quick" if args.quick else "full", "rows": rows, "knee": find_knee(rows, cores),
        "knee_rl_mix": find_knee(rows, cores, args.rl_share), "capacity": capacity(rows, args.loop),
        "settings": {"episode_s": args.episode_s, "episode_len": args.episode_len, "per_host": args.per_host,
                     "train_s": args.train_s, "rl_share": args.rl_share, "critic_every_s": args.critic_every,
                     "shape": args.shape, "job_settings": SHAPES[args.shape],
                     # what the critic stand-in publishes per version: the critic and its target, or (the
                     # default's shape) the actor and its log-std network, both of the actor's size
                     "critic_bytes": 2 * (ACTOR_PARAMS if args.shape == "default" else CRITIC_PARAMS) * 4,
                     "hidden": list(HIDDEN), "actor_params": ACTOR_PARAMS,
                     "episode_bytes": args.episode_len * (2 * EP_OBS + EP_ACT + 2) * 4,
                     "warm_s": args.warm, "window_s": args.window},
        "machine": {"cores": cores, "python": platform.python_version(), "redis_server": find_redis_server(),
                    "loadavg_start": load_start,
                    "date": datetime.now().isoformat(timespec="seconds"), "loadavg_end": list(os.getloadavg())},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_host"]:
        hp = argparse.ArgumentParser()
        hp.add_argument("--url", required=True)
        hp.add_argument("--read-url", default="")
        hp.add_argument("--threads", type=int, required=True)
        hp.add_argument("--prefix", required=True)
        hp.add_argument("--episode-s", type=float, required=True)
        hp.add_argument("--episode-len", type=int, required=True)
        hp.add_argument("--train-s", type=float, required=True)
        hp.add_argument("--stats", default="")
        hp.add_argument("--fanout-url", default="")
        host_main(hp.parse_args(argv[1:]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 worker counts + 1 replica point, short windows (<60 s)")
    ap.add_argument("--workers", default=None, help="comma-separated worker counts without replicas")
    ap.add_argument("--replica-workers", default=None, help="worker counts to repeat with one replica per host ('' for none)")
    ap.add_argument("--rl-workers", default=None, help="worker counts of the RL mix without replicas ('' for none)")
    ap.add_argument("--rl-replica-workers", default=None, help="worker counts of the RL mix with replicas ('' for none)")
    ap.add_argument("--fanout-workers", default=None,
                    help="worker counts (ES) with one replica per host following a fan-out instance beside the primary")
    ap.add_argument("--rl-fanout-workers", default=None,
                    help="worker counts of the RL mix with one replica per host following a fan-out instance")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="default",
                    help="the jobs' Redis traffic: the defaults' (default) or RL jobs that train (trains)")
    ap.add_argument("--rl-share", type=float, default=0.5, help="target share of RL jobs in the RL mix")
    ap.add_argument("--train-s", type=float, default=1.0, help="seconds an RL job sleeps for its training")
    ap.add_argument("--critic-every", type=float, default=2.0, help="seconds between critic publications (RL mix)")
    ap.add_argument("--per-host", type=int, default=32, help="simulated workers per host process (one replica each)")
    ap.add_argument("--episode-s", type=float, default=1.0, help="seconds one simulated job sleeps (±20%%)")
    ap.add_argument("--episode-len", type=int, default=1000, help="transitions stored per job")
    ap.add_argument("--warm", type=float, default=None, help="warm-up seconds after every worker's first result")
    ap.add_argument("--window", type=float, default=None, help="measurement seconds per point")
    ap.add_argument("--out", default=None,
                    help="JSON results path (default: bench/results/scale.json; --quick: a temporary folder)")
    ap.add_argument("--capacity-from", nargs="+", metavar="JSON",
                    help="measure nothing: print (and write into the first file) the capacity from saved rows")
    ap.add_argument("--loop-cost", default=str(ROOT / "bench" / "results" / "loop_cost.json"), metavar="JSON",
                    help="bench/loop_cost.py's rows: the scheduler's and Redis's costs of ES runs with host replicas at "
                         "the rate ('' to take them from the scale points alone)")
    args = ap.parse_args(argv)
    loop = json.loads(Path(args.loop_cost).read_text()) if args.loop_cost and Path(args.loop_cost).exists() else None
    args.loop = loop
    if args.capacity_from:
        files = [Path(f) for f in args.capacity_from]
        saved = [json.loads(f.read_text()) for f in files]
        rows = [r for d in saved for r in d["rows"]]
        saved[0]["capacity"] = capacity(rows, loop)
        print(render_capacity(saved[0]["capacity"]))
        files[0].write_text(json.dumps(saved[0], indent=2))
        print(f"wrote the capacity of {len(rows)} rows into {files[0]}")
        return 0
    if args.out is None:
        args.out = str(Path(tempfile.mkdtemp(prefix="aesrl-bench-")) / DEFAULT_OUT.name if args.quick else DEFAULT_OUT)
    data = run(args)
    print(render(data["rows"]))
    for label, knee in (("ES only", data["knee"]), (f"RL mix {args.rl_share:.0%}", data["knee_rl_mix"])):
        if knee["workers"] is None and not knee.get("ceilings"):
            continue
        print(f"\n{label}: knee at {knee['workers']} workers — bottleneck: {knee['bottleneck']} ({knee['why']})")
        if knee.get("ceilings"):
            print("  ceilings on machines of their own (results/s, from the costs at the busiest point): "
                  + ", ".join(f"{k} {v:.0f}" for k, v in knee["ceilings"].items())
                  + f" — first: {knee['first_limit_on_own_machines']}")
    print("\n" + render_capacity(data["capacity"]))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
