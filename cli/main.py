"""The `aesrl-queue` click group: every command a user of a run types.

Library code logs; this module prints. Bad input exits with status 2 and names the field.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time

import click

from aesrl_queue.codec import CodecError
from aesrl_queue.config import ALGOS, MEAN_RULES, R_MODES, VAR_RULES, ConfigError, RunConfig
from aesrl_queue.connection import ENV_URL, RedisUnavailable, connect, redact

log = logging.getLogger("aesrl_queue.cli")

URL_HELP = f"Redis URL (redis://[:PASSWORD@]HOST:PORT/DB or rediss:// for TLS); default ${ENV_URL} or redis://127.0.0.1:6379/0."


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def fail(message: str, code: int = 2) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _connect(url: str | None, blocking: bool = False):
    try:
        return connect(url, blocking=blocking)
    except RedisUnavailable as exc:
        fail(str(exc), code=1)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Logging level of this process.")
def cli(log_level: str) -> None:
    """AES-RL on a Redis task queue: a scheduler, RQ workers on every machine, a critic daemon.

    Quickstart on one machine (embedded Redis): aesrl-queue run --env Pendulum-v1
    """
    setup_logging(log_level)


# -- run-config options shared by `run` and `scheduler start` ----------------------------------------
def config_options(f):
    opts = [
        click.option("--env", "env_id", default=None, help="Gymnasium environment id, e.g. HalfCheetah-v5, Pendulum-v1."),
        click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="TOML or JSON file of config fields (command-line options override it)."),
        click.option("--algo", type=click.Choice(ALGOS), default=None, help="Algorithm (default aesrl)."),
        click.option("--steps", "total_steps", type=int, default=None, help="Budget of stored env steps (preset default)."),
        click.option("--seed", type=int, default=None, help="Run seed (μ₀ and every job seed derive from it)."),
        click.option("--mean-rule", type=click.Choice(MEAN_RULES), default=None, help="AES-RL mean update rule."),
        click.option("--var-rule", type=click.Choice(VAR_RULES), default=None, help="AES-RL variance update rule."),
        click.option("--r", "r", default=None,
                     help="Fitness scale r of the mean rule: 'adaptive' (default: robust spread of recent "
                          "f(z)-f(μ)), 'paper' (the paper's r for the environment), a number, or 'auto'."),
        click.option("--fixed-n", type=float, default=None, help="n of the fixed variance rule (default 10)."),
        click.option("--rl-ratio", type=float, default=None, help="Target share of RL individuals ρ* (default 0.5)."),
        click.option("--rl-gain", type=float, default=None, help="Gain K of the P controller (default 50)."),
        click.option("--initial-steps", type=int, default=None, help="Random-action steps before the first RL job."),
        click.option("--hidden", default=None, help="Actor hidden sizes, e.g. 400,300 (preset default)."),
        click.option("--critic-hidden", default=None, help="Critic hidden sizes, e.g. 400,300."),
        click.option("--parallel-critic/--serial-critic", "parallel_critic", default=None,
                     help="pcemrl: train the critic in the critic daemon while jobs run (default: serial, "
                          "between generations)."),
        click.option("--run-id", default=None, help="Name of the run in Redis (default: generated)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def build_config(env_id, config_file, **kw) -> RunConfig:
    """Preset + file + options, validated and resolved against the environment; exit 2 if invalid."""
    r = kw.get("r")
    if r is not None and r not in R_MODES:
        try:
            kw["r"] = float(r)
        except ValueError:
            fail(f"r: must be a positive number or one of {', '.join(R_MODES)}, got {r!r}")
    for name in ("hidden", "critic_hidden"):
        if kw.get(name) is not None:
            try:
                kw[name] = tuple(int(x) for x in kw[name].replace("x", ",").split(",") if x.strip())
            except ValueError:
                fail(f"{name}: expected comma-separated layer sizes such as 400,300, got {kw[name]!r}")
    if kw.get("run_id") is None:
        kw.pop("run_id", None)
    try:
        if config_file:
            cfg = RunConfig.from_file(config_file, **({"env_id": env_id} if env_id else {}), **kw)
        elif env_id:
            cfg = RunConfig.from_preset(env_id, **kw)
        else:
            fail("env_id: pass --env (e.g. --env Pendulum-v1) or --config FILE")
        return cfg.resolve()
    except ConfigError as exc:
        fail(str(exc))
    except TypeError as exc:
        fail(f"config: {exc}")


# -- scheduler ----------------------------------------------------------------------------------------
@cli.group()
def scheduler() -> None:
    """The scheduler of a run (one per run)."""


@scheduler.command("start")
@click.option("--redis-url", envvar=ENV_URL, default=None, help=URL_HELP)
@config_options
@click.option("--run", "run", default=None, help="Resume this existing run instead of creating one.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the run folder OUT/<run-id> (metrics.jsonl as it goes; policy, summary at the end).")
@click.option("--tensorboard", "tensorboard_dir", type=click.Path(file_okay=False), default=None,
              help="Write TensorBoard scalars to DIR/<run-id> (needs the tensorboard extra).")
def scheduler_start(redis_url, run, env_id, config_file, out_dir=None, tensorboard_dir=None, **kw) -> None:
    """Run the scheduler loop of a new run (or resume --run RUN) until its step budget is spent."""
    from aesrl_queue.store import Store
    from scheduler.loop import ASYNC_ALGOS, AsyncScheduler, install_signal_handlers

    client = _connect(redis_url)
    if run:
        store = Store(client, run)
        if not store.exists():
            fail(f"run: no run {run!r} on {redact(redis_url or os.environ.get(ENV_URL, 'the default Redis'))}; "
                 "`aesrl-queue runs` lists them")
        try:
            cfg = store.config()
        except CodecError as exc:  # malformed, truncated or planted (a pickle): refuse, never guess
            fail(f"run: the stored config of {run!r} is unusable: {exc}")
        click.echo(f"resuming run {run} ({cfg.algo} on {cfg.env_id})", err=True)
    else:
        cfg = build_config(env_id, config_file, **kw)
    stop = threading.Event()
    install_signal_handlers(stop)
    blocking = _connect(redis_url, blocking=True)
    if cfg.algo in ASYNC_ALGOS:
        sched = AsyncScheduler(client, blocking, cfg, stop_event=stop)
    else:
        try:
            from scheduler.sync import make_sync_scheduler
        except ImportError:
            fail(f"algo: {cfg.algo!r} is not available in this version; use one of {', '.join(ASYNC_ALGOS)}")
        sched = make_sync_scheduler(client, blocking, cfg, stop_event=stop)
    click.echo(f"run {cfg.run_id}: scheduler started ({cfg.algo}, {cfg.env_id}, {cfg.actor_dim} parameters)", err=True)
    metrics = _start_metrics(redis_url, cfg, out_dir, tensorboard_dir)
    try:
        status = sched.run()
    finally:
        if metrics is not None:
            _finish_run_folder(metrics, out_dir, cfg.run_id)
    click.echo(f"run {cfg.run_id}: {status}", err=True)


def _start_metrics(redis_url, cfg, out_dir, tensorboard_dir):
    """A MetricsWriter thread for `scheduler start --out/--tensorboard` (None when neither is given)."""
    if not out_dir and not tensorboard_dir:
        return None
    from pathlib import Path

    from cli.metrics import MetricsWriter

    run_dir = Path(out_dir or "runs") / cfg.run_id
    try:
        writer = MetricsWriter(_connect(redis_url), cfg.run_id, run_dir / "metrics.jsonl",
                               tensorboard_dir=Path(tensorboard_dir) / cfg.run_id if tensorboard_dir else None)
    except ImportError as exc:
        fail(f"tensorboard: {exc}")
    click.echo(f"run {cfg.run_id}: metrics in {run_dir / 'metrics.jsonl'}"
               + (f", TensorBoard in {Path(tensorboard_dir) / cfg.run_id}" if tensorboard_dir else ""), err=True)
    return writer.start()


def _finish_run_folder(metrics, out_dir, run_id) -> None:
    from aesrl_queue.store import Store
    from cli.launch import write_run_folder

    metrics.close()
    if out_dir:
        try:
            write_run_folder(metrics.path.parent, Store(metrics.r, run_id))
            click.echo(f"run {run_id}: run folder {metrics.path.parent}", err=True)
        except Exception as exc:  # the scheduler's outcome matters more than the folder
            click.echo(f"could not write the run folder: {exc}", err=True)


# -- critic -------------------------------------------------------------------------------------------
@cli.group()
def critic() -> None:
    """The critic daemon of a run (GPU when there is one)."""


@critic.command("start")
@click.option("--redis-url", envvar=ENV_URL, default=None, help=URL_HELP)
@click.option("--run", "run", default=None, help="Run to serve (default: the newest run on this Redis).")
@click.option("--device", default="auto", help="Torch device: auto (CUDA if present), cpu, cuda, cuda:1, ...")
@click.option("--wait", type=float, default=120.0, help="Seconds to wait for the run to appear.")
def critic_start(redis_url, run, device, wait) -> None:
    """Train the TD3 critic of a run continuously and republish its weights."""
    import torch

    from aesrl_queue.store import Store, list_runs
    from scheduler.loop import install_signal_handlers
    from workers.critic import CriticDaemon

    torch.set_num_threads(int(os.environ.get("AESRL_TORCH_THREADS", "1")))
    client = _connect(redis_url)
    deadline = time.monotonic() + wait
    while True:
        if run is None:
            runs = list_runs(client)
            chosen = runs[-1][0] if runs else None
        else:
            chosen = run
        if chosen and Store(client, chosen).exists():
            break
        if time.monotonic() > deadline:
            fail(f"run: {'no run' if run is None else repr(run)} found on Redis after {wait:.0f}s")
        time.sleep(0.5)
    stop = threading.Event()
    install_signal_handlers(stop)
    try:
        daemon = CriticDaemon(client, _connect(redis_url, blocking=True), chosen, device=device, stop_event=stop)
    except CodecError as exc:  # a CodecError is a ValueError too: not a device problem
        fail(f"run: the stored config of {chosen!r} is unusable: {exc}")
    except ValueError as exc:
        fail(f"device: {exc}")
    click.echo(f"critic daemon for run {chosen} on {daemon.device}", err=True)
    daemon.run()


# -- workers ------------------------------------------------------------------------------------------
def worker_command(url: str, burst: bool = False, name: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "rq.cli", "worker", "-w", "workers.AesrlWorker", "-u", url,
           "--logging_level", "WARNING"]
    if burst:
        cmd.append("--burst")
    if name:
        cmd += ["-n", name]
    return cmd + ["aesrl-rl", "aesrl-es"]


@cli.command()
@click.option("--redis-url", envvar=ENV_URL, default=None, help=URL_HELP)
@click.option("--processes", "-n", type=int, default=os.cpu_count() or 1, help="Worker processes to start (one per core).")
@click.option("--burst", is_flag=True, help="Exit when the queues are empty.")
@click.option("--read-url", envvar="AESRL_READ_URL", default=None,
              help="A local Redis replica (replicaof the primary) to read μ/var, config, critic and replay "
                   "from; writes still go to --redis-url. [env: AESRL_READ_URL]")
def worker(redis_url, processes, burst, read_url) -> None:
    """Start N `rq worker -w workers.AesrlWorker` processes on this machine (a thin wrapper)."""
    from aesrl_queue.connection import resolve_url

    if processes < 1:
        fail("processes: must be at least 1")
    primary = _connect(redis_url)
    url = resolve_url(redis_url)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if read_url:
        from workers.replica import READ_URL_ENV, ReplicaError, reader_for

        try:
            reader_for(primary, read_url).check()
        except (ReplicaError, RedisUnavailable) as exc:
            fail(f"read-url: {exc}")
        env[READ_URL_ENV] = read_url
        click.echo(f"reading run data from replica {redact(read_url)}", err=True)
    procs = [subprocess.Popen(worker_command(url, burst), env=env) for _ in range(processes)]
    click.echo(f"started {processes} workers on {redact(url)}", err=True)

    def stop(signum, frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    codes = [p.wait() for p in procs]
    sys.exit(max(codes) if codes else 0)


# -- status and runs ----------------------------------------------------------------------------------
@cli.command()
@click.option("--redis-url", envvar=ENV_URL, default=None, help=URL_HELP)
@click.option("--run", "run", default=None, help="Run to show (default: the newest).")
@click.option("--watch", is_flag=True, help="Refresh about once a second until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def status(redis_url, run, watch, as_json) -> None:
    """Live population statistics of a run: f(μ), σ, steps, RL share, jobs, critic, workers."""
    from aesrl_queue.store import list_runs
    from cli.report import render, safe_gather

    client = _connect(redis_url)
    if run is None:
        runs = list_runs(client)
        if not runs:
            fail("run: no runs on this Redis yet", code=1)
        run = runs[-1][0]
    if watch:
        from cli.watch import watch_status

        watch_status(client, run)
        return
    s = safe_gather(client, run)
    if isinstance(s, str):
        fail(f"run: {s}", code=1)
    click.echo(json.dumps(s, default=_json_default) if as_json else render(s))


def _json_default(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


@cli.command()
@click.option("--redis-url", envvar=ENV_URL, default=None, help=URL_HELP)
def runs(redis_url) -> None:
    """List the runs on a Redis with their status, steps and f(μ)."""
    from aesrl_queue.store import Store, list_runs

    client = _connect(redis_url)
    rows = list_runs(client)
    if not rows:
        click.echo("no runs")
        return
    click.echo(f"{'run':48} {'status':9} {'steps':>10} {'f(μ)':>10}  created")
    for run_id, created in rows:
        st = Store(client, run_id).state()
        f_mu = st.get("f_mu", math.nan)
        click.echo(f"{run_id:48} {st.get('status', '?'):9} {st['steps']:>10,} "
                   f"{(format(f_mu, '.1f') if math.isfinite(f_mu) else '-'):>10}  "
                   f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(created))}")


# -- run: everything on one machine -------------------------------------------------------------------
@cli.command("run")
@click.option("--redis-url", default=None, help="Use this Redis instead of starting an embedded one. " + URL_HELP)
@config_options
@click.option("--workers", "n_workers", type=int, default=None, help="Local worker processes (default: cores).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="runs", help="Folder for run folders.")
@click.option("--no-critic", is_flag=True, help="Do not start a local critic daemon (one runs elsewhere).")
@click.option("--tensorboard", "tensorboard_dir", type=click.Path(file_okay=False), default=None,
              help="Write TensorBoard scalars to DIR/<run-id> (needs the tensorboard extra).")
def run_cmd(redis_url, env_id, config_file, n_workers, out_dir, no_critic, tensorboard_dir=None, **kw) -> None:
    """Everything on one machine: embedded Redis, scheduler, critic daemon and N workers.

    Shows progress, and at the end (or on Ctrl-C) stops every child and writes a run folder with
    config.json, metrics.jsonl, policy.npz (final μ) and summary.json.
    """
    from cli.launch import launch

    cfg = build_config(env_id, config_file, **kw)
    n = n_workers if n_workers is not None else max(1, (os.cpu_count() or 2))
    if n < 1:
        fail("workers: must be at least 1")
    if tensorboard_dir:
        from cli.metrics import open_tensorboard

        try:
            open_tensorboard(tensorboard_dir).close()
        except ImportError as exc:
            fail(f"tensorboard: {exc}")
    code = launch(cfg, n_workers=n, redis_url=redis_url, out_dir=out_dir, start_critic=not no_critic,
                  tensorboard_dir=tensorboard_dir)
    sys.exit(code)


# -- results: plot, export, evaluate -------------------------------------------------------------------
@cli.command()
@click.argument("run_folders", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--out", "out", default="curves.png", type=click.Path(dir_okay=False), help="PNG to write.")
@click.option("--title", default=None, help="Figure title (default: the environments and run counts).")
def plot(run_folders, out, title) -> None:
    """Learning curves (f(μ) vs stored steps and vs wall clock) and the ES/RL interaction chart of run folders.

    Runs whose configs differ only by seed are drawn as one curve: the mean with a ±1 std band.
    """
    from cli.plot import PlotError, plot_runs

    try:
        drawn = plot_runs(list(run_folders), out, title=title)
    except PlotError as exc:
        fail(str(exc), code=1)
    for why in drawn["skipped"]:
        click.echo(f"skipped: {why}", err=True)
    for label, run_ids in drawn["groups"].items():
        click.echo(f"{label}: {len(run_ids)} run{'s' if len(run_ids) != 1 else ''} ({', '.join(run_ids)})")
    click.echo(f"wrote {drawn['out']}")


@cli.command()
@click.argument("run")
@click.option("-o", "--out", "out", default="policy.pt", type=click.Path(dir_okay=False), help="File to write.")
@click.option("--which", type=click.Choice(["mu", "best"]), default="mu",
              help="mu: the current mean of the search distribution; best: the best individual evaluated.")
@click.option("--redis-url", envvar=ENV_URL, default=None, help="Read RUN (a run id) from this Redis. " + URL_HELP)
def export(run, out, which, redis_url) -> None:
    """Write a run's policy (RUN: a run folder, or a run id with --redis-url) with the config to rebuild it."""
    from pathlib import Path

    from cli.export import ExportError, export_policy

    client = None if Path(run).exists() else _connect(redis_url)
    try:
        payload = export_policy(run, out, which=which, client=client)
    except ExportError as exc:
        fail(str(exc), code=1)
    src = payload["source"]
    def num(x):
        return format(x, ".1f") if isinstance(x, float) and math.isfinite(x) else "-"

    extra = (f"version {src.get('mu_version')}, last f(μ) {num(src.get('f_mu'))}" if which == "mu"
             else f"f(z) {num(src.get('fitness'))}, {src.get('kind')} individual")
    click.echo(f"wrote {out}: {which} of {payload['env_id']} ({payload['params'].numel():,} parameters; {extra})")


