"""Metrics of a run as files: `metrics.jsonl` in the run folder and, optionally, TensorBoard scalars.

A `MetricsWriter` follows the run's Redis streams (history, results) and state from any process
(the `run` launcher, `scheduler start --out`), so the scheduler's own loop does no file I/O.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import redis

from aesrl_queue.store import Store, decode_result

log = logging.getLogger(__name__)

# Names of the TensorBoard scalars (stable, namespaced like CleanRL's); x-axis = stored steps.
TB_SCALARS = {
    "f_mu": "charts/f_mu",
    "f_mu_eval": "charts/f_mu_eval",
    "best_fitness": "charts/best_fitness",
    "f_z_es": "charts/f_z_es",
    "f_z_rl": "charts/f_z_rl",
    "interactions": "charts/interactions",
    "steps_per_s": "charts/steps_per_second",
    "sigma_mean": "population/sigma_mean",
    "sigma_min": "population/sigma_min",
    "sigma_max": "population/sigma_max",
    "rl_share": "population/rl_share",
    "p_es": "population/p_es",
    "p_rl": "population/p_rl",
    "r": "population/fitness_scale",
    "version": "population/version",
    "critic_loss": "critic/loss",
    "critic_version": "critic/version",
    "critic_steps": "critic/steps",
    "critic_steps_per_s": "critic/steps_per_second",
}

TENSORBOARD_MISSING = ("--tensorboard needs the `tensorboard` package: pip install 'aesrl-queue[tensorboard]' "
                       "(or pip install tensorboard)")


def open_tensorboard(log_dir: str | Path):
    """A SummaryWriter on log_dir; ImportError with the install command when tensorboard is missing."""
    try:
        import tensorboard  # noqa: F401  (torch's SummaryWriter needs it; check first for a clear message)
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ImportError(TENSORBOARD_MISSING) from None
    return SummaryWriter(log_dir=str(log_dir))


WANDB_MISSING = "--wandb-project needs the `wandb` package: pip install 'aesrl-queue[wandb]' (or pip install wandb)"


def open_wandb(project: str, run_id: str, config: dict[str, Any], directory: str | Path | None = None):
    """A W&B run named after the run id (resumed if it exists); offline with WANDB_MODE=offline."""
    try:
        import wandb
    except ImportError:
        raise ImportError(WANDB_MISSING) from None
    return wandb.init(project=project, name=run_id, id=run_id, resume="allow", config=config,
                      dir=str(directory) if directory else None, reinit=True)


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _improved(h: dict[str, Any]) -> bool:
    """Did the individual beat the f(μ) it was compared with (the newest f(μ) for older histories)?"""
    delta = h.get("delta")
    if _finite(delta):
        return bool(delta > 0)
    f_z, f_mu = h.get("f_z"), h.get("f_mu")
    return bool(_finite(f_z) and _finite(f_mu) and f_z > f_mu)


def _clean(x: Any) -> Any:
    return x if not isinstance(x, float) or math.isfinite(x) else None


class MetricsWriter:
    """Append one JSON line per applied update ("update"), per μ evaluation that came with it
    ("mu_eval"), and per critic publication seen ("critic"); mirror them as TensorBoard scalars.

    Call `poll()` periodically (or `start()` a thread); `close()` reads what is left.
    """

    def __init__(self, client: redis.Redis, run_id: str, path: str | Path, tensorboard_dir: str | Path | None = None,
                 append: bool = False, wandb_project: str | None = None) -> None:
        self.store = Store(client, run_id)
        self.r = client
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "a" if append else "w")  # noqa: SIM115 - closed in close()
        self.tb = open_tensorboard(tensorboard_dir) if tensorboard_dir else None
        self.wandb = None
        if wandb_project:
            self.wandb = open_wandb(wandb_project, run_id, self.store.config().to_dict(), self.path.parent)
        self._wb_row: dict[str, float] = {}
        self._wb_step = 0
        self.history_after = "-"
        self.results_after = "0-0"
        self.pending: OrderedDict[str, dict[str, Any]] = OrderedDict()  # job -> its μ evaluation
        self.counts = {"es": 0, "rl": 0}
        self.critic_version = 0
        self.started_at: float | None = None
        self.best = -math.inf
        self.records = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- one pass ---------------------------------------------------------------------------------
    def poll(self, max_entries: int = 5000) -> int:
        """Write the records of everything new in Redis; returns how many were written."""
        with self._lock:
            return self._poll(max_entries)

    def _poll(self, max_entries: int) -> int:
        if self.started_at is None:
            st = self.store.state()
            self.started_at = st.get("started_at") or None
        written = 0
        # History first, then results: every applied entry's result is already in the results stream.
        hist = self.store.history(count=max_entries, after=self.history_after)
        self._read_results(max_entries)
        for entry_id, h in hist:
            written += self._update(h)
            # Advance per entry: a signal that interrupts this loop loses no record on the next poll.
            self.history_after = "(" + entry_id
        st = self.store.state()
        written += self._critic(st)
        if written:
            self.fh.flush()
            if self.tb is not None:
                self.tb.flush()
            self._flush_wandb()
        return written

    def _read_results(self, max_entries: int) -> None:
        for entry_id, fields in self.store.read_stream("results", self.results_after, count=max_entries):
            self.results_after = entry_id
            try:
                res = decode_result(entry_id, fields)
            except Exception:  # a malformed entry is the scheduler's to reject; nothing to plot
                continue
            if res.ok and _finite(res.f_mu):
                self.pending[res.job] = {"f_mu": res.f_mu, "mu_version": res.f_mu_version,
                                         "episodes_steps": res.eval_steps,
                                         "t": int(entry_id.split("-")[0]) / 1000.0, "worker": res.worker}
        while len(self.pending) > 10_000:  # results that were never applied (stale, failed)
            self.pending.popitem(last=False)

    def _elapsed(self, t: float) -> float | None:
        return round(t - self.started_at, 3) if self.started_at else None

    def _write(self, rec: dict[str, Any]) -> None:
        self.fh.write(json.dumps({k: _clean(v) for k, v in rec.items()}) + "\n")
        self.records += 1

    def _scalar(self, name: str, value: Any, step: int, t: float) -> None:
        if self.tb is not None and _finite(value):
            self.tb.add_scalar(TB_SCALARS[name], float(value), global_step=int(step), walltime=t)
        if self.wandb is not None and _finite(value):
            if self._wb_row.get("steps", step) != step:
                self._flush_wandb()
            self._wb_row[TB_SCALARS[name]] = float(value)
            self._wb_row["steps"] = step

    def _flush_wandb(self) -> None:
        """One W&B row per stored-steps value (W&B wants a step that never goes down)."""
        if self.wandb is not None and self._wb_row:
            row, self._wb_row = self._wb_row, {}
            self._wb_step = max(self._wb_step, int(row["steps"]))
            self.wandb.log(row, step=self._wb_step)

    def _update(self, h: dict[str, Any]) -> int:
        kind = h.get("kind", "?")
        if kind in self.counts:
            self.counts[kind] += 1
        total = sum(self.counts.values())
        f_z, f_mu = h.get("f_z"), h.get("f_mu")
        if _finite(f_z):
            self.best = max(self.best, f_z)
        t = float(h.get("t", time.time()))
        rec = {
            "type": "update", "t": t, "elapsed": self._elapsed(t), "steps": h.get("steps"),
            "interactions": h.get("interactions"), "version": h.get("version"), "kind": kind, "p": h.get("p"),
            "f_z": f_z, "f_mu": f_mu, "improved": _improved(h),
            # why μ moved as it did: the f(μ) f(z) was compared with, the gap, the fitness scale r in
            # use, whether the result was told at all, and an RL individual's distance from its μ
            "f_ref": h.get("f_ref"), "delta": h.get("delta"), "r": h.get("r"), "told": h.get("told", True),
            "dist_after": h.get("dist_after"),
            "sigma_mean": h.get("sigma_mean"), "sigma_min": h.get("sigma_min"), "sigma_max": h.get("sigma_max"),
            "rl_share": self.counts["rl"] / total if total else 0.0, "len": h.get("len"), "job": h.get("job"),
            "worker": h.get("worker"), "random": h.get("random", False), "rl_steps": h.get("rl_steps"),
            "duration": h.get("duration"),
            # updates told while this individual ran: how stale the μ it was drawn from was
            "lag": h.get("lag"),
        }
        # the td3 baseline's learner at the episode's end: its critic's loss and mean Q1, and α
        rec.update({k: h[k] for k in ("critic_loss", "q1_mean", "alpha") if k in h})
        self._write(rec)
        n = 1
        step = int(h.get("steps") or 0)
        for name in ("f_mu", "sigma_mean", "sigma_min", "sigma_max", "rl_share", "version", "interactions", "r"):
            self._scalar(name, rec[name], step, t)
        self._scalar("best_fitness", self.best, step, t)
        self._scalar(f"f_z_{kind}" if kind in self.counts else "f_z_es", f_z, step, t)
        self._scalar(f"p_{kind}" if kind in self.counts else "p_es", h.get("p"), step, t)
        ev = self.pending.pop(h.get("job"), None)
        if ev is not None:
            self._write({"type": "mu_eval", "t": ev["t"], "elapsed": self._elapsed(ev["t"]), "steps": step,
                         "interactions": h.get("interactions"), "mu_version": ev["mu_version"], "f_mu": ev["f_mu"],
                         "eval_steps": ev["episodes_steps"], "job": h.get("job"), "worker": ev["worker"]})
            self._scalar("f_mu_eval", ev["f_mu"], step, ev["t"])
            n += 1
        return n

    def _critic(self, st: dict[str, Any]) -> int:
        version = int(st.get("critic_version") or 0)
        if version <= self.critic_version:
            return 0
        self.critic_version = version
        t = float(st.get("critic_updated_at") or time.time())
        rec = {"type": "critic", "t": t, "elapsed": self._elapsed(t), "steps": st.get("steps"),
               "critic_version": version, "critic_steps": st.get("critic_steps"),
               "critic_loss": st.get("critic_loss"), "critic_steps_per_s": st.get("critic_steps_per_s")}
        self._write(rec)
        step = int(st.get("steps") or 0)
        for name in ("critic_loss", "critic_version", "critic_steps", "critic_steps_per_s"):
            self._scalar(name, rec[name], step, t)
        return 1

    # -- background thread --------------------------------------------------------------------------
    def start(self, every: float = 1.0) -> MetricsWriter:
        def loop() -> None:
            failures = 0
            while not self._stop.wait(every):
                try:
                    self.poll()
                    failures = 0
                except redis.RedisError as exc:  # Redis restarting: keep the file, try again
                    failures += 1
                    if failures == 1:
                        log.warning("metrics: cannot read the run from Redis (%s); retrying", exc)
        self._thread = threading.Thread(target=loop, name="aesrl-metrics", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the thread, write what is left in Redis, close the files."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        try:
            while self.poll() > 0:
                pass
        except redis.RedisError as exc:
            log.warning("metrics: final read failed (%s); %s may miss the last records", exc, self.path)
        with self._lock:
            self.fh.close()
            if self.tb is not None:
                self.tb.close()
            if self.wandb is not None:
                self._flush_wandb()
                self.wandb.finish()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl (a run folder or the file itself); skips torn lines."""
    p = Path(path)
    if p.is_dir():
        p = p / "metrics.jsonl"
    out = []
    with open(p) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash
            if isinstance(rec, dict):
                out.append(rec)
    return out
