"""The run's problem line: the state fields `problem` (what is wrong and what to do, one sentence) and
`problem_hint` (a few words and the fix, for `run`'s progress line), which `status`, `status --watch`
and the progress line show.

Two sources feed it: failing jobs (FailureBreaker in scheduler/breaker.py) and a missing or stalled
critic (the loop's critic gate, scheduler/critic_gate.py: its `problem`). Failing jobs come first: while jobs fail, the critic waits
for episodes that never come. The line is written only when what it shows changes, and its first
write replaces whatever an earlier scheduler of the run left there, its circuit breaker included.
"""

from __future__ import annotations

from aesrl_queue.connection import client_url
from aesrl_queue.procs import start_critic_command
from aesrl_queue.store import Store
from scheduler.critic_gate import (
    CRITIC_STALLED,
    GENERATION_GAVE_UP,
    GENERATION_WAITING,
    NO_CRITIC_GAVE_UP,
    NO_CRITIC_WAITING,
)

ORDER = ("jobs", "critic")  # the first source with something to say is shown
# What each of the critic gate's `problem`s means, (what is wrong, a few words); {wait} is critic_wait.
CRITIC_PROBLEMS = {
    NO_CRITIC_WAITING: ("no critic has published weights since the random phase ended: RL jobs are held for "
                        "critic_wait ({wait:.0f} s), then the run goes on with ES alone", "no critic"),
    NO_CRITIC_GAVE_UP: ("no critic has published weights within critic_wait ({wait:.0f} s): the run goes on "
                        "with ES alone, RL starts when a critic publishes", "no critic"),
    CRITIC_STALLED: ("the critic has trained no step for critic_wait ({wait:.0f} s) and trails the replay by "
                     "more than critic_lag: jobs go out without waiting for it (is its daemon running?)",
                     "critic stalled"),
    GENERATION_WAITING: ("no critic has trained what the generation's RL members need: they are held for "
                         "critic_wait ({wait:.0f} s), then evaluated without training", "no critic"),
    GENERATION_GAVE_UP: ("no critic trained within critic_wait ({wait:.0f} s): the generation's RL members are "
                         "evaluated without training", "no critic"),
}


def critic_line(problem: tuple[str, float]) -> tuple[str, str]:
    """(what is wrong, a few words) of the critic gate's `problem`."""
    what, short = CRITIC_PROBLEMS[problem[0]]
    return what.format(wait=problem[1]), short


class ProblemLine:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.sources: dict[str, tuple[str, str]] = {}
        self.shown: tuple[str, str] | None = None  # None: not written yet by this process
        self._critic: tuple[str, str] | None = None

    def set(self, source: str, line: tuple[str, str] | None) -> None:
        """(problem, hint) of `source`, or None when it has nothing to say."""
        if line is None:
            self.sources.pop(source, None)
        else:
            self.sources[source] = line
        self.flush()

    def critic(self, problem: tuple[str, float] | None) -> None:
        """The critic gate's `problem` (checked after every ask: cheap when unchanged), said in
        words with the command that starts a critic daemon."""
        if problem == self._critic and self.shown is not None:
            return
        self._critic = problem
        if problem is None:
            self.set("critic", None)
            return
        command = start_critic_command(self.store.run_id, client_url(self.store.r))
        what, short = critic_line(problem)
        self.set("critic", (f"{what}; start one: {command}", f"{short}: {command}"))

    def flush(self) -> None:
        line = next((self.sources[s] for s in ORDER if s in self.sources), ("", ""))
        if line != self.shown:
            # the first write also clears the circuit breaker an earlier scheduler of the run left open
            extra = {"breaker": ""} if self.shown is None else {}
            self.store.set_state(problem=line[0], problem_hint=line[1], **extra)
            self.shown = line
