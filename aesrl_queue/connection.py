"""Redis clients for every component: URL handling, reconnect with backoff, errors that say what to do.

One place decides socket timeouts (redis-py 8 defaults to 5 s, which breaks blocking reads).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time

import redis
from redis.backoff import ExponentialBackoff
from redis.connection import PythonRespSerializer
from redis.retry import Retry

try:
    from redis.connection import HiredisRespSerializer
    from redis.utils import HIREDIS_AVAILABLE
except ImportError:  # an older or newer redis-py: the pure-Python packer alone is still correct
    HiredisRespSerializer, HIREDIS_AVAILABLE = None, False

log = logging.getLogger(__name__)

ENV_URL = "AESRL_REDIS_URL"
DEFAULT_URL = "redis://127.0.0.1:6379/0"
# Errors worth retrying: the server restarted or the link dropped for a moment.
RETRY_ON = (redis.ConnectionError, redis.TimeoutError, ConnectionResetError, OSError)


class RedisUnavailable(RuntimeError):
    """Redis could not be reached; the message says where and what to do."""


class _Outage:
    """One log line when Redis stops answering and one when it answers again, per process.

    redis-py's retries are silent; without this a Redis restart leaves no trace in any log.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.since: float | None = None

    def down(self, exc: BaseException) -> None:
        with self.lock:
            if self.since is None:
                self.since = time.monotonic()
                log.warning("Redis unreachable (%s); retrying with backoff", exc)

    def up(self) -> None:
        if self.since is None:  # the common case, without the lock
            return
        with self.lock:
            if self.since is not None:
                log.warning("Redis reachable again after %.1fs", time.monotonic() - self.since)
                self.since = None


OUTAGE = _Outage()


class _Refused(Exception):
    """Carries an AuthenticationError through Retry without a retry (not in its supported errors)."""

    def __init__(self, error: redis.AuthenticationError) -> None:
        super().__init__(str(error))
        self.error = error


class _Retry(Retry):
    """Retry with backoff, except when Redis refuses the credentials: asking again cannot help.

    redis-py's AuthenticationError is a ConnectionError, so a plain Retry on ConnectionError
    repeats a refused login (nested in the connect and command retries: ~90 s before the error).
    """

    def call_with_retry(self, do, fail, *args, **kwargs):
        def attempt():
            try:
                out = do()
            except redis.AuthenticationError as exc:
                raise _Refused(exc) from exc
            except RETRY_ON as exc:
                OUTAGE.down(exc)
                raise
            OUTAGE.up()
            return out

        try:
            return super().call_with_retry(attempt, fail, *args, **kwargs)
        except _Refused as refused:
            raise refused.error from None


class _Pipeline(redis.client.Pipeline):
    """A pipeline that loads its Lua scripts again before it resends its commands.

    redis-py loads a pipeline's scripts once per execute, before the first send. When the link drops
    and the retry resends the MULTI/EXEC to a Redis that restarted meanwhile (its script cache empty),
    every EVALSHA in it failed with NoScriptError (seen: the td3 baseline's episode append, right
    after a Redis restart on its AOF)."""

    _sends = 0

    def execute(self, raise_on_error: bool = True):
        self._sends = 0
        return super().execute(raise_on_error)

    def _execute_transaction(self, connection, commands, raise_on_error):
        self._before_send()
        return super()._execute_transaction(connection, commands, raise_on_error)

    def _execute_pipeline(self, connection, commands, raise_on_error):
        self._before_send()
        return super()._execute_pipeline(connection, commands, raise_on_error)

    def _before_send(self) -> None:
        self._sends += 1
        if self._sends > 1 and self.scripts:
            self.load_scripts()


class _Redis(redis.Redis):
    """redis.Redis whose pipelines are _Pipeline."""

    def pipeline(self, transaction=True, shard_hint=None):
        return _Pipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)


# A value longer than this is sent as its own buffer, never copied into the command (redis-py's cutoff).
LARGE_VALUE = 6000


