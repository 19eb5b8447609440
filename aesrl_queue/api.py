"""The Python API: `train` a run from a script or a notebook, `load` a run folder (docs/api.md).

    import aesrl_queue as aq

    run = aq.train("Pendulum-v1", steps=20_000, workers=2)
    run.metrics                       # the records of metrics.jsonl (a DataFrame with pandas)
    run.policy(obs)                   # the action of μ, the mean of the search distribution
    run.evaluate(episodes=10)         # {"mean": ..., "std": ..., "returns": [...]}
    aq.load("runs/<run id>").resume(steps=40_000)

`train` is `aesrl-queue run` without the terminal: the same child processes, run folder and
resumable embedded Redis (aesrl_queue/local.py), with a tqdm bar instead of the progress line.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from aesrl_queue.config import ConfigError, RunConfig
from aesrl_queue.envs import ENV_IDS, ENVS_VAR
from aesrl_queue.local import JobsFail, LocalRun, Refused, Terminated, _raise_terminated, _received
from aesrl_queue.progress import Snapshot

ENVS_FILE = "envs.json"  # the registrations a run's environment needs (see _env_registration)


class RunError(RuntimeError):
    """A run did not start or its scheduler failed; the message says why and where the logs are."""


# -- environments ------------------------------------------------------------------------------------
def _entry_point(ep: Any, env_id: str) -> str:
    if isinstance(ep, str):
        return ep
    module, name = getattr(ep, "__module__", None), getattr(ep, "__qualname__", None)
    if not module or not name or module == "__main__" or "<locals>" in name:
        raise ConfigError("env_id", f"{env_id} is made by {ep!r}, defined in the script or notebook that runs "
                                    "train(): the workers are other processes and cannot import it; put the "
                                    "class in a module file and pass env='module:Class' (docs/api.md)")
    return f"{module}:{name}"


def _env_registration(env: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """The env id every process can make, and the gymnasium registrations to hand to the children.

    - a gymnasium id ("Pendulum-v1"), or "module:Env-v0" (gymnasium imports the module, whose
      import registers the id): as it is;
    - "module:Class", a gymnasium.Env subclass: registered as the id "Class";
    - an id the caller's own code registered: its registration (entry point as "module:Class").
    """
    import gymnasium as gym

    import aesrl_queue.envs  # noqa: F401  (registers the project's and $AESRL_ENVS's environments)

    if not isinstance(env, str) or not env:
        raise ConfigError("env_id", f"pass a gymnasium id or 'module:Class', not {env!r}")
    if ":" in env:
        module_name, name = env.split(":", 1)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError("env_id", f"cannot import {module_name!r} of {env!r}: {exc}") from None
        if name in gym.registry:
            return env, {}
        cls = getattr(module, name, None)
        if not (isinstance(cls, type) and issubclass(cls, gym.Env)):
            raise ConfigError("env_id", f"{module_name} has no registered id or gymnasium.Env class {name!r}")
        if name not in gym.registry:
            gym.register(id=name, entry_point=env)
        env = name
    if env not in gym.registry:
        return env, {}  # RunConfig.resolve names the problem and the closest ids
    spec = gym.spec(env)
    if env in ENV_IDS:
        return env, {}  # every process registers these itself
    # Every other registration is handed over: a child skips an id it already knows (gymnasium's own).
    ep = _entry_point(spec.entry_point, env)
    reg = {"entry_point": ep, "kwargs": dict(spec.kwargs or {}), "max_episode_steps": spec.max_episode_steps}
    try:
        json.dumps(reg)
    except TypeError:
        raise ConfigError("env_id", f"the registration of {env} has keyword arguments that are not JSON "
                                    f"({reg['kwargs']!r}): pass them as env_kwargs instead") from None
    return env, {env: reg}


def _hand_over(registrations: dict[str, dict[str, Any]]) -> None:
    """Put the registrations in $AESRL_ENVS, which the children inherit (aesrl_queue/envs.py)."""
    if not registrations:
        return
    try:
        handed = json.loads(os.environ.get(ENVS_VAR) or "{}")
    except ValueError:
        handed = {}
    handed.update(registrations)
    os.environ[ENVS_VAR] = json.dumps(handed)


# -- running --------------------------------------------------------------------------------------------
class _Bar:
    """A tqdm bar of stored steps with the progress line's fields beside it (tqdm draws itself in
    a notebook and in a terminal alike)."""

    def __init__(self, total: int, initial: int, run_id: str) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, initial=initial, desc=run_id, unit="step", dynamic_ncols=True,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}{postfix}")
        self.shown: tuple[int, str] | None = None

    def __call__(self, snap: Snapshot) -> None:
        f = snap.fields()
        parts = [f"f(μ)~ {f['f_mu']}"]
        if not snap.done:
            parts += [f"{f['rate']} steps/s", f"ETA {f['eta']}"]
        parts += [p for p in (snap.phase, f["counts"]) if p]
        shown = (min(snap.steps, self.bar.total), "  ".join(parts))
        if shown == self.shown:
            return  # off a terminal every refresh is a new line
        self.shown = shown
        self.bar.n = shown[0]
        self.bar.set_postfix_str(shown[1], refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def _catch_termination() -> dict[int, Any]:
    """SIGTERM and SIGHUP stop the run as Ctrl-C does (Terminated, raised where the run is), so that a
    batch script (`nohup python train.py &`, whose SIGINT the shell ignores) is stopped with `kill`
    and still writes policy.npz and summary.json. Only a signal left at its default (which would end
    the process without clean-up) is caught, and only from the main thread (the only one Python
    delivers signals to): a handler of the caller's own, or nohup's ignored SIGHUP, stays as it is.
    Returns the handlers to put back."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    _received.clear()
    caught = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) == signal.SIG_DFL:
            caught[signum] = signal.signal(signum, _raise_terminated)
    return caught


