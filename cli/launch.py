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
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import click
import numpy as np

from aesrl_queue.codec import json_default
from aesrl_queue.config import RunConfig
from aesrl_queue.connection import connect, redact
from aesrl_queue.procs import ProcessGroup, worker_command
from aesrl_queue.redis_server import RedisServer
from aesrl_queue.store import Store
from cli.metrics import MetricsWriter
from cli.report import summary_numbers

log = logging.getLogger(__name__)

PLAIN_EVERY = 10.0  # seconds between progress lines when stderr is not a terminal


class Terminated(BaseException):
    """SIGTERM or SIGHUP reached the launcher: stop the children and write the run folder.

    A BaseException, like KeyboardInterrupt: raised from the handler inside whatever call is
    running, it must not be swallowed by a library's `except Exception` (a SIGTERM that arrived
    inside a redis-py call was once lost that way, and the run went on)."""


class Children(ProcessGroup):
    """The processes `run` started (aesrl_queue.procs: each in its own session, each dies with
    the launcher, even on kill -9); stopped workers first, then critic and scheduler."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        super().__init__(log_dir, env=env)

    def stop(self, names_first: tuple[str, ...] = ("worker",), grace: float = 15.0, only=None) -> list[str]:
        return super().stop(names_first=names_first, grace=grace, only=only)


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


def trains_critic(cfg: RunConfig) -> bool:
    from aesrl_queue.optimizers import needs_critic_daemon

    return needs_critic_daemon(cfg) and cfg.rl_ratio > 0


class Phase:
    """What the run is doing, in a few words for the progress line ("" when it is just working)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.critic_wait_since: float | None = None

    def label(self, st: dict[str, Any], now: float | None = None) -> str:
        cfg = self.cfg
        now = time.monotonic() if now is None else now
        problem = st.get("problem_hint") or ""
        if problem:
            return problem
        status = st.get("status", "")
        if status in ("draining", "finished", "stopped", "failed"):
            return status
        steps = st.get("steps", 0)
        if trains_critic(cfg) and st.get("critic_version", 0):
            self.critic_wait_since = None
            from aesrl_queue.optimizers import ASYNC_ALGOS
            from aesrl_queue.optimizers.aesrl import critic_too_far_behind

            critic_steps = int(st.get("critic_steps") or 0)
            # Only the asynchronous loops hold jobs for it; the synchronous ones ask for critic steps.
            if cfg.algo in ASYNC_ALGOS and critic_too_far_behind(cfg, steps, critic_steps):
                return f"critic {steps - critic_steps:,} steps behind"
            return ""
        if not trains_critic(cfg):
            self.critic_wait_since = None
            return ""
        if steps < cfg.initial_steps:
            return "random actions"
        if steps >= max(cfg.initial_steps, cfg.batch_size):
            if self.critic_wait_since is None:
                self.critic_wait_since = now
            return f"waiting for critic {now - self.critic_wait_since:.0f} s"
        return "filling the replay"


def fit_line(parts: list[tuple[int, str]], width: int) -> str:
    """Join the parts (priority, text) with two spaces, dropping the least important first until the
    line fits `width` columns; the most important part is cut with an ellipsis as a last resort."""
    parts = [p for p in parts if p[1]]
    while len(parts) > 1 and len("  ".join(t for _, t in parts)) > width:
        drop = min(range(len(parts)), key=lambda i: (parts[i][0], -i))
        parts.pop(drop)
    line = "  ".join(t for _, t in parts)
    return line if len(line) <= width else line[: max(0, width - 1)] + "…"


def _bar(frac: float, width: int) -> str:
    full = int(max(0.0, min(1.0, frac)) * width)
    return "━" * full + "╌" * (width - full)


