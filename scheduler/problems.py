"""The run's problem line: the state fields `problem` (what is wrong and what to do, one sentence) and
`problem_hint` (a few words and the fix, for `run`'s progress line), which `status`, `status --watch`
and the progress line show.

Two sources feed it: failing jobs (FailureBreaker in scheduler/dispatch.py) and a missing or stalled
critic (the optimizer's `critic_problem`). Failing jobs come first: while jobs fail, the critic waits
for episodes that never come. The line is written only when what it shows changes, and its first
write replaces whatever an earlier scheduler of the run left there, its circuit breaker included.
"""

from __future__ import annotations

from aesrl_queue.connection import client_url
from aesrl_queue.procs import start_critic_command
from aesrl_queue.store import Store

ORDER = ("jobs", "critic")  # the first source with something to say is shown


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

    def critic(self, problem: tuple[str, str] | None) -> None:
        """The optimizer's `critic_problem` (checked after every ask: cheap when unchanged), with the
        command that starts a critic daemon."""
        if problem == self._critic and self.shown is not None:
            return
        self._critic = problem
        if problem is None:
            self.set("critic", None)
            return
        command = start_critic_command(self.store.run_id, client_url(self.store.r))
        self.set("critic", (f"{problem[0]}; start one: {command}", f"{problem[1]}: {command}"))

    def flush(self) -> None:
        line = next((self.sources[s] for s in ORDER if s in self.sources), ("", ""))
        if line != self.shown:
            # the first write also clears the circuit breaker an earlier scheduler of the run left open
            extra = {"breaker": ""} if self.shown is None else {}
            self.store.set_state(problem=line[0], problem_hint=line[1], **extra)
            self.shown = line
