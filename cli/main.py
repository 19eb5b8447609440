"""The `aesrl-queue` click group: every command a user of a run types.

Library code logs; this module prints. Bad input exits with status 2 and names the field.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path

import click

from aesrl_queue.codec import CodecError, json_default
from aesrl_queue.config import (
    ALGOS,
    LEARNERS,
    MEAN_RULES,
    R_MODES,
    SHIFT_MODES,
    VAR_RULES,
    ConfigError,
    RunConfig,
    parse_sizes,
)
from aesrl_queue.connection import ENV_URL, RedisUnavailable, connect, ping, redact, resolve_url, warn_if_open
from cli.resume import ResumeError, check_resume, given_options

log = logging.getLogger("aesrl_queue.cli")

URL_HELP = f"Redis URL (redis://[:PASSWORD@]HOST:PORT/DB or rediss:// for TLS); default ${ENV_URL} or redis://127.0.0.1:6379/0."


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def fail(message: str, code: int = 2) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


FANOUT_HINT = "pass --fanout-url or set $AESRL_FANOUT_URL"


def _connect(url: str | None, blocking: bool = False, hint: str | None = None):
    """A client for the command; a missing, wrong or refusing Redis ends the command (exit 2) with one
    line, `hint` (default: pass --redis-url or set $AESRL_REDIS_URL) saying where the address comes from.

    The first PING, with a single retry, answers in about a second when nothing listens, and logs
    nothing (the error line says it all); the client returned then retries with backoff, and logs
    outages, like every other one.
    """
    try:
        return _reach(url, blocking, hint)
    except RedisUnavailable as exc:
        fail(str(exc))


def _reach(url: str | None, blocking: bool = False, hint: str | None = None):
    """_connect's client, or RedisUnavailable (one line) for the caller to report."""
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    probe = connect(url, retries=1, check=False, retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 1))
    try:
        ping(probe, resolve_url(url), **({"hint": hint} if hint else {}))
        warn_if_open(probe, resolve_url(url))
    finally:
        probe.close()
    return connect(url, blocking=blocking, check=False)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Logging level of this process.")
def cli(log_level: str) -> None:
    """AES-RL on a Redis task queue: a scheduler, RQ workers on every machine, a critic daemon.

    Quickstart on one machine (embedded Redis): aesrl-queue run --env Pendulum-v1
    """
    setup_logging(log_level)


# -- run-config options shared by `run` and `scheduler start` ----------------------------------------
def _preset_default(field: str, fmt) -> str:
    """`default: ...` for a field that the environment's preset (and --algo td3) may set: the value
    for the paper's MuJoCo environments first, then each preset that differs."""
    import dataclasses

    from aesrl_queue.algorithms import REGISTRY
    from aesrl_queue.config import PAPER_ENVS, preset_for

    base = next(f.default for f in dataclasses.fields(RunConfig) if f.name == field)
    parts = [f"{fmt(base)} for MuJoCo"]
    for stem, env in [(e, e) for e in PAPER_ENVS] + [("Pendulum", "Pendulum-v1")]:
        value = preset_for(stem).get(field, base)
        if value != base:
            parts.append(f"{fmt(value)} for {env}")
    parts += [f"{fmt(a.defaults[field])} with --algo {a.name}" for a in REGISTRY.values() if field in a.defaults]
    return "default: the environment's preset, " + ", ".join(parts)


def _sizes(v) -> str:
    return ",".join(map(str, v))


