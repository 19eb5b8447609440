"""Every --algo survives the sequence of issue 15, all runs at once on one Redis and one pool of workers:
the scheduler is SIGKILLed mid-run (the synchronous ones mid-generation, with members already back)
and restarted with --run; Redis is SIGKILLed (AOF, fsync every second: up to a second of writes is
lost) and restarted on its AOF; each scheduler is killed and restarted once more. Every run finishes
its budget with every result applied exactly once; td3, which has no jobs, resumes from its checkpoint
with every episode stored and recorded exactly once. aesrl and td3 run with each learner.
"""

from __future__ import annotations

import signal
import time

import pytest

from aesrl_queue.connection import connect
from aesrl_queue.redis_server import RedisServer
from aesrl_queue.store import Store
from tests.conftest import wait_for
from tests.faults import check_exactly_once, check_td3_exactly_once, sleep_config, wait_pid_exit

pytestmark = pytest.mark.slow

AOF_ARGS = ["--appendfsync", "everysec", "--maxmemory-policy", "noeviction"]
# run name -> scheduler options; the budget in stored steps (20-step episodes): 3200, about 80 jobs
# where a job also stores μ's episode (a run with a critic) and 160 for es, whose jobs are the quickest
# and which otherwise finished before the second kill could catch it mid-run (beside other tests)
RUNS = {
    "aesrl": ("--algo", "aesrl", "--steps", "3200"),
    "es": ("--algo", "es", "--steps", "3200"),
    "opo": ("--algo", "opo", "--steps", "3200"),
    "acemrl": ("--algo", "acemrl", "--steps", "3200"),
    "cemrl": ("--algo", "cemrl", "--steps", "3200"),
    "pcemrl": ("--algo", "pcemrl", "--serial-critic", "--steps", "3200"),
    "pcemrl-pc": ("--algo", "pcemrl", "--parallel-critic", "--steps", "3200"),
    "td3": ("--algo", "td3", "--steps", "4000"),
    # each learner in the daemon and RL jobs of an asynchronous run and alone: aesrl's default is crossq-sac
    # (its checkpoint is crossq's critic, statistics and optimizer with its log-std, α and their
    # optimizers), td3's and the CEM-RL family's is td3
    "aesrl-td3": ("--algo", "aesrl", "--learner", "td3", "--steps", "3200"),
    "td3-crossq-sac": ("--algo", "td3", "--learner", "crossq-sac", "--steps", "4000"),
}
SYNC = ("cemrl", "pcemrl", "pcemrl-pc")
TD3 = ("td3", "td3-crossq-sac")
NO_CRITIC = ("es", *TD3)
WORKERS = 4


def mid_run(client, store: Store, name: str, after: int) -> bool:
    """Whether the run is where the kill should hit: results applied since `after`, jobs out, and for
    the synchronous runs an open generation with some members back and some not."""
    st = store.state()
    if st["status"] not in ("running", "created"):
        return False
    if name in TD3:
        return bool(client.exists(store.key("td3:ckpt"))) and st["steps"] > after + 200
    if st["results_applied"] < after + 4 or not client.hlen(store.key("inflight")):
        return False
    if name not in SYNC:
        return True
    gen = (store.load_checkpoint("optimizer") or {}).get("gen")
    done = sum(m["done"] for m in gen["members"]) if gen else 0
    return bool(gen) and 0 < done < len(gen["members"])


def kill_all_mid_run(client, procs, stores, incarnation: int, after: dict[str, int]) -> None:
    """SIGKILL each run's scheduler at its own mid-run moment and start the next one with --run."""
    left = set(stores)
    deadline = time.monotonic() + 300
    while left:
        if time.monotonic() >= deadline:
            states = {name: {k: stores[name].state().get(k) for k in ("status", "steps", "results_applied")}
                      | {"inflight": client.hlen(stores[name].key("inflight"))} for name in sorted(left)}
            raise AssertionError(f"never caught mid-run: {states}\n{procs.logs()}")
        for name in sorted(left):
            if not mid_run(client, stores[name], name, after[name]):
                continue
            p = procs.procs[f"{name}-s{incarnation}"]
            p.send_signal(signal.SIGKILL)
            assert wait_pid_exit(p.pid)
            procs.cli(f"{name}-s{incarnation + 1}", "scheduler", "start", "--redis-url", procs.url, "--run", name)
            left.discard(name)
        time.sleep(0.05)


