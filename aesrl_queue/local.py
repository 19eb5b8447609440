"""A whole run on one machine, as child processes: what `aesrl-queue run` and `aesrl_queue.train`
share, without a word of terminal output (messages go to a `say` callback, progress to the caller).

`LocalRun` starts an embedded Redis unless a URL is given (its AOF in the run folder, so that the
run resumes after Ctrl-C, kill -9 or a reboot), writes the run's config, starts the scheduler, the
critic daemon and N workers by module name (`python -m cli.main ...`, `rq worker -w
workers.AesrlWorker`: this library imports neither), follows the run once a second (metrics.jsonl,
policy snapshots, milestones) and, at the end or when interrupted, stops every child and writes
the run folder: config.json, metrics.jsonl, policy.npz and summary.json.

When interrupted (Ctrl-C, SIGTERM) it writes policy.npz and summary.json first, then stops the
children with STOP_GRACE seconds of grace, then writes both again with the final numbers; a Ctrl-C
during that clean-up kills the children at once and the files are still written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from aesrl_queue.codec import CodecError, json_default
from aesrl_queue.config import RunConfig
from aesrl_queue.connection import client_url, connect, redact
from aesrl_queue.metrics import MetricsWriter
from aesrl_queue.optimizers import rl_target
from aesrl_queue.procs import ProcessGroup, signal_group, start_critic_command, worker_command
from aesrl_queue.progress import Progress, Snapshot
from aesrl_queue.redis_server import RedisServer, RedisVersionError
from aesrl_queue.store import Store, list_runs

log = logging.getLogger(__name__)

# Seconds an interrupted run gives its children to stop before they are killed: a worker ends its
# job in hand on SIGTERM (an RL job trains for up to 20 s on two cores), and a killed job is only
# dispatched again when the run resumes, so waiting for it buys nothing. A run that ends normally
# gives them END_GRACE: its scheduler has finished and the workers are idle.
STOP_GRACE = 1.5
END_GRACE = 15.0
# A local run's workers are its own children and run the launcher's code, so jobs that keep the
# circuit breaker open this long (three probe jobs, one every 30 s, all failed) fail for a cause no
# restart of theirs removes: the run stops with that cause instead of waiting for ever.
GIVE_UP_AFTER = 90.0
STOPPING = "stopping the children (workers, critic, scheduler); writing policy.npz and summary.json"


class Terminated(BaseException):
    """SIGTERM or SIGHUP reached the launcher: stop the children and write the run folder.

    A BaseException, like KeyboardInterrupt: raised from the handler inside whatever call is
    running, it must not be swallowed by a library's `except Exception` (a SIGTERM that arrived
    inside a redis-py call was once lost that way, and the run went on)."""


class Refused(Exception):
    """The launch stopped before touching the run (exit 2 with this message)."""


class JobsFail(Exception):
    """A local run's jobs kept failing with the circuit breaker open; the message is the problem line."""


_received: list[str] = []  # signals seen by the handler: the loop checks it too, in case one was lost
_deferring = False  # poll_metrics is running: the handlers note a signal, and it is raised right after


def _raise_terminated(signum, frame):
    _received.append(signal.Signals(signum).name)
    if not _deferring:
        raise Terminated(_received[-1])


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def signals_held():
    """Ctrl-C, SIGTERM and SIGHUP held back for the block and raised right after it, so that a signal
    never leaves its work half done: a metrics record written twice or not at all, or a child started
    and not yet recorded. It also keeps a Ctrl-C from being lost: one that arrives while a child is
    forked is raised inside logging's after-fork hook, which swallows it ("Exception ignored in
    _releaseLock"), and the run went on.

    Held back by the handlers, not by the thread's signal mask: a process-directed signal that the
    main thread blocks is delivered to another thread (numpy's BLAS threads), and Python still runs
    its handler in the main thread, in the middle of the block (a record written twice on SIGTERM)."""
    global _deferring
    if not _main_thread():  # signals reach the main thread only: nothing to hold back here
        yield
        return
    interrupted: list[int] = []
    previous_int = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    _deferring = True
    try:
        yield
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


