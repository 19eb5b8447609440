"""Thousands of null-environment jobs against one Redis: the number of keys and Redis's memory stay
bounded (superseded distribution versions deleted, streams trimmed, RQ job and result keys expired),
so a run of hours does not fill Redis.
"""

from __future__ import annotations

import collections
import threading
import time

import pytest

from aesrl_queue.store import Store
from tests.conftest import wait_for
from tests.faults import check_exactly_once, write_config

pytestmark = pytest.mark.slow

RUN = "bounded"
JOBS = 2000
EPISODE = 4  # steps per episode: the budget is JOBS * PAIR * EPISODE stored steps
PAIR = 2  # an es job stores an antithetic pair of episodes (es_antithetic, the es default)
RESULT_TTL = 5  # seconds RQ keeps a finished job; our results go to the run's own stream
HISTORY_MAX = 300  # entries kept in the results and history streams
REPLAY = 400  # transitions kept in the replay stream


PER_JOB = ("rq:job:", "rq:results:", "rq:execution")


def _per_job(key: str) -> bool:
    return key.startswith(PER_JOB) or ":ind:" in key or ":dist:" in key


def _sample(client, out: list, fixed: set, per_job_counts: list, stop: threading.Event) -> None:
    """DBSIZE and used_memory twice a second; once a second, the keys that have no TTL."""
    n = 0
    while not stop.is_set():
        info = client.info("memory")
        out.append((time.monotonic(), client.dbsize(), info["used_memory"]))
        if n % 2 == 0:
            keys = list(client.scan_iter(count=1000))
            pipe = client.pipeline(transaction=False)
            for k in keys:
                pipe.ttl(k)
            now = [k.decode() for k, ttl in zip(keys, pipe.execute(), strict=True) if ttl == -1]
            fixed.update(k for k in now if not _per_job(k))
            per_job_counts.append(sum(1 for k in now if _per_job(k)))
        n += 1
        stop.wait(0.5)


def test_keys_and_memory_stay_bounded_over_thousands_of_jobs(tmp_path, redis_url, client, procs):
    cfg = write_config(tmp_path / "run.json", "AesrlNull-v0", algo="es", hidden=[8, 8],
                       env_kwargs={"episode_len": EPISODE}, total_steps=JOBS * PAIR * EPISODE, mean_eval_episodes=1,
                       result_ttl=RESULT_TTL, failure_ttl=60, history_max=HISTORY_MAX, replay_capacity=REPLAY)
    base_memory = client.info("memory")["used_memory"]
    samples: list[tuple[float, int, int]] = []
    fixed: set[str] = set()  # every key seen without a TTL that is not a per-job key
    per_job_counts: list[int] = []  # per-job keys without a TTL at each sample (running jobs)
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(client, samples, fixed, per_job_counts, stop), daemon=True)
    sampler.start()
    try:
        procs.rq_worker("w0", redis_url)
        procs.rq_worker("w1", redis_url)
        procs.cli("scheduler", "scheduler", "start", "--redis-url", redis_url, "--config", str(cfg), "--run-id", RUN)
        store = Store(client, RUN)
        wait_for(lambda: store.exists() and store.status() == "finished", 300, interval=1.0,
                 what="the run to finish", on_fail=procs.logs)
    finally:
        stop.set()
        sampler.join(5)
    st = check_exactly_once(client, store)["state"]
    assert st["results_applied"] + st["failed"] + st["rejected"] + st["stale"] >= JOBS * 0.95, st

    elapsed = st["finished_at"] - st["started_at"]
    rate = st["dispatched"] / elapsed
    peak_keys = max(n for _t, n, _m in samples)
    by_prefix = collections.Counter(":".join(k.decode().split(":")[:2]) for k in client.scan_iter(count=1000))
    print(f"\n{st['dispatched']} jobs in {elapsed:.0f}s ({rate:.0f} jobs/s, 2 workers); keys: peak {peak_keys}, "
          f"end {client.dbsize()} {dict(by_prefix)}; fixed keys without TTL {len(fixed)}, per-job keys "
          f"without TTL at most {max(per_job_counts)}; used_memory peak "
          f"{max(m for *_x, m in samples) / 2**20:.1f} MiB (empty Redis {base_memory / 2**20:.1f} MiB)")
    per_entry = {name: client.memory_usage(store.key(name), samples=0) / max(1, client.xlen(store.key(name)))
                 for name in ("results", "history")}
    print(f"bytes per stream entry: results {per_entry['results']:.0f}, history {per_entry['history']:.0f}")
    # The bound: the keys without a TTL are a fixed set (run state, streams, queues, registries,
    # worker sets) that does not grow with the number of jobs ...
    assert len(fixed) <= 30, sorted(fixed)
    # ... plus, per running job, its RQ job hash (RQ drops the TTL while a job runs) and the dist:{v}
    # it reads: 2 workers x (1 running + 1 queued) jobs, and the current version.
    assert max(per_job_counts) <= 2 * 2 + 2 * 2 + 1, max(per_job_counts)
    # Keys at any moment: the fixed set plus RQ's two keys per job finished within result_ttl (Redis
    # reclaims expired keys lazily, so allow the rate over three times the TTL).
    assert peak_keys <= 30 + 2 * rate * 3 * RESULT_TTL, (peak_keys, rate)
    # Memory: the streams are capped, so Redis stays within a few MiB of an empty server.
    peak_memory = max(m for *_x, m in samples)
    assert peak_memory - base_memory < 16 * 2**20, (peak_memory - base_memory) / 2**20
    assert client.xlen(store.key("results")) <= HISTORY_MAX + 100  # MAXLEN ~ trims whole macro-nodes
    assert client.xlen(store.key("history")) <= HISTORY_MAX + 100
    assert int(st["replay_held"]) <= REPLAY
    assert len(list(client.scan_iter(match=store.key("dist:*")))) <= 3
    assert client.hlen(store.key("inflight")) == 0 and client.hlen(store.key("refs")) == 0
    # After result_ttl every RQ job key of the run is gone on its own.
    wait_for(lambda: not list(client.scan_iter(match=f"rq:job:{RUN}-*", count=1000)), RESULT_TTL + 60,
             what="RQ job keys to expire")
    assert not list(client.scan_iter(match=f"rq:results:{RUN}-*", count=1000))