def progress_line(st: dict[str, Any], cfg: RunConfig, rate: float, elapsed: float, phase: str = "",
                  width: int = 80) -> str:
    """One line of at most `width` columns, f(μ) first; what does not fit is left out (bar, counts,
    elapsed, rate, ETA, in that order)."""
    f = progress_fields(st, cfg, rate)
    total = cfg.total_steps or 1
    pct = 100.0 * st["steps"] / total
    stopped = st.get("status") in ("finished", "stopped", "failed")
    parts = [
        (9, f"f(μ) {f['f_mu']}"),
        (8, f"{st['steps']:,}/{cfg.total_steps:,} ({pct:.0f}%)"),
        (0, ""),  # the bar, if there is room left
        (3, "" if stopped else f"{f['rate']} steps/s"),
        (4, "" if stopped else f"ETA {f['eta']}"),
        (2, f"elapsed {_eta(elapsed)}"),
        (7, phase),
        (1, f["counts"]),
    ]
    line = fit_line(parts, width)
    room = width - len(line) - 2
    if room >= 12:
        parts[2] = (0, _bar(pct / 100.0, min(30, room)))
        line = fit_line(parts, width)
    return line


class ProgressView:
    """One progress line on a terminal (redrawn in place, fitted to its width); a plain line every
    PLAIN_EVERY seconds otherwise. Output that cannot be written (a closed pipe) is dropped."""

    def __init__(self, cfg: RunConfig, steps0: int, tty: bool | None = None) -> None:
        self.cfg = cfg
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.rate = Rate()
        self.phase = Phase(cfg)
        self.t0 = time.monotonic()
        self.last_plain = -math.inf
        self.live = None
        if self.tty:
            from rich.console import Console
            from rich.live import Live
            from rich.text import Text

            self.console = Console(stderr=True)
            self.live = Live(Text(""), console=self.console, refresh_per_second=2, transient=False,
                             redirect_stdout=False, redirect_stderr=False)
            self.live.start()

    def say(self, message: str) -> None:
        if self.live is not None:
            try:
                self.live.console.print(message, markup=False, highlight=False)
            except OSError:
                self.close()
        else:
            echo(message, err=True)

    def line(self, st: dict[str, Any], rate: float, width: int) -> str:
        return progress_line(st, self.cfg, rate, time.monotonic() - self.t0, self.phase.label(st), width)

    def update(self, st: dict[str, Any], force: bool = False) -> None:
        now = time.monotonic()
        status = st.get("status")
        rate = self.rate.add(now, st["steps"]) if status not in ("finished", "stopped", "failed") else 0.0
        if self.live is not None:
            from rich.text import Text

            try:
                width = max(20, self.console.width - 1)
                self.live.update(Text(self.line(st, rate, width), no_wrap=True, overflow="ellipsis"))
            except OSError:
                self.close()
        elif force or now - self.last_plain >= PLAIN_EVERY:
            self.last_plain = now
            echo(self.line(st, rate, 80), err=True)

    def close(self) -> None:
        if self.live is not None:
            live, self.live = self.live, None
            try:
                live.stop()
            except OSError:
                _silence(sys.stderr)