class CommandPacker:
    """Packs commands into RESP: hiredis for ordinary commands, pure Python for those with a large value.

    hiredis packs small commands fastest, but it copies every value into one new buffer: measured
    here at ~1 ms of CPU for one 512 KB μ, about as much as the rest of a scheduler apply. The
    pure-Python packer hands a large value to the socket as it is. Stateless: one is shared.
    """

    def __init__(self) -> None:
        self.python = PythonRespSerializer(LARGE_VALUE, redis.connection.Encoder("utf-8", "strict", False).encode)
        self.hiredis = HiredisRespSerializer() if HIREDIS_AVAILABLE and HiredisRespSerializer else None
        self._pack_command = None
        if self.hiredis is not None:
            import hiredis  # noqa: PLC0415

            self._pack_command = hiredis.pack_command

    def pack(self, *args):
        # A scheduler apply packs ~20 commands: this path is hot, so types are compared, not isinstance'd.
        if self._pack_command is None:
            return self.python.pack(*args)
        views = False
        for arg in args:
            t = type(arg)
            if t is bytes:
                if len(arg) > LARGE_VALUE:
                    return self.python.pack(*args)
            elif t is memoryview or t is bytearray:
                if arg.nbytes > LARGE_VALUE if t is memoryview else len(arg) > LARGE_VALUE:
                    return self.python.pack(*args)
                views = True
        first = args[0]
        if views or type(first) is not str or " " in first:
            return self.hiredis.pack(*args)  # splits 'CONFIG GET'-style names, copies small views
        try:
            return [self._pack_command(args)]
        except TypeError as exc:
            raise redis.DataError(str(exc)) from None


PACKER = CommandPacker()


def use_packer(client: redis.Redis) -> redis.Redis:
    """Make `client` (one made elsewhere, e.g. by `rq worker -u URL`) pack commands with PACKER."""
    pool = client.connection_pool
    pool.connection_kwargs["command_packer"] = PACKER
    # Connections already open keep the packer they were made with; swap it where redis-py allows.
    for attr in ("_available_connections", "_in_use_connections"):
        for conn in list(getattr(pool, attr, ()) or ()):
            if hasattr(conn, "_command_packer"):
                conn._command_packer = PACKER
    return client


def without_retries(client: redis.Redis) -> redis.Redis:
    """A client on the same server and settings as `client` that never resends a command.

    For writes that must happen at most once: redis-py resends a whole MULTI/EXEC when the link
    drops after it was sent, and if Redis had already run it the second copy runs too. Without
    retries the caller gets the ConnectionError and decides from what Redis holds.
    """
    from redis.backoff import NoBackoff  # noqa: PLC0415

    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs["retry"] = Retry(NoBackoff(), 0)
    return redis.Redis(connection_pool=type(pool)(connection_class=pool.connection_class, **kwargs))


def backoff_retry(retries: int = 8) -> Retry:
    """The retry policy of every client here: exponential backoff 0.1 s .. 2 s (~9 s in all for 8),
    a log line when Redis stops and starts answering, no retry of refused credentials."""
    return _Retry(ExponentialBackoff(cap=2.0, base=0.05), retries)


def redact(url: str) -> str:
    """The URL with any password replaced by ***, for log lines and error messages."""
    # The user info ends at the last '@' before the path (redis-py reads a raw '@' in a password so).
    return re.sub(r"(://[^:/@]*:)[^/?#]*@", r"\1***@", url)


def client_url(client: redis.Redis) -> str:
    """The URL of the server `client` talks to, its password as *** (for a command shown to a user,
    who puts the password back in: state and logs never hold it)."""
    pool = client.connection_pool
    kw = pool.connection_kwargs
    db = kw.get("db") or 0
    if kw.get("path"):
        return f"unix://{kw['path']}?db={db}"
    scheme = "rediss" if issubclass(pool.connection_class, redis.SSLConnection) else "redis"
    user = kw.get("username") or ""
    auth = f"{user}:***@" if kw.get("password") else (f"{user}@" if user else "")
    return f"{scheme}://{auth}{kw.get('host') or 'localhost'}:{kw.get('port') or 6379}/{db}"


def resolve_url(url: str | None) -> str:
    return url or os.environ.get(ENV_URL) or DEFAULT_URL


def connect(
    url: str | None = None,
    *,
    blocking: bool = False,
    retries: int = 8,
    check: bool = True,
    **kwargs,
) -> redis.Redis:
    """A client for `url` (or $AESRL_REDIS_URL) that retries with exponential backoff.

    `blocking=True` is for clients that issue XREAD BLOCK or BLPOP: no socket timeout there.
    With `check`, PING once and raise RedisUnavailable with a clear message if Redis is not there.
    """
    url = resolve_url(url)
    options = dict(
        socket_connect_timeout=5.0,
        socket_timeout=None if blocking else 30.0,
        socket_keepalive=True,
        health_check_interval=30,
        retry=backoff_retry(retries),
        retry_on_error=list(RETRY_ON),
        command_packer=PACKER,
    )
    if url.startswith("unix:"):  # TCP keepalive has no meaning on a Unix socket (redis-py refuses it)
        del options["socket_keepalive"]
    options.update(kwargs)
    try:
        client = _Redis.from_url(url, **options)
    except ValueError as exc:
        raise RedisUnavailable(f"invalid Redis URL {redact(url)!r}: {exc}") from None
    if check:
        ping(client, url)
        warn_if_open(client, url)
    return client