def poll_metrics(metrics: MetricsWriter) -> None:
    """One metrics pass with Ctrl-C/SIGTERM/SIGHUP held back (raised right after)."""
    with signals_held():
        metrics.poll()


class Children(ProcessGroup):
    """The processes a local run started (aesrl_queue.procs: each in its own session, each dies with
    the launcher, even on kill -9); stopped workers first, then critic and scheduler."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        super().__init__(log_dir, env=env)

    def stop(self, names_first: tuple[str, ...] = ("worker",), grace: float = END_GRACE, only=None) -> list[str]:
        return super().stop(names_first=names_first, grace=grace, only=only)

    def kill_now(self) -> None:
        """SIGKILL every child's group at once (the second Ctrl-C); safe to call from a handler."""
        for _name, p in list(self.procs):
            try:
                signal_group(p, signal.SIGKILL)
            except Exception:  # noqa: BLE001, S110 - the others must still be killed
                pass


# -- the run folder ------------------------------------------------------------------------------------
def needed_interactions(cfg: RunConfig, st: dict[str, Any]) -> int:
    """The environment steps a run needed to learn so far: every stored step (μ's f(μ) episodes
    included where the run keeps a replay), plus, for the asynchronous loops (aesrl, es, opo,
    acemrl) without a critic, the unstored f(μ) episodes their update rule compares each individual
    with. td3's evaluation episodes only report progress, so they are left out here (the run's
    `interactions` counts every env step, those included)."""
    from aesrl_queue.algorithms import algorithm

    return int(st.get("interactions", 0)) if algorithm(cfg.algo).tells == "result" else int(st.get("steps", 0))


NO_POLICY = "no policy.npz: the run stopped before its scheduler wrote μ"


def write_policy(run_dir: Path, store: Store, name: str = "policy.npz",
                 at: dict[str, Any] | None = None) -> Path | None:
    """policy.npz (or `name` under the run folder): the current μ and var (td3: its actor; and the best
    individual when kept), replaced atomically, so that a crash while writing a snapshot leaves the
    previous one intact. None, and nothing written, for a run stopped in its first seconds, before
    its scheduler wrote the first μ. `at` (a history entry) names an earlier version and its counters
    instead of the current ones."""
    cfg = store.config()
    version = store.current_version() if at is None else int(at["version"])
    try:
        mu, var = store.read_dist(version)
    except CodecError:
        if version == 0 and store.status() == "created":
            return None
        raise
    st = store.state() if at is None else {**store.state(), "steps": at["steps"], "interactions": at["interactions"]}
    arrays: dict[str, Any] = {"mu": mu, "var": var, "version": version, "f_mu": st.get("f_mu", math.nan),
                              "f_mu_version": st.get("f_mu_version", -1), "steps": st.get("steps", 0),
                              "interactions": st.get("interactions", 0),
                              "needed_interactions": needed_interactions(cfg, st)}
    if at is not None:
        arrays.update(f_mu=at.get("f_mu", math.nan), f_mu_version=version)
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