def _silence(stream) -> None:
    """Point a stream whose reader went away (a closed pipe) at /dev/null: later writes, and the
    interpreter's flush at exit, then succeed without a word."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def echo(message: str = "", err: bool = False) -> bool:
    """click.echo that survives a closed pipe (`aesrl-queue run | head -2`): False if not written."""
    try:
        click.echo(message, err=err)
        return True
    except OSError:  # EPIPE (BrokenPipeError), EIO of a closed terminal
        _silence(sys.stderr if err else sys.stdout)
        return False


def write_policy(run_dir: Path, store: Store, name: str = "policy.npz") -> Path:
    """policy.npz (or `name` under the run folder): the current μ and var (td3: its actor; and the best
    individual when kept), replaced atomically, so that a crash while writing a snapshot leaves the
    previous one intact."""
    cfg = store.config()
    version = store.current_version()
    mu, var = store.read_dist(version)
    st = store.state()
    arrays: dict[str, Any] = {"mu": mu, "var": var, "version": version, "f_mu": st.get("f_mu", math.nan),
                              "f_mu_version": st.get("f_mu_version", -1), "steps": st.get("steps", 0),
                              "interactions": st.get("interactions", 0),
                              "needed_interactions": needed_interactions(cfg, st)}
    best = store.read_best()
    if best is not None:
        arrays.update(best=best["params"], best_fitness=best.get("fitness", math.nan),
                      best_kind=str(best.get("kind", "")), best_job=str(best.get("job", "")))
    path = run_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, config=json.dumps(cfg.to_dict(), default=json_default), **arrays)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def needed_interactions(cfg: RunConfig, st: dict[str, Any]) -> int:
    """The environment steps a run needed to learn so far: every stored step, plus, for the
    asynchronous loops (aesrl, es, opo, acemrl), the unstored f(μ) episodes their update rule
    compares each individual with. td3's and the CEM-RL loops' f(μ) episodes only report progress,
    so they are left out here (the run's `interactions` counts every env step, those included)."""
    from aesrl_queue.optimizers import ASYNC_ALGOS

    return int(st.get("interactions", 0)) if cfg.algo in ASYNC_ALGOS else int(st.get("steps", 0))


class Milestones:
    """`run --snapshot-steps/--snapshot-interactions`: the policy (as policy.npz holds it) written to
    snapshots/steps-N.npz when the stored steps first reach N, and to snapshots/interactions-N.npz
    when the needed interactions (needed_interactions) first do. The launcher checks once a second
    and the counters move one finished episode at a time, so a snapshot is the policy of the first
    check at or past N: up to one second and one episode per worker late; the npz records the
    counters it was taken at. td3's actor is the one it evaluated last, at the first episode end
    past each multiple of td3_eval_every. A milestone whose file exists (a resumed run) is kept."""

    def __init__(self, run_dir: Path, steps=(), interactions=()) -> None:
        self.dir = run_dir / "snapshots"
        self.todo = [(kind, int(n)) for kind, ns in (("steps", steps), ("interactions", interactions))
                     for n in sorted(set(ns)) if not (self.dir / f"{kind}-{int(n)}.npz").exists()]

    def check(self, run_dir: Path, store: Store) -> list[Path]:
        if not self.todo:
            return []
        st = store.state()
        now = {"steps": int(st.get("steps", 0)), "interactions": needed_interactions(store.config(), st)}
        due = [(kind, n) for kind, n in self.todo if now[kind] >= n]
        for item in due:
            self.todo.remove(item)
        return [write_policy(run_dir, store, f"snapshots/{kind}-{n}.npz") for kind, n in due]


def _milestones(milestones: Milestones, run_dir: Path, store: Store, view: ProgressView) -> None:
    try:
        milestones.check(run_dir, store)
    except Exception as exc:  # noqa: BLE001 - a failed snapshot must not end the run
        view.say(f"warning: milestone snapshot failed: {exc}")


def write_run_folder(run_dir: Path, store: Store) -> dict:
    """config.json, policy.npz (final μ, var; best individual when kept) and summary.json.

    metrics.jsonl is written as the run goes by a MetricsWriter.
    """
    cfg = store.config()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=json_default))
    write_policy(run_dir, store)
    summary = summary_numbers(store.r, cfg.run_id)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=json_default))
    return summary


_received: list[str] = []  # signals seen by the handler: the loop checks it too, in case one was lost
_deferring = False  # poll_metrics is running: the handlers note a signal, and it is raised right after


def _raise_terminated(signum, frame):
    _received.append(signal.Signals(signum).name)
    if not _deferring:
        raise Terminated(_received[-1])


