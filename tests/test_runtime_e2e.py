"""The runtime end to end, as users start it: `aesrl-queue scheduler start`, `aesrl-queue critic start`
and two `rq worker -w workers.AesrlWorker` processes on a private Redis, Pendulum-v1, tiny networks.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import pytest

from aesrl_queue.store import Store
from tests.conftest import ROOT, child_env, wait_for

pytestmark = pytest.mark.slow

RUN = "e2e-pendulum"


def _status(url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", "status", "--redis-url", url, "--run", RUN, *extra],
                          capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=60)


def test_scheduler_critic_and_rq_workers_run_pendulum(redis_url, client, procs):
    procs.rq_worker("worker-a", redis_url)
    procs.rq_worker("worker-b", redis_url)
    procs.cli("scheduler", "scheduler", "start", "--redis-url", redis_url, "--env", "Pendulum-v1",
              "--run-id", RUN, "--steps", "4000", "--initial-steps", "600", "--hidden", "8,8",
              "--critic-hidden", "32,32", "--seed", "3")
    procs.cli("critic", "critic", "start", "--redis-url", redis_url, "--run", RUN)
    store = Store(client, RUN)
    wait_for(lambda: store.exists(), 60, what="the run's config", on_fail=procs.logs)

    # While it runs, status shows the run with live workers.
    wait_for(lambda: store.state().get("results_applied", 0) >= 3, 120, what="first results", on_fail=procs.logs)
    live = _status(redis_url)
    assert live.returncode == 0, live.stderr
    assert RUN in live.stdout and "live workers 2" in live.stdout, live.stdout

    wait_for(lambda: store.status() == "finished", 400, interval=1.0, what="the run to finish", on_fail=procs.logs)
    assert procs.procs["scheduler"].wait(30) == 0, procs.log("scheduler")
    st = store.state()

    # Both kinds of individuals ran and were applied.
    assert st["es_applied"] > 0 and st["rl_applied"] > 0, st
    assert st["steps"] >= 4000
    # The critic version advanced and the critic exits once the run is finished.
    assert st["critic_version"] >= 2, st
    assert procs.procs["critic"].wait(60) == 0, procs.log("critic")

    # `steps` equals the transitions stored in the replay stream.
    stored = sum(int(f[b"len"]) for _i, f in client.xrange(store.key("replay")))
    assert stored == st["steps"] == st["replay_held"]

    # Every result was applied exactly once: each results entry was consumed once, each job at most once.
    results = client.xrange(store.key("results"))
    consumed = st["results_applied"] + st["failed"] + st["rejected"] + st["stale"]
    assert consumed == len(results), (consumed, len(results), st)
    assert st.get("last_result_id") == results[-1][0].decode()
    history = [h for _i, h in store.history()]
    assert len(history) == st["results_applied"]
    per_job = collections.Counter(h["job"] for h in history)
    assert max(per_job.values()) == 1
    assert {h["kind"] for h in history} == {"es", "rl"}
    versions = [h["version"] for h in history]
    assert versions == sorted(versions) and versions[-1] == st["version"]
    # Bounded: superseded distribution versions are deleted once no job uses them.
    dist_keys = list(client.scan_iter(match=store.key("dist:*")))
    assert len(dist_keys) <= 3, dist_keys

    # Plain status and --json show the finished run.
    out = _status(redis_url, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["status"] == "finished" and data["steps"] == st["steps"]
    assert data["rl_applied"] == st["rl_applied"]
