"""The Python API (aesrl_queue.train / load / Run) from plain Python scripts, on real processes:
a run to completion, a run interrupted with Ctrl-C (SIGINT) and resumed, a batch run stopped with SIGTERM,
a user-registered env, a run whose jobs all fail."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import child_env, default_sigint, descendants, wait_for

SMALL = "hidden=(16, 16), critic_hidden=(32, 32), initial_steps=400, workers=2"


def script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / f"{name}.py"
    path.write_text("import json, sys\nimport aesrl_queue as aq\n" + textwrap.dedent(body))
    return [sys.executable, str(path)]


def python(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), cwd=cwd, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def test_bad_config_fields_are_one_line_config_errors(tmp_path) -> None:
    from aesrl_queue import ConfigError, train

    for kwargs, field in (({"rl_ratoi": 0.3}, "rl_ratoi"), ({"rl_ratio": 2.0}, "rl_ratio"),
                          ({"workers": 0}, "workers"), ({"r_kinds": "es"}, "r_kinds"), ({"steps": -5}, "steps"),
                          ({"obs_dim": 3}, "obs_dim"), ({"total_steps": 500}, "total_steps")):
        with pytest.raises(ConfigError) as err:
            train("Pendulum-v1", out=tmp_path, progress=False, **kwargs)
        assert err.value.field == field and "\n" not in str(err.value), str(err.value)
        # the settings a user can pass, never what the run derives (obs_dim, created_at, ...)
        assert not any(name in str(err.value) for name in ("created_at", "shift_per_step", "act_dim")), str(err.value)
    with pytest.raises(ConfigError, match="did you mean 'rl_ratio'.*; the settings: activation, actor_lr, "):
        train("Pendulum-v1", out=tmp_path, rl_ratoi=0.3)
    with pytest.raises(ConfigError, match="total_steps: pass it as train\\(\\)'s steps= argument"):
        train("Pendulum-v1", out=tmp_path, total_steps=500)
    with pytest.raises(ConfigError, match="env_id"):
        train("no.such.module:Env", out=tmp_path)
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


@pytest.mark.slow
def test_train_to_completion_evaluate_and_a_user_registered_env(tmp_path) -> None:
    res = python(script(tmp_path, "full", f"""
        run = aq.train("Pendulum-v1", steps=1200, out="runs", run_id="full", {SMALL})
        m = run.metrics  # a DataFrame where pandas is installed, else a list of records
        records = m.to_dict("records") if hasattr(m, "to_dict") else m
        act = run.policy([1.0, 0.0, 0.0])
        ev = run.evaluate(episodes=2, seed=0)
        again = aq.load("runs/full").evaluate(episodes=2, seed=0)
        # an id registered by this script, its class in an importable module
        import gymnasium as gym
        gym.register(id="MyNull-v0", entry_point="aesrl_queue.envs:NullEnv", kwargs={{"episode_len": 40}})
        mine = aq.train("MyNull-v0", algo="es", steps=400, workers=1, hidden=(8, 8), out="runs", run_id="mine",
                        progress=False)
        print(json.dumps({{"folder": str(run.folder), "summary": run.summary, "algo": run.config.algo,
                          "rows": len(records), "types": sorted(set(r["type"] for r in records)), "act": [float(a) for a in act],
                          "ev": ev, "again": again, "mine": mine.summary, "mine_env": mine.config.env_id}}))
        """), tmp_path)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["summary"]["status"] == "finished" and out["summary"]["steps"] >= 1200, out["summary"]
    assert out["algo"] == "aesrl" and out["rows"] >= 6 and "update" in out["types"]
    assert len(out["act"]) == 1 and -2.0 <= out["act"][0] <= 2.0
    assert len(out["ev"]["returns"]) == 2 and out["ev"]["mean"] < 0 and out["ev"] == out["again"]
    assert "full: 100%" in res.stderr  # the tqdm bar reached the budget
    assert out["mine"]["status"] == "finished" and out["mine_env"] == "MyNull-v0", out["mine"]
    assert (tmp_path / "runs" / "mine" / "envs.json").exists()


@pytest.mark.slow
def test_ctrl_c_stops_train_and_load_resume_finishes_it(tmp_path) -> None:
    err_path = tmp_path / "train.err"
    cmd = script(tmp_path, "long", f"""
        try:
            aq.train("Pendulum-v1", steps=40_000, out="runs", run_id="cut", {SMALL})
        except KeyboardInterrupt:
            print("KeyboardInterrupt reached the caller")
            sys.exit(3)
        """)
    with open(err_path, "w") as err:
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=child_env(), cwd=tmp_path, text=True,
                                 preexec_fn=default_sigint)
        try:
            folder = tmp_path / "runs" / "cut"

            def stored():
                try:
                    return sum(1 for ln in (folder / "metrics.jsonl").read_text().splitlines()
                               if '"type": "update"' in ln) >= 4
                except OSError:
                    return False

            wait_for(stored, 300, interval=0.5, what="a few applied updates", on_fail=err_path.read_text)
            t0 = time.monotonic()
            child.send_signal(signal.SIGINT)
            stdout, _ = child.communicate(timeout=120)
            print(f"train() stopped {time.monotonic() - t0:.2f} s after SIGINT")
        finally:
            if child.poll() is None:
                child.kill()
    said = err_path.read_text()
    assert child.returncode == 3 and "KeyboardInterrupt reached the caller" in stdout, said[-3000:]
    assert "interrupted: stopping the children" in said and "load(" in said, said[-2000:]
    for at in (i for i in range(len(said)) if said.startswith("interrupted: ", i)):
        assert at == 0 or said[at - 1] == "\n", repr(said[max(0, at - 200):at + 40])  # not glued to the bar
    cut = json.loads((folder / "summary.json").read_text())
    assert cut["status"] == "stopped" and (folder / "policy.npz").exists(), cut
    budget = cut["steps"] + 600
    res = python(script(tmp_path, "resume", f"""
        run = aq.load("runs/cut")
        before = len(run.metrics)
        run = run.resume(steps={budget}, workers=2, progress=False)
        print(json.dumps({{"before": before, "after": len(run.metrics), "summary": run.summary,
                          "total": run.config.total_steps, "ev": run.evaluate(episodes=2)}}))
        """), tmp_path)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["summary"]["status"] == "finished" and out["summary"]["steps"] >= budget, out["summary"]
    assert out["total"] == budget and out["after"] > out["before"] > 0
    assert len(out["ev"]["returns"]) == 2


def _ignore_sigint() -> None:
    """In a child before exec: SIGINT ignored, as `nohup python script.py &` starts it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.slow
