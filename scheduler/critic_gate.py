"""Critic gating: when the loop may ask its optimizer for RL jobs, given the critic's progress.

An RL job trains its actor against the published critic, so the loop holds RL jobs until a critic
is there, and the optimizer only hears whether it may make them (`ask(..., rl=...)`). The gate holds
the clocks of those waits (they restart with the process, as the loop's memory does), says whether
the loop waits for the critic (`waiting`: it then polls often) and what is wrong with it (`problem`,
which scheduler/problems.py puts on the run's problem line). One gate per way of telling:

- `ResultGate` (an optimizer that tells every result: aesrl, es, opo, acemrl): past the random
  phase, no jobs for up to critic_wait while no critic has published, then ES alone until one does;
  with a critic, no jobs while it trails its schedule (`config.critic_due`: a step per stored step) by
  more than critic_lag (unless it stopped training for critic_wait), and within the lag no more jobs
  out, those in flight counted, than the room left under it holds.
- `GenerationGate` (a generation at a time: cemrl, pcemrl): a generation's RL members wait for the
  critic steps their optimizer requested (critic_on_request), or for a published critic; after
  critic_wait without one they run as ES members, untrained.
"""

from __future__ import annotations

import logging
import math

from aesrl_queue.algorithms import algorithm
from aesrl_queue.config import RunConfig, critic_due, critic_too_far_behind
from aesrl_queue.optimizers import JobSpec, uses_rl

log = logging.getLogger(__name__)

# A critic daemon that runs publishes its first weights seconds after the replay holds a batch (its
# first chunk of training), so a run that has waited a quarter of critic_wait for one (30 s of the
# default 120 s) most likely has none: that is when `problem` names it.
NO_CRITIC_AFTER = 0.25

# What `problem` reports, with the seconds of critic_wait: scheduler/problems.py says what each means
# and how to start a critic.
NO_CRITIC_WAITING = "no critic, waiting"  # jobs are held for critic_wait
NO_CRITIC_GAVE_UP = "no critic, going on"  # the run goes on with ES alone until a critic publishes
CRITIC_STALLED = "critic stalled"  # no trained step for critic_wait: jobs go out without waiting
GENERATION_WAITING = "no critic for the generation, waiting"  # its RL members are held
GENERATION_GAVE_UP = "no critic for the generation, going on"  # its RL members run untrained


def make_gate(cfg: RunConfig, opt) -> ResultGate | GenerationGate:
    """The gate of `cfg.algo`'s optimizer, by how it tells (its registry entry)."""
    return (GenerationGate if algorithm(cfg.algo).tells == "generation" else ResultGate)(cfg, opt)


