"""The failure breaker: why jobs fail, said once per cause on the run's problem line, and no more
jobs queued while every job fails (one probe job now and then until one succeeds).

The loop feeds it what its jobs report (`Scheduler._tell`) and what RQ says of jobs lost in
flight (`InFlight.find_lost`); `limit` caps the jobs the loop keeps in flight.
"""

from __future__ import annotations

import logging
import re
import time

from aesrl_queue.store import Store

log = logging.getLogger(__name__)

PLAIN_WORKER_HINT = "plain rq worker: use -w workers.AesrlWorker"
PLAIN_WORKER_CAUSE = ("jobs fail with DeserializationError: a plain `rq worker` (pickle serializer) took them; "
                      "start workers with `rq worker -w workers.AesrlWorker -u URL aesrl-rl aesrl-es` "
                      "(or `aesrl-queue worker`)")

# What to do about a failing job, by what its error text contains: (markers, what to do, a few words).
ADVICE = (
    (("spec_hash",), "the workers run other code or another environment version than the scheduler: give "
     "them the scheduler's and restart them", "update the workers"),
    (("ModuleNotFoundError", "ImportError", "No module named", "NameNotFound", "NamespaceNotFound",
      "DependencyNotInstalled"),
     "the workers cannot import the environment or a package it needs: install it where they run (a custom "
     "env's module must be importable there, docs/guide.md §6) and restart them", "install it on the workers"),
)
ADVICE_ELSE = ("the traceback is in the scheduler's log and the worker's (`aesrl-queue run`: RUN/logs/); fix "
               "its cause and restart the workers: the run goes on where it is", "traceback in the logs")


def failure_cause(text: str) -> tuple[str, str, str]:
    """(key, cause, hint) of a failed job from its error text or RQ's exc_string: the cause is the
    exception's last line and what to do, the hint both in a few words (the progress line); the
    key is the last line without numbers (job ids, pids), the same for every failure of one cause."""
    if "DeserializationError" in text or "UnpicklingError" in text:
        return "plain worker", PLAIN_WORKER_CAUSE, PLAIN_WORKER_HINT
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    last = lines[-1][:300] if lines else "unknown error"
    todo, short = next(((todo, short) for markers, todo, short in ADVICE if any(m in text for m in markers)),
                       ADVICE_ELSE)
    return re.sub(r"\d+", "#", last), f"jobs fail with {last}: {todo}", f"jobs fail: {last[:60]} ({short})"


class FailureBreaker:
    """Stops refilling slots after `after` failures in a row (no success between), and puts the cause
    of failing jobs on the run's problem line (scheduler/problems.py).

    A job that fails on every worker, or workers that cannot run our jobs at all (a plain `rq
    worker`), would otherwise be refilled and fail again for ever. The cause is shown from the first
    failure, per job kind: RL jobs that fail while ES jobs succeed (no torch on the workers) stay
    shown until an RL job succeeds. While open, one probe job is let through every `probe_every`
    seconds, and the first success closes the breaker.
    """

    def __init__(self, store: Store, after: int = 4, probe_every: float = 30.0) -> None:
        from scheduler.problems import ProblemLine

        self.store = store
        self.line = ProblemLine(store)  # also shows a missing critic (the loop feeds it)
        self.after = after
        self.probe_every = probe_every
        self.causes: dict[str, tuple[str, str, str]] = {}  # job kind -> (key, cause, hint) of its last failure
        self.streak = 0
        self.open = False
        self._probe_at = 0.0

    @property
    def cause(self) -> str | None:
        return next((c[1] for c in self.causes.values()), None)

    def failure(self, text: str, workers: int = 0, kind: str = "") -> None:
        key, cause, hint = failure_cause(text)
        if self.causes.get(kind, ("",))[0] != key:
            if all(c[0] != key for c in self.causes.values()):
                log.warning("run %s: %s\n%s", self.store.run_id, cause, text.strip()[-1500:])
            self.causes[kind] = (key, cause, hint)
            self._show()
        self.streak += 1
        if not self.open and self.streak >= max(self.after, workers):
            self.open = True
            self._probe_at = time.monotonic()
            log.error("run %s: %d jobs in a row failed (%s); no more jobs are queued, one probe job every %.0fs "
                      "until one succeeds", self.store.run_id, self.streak, cause, self.probe_every)
            self.store.set_state(breaker=f"open after {self.streak} failures in a row; one probe job every "
                                         f"{self.probe_every:.0f}s")

    def success(self, kind: str = "") -> None:
        self.streak = 0
        if self.open:
            log.warning("run %s: a job succeeded again; queueing jobs as before", self.store.run_id)
            self.open = False
            self.store.set_state(breaker="")
        if self.causes.pop(kind, None) is not None:
            self._show()

    def _show(self) -> None:
        latest = next(reversed(self.causes.values()), None)
        self.line.set("jobs", None if latest is None else latest[1:])

    def limit(self, target: int, inflight: int) -> int:
        """The in-flight target allowed: `target` when closed; while open, one more job (a probe)
        every probe_every seconds, else none."""
        if not self.open:
            return target
        now = time.monotonic()
        if now - self._probe_at >= self.probe_every:
            self._probe_at = now
            return min(target, inflight + 1)
        return min(target, inflight)
