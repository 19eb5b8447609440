"""`aesrl-queue run`: the whole system on one machine as child processes, with progress on screen.

Starts an embedded Redis unless a URL is given, then the scheduler, the critic daemon and N
workers; at the end, on Ctrl-C or on SIGTERM it stops every child it started and writes the run folder.
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
from collections import deque
from pathlib import Path
from typing import Any

import click
import numpy as np

from aesrl_queue import codec
from aesrl_queue.codec import CodecError
from aesrl_queue.config import RunConfig
from aesrl_queue.connection import connect, redact
from aesrl_queue.redis_server import RedisServer
from aesrl_queue.store import Store
from cli.main import worker_command
from cli.metrics import MetricsWriter
from cli.report import summary_numbers

log = logging.getLogger(__name__)

PLAIN_EVERY = 10.0  # seconds between progress lines when stderr is not a terminal


class Terminated(BaseException):
    """SIGTERM or SIGHUP reached the launcher: stop the children and write the run folder.

    A BaseException, like KeyboardInterrupt: raised from the handler inside whatever call is
    running, it must not be swallowed by a library's `except Exception` (a SIGTERM that arrived
    inside a redis-py call was once lost that way, and the run went on)."""


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


class Rate:
    """Stored steps per second over the last `window` seconds (the ETA follows recent speed)."""

    def __init__(self, window: float = 30.0) -> None:
        self.window = window
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, t: float, steps: int) -> float:
        self.samples.append((t, steps))
        while len(self.samples) > 2 and t - self.samples[0][0] > self.window:
            self.samples.popleft()
        (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0


def _eta(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def progress_fields(st: dict[str, Any], cfg: RunConfig, rate: float) -> dict[str, str]:
    """The numbers beside the bar, as text (the same for the bar and the plain lines)."""
    steps = st["steps"]
    f_mu = st.get("f_mu", math.nan)
    left = max(0, cfg.total_steps - steps)
    return {
        "f_mu": format(f_mu, ".1f") if math.isfinite(f_mu) else "-",
        "rate": format(rate, ",.0f"),
        "eta": _eta(left / rate) if rate > 0 else ("0m00s" if left == 0 else "?"),
        "counts": f"v{st['version']} es {st['es_applied']} rl {st['rl_applied']} critic v{st['critic_version']}",
    }


def progress_line(st: dict[str, Any], cfg: RunConfig, rate: float, elapsed: float) -> str:
    f = progress_fields(st, cfg, rate)
    pct = 100.0 * st["steps"] / cfg.total_steps if cfg.total_steps else 0.0
    return (f"{st['steps']:,}/{cfg.total_steps:,} steps ({pct:4.1f}%)  f(μ) {f['f_mu']}  {f['rate']} steps/s  "
            f"ETA {f['eta']}  elapsed {_eta(elapsed)}  {f['counts']}")


class ProgressView:
    """A rich progress bar on a terminal; a plain line every PLAIN_EVERY seconds otherwise."""

    def __init__(self, cfg: RunConfig, steps0: int, tty: bool | None = None) -> None:
        self.cfg = cfg
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.rate = Rate()
        self.t0 = time.monotonic()
        self.last_plain = -math.inf
        self.progress = None
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(bar_width=30),
                TextColumn("{task.completed:>9,.0f}/{task.total:,.0f} steps"),
                TextColumn("f(μ) [bold cyan]{task.fields[f_mu]:>8}"),
                TextColumn("{task.fields[rate]:>6} steps/s"), TextColumn("ETA {task.fields[eta]:>6}"),
                TimeElapsedColumn(), TextColumn("[dim]{task.fields[counts]}"),
                console=Console(stderr=True), refresh_per_second=2, redirect_stdout=False, redirect_stderr=False,
            )
            self.task = self.progress.add_task(cfg.algo, total=cfg.total_steps, completed=steps0,
                                               f_mu="-", rate="0", eta="?", counts="")
            self.progress.start()

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress.console.print(message, markup=False, highlight=False)
        else:
            click.echo(message, err=True)

    def update(self, st: dict[str, Any], force: bool = False) -> None:
        now = time.monotonic()
        rate = self.rate.add(now, st["steps"])
        if self.progress is not None:
            self.progress.update(self.task, completed=min(st["steps"], self.cfg.total_steps),
                                 **progress_fields(st, self.cfg, rate))
        elif force or now - self.last_plain >= PLAIN_EVERY:
            self.last_plain = now
            click.echo(progress_line(st, self.cfg, rate, now - self.t0), err=True)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def read_best(store: Store) -> dict[str, Any] | None:
    """The best individual the scheduler kept (`best` hash), or None when there is none."""
    raw = store.r.hgetall(store.key("best"))
    if not raw or b"params" not in raw:
        return None
    try:
        params = codec.decode_array(raw[b"params"], size=store.config().actor_dim, what="best individual")
    except CodecError as exc:
        log.warning("best individual unusable: %s", exc)
        return None
    meta = {k.decode(): v.decode() for k, v in raw.items() if k != b"params"}
    out: dict[str, Any] = {"params": params}
    for k, v in meta.items():
        try:
            out[k] = float(v) if k == "fitness" else int(v) if k in ("version", "steps") else v
        except ValueError:
            out[k] = v
    return out


def write_run_folder(run_dir: Path, store: Store) -> dict:
    """config.json, policy.npz (final μ, var; best individual when kept) and summary.json.

    metrics.jsonl is written as the run goes by a MetricsWriter.
    """
    cfg = store.config()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=_json_safe))
    version = store.current_version()
    mu, var = store.read_dist(version)
    st = store.state()
    arrays: dict[str, Any] = {"mu": mu, "var": var, "version": version, "f_mu": st.get("f_mu", math.nan),
                              "f_mu_version": st.get("f_mu_version", -1)}
    best = read_best(store)
    if best is not None:
        arrays.update(best=best["params"], best_fitness=best.get("fitness", math.nan),
                      best_kind=str(best.get("kind", "")), best_job=str(best.get("job", "")))
    np.savez(run_dir / "policy.npz", config=json.dumps(cfg.to_dict(), default=_json_safe), **arrays)
    summary = summary_numbers(store.r, cfg.run_id)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=_json_safe))
    return summary


_received: list[str] = []  # signals seen by the handler: the loop checks it too, in case one was lost


def _raise_terminated(signum, frame):
    _received.append(signal.Signals(signum).name)
    raise Terminated(_received[-1])


_DEFERRED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def poll_metrics(metrics: MetricsWriter) -> None:
    """One metrics pass with Ctrl-C/SIGTERM held back (delivered right after), so that a signal
    never leaves a record half-processed: written twice or not at all."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED)
    try:
        metrics.poll()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _DEFERRED)