def poll_metrics(metrics: MetricsWriter) -> None:
    """One metrics pass with Ctrl-C/SIGTERM/SIGHUP held back (raised right after), so that a signal
    never leaves a record half-processed: written twice or not at all.

    Held back by the handlers, not by the thread's signal mask: a process-directed signal that the
    main thread blocks is delivered to another thread (numpy's BLAS threads), and Python still runs
    its handler in the main thread, in the middle of the pass (a record written twice on SIGTERM)."""
    global _deferring
    interrupted: list[int] = []
    previous_int = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    _deferring = True
    try:
        metrics.poll()
    finally:
        _deferring = False
        signal.signal(signal.SIGINT, previous_int)
    if interrupted and previous_int != signal.SIG_IGN:
        if callable(previous_int):
            previous_int(signal.SIGINT, None)  # the launcher's handler: KeyboardInterrupt by default
        else:
            raise KeyboardInterrupt
    if _received:
        raise Terminated(_received[0])


def _step(what: str, fn, *args, **kwargs):
    """One clean-up step: a failure is reported and the next step still runs."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - every step must run
        echo(f"clean-up: {what} failed: {type(exc).__name__}: {exc}", err=True)
        return None


def folder_run_id(run_dir: Path, client) -> str:
    """The run id of a run folder: its config.json, else the one run its Redis holds, else its name."""
    from aesrl_queue.store import list_runs

    try:
        return str(json.loads((run_dir / "config.json").read_text())["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    runs = list_runs(client)
    return runs[0][0] if len(runs) == 1 else run_dir.name


class Refused(Exception):
    """The launch stopped before touching the run (exit 2 with this message)."""


def launch(cfg: RunConfig | None, n_workers: int, redis_url: str | None, out_dir: str, start_critic: bool = True,
           tensorboard_dir: str | None = None, resume=None, snapshot_every: float = 600.0,
           run_dir: Path | None = None, wandb_project: str | None = None, snapshot_steps=(),
           snapshot_interactions=()) -> int:
    """Start everything, show progress, stop everything, write the run folder; the exit code.

    `resume(store) -> (cfg, notes)` resumes the run in `run_dir` (cfg None): its embedded Redis
    loads the AOF there, or `redis_url` holds the run. It raises Refused to stop without a trace.
    """
    from aesrl_queue.optimizers import needs_critic_daemon, needs_workers

    run_dir = Path(run_dir) if run_dir is not None else Path(out_dir) / cfg.run_id
    _received.clear()
    previous = {s: signal.signal(s, _raise_terminated) for s in (signal.SIGTERM, signal.SIGHUP)}
    server = None
    kids = None
    metrics = None
    view = None
    store = None
    started = False  # past the checks: the run folder is ours to write
    code = 0
    outcome = ""
    try:
        if redis_url is None:
            # AOF in the run folder (fsync every second): `run --resume RUN_FOLDER` continues from it
            # after Ctrl-C, kill -9 or a reboot.
            server = RedisServer(directory=run_dir / "redis", appendonly=True).start()
            redis_url = server.url
            echo(f"embedded Redis on {redis_url} (AOF in {run_dir / 'redis'})", err=True)
        client = connect(redis_url)
        if resume is not None:
            store = Store(client, cfg.run_id if cfg is not None else folder_run_id(run_dir, client))
            cfg, notes = resume(store)
            for note in notes:
                echo(f"resume: {note}", err=True)
            if cfg.total_steps != store.config().total_steps:
                store.replace_config(cfg)
            store.set_state(finished_at=None)
            if store.status() in ("finished", "stopped", "failed"):
                store.set_state(status="created", updated_at=time.time())  # until its scheduler runs again
            echo(f"resuming run {cfg.run_id} at {store.state()['steps']:,} of {cfg.total_steps:,} steps", err=True)
        else:
            store = Store(client, cfg.run_id)
            if not store.write_config(cfg):
                raise Refused(f"run_id: run {cfg.run_id} already exists on {redact(redis_url)}: "
                              "--resume it or --force a new start")
        started = True
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=json_default))
        tb_dir = Path(tensorboard_dir) / cfg.run_id if tensorboard_dir else None
        metrics = MetricsWriter(client, cfg.run_id, run_dir / "metrics.jsonl", tensorboard_dir=tb_dir,
                                wandb_project=wandb_project)
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", AESRL_TRACEBACK="1")
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
        echo(f"run {cfg.run_id}: {cfg.algo} on {cfg.env_id}, {n_workers} workers, budget {cfg.total_steps:,} "
             f"steps; logs in {run_dir / 'logs'}" + (f"; TensorBoard in {tb_dir}" if tb_dir else ""), err=True)
        view = ProgressView(cfg, store.state()["steps"])
        milestones = Milestones(run_dir, snapshot_steps, snapshot_interactions)
        last_snapshot = time.monotonic()
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
            if snapshot_every > 0 and time.monotonic() - last_snapshot >= snapshot_every:
                last_snapshot = time.monotonic()
                try:
                    write_policy(run_dir, store)
                except Exception as exc:  # noqa: BLE001 - a failed snapshot must not end the run
                    view.say(f"warning: policy snapshot failed: {exc}")
            _milestones(milestones, run_dir, store, view)
        _milestones(milestones, run_dir, store, view)  # those the last episodes reached after the last check
        view.update(store.state(), force=True)
        code = 0 if sched.returncode == 0 else 1
        if code:
            outcome = f"scheduler exited with {sched.returncode}; see {run_dir / 'logs' / 'scheduler.log'}"
    except KeyboardInterrupt:
        code, outcome = 130, "interrupted"
    except Terminated as exc:
        code, outcome = 143, f"terminated ({exc})"
    except Refused as exc:
        echo(f"error: {exc}", err=True)
        code = 2
    finally:
        # A second SIGTERM must not cut the clean-up short (a second Ctrl-C still can). Each step
        # runs even when an earlier one failed.
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        if view is not None and store is not None and outcome:
            # Stopped early: the log ends with where the run got to (off a terminal the last plain
            # line may be up to PLAIN_EVERY seconds old).
            _step("a last progress line", lambda: view.update(store.state(), force=True))
        if view is not None:
            _step("closing the progress line", view.close)
        if outcome:
            echo(f"{outcome}: stopping the children...", err=True)
        if kids is not None:
            _step("stopping the children", kids.stop)
        if metrics is not None:
            _step("closing metrics", metrics.close)
        if store is not None and started:
            summary = _step("writing the run folder", write_run_folder, run_dir, store)
            if summary is not None:
                _step("printing the summary", _print_summary, cfg, summary, run_dir, metrics, outcome)
        if server is not None:
            _step("stopping the embedded Redis", server.stop)
        for s, h in previous.items():
            signal.signal(s, h)
    return code


def _print_summary(cfg: RunConfig, summary: dict, run_dir: Path, metrics: MetricsWriter | None, outcome: str) -> None:
    lines = [f"\nrun {cfg.run_id}{f' ({outcome})' if outcome else ''}"]
    for k in ("status", "steps", "interactions", "results_applied", "es_applied", "rl_applied",
              "failed", "rejected", "replaced", "critic_version", "elapsed_s", "f_mu_first", "f_mu_last",
              "best_fitness"):
        v = summary.get(k)
        lines.append(f"  {k:16} {format(v, ',.1f') if isinstance(v, float) else v}")
    lines += [f"  warning          {w}" for w in summary.get("warnings", ())]
    if metrics is not None:
        lines.append(f"  metrics          {metrics.records:,} records in {metrics.path}")
    lines.append(f"  run folder       {run_dir}")
    lines.append(f"  next             aesrl-queue plot {run_dir}   |   "
                 f"aesrl-queue export {run_dir}")
    for line in lines:
        if not echo(line):  # stdout closed (`| head -2`): say once, on stderr, where the results are
            echo(f"stdout closed; the run folder is {run_dir}", err=True)
            return
