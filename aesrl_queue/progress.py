"""What a run's progress line says: the same numbers for `aesrl-queue run` (a terminal line) and
for `aesrl_queue.train` (a tqdm bar), read from the run's keys in Redis once a second.

- f(μ)~ is the mean of the last F_MU_WINDOW estimates of f(μ). Each estimate is one episode of μ
  (mean_eval_episodes = 1), which on Pendulum-v1 swings by hundreds from one job to the next; the
  mean of ten moves with the policy, not with the start state.
- The rate (stored steps per second) behind the ETA is the mean rate since the random phase ended
  (since the line started, for a run without one). The random phase, RL jobs (whose steps arrive at
  the end of a job, tens of seconds apart) and ES jobs store steps at very different rates: a window
  of 30 s gave ETAs that swung between 4 and 22 minutes, and an exponential average over 60 s still
  swung by a factor of two. Over the first RATE_TAU seconds after the phase ends the random
  phase's rate fades out linearly, so the ETA moves to the new rate without a jump.
- The phase is what the run waits for, or "" while it is simply working (`Phase.label`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from aesrl_queue.config import RunConfig
from aesrl_queue.store import Store, live_workers

F_MU_WINDOW = 10  # f(μ) estimates averaged into f(μ)~
RATE_TAU = 60.0  # seconds over which the random phase's rate fades out of the ETA
IDLE_AFTER = 3.0  # seconds without a stored step before the line says what the run waits for
STALLED_AFTER = 10.0  # seconds without an applied update before `status --watch` says "stalled"


def trains_critic(cfg: RunConfig) -> bool:
    from aesrl_queue.optimizers import needs_critic_daemon

    return needs_critic_daemon(cfg) and cfg.rl_ratio > 0


def duration(seconds: float) -> str:
    """3m07s, 1h05m; "?" for an unknown duration."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


class Rate:
    """Stored steps per second: the mean since `restart` (or the first call); for `tau` seconds after
    a restart, blended linearly with the rate at the restart (see the module's docstring)."""

    def __init__(self, tau: float = RATE_TAU) -> None:
        self.tau = tau
        self.first: tuple[float, int] | None = None
        self.last: tuple[float, int] | None = None
        self.restarted = False
        self.bridge = 0.0  # the rate at the restart, weighed out linearly over tau seconds
        self.value = 0.0

    def restart(self, t: float, steps: int) -> None:
        """Measure from here on (the random phase is over); the value so far fades out over tau s."""
        self.first, self.restarted, self.bridge = (t, steps), self.first is not None, self.value

    def add(self, t: float, steps: int) -> float:
        if self.first is None:
            self.first = self.last = (t, steps)
            return 0.0
        t0, s0 = self.first
        tl = (self.last or self.first)[0]
        self.last = (t, steps)
        if t <= tl:
            return self.value
        if t <= t0:
            return self.value
        mean = (steps - s0) / (t - t0)
        w = min(1.0, (t - t0) / self.tau) if self.restarted else 1.0
        self.value = w * mean + (1.0 - w) * self.bridge
        return self.value


class Phase:
    """What the run is doing, in a few words for the progress line ("" when it is just working)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.critic_wait_since: float | None = None

    def label(self, st: dict[str, Any], now: float | None = None, rl_jobs: int = 0, idle: float = 0.0) -> str:
        """`rl_jobs`: RL jobs the run's workers hold now; `idle`: seconds since the steps last moved."""
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
            from aesrl_queue.algorithms import algorithm
            from aesrl_queue.config import critic_due, critic_too_far_behind

            critic_steps = int(st.get("critic_steps") or 0)
            # Only the asynchronous loops hold jobs for it; the synchronous ones ask for critic steps.
            if algorithm(cfg.algo).tells == "result" and critic_too_far_behind(cfg, steps, critic_steps):
                return f"critic {critic_due(cfg, steps) - critic_steps:,} steps behind"
            if rl_jobs and idle >= IDLE_AFTER:
                return f"training RL individuals ({rl_jobs})"
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


