"""Workers killed with real signals in the middle of ES and RL jobs: the scheduler notices by the
missing heartbeat (seconds, not RQ's minutes-long abandoned-job pass), refills the slot, and a
late result of a replaced job is dropped, never applied twice.
"""

from __future__ import annotations

import signal
import time

import pytest

from aesrl_queue.store import WORKER_TTL, Store
from tests.conftest import wait_for
from tests.faults import (
    check_exactly_once,
    results,
    signal_worker,
    sleep_config,
    wait_pid_exit,
    workers_in_job,
)

pytestmark = pytest.mark.slow

RUN = "faults-workers"
# A generous wait for a lost job to be replaced: the heartbeat notices it in about WORKER_TTL + 1 s;
# the reason logged (below) tells the heartbeat from a job deadline.
LOSS_LIMIT = 9 * WORKER_TTL


def _wait_replaced(store: Store, before: int, since: float, timeout: float, on_fail) -> float:
    wait_for(lambda: store.state()["replaced"] > before, timeout, interval=0.1,
             what="the scheduler to replace the job of the signalled worker", on_fail=on_fail)
    return time.monotonic() - since


def _signal_in_job(client, redis_url: str, store: Store, procs, sig: int, kind: str | None = None, exclude: str = "",
                   timeout: float = 90) -> tuple[dict[str, str], int, float]:
    """Signal a worker in the middle of a job: (its heartbeat fields, `replaced` before, when).
    A worker's hash names its job until its next heartbeat (2 s) and the job stays in `started` until
    the scheduler applies it, so the worker picked may have just finished that job: a signal that
    lands after the job's result is in the stream is not "mid-job"; the worker (killed: replaced by a
    fresh one; stopped: continued) is left alone and another job is taken."""
    for attempt in range(5):
        w = wait_for(lambda: [w for w in workers_in_job(client, store, kind) if w["name"] != exclude], timeout,
                     interval=0.05, what=f"a {kind or 'any'} job running", on_fail=procs.logs)[0]
        time.sleep(0.3)
        before = store.state()["replaced"]
        t = time.monotonic()
        signal_worker(w, sig)
        if sig == signal.SIGKILL:
            assert wait_pid_exit(int(w["pid"]))
        if not any(f.get("job") == w["job"] for _i, f in results(client, store)):
            return w, before, t
        if sig == signal.SIGKILL:
            procs.rq_worker(f"w-again-{attempt}-{w['name']}", redis_url)
        else:
            signal_worker(w, signal.SIGCONT)
    raise AssertionError(f"five {kind or 'any'} jobs ended before the signal reached their worker")


def test_kill_9_in_es_and_rl_jobs_and_a_late_result(tmp_path, redis_url, client, procs):
    cfg = sleep_config(tmp_path / "run.json", mean_s=1.5, total_steps=4000, rl_ratio=0.5, initial_steps=300)
    for i in range(4):
        procs.rq_worker(f"w{i}", redis_url)
    procs.cli("scheduler", "scheduler", "start", "--redis-url", redis_url, "--config", str(cfg), "--run-id", RUN)
    procs.cli("critic", "critic", "start", "--redis-url", redis_url, "--run", RUN)
    store = Store(client, RUN)
    wait_for(store.exists, 60, what="the run", on_fail=procs.logs)

    # 1. kill -9 a worker in the middle of an ES job; SIGSTOP another one mid-job (its result comes late).
    es, before, t_kill = _signal_in_job(client, redis_url, store, procs, signal.SIGKILL, "es")
    stopped, _, _ = _signal_in_job(client, redis_url, store, procs, signal.SIGSTOP, exclude=es["name"], timeout=30)
    es_latency = _wait_replaced(store, before, t_kill, LOSS_LIMIT, procs.logs)
    wait_for(lambda: store.state()["replaced"] >= before + 2, LOSS_LIMIT, interval=0.1,
             what="the stopped worker's job to be replaced", on_fail=procs.logs)
    procs.rq_worker("w-new-1", redis_url)
    # The stopped worker wakes up and reports its (replaced) job: dropped as stale.
    stale_before = store.state()["stale"]
    signal_worker(stopped, signal.SIGCONT)
    wait_for(lambda: store.state()["stale"] > stale_before, 60, what="the late result to be dropped as stale",
             on_fail=procs.logs)

    # 2. kill -9 a worker in the middle of an RL job (needs the first critic).
    rl, before, t_kill = _signal_in_job(client, redis_url, store, procs, signal.SIGKILL, "rl", timeout=120)
    rl_latency = _wait_replaced(store, before, t_kill, LOSS_LIMIT, procs.logs)
    steps_after_faults = store.state()["steps"]
    procs.rq_worker("w-new-2", redis_url)

    # 3. The run reaches its budget with no result applied twice.
    wait_for(lambda: store.status() == "finished", 240, interval=0.5, what="the run to finish", on_fail=procs.logs)
    assert procs.procs["scheduler"].wait(30) == 0, procs.log("scheduler")
    out = check_exactly_once(client, store)
    st, history, entries = out["state"], out["history"], out["results"]
    assert st["steps"] >= 4000
    applied = {h["job"] for h in history}
    assert es["job"] not in applied and rl["job"] not in applied
    # The late result is in the stream, ok, and was not applied.
    late = [f for _i, f in entries if f["job"] == stopped["job"]]
    assert late and late[0]["status"] == "ok", late
    assert stopped["job"] not in applied
    assert st["replaced"] >= 3 and st["stale"] >= 1, st
    assert st["rl_applied"] > 0 and st["es_applied"] > 0, st
    # Both kills are noticed by the missing heartbeat, not by a job deadline (at least 120 s) or
    # RQ's abandoned-job pass: the scheduler logs that reason for each job it replaced.
    log = procs.log("scheduler")
    for killed in (es, rl):
        line = next((ln for ln in log.splitlines() if f"job {killed['job']} lost (" in ln), "")
        assert f"(worker {killed['name']} on " in line and "stopped heartbeating" in line, log[-3000:]
    assert "past its deadline" not in log, log[-3000:]
    assert f"result of {stopped['job']} (" in log and "is not in flight" in log
    print(f"\ndetection latency after kill -9: ES {es_latency:.1f}s, RL {rl_latency:.1f}s "
          f"(heartbeat TTL {WORKER_TTL}s); replaced={st['replaced']} stale={st['stale']}; "
          f"steps when the faults were over {steps_after_faults}")