def launch(cfg: RunConfig, n_workers: int, redis_url: str | None, out_dir: str, start_critic: bool = True,
           tensorboard_dir: str | None = None) -> int:
    from scheduler.sync import needs_critic_daemon, needs_workers

    run_dir = Path(out_dir) / cfg.run_id
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    _received.clear()
    previous = {s: signal.signal(s, _raise_terminated) for s in (signal.SIGTERM, signal.SIGHUP)}
    server = None
    kids = None
    metrics = None
    view = None
    store = None
    code = 0
    outcome = ""
    try:
        if redis_url is None:
            server = RedisServer(directory=run_dir / "redis", appendonly=False).start()
            redis_url = server.url
            click.echo(f"embedded Redis on {redis_url} (files in {run_dir / 'redis'})", err=True)
        client = connect(redis_url)
        store = Store(client, cfg.run_id)
        if not store.write_config(cfg):
            click.echo(f"run {cfg.run_id} exists on {redact(redis_url)}: resuming it", err=True)
        tb_dir = Path(tensorboard_dir) / cfg.run_id if tensorboard_dir else None
        metrics = MetricsWriter(client, cfg.run_id, run_dir / "metrics.jsonl", tensorboard_dir=tb_dir)
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env.pop("AESRL_REDIS_URL", None)
        py = [sys.executable, "-m", "cli.main"]
        kids = Children(run_dir / "logs", env)
        if not needs_workers(cfg):
            n_workers = 0  # td3 runs in the scheduler process
        for i in range(n_workers):
            kids.spawn(f"worker-{i}", worker_command(redis_url))
        if needs_critic_daemon(cfg) and start_critic:
            kids.spawn("critic", py + ["critic", "start", "--redis-url", redis_url, "--run", cfg.run_id])
        sched = kids.spawn("scheduler", py + ["scheduler", "start", "--redis-url", redis_url, "--run", cfg.run_id])
        click.echo(f"run {cfg.run_id}: {cfg.algo} on {cfg.env_id}, {n_workers} workers, budget {cfg.total_steps:,} "
                   f"steps; logs in {run_dir / 'logs'}" + (f"; TensorBoard in {tb_dir}" if tb_dir else ""), err=True)
        view = ProgressView(cfg, store.state()["steps"])
        while sched.poll() is None:
            time.sleep(1.0)
            if _received:
                raise Terminated(_received[0])
            for name, p in list(kids.procs):
                if name != "scheduler" and p.poll() is not None and p.returncode not in (0, None):
                    view.say(f"warning: {name} exited with {p.returncode} (see {run_dir / 'logs' / (name + '.log')})")
                    kids.procs.remove((name, p))
            poll_metrics(metrics)
            view.update(store.state())
        view.update(store.state(), force=True)
        code = 0 if sched.returncode == 0 else 1
        if code:
            outcome = f"scheduler exited with {sched.returncode}; see {run_dir / 'logs' / 'scheduler.log'}"
    except KeyboardInterrupt:
        code, outcome = 130, "interrupted"
    except Terminated as exc:
        code, outcome = 143, f"terminated ({exc})"
    finally:
        # A second SIGTERM must not cut the clean-up short (a second Ctrl-C still can).
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        if view is not None:
            view.close()
        if outcome:
            click.echo(f"{outcome}: stopping the children...", err=True)
        if kids is not None:
            kids.stop()
        if metrics is not None:
            metrics.close()
        if store is not None:
            try:
                summary = write_run_folder(run_dir, store)
                _print_summary(cfg, summary, run_dir, metrics, outcome)
            except Exception as exc:  # the summary must not hide the real outcome
                click.echo(f"could not write the run folder: {exc}", err=True)
        if server is not None:
            server.stop()
        for s, h in previous.items():
            signal.signal(s, h)
    return code


def _print_summary(cfg: RunConfig, summary: dict, run_dir: Path, metrics: MetricsWriter | None, outcome: str) -> None:
    click.echo(f"\nrun {cfg.run_id}{f' ({outcome})' if outcome else ''}")
    for k in ("status", "steps", "interactions", "results_applied", "es_applied", "rl_applied",
              "failed", "rejected", "replaced", "critic_version", "elapsed_s", "f_mu_first", "f_mu_last",
              "best_fitness"):
        v = summary.get(k)
        click.echo(f"  {k:16} {format(v, ',.1f') if isinstance(v, float) else v}")
    if metrics is not None:
        click.echo(f"  metrics          {metrics.records:,} records in {metrics.path}")
    click.echo(f"  run folder       {run_dir}")
    click.echo(f"  next             aesrl-queue plot {run_dir} -o curves.png   |   "
               f"aesrl-queue export {run_dir} -o policy.pt")