@dataclass
class Snapshot:
    """One look at a run, as the progress line shows it."""

    steps: int
    total_steps: int
    status: str
    f_mu: float  # f(μ)~: mean of the last F_MU_WINDOW estimates (nan before the first)
    f_mu_last: float  # the newest single estimate
    rate: float  # smoothed stored steps per second (0 when stopped)
    eta: float  # seconds left at that rate (nan when unknown)
    elapsed: float  # seconds since the line started
    phase: str
    version: int
    es_applied: int
    rl_applied: int
    critic_version: int
    state: dict[str, Any]

    @property
    def done(self) -> bool:
        return self.status in ("finished", "stopped", "failed")

    def fields(self) -> dict[str, str]:
        """The numbers beside the bar, as text (the same for the terminal line and the tqdm bar)."""
        left = max(0, self.total_steps - self.steps)
        return {
            "f_mu": format(self.f_mu, ".1f") if math.isfinite(self.f_mu) else "-",
            "rate": format(self.rate, ",.0f"),
            "eta": duration(self.eta) if self.rate > 0 else ("0m00s" if left == 0 else "?"),
            # μ's version counts the results that moved μ; the results count them all, those of the
            # random phase and those with p = 0 included, so the two are named apart
            "counts": (f"μ v{self.version}  results es {self.es_applied} rl {self.rl_applied}  "
                       f"critic v{self.critic_version}"),
        }


class Progress:
    """Reads a run's progress from Redis: call `look()` about once a second."""

    def __init__(self, cfg: RunConfig, store: Store) -> None:
        self.cfg = cfg
        self.store = store
        self.rate = Rate()
        self.phase = Phase(cfg)
        self.t0 = time.monotonic()
        self.f_mus: deque[float] = deque(maxlen=F_MU_WINDOW)
        self.history_after: str | None = None
        self.moved_at = self.t0
        self.steps = -1
        self.past_random = False  # the rate restarts once, when the random phase ends

    def _read_f_mu(self) -> None:
        """Append each new f(μ) estimate of the updates applied since the last look (an update
        carries the f(μ) in force when it was told: a new value is a new estimate)."""
        if self.history_after is None:
            rows = self.store.history(count=200, newest=True)
        else:
            rows = self.store.history(count=5000, after=self.history_after)
        for entry_id, h in rows:
            self.history_after = "(" + entry_id
            f = h.get("f_mu")
            if isinstance(f, float) and math.isfinite(f) and (not self.f_mus or f != self.f_mus[-1]):
                self.f_mus.append(f)

    def _rl_jobs(self) -> int:
        run = self.cfg.run_id
        return sum(1 for w in live_workers(self.store.r).values() if w.get("run") == run and w.get("kind") == "rl")

    def look(self, now: float | None = None) -> Snapshot:
        now = time.monotonic() if now is None else now
        st = self.store.state()
        steps = int(st.get("steps", 0))
        if steps != self.steps:
            self.steps, self.moved_at = steps, now
        self._read_f_mu()
        status = str(st.get("status", ""))
        stopped = status in ("finished", "stopped", "failed")
        if not self.past_random and self.cfg.initial_steps and steps >= self.cfg.initial_steps:
            self.past_random = True
            self.rate.restart(now, steps)
        rate = 0.0 if stopped else self.rate.add(now, steps)
        idle = now - self.moved_at
        rl_jobs = self._rl_jobs() if idle >= IDLE_AFTER and not stopped else 0
        left = max(0, self.cfg.total_steps - steps)
        state_f = st.get("f_mu", math.nan)
        return Snapshot(
            steps=steps, total_steps=self.cfg.total_steps, status=status,
            f_mu=sum(self.f_mus) / len(self.f_mus) if self.f_mus else state_f,
            f_mu_last=self.f_mus[-1] if self.f_mus else state_f,
            rate=rate, eta=left / rate if rate > 0 else (0.0 if left == 0 else math.nan),
            elapsed=now - self.t0, phase=self.phase.label(st, now, rl_jobs=rl_jobs, idle=idle),
            version=int(st.get("version", 0)), es_applied=int(st.get("es_applied", 0)),
            rl_applied=int(st.get("rl_applied", 0)), critic_version=int(st.get("critic_version", 0)), state=st)