def _run(local: LocalRun, progress: bool, say: Callable[[str], Any]) -> Run:
    bar = None
    outcome = ""
    jobs_fail = False  # stopped by JobsFail: the run folder holds the run, to resume once fixed
    terminated = ""  # the signal that ended the run: the process then exits as that signal asks
    caught = _catch_termination()
    try:
        try:
            local.start()
        except Refused as exc:
            raise RunError(str(exc)) from None
        if progress:
            bar = _Bar(local.cfg.total_steps, local.store.state()["steps"], local.cfg.run_id)
        try:
            code = local.wait(bar)
        except JobsFail as exc:
            code, outcome, jobs_fail = 1, f"stopped: {exc}", True
        if code and not outcome:
            outcome = f"scheduler exited with {local.sched.returncode}"
    except KeyboardInterrupt:
        outcome = "interrupted"
        raise
    except Terminated as exc:
        terminated = str(exc)
        outcome = f"terminated ({terminated})"
    except BaseException as exc:
        outcome = outcome or f"stopped by {type(exc).__name__}"
        raise
    finally:
        for signum in caught:  # a second SIGTERM must not cut the clean-up short
            signal.signal(signum, signal.SIG_IGN)
        try:
            if bar is not None and outcome:
                bar.close()  # the clean-up's messages then start lines of their own
                bar = None
            local.close(outcome)  # it holds a second Ctrl-C back from the files it writes
            if bar is not None:
                bar.close()
            if outcome == "interrupted" or terminated:
                say(f"{outcome}: {local.run_dir} holds the run so far; aesrl_queue.load({str(local.run_dir)!r})"
                    ".resume() continues it")
        finally:
            for signum, handler in caught.items():
                signal.signal(signum, handler)
    if terminated:
        # What the signal would have done, after the clean-up: end the process (exit status 128 + N,
        # as a shell reports a process that a signal ended). SystemExit runs the caller's `finally`
        # blocks and passes their `except Exception`.
        raise SystemExit(128 + signal.Signals[terminated].value)
    if jobs_fail:
        raise RunError(f"{outcome}; fix the cause, then aesrl_queue.load({str(local.run_dir)!r}).resume() "
                       f"continues the run (logs in {local.run_dir / 'logs'})")
    if outcome:
        raise RunError(f"{outcome}; see {local.run_dir / 'logs' / 'scheduler.log'}")
    return Run(local.run_dir)


def _say(message: str) -> None:
    import sys

    print(message, file=sys.stderr, flush=True)