class Milestones:
    """`run --snapshot-steps/--snapshot-interactions`: the policy (as policy.npz holds it) written to
    snapshots/steps-N.npz when the stored steps first reach N, and to snapshots/interactions-N.npz
    when the needed interactions (needed_interactions) first do. The launcher checks once a second
    and the counters move one finished episode at a time, so a snapshot is the policy of the first
    check at or past N: up to one second and one episode per worker late; the npz records the
    counters it was taken at. td3 is one deterministic process, so its snapshot is exact whatever
    the machine's load: the actor it evaluated last at the first episode whose history entry reaches N
    (evaluations fall at the first episode end past each multiple of td3_eval_every), read back from
    the history and its versioned actor. A milestone whose file exists (a resumed run) is kept."""

    def __init__(self, run_dir: Path, steps=(), interactions=()) -> None:
        self.dir = run_dir / "snapshots"
        self.todo = [(kind, int(n)) for kind, ns in (("steps", steps), ("interactions", interactions))
                     for n in sorted(set(ns)) if not (self.dir / f"{kind}-{int(n)}.npz").exists()]
        self._seen = "-"  # td3: the history read so far

    def check(self, run_dir: Path, store: Store) -> list[Path]:
        from aesrl_queue.algorithms import algorithm

        if not self.todo:
            return []
        cfg = store.config()
        st = store.state()
        now = {"steps": int(st.get("steps", 0)), "interactions": needed_interactions(cfg, st)}
        due = [(kind, n) for kind, n in self.todo if now[kind] >= n]
        for item in due:
            self.todo.remove(item)
        if algorithm(cfg.algo).tells != "step" or not due:
            return [write_policy(run_dir, store, f"snapshots/{kind}-{n}.npz") for kind, n in due]
        # td3 (tells "step"): its needed interactions are its stored steps (its evaluations are not counted)
        out, pending = [], sorted(due, key=lambda d: d[1])
        for hid, entry in store.history(after=self._seen):
            while pending and entry["steps"] >= pending[0][1]:
                kind, n = pending.pop(0)
                try:
                    out.append(write_policy(run_dir, store, f"snapshots/{kind}-{n}.npz", at=entry))
                except CodecError:  # its actor expired (60 s after the next evaluation): the current one
                    pending.insert(0, (kind, n))
                    break
            if not pending or entry["steps"] >= pending[0][1]:
                self._seen = hid  # the next milestone may fall on this entry too
                break
            self._seen = f"({hid}"
        return out + [write_policy(run_dir, store, f"snapshots/{kind}-{n}.npz") for kind, n in pending]


# The summary warns of an RL share this far from its target once this many results are applied: the
# P controller steers the share to ρ* (0.80 against 0.90 after 81 updates in docs/guide.md §2, the random
# phase's ES-only results included), so 0.2 off means RL jobs did not happen (no critic, failing RL
# jobs); 20 results keep a short run quiet.
RL_SHARE_TOLERANCE = 0.2
RL_SHARE_MIN_RESULTS = 20