def config_options(f):
    opts = [
        click.option("--env", "env_id", default=None, help="Gymnasium environment id, e.g. HalfCheetah-v5, Pendulum-v1."),
        click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="TOML or JSON file of config fields (command-line options override it)."),
        click.option("--algo", type=click.Choice(ALGOS), default=None, help="Algorithm (default aesrl)."),
        click.option("--steps", "total_steps", type=int, default=None, help=f"Budget of stored env steps ({_preset_default('total_steps', '{:,}'.format)})."),
        click.option("--seed", type=int, default=None, help="Run seed (μ₀ and every job seed derive from it)."),
        click.option("--mean-rule", type=click.Choice(MEAN_RULES), default=None, help="AES-RL mean update rule."),
        click.option("--var-rule", type=click.Choice(VAR_RULES), default=None, help="AES-RL variance update rule."),
        click.option("--r", "r", default=None,
                     help="Fitness scale r of the mean rule: 'adaptive' (default: robust spread of recent "
                          "f(z)-f(μ)), 'paper' (the paper's r for the environment), or a number."),
        click.option("--fitness-shift", "fitness_shift", default=None,
                     help="Amount per step subtracted from returns when aesrl/es compare individuals: "
                          "'alive' (the env's survival bonus: 1 on Hopper, 0 on HalfCheetah), a number, or 0 "
                          "(the paper). The reported f(μ) stays the env's return."),
        click.option("--fixed-n", type=float, default=None, help="n of the fixed variance rule (default 10)."),
        click.option("--rl-ratio", type=float, default=None, help="Target share of RL individuals ρ* (aesrl 0.9; opo, acemrl 0.5, the paper's)."),
        click.option("--rl-gain", type=float, default=None, help="Gain K of the P controller (default 50)."),
        click.option("--initial-steps", type=int, default=None, help=f"Random-action steps before the first RL job ({_preset_default('initial_steps', '{:,}'.format)})."),
        click.option("--hidden", default=None, help=f"Actor hidden sizes, e.g. 400,300 ({_preset_default('hidden', _sizes)})."),
        click.option("--critic-hidden", default=None, help="Critic hidden sizes, e.g. 400,300."),
        click.option("--learner", type=click.Choice(LEARNERS), default=None,
                     help="Off-policy learner of the critic daemon, the RL jobs and td3: crossq-sac (aesrl's "
                          "default: CrossQ's batch-renormalised critic, 256-256, with SAC's squashed Gaussian "
                          "policy around the actor), crossq (2048-2048 critics, TD3's actor) or td3 (the "
                          "paper's, the other algorithms' default)."),
        click.option("--parallel-critic/--serial-critic", "parallel_critic", default=None,
                     help="pcemrl: train the critic in the critic daemon while jobs run (default: serial, "
                          "between generations)."),
        click.option("--env-kwargs", "env_kwargs", default=None,
                     help='Keyword arguments of gymnasium.make as JSON, e.g. \'{"episode_len": 50}\'.'),
        click.option("--run-id", default=None, help="Name of the run in Redis (default: generated)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def build_config(env_id, config_file, **kw) -> RunConfig:
    """Preset + file + options, validated and resolved against the environment; exit 2 if invalid."""
    # options that take a number or a named mode: the number as a float, a bad value named
    for name, modes, number in (("r", R_MODES, "a positive number"), ("fitness_shift", SHIFT_MODES, "a number >= 0")):
        val = kw.get(name)
        if val is not None and val not in modes:
            try:
                kw[name] = float(val)
            except ValueError:
                fail(f"{name}: must be {number} or one of {', '.join(modes)}, got {val!r}")
    for name in ("hidden", "critic_hidden"):
        if kw.get(name) is not None:
            try:
                kw[name] = parse_sizes(name, kw[name])
            except ConfigError as exc:
                fail(str(exc))
    if kw.get("env_kwargs") is not None:
        try:
            kw["env_kwargs"] = json.loads(kw["env_kwargs"])
        except ValueError as exc:
            fail(f"env_kwargs: expected a JSON object such as '{{\"episode_len\": 50}}' ({exc})")
        if not isinstance(kw["env_kwargs"], dict):
            fail("env_kwargs: expected a JSON object such as '{\"episode_len\": 50}'")
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
@click.option("--run", "run", default=None,
              help="Resume this existing run. Options that restate its config are ignored (and named), options "
                   "that contradict it are refused; --steps sets a new, larger budget.")
@click.option("--resume", is_flag=True, help="If --run-id names an existing run, resume it (as --run does).")
@click.option("--force", is_flag=True,
              help="If --run-id names an existing run, delete it from Redis (and OUT/<run-id> with --out) first.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the run folder OUT/<run-id> (metrics.jsonl as it goes; policy, summary at the end).")
@click.option("--tensorboard", "tensorboard_dir", type=click.Path(file_okay=False), default=None,
              help="Write TensorBoard scalars to DIR/<run-id> (needs the tensorboard extra).")
@click.option("--wandb-project", default=None,
              help="Also log the metrics to this Weights & Biases project (needs the wandb extra; "
                   "WANDB_MODE=offline works without a network).")
@click.option("--device", default="auto",
              help="Torch device of --algo td3, which trains in this process: auto (CUDA if present), cpu, cuda, "
                   "cuda:1, ... (the queue algorithms train on the critic daemon's and the workers' devices).")
@click.option("--fanout-url", envvar="AESRL_FANOUT_URL", default=None,
              help="The fan-out instance: a Redis beside the primary that holds what every host reads (versions, "
                   "critic, the replay's observations) and that the hosts' replicas follow (docs/decisions.md). "
                   "Default: none, the primary serves. [env: AESRL_FANOUT_URL]")
def scheduler_start(redis_url, run, env_id, config_file, resume=False, force=False, out_dir=None,
                    tensorboard_dir=None, wandb_project=None, device="auto", fanout_url=None, **kw) -> None:
    """Run the scheduler loop of a new run (or resume --run RUN) until its step budget is spent.

    An existing run id is never started over silently: --run/--resume continue it, --force deletes it.
    """
    from aesrl_queue.procs import install_signal_handlers
    from aesrl_queue.store import Store
    from aesrl_queue.td3 import pick_device
    from scheduler.loop import make_scheduler

    if run and force:
        fail("force: --run resumes a run, --force deletes one; pass one of them")
    try:
        pick_device(device)
    except (ValueError, RuntimeError) as exc:
        fail(f"device: {exc}")
    client = _connect(redis_url)
    fanout = _connect(fanout_url, hint=FANOUT_HINT) if fanout_url else None
    if not run and kw.get("run_id") and Store(client, kw["run_id"]).exists():
        existing = Store(client, kw["run_id"])
        if resume:
            run = kw["run_id"]
        elif force:
            n = existing.delete()
            if fanout is not None:
                from aesrl_queue.store import Fanout

                n += Fanout(existing, fanout).delete()
            click.echo(f"--force: deleted run {kw['run_id']} from Redis ({n} keys: config, state, μ/var, "
                       "history, results, replay, critic)", err=True)
            if out_dir:
                _force_delete_folder(Path(out_dir) / kw["run_id"])
        else:
            fail(f"run_id: run {kw['run_id']!r} already exists ({_describe(existing)}): resume it with "
                 f"--run {kw['run_id']} (or --resume), or start it over with --force (deletes it)")
    if run:
        store = Store(client, run)
        if not store.exists():
            fail(f"run: no run {run!r} on {redact(redis_url or os.environ.get(ENV_URL, 'the default Redis'))}; "
                 "`aesrl-queue runs` lists them")
        try:
            stored = store.config()
        except CodecError as exc:  # malformed, truncated or planted (a pickle): refuse, never guess
            fail(f"run: the stored config of {run!r} is unusable: {exc}")
        given = given_options(env_id, config_file, {k: v for k, v in kw.items() if k != "run_id" or v != run})
        cfg = _check_resume(store, stored, given)
        _check_fanout(store, fanout)
        # `aesrl-queue run` writes a new run's config, then starts this scheduler with --run.
        started = "started_at" in store.state()
        click.echo(f"{'resuming' if started else 'starting'} run {run} ({cfg.algo} on {cfg.env_id})", err=True)
    else:
        cfg = build_config(env_id, config_file, **kw)
    stop = threading.Event()
    install_signal_handlers(stop)
    blocking = _connect(redis_url, blocking=True)
    sched = make_scheduler(client, blocking, cfg, stop_event=stop, device=device, fanout=fanout)
    click.echo(f"run {cfg.run_id}: scheduler started ({cfg.algo}, {cfg.env_id}, {cfg.actor_dim} parameters)", err=True)
    metrics = _start_metrics(redis_url, cfg, out_dir, tensorboard_dir, wandb_project)
    try:
        status = sched.run()
    finally:
        if metrics is not None:
            _finish_run_folder(metrics, out_dir, cfg.run_id)
    click.echo(f"run {cfg.run_id}: {status}", err=True)


def _describe(store) -> str:
    try:
        cfg, st = store.config(), store.state()
        return (f"{cfg.algo} on {cfg.env_id}, {st['steps']:,}/{cfg.total_steps:,} steps, "
                f"{st.get('status', '?')}")
    except Exception:  # noqa: BLE001 - a description only
        return "unreadable config"


def _check_resume(store, stored, given):
    """The config to resume with (new budget applied in Redis); exit 2 when options contradict it."""
    try:
        cfg, notes = check_resume(stored, given, store.state()["steps"])
    except ResumeError as exc:
        fail(f"resume: {exc}")
    for note in notes:
        click.echo(f"resume: {note}", err=True)
    if cfg.total_steps != stored.total_steps:
        store.replace_config(cfg)
    return cfg


def _check_fanout(store, fanout) -> None:
    """A run keeps the fan-out instance it started with (or none): its workers and critic daemon decided
    where to read and write from its state when they first served it (exit 2 otherwise)."""
    from aesrl_queue.store import FANOUT_FIELD

    named = store.state_field(FANOUT_FIELD, cast=str, default=None)
    if "started_at" in store.state() and bool(named) != (fanout is not None):
        fail(f"fanout-url: run {store.run_id} " + (f"was started with the fan-out instance {named}: pass its URL"
                                                    if named else "was started without a fan-out instance: "
                                                    "resume it without --fanout-url"))


def _force_delete_folder(run_dir) -> None:
    import shutil

    if run_dir.exists():
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in run_dir.iterdir())
        shutil.rmtree(run_dir)
        click.echo(f"--force: deleted {run_dir} ({', '.join(names) or 'empty'})", err=True)


