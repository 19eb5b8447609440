"""What a user sees while a run goes: `status --watch` in a pseudo-terminal against a live launcher run,
the launcher's progress (plain lines off a terminal, a bar on one), and what SIGTERM leaves behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time

import pexpect
import pytest

from aesrl_queue.store import Store, live_workers
from tests.conftest import ROOT, child_env, default_sigint, wait_for

pytestmark = pytest.mark.slow

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")


def screen_text(raw: str) -> str:
    return ANSI.sub("", raw)


def read_until(child: pexpect.spawn, done, limit: float) -> str:
    """What the child writes until `done(text without escapes)` holds, it exits, or `limit` seconds pass."""
    out, deadline = [], time.monotonic() + limit
    while time.monotonic() < deadline and not done(screen_text("".join(out))):
        try:
            out.append(child.read_nonblocking(65536, timeout=0.5))
        except pexpect.TIMEOUT:
            continue
        except pexpect.EOF:
            break
    return "".join(out)


def watch_numbers(text: str) -> tuple[list[int], list[int]]:
    """The step counts and versions of every screen in `text`, in order."""
    steps = [int(a.replace(",", "")) for a, _ in re.findall(r"steps\s+([\d,]+) / ([\d,]+)", text)]
    versions = [int(v.replace(",", "")) for v in re.findall(r"version ([\d,]+)", text)]
    return steps, versions


def numbers_moved(text: str) -> bool:
    steps, versions = watch_numbers(text)
    return len(steps) >= 4 and steps[-1] > steps[0] and len(versions) >= 2 and versions[-1] > versions[0]


def tb_scalars(log_dir) -> dict[str, list]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}


def test_watch_shows_moving_numbers_and_sigterm_to_the_launcher_writes_the_run_folder(redis_url, client, procs,
                                                                                       tmp_path):
    run = "watch-run"
    out_dir, tb_dir = tmp_path / "runs", tmp_path / "tb"
    launcher = procs.cli("launcher", "run", "--redis-url", redis_url, "--env", "Pendulum-v1", "--algo", "es",
                         "--steps", "1000000", "--workers", "1", "--hidden", "8,8", "--run-id", run,
                         "--out", str(out_dir), "--tensorboard", str(tb_dir))
    store = Store(client, run)
    wait_for(lambda: store.exists() and store.state()["results_applied"] >= 3, 120, what="first updates",
             on_fail=procs.logs)

    child = pexpect.spawn(sys.executable, ["-m", "cli.main", "status", "--redis-url", redis_url, "--run", run, "--watch"],
                          cwd=str(ROOT), env=dict(child_env(), TERM="xterm-256color", COLUMNS="140", LINES="45"),
                          dimensions=(45, 140), encoding="utf-8", codec_errors="replace", timeout=30,
                          preexec_fn=default_sigint)
    try:
        # The screen redraws with the run's numbers moving; a generous limit for a loaded machine.
        text = screen_text(read_until(child, numbers_moved, 120))
        steps, versions = watch_numbers(text)
        assert len(steps) >= 4, text[-3000:]
        assert steps[-1] > steps[0] and versions[-1] > versions[0], (steps, versions)
        assert "1,000,000" in text and "es on Pendulum-v1" in text and "running" in text
        assert re.search(r"f\(μ\)\s+-\d+\.\d", text), text[-3000:]
        assert "live workers 1" in text and "workers (1 live)" in text
        # The per-worker table: this host, the worker's pid, its current job kind, jobs done, last seen.
        (worker,) = live_workers(client).values()
        row = [ln for ln in text.splitlines() if worker["pid"] in ln and socket.gethostname() in ln]
        assert row and re.search(r"(es|idle)\s+[\d,]+\s+\d+\.\ds ago", row[-1]), row[-3:]
        child.sendintr()
        child.expect(pexpect.EOF, timeout=15)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    assert "Traceback" not in (child.before or "")

    # SIGTERM to the launcher: children stop, the run folder is written as on Ctrl-C.
    applied_before = store.state()["results_applied"]
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(90) == 128 + signal.SIGTERM, procs.log("launcher")
    log = procs.log("launcher")
    assert "terminated (SIGTERM): stopping the children" in log, log
    assert re.search(r"f\(μ\)~ (-?[\d.]+|-)\s+[\d,]+/1,000,000 \(\d+%\)", log), log  # plain progress lines
    wait_for(lambda: not live_workers(client), 20, what="workers to stop")
    assert store.status() == "stopped"
    run_dir = out_dir / run
    for name in ("config.json", "metrics.jsonl", "policy.npz", "summary.json"):
        assert (run_dir / name).is_file(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["results_applied"] >= applied_before
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in recs if r["type"] == "update"]
    evals = [r for r in recs if r["type"] == "mu_eval"]
    # One record per applied update, none lost or doubled; each carries the documented fields.
    assert len(updates) == store.state()["results_applied"] == summary["results_applied"]
    assert [r["version"] for r in updates] == sorted(r["version"] for r in updates)
    assert {"t", "steps", "interactions", "version", "kind", "p", "f_z", "f_mu", "sigma_mean", "sigma_min",
            "sigma_max"} <= set(updates[-1])
    assert len(evals) >= len(updates) - 2 and all(isinstance(r["f_mu"], float) for r in evals)
    # TensorBoard scalars under namespaced names, one f(μ) point per update that had one.
    scalars = tb_scalars(tb_dir / run)
    for tag in ("charts/f_mu", "charts/f_mu_eval", "population/sigma_mean", "population/rl_share",
                "population/p_es", "charts/best_fitness"):
        assert tag in scalars, sorted(scalars)
    assert len(scalars["charts/f_mu"]) == sum(1 for r in updates if r["f_mu"] is not None)
    assert [e.step for e in scalars["charts/f_mu"]] == [r["steps"] for r in updates if r["f_mu"] is not None]


def test_run_on_a_terminal_shows_a_progress_bar_and_writes_critic_metrics(redis_url, client, tmp_path):
    run = "bar-run"
    child = pexpect.spawn(sys.executable, ["-m", "cli.main", "run", "--redis-url", redis_url, "--env", "Pendulum-v1",
                                           "--steps", "2400", "--initial-steps", "600", "--workers", "1",
                                           "--hidden", "8,8", "--critic-hidden", "32,32", "--run-id", run,
                                           "--out", str(tmp_path / "runs"), "--tensorboard", str(tmp_path / "tb")],
                          cwd=str(ROOT), env=dict(child_env(), TERM="xterm-256color"), dimensions=(30, 200),
                          encoding="utf-8", codec_errors="replace", timeout=400)
    try:
        child.expect(pexpect.EOF, timeout=400)
    finally:
        child.close(force=True)
    text = screen_text(child.before)
    assert child.exitstatus == 0, text[-3000:]
    # The line: f(μ)~ first (a number, or "-" before the first antithetic pair reports one: in 2 400 steps
    # at ρ* 0.9 there may be none), stored steps against the budget, a bar, steps/s and ETA, redrawn in place.
    assert "━" in text and re.search(r"f\(μ\)~ (-?[\d.]+|-)\s+[\d,]+/2,400 \(\d+%\)\s+[━╌]+\s+[\d,]+ steps/s\s+ETA",
                                     text), text[-3000:]
    assert "run folder" in text and "finished" in text
    assert os.path.isfile(tmp_path / "runs" / run / "metrics.jsonl")
    recs = [json.loads(x) for x in (tmp_path / "runs" / run / "metrics.jsonl").read_text().splitlines()]
    critic = [r for r in recs if r["type"] == "critic"]
    assert critic and critic[-1]["critic_version"] == store_state(client, run)["critic_version"]
    assert {r["kind"] for r in recs if r["type"] == "update"} == {"es", "rl"}
    scalars = tb_scalars(tmp_path / "tb" / run)
    assert "critic/loss" in scalars and "population/p_rl" in scalars and "charts/f_z_rl" in scalars
    assert len(scalars["critic/loss"]) == len(critic)


def store_state(client, run):
    return Store(client, run).state()


def test_scheduler_start_out_writes_the_run_folder_as_it_goes(redis_url, client, procs, tmp_path):
    run = "sched-out"
    procs.rq_worker("worker", redis_url)
    sched = procs.cli("scheduler", "scheduler", "start", "--redis-url", redis_url, "--env", "Pendulum-v1",
                      "--algo", "es", "--steps", "3000", "--hidden", "8,8", "--run-id", run,
                      "--out", str(tmp_path / "runs"))
    assert sched.wait(180) == 0, procs.logs()
    run_dir = tmp_path / "runs" / run
    st = Store(client, run).state()
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["type"] == "update" for r in recs) == st["results_applied"] > 0
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"
    assert (run_dir / "policy.npz").is_file() and (run_dir / "config.json").is_file()
    assert f"run folder {run_dir}" in procs.log("scheduler")


def test_a_run_that_applied_nothing_for_a_while_shows_stalled_not_a_stale_rate(client):
    from aesrl_queue.config import RunConfig
    from cli.report import gather, render_line
    from cli.watch import render_screen

    cfg = RunConfig.from_preset("AesrlNull-v0", run_id="quiet", total_steps=10_000).resolve()
    store = Store(client, "quiet")
    store.write_config(cfg)
    t = time.time()
    for i in range(20):  # 100 steps a second, then nothing for a minute
        store.append_history({"t": t - 80 + i, "len": 100, "kind": "es", "p": 0.5, "f_mu": -1.0, "version": i})
    store.set_state(status="running", started_at=t - 90, steps=2000)
    s = gather(client, "quiet")
    assert s["stalled_s"] is not None and s["stalled_s"] >= 60, s["stalled_s"]
    line = render_line(s)
    assert "stalled 6" in line and "steps/s" not in line, line
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(render_screen(s))
    screen = console.export_text()
    assert "stalled 6" in screen and "ETA" not in screen, screen
    store.append_history({"t": time.time(), "len": 100, "kind": "es", "p": 0.5, "f_mu": -1.0, "version": 21})
    moving = gather(client, "quiet")
    assert moving["stalled_s"] is None and "steps/s" in render_line(moving)