def test_sigterm_stops_a_nohup_train_and_writes_the_policy_and_summary(tmp_path) -> None:
    """A batch script (SIGINT ignored, as under `nohup ... &`) is stopped with `kill`: train() stops the
    children, writes policy.npz and summary.json, says how to resume, runs the caller's `finally` and
    exits with 143, as a process that SIGTERM ended."""
    err_path = tmp_path / "train.err"
    cmd = script(tmp_path, "batch", f"""
        try:
            aq.train("Pendulum-v1", steps=40_000, out="runs", run_id="term", {SMALL})
        except Exception as exc:
            print("train raised", type(exc).__name__)
        finally:
            print("the caller's finally ran", flush=True)
        """)
    folder = tmp_path / "runs" / "term"
    with open(err_path, "w") as err:
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=child_env(), cwd=tmp_path, text=True,
                                 preexec_fn=_ignore_sigint)
        try:
            def updates():
                try:
                    return sum('"type": "update"' in ln for ln in (folder / "metrics.jsonl").read_text().splitlines()) >= 4
                except OSError:
                    return False

            wait_for(updates, 300, interval=0.5, what="a few applied updates", on_fail=err_path.read_text)
            kids = descendants(child.pid)
            child.send_signal(signal.SIGTERM)
            stdout, _ = child.communicate(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
    said = err_path.read_text()
    assert child.returncode == 143, (child.returncode, said[-3000:])
    assert "the caller's finally ran" in stdout and "train raised" not in stdout, stdout
    assert "terminated (SIGTERM): stopping the children" in said, said[-2000:]
    assert "aesrl_queue.load('runs/term').resume() continues it" in said, said[-2000:]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["results_applied"] >= 4, summary
    with np.load(folder / "policy.npz") as npz:
        assert npz["mu"].size > 0 and int(npz["steps"]) == summary["steps"]
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in kids), 10, what="the children to be gone")


def test_train_stops_with_the_cause_when_every_job_fails(tmp_path) -> None:
    from tests.raising_env import MESSAGE

    res = python(script(tmp_path, "failing", """
        import aesrl_queue.local
        aesrl_queue.local.GIVE_UP_AFTER = 3.0  # the same path as the default 90 s, sooner
        try:
            aq.train("tests.raising_env:AesrlRaise-v0", algo="es", steps=100_000, workers=1, hidden=(8, 8),
                     out="runs", run_id="bad", progress=False)
        except aq.RunError as exc:
            print(json.dumps({"error": str(exc)}))
        """), tmp_path)
    error = json.loads(res.stdout.strip().splitlines()[-1])["error"]
    assert error.startswith(f"stopped: jobs fail: RuntimeError: {MESSAGE} at step 2"), error
    # the open breaker's time as measured: GIVE_UP_AFTER (3 s) at least, plus the poll that noticed it
    waited = re.search(r"no job succeeded in (\d+) s with the circuit breaker open", error)
    assert waited and 3 <= int(waited.group(1)) <= 10, error
    assert "aesrl_queue.load('runs/bad').resume()" in error, error
    folder = tmp_path / "runs" / "bad"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["failed"] >= 4 and summary["steps"] == 0, summary
    assert (folder / "policy.npz").exists() and "in step" in (folder / "logs" / "scheduler.log").read_text()
