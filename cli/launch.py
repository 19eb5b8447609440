"""`aesrl-queue run`: the terminal front end of a local run (aesrl_queue/local.py runs it).

It prints the messages, the progress line (aesrl_queue/progress.py computes its numbers) and the
summary, and turns SIGTERM/SIGHUP into a clean stop as Ctrl-C is.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import click

from aesrl_queue.config import RunConfig
from aesrl_queue.local import JobsFail, LocalRun, Refused, Terminated, _raise_terminated, _received
from aesrl_queue.metrics import MetricsWriter
from aesrl_queue.progress import Snapshot, duration

log = logging.getLogger(__name__)

PLAIN_EVERY = 10.0  # seconds between progress lines when stderr is not a terminal
PLAIN_WIDTH = 220  # a log line is not redrawn: every part fits, the phase with its command included
PHASE_ROOM = 40  # columns the phase keeps on a narrow terminal before the other parts give way



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


def progress_line(snap: Snapshot, width: int = 80) -> str:
    """One line of at most `width` columns, f(μ)~ first and the phase last; what does not fit is left
    out (bar, counts, elapsed, rate, ETA, in that order), and a long phase is cut."""
    f = snap.fields()
    total = snap.total_steps or 1
    pct = 100.0 * snap.steps / total
    parts = [
        (9, f"f(μ)~ {f['f_mu']}"),
        (8, f"{snap.steps:,}/{snap.total_steps:,} ({pct:.0f}%)"),
        (0, ""),  # the bar, if there is room left
        (3, "" if snap.done else f"{f['rate']} steps/s"),
        (4, "" if snap.done else f"ETA {f['eta']}"),
        (2, f"elapsed {duration(snap.elapsed)}"),
        (1, f["counts"]),
    ]
    # The phase says what the run waits for, or what is wrong and the command that fixes it: it is
    # never dropped, only cut, and the parts below it in importance make room for its first words.
    phase = snap.phase
    need = min(len(phase), PHASE_ROOM) + 2 if phase else 0
    line = fit_line(parts, width - need)
    room = width - len(line) - (len(phase) + 2 if phase else 0) - 2  # the bar only where the whole phase fits
    if room >= 12:
        parts[2] = (0, _bar(pct / 100.0, min(30, room)))
        line = fit_line(parts, width - need)
    if phase:
        left = width - len(line) - 2
        line += "  " + (phase if len(phase) <= left else phase[: max(0, left - 1)] + "…")
    return line


class ProgressView:
    """One progress line on a terminal (redrawn in place, fitted to its width); a plain line every
    PLAIN_EVERY seconds otherwise. Output that cannot be written (a closed pipe) is dropped."""

    def __init__(self, tty: bool | None = None) -> None:
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.last_plain = -math.inf
        self.last: Snapshot | None = None
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

    def update(self, snap: Snapshot | None = None, force: bool = False) -> None:
        snap = snap or self.last
        if snap is None:
            return
        self.last = snap
        now = time.monotonic()
        if self.live is not None:
            from rich.text import Text

            try:
                width = max(20, self.console.width - 1)
                self.live.update(Text(progress_line(snap, width), no_wrap=True, overflow="ellipsis"))
            except OSError:
                self.close()
        elif force or now - self.last_plain >= PLAIN_EVERY:
            self.last_plain = now
            echo(progress_line(snap, PLAIN_WIDTH), err=True)

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


def launch(cfg: RunConfig | None, n_workers: int, redis_url: str | None, out_dir: str, start_critic: bool = True,
           tensorboard_dir: str | None = None, resume=None, snapshot_every: float = 600.0,
           run_dir: Path | None = None, wandb_project: str | None = None, snapshot_steps=(),
           snapshot_interactions=()) -> int:
    """Start everything, show progress, stop everything, write the run folder; the exit code.

    `resume(store) -> (cfg, notes)` resumes the run in `run_dir` (cfg None): its embedded Redis
    loads the AOF there, or `redis_url` holds the run. It raises Refused to stop without a trace.
    """
    _received.clear()
    previous = {s: signal.signal(s, _raise_terminated) for s in (signal.SIGTERM, signal.SIGHUP)}
    view: ProgressView | None = None

    def say(message: str) -> None:
        if view is not None:
            view.say(message)
        else:
            echo(message, err=True)

    run = LocalRun(cfg, n_workers, redis_url=redis_url, out_dir=out_dir, run_dir=run_dir, start_critic=start_critic,
                   tensorboard_dir=tensorboard_dir, wandb_project=wandb_project, snapshot_every=snapshot_every,
                   snapshot_steps=snapshot_steps, snapshot_interactions=snapshot_interactions, resume=resume,
                   say=say)
    code = 0
    outcome = ""
    try:
        run.start()
        cfg = run.cfg
        echo(f"run {cfg.run_id}: {cfg.algo} on {cfg.env_id}, {run.n_workers} worker{'s' if run.n_workers != 1 else ''}, budget {cfg.total_steps:,} "
             f"steps; logs in {run.run_dir / 'logs'}" + (f"; TensorBoard in {run.tb_dir}" if run.tb_dir else ""),
             err=True)
        view = ProgressView()
        code = run.wait(view.update)
        view.update(force=True)
        if code:
            outcome = (f"scheduler exited with {run.sched.returncode}; "
                       f"see {run.run_dir / 'logs' / 'scheduler.log'}")
    except KeyboardInterrupt:
        code, outcome = 130, "interrupted"
    except Terminated as exc:
        code, outcome = 143, f"terminated ({exc})"
    except JobsFail as exc:
        code, outcome = 1, f"stopped: {exc}"
    except Refused as exc:
        echo(f"error: {exc}", err=True)
        code = 2
    finally:
        # A second SIGTERM must not cut the clean-up short (a Ctrl-C meanwhile kills the children at
        # once, and the files are still written). Each step runs even when an earlier one failed.
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        previous_int = signal.signal(signal.SIGINT, lambda signum, frame: run.kids and run.kids.kill_now())
        if view is not None and outcome:
            # Stopped early: the log ends with where the run got to (off a terminal the last plain
            # line may be up to PLAIN_EVERY seconds old).
            try:
                view.update(run.progress.look() if run.progress else None, force=True)
            except Exception as exc:  # noqa: BLE001 - the clean-up goes on
                say(f"clean-up: a last progress line failed: {exc}")
        if view is not None:
            view.close()
            view = None
        summary = run.close(outcome if code != 2 else "")
        if summary is not None:
            try:
                _print_summary(run.cfg, summary, run.run_dir, run.metrics, outcome, run.stop_seconds)
            except Exception as exc:  # noqa: BLE001
                echo(f"clean-up: printing the summary failed: {exc}", err=True)
        for s, h in previous.items():
            signal.signal(s, h)
        signal.signal(signal.SIGINT, previous_int)
    return code


def _bytes(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def folder_size(run_dir: Path) -> str:
    """The size of a run folder, and how much of it is the Redis data kept for --resume (a Pendulum
    run's AOF is most of its 57 MB): "57.1 MB, 56.0 MB of it redis/, kept for --resume"."""
    total, data = _bytes(run_dir), _bytes(run_dir / "redis")
    size = f"{total / 1e6:,.1f} MB"
    return f"{size}, {data / 1e6:,.1f} MB of it redis/, kept for --resume" if data else size


def command_names() -> tuple[str, str | None]:
    """How to call aesrl-queue from this shell, and the clone's scripts/aesrl-queue (None without one).

    `aesrl-queue` where that name on PATH is this installation's (an activated .venv); else the
    wrapper, as the quickstart calls it (`./scripts/aesrl-queue`, relative to the working folder):
    in a shell without the venv the bare name is not found, and the wrapper also installs the plot
    extra that `plot` needs."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "aesrl-queue"
    wrapper = None
    if script.is_file():
        wrapper = os.path.relpath(script)
        if not wrapper.startswith((os.sep, ".")):
            wrapper = f".{os.sep}{wrapper}"
    on_path = shutil.which("aesrl-queue")
    ours = Path(sys.executable).parent / "aesrl-queue"
    try:
        here = bool(on_path) and os.path.samefile(on_path, ours)
    except OSError:
        here = False
    return ("aesrl-queue" if here or wrapper is None else wrapper), wrapper


# Each estimate of f(μ) is one episode or an antithetic ES pair's mean, so a run has several "final f(μ)":
# each says which it is.
# The progress line's f(μ)~ is the mean of the last 10 estimates, between the last two.
F_MU_NOTES = {
    "f_mu_first": "mean of the first tenth of the run's f(μ) estimates",
    "f_mu_last": "mean of the last tenth: the run's score",
    "f_mu_final": "the last estimate (one episode, or an ES pair's mean); `evaluate` scores μ over 10",
}


def _print_summary(cfg: RunConfig, summary: dict, run_dir: Path, metrics: MetricsWriter | None, outcome: str,
                   stop_seconds: float | None = None) -> None:
    stopped = f", stopped in {stop_seconds:.1f} s" if stop_seconds is not None else ""
    lines = [f"\nrun {cfg.run_id}{f' ({outcome}{stopped})' if outcome else ''}"]
    for k in ("status", "steps", "interactions", "results_applied", "es_applied", "rl_applied",
              "failed", "rejected", "replaced", "critic_version", "elapsed_s", "f_mu_first", "f_mu_last",
              "f_mu_final", "best_fitness"):
        v = summary.get(k)
        shown = format(v, ',.1f') if isinstance(v, float) else v
        lines.append(f"  {k:16} {shown}" + (f"  ({F_MU_NOTES[k]})" if k in F_MU_NOTES and v is not None else ""))
    lines += [f"  warning          {w}" for w in summary.get("warnings", ())]
    if metrics is not None:
        lines.append(f"  metrics          {metrics.records:,} records in {metrics.path}")
    lines.append(f"  run folder       {run_dir} ({folder_size(run_dir)})")
    name, wrapper = command_names()
    plot = f"{name} plot {run_dir}"
    if importlib.util.find_spec("matplotlib") is None:  # the plot extra is not in the runtime install
        plot = f"{wrapper} plot {run_dir}" if wrapper else f"pip install -e '.[plot]' && {plot}"
    nexts = [plot, f"{name} export {run_dir}"]
    if summary.get("status") != "finished":
        nexts.insert(0, f"{name} run --resume {run_dir}")
    lines.append("  next             " + "   |   ".join(nexts))
    for line in lines:
        if not echo(line):  # stdout closed (`| head -2`): say once, on stderr, where the results are
            echo(f"stdout closed; the run folder is {run_dir}", err=True)
            return


def launch_virtual(cfg: RunConfig, workers: int, cost_model: str | None, out_dir: str) -> int:
    """`run --virtual-workers N`: the run in virtual time in this process (aesrl_queue/virtual.py); the exit code."""
    from aesrl_queue.cost_model import CostModelError, resolve
    from aesrl_queue.virtual import VirtualRun

    try:
        cost = resolve(cost_model)
    except CostModelError as exc:
        echo(f"error: cost_model: {exc}", err=True)
        return 2
    run = VirtualRun(cfg, workers, cost, out_dir=out_dir, say=lambda message: echo(message, err=True))
    echo(f"run {cfg.run_id}: {cfg.algo} on {cfg.env_id}, {workers} virtual workers, budget {cfg.total_steps:,} "
         f"steps; cost model {cost_model or 'nominal'}", err=True)
    code, outcome, _ = _drive_virtual(run)
    if run.summary is not None and "steps" in run.summary:
        _print_summary(cfg, run.summary, run.run_dir, run.metrics, outcome)
        v = run.summary["virtual"]
        echo(f"  virtual          {workers} workers, {v['virtual_s']:,.1f} s of virtual time in {v['wall_s']:,.1f} s "
             f"({run.run_dir / 'virtual.json'})")
    return code


def _drive_virtual(run) -> tuple[int, str, Exception | None]:
    """Run a virtual run to its end: (exit code, how it ended for the summary, the VirtualRunError that
    stopped it or None)."""
    from aesrl_queue.virtual import VirtualRunError

    try:
        run.run()
    except KeyboardInterrupt:
        return 130, "interrupted", None
    except VirtualRunError as exc:
        return 1, f"stopped: {exc}", exc
    return 0, "", None


def launch_virtual_resume(run_dir: Path, given: dict) -> int:
    """`run --resume FOLDER` of a virtual run folder: the run continued in virtual time in this process,
    with the workers and cost model of its virtual.json; options as for any resume (--steps raises the
    budget, others must restate the run's). The exit code."""
    from aesrl_queue.virtual import VirtualRun, VirtualRunError
    from cli.resume import ResumeError, check_resume

    def check(store):
        try:
            return check_resume(store.config(), given, store.state()["steps"])
        except ResumeError as exc:
            raise VirtualRunError(f"resume: {exc}") from None

    try:
        run = VirtualRun.resumed(run_dir, resume=check, say=lambda message: echo(message, err=True))
    except VirtualRunError as exc:
        echo(f"error: {exc}", err=True)
        return 2
    echo(f"run {run.cfg.run_id}: resuming a virtual run, {run.workers} virtual workers ({run_dir / 'virtual.json'})",
         err=True)
    code, outcome, refused = _drive_virtual(run)
    if refused is not None and run.metrics is None:  # refused before it ran
        echo(f"error: {refused}", err=True)
        return 2
    if run.summary is not None and "steps" in run.summary:
        _print_summary(run.cfg, run.summary, run.run_dir, run.metrics, outcome)
        v = run.summary["virtual"]
        echo(f"  virtual          {run.workers} workers, {v['virtual_s']:,.1f} s of virtual time, {v['wall_s']:,.1f} s "
             f"of wall time over {1 + len(v['resumes'])} incarnations ({run.run_dir / 'virtual.json'})")
    return code


def fit_to_workers(cfg, model, workers: int, jobs_per_worker: int = 20, out: str | os.PathLike | None = None):
    """`model` (a CostModel) fitted to a short real `es` run of `cfg`'s environment and actor with `workers` worker
    processes on an embedded Redis (about jobs_per_worker jobs each): env_step_s and job_overhead_s
    scaled by the median ratio of a job's real duration to the model's for the same steps, worker_gap_s
    of that run and duration_spread, the coefficient of variation of that ratio (`aesrl-queue calibrate
    --workers N`); (the fitted model, notes).
    `out`: keep the run folder there (default: a temporary folder)."""
    import dataclasses
    import tempfile

    from aesrl_queue.api import train
    from aesrl_queue.cost_model import (
        duration_ratios,
        duration_spread,
        measured_updates,
        ratio_spread,
        worker_gap,
    )
    from aesrl_queue.metrics import read_metrics

    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    folder = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="aesrl-calibrate-"))
    # an es job plays an antithetic pair of whole episodes
    steps = workers * jobs_per_worker * 2 * max(1, int(cfg.max_episode_steps))
    t0 = time.perf_counter()
    try:
        run = train(cfg.env_id, algo="es", steps=steps, workers=workers, seed=cfg.seed, out=folder, progress=False,
                    hidden=tuple(cfg.hidden), activation=cfg.activation, env_kwargs=dict(cfg.env_kwargs),
                    run_id=f"calibrate-w{workers}")
        metrics = read_metrics(run.folder / "metrics.jsonl")
    finally:
        if out is None:
            shutil.rmtree(folder, ignore_errors=True)
    n_results = len(measured_updates(metrics, "es"))
    ratios = duration_ratios(metrics, model)
    if n_results < 2 or not ratios:
        raise RuntimeError(f"the {workers}-worker es run told {n_results} results: too few to fit to")
    k = sorted(ratios)[len(ratios) // 2]
    spread = ratio_spread(ratios)
    fitted = dataclasses.replace(model, env_step_s=model.env_step_s * k, job_overhead_s=model.job_overhead_s * k,
                                 worker_gap_s=worker_gap(metrics, workers), duration_spread=spread)
    notes = {"workers": workers, "es_results": n_results, "duration_ratio": k, "env_step_s_one_core": model.env_step_s,
             "worker_gap_s": fitted.worker_gap_s, "duration_spread": fitted.duration_spread,
             "duration_cv": duration_spread(metrics), "fit_wall_s": round(time.perf_counter() - t0, 1)}
    return fitted, notes
