"""The command line as a user meets it: help texts, bad input refused with exit 2 naming the field,
and nothing written to Redis when a config is refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, child_env


def aq(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True,
                          env=child_env(), cwd=ROOT, timeout=timeout)


def test_help_lists_every_command_and_defaults():
    out = aq("--help")
    assert out.returncode == 0
    for cmd in ("run", "scheduler", "critic", "worker", "status", "runs"):
        assert cmd in out.stdout
    sched = aq("scheduler", "start", "--help")
    assert sched.returncode == 0
    assert "--redis-url" in sched.stdout and "AESRL_REDIS_URL" in sched.stdout
    assert "--mean-rule" in sched.stdout and "baseline-relative" in sched.stdout


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--env", "NoSuchEnv-v9"], "env_id"),
        (["--env", "Pendulum-v1", "--r", "-3"], "r"),
        (["--env", "Pendulum-v1", "--r", "lots"], "r"),
        (["--env", "Pendulum-v1", "--rl-ratio", "1.5"], "rl_ratio"),
        (["--env", "Pendulum-v1", "--hidden", "64,zero"], "hidden"),
        (["--env", "Pendulum-v1", "--steps", "0"], "total_steps"),
        (["--env", "Pendulum-v1", "--run-id", "bad:id"], "run_id"),
        ([], "env_id"),
    ],
)
def test_scheduler_start_refuses_bad_config_before_enqueuing(redis_url, client, args, field):
    out = aq("scheduler", "start", "--redis-url", redis_url, *args)
    assert out.returncode == 2, out.stderr
    assert f"error: {field}:" in out.stderr, out.stderr
    # Nothing was created: no run, no job.
    assert client.dbsize() == 0, list(client.scan_iter())


def test_unknown_choice_is_a_usage_error(redis_url):
    out = aq("scheduler", "start", "--redis-url", redis_url, "--env", "Pendulum-v1", "--algo", "ppo")
    assert out.returncode == 2
    assert "ppo" in out.stderr and "aesrl" in out.stderr


def test_unreachable_redis_says_what_to_do():
    out = aq("status", "--redis-url", "redis://127.0.0.1:1/0")
    assert out.returncode == 2
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in out.stderr
    assert "--redis-url" in out.stderr


def test_status_and_runs_on_an_empty_redis(redis_url):
    out = aq("status", "--redis-url", redis_url)
    assert out.returncode == 1 and "no runs" in out.stderr
    out = aq("runs", "--redis-url", redis_url)
    assert out.returncode == 0 and "no runs" in out.stdout


def test_resume_of_a_missing_run_is_refused(redis_url):
    out = aq("scheduler", "start", "--redis-url", redis_url, "--run", "nope")
    assert out.returncode == 2 and "no run 'nope'" in out.stderr