def train(env: str, algo: str = "aesrl", steps: int | None = None, workers: int = 2, seed: int = 0,
          redis_url: str | None = None, out: str | os.PathLike = "runs", progress: bool = True,
          virtual_workers: int | None = None, cost_model: Any = None, **config: Any) -> Run:
    """Run `algo` on `env` on this machine until `steps` stored steps, as `aesrl-queue run` does, and
    return the Run. Blocks; Ctrl-C (KeyboardInterrupt) stops it cleanly, writes the run folder and
    raises KeyboardInterrupt again: `load(folder).resume()` continues it.

    env: a gymnasium id, "module:Class" (a gymnasium.Env subclass), or an id registered by your
    own code before this call (its class in an importable module). steps: the budget of stored
    steps (default: the environment's preset). workers: local worker processes. redis_url: a
    Redis to use instead of an embedded one. out: the folder of run folders. progress: a tqdm bar.
    config: any RunConfig field (`aesrl-queue config show` lists them), e.g. rl_ratio=0.3,
    hidden=(64, 64), run_id="pend-s1"; a bad one raises ConfigError naming the field.
    virtual_workers: run that many workers in virtual time in this process instead (aesrl_queue/virtual.py),
    under cost_model (a CostModel, a dict, a JSON file, or None for nominal durations).
    """
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ConfigError("workers", f"must be a positive integer, got {workers!r}")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise ConfigError("steps", f"must be a positive integer, got {steps!r}")
    _check_settings(config)
    env_id, registrations = _env_registration(env)
    overrides = dict(config, algo=algo, seed=seed)
    if steps is not None:
        overrides["total_steps"] = steps
    try:
        cfg = RunConfig.from_preset(env_id, **overrides).resolve()
    except TypeError as exc:
        raise ConfigError("config", str(exc)) from None
    run_dir = Path(out) / cfg.run_id
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError("run_id", f"{run_dir} already exists: load({str(run_dir)!r}).resume() continues it, "
                                    "or pass another run_id")
    if virtual_workers is not None:
        from aesrl_queue.cost_model import resolve
        from aesrl_queue.virtual import VirtualRun

        VirtualRun(cfg, virtual_workers, resolve(cost_model), out_dir=out, say=_say).run()
        return Run(run_dir)
    _hand_over(registrations)
    if any(not reg["entry_point"].startswith("gymnasium.envs.") for reg in registrations.values()):
        # the caller's own environment: Run.resume in a new process registers it again from here
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / ENVS_FILE).write_text(json.dumps(registrations, indent=2))
    local = LocalRun(cfg, workers, redis_url=redis_url, out_dir=str(out), say=_say)
    return _run(local, progress, _say)


# train()'s own arguments, which name these fields of RunConfig
_ARGUMENTS = {"env_id": "env", "algo": "algo", "total_steps": "steps", "seed": "seed"}


def _check_settings(config: dict[str, Any]) -> None:
    """A keyword that is no setting of a run raises ConfigError naming it and the settings there
    are: the fields resolve() reads off the environment (obs_dim, ...) and the run's creation time
    are not settings, and four fields are train()'s own arguments under other names."""
    import difflib

    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    settings = sorted(name for name, f in fields.items()
                      if "help" in f.metadata and not f.metadata.get("derived") and name not in _ARGUMENTS)
    for name in config:
        if name in settings:
            continue
        if name in _ARGUMENTS:
            raise ConfigError(name, f"pass it as train()'s {_ARGUMENTS[name]}= argument")
        if name in fields:
            raise ConfigError(name, "not a setting: the run derives it (from the environment, or when it starts)")
        near = difflib.get_close_matches(name, settings + list(_ARGUMENTS.values()), n=1, cutoff=0.75)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(name, f"unknown setting{hint}; the settings: {', '.join(settings)} "
                                "(`aesrl-queue config show --env ENV` explains each)")


