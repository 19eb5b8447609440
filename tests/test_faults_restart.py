"""The scheduler and the critic daemon killed with real signals and started again on the same run:
both continue from what Redis holds, and every result is applied exactly once across the restarts.
"""

from __future__ import annotations

import re
import signal

import pytest

from aesrl_queue.store import Store
from tests.conftest import wait_for
from tests.faults import check_exactly_once, sleep_config, wait_pid_exit

pytestmark = pytest.mark.slow

RUN = "faults-restart"


def test_scheduler_and_critic_killed_and_restarted(tmp_path, redis_url, client, procs):
    cfg = sleep_config(tmp_path / "run.json", mean_s=0.3, total_steps=5600, initial_steps=300)
    for i in range(3):
        procs.rq_worker(f"w{i}", redis_url)
    sched = ["scheduler", "start", "--redis-url", redis_url]
    procs.cli("scheduler-1", *sched, "--config", str(cfg), "--run-id", RUN)
    procs.cli("critic-1", "critic", "start", "--redis-url", redis_url, "--run", RUN)
    store = Store(client, RUN)
    wait_for(store.exists, 60, what="the run", on_fail=procs.logs)

    # -- scheduler: kill -9 while jobs are in flight, then resume with --run ------------------------
    wait_for(lambda: store.state()["results_applied"] >= 8 and client.hlen(store.key("inflight")) >= 3, 90,
             what="results and jobs in flight", on_fail=procs.logs)
    p = procs.procs["scheduler-1"]
    p.send_signal(signal.SIGKILL)
    assert wait_pid_exit(p.pid)
    at_kill = store.state()
    inflight_at_kill = set(store.inflight())
    assert inflight_at_kill
    # Workers go on: their results wait in the stream for the next scheduler.
    wait_for(lambda: client.xlen(store.key("results")) > at_kill["results_applied"] + at_kill["failed"]
             + at_kill["rejected"] + at_kill["stale"], 120, what="results written while no scheduler runs",
             on_fail=procs.logs)
    procs.cli("scheduler-2", *sched, "--run", RUN)
    wait_for(lambda: store.state()["results_applied"] > at_kill["results_applied"] + 3, 60,
             what="the restarted scheduler to apply results", on_fail=procs.logs)
    log2 = procs.log("scheduler-2")
    assert f"resumed at version {at_kill['version']}," in log2, log2

    # -- a graceful stop (SIGTERM) and a second resume ----------------------------------------------
    p = procs.procs["scheduler-2"]
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0, procs.log("scheduler-2")
    assert store.status() == "stopped"
    at_stop = store.state()
    procs.cli("scheduler-3", *sched, "--run", RUN)

    # -- critic: wait for a checkpoint, kill -9, RL jobs go on with the last weights, restart -----------
    wait_for(lambda: client.exists(store.key("critic:ckpt")) and store.state()["rl_applied"] >= 2, 90,
             what="a critic checkpoint and RL results", on_fail=procs.logs)
    c = procs.procs["critic-1"]
    c.send_signal(signal.SIGKILL)
    assert wait_pid_exit(c.pid)
    critic_at_kill = store.critic_version()
    rl_at_kill = store.state()["rl_applied"]
    steps_at_kill = store.state()["steps"]
    wait_for(lambda: store.state()["rl_applied"] >= rl_at_kill + 2, 60,
             what="RL jobs applied while the critic daemon is down", on_fail=procs.logs)
    assert store.critic_version() == critic_at_kill  # nobody published meanwhile: the last critic served
    procs.cli("critic-2", "critic", "start", "--redis-url", redis_url, "--run", RUN)
    wait_for(lambda: store.critic_version() > critic_at_kill, 60, what="the restarted critic to publish",
             on_fail=procs.logs)
    steps_at_critic_back = store.state()["steps"]
    clog = procs.log("critic-2")
    restored = re.search(r"restored: version (\d+), (\d+) steps trained", clog)
    assert restored, clog
    assert 0 < int(restored.group(1)) <= critic_at_kill
    mirrored = re.search(r"on cpu: (\d+) transitions mirrored", clog)
    assert mirrored and int(mirrored.group(1)) >= steps_at_kill, clog

    # -- the run finishes; every result applied exactly once across three schedulers --------------------
    wait_for(lambda: store.status() == "finished", 240, interval=0.5, what="the run to finish", on_fail=procs.logs)
    assert procs.procs["scheduler-3"].wait(30) == 0, procs.log("scheduler-3")
    out = check_exactly_once(client, store)
    st, history = out["state"], out["history"]
    assert st["steps"] >= 2800
    assert f"resumed at version {at_stop['version']}," in procs.log("scheduler-3")
    # Counters carried over: nothing counted from zero again.
    assert st["dispatched"] > at_stop["dispatched"] > at_kill["dispatched"]
    # Jobs in flight when the scheduler died were adopted: their results applied by its successor.
    applied = {h["job"] for h in history}
    adopted = inflight_at_kill & applied
    assert adopted, (inflight_at_kill, sorted(applied)[-10:])
    # Job ids never repeat across incarnations (numbering continues from `dispatched`).
    numbers = sorted(int(j.rsplit("-j", 1)[1]) for j in applied)
    assert len(numbers) == len(set(numbers)) and numbers[-1] <= st["dispatched"]
    assert st["critic_version"] > critic_at_kill
    print(f"\nrestart: {len(adopted)}/{len(inflight_at_kill)} in-flight jobs adopted after kill -9; "
          f"versions {at_kill['version']} -> {at_stop['version']} -> {st['version']}; "
          f"critic {critic_at_kill} -> {st['critic_version']}; replaced={st['replaced']} stale={st['stale']}; "
          f"steps when the critic was back {steps_at_critic_back}")
