"""Every read of a job's run data (dist:{v}, critic, replay) goes through one ReplicaReader: from the
host's replica (`aesrl-queue worker` starts one: workers/host_replica.py; `AESRL_READ_URL` names it)
with a bounded wait for what it does not hold yet, else from the primary. Without a replica the same
reader reads the primary directly. Writes never go to the replica. For a run with a fan-out instance
(docs/decisions.md) the reader's `primary` is that instance: the host's replica follows it, and what
the replica lacks is read there, never from the primary.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from aesrl_queue.codec import CodecError
from aesrl_queue.connection import RETRY_ON, connect, redact
from aesrl_queue.store import ANNOUNCE, Store

log = logging.getLogger(__name__)

READ_URL_ENV = "AESRL_READ_URL"
WAIT_ENV = "AESRL_READ_WAIT"
# How long a job waits for its distribution version to reach the replica before it reads the
# primary. Replicating 1 MB (a 129k-parameter μ and var) over 1 GbE takes ~10 ms.
DEFAULT_WAIT_S = 0.25
# After this many fallbacks in a row the copy is skipped for a while, so that jobs do not pay the wait
# every time: BYPASS_S seconds when it failed to answer (down, resyncing), and LAG_BYPASS_S when it
# answered but lacked what was asked (behind: a busy host), doubling while it stays behind, up to
# BYPASS_S. Every read skipped costs the primary the bytes (1 MB for a HalfCheetah μ/var, 2 MB for a
# critic), so a copy that is only behind is tried again soon; and the host's replica, when it dies,
# is started again within a few seconds (workers/host_replica.py), so a dead one is tried every 5 s.
BYPASS_AFTER = 3
BYPASS_S = 5.0
LAG_BYPASS_S = 1.0

# A job whose version is not on the replica yet waits for the announcement of the next version (a
# PUBLISH right after the scheduler's commit, replicated after the version's bytes) rather than polling; it
# looks again at least this often, in case an announcement came before its subscription.
ANNOUNCE_BACKSTOP_S = 0.1

T = TypeVar("T")
# A replica that is down, loading, or refusing (MASTERDOWN with replica-serve-stale-data no).
_REPLICA_ERRORS = (*RETRY_ON, redis.ResponseError)


class ReplicaError(RuntimeError):
    """The read URL does not name a usable replica; the message says what to do."""


class ReplicaReader:
    """Reads from a replica with a bounded wait for data it does not have yet, else from the primary.

    Correct when the replica lags because everything read through it is either immutable once
    written (`dist:{v}`, `config`, replay entries) or checked against a version that the primary
    named (`critic`): a lagging replica can only lack data, never hold a wrong version of it.
    """

    def __init__(self, primary: redis.Redis, replica: redis.Redis | None, wait_s: float = DEFAULT_WAIT_S,
                 url: str = "") -> None:
        self.primary = primary
        self.replica = replica
        self.wait_s = float(wait_s)
        self.url = url
        self._lock = threading.Lock()
        self._misses = 0  # fallbacks in a row
        self._errors = 0  # of them, the ones where the replica failed to answer (not merely lagged)
        self._bypass_until = 0.0
        self._lag_bypass_s = LAG_BYPASS_S  # the next skip for lagging; back to LAG_BYPASS_S after a hit
        self._subs: dict[str, redis.client.PubSub] = {}  # announcement channels subscribed on the replica
        # Counters, for logs, tests and the scale benchmark.
        self.stats = {"replica": 0, "waited": 0, "primary": 0, "errors": 0}

    # -- health ---------------------------------------------------------------------------------------
    def usable(self) -> bool:
        return self.replica is not None and time.monotonic() >= self._bypass_until

    def fallbacks(self) -> int:
        """Reads meant for the replica that went to the primary (0 without a replica)."""
        return self.stats["primary"] if self.replica is not None else 0

    def _count(self, name: str) -> None:
        with self._lock:
            self.stats[name] += 1

    def _hit(self) -> None:
        with self._lock:
            self.stats["replica"] += 1
            self._misses = self._errors = 0
            self._lag_bypass_s = LAG_BYPASS_S

    def _miss(self, why: str, error: bool = False) -> None:
        with self._lock:
            self.stats["primary"] += 1
            self._misses += 1
            self._errors += int(error)
            if self._misses >= BYPASS_AFTER and self.usable():
                if self._errors:
                    skip = BYPASS_S
                    hint = " — check `INFO replication` on the replica (master_link_status)"
                else:
                    skip, self._lag_bypass_s = self._lag_bypass_s, min(BYPASS_S, 2 * self._lag_bypass_s)
                    hint = " (behind, not down)"
                self._bypass_until = time.monotonic() + skip  # then one more miss skips it again
                # A copy briefly behind is routine on a busy host; one down or behind for long is not.
                log.log(logging.WARNING if skip >= BYPASS_S else logging.INFO,
                        "replica %s: %d reads in a row fell back to the primary (%s); reading the primary "
                        "for %gs%s", redact(self.url), self._misses, why, skip, hint)

    def check(self) -> dict[str, Any]:
        """INFO replication of the replica; ReplicaError when unreachable or not a replica."""
        try:
            info = self.replica.info("replication")
        except (redis.RedisError, OSError) as exc:
            raise ReplicaError(f"cannot reach the read replica at {redact(self.url)}: {exc}") from None
        if info.get("role") != "slave":
            raise ReplicaError(
                f"{redact(self.url)} is not a replica (role {info.get('role')}): start it with "
                "`redis-server --replicaof PRIMARY_HOST PRIMARY_PORT` (and --masterauth PASSWORD)"
            )
        return info

    # -- reads ----------------------------------------------------------------------------------------
    def read(self, fn: Callable[[redis.Redis], T], append_only: bool = False) -> T:
        """fn(replica), or fn(primary) when the replica is skipped or fails to answer.

        `append_only`: a read of a stream (the replay), where a lagging copy only has fewer entries and
        the next read takes the rest; it stays on the replica while the replica is skipped for lagging,
        so a copy that falls behind at a run's start does not send whole replay catch-ups to the primary."""
        if self.replica is None:
            return fn(self.primary)
        if self.usable() or (append_only and not self._errors):
            try:
                out = fn(self.replica)
                self._hit()
                return out
            except _REPLICA_ERRORS as exc:
                self._count("errors")
                self._miss(f"{type(exc).__name__}: {exc}", error=True)
        else:
            self._count("primary")
        return fn(self.primary)

    def _listener(self, channel: str) -> redis.client.PubSub | None:
        """A subscription on the replica to `channel` (kept for the process), None if it fails."""
        sub = self._subs.get(channel)
        if sub is None:
            try:
                sub = self.replica.pubsub(ignore_subscribe_messages=True)
                sub.subscribe(channel)
            except _REPLICA_ERRORS:
                return None
            self._subs[channel] = sub
        return sub

    def _announced(self, sub: redis.client.PubSub | None, timeout: float) -> None:
        """Wait up to `timeout` for an announcement on `sub` (without one, sleep `timeout`)."""
        if sub is None:
            time.sleep(timeout)
            return
        try:
            sub.get_message(timeout=timeout)
        except _REPLICA_ERRORS:
            self._subs = {k: v for k, v in self._subs.items() if v is not sub}
            time.sleep(timeout)

    @staticmethod
    def _drain(sub: redis.client.PubSub | None) -> None:
        """Drop the announcements of earlier versions that queued up between jobs."""
        quiet = 0
        try:
            while sub is not None and quiet < 2:  # a None also stands for a subscription's own reply
                quiet = 0 if sub.get_message(timeout=0.0) is not None else quiet + 1
        except _REPLICA_ERRORS:
            pass

    def wait_for(self, fn: Callable[[redis.Redis], T | None], what: str, channel: str | None = None) -> T:
        """fn(replica) until it returns something other than None (up to wait_s), else fn(primary).

        `fn` returns None for "not there yet"; CodecError when the primary does not have it either.
        With `channel`, a replica that lacks it is asked again when the primary's announcement of a
        new version reaches the replica (a PUBLISH right after the commit that wrote it, replicated in
        order after the write), and at the latest every ANNOUNCE_BACKSTOP_S."""
        if self.replica is None:
            out = fn(self.primary)
            if out is None:
                raise CodecError(f"{what} is not in Redis (expired?)")
            return out
        if self.usable():
            deadline = time.monotonic() + self.wait_s
            delay = 0.001
            waited = False
            sub = self._listener(channel) if channel else None
            self._drain(sub)
            try:
                while True:
                    out = fn(self.replica)
                    if out is not None:
                        self._hit()
                        if waited:
                            self._count("waited")
                        return out
                    left = deadline - time.monotonic()
                    if left <= 0 or (sub is None and delay > left):
                        break
                    waited = True
                    if sub is not None:
                        self._announced(sub, min(left, ANNOUNCE_BACKSTOP_S))
                    else:
                        time.sleep(delay)
                        delay = min(2 * delay, 0.02)
                self._miss(f"{what} not on the replica after {self.wait_s:.2f}s")
            except _REPLICA_ERRORS as exc:
                self._count("errors")
                self._miss(f"{type(exc).__name__}: {exc}", error=True)
        else:
            self._count("primary")
        out = fn(self.primary)
        if out is None:
            raise CodecError(f"{what} is in neither the replica nor the primary (expired?)")
        return out

    def dist(self, store: Store, version: int, tag: bytes | None = None) -> tuple[bytes, bytes]:
        """The raw mu and var blobs of dist:{version} (immutable once written), carrying the run token
        `tag` that the primary named (a copy of an earlier run of the same id is not there yet)."""
        return self.wait_for(lambda c: store.dist_blobs(version, client=c, tag=tag), f"distribution version {version}",
                             channel=store.key(ANNOUNCE))

    def critic(self, store: Store, at_least: int, tag: bytes | None = None) -> tuple[int, bytes]:
        """(version, weights blob) of the critic, of version >= at_least (what the primary named) and of
        this run (`tag`)."""

        def get(c: redis.Redis):
            got = store.critic_blob(client=c, tag=tag)
            return None if got is None or got[0] < at_least else got

        return self.wait_for(get, f"critic version {at_least}")


_READERS: dict[tuple[int, str], ReplicaReader] = {}


def read_url() -> str | None:
    return os.environ.get(READ_URL_ENV) or None


def reader_for(primary: redis.Redis, url: str | None = None) -> ReplicaReader:
    """The process's reader for `primary`: through the replica $AESRL_READ_URL (or `url`) names, or,
    when none is named, straight from the primary."""
    url = url or read_url() or ""
    key = (id(primary), url)
    reader = _READERS.get(key)
    if reader is None:
        client = None
        if url:
            # Fail fast on a dead replica: the primary answers instead (connect()'s default retries ~20 s).
            client = connect(url, check=False, retries=1, socket_connect_timeout=1.0, socket_timeout=10.0)
        wait = float(os.environ.get(WAIT_ENV, DEFAULT_WAIT_S))
        reader = _READERS[key] = ReplicaReader(primary, client, wait_s=wait, url=url)
        if url:
            log.info("reading run data from replica %s (wait up to %.2fs for a version)", redact(url), wait)
    return reader


def fallbacks() -> int:
    """Reads of this process meant for its host's replica that went to the primary."""
    return sum(r.fallbacks() for r in list(_READERS.values()))
