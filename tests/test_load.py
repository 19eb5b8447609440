"""Load: 32 `rq worker` processes on a sleep-based environment against one scheduler for about a
minute. No result lost or applied twice, the results backlog never exceeds the jobs the scheduler
has in flight, every worker gets work, and 32 ES-only workers fit easily in memory (they never
import torch). The throughput against the ideal W / job-seconds is measured by bench/scale.py and
bench/overhead.py, not asserted here: on a loaded machine it falls for load alone.
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

RUN = "load-32"
WORKERS = 32
MEAN_S = 0.5  # seconds per episode; a job is two episodes (the individual and one of μ)
EPISODE = 50
JOBS = 1000


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _backlog(client, store: Store, out: list, stop: threading.Event) -> None:
    """Results written but not yet consumed by the scheduler, twice a second."""
    while not stop.is_set():
        try:
            added = int(client.xinfo_stream(store.key("results"))["entries-added"])
            st = store.state()
            out.append(added - (st["results_applied"] + st["failed"] + st["rejected"] + st["stale"]))
        except Exception:  # the stream does not exist yet
            pass
        stop.wait(0.5)


def test_32_workers_against_one_scheduler(tmp_path, redis_url, client, procs):
    cfg = write_config(tmp_path / "run.json", "AesrlSleep-v0", algo="es", hidden=[8, 8],
                       env_kwargs={"episode_len": EPISODE, "mean_s": MEAN_S, "sigma": 0.3},
                       total_steps=JOBS * EPISODE, mean_eval_episodes=1, result_ttl=30, failure_ttl=120)
    t0 = time.monotonic()
    for i in range(WORKERS):
        procs.rq_worker(f"w{i:02d}", redis_url, "--logging_level", "WARNING")
    procs.cli("scheduler", "scheduler", "start", "--redis-url", redis_url, "--config", str(cfg), "--run-id", RUN)
    store = Store(client, RUN)
    wait_for(lambda: len([k for k in client.scan_iter(match="aesrl:worker:*")]) >= WORKERS, 120,
             what=f"{WORKERS} workers to heartbeat", on_fail=procs.logs)
    t_ready = time.monotonic() - t0
    backlog: list[int] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_backlog, args=(client, store, backlog, stop), daemon=True)
    sampler.start()
    try:
        # A generous limit: the run takes about a minute alone and fails here only if it never finishes.
        wait_for(lambda: store.status() == "finished", 900, interval=1.0, what="the run to finish",
                 on_fail=procs.logs)
    finally:
        stop.set()
        sampler.join(5)
    wall = time.monotonic() - t0
    assert procs.procs["scheduler"].wait(30) == 0, procs.log("scheduler")
    rss = [_rss_mib(p.pid) for name, p in procs.procs.items() if name.startswith("w") and p.poll() is None]

    out = check_exactly_once(client, store)
    st = out["state"]
    history = [h for _i, h in store.history()]
    # Zero lost, zero duplicated: every dispatched job's result applied once; nothing replaced or dropped.
    assert st["replaced"] == 0 and st["failed"] == 0 and st["stale"] == 0 and st["rejected"] == 0, st
    abandoned = st["dispatched"] - st["results_applied"]
    assert abandoned <= 2 * WORKERS, st  # only the jobs still in flight at the budget are left out
    assert len({h["job"] for h in history}) == st["results_applied"]
    # Throughput over the busy part of the run (first to last applied result).
    span = history[-1]["t"] - history[0]["t"]
    rate = (len(history) - 1) / span
    ideal = WORKERS / (2 * MEAN_S)
    print(f"\n{WORKERS} workers ready after {t_ready:.0f}s; {len(history)} results in {span:.0f}s = {rate:.1f} jobs/s "
          f"(ideal {ideal:.0f} jobs/s for {2 * MEAN_S:.1f}s jobs); whole test {wall:.0f}s; results backlog max "
          f"{max(backlog, default=0)}, median {sorted(backlog)[len(backlog) // 2] if backlog else 0}; worker RSS "
          f"{min(rss):.0f}-{max(rss):.0f} MiB, {sum(rss) / 1024:.2f} GiB for {len(rss)}; "
          f"lost {st['replaced']}, duplicated 0, abandoned at the end {abandoned}")
    assert len(rss) == WORKERS  # no worker died
    # Every worker got work: 1000 jobs over 32 workers, about 30 each, so none was left idle.
    by_worker = collections.Counter(f.get("worker") for _i, f in out["results"] if f.get("status", "ok") == "ok")
    assert len(by_worker) == WORKERS and min(by_worker.values()) > 0, by_worker
    # A result waiting in the stream is a job still in flight, and the scheduler keeps at most one
    # running and queued_per_worker (1) queued per live worker: more backlog would mean jobs
    # dispatched beyond that limit.
    assert backlog and max(backlog) <= 2 * WORKERS, backlog
    # Memory: ES-only workers do not import torch (~60 MiB each instead of ~230 MiB).
    assert max(rss) < 150, rss