def _start_metrics(redis_url, cfg, out_dir, tensorboard_dir, wandb_project=None):
    """A MetricsWriter thread for `scheduler start --out/--tensorboard` (None when neither is given)."""
    if not out_dir and not tensorboard_dir and not wandb_project:
        return None
    from pathlib import Path

    from aesrl_queue.metrics import MetricsWriter

    run_dir = Path(out_dir or "runs") / cfg.run_id
    try:
        writer = MetricsWriter(_connect(redis_url), cfg.run_id, run_dir / "metrics.jsonl",
                               tensorboard_dir=Path(tensorboard_dir) / cfg.run_id if tensorboard_dir else None,
                               wandb_project=wandb_project)
    except ImportError as exc:
        fail(f"{'wandb' if 'wandb' in str(exc) else 'tensorboard'}: {exc}")
    click.echo(f"run {cfg.run_id}: metrics in {run_dir / 'metrics.jsonl'}"
               + (f", TensorBoard in {Path(tensorboard_dir) / cfg.run_id}" if tensorboard_dir else ""), err=True)
    return writer.start()


def _finish_run_folder(metrics, out_dir, run_id) -> None:
    from aesrl_queue.local import write_run_folder
    from aesrl_queue.store import Store

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
@click.option("--cuda-graph/--no-cuda-graph", default=True,
              help="On CUDA, replay one critic step captured as a CUDA graph (~7× the steps/s of launching its "
                   "kernels one by one; docs/performance.md). No effect on the CPU.")
@click.option("--fanout-url", envvar="AESRL_FANOUT_URL", default=None,
              help="The fan-out instance: a Redis beside the primary that holds what every host reads (versions, "
                   "critic, the replay's observations) and that the hosts' replicas follow (docs/decisions.md). "
                   "Default: none, the primary serves. [env: AESRL_FANOUT_URL]")
def critic_start(redis_url, run, device, wait, cuda_graph=True, fanout_url=None) -> None:
    """Train the TD3 critic of a run continuously and republish its weights."""
    import torch

    from aesrl_queue.procs import install_signal_handlers
    from aesrl_queue.store import Store, list_runs
    from workers.critic import CriticDaemon, FanoutMissing

    torch.set_num_threads(int(os.environ.get("AESRL_TORCH_THREADS", "1")))
    client = _connect(redis_url)
    deadline = time.monotonic() + wait
    said = False
    while True:
        if run is None:
            runs = list_runs(client)
            chosen = runs[-1][0] if runs else None
        else:
            chosen = run
        if chosen and Store(client, chosen).exists():
            break
        # A critic may start before its scheduler (docker-compose starts both), so it waits for the run;
        # it says so at once, with the runs that are there, so that a typo in --run shows in a second.
        what = "a run" if run is None else f"run {run!r}"
        if not said:
            said = True
            click.echo(f"critic: waiting up to {wait:.0f} s for {what} on {redact(resolve_url(redis_url))} "
                       f"({_runs_there(client, run)})", err=True)
        if time.monotonic() > deadline:
            fail(f"run: no {what} on {redact(resolve_url(redis_url))} after {wait:.0f} s "
                 f"({_runs_there(client, run)}); `aesrl-queue runs` lists them")
        time.sleep(0.5)
    stop = threading.Event()
    install_signal_handlers(stop)
    try:
        daemon = CriticDaemon(client, _connect(redis_url, blocking=True), chosen, device=device, stop_event=stop,
                              cuda_graph=cuda_graph, fanout=_connect(fanout_url, hint=FANOUT_HINT) if fanout_url else None)
    except CodecError as exc:  # a CodecError is a ValueError too: not a device problem
        fail(f"run: the stored config of {chosen!r} is unusable: {exc}")
    except FanoutMissing as exc:
        fail(f"fanout-url: {exc}")
    except ValueError as exc:
        fail(f"device: {exc}")
    click.echo(f"critic daemon for run {chosen} on {daemon.device}", err=True)
    daemon.run()