_OPEN_WARNED: set[tuple] = set()


def warn_if_open(client: redis.Redis, url: str | None = None) -> None:
    """A password in the URL of a Redis that asks for none is accepted and protects nothing: say so,
    once per process and server, when the same server answers a connection without credentials."""
    kw = client.connection_pool.connection_kwargs
    if not kw.get("password"):
        return
    where = (kw.get("host"), kw.get("port"), kw.get("path"))
    if where in _OPEN_WARNED:
        return
    _OPEN_WARNED.add(where)
    bare = {k: v for k, v in kw.items() if k not in ("password", "username", "retry", "retry_on_error")}
    try:
        with redis.Redis(connection_pool=redis.ConnectionPool(connection_class=client.connection_pool.connection_class,
                                                              **bare)) as probe:
            probe.ping()
    except (redis.RedisError, OSError):
        return  # it asks for credentials (NOAUTH), or did not answer this once: nothing to say
    log.warning("Redis at %s accepts connections without a password: the one in the URL protects nothing. "
                "Set requirepass or an ACL user on the server (docs/security.md)",
                redact(url) if url else kw.get("path") or f"{kw.get('host')}:{kw.get('port')}")


def ping(client: redis.Redis, url: str | None = None, hint: str = f"pass --redis-url or set {ENV_URL}") -> None:
    """PING once; RedisUnavailable says why not, ending with `hint` where the address may be wrong."""
    where = redact(url) if url else "the configured Redis"
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        raise RedisUnavailable(
            f"Redis at {where} refused the credentials ({exc}): put the password in the URL "
            "(redis://:PASSWORD@host:6379/0 or redis://USER:PASSWORD@host:6379/0)"
        ) from None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise RedisUnavailable(
            f"cannot reach Redis at {where}: {exc} — is redis-server running? {hint}"
        ) from None
    except redis.exceptions.InvalidResponse as exc:
        raise RedisUnavailable(
            f"{where} does not answer as Redis ({exc}): is that the Redis host and port? {hint}"
        ) from None
    except redis.ResponseError as exc:
        if "NOAUTH" in str(exc) or "AUTH" in str(exc):
            raise RedisUnavailable(
                f"Redis at {where} needs a password: use redis://:PASSWORD@host:port/0 ({exc})"
            ) from None
        raise


def wait_until_reachable(client: redis.Redis, what: str, error: BaseException | None = None,
                         stop_event: threading.Event | None = None, cap: float = 5.0) -> bool:
    """Block until `client` answers PING again (backoff up to `cap` s); False if `stop_event` was set.

    For loops that outlive a Redis restart: they call this when a command failed even after the
    client's own retries, then re-read what they need. Refused credentials are raised, not retried.
    """
    OUTAGE.down(error or RuntimeError("no answer"))
    log.warning("%s waits for Redis (retrying every %.0fs at most)", what, cap)
    delay = 0.25
    while not (stop_event is not None and stop_event.is_set()):
        try:
            client.ping()
            OUTAGE.up()
            log.warning("%s resumes", what)
            return True
        except redis.AuthenticationError:
            raise
        except RETRY_ON:
            pass
        if stop_event is not None:
            stop_event.wait(delay)
        else:
            time.sleep(delay)
        delay = min(cap, delay * 2)
    return False


FANOUT_ENV = "AESRL_FANOUT_URL"
_FANOUT: dict[str, redis.Redis] = {}


def fanout_url(url: str | None = None) -> str | None:
    """The fan-out instance's URL: `url`, else $AESRL_FANOUT_URL, else None (the primary serves)."""
    return url or os.environ.get(FANOUT_ENV) or None


def fanout_client(url: str | None = None) -> redis.Redis | None:
    """This process's client of the fan-out instance (docs/decisions.md), None when none is named."""
    url = fanout_url(url)
    if url is None:
        return None
    if url not in _FANOUT:
        _FANOUT[url] = connect(url)
    return _FANOUT[url]
