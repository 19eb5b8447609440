"""The run's problem line (scheduler/problems.py): a forgotten critic daemon and jobs that fail inside
the worker reach `status` with what to do, on real scheduler, worker and critic processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from aesrl_queue.connection import client_url, connect
from aesrl_queue.store import Store
from scheduler.breaker import FailureBreaker, failure_cause
from scheduler.critic_gate import NO_CRITIC_WAITING
from tests.conftest import ROOT, child_env, wait_for
from tests.faults import write_config
from tests.raising_env import MESSAGE


def aq(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True,
                          env=child_env(), cwd=ROOT, timeout=180)


def test_client_url_names_the_server_and_hides_the_password():
    assert client_url(connect("redis://127.0.0.1:6390/2", check=False)) == "redis://127.0.0.1:6390/2"
    assert client_url(connect("redis://:s3cret@db.lab:6379/0", check=False)) == "redis://:***@db.lab:6379/0"
    assert client_url(connect("rediss://u:pw@db.lab:6380/1", check=False)) == "rediss://u:***@db.lab:6380/1"


def test_failure_cause_keeps_the_last_line_and_says_what_to_do():
    key, cause, hint = failure_cause("RuntimeError: boom\nTraceback (most recent call last):\n  File x\n"
                                     "RuntimeError: boom at step 17")
    assert key == "RuntimeError: boom at step #"
    assert cause.startswith("jobs fail with RuntimeError: boom at step 17: the traceback is in")
    assert hint == "jobs fail: RuntimeError: boom at step 17 (traceback in the logs)"
    _, cause, hint = failure_cause("ModuleNotFoundError: No module named 'mylab'")
    assert "install it where they run" in cause and hint.endswith("(install it on the workers)")
    _, cause, _ = failure_cause("rq.serializers.DeserializationError: ...")
    assert "-w workers.AesrlWorker" in cause


def test_failing_jobs_come_before_the_critic_and_each_kind_clears_its_own(client):
    store = Store(client, "pl")
    store.set_state(problem="left by an earlier scheduler", problem_hint="old", breaker="open after 4 failures")
    breaker = FailureBreaker(store)
    breaker.line.critic(None)  # the loop's first pass: the stale line and circuit breaker go
    assert store.state().get("problem") == "" and store.state().get("breaker") == ""
    breaker.line.critic((NO_CRITIC_WAITING, 120.0))
    assert store.state()["problem"].endswith(f"start one: aesrl-queue critic start --run pl --redis-url "
                                             f"{client_url(client)}")
    breaker.failure("RuntimeError: torch is missing", kind="rl")
    assert store.state()["problem"].startswith("jobs fail with RuntimeError: torch is missing")
    breaker.success("es")  # ES jobs that work say nothing about the failing RL jobs
    assert store.state()["problem"].startswith("jobs fail with RuntimeError")
    breaker.success("rl")
    assert store.state()["problem"].startswith("no critic has published weights")
    assert store.state()["problem_hint"].startswith("no critic: aesrl-queue critic start --run pl")
    breaker.line.critic(None)
    assert store.state()["problem"] == "" and store.state()["problem_hint"] == ""


def _status(redis_url: str, run: str) -> str:
    out = aq("status", "--redis-url", redis_url, "--run", run)
    return out.stdout


@pytest.mark.slow
def test_a_forgotten_critic_is_named_in_status_and_starting_one_clears_it(tmp_path, redis_url, client, procs):
    run = "nocritic"
    cfg = write_config(tmp_path / "c.json", "AesrlNull-v0", hidden=[8, 8], critic_hidden=[16, 16], batch_size=32,
                       critic_chunk=100, initial_steps=200, critic_wait=20.0, total_steps=10_000_000,
                       mean_eval_episodes=1, run_id=run)
    procs.cli("scheduler", "scheduler", "start", "--redis-url", redis_url, "--config", str(cfg))
    procs.rq_worker("worker", redis_url)
    store = Store(client, run)
    wait_for(store.exists, 60, what="the run", on_fail=procs.logs)
    # Read straight from Redis as it is written: the first line seen is the one of the wait itself,
    # which the scheduler replaces once critic_wait is over (it shows within critic_wait).
    first = wait_for(lambda: store.state().get("problem"), 180, interval=0.1, what="the problem line",
                     on_fail=procs.logs)
    assert "RL jobs are held for critic_wait (20 s)" in first, first
    command = f"aesrl-queue critic start --run {run} --redis-url {client_url(client)}"
    assert first.endswith(f"start one: {command}")
    assert store.state()["problem_hint"] == f"no critic: {command}"
    shown = wait_for(lambda: command in (out := _status(redis_url, run)) and out, 60, interval=1.0,
                     what="the command in status", on_fail=procs.logs)
    assert "problem: no critic has published weights" in shown
    procs.cli("critic", *command.split()[1:])
    wait_for(lambda: store.state().get("critic_version", 0) > 0, 300, what="the critic's first weights",
             on_fail=procs.logs)
    wait_for(lambda: store.state().get("problem") == "", 60, what="the problem line to clear", on_fail=procs.logs)
    out = _status(redis_url, run)
    assert "critic version" in out and "problem" not in out, out


@pytest.mark.slow
def test_an_exception_in_the_job_function_reaches_status_with_what_to_do(tmp_path, redis_url, client, procs):
    run = "raising"
    cfg = write_config(tmp_path / "c.json", "tests.raising_env:AesrlRaise-v0", algo="es", hidden=[8, 8],
                       total_steps=100_000, run_id=run)
    procs.cli("scheduler", "scheduler", "start", "--redis-url", redis_url, "--config", str(cfg))
    procs.rq_worker("worker", redis_url)
    store = Store(client, run)
    wait_for(store.exists, 60, what="the run", on_fail=procs.logs)
    t0 = time.monotonic()
    shown = wait_for(lambda: MESSAGE in (out := _status(redis_url, run)) and out, 120, interval=1.0,
                     what="the exception in status", on_fail=procs.logs)
    print(f"the cause reached status {time.monotonic() - t0:.1f}s after the run appeared")
    line = next(ln for ln in shown.splitlines() if "problem:" in ln)
    assert f"RuntimeError: {MESSAGE} at step 2" in line and "restart the workers" in line, line
    st = json.loads(aq("status", "--redis-url", redis_url, "--run", run, "--json").stdout)
    assert st["problem_hint"] == f"jobs fail: RuntimeError: {MESSAGE} at step 2 (traceback in the logs)"
    # The scheduler's log holds the traceback of the first failure, down to the env's step.
    wait_for(lambda: "in step" in procs.log("scheduler"), 30, what="the traceback in the scheduler's log",
             on_fail=procs.logs)
    wait_for(lambda: store.state().get("breaker"), 60, what="the circuit breaker", on_fail=procs.logs)


@pytest.mark.parametrize("algo, rl, es, critic, warned", [
    ("aesrl", 0, 30, 0, "RL share 0.00 against a target of 0.90: no critic trained (start `aesrl-queue critic "
                        "start --run sum --redis-url "),
    ("aesrl", 3, 27, 4, "RL share 0.10 against a target of 0.90: RL jobs were held, none failed"),
    ("aesrl", 26, 4, 4, None),  # near its target
    ("aesrl", 0, 19, 0, None),  # too few results to judge
    ("es", 0, 30, 0, None),  # no RL wanted
])
def test_the_summary_says_when_the_rl_share_ended_far_from_its_target(client, algo, rl, es, critic, warned):
    from aesrl_queue.config import RunConfig
    from aesrl_queue.local import summary_numbers

    store = Store(client, "sum")
    store.write_config(RunConfig.from_preset("AesrlNull-v0", algo=algo, run_id="sum").resolve())
    store.set_state(status="finished", started_at=time.time() - 5, rl_applied=rl, es_applied=es,
                    results_applied=rl + es, critic_version=critic)
    summary = summary_numbers(client, "sum")
    assert summary["rl_share"] == round(rl / (rl + es), 3)
    if warned is None:
        assert summary["warnings"] == []
    else:
        assert len(summary["warnings"]) == 1 and summary["warnings"][0].startswith(warned), summary["warnings"]
        assert client_url(client) in summary["warnings"][0] or critic