@cli.command()
@click.argument("policy", type=click.Path(exists=True, dir_okay=False))
@click.option("--episodes", "-n", type=click.IntRange(min=1), default=10, help="Episodes to run.")
@click.option("--seed", type=int, default=0, help="Episode i resets the environment with seed + i.")
@click.option("--video", "video_dir", type=click.Path(file_okay=False), default=None,
              help="Film the first episode into this folder (needs the video extra).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def evaluate(policy, episodes, seed, video_dir, as_json) -> None:
    """Run an exported policy deterministically and print its mean ± std return."""
    import torch

    from cli.export import ExportError, evaluate_policy

    torch.set_num_threads(1)
    try:
        res = evaluate_policy(policy, episodes=episodes, seed=seed, video_dir=video_dir)
    except ExportError as exc:
        fail(str(exc), code=1)
    if as_json:
        click.echo(json.dumps(res, default=_json_default))
        sys.exit(1 if "video_error" in res else 0)
    click.echo(f"{res['env_id']} ({res['which']}): return {res['mean']:.1f} ± {res['std']:.1f} "
               f"over {episodes} episodes (min {min(res['returns']):.1f}, max {max(res['returns']):.1f})")
    if "video" in res:
        click.echo(f"video: {res['video']['path']} ({res['video']['frames']} frames, return {res['video']['return']:.1f})")
    if "video_error" in res:
        fail(f"video: {res['video_error']}", code=1)


def main() -> None:
    cli(prog_name="aesrl-queue")


if __name__ == "__main__":
    main()
