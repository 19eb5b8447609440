"""The host's copy of the run data: a stock Redis replica (`replicaof`) that `aesrl-queue worker` starts
beside its workers and keeps alive.

The replica follows its source (the primary, or another host's replica for a tree of hosts) with
Redis's own replication: authenticated with `masterauth` (the source URL's password), over TLS when
the source URL is `rediss://`, with partial resync after a short cut. The replica has a password of
its own (`requirepass`), so a local user without it can neither read nor write what the host's
workers trust; its settings (passwords included) live in a file only this user can read, never on
a command line that `ps` shows.

A supervisor thread looks at the replica every second: a dead redis-server is started again on the
same port with the same password (the workers' read URL stays valid), and every BEAT_S seconds the
host's link, lag and restarts are written to the primary for `aesrl-queue status`.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import redis

from aesrl_queue import procs
from aesrl_queue.connection import redact
from aesrl_queue.redis_server import RedisServer
from aesrl_queue.store import host_beat

log = logging.getLogger(__name__)

PASSWORD_ENV = "AESRL_REPLICA_PASSWORD"  # the replica's own password (a host that chains from this one needs it)
CHECK_S = 1.0  # seconds between looks at the replica's process: a dead one is back within ~CHECK_S + its start
BEAT_S = 2.0  # seconds between the host's reports to the primary


def _source(url: str) -> tuple[str, int, str | None, dict[str, str] | None]:
    """(host, port, password, TLS files or None) of a redis:// or rediss:// URL (its ACL user name:
    _user); the TLS files are
    the CA (`ssl_ca_certs` in the URL, else $AESRL_REDIS_CA) and a client certificate and key
    (`ssl_certfile`, `ssl_keyfile`) where the URL names them."""
    pool = redis.ConnectionPool.from_url(url)
    kw = pool.connection_kwargs
    tls = None
    if issubclass(pool.connection_class, redis.SSLConnection):
        tls = {"ca": kw.get("ssl_ca_certs") or os.environ.get("AESRL_REDIS_CA") or "",
               "cert": kw.get("ssl_certfile") or "", "key": kw.get("ssl_keyfile") or ""}
    return str(kw.get("host", "127.0.0.1")), int(kw.get("port", 6379)), kw.get("password"), tls


def _user(url: str) -> str | None:
    """The ACL user a URL names (redis://USER:PASSWORD@...), None for the default user."""
    return redis.ConnectionPool.from_url(url).connection_kwargs.get("username") or None


class HostReplica:
    """A supervised `redis-server --replicaof SOURCE` on this host; `url` (with its password) is what
    the host's workers read from."""

    def __init__(self, source_url: str, primary: redis.Redis | None = None, directory: str | os.PathLike | None = None,
                 bind: str = "127.0.0.1", port: int | None = None, password: str | None = None,
                 name: str | None = None) -> None:
        self.source_url = source_url
        self.primary = primary  # where the host reports (None: no reports)
        self.password = password or os.environ.get(PASSWORD_ENV) or secrets.token_urlsafe(24)
        self.server = RedisServer(port=port, directory=directory, bind=bind)
        self.server.password = self.password  # for .url; requirepass goes into the config file, not argv
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.restarts = 0
        self.stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._source_client: redis.Redis | None = None
        self._client: redis.Redis | None = None

    @property
    def url(self) -> str:
        return self.server.url

    def _config_file(self) -> Path:
        host, port, auth, tls = _source(self.source_url)
        lines = [f"requirepass {self.password}", f"replicaof {host} {port}", "replica-read-only yes",
                 # a replica still loading or cut off answers with what it has; jobs check versions
                 "replica-serve-stale-data yes", "repl-diskless-load on-empty-db"]
        if auth:
            lines.append(f"masterauth {auth}")
            if _user(self.source_url):  # an ACL user (it needs +psync +replconf +ping: docs/security.md)
                lines.append(f"masteruser {_user(self.source_url)}")
        if tls is not None:  # the source speaks TLS: so does the link (the CA is the one the workers use)
            lines.append("tls-replication yes")
            if not (tls["cert"] and tls["key"]):  # Redis needs a certificate of its own to speak TLS at all
                tls["cert"], tls["key"] = self._own_certificate()
            for name, value in (("tls-ca-cert-file", tls["ca"]), ("tls-cert-file", tls["cert"]),
                                ("tls-key-file", tls["key"])):
                if value:
                    lines.append(f"{name} {value}")
        path = self.server.directory / "replica.conf"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        return path

    def _own_certificate(self) -> tuple[str, str]:
        """A self-signed certificate and key for the replica's side of a TLS link (a source that
        checks client certificates, `tls-auth-clients yes`, needs one signed by its CA instead:
        name it in the URL as ssl_certfile and ssl_keyfile)."""
        cert, key = self.server.directory / "replica.crt", self.server.directory / "replica.key"
        if not (cert.exists() and key.exists()):
            try:
                subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                                "-out", str(cert), "-days", "3650", "-subj", "/CN=aesrl-host-replica"],
                               check=True, capture_output=True, timeout=60)
            except (OSError, subprocess.SubprocessError) as exc:
                raise RuntimeError("a TLS source needs a client certificate for the host replica: put "
                                   f"ssl_certfile and ssl_keyfile in its URL (openssl could not make one: {exc})") from None
            os.chmod(key, 0o600)
        return str(cert), str(key)

    def _args(self) -> list[str]:
        args = self.server.args()
        # redis-server CONFIG-FILE [options]: the file first; drop the --requirepass args() added
        i = args.index("--requirepass")
        del args[i:i + 2]
        return [args[0], str(self._config_file()), *args[1:]]

    def _spawn(self) -> None:
        self.server.binary = self.server.binary or self.server.args()[0]
        # SIGTERM when this process dies, even by kill -9, also when the supervisor thread (which lives
        # until stop()) started it again.
        self.server.proc = procs.spawn(self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       death_signal=signal.SIGTERM, thread_lives=True)
        if not self.server.wait_answering(10.0):
            raise RuntimeError(f"the host replica on port {self.server.port} did not answer in 10 s")

    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5, socket_timeout=2.0)
        return self._client

    def start(self, wait_sync_s: float = 0.0) -> HostReplica:
        """Start the replica (and, with wait_sync_s, wait that long at most for its first sync) and the
        supervisor thread."""
        self._spawn()
        if wait_sync_s:
            self.wait_synced(wait_sync_s)
        self._thread = threading.Thread(target=self._supervise, name="aesrl-host-replica", daemon=True)
        self._thread.start()
        return self

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.client().info("replication").get("master_link_status") == "up":
                    return True
            except redis.RedisError:
                pass
            time.sleep(0.05)
        return False

    def alive(self) -> bool:
        return self.server.proc is not None and self.server.proc.poll() is None

    def _supervise(self) -> None:
        beat_at = 0.0
        while not self.stop_event.wait(CHECK_S):
            if not self.alive():
                log.warning("host replica on port %d exited (%s); starting it again", self.server.port,
                            self.server.proc.returncode if self.server.proc else "?")
                try:
                    self._spawn()
                    self.restarts += 1
                except (RuntimeError, OSError) as exc:
                    log.warning("host replica did not start again: %s; trying again in %gs", exc, CHECK_S)
                    continue
            if self.primary is not None and time.monotonic() - beat_at >= BEAT_S:
                try:
                    host_beat(self.primary, self.name, self.report())
                    beat_at = time.monotonic()
                except (redis.RedisError, OSError) as exc:
                    log.debug("host report failed: %s", exc)

    def report(self) -> dict[str, Any]:
        """The host's link as `status` shows it: link status, lag (bytes of the source's replication
        stream not yet applied, and seconds since the source was last heard), restarts."""
        out: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "port": self.server.port,
                               "source": redact(self.source_url), "restarts": self.restarts,
                               "link": "down", "lag_bytes": -1, "io_s": -1}
        try:
            info = self.client().info("replication")
        except redis.RedisError:
            return out
        out["link"] = str(info.get("master_link_status", "down"))
        out["io_s"] = int(info.get("master_last_io_seconds_ago", -1))
        try:
            if self._source_client is None:
                self._source_client = redis.Redis.from_url(self.source_url, socket_connect_timeout=1.0, socket_timeout=2.0)
            source = int(self._source_client.info("replication").get("master_repl_offset", 0))
            out["lag_bytes"] = max(0, source - int(info.get("slave_repl_offset", info.get("master_repl_offset", 0))))
        except (redis.RedisError, OSError):
            pass
        return out

    def stop(self) -> None:
        self.stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.server.cleanup()
