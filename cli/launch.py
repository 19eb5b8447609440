"""`aesrl-queue run`: the whole system on one machine as child processes, with progress on screen.

Starts an embedded Redis unless a URL is given, then the scheduler, the critic daemon and N
workers; at the end or on Ctrl-C it stops every child it started and writes the run folder.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import numpy as np

from aesrl_queue.config import RunConfig
from aesrl_queue.connection import connect, redact
from aesrl_queue.redis_server import RedisServer
from aesrl_queue.store import Store
from cli.main import worker_command
from cli.report import summary_numbers

log = logging.getLogger(__name__)


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


class Children:
    """The processes `run` started; stopped in reverse order (workers, critic, scheduler)."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = env
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        out = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the child
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def stop(self, names_first: tuple[str, ...] = ("worker",), grace: float = 15.0) -> None:
        order = sorted(self.procs, key=lambda np_: 0 if np_[0].startswith(names_first) else 1)
        for _name, p in order:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name, p in order:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) did not stop in %.0fs; killing it", name, p.pid, grace)
                p.kill()
                p.wait(5)


def _progress_line(st: dict, cfg: RunConfig, t0: float, steps0: int) -> str:
    steps = st["steps"]
    frac = min(1.0, steps / cfg.total_steps) if cfg.total_steps else 0.0
    bar = "#" * int(frac * 30) + "." * (30 - int(frac * 30))
    elapsed = time.monotonic() - t0
    rate = (steps - steps0) / elapsed if elapsed > 1 else 0.0
    eta = (cfg.total_steps - steps) / rate if rate > 0 else math.inf
    f_mu = st.get("f_mu", math.nan)
    eta_s = f"{int(eta // 60)}m{int(eta % 60):02d}s" if math.isfinite(eta) else "?"
    return (f"[{bar}] {steps:,}/{cfg.total_steps:,} steps  f(μ) {f_mu:9.1f}  {rate:6.0f} steps/s  "
            f"ETA {eta_s}  v{st['version']} rl {st['rl_applied']} es {st['es_applied']} critic v{st['critic_version']}")


def write_run_folder(run_dir: Path, store: Store) -> dict:
    cfg = store.config()
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=_json_safe))
    with open(run_dir / "metrics.jsonl", "w") as fh:
        for _id, entry in store.history():
            fh.write(json.dumps(entry, default=_json_safe) + "\n")
    version = store.current_version()
    mu, var = store.read_dist(version)
    np.savez(run_dir / "policy.npz", mu=mu, var=var, version=version,
             config=json.dumps(cfg.to_dict(), default=_json_safe))
    summary = summary_numbers(store.r, cfg.run_id)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=_json_safe))
    return summary


def launch(cfg: RunConfig, n_workers: int, redis_url: str | None, out_dir: str, start_critic: bool = True) -> int:
    from scheduler.loop import uses_rl

    run_dir = Path(out_dir) / cfg.run_id
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    server = None
    if redis_url is None:
        server = RedisServer(directory=run_dir / "redis", appendonly=False).start()
        redis_url = server.url
        click.echo(f"embedded Redis on {redis_url} (files in {run_dir / 'redis'})", err=True)
    client = connect(redis_url)
    store = Store(client, cfg.run_id)
    if not store.write_config(cfg):
        click.echo(f"run {cfg.run_id} exists on {redact(redis_url)}: resuming it", err=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("AESRL_REDIS_URL", None)
    py = [sys.executable, "-m", "cli.main"]
    kids = Children(run_dir / "logs", env)
    code = 0
    interrupted = False
    try:
        for i in range(n_workers):
            kids.spawn(f"worker-{i}", worker_command(redis_url))
        if uses_rl(cfg) and start_critic:
            kids.spawn("critic", py + ["critic", "start", "--redis-url", redis_url, "--run", cfg.run_id])
        sched = kids.spawn("scheduler", py + ["scheduler", "start", "--redis-url", redis_url, "--run", cfg.run_id])
        click.echo(f"run {cfg.run_id}: {cfg.algo} on {cfg.env_id}, {n_workers} workers, budget {cfg.total_steps:,} "
                   f"steps; logs in {run_dir / 'logs'}", err=True)
        t0 = time.monotonic()
        steps0 = store.state()["steps"]
        tty = sys.stderr.isatty()
        last_print = 0.0
        while sched.poll() is None:
            time.sleep(1.0)
            for name, p in kids.procs:
                if name != "scheduler" and p.poll() is not None and p.returncode not in (0, None):
                    log.warning("%s exited with %d (see %s)", name, p.returncode, run_dir / "logs" / f"{name}.log")
                    kids.procs.remove((name, p))
                    break
            st = store.state()
            line = _progress_line(st, cfg, t0, steps0)
            if tty:
                click.echo("\r" + line[:200], nl=False, err=True)
            elif time.monotonic() - last_print > 10:
                click.echo(line, err=True)
                last_print = time.monotonic()
        if tty:
            click.echo("", err=True)
        code = 0 if sched.returncode == 0 else 1
        if code:
            click.echo(f"scheduler exited with {sched.returncode}; see {run_dir / 'logs' / 'scheduler.log'}", err=True)
    except KeyboardInterrupt:
        interrupted = True
        click.echo("\ninterrupted: stopping the children...", err=True)
        code = 130
    finally:
        kids.stop()
        try:
            summary = write_run_folder(run_dir, store)
            click.echo(f"\nrun {cfg.run_id} {'(interrupted)' if interrupted else ''}", err=False)
            for k in ("status", "steps", "interactions", "results_applied", "es_applied", "rl_applied",
                      "failed", "rejected", "replaced", "critic_version", "elapsed_s", "f_mu_first", "f_mu_last",
                      "best_fitness"):
                v = summary.get(k)
                click.echo(f"  {k:16} {format(v, ',.1f') if isinstance(v, float) else v}")
            click.echo(f"  run folder       {run_dir}")
        except Exception as exc:  # the summary must not hide the real outcome
            click.echo(f"could not write the run folder: {exc}", err=True)
        if server is not None:
            server.stop()
    return code