def _runs_there(client, run: str | None) -> str:
    """The runs on a Redis, the closest to `run` named first: "runs there: a, b; did you mean a?"."""
    import difflib

    from aesrl_queue.store import list_runs

    ids = [run_id for run_id, _ in list_runs(client)]
    if not ids:
        return "no runs there yet"
    close = difflib.get_close_matches(run, ids, n=1, cutoff=0.6) if run else []
    shown = ", ".join(ids[-10:]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
    return f"runs there: {shown}" + (f"; did you mean {close[0]!r}?" if close else "")


# -- workers ------------------------------------------------------------------------------------------
@cli.command()
@click.option("--redis-url", envvar=ENV_URL, default=None, help=URL_HELP)
@click.option("--processes", "-n", type=int, default=os.cpu_count() or 1, help="Worker processes to start (one per core).")
@click.option("--burst", is_flag=True, help="Exit when the queues are empty.")
@click.option("--replica/--no-replica", default=True,
              help="Start and supervise this machine's replica of the run data (redis-server --replicaof, with a "
                   "password of its own); the workers read μ/var, critic and replay from it. Needs redis-server.")
@click.option("--replicate-from", envvar="AESRL_REPLICATE_FROM", default=None,
              help="What the replica follows: the primary (default) or another host's replica, as a URL with its "
                   "password (a tree of hosts). [env: AESRL_REPLICATE_FROM]")
@click.option("--replica-bind", default="127.0.0.1", show_default=True,
              help="Address the replica listens on (another host that replicates this one must reach it).")
@click.option("--replica-port", type=int, default=None, help="Port of the replica (default: a free one).")
@click.option("--read-url", envvar="AESRL_READ_URL", default=None,
              help="A replica you run yourself to read from instead of starting one. [env: AESRL_READ_URL]")
@click.option("--fanout-url", envvar="AESRL_FANOUT_URL", default=None,
              help="The fan-out instance: a Redis beside the primary that holds what every host reads (versions, "
                   "critic, the replay's observations) and that this host's replica follows (docs/decisions.md). "
                   "Default: none, the primary serves. [env: AESRL_FANOUT_URL]")
def worker(redis_url, processes, burst, replica, replicate_from, replica_bind, replica_port, read_url,
           fanout_url=None) -> None:
    """Start N `rq worker -w workers.AesrlWorker` processes on this machine, and the machine's replica.

    The replica's password is $AESRL_REPLICA_PASSWORD (set it where another host replicates this one),
    else a random one that only these workers get."""
    from aesrl_queue.connection import resolve_url

    if processes < 1:
        fail("processes: must be at least 1")
    _check_rq()
    primary = _connect(redis_url)
    url = resolve_url(redis_url)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if fanout_url:
        from aesrl_queue.connection import FANOUT_ENV

        _connect(fanout_url, hint=FANOUT_HINT)  # fail now, with the message, not in every job
        env[FANOUT_ENV] = fanout_url
    if read_url:
        from workers.replica import READ_URL_ENV, ReplicaError, reader_for

        try:
            reader_for(primary, read_url).check()
        except (ReplicaError, RedisUnavailable) as exc:
            fail(f"read-url: {exc}")
        env[READ_URL_ENV] = read_url
        click.echo(f"reading run data from replica {redact(read_url)}", err=True)
    elif replica:
        host = _start_replica(primary, replicate_from or fanout_url or url, replica_bind, replica_port)
        if host is not None:
            env["AESRL_READ_URL"] = host.url
    from aesrl_queue.procs import spawn, worker_command

    # Each worker gets SIGTERM (RQ's warm shutdown: the job in hand finishes) if this process dies,
    # even by kill -9: no orphaned workers keep taking jobs.
    procs = [spawn(worker_command(url, burst), env=env, death_signal=signal.SIGTERM) for _ in range(processes)]
    click.echo(f"started {processes} worker{'s' if processes != 1 else ''} on {redact(url)}", err=True)

    def stop(signum, frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    codes = [p.wait() for p in procs]
    sys.exit(max(codes) if codes else 0)


def _start_replica(primary, source: str, bind: str, port: int | None):
    """This machine's replica of `source` (workers/host_replica.py), supervised and reporting to the
    primary; None (and the workers read the primary) when this machine has no redis-server."""
    import atexit

    from aesrl_queue.redis_server import find_redis_server
    from workers.host_replica import HostReplica

    try:
        find_redis_server()
    except (FileNotFoundError, RuntimeError) as exc:
        click.echo(f"no host replica ({exc}); workers read everything from the primary", err=True)
        return None
    host = HostReplica(source, primary=primary, bind=bind, port=port)
    try:
        host.start()
    except RuntimeError as exc:
        click.echo(f"no host replica ({exc}); workers read everything from the primary", err=True)
        return None
    atexit.register(host.stop)
    synced = host.wait_synced(10.0)
    click.echo(f"host replica on {redact(host.url)} (replicaof {redact(source)}, "
               f"{'in sync' if synced else 'still syncing: reads go to the primary meanwhile'})", err=True)
    return host


# -- status and runs ----------------------------------------------------------------------------------
@cli.command()
@click.option("--redis-url", envvar=ENV_URL, default=None, help=URL_HELP)
@click.option("--run", "run", default=None,
              help="Run to show: a run id (default: the newest), or a run folder of `aesrl-queue run`, read from a "
                   "copy of its Redis data unless --redis-url is given.")
@click.option("--watch", is_flag=True,
              help="Refresh about once a second until Ctrl-C (a plain line a second when stdout is not a terminal).")
@click.option("--until-done", is_flag=True, help="With --watch: exit when the run is finished, stopped or failed.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, help="Seconds between --watch refreshes.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.pass_context
def status(ctx, redis_url, run, watch, until_done, interval, as_json) -> None:
    """Live population statistics of a run: f(μ), σ, steps, RL share, jobs, critic, workers."""
    folder = Path(run) if run and Path(run).is_dir() else None
    if folder is not None:
        try:
            run = str(json.loads((folder / "config.json").read_text())["run_id"])
        except (OSError, ValueError, KeyError, TypeError):
            fail(f"run: {folder} is not a run folder (no config.json with a run_id)")
        if ctx.get_parameter_source("redis_url") != click.core.ParameterSource.COMMANDLINE:
            if not (folder / "redis").is_dir():
                fail(f"run: {folder} keeps no Redis data (its run was on another Redis): pass that --redis-url "
                     f"and --run {run}")
            with _folder_redis(folder) as url:
                _status(url, run, watch, until_done, interval, as_json)
            return
    _status(redis_url, run, watch, until_done, interval, as_json)


@contextlib.contextmanager
def _folder_redis(folder: Path):
    """The URL of a private redis-server on a copy of a run folder's Redis data, for as long as the
    block runs: the folder is left as it is (no log line, no AOF rewrite), even while its run goes on."""
    from aesrl_queue.redis_server import RedisVersionError, folder_copy

    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(folder_copy(folder))
        except RedisVersionError as exc:
            fail(f"run: {exc}")
        click.echo(f"status of {folder} from a copy of its Redis data (a run that still goes: pass the "
                   "--redis-url its `run` printed for live numbers)", err=True)
        yield server.url


def _status(redis_url, run, watch, until_done, interval, as_json) -> None:
    from aesrl_queue.store import list_runs
    from cli.report import render, safe_gather

    client = _connect(redis_url)
    if run is None:
        runs = list_runs(client)
        if not runs:
            from aesrl_queue.connection import resolve_url

            where = redact(resolve_url(redis_url))
            fail(f"run: no runs on {where}" + ("" if redis_url else f" (the default: pass --redis-url or set {ENV_URL}; "
                                                                    "a local `aesrl-queue run` prints its Redis URL as it starts)"))
        run = runs[-1][0]
    if watch or until_done:
        from cli.watch import watch_status

        watch_status(client, run, interval=interval, until_done=until_done)
        return
    s = safe_gather(client, run)
    if isinstance(s, str):
        fail(f"run: {s}")
    click.echo(json.dumps(s, default=json_default) if as_json else render(s))


@cli.command()
@click.option("--redis-url", "redis_urls", envvar=ENV_URL, multiple=True,
              help=URL_HELP + " Repeat it (or list the URLs in the variable, space-separated) for a lab with several "
                              "primaries: one table with the primary of each run, and a line for one that does not answer.")
def runs(redis_urls) -> None:
    """List the runs on a Redis (or on several primaries) with their status, steps and f(μ)."""
    from aesrl_queue.store import Store, list_runs

    urls = list(redis_urls) or [None]
    several = len(urls) > 1
    rows, down = [], []
    for url in urls:
        if several:
            try:
                client = _reach(url)
            except RedisUnavailable as exc:  # the others are still listed
                down.append(str(exc).splitlines()[0])
                continue
        else:
            client = _connect(url)
        for run_id, created in list_runs(client):
            rows.append((redact(resolve_url(url)), run_id, created, Store(client, run_id).state()))
    if not rows:
        click.echo("no runs")
    else:
        where = f"{'primary':32} " if several else ""
        click.echo(f"{where}{'run':48} {'status':9} {'steps':>10} {'f(μ)':>10}  created")
        for primary, run_id, created, st in rows:
            f_mu = st.get("f_mu", math.nan)
            click.echo(f"{(f'{primary:32} ' if several else '')}{run_id:48} {st.get('status', '?'):9} {st['steps']:>10,} "
                       f"{(format(f_mu, '.1f') if math.isfinite(f_mu) else '-'):>10}  "
                       f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(created))}")
    for line in down:
        click.echo(f"problem: {line}", err=True)
    if down:
        raise SystemExit(1)


# -- config: the resolved settings of a run, as a file to edit ------------------------------------------
@cli.group("config")
def config_group() -> None:
    """Run configurations."""


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value), ensure_ascii=False)  # a TOML basic string