def load(folder: str | os.PathLike) -> Run:
    """The run in a run folder (finished or interrupted); ConfigError if it is not one."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ConfigError("folder", f"{folder} is not a run folder (no config.json)")
    return Run(folder)


# -- a run folder -----------------------------------------------------------------------------------------
class Run:
    """A run folder: its config, metrics, policy and summary, read when asked for."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self._actor = None
        self._actor_key = None

    def __repr__(self) -> str:
        s = self.summary or {}
        return (f"Run({str(self.folder)!r}: {self.config.algo} on {self.config.env_id}, "
                f"{s.get('steps', '?')} steps, status {s.get('status', '?')})")

    @property
    def config(self) -> RunConfig:
        data = json.loads((self.folder / "config.json").read_text())
        data.pop("spec_hash", None)
        known = {f.name for f in dataclasses.fields(RunConfig)}
        return RunConfig.from_dict({k: v for k, v in data.items() if k in known})

    @property
    def summary(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.folder / "summary.json").read_text())
        except (OSError, ValueError):
            return None

    @property
    def metrics(self):
        """The records of metrics.jsonl: a pandas DataFrame if pandas is installed, else a list of dicts
        (each with "type": "update", "mu_eval" or "critic"; docs/guide.md lists the fields)."""
        from aesrl_queue.metrics import read_metrics

        path = self.folder / "metrics.jsonl"
        records = read_metrics(path) if path.exists() else []
        try:
            import pandas as pd
        except ImportError:
            return records
        return pd.DataFrame.from_records(records)

    def _load_actor(self):
        path = self.folder / "policy.npz"
        key = path.stat().st_mtime_ns
        if self._actor is None or self._actor_key != key:
            from aesrl_queue.numpy_actor import NetSpec

            with np.load(path, allow_pickle=False) as npz:
                mu = np.array(npz["mu"])
            actor = NetSpec.from_config(self.config).make_numpy_actor()
            actor.set_params(mu)
            self._actor, self._actor_key = actor, key
        return self._actor

    def policy(self, obs) -> np.ndarray:
        """The action of μ (the mean of the search distribution, from policy.npz) for an observation
        (or a batch of them, one per row), as a numpy array."""
        return np.array(self._load_actor().act(np.asarray(obs, dtype=np.float32)), copy=True)

    def evaluate(self, episodes: int = 10, seed: int = 0) -> dict[str, Any]:
        """Mean and std of μ's return over `episodes` deterministic episodes (episode i resets with
        seed + i), as `aesrl-queue evaluate RUN_FOLDER` reports them."""
        from aesrl_queue.rollout import run_episodes

        self._hand_over_envs()
        cfg, actor = self.config, self._load_actor()
        returns, lengths = [], []
        for i in range(int(episodes)):
            ep = run_episodes(cfg.env_id, actor, k=1, seed=seed + i, store=False, env_kwargs=cfg.env_kwargs)
            returns.append(float(ep.returns[0]))
            lengths.append(int(ep.lengths[0]))
        return {"env_id": cfg.env_id, "episodes": int(episodes), "mean": float(np.mean(returns)),
                "std": float(np.std(returns)), "returns": returns, "lengths": lengths}

    def _hand_over_envs(self) -> None:
        try:
            registrations = json.loads((self.folder / ENVS_FILE).read_text())
        except (OSError, ValueError):
            return
        import gymnasium as gym

        for env_id, reg in registrations.items():
            if env_id not in gym.registry:
                gym.register(id=env_id, **reg)
        _hand_over(registrations)

    def resume(self, steps: int | None = None, workers: int = 2, redis_url: str | None = None,
               progress: bool = True) -> Run:
        """Continue the run (its embedded Redis data in the folder, or `redis_url`) until `steps`
        stored steps (default: its budget); returns it. Blocks, and stops on Ctrl-C, as train does."""
        if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
            raise ConfigError("total_steps", f"must be a positive integer, got {steps!r}")
        virtual = (self.folder / "virtual.json").is_file()
        if virtual and redis_url is not None:
            raise ConfigError("redis_url", f"{self.folder} is a virtual run: it resumes on its own Redis data (redis/)")
        if redis_url is None and not (self.folder / "redis").is_dir():
            raise ConfigError("folder", f"{self.folder} has no Redis data (redis/): pass the redis_url that holds it")
        self._hand_over_envs()

        def check(store):
            if not store.exists():
                raise Refused(f"resume: the Redis data of {self.folder} holds no run {store.run_id!r}")
            cfg = store.config()
            done = int(store.state()["steps"])
            if steps is not None and steps != cfg.total_steps:
                if steps <= done:
                    raise Refused(f"total_steps: {steps:,} is not above the {done:,} steps the run has stored")
                return dataclasses.replace(cfg, total_steps=int(steps)), [
                    f"budget {cfg.total_steps:,} -> {steps:,} stored steps"]
            return cfg, []

        if virtual:  # in virtual time in this process, on its virtual.json's workers and cost model
            from aesrl_queue.virtual import VirtualRun, VirtualRunError

            try:
                VirtualRun.resumed(self.folder, resume=check, say=_say).run()
            except (Refused, VirtualRunError) as exc:
                raise RunError(str(exc)) from None
            return load(self.folder)
        local = LocalRun(None, workers, redis_url=redis_url, run_dir=self.folder, resume=check, say=_say)
        return _run(local, progress, _say)

    @property
    def f_mu(self) -> float:
        """The last f(μ) of the summary (the mean of the last tenth of the run's estimates)."""
        s = self.summary or {}
        value = s.get("f_mu_last")
        return float(value) if isinstance(value, int | float) else math.nan
