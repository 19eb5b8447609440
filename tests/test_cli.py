"""The command line as a user meets it: help texts, bad input refused with exit 2 naming the field,
and nothing written to Redis when a config is refused."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

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
    assert out.returncode == 2 and f"no runs on {redis_url}" in out.stderr, out.stderr
    out = aq("runs", "--redis-url", redis_url)
    assert out.returncode == 0 and "no runs" in out.stdout


def test_resume_of_a_missing_run_is_refused(redis_url):
    out = aq("scheduler", "start", "--redis-url", redis_url, "--run", "nope")
    assert out.returncode == 2 and "no run 'nope'" in out.stderr


def test_help_shows_the_preset_values():
    out = aq("run", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())  # click wraps the help
    assert "(preset default)" not in text
    assert "1,000,000 for MuJoCo, 40,000 for Pendulum-v1" in text  # --steps
    assert "10,000 for MuJoCo, 2,000 for Pendulum-v1" in text  # --initial-steps
    assert "400,300 for MuJoCo" in text and "64,64 for Pendulum-v1" in text  # --hidden


def test_env_typo_hint_lists_no_test_environments(redis_url):
    out = aq("scheduler", "start", "--redis-url", redis_url, "--env", "Pendulm-v1")
    assert out.returncode == 2 and "error: env_id:" in out.stderr and "Pendulum" in out.stderr, out.stderr
    assert "Aesrl" not in out.stderr, out.stderr


def test_status_without_a_url_names_the_redis_it_tried(redis_url):
    env = child_env()
    env["AESRL_REDIS_URL"] = redis_url  # what "no --redis-url" reads first
    out = subprocess.run([sys.executable, "-m", "cli.main", "status"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 2 and f"no runs on {redis_url}" in out.stderr, out.stderr
    env["AESRL_REDIS_URL"] = "redis://127.0.0.1:1/0"
    out = subprocess.run([sys.executable, "-m", "cli.main", "status"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "redis://127.0.0.1:1/0" in out.stderr, out.stderr


def test_a_fresh_run_starts_and_writes_its_outputs_under_runs(tmp_path):
    # A short ES run (no critic) on the project's no-cost environment, from a scratch working folder.
    res = subprocess.run([sys.executable, "-m", "cli.main", "run", "--env", "AesrlNull-v0", "--algo", "es",
                          "--steps", "1000", "--workers", "1", "--run-id", "fresh"], capture_output=True, text=True,
                         env=child_env(), cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    run_dir = tmp_path / "runs" / "fresh"
    log = (run_dir / "logs" / "scheduler.log").read_text()
    assert "starting run fresh" in log and "resuming" not in log, log[:2000]
    # export and plot with no output named write into the run folder, not the working folder.
    for args in (["export", "runs/fresh"], ["plot", "runs/fresh"]):
        out = subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True,
                             env=child_env(), cwd=tmp_path, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
    assert (run_dir / "policy.pt").is_file() and (run_dir / "curves.png").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    assert json.loads((run_dir / "config.json").read_text())["run_id"] == "fresh"
    assert Path(run_dir / "summary.json").is_file()


def _settings(cfg) -> dict:
    out = cfg.to_dict()
    for name in ("run_id", "created_at", "spec_hash"):
        out.pop(name)
    return out


@pytest.mark.parametrize("algo", ["aesrl", "es"])
def test_config_show_round_trips_through_run_config(tmp_path, algo):
    from aesrl_queue.config import RunConfig, field_docs

    shown = aq("config", "show", "--env", "Pendulum-v1", "--algo", algo)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    for name, _default, help_text, departure in field_docs():
        at = next(i for i, ln in enumerate(lines) if ln.startswith(f"{name} = "))
        assert lines[at - 1].startswith(f"# {help_text}"), (name, lines[at - 1])
        assert ("departure from the paper" in lines[at - 1]) == departure, (name, lines[at - 1])
    path = tmp_path / "c.toml"
    path.write_text(shown.stdout)
    # what `run --config FILE` builds is the config `run --env Pendulum-v1 --algo A` builds
    again = RunConfig.from_file(path).resolve()
    assert _settings(again) == _settings(RunConfig.from_preset("Pendulum-v1", algo=algo).resolve())
    assert again.run_id != ""  # a fresh id per run: the file leaves it empty
    # a file given to `config show` comes back with its settings (and its run id) applied
    edited = tmp_path / "e.toml"
    text = re.sub(r"(?m)^rl_ratio = .*$", "rl_ratio = 0.3", shown.stdout)
    edited.write_text(text.replace('run_id = ""', 'run_id = "mine"'))
    shown2 = aq("config", "show", "--config", str(edited))
    assert shown2.returncode == 0, shown2.stderr
    assert "rl_ratio = 0.3" in shown2.stdout and 'run_id = "mine"' in shown2.stdout


def test_the_example_config_is_what_config_show_prints():
    shown = aq("config", "show", "--env", "Pendulum-v1")
    assert shown.returncode == 0, shown.stderr
    assert (ROOT / "examples" / "config.toml").read_text() == shown.stdout


def test_run_help_explains_the_progress_line():
    out = aq("run", "--help")
    assert out.returncode == 0
    for field in ("f(μ)~", "mean of the last 10 estimates", "since the random phase ended", "ETA", "training RL individuals",
                  "waiting for critic", "random actions", "critic vN", "version of the critic"):
        assert field in out.stdout, field


def test_run_on_an_unreachable_redis_url_says_so_in_one_line_about_its_own_option(tmp_path):
    """`run` does not read $AESRL_REDIS_URL, so its error names --redis-url alone; no log line before it."""
    env = child_env()
    env["AESRL_REDIS_URL"] = "redis://127.0.0.1:2/0"  # a shell set up for a cluster: `run` ignores it
    out = subprocess.run([sys.executable, "-m", "cli.main", "run", "--env", "Pendulum-v1", "--redis-url",
                          "redis://127.0.0.1:1/0"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach Redis at redis://127.0.0.1:1/0"), lines
    assert "--redis-url" in lines[0] and "AESRL_REDIS_URL" not in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()


def test_critic_start_names_a_missing_run_and_the_runs_there_at_once(redis_url, client, tmp_path):
    """A --run typo: the critic says at once what it waits for and which runs the Redis holds, then
    fails at the end of --wait naming them again."""
    import select
    import time

    from aesrl_queue.config import RunConfig
    from aesrl_queue.store import Store

    assert Store(client, "cheetah-1").write_config(RunConfig.from_preset("Pendulum-v1", run_id="cheetah-1").resolve())
    child = subprocess.Popen([sys.executable, "-m", "cli.main", "critic", "start", "--redis-url", redis_url,
                              "--run", "cheetah-l", "--wait", "60"], stderr=subprocess.PIPE, text=True,
                             env=child_env(), cwd=tmp_path)
    try:
        t0 = time.monotonic()
        ready, _, _ = select.select([child.stderr], [], [], 45)
        assert ready, "the critic printed nothing"
        first = child.stderr.readline()
        assert child.poll() is None, f"it had already given up after {time.monotonic() - t0:.0f} s: {first}"
        assert "waiting up to 60 s for run 'cheetah-l'" in first and "did you mean 'cheetah-1'?" in first, first
    finally:
        child.kill()
        child.wait()
    out = aq("critic", "start", "--redis-url", redis_url, "--run", "cheetah-l", "--wait", "0")
    assert out.returncode == 2, out.stderr
    assert f"error: run: no run 'cheetah-l' on {redis_url} after 0 s (runs there: cheetah-1" in out.stderr, out.stderr


def test_runs_lists_the_runs_of_several_primaries_and_names_one_that_does_not_answer(tmp_path):
    """A lab with more cores than one primary carries runs several: `runs` shows them in one table,
    each with its primary, from repeated --redis-url or the variable's space-separated list."""
    import time

    from aesrl_queue.config import RunConfig
    from aesrl_queue.connection import connect
    from aesrl_queue.redis_server import RedisServer
    from aesrl_queue.store import Store

    servers = [RedisServer(directory=tmp_path / f"r{i}").start() for i in range(2)]
    try:
        for server, run_id in zip(servers, ("lab-a", "lab-b"), strict=True):
            assert Store(connect(server.url), run_id).write_config(
                RunConfig(env_id="Pendulum-v1", run_id=run_id, created_at=time.time()))
        urls = [s.url for s in servers]
        out = aq("runs", "--redis-url", urls[0], "--redis-url", urls[1])
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0].split()[:2] == ["primary", "run"]
        assert [line.split()[:3] for line in lines[1:]] == [[urls[0], "lab-a", "created"], [urls[1], "lab-b", "created"]]
        env = dict(child_env(), AESRL_REDIS_URL=" ".join(urls))
        by_env = subprocess.run([sys.executable, "-m", "cli.main", "runs"], capture_output=True, text=True, env=env,
                                cwd=ROOT, timeout=120)
        assert by_env.returncode == 0 and by_env.stdout == out.stdout
        # one primary down: the others are listed, the dead one is one problem line, and the exit is 1
        dead = "redis://127.0.0.1:1/0"
        out = aq("runs", "--redis-url", urls[0], "--redis-url", dead, "--redis-url", urls[1])
        assert out.returncode == 1 and len(out.stdout.splitlines()) == 3
        problems = out.stderr.strip().splitlines()
        assert len(problems) == 1 and problems[0].startswith(f"problem: cannot reach Redis at {dead}"), out.stderr
    finally:
        for server in servers:
            server.cleanup()