def test_every_algorithm_survives_scheduler_and_redis_kills(tmp_path, procs):
    data = tmp_path / "redis"
    server = RedisServer(directory=data, appendonly=True, extra_args=AOF_ARGS).start()
    port = server.port
    procs.url = server.url  # the same after Redis restarts on its port
    try:
        client = connect(server.url)
        cfg = sleep_config(tmp_path / "run.json", mean_s=0.1, episode_len=20, total_steps=1600, initial_steps=100,
                           population=4, rl_steps_max=100, critic_wait=20.0, job_deadline=20.0,
                           td3_start_steps=200, td3_eval_every=400, queued_per_worker=0)
        for i in range(WORKERS):
            procs.rq_worker(f"w{i}", server.url)
        stores = {name: Store(client, name) for name in RUNS}
        for name, opts in RUNS.items():
            procs.cli(f"{name}-s1", "scheduler", "start", "--redis-url", server.url, "--config", str(cfg),
                      "--run-id", name, *opts)
            if name not in NO_CRITIC:
                procs.cli(f"{name}-critic", "critic", "start", "--redis-url", server.url, "--run", name)
        for store in stores.values():
            wait_for(store.exists, 60, what=f"run {store.run_id}", on_fail=procs.logs)

        # 1. Each scheduler SIGKILLed mid-run and restarted with --run.
        kill_all_mid_run(client, procs, stores, 1, {name: 0 for name in RUNS})

        # 2. Redis SIGKILLed (the last second of writes may be lost) and restarted on its AOF, once every
        # restarted scheduler is in its loop: one still starting (seconds under load) that finds Redis
        # gone exits with "cannot reach Redis", which is right for a start but not what this step tests.
        wait_for(lambda: all("scheduler started" in procs.log(f"{name}-s2") for name in RUNS), 120,
                 what="the restarted schedulers", on_fail=procs.logs)
        time.sleep(2.0)
        server.stop(kill=True)
        time.sleep(1.0)
        server = RedisServer(port=port, directory=data, appendonly=True, extra_args=AOF_ARGS).start()
        client = connect(server.url)
        stores = {name: Store(client, name) for name in RUNS}
        after = {name: (s.state()["steps"] if name in TD3 else s.state()["results_applied"])
                 for name, s in stores.items()}

        # 3. Each scheduler killed once more (the synchronous ones again mid-generation), restarted.
        kill_all_mid_run(client, procs, stores, 2, after)

        # 4. Every run finishes its budget; every result applied exactly once.
        for name, store in stores.items():
            wait_for(lambda s=store: s.status() in ("finished", "failed"), 300, interval=0.5,
                     what=f"{name} to finish", on_fail=procs.logs)
            assert store.status() == "finished", (name, procs.log(f"{name}-s3"))
            assert procs.procs[f"{name}-s3"].wait(60) == 0, procs.log(f"{name}-s3")
        for name, store in stores.items():
            st = store.state()
            budget = int(RUNS[name][RUNS[name].index("--steps") + 1])
            assert st["steps"] >= budget, (name, st)
            if name in TD3:
                check_td3_exactly_once(client, store)
                for log in (procs.log(f"{name}-s2"), procs.log(f"{name}-s3")):
                    assert "td3 resumed at" in log and "from its checkpoint" in log, log[-2000:]
                continue
            check_exactly_once(client, store)
            for i in (2, 3):
                assert "resumed at version" in procs.log(f"{name}-s{i}"), procs.log(f"{name}-s{i}")
    finally:
        server.cleanup()