def config_toml(cfg: RunConfig, keep_run_id: bool = False) -> str:
    """The settings of `cfg` as TOML, each under a comment with its help (and "departure" where it is
    this project's departure from the paper), ready for `run --config FILE`."""
    from aesrl_queue.config import field_docs

    lines = [f"# aesrl-queue run config: {cfg.algo} on {cfg.env_id} (aesrl-queue config show)",
             "# run it with: aesrl-queue run --config FILE (options given beside --config override it)", ""]
    for name, default, help_text, departure in field_docs():
        value = getattr(cfg, name)
        if name == "run_id" and not keep_run_id:
            value = ""
        note = "  [departure from the paper: docs/decisions.md]" if departure else ""
        changed = "" if value == default or name in ("env_id", "run_id") else f"  [default {_toml_value(default)}]"
        lines.append(f"# {help_text}{note}{changed}")
        lines.append(f"{name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


@config_group.command("show")
@click.option("--env", "env_id", default=None, help="Gymnasium environment id, e.g. Pendulum-v1.")
@click.option("--algo", type=click.Choice(ALGOS), default=None, help="Algorithm (default aesrl).")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A TOML or JSON file of config fields to start from (--env overrides its env_id).")
def config_show(env_id, algo, config_file) -> None:
    """Print the resolved config of a run as TOML, one comment per field: the environment's preset
    and the algorithm's defaults applied. Save it, edit it, and pass it back with `run --config FILE`."""
    cfg = build_config(env_id, config_file, algo=algo)
    keep = False
    if config_file:
        import tomllib

        try:
            text = Path(config_file).read_text()
            data = tomllib.loads(text) if config_file.endswith(".toml") else json.loads(text)
            keep = bool(data.get("run_id"))
        except (OSError, ValueError, AttributeError):
            keep = False
    click.echo(config_toml(cfg, keep_run_id=keep), nl=False)


# -- run: everything on one machine -------------------------------------------------------------------
@cli.command("run")
@click.option("--redis-url", default=None,
              help="Use this Redis instead of starting an embedded one (redis://[:PASSWORD@]HOST:PORT/DB or "
                   f"rediss://). ${ENV_URL} is not read here: a local run never lands on a shared Redis by accident.")
@config_options
@click.option("--workers", "n_workers", type=int, default=None, help="Local worker processes (default: cores).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="runs", help="Folder for run folders.")
@click.option("--resume", "resume", default=None, metavar="RUN",
              help="Continue RUN (a run folder, or a run id under --out) after Ctrl-C, kill -9 or a reboot.")
@click.option("--force", is_flag=True, help="Delete an existing run of the same --run-id (folder and Redis) first.")
@click.option("--snapshot-every", type=float, default=10.0,
              help="Minutes between policy.npz snapshots of the current μ (0: only at the end).")
@click.option("--snapshot-steps", default="", metavar="N,N,...",
              help="Also write the policy to snapshots/steps-N.npz when the stored steps first reach each N "
                   "(checked once a second, so up to a second and an episode per worker late).")
@click.option("--snapshot-interactions", default="", metavar="N,N,...",
              help="The same at N needed interactions, snapshots/interactions-N.npz: stored steps plus the f(μ) "
                   "episodes of aesrl/es/opo/acemrl (td3's and CEM-RL's evaluation episodes left out).")
@click.option("--no-critic", is_flag=True, help="Do not start a local critic daemon (one runs elsewhere).")
@click.option("--tensorboard", "tensorboard_dir", type=click.Path(file_okay=False), default=None,
              help="Write TensorBoard scalars to DIR/<run-id> (needs the tensorboard extra).")
@click.option("--wandb-project", default=None,
              help="Also log the metrics to this Weights & Biases project (needs the wandb extra; "
                   "WANDB_MODE=offline works without a network).")
@click.option("--virtual-workers", type=int, default=None, metavar="N",
              help="Run N workers in virtual time in this one process, deterministically (aesrl_queue/virtual.py): "
                   "the same seed and cost model give the same metrics.jsonl.")
@click.option("--cost-model", type=click.Path(exists=True, dir_okay=False), default=None,
              help="With --virtual-workers: the cost model's JSON file (`aesrl-queue calibrate` writes one); "
                   "default: nominal durations.")
def run_cmd(redis_url, env_id, config_file, n_workers, out_dir, resume, force, snapshot_every, no_critic,
            tensorboard_dir=None, wandb_project=None, snapshot_steps="", snapshot_interactions="",
            virtual_workers=None, cost_model=None, **kw) -> None:
    """Everything on one machine: embedded Redis, scheduler, critic daemon and N workers.

    Shows progress, and at the end (or on Ctrl-C) stops every child and writes a run folder with
    config.json, metrics.jsonl, policy.npz (μ; also every --snapshot-every minutes) and summary.json.
    The embedded Redis keeps an AOF in the run folder: `run --resume RUN_FOLDER` continues the run.
    An existing run id is refused unless --resume or --force is given. Ctrl-C stops the run within a
    few seconds (a second one kills the children at once; policy.npz and summary.json are written
    either way).

    \b
    The progress line, e.g.
      f(μ)~ -812.4  12,600/40,000 (32%)  412 steps/s  ETA 1m06s  elapsed 0m31s
      μ v88  results es 60 rl 28  critic v9  training RL individuals (2)
    f(μ)~      mean of the last 10 estimates of f(μ), the return of μ (the
               mean policy), each one episode or an antithetic ES pair's mean
    N/M (P%)   stored env steps of the budget
    steps/s    stored steps per second since the random phase ended
    ETA        the steps left at that rate
    elapsed    time since the progress line started
    μ vN  results es N rl N  critic vN
               version of μ (the results that moved it), ES and RL
               results applied (random-phase ones and those that left
               μ where it was included), version of the critic
    phase      what the run waits for, when it waits: random actions (before
               --initial-steps), waiting for critic, critic N steps behind,
               training RL individuals (RL jobs in hand, no step stored for
               3 s), or a problem and what to do
    """
    from aesrl_queue.store import Store
    from cli.launch import launch

    n = n_workers if n_workers is not None else max(1, (os.cpu_count() or 2))
    if n < 1:
        fail("workers: must be at least 1")
    if snapshot_every < 0:
        fail("snapshot_every: must be 0 (off) or a number of minutes")
    marks = {}
    for name, text in (("snapshot_steps", snapshot_steps), ("snapshot_interactions", snapshot_interactions)):
        try:
            marks[name] = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            fail(f"{name}: expected comma-separated whole numbers, got {text!r}")
        if any(n <= 0 for n in marks[name]):
            fail(f"{name}: every milestone must be positive")
    if resume and force:
        fail("force: --resume continues a run, --force deletes one; pass one of them")
    if virtual_workers is not None:
        clash = [name for name, value in (("--redis-url", redis_url), ("--resume", resume), ("--workers", n_workers),
                                          ("--no-critic", no_critic), ("--tensorboard", tensorboard_dir),
                                          ("--wandb-project", wandb_project), ("--snapshot-steps", snapshot_steps),
                                          ("--snapshot-interactions", snapshot_interactions)) if value]
        if clash:
            fail(f"virtual_workers: a virtual run is one process on its own embedded Redis; drop {', '.join(clash)}")
    elif cost_model:
        fail("cost_model: only a virtual run has one; add --virtual-workers N")
    # before any folder is made; $AESRL_REDIS_URL plays no part in a local run, so the hint leaves it out
    client = _connect(redis_url, hint="check --redis-url, or leave it out for an embedded Redis") if redis_url else None
    _check_extras(tensorboard_dir, wandb_project)
    _check_rq()
    if resume:
        run_dir = Path(resume) if Path(resume).is_dir() else Path(out_dir) / resume
        if (run_dir / "virtual.json").is_file():
            clash = [name for name, value in (("--redis-url", redis_url), ("--workers", n_workers),
                                              ("--no-critic", no_critic), ("--tensorboard", tensorboard_dir),
                                              ("--wandb-project", wandb_project), ("--snapshot-steps", snapshot_steps),
                                              ("--snapshot-interactions", snapshot_interactions)) if value]
            if clash:
                fail(f"resume: {run_dir} is a virtual run (its workers and cost model in virtual.json); "
                     f"drop {', '.join(clash)}")
            from cli.launch import launch_virtual_resume

            sys.exit(launch_virtual_resume(run_dir, given_options(env_id, config_file, kw)))
        if redis_url is None and not (run_dir / "redis").is_dir():
            fail(f"resume: {run_dir} is not a run folder with its Redis data (redis/); "
                 "`aesrl-queue run` writes one, `run --redis-url` keeps the run in that Redis instead")
        if redis_url is not None and not Store(client, run_dir.name).exists():
            fail(f"resume: no run {run_dir.name!r} on {redact(redis_url)}; `aesrl-queue runs` lists them")
        given = given_options(env_id, config_file, kw)

        def check(store):
            from aesrl_queue.local import Refused

            if not store.exists():
                raise Refused(f"resume: the Redis data in {run_dir / 'redis'} holds no run {store.run_id!r}")
            try:
                return check_resume(store.config(), given, store.state()["steps"])
            except ResumeError as exc:
                raise Refused(f"resume: {exc}") from None

        code = launch(None, n_workers=n, redis_url=redis_url, out_dir=str(run_dir.parent),
                      start_critic=not no_critic, tensorboard_dir=tensorboard_dir, resume=check,
                      snapshot_every=snapshot_every * 60.0, run_dir=run_dir, wandb_project=wandb_project, **marks)
        sys.exit(code)
    cfg = build_config(env_id, config_file, **kw)
    run_dir = Path(out_dir) / cfg.run_id
    in_redis = client is not None and Store(client, cfg.run_id).exists()
    if run_dir.exists() and any(run_dir.iterdir()) or in_redis:
        if not force:
            where = " and ".join(w for w, there in ((str(run_dir), run_dir.exists()),
                                                   (redact(redis_url or ""), in_redis)) if there)
            fail(f"run_id: run {cfg.run_id!r} already exists ({where}): continue it with --resume {run_dir}, "
                 "start it over with --force (deletes it), or pick another --run-id")
        _force_delete_folder(run_dir)
        if in_redis:
            keys = Store(client, cfg.run_id).delete()
            click.echo(f"--force: deleted run {cfg.run_id} from {redact(redis_url)} ({keys} keys)", err=True)
    if virtual_workers is not None:
        from cli.launch import launch_virtual

        sys.exit(launch_virtual(cfg, virtual_workers, cost_model, out_dir))
    code = launch(cfg, n_workers=n, redis_url=redis_url, out_dir=out_dir, start_critic=not no_critic,
                  tensorboard_dir=tensorboard_dir, snapshot_every=snapshot_every * 60.0, wandb_project=wandb_project,
                  **marks)
    sys.exit(code)


@cli.command()
@config_options
@click.option("--out", "out_file", type=click.Path(dir_okay=False), default="cost-model.json",
              help="The cost-model file to write.")
@click.option("--workers", "fit_workers", type=click.IntRange(min=1), default=None,
              help="Also run a short real es run with this many worker processes here and fit the model to "
                   "it: job durations as those workers take them on this machine's cores, and the workers' "
                   "time between jobs (worker_gap_s) and the spread of durations (duration_spread), which "
                   "are 0 otherwise.")
def calibrate(env_id, config_file, out_file, fit_workers, **kw) -> None:
    """Measure a virtual run's cost model on this machine for a run's config (its environment, network
    and learner): seconds per environment step and per RL actor step, learner steps per second, and the
    round trips of a result and of a μ version, each with one core. Takes under a minute (--workers N
    adds a real run of about 20 jobs per worker); `run --virtual-workers N --cost-model FILE` uses the file."""
    from aesrl_queue.cost_model import FIELDS
    from aesrl_queue.cost_model import calibrate as measure
    from cli.launch import fit_to_workers

    cfg = build_config(env_id, config_file, **kw)
    model, notes = measure(cfg)
    if fit_workers:
        click.echo(f"fitting to a real es run with {fit_workers} workers ...", err=True)
        model, fit = fit_to_workers(cfg, model, fit_workers)
        notes["fit"] = fit
    path = model.save(out_file, notes)
    for name, value in model.to_dict().items():
        click.echo(f"  {name:20} {value:<12.6g} {FIELDS[name]}")
    click.echo(f"wrote {path} ({cfg.env_id}, learner {cfg.learner} on {notes['learner_device']})")


def _check_rq() -> None:
    """Refuse an RQ that AesrlWorker cannot run on before any worker starts."""
    from workers.worker import rq_problem

    problem = rq_problem()
    if problem:
        fail(problem)


def _check_extras(tensorboard_dir, wandb_project) -> None:
    """Refuse a missing optional package before anything starts."""
    if tensorboard_dir:
        from aesrl_queue.metrics import TENSORBOARD_MISSING

        try:
            import tensorboard  # noqa: F401
        except ImportError:
            fail(f"tensorboard: {TENSORBOARD_MISSING}")
    if wandb_project:
        from aesrl_queue.metrics import WANDB_MISSING

        try:
            import wandb  # noqa: F401
        except ImportError:
            fail(f"wandb: {WANDB_MISSING}")


# -- results: plot, export, evaluate -------------------------------------------------------------------
@cli.command()
@click.argument("run_folders", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--out", "out", default=None, type=click.Path(dir_okay=False),
              help="PNG to write (default: curves.png in the run folder, or in the folder that holds the run "
                   "folders, e.g. runs/curves.png).")
@click.option("--title", default=None, help="Figure title (default: the environments and run counts).")
@click.option("--x", "x_axis", type=click.Choice(["steps", "interactions"]), default="steps",
              help="x-axis of the f(μ) curve: stored steps (the paper's), or every environment interaction "
                   "(μ evaluations included).")
@click.option("--label", "label_fields", default=None, metavar="FIELD,...",
              help="Config fields to name in each curve's label, e.g. mean_rule,rl_ratio (default: the "
                   "algorithm alone, and what tells apart runs of one algorithm); --label seed draws a curve per seed.")
def plot(run_folders, out, title, x_axis, label_fields) -> None:
    """Learning curves (f(μ) vs stored steps and vs wall clock) and the ES/RL interaction chart of run folders.

    Runs whose configs differ only by seed are drawn as one curve: the mean with a ±1 std band.
    """
    from cli.plot import LabelError, PlotError, plot_runs

    fields = [f.strip() for f in (label_fields or "").split(",") if f.strip()]
    if out is None:
        parents = {Path(f).resolve().parent for f in run_folders}
        where = Path(run_folders[0]) if len(run_folders) == 1 else Path(run_folders[0]).parent if len(parents) == 1 \
            else Path("runs")
        out = str(where / "curves.png")
    try:
        drawn = plot_runs(list(run_folders), out, title=title, x_axis=x_axis, label_fields=fields)
    except LabelError as exc:
        fail(str(exc))
    except PlotError as exc:
        fail(str(exc), code=1)
    except ModuleNotFoundError as exc:
        if exc.name != "matplotlib":
            raise
        fail("plot: needs matplotlib, the plot extra: pip install -e '.[plot]' in the clone "
             "(./scripts/aesrl-queue plot installs it)")
    for why in drawn["skipped"]:
        click.echo(f"skipped: {why}", err=True)
    for label, run_ids in drawn["groups"].items():
        click.echo(f"{label}: {len(run_ids)} run{'s' if len(run_ids) != 1 else ''} ({', '.join(run_ids)})")
    click.echo(f"wrote {drawn['out']}")


@cli.command()
@click.argument("run")
@click.option("-o", "--out", "out", default=None, type=click.Path(dir_okay=False),
              help="File to write (default: policy.pt, or best.pt with --which best, in the run folder; "
                   "runs/RUN-policy.pt for a run id).")
@click.option("--which", type=click.Choice(["mu", "best"]), default="mu",
              help="mu: the current mean of the search distribution; best: the best individual evaluated.")
@click.option("--redis-url", envvar=ENV_URL, default=None, help="Read RUN (a run id) from this Redis. " + URL_HELP)
def export(run, out, which, redis_url) -> None:
    """Write a run's policy (RUN: a run folder, or a run id with --redis-url) with the config to rebuild it."""
    from pathlib import Path

    from cli.export import ExportError, export_policy

    client = None if Path(run).exists() else _connect(redis_url)
    if out is None:
        name = "policy.pt" if which == "mu" else "best.pt"
        folder = Path(run) if Path(run).is_dir() else Path(run).parent
        out = str(folder / name if client is None else Path("runs") / f"{run}-{name}")
    try:
        payload = export_policy(run, out, which=which, client=client)
    except ExportError as exc:
        fail(str(exc))
    src = payload["source"]
    def num(x):
        return format(x, ".1f") if isinstance(x, float) and math.isfinite(x) else "-"

    extra = (f"version {src.get('mu_version')}, last f(μ) {num(src.get('f_mu'))}" if which == "mu"
             else f"f(z) {num(src.get('fitness'))}, {src.get('kind')} individual")
    click.echo(f"wrote {out}: {which} of {payload['env_id']} ({payload['params'].numel():,} parameters; {extra})")


@cli.command()
@click.argument("policy", type=click.Path(exists=True))
@click.option("--episodes", "-n", type=click.IntRange(min=1), default=10, help="Episodes to run.")
@click.option("--seed", type=int, default=0, help="Episode i resets the environment with seed + i.")
@click.option("--video", "video_dir", type=click.Path(file_okay=False), default=None,
              help="Film the first episode into this folder (needs the video extra).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def evaluate(policy, episodes, seed, video_dir, as_json) -> None:
    """Run a policy deterministically and print its mean ± std return.

    POLICY: a file from `export`, a run folder, or its policy.npz (the run's μ)."""
    import torch

    from cli.export import VIDEO_MISSING, ExportError, evaluate_policy

    torch.set_num_threads(1)
    if video_dir is not None and importlib.util.find_spec("imageio_ffmpeg") is None:
        fail(VIDEO_MISSING)  # before the episodes, not after them
    try:
        res = evaluate_policy(policy, episodes=episodes, seed=seed, video_dir=video_dir)
    except ExportError as exc:
        fail(str(exc))
    if as_json:
        click.echo(json.dumps(res, default=json_default))
        sys.exit(1 if "video_error" in res else 0)
    click.echo(f"{res['env_id']} ({res['which']}): return {res['mean']:.1f} ± {res['std']:.1f} "
               f"over {episodes} episodes (min {min(res['returns']):.1f}, max {max(res['returns']):.1f})")
    if "video" in res:
        click.echo(f"video: {res['video']['path']} ({res['video']['frames']} frames, return {res['video']['return']:.1f})")
    if "video_error" in res:
        fail(f"video: {res['video_error']}", code=1)


def one_line_error(exc: BaseException) -> str | None:
    """What to tell the user about an exception that reached the top of a command, in one line;
    None for one that is a bug (it gets a one-line message too, and its traceback in a file)."""
    import redis

    from cli.export import ExportError

    if isinstance(exc, RedisUnavailable | ExportError | ConfigError):
        return str(exc)
    if isinstance(exc, redis.AuthenticationError) or "NOAUTH" in str(exc):
        return (f"Redis refused the credentials ({exc}): put the password in the URL "
                "(redis://:PASSWORD@host:6379/0)")
    if isinstance(exc, redis.exceptions.InvalidResponse):
        return (f"the server does not answer as Redis ({exc}): check the host and port of --redis-url "
                f"(or ${ENV_URL})")
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return f"lost Redis ({exc}): is redis-server running? check --redis-url (or ${ENV_URL})"
    if isinstance(exc, CodecError):
        return f"unusable data: {exc}"
    if isinstance(exc, ModuleNotFoundError):  # a custom env's module (--env mypkg.envs:MyEnv-v0)
        return f"{str(exc).splitlines()[0]} — put its package on PYTHONPATH (on every machine that runs workers)"
    gym = sys.modules.get("gymnasium")
    if gym is not None and isinstance(exc, gym.error.Error):
        return f"environment: {exc}"
    if isinstance(exc, FileNotFoundError | IsADirectoryError | NotADirectoryError | PermissionError):
        return f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return None


def main() -> None:
    """The command line. An error that reaches this point is printed as one line (exit 2); an
    unexpected one also gets its traceback written to a file, named in that line (exit 1), or
    printed where AESRL_TRACEBACK=1 (the children of `run`, whose stderr is a log file)."""
    try:
        code = cli.main(prog_name="aesrl-queue", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # `aesrl-queue runs | head -1`: the reader has all it wanted
        from cli.launch import _silence

        _silence(sys.stdout)
        sys.exit(0)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the one place where errors become messages
        message = one_line_error(exc)
        if message is not None:
            click.echo(f"error: {message}", err=True)
            sys.exit(2)
        import tempfile
        import traceback

        if os.environ.get("AESRL_TRACEBACK") == "1":  # a child of `run`: its stderr is a log file
            raise
        fd, path = tempfile.mkstemp(prefix="aesrl-queue-error-", suffix=".txt")
        with os.fdopen(fd, "w") as fh:
            traceback.print_exc(file=fh)
        click.echo(f"error: unexpected {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
                   f"(a bug: the traceback is in {path})", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