def summary_numbers(client, run_id: str) -> dict[str, Any]:
    """The end-of-run summary: first and last f(μ), counts, rates."""
    store = Store(client, run_id)
    hist = store.history()
    st = store.state()
    f_mus = [h["f_mu"] for _, h in hist if isinstance(h.get("f_mu"), float) and math.isfinite(h["f_mu"])]
    head = f_mus[: max(1, len(f_mus) // 10)]
    tail = f_mus[-max(1, len(f_mus) // 10):]
    elapsed = (st.get("finished_at") or st.get("updated_at") or time.time()) - st.get("started_at", time.time())
    cfg = store.config()
    applied = st["rl_applied"] + st["es_applied"]
    share, target = (st["rl_applied"] / applied if applied else 0.0), rl_target(cfg)
    # The random-action phase makes ES-shaped results only, by design: the RL share is judged on the
    # results after it (on the state's counts where the history holds no results).
    after = [h for _, h in hist if not h.get("random")]
    judged, rl_judged = (len(after), sum(h.get("kind") == "rl" for h in after)) if hist else (applied, st["rl_applied"])
    judged_share = rl_judged / judged if judged else 0.0
    warnings = []
    if judged >= RL_SHARE_MIN_RESULTS and abs(judged_share - target) > RL_SHARE_TOLERANCE:  # False for td3 (NaN)
        command = start_critic_command(run_id, client_url(client))
        if not st["critic_version"]:
            why = f"no critic trained (start `{command}` beside the run)"
        elif st["failed"]:
            why = f"{st['failed']} jobs failed (see the problem lines of the scheduler's log)"
        else:
            why = "RL jobs were held, none failed: the critic trailed the replay or published late (the scheduler's log)"
        after_phase = " after the random phase" if hist and judged < applied else ""
        warnings.append(f"RL share {judged_share:.2f}{after_phase} against a target of {target:.2f}: {why}")
    still = _why_mu_stayed(cfg, st, hist)
    if still:
        warnings.append(still)
    return {
        "run": run_id, "status": st.get("status"), "steps": st["steps"], "interactions": st["interactions"],
        "results_applied": st["results_applied"], "rl_applied": st["rl_applied"], "es_applied": st["es_applied"],
        "failed": st["failed"], "rejected": st["rejected"], "replaced": st["replaced"],
        "critic_version": st["critic_version"], "elapsed_s": round(elapsed, 1),
        "f_mu_first": float(np.mean(head)) if head else None, "f_mu_last": float(np.mean(tail)) if tail else None,
        "f_mu_final": st.get("f_mu"), "best_fitness": st.get("best_fitness"),
        "rl_share": round(share, 3), "rl_target": target, "warnings": warnings,
    }


def _why_mu_stayed(cfg: RunConfig, st: dict[str, Any], hist: list) -> str:
    """Why μ never moved in a run that applied results ("" where it moved): a short budget spends
    itself on the random-action phase, whose results do not move μ, and under the adaptive fitness
    scale μ moves only once MIN_GAPS ES results after that phase have set the scale."""
    from aesrl_queue.algorithms import algorithm
    from aesrl_queue.fitness import MIN_GAPS

    if algorithm(cfg.algo).tells != "result" or int(st.get("version", 0)) > 0 or not hist:
        return ""
    after = [h for _, h in hist if not h.get("random")]
    # the stored steps when the phase's last result was applied (its jobs' μ episodes included)
    random_steps = max((int(h.get("steps", 0) or 0) for _, h in hist if h.get("random")), default=0)
    steps = f"{random_steps:,} of its {int(st['steps']):,} stored steps"
    if not after:
        return (f"μ did not move (still v0): the whole run was the random-action phase ({steps}; initial_steps "
                f"{cfg.initial_steps:,}), whose results do not move μ: give it a budget well above initial_steps")
    es_after = sum(h.get("kind") == "es" for h in after)
    if cfg.r == "adaptive" and es_after < MIN_GAPS:
        return (f"μ did not move (still v0): the random-action phase took {steps}, and after it μ moves only once "
                f"{MIN_GAPS} ES results have set the fitness scale (this run had {es_after}): give it a larger budget")
    return (f"μ did not move (still v0): none of the {len(after)} results after the random-action phase "
            f"({steps}) moved it")


def write_summary(run_dir: Path, store: Store, warnings: tuple[str, ...] = ()) -> dict:
    """summary.json of the run as it stands (with `warnings` added to its own)."""
    summary = summary_numbers(store.r, store.run_id)
    summary["warnings"] += list(warnings)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "summary.json"
    tmp = path.with_name(".summary.json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=json_default))
    os.replace(tmp, path)
    return summary


def write_run_folder(run_dir: Path, store: Store) -> dict:
    """config.json, policy.npz (final μ, var; best individual when kept) and summary.json.

    metrics.jsonl is written as the run goes by a MetricsWriter.
    """
    cfg = store.config()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=json_default))
    policy = write_policy(run_dir, store)
    return write_summary(run_dir, store, () if policy else (NO_POLICY,))


def folder_run_id(run_dir: Path, client) -> str:
    """The run id of a run folder: its config.json, else the one run its Redis holds, else its name."""
    try:
        return str(json.loads((run_dir / "config.json").read_text())["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    runs = list_runs(client)
    return runs[0][0] if len(runs) == 1 else run_dir.name


# -- the run ---------------------------------------------------------------------------------------------
class LocalRun:
    """One local run: `start()`, then `step()` about once a second while `running`, then `close()`.

    `resume(store) -> (cfg, notes)` resumes the run in `run_dir` (cfg None): its embedded Redis
    loads the AOF there, or `redis_url` holds the run; it raises Refused to stop without a trace.
    `say(message)` receives every message for the user (one line each).
    """

    def __init__(self, cfg: RunConfig | None, n_workers: int, redis_url: str | None = None, out_dir: str = "runs",
                 run_dir: Path | None = None, start_critic: bool = True, tensorboard_dir: str | None = None,
                 wandb_project: str | None = None, snapshot_every: float = 600.0, snapshot_steps=(),
                 snapshot_interactions=(), resume: Callable | None = None,
                 say: Callable[[str], Any] = log.warning) -> None:
        self.cfg = cfg
        self.n_workers = n_workers
        self.redis_url = redis_url
        self.run_dir = Path(run_dir) if run_dir is not None else Path(out_dir) / cfg.run_id
        self.start_critic = start_critic
        self.tensorboard_dir = tensorboard_dir
        self.wandb_project = wandb_project
        self.snapshot_every = snapshot_every
        self.milestones = Milestones(self.run_dir, snapshot_steps, snapshot_interactions)
        self.resume = resume
        self.say = say
        self.server: RedisServer | None = None
        self.store: Store | None = None
        self.kids: Children | None = None
        self.metrics: MetricsWriter | None = None
        self.progress: Progress | None = None
        self.sched = None
        self.started = False  # past the checks: the run folder is ours to write
        self.summary: dict | None = None
        self.tb_dir: Path | None = None
        self.stop_seconds: float | None = None  # how long close() took after an interruption
        self._last_snapshot = time.monotonic()
        self._breaker_since: float | None = None

    @property
    def running(self) -> bool:
        return self.sched is not None and self.sched.poll() is None

    def start(self) -> None:
        from aesrl_queue.optimizers import needs_critic_daemon, needs_workers

        cfg = self.cfg
        if self.redis_url is None:
            try:
                with signals_held():  # the server is recorded before a Ctrl-C can stop this
                    self.server = RedisServer(directory=self.run_dir / "redis", appendonly=True).start()
            except RedisVersionError as exc:
                raise Refused(f"{'resume: ' if self.resume else ''}{exc}") from None
            self.redis_url = self.server.url
            self.say(f"embedded Redis on {self.redis_url} (redis-server {self.server.version}; AOF in "
                     f"{self.run_dir / 'redis'})")
        client = connect(self.redis_url)
        if self.resume is not None:
            store = Store(client, cfg.run_id if cfg is not None else folder_run_id(self.run_dir, client))
            self.store = store
            cfg, notes = self.resume(store)
            for note in notes:
                self.say(f"resume: {note}")
            if cfg.total_steps != store.config().total_steps:
                store.replace_config(cfg)
            store.set_state(finished_at=None)
            if store.status() in ("finished", "stopped", "failed"):
                store.set_state(status="created", updated_at=time.time())  # until its scheduler runs again
            self.say(f"resuming run {cfg.run_id} at {store.state()['steps']:,} of {cfg.total_steps:,} steps")
        else:
            store = Store(client, cfg.run_id)
            self.store = store
            if not store.write_config(cfg):
                raise Refused(f"run_id: run {cfg.run_id} already exists on {redact(self.redis_url)}: "
                              "resume it or start it over under another run id")
        self.cfg = cfg
        self.started = True
        run_dir = self.run_dir
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=json_default))
        self.tb_dir = Path(self.tensorboard_dir) / cfg.run_id if self.tensorboard_dir else None
        self.metrics = MetricsWriter(client, cfg.run_id, run_dir / "metrics.jsonl", tensorboard_dir=self.tb_dir,
                                     wandb_project=self.wandb_project)
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", AESRL_TRACEBACK="1")
        env.pop("AESRL_REDIS_URL", None)
        py = [sys.executable, "-m", "cli.main"]
        self.kids = Children(run_dir / "logs", env)
        n_workers = self.n_workers if needs_workers(cfg) else 0  # td3 runs in the scheduler process
        self.n_workers = n_workers
        url = self.redis_url
        with signals_held():  # each child recorded (close() stops it), and a Ctrl-C meanwhile not lost
            for i in range(n_workers):
                self.kids.spawn(f"worker-{i}", worker_command(url))
            if needs_critic_daemon(cfg) and self.start_critic:
                self.kids.spawn("critic", py + ["critic", "start", "--redis-url", url, "--run", cfg.run_id])
            self.sched = self.kids.spawn("scheduler", py + ["scheduler", "start", "--redis-url", url, "--run",
                                                            cfg.run_id])
        self.progress = Progress(cfg, store)
        self._last_snapshot = time.monotonic()

    def step(self) -> Snapshot:
        """One look at the run: metrics records, dead children, snapshots; the progress to show."""
        run_dir, store = self.run_dir, self.store
        for name, p in list(self.kids.procs):
            if name != "scheduler" and p.poll() is not None and p.returncode not in (0, None):
                self.say(f"warning: {name} exited with {p.returncode} (see {run_dir / 'logs' / (name + '.log')})")
                self.kids.procs.remove((name, p))
        poll_metrics(self.metrics)
        if self.snapshot_every > 0 and time.monotonic() - self._last_snapshot >= self.snapshot_every:
            self._last_snapshot = time.monotonic()
            try:
                write_policy(run_dir, store)
            except Exception as exc:  # noqa: BLE001 - a failed snapshot must not end the run
                self.say(f"warning: policy snapshot failed: {exc}")
        self.check_milestones()
        return self.progress.look()

    def check_milestones(self) -> None:
        try:
            self.milestones.check(self.run_dir, self.store)
        except Exception as exc:  # noqa: BLE001 - a failed snapshot must not end the run
            self.say(f"warning: milestone snapshot failed: {exc}")

    def wait(self, on_progress: Callable[[Snapshot], Any] | None = None, interval: float = 1.0) -> int:
        """Follow the run until its scheduler exits; the exit code (0, or 1 if the scheduler failed).
        KeyboardInterrupt and Terminated pass through to the caller, who then calls close(); so does
        JobsFail, raised once the circuit breaker has stayed open for GIVE_UP_AFTER seconds."""
        while self.running:
            time.sleep(interval)
            if _received:
                raise Terminated(_received[0])
            snap = self.step()
            self._check_breaker(snap)
            if on_progress is not None:
                on_progress(snap)
        self.check_milestones()  # those the last episodes reached after the last check
        if on_progress is not None:
            on_progress(self.progress.look())
        return 0 if self.sched.returncode == 0 else 1

    def _check_breaker(self, snap: Snapshot) -> None:
        state = snap.state or {}
        if not (state.get("breaker") and state.get("problem")):
            self._breaker_since = None
            return
        now = time.monotonic()
        if self._breaker_since is None:
            self._breaker_since = now
        elif now - self._breaker_since >= GIVE_UP_AFTER:
            raise JobsFail(f"{state.get('problem_hint') or state['problem']}; no job succeeded in "
                           f"{now - self._breaker_since:.0f} s with the circuit breaker open")

    def _step(self, what: str, fn, *args, **kwargs):
        """One clean-up step: a failure is reported and the next step still runs."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every step must run
            self.say(f"clean-up: {what} failed: {type(exc).__name__}: {exc}")
            return None

    def close(self, outcome: str = "") -> dict | None:
        """Stop every child, write the run folder, stop the embedded Redis; the summary (None if the
        run never started). With an `outcome` (the run was interrupted: "interrupted", "terminated
        (SIGTERM)"), one line says so and what is being done, policy.npz and summary.json are written before the
        children are stopped, and a Ctrl-C meanwhile kills them at once instead of waiting."""
        t0 = time.monotonic()
        interrupted = bool(outcome)
        store, kids = self.store, self.kids
        previous_int = None
        if interrupted and _main_thread():
            def hurry(signum, frame):
                if kids is not None:
                    kids.kill_now()
            previous_int = signal.signal(signal.SIGINT, hurry)
        try:
            if interrupted:
                self.say(f"{outcome}: {STOPPING}")
                if store is not None and self.started:
                    # a milestone the last episodes reached (the run may have ended between two looks)
                    self._step("writing milestone snapshots", self.milestones.check, self.run_dir, store)
                    self._step("writing policy.npz", write_policy, self.run_dir, store)
                    self._step("writing summary.json", write_summary, self.run_dir, store)
            if kids is not None:
                self._step("stopping the children", kids.stop, grace=STOP_GRACE if interrupted else END_GRACE)
            if store is not None and self.started:
                self._step("marking the run stopped", self._mark_stopped)
            if self.metrics is not None:
                self._step("closing metrics", self.metrics.close)
            if store is not None and self.started:
                self.summary = self._step("writing the run folder", write_run_folder, self.run_dir, store)
            if self.server is not None:
                self._step("stopping the embedded Redis", self.server.stop)
        finally:
            if previous_int is not None:
                signal.signal(signal.SIGINT, previous_int)
        if interrupted:
            self.stop_seconds = time.monotonic() - t0
        return self.summary

    def _mark_stopped(self) -> None:
        """A scheduler killed before it said so leaves "running": the run is stopped (and resumable)."""
        if self.store.status() in ("running", "draining"):
            self.store.set_state(status="stopped", updated_at=time.time())
