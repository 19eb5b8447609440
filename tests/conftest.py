"""Shared fixtures: a private redis-server per test module on a free port, and real child processes.

No mocks of Redis or RQ: integration tests talk to a real server and real `rq worker` processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aesrl_queue.procs import spawn, stop_all
from aesrl_queue.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    # Two torch threads beside another busy process run 5-10x slower on a 2-core machine.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


@pytest.fixture()
def redis_server(tmp_path):
    server = RedisServer(directory=tmp_path / "redis").start()
    yield server
    server.cleanup()


def password_server(directory: Path, password: str):
    """A redis-server of its own under `directory` with `password`, quick to serve a full resync to a
    replica (no diskless-sync delay); a generator for a fixture to yield from."""
    server = RedisServer(directory=directory, password=password,
                         extra_args=["--repl-diskless-sync-delay", "0"]).start()
    yield server
    server.cleanup()


@pytest.fixture()
def redis_url(redis_server):
    return redis_server.url


@pytest.fixture()
def client(redis_url):
    from aesrl_queue.connection import connect

    c = connect(redis_url)
    yield c
    c.close()


def child_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("AESRL_REDIS_URL", None)
    # pytest-xdist's workers set COLUMNS=80: a child's terminal width is the one its test gives it
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    return env


class Procs:
    """Child processes of one test, each logging to a file; all are killed at teardown (and die with
    the test process: aesrl_queue.procs)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        p = spawn(cmd, log_file=self.log_dir / f"{name}.log", env=child_env(), cwd=ROOT)
        self.procs[name] = p
        return p

    def cli(self, name: str, *args: str) -> subprocess.Popen:
        return self.start(name, [sys.executable, "-m", "cli.main", *args])

    def rq_worker(self, name: str, url: str, *extra: str) -> subprocess.Popen:
        return self.start(name, [sys.executable, "-m", "rq.cli", "worker", "-w", "workers.AesrlWorker", "-u", url,
                                 *extra, "aesrl-rl", "aesrl-es"])

    def log(self, name: str) -> str:
        try:
            return (self.log_dir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""

    def logs(self) -> str:
        return "\n".join(f"===== {n}\n{self.log(n)[-3000:]}" for n in self.procs)

    def stop_all(self) -> None:
        stop_all(self.procs.items(), grace=10.0, sig=signal.SIGKILL)


@pytest.fixture()
def procs(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    p = Procs(d)
    yield p
    p.stop_all()


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition", on_fail=None):
    """Poll `predicate` until it returns a truthy value; fail the test with `what` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    extra = on_fail() if on_fail else ""
    pytest.fail(f"timed out after {timeout}s waiting for {what}\n{extra}")


def default_sigint() -> None:
    """In a child before exec: Ctrl-C interrupts, as at a terminal. A shell without job control starts
    background commands (a suite run with `&` or nohup) with SIGINT ignored, and children inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (from /proc)."""
    parents: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
