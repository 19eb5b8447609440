"""Child processes that die with their parent: the one process helper of the launcher, the
embedded Redis, the benchmarks and the tests.

Every child starts in a session (and process group) of its own, so that a Ctrl-C at the terminal
reaches the parent alone and the parent stops the children in its own order. Each child also asks
the kernel (prctl PR_SET_PDEATHSIG) to receive a signal the moment the thread that started it
dies, so that a `kill -9` of the parent, which runs no clean-up at all, still ends every child.
Stopping a child signals its whole process group, and every step of `stop_all` runs even when an
earlier one failed. `install_signal_handlers` turns SIGINT/SIGTERM into a stop event for the
scheduler and the critic daemon.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1

_libc = None


def _prctl():
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        except OSError:
            _libc = False
    return _libc.prctl if _libc else None


def die_with_parent(sig: int = signal.SIGKILL, thread_lives: bool = False) -> Callable[[], None]:
    """A preexec_fn: the child gets `sig` when the parent's starting thread ends (Linux only).

    If the parent is already gone when the child gets here (it died between fork and prctl),
    the child ends itself at once.
    """
    parent = os.getpid()
    # The signal follows the *thread* that forked: a child started from a short-lived thread
    # would die with that thread, so only children of the main thread ask for it, and those of a
    # thread that lives as long as the child should (`thread_lives`: a supervisor's).
    main = threading.current_thread() is threading.main_thread()
    prctl = _prctl() if main or thread_lives else None

    def preexec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


def spawn(cmd: list[str], *, log_file: str | os.PathLike | None = None, env: dict[str, str] | None = None,
          cwd: str | os.PathLike | None = None, death_signal: int = signal.SIGKILL,
          stdout=None, stderr=None, thread_lives: bool = False) -> subprocess.Popen:
    """Start `cmd` in its own session, ended with `death_signal` when this process dies (or, from
    another thread than the main one, when that thread ends, if `thread_lives` says it lives as long
    as this process; else the child outlives a kill -9 of this process).

    With `log_file`, stdout and stderr go (appended) to that file.
    """
    out = None
    if log_file is not None:
        out = open(log_file, "ab")  # noqa: SIM115 - the child holds its own copy; ours is closed below
        stdout, stderr = out, subprocess.STDOUT
    try:
        return subprocess.Popen(cmd, stdout=stdout, stderr=stderr, env=env, cwd=cwd, start_new_session=True,
                                preexec_fn=die_with_parent(death_signal, thread_lives))
    finally:
        if out is not None:
            out.close()


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the child's process group (the child leads it), or to the child alone."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:  # not our group after all (the child changed it): the child itself
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


def stop_all(procs: Iterable[tuple[str, subprocess.Popen]], grace: float = 15.0,
             sig: int = signal.SIGTERM) -> list[str]:
    """`sig` to every process group, wait up to `grace` s in all, then SIGKILL what is left.

    Each step runs for every process even when one fails; returns the names that had to be killed.
    """
    procs = list(procs)
    for name, p in procs:
        try:
            signal_group(p, sig)
        except Exception as exc:  # noqa: BLE001 - the others must still be stopped
            log.warning("could not signal %s (pid %d): %s", name, p.pid, exc)
    deadline = time.monotonic() + grace
    killed = []
    for name, p in procs:
        try:
            p.wait(max(0.05, deadline - time.monotonic()))
            continue
        except subprocess.TimeoutExpired:
            pass
        except Exception as exc:  # noqa: BLE001
            log.warning("waiting for %s (pid %d) failed: %s", name, p.pid, exc)
        killed.append(name)
        try:
            signal_group(p, signal.SIGKILL)
            p.wait(5)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not kill %s (pid %d): %s", name, p.pid, exc)
    # Whatever is left in the groups (a grandchild) goes too.
    for _name, p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
    return killed


class ProcessGroup:
    """Named child processes, each logging to LOG_DIR/NAME.log; `stop()` ends all of them."""

    def __init__(self, log_dir: str | os.PathLike, env: dict[str, str] | None = None,
                 cwd: str | os.PathLike | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.env = env
        self.cwd = cwd
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        p = spawn(cmd, log_file=self.log_dir / f"{name}.log", env=env or self.env, cwd=self.cwd)
        self.procs.append((name, p))
        return p

    start = spawn

    def get(self, name: str) -> subprocess.Popen | None:
        for n, p in self.procs:
            if n == name:
                return p
        return None

    def log(self, name: str) -> str:
        try:
            return (self.log_dir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, name: str, n: int = 1500) -> str:
        return self.log(name)[-n:]

    def stop(self, names_first: tuple[str, ...] = (), grace: float = 15.0, only=None) -> list[str]:
        """Stop the children (those whose names start with `names_first` are signalled first)."""
        chosen = [np_ for np_ in self.procs if only is None or np_[1] in only]
        chosen.sort(key=lambda np_: 0 if names_first and np_[0].startswith(names_first) else 1)
        return stop_all(chosen, grace=grace)

    def kill_all(self, grace: float = 1.0) -> list[str]:
        """Stop every child (subclasses may give `stop` another signature; this one is fixed)."""
        return stop_all(self.procs, grace=grace)


def start_critic_command(run_id: str, url: str) -> str:
    """The command that starts a critic daemon for a run, as a user pastes it (`url` already redacted)."""
    return f"aesrl-queue critic start --run {run_id} --redis-url {url}"


def worker_command(url: str, burst: bool = False, name: str | None = None) -> list[str]:
    """The command line of one `rq worker` of ours (AesrlWorker, both queues, RL first)."""
    cmd = [sys.executable, "-m", "rq.cli", "worker", "-w", "workers.AesrlWorker", "-u", url,
           "--logging_level", "WARNING"]
    if burst:
        cmd.append("--burst")
    if name:
        cmd += ["-n", name]
    return cmd + ["aesrl-rl", "aesrl-es"]


def install_signal_handlers(stop_event: threading.Event) -> None:
    """SIGINT/SIGTERM set the stop event (a second one raises KeyboardInterrupt).

    The scheduler's and the critic daemon's processes both install it, so it lives here, below both."""
    def handler(signum, frame):
        if stop_event.is_set():
            raise KeyboardInterrupt
        stop_event.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