class ResultGate:
    """Critic gating of an asynchronous optimizer (AesrlOptimizer)."""

    def __init__(self, cfg: RunConfig, opt) -> None:
        self.cfg, self.opt = cfg, opt
        self.rl = uses_rl(cfg)
        self.problem: tuple[str, float] | None = None  # (which problem, critic_wait), or None
        self._since: float | None = None  # when the wait for the first critic began (the loop's clock)
        self._warned = -math.inf
        # holding jobs for a critic that trails the replay: (since, critic steps then) on the clock
        self._lag_wait: tuple[float, int] | None = None
        self._lag_holding = False  # the last ask held jobs for it (a stalled critic no longer does)

    @property
    def waiting(self) -> bool:
        """Holding jobs back for the critic: the loop polls often."""
        return self._since is not None or self._lag_holding

    def ask(self, n: int, steps: int, inflight: int, critic_version: int, critic_steps: int,
            now: float) -> list[JobSpec]:
        """Up to `n` new jobs from the optimizer, given the stored steps, the jobs in flight, the
        critic's version and trained steps, and a monotonic clock; none while holding for the critic."""
        cfg = self.cfg
        n = self.opt.room(n, steps, inflight)  # the budget first: no wait begins for jobs it has no room for
        if n <= 0:
            return []
        rl_ready = self.rl and critic_version > 0
        if rl_ready:
            self._since = None
            self.problem = None
        # A critic cannot train before the replay holds a batch: never wait for one before that,
        # even when the random phase is shorter (initial_steps 0 would otherwise wait critic_wait).
        elif self.rl and steps >= max(cfg.initial_steps, cfg.batch_size):
            # The random phase is over but no critic exists yet: hold new jobs for a while rather
            # than spend the budget on ES alone (a critic daemon needs seconds to start and train).
            if self._since is None:
                self._since = now
                log.info("run %s: initial phase over; waiting up to %.0fs for the first critic", cfg.run_id,
                         cfg.critic_wait)
            waited = now - self._since
            if waited < cfg.critic_wait:
                if waited >= NO_CRITIC_AFTER * cfg.critic_wait:
                    self.problem = (NO_CRITIC_WAITING, cfg.critic_wait)
                return []
            self.problem = (NO_CRITIC_GAVE_UP, cfg.critic_wait)
            if now - self._warned > 60:
                self._warned = now
                log.warning("run %s: %d steps stored but no critic published yet; dispatching ES jobs meanwhile",
                            cfg.run_id, steps)
        self._lag_holding = rl_ready and self._behind(steps, critic_steps, now)
        if self._lag_holding:
            return []
        room = cfg.critic_lag - (critic_due(cfg, steps) - critic_steps)
        if rl_ready and cfg.critic_lag and steps >= cfg.initial_steps and room >= 0:
            # within critic_lag: as many jobs as the room left after those in flight holds (each at the
            # optimizer's expected steps per job), none while those in flight fill it, and one when
            # nothing is in flight. The loop asks at every event, so a gate that ignored the jobs in flight
            # would open to a burst of up to every free slot drawn from one μ, which overshoot the lag
            # together (a stopped critic, which no longer holds the run with room < 0, caps nothing)
            left = math.ceil(room / self.opt.job_steps()) - inflight
            if inflight and left <= 0:
                self._lag_holding = True  # the critic's progress opens the room: the loop polls often
                return []
            n = min(n, max(1, left))
        return self.opt.ask(n, steps, inflight, rl=rl_ready)

    def _behind(self, steps: int, critic_steps: int, now: float) -> bool:
        """Whether to hold new jobs because the critic trails its schedule by more than `critic_lag`.

        Only after the random phase, and only while the critic moves: a critic that has not trained
        a step for `critic_wait` seconds (a daemon stopped or lost) no longer holds the run."""
        cfg = self.cfg
        if not critic_too_far_behind(cfg, steps, critic_steps):
            self._lag_wait = None
            return False
        if self._lag_wait is None or critic_steps > self._lag_wait[1]:
            if self._lag_wait is None:
                log.debug("run %s: critic %d steps behind the replay; holding new jobs", cfg.run_id,
                          critic_due(cfg, steps) - critic_steps)
            self._lag_wait = (now, critic_steps)
            return True
        if now - self._lag_wait[0] < cfg.critic_wait:
            return True
        self.problem = (CRITIC_STALLED, cfg.critic_wait)
        if now - self._warned > 60:
            self._warned = now
            log.warning("run %s: the critic has trained no step for %.0fs and trails the replay by %d steps; "
                        "dispatching meanwhile", cfg.run_id, now - self._lag_wait[0], critic_due(cfg, steps) - critic_steps)
        return False


class GenerationGate:
    """Critic gating of a synchronous optimizer (CemOptimizer): its RL members wait for their critic."""

    def __init__(self, cfg: RunConfig, opt) -> None:
        self.cfg, self.opt = cfg, opt
        self.problem: tuple[str, float] | None = None
        self._wait: dict[str, float] | None = None  # since, trained (critic steps), moved: the loop's clock

    @property
    def waiting(self) -> bool:
        return self._wait is not None

    def ask(self, n: int, steps: int, inflight: int, critic_version: int, critic_steps: int,
            now: float) -> list[JobSpec]:
        """The members the optimizer dispatches now; none while its next RL member waits for the critic."""
        cfg = self.cfg
        need = self.opt.critic_need(steps, inflight)  # (on "steps" or "version", target), or None
        if need is None:
            return self.opt.ask(n, steps, inflight, rl=True)
        if self._wait is None:
            self._wait = {"since": now, "trained": critic_steps, "moved": now}
        w = self._wait
        on, target = need
        if (critic_steps if on == "steps" else critic_version) >= target:
            self._wait = None
            self.problem = None
            return self.opt.ask(n, steps, inflight, rl=True)
        if critic_steps > w["trained"]:  # a critic that trains (serial CEM-RL asks for many steps) is there
            w.update(trained=critic_steps, moved=now)
        elif now - w["moved"] >= NO_CRITIC_AFTER * cfg.critic_wait:
            self.problem = (GENERATION_WAITING, cfg.critic_wait)
        if now - w["since"] > cfg.critic_wait:
            log.warning("run %s: no critic trained within %.0fs; generation %d evaluates its RL members without "
                        "training", cfg.run_id, cfg.critic_wait, self.opt.generation)
            self._wait = None
            self.problem = (GENERATION_GAVE_UP, cfg.critic_wait)
            return self.opt.ask(n, steps, inflight, rl=False)
        return []
