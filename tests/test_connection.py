"""Redis clients: errors that say what to do without leaking passwords, and blocking reads without timeouts."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import redis

from aesrl_queue.connection import ENV_URL, RedisUnavailable, connect, redact, resolve_url
from aesrl_queue.redis_server import RedisServer, free_port
from tests.conftest import ROOT, child_env

PASSWORD = "s3cret"


@pytest.fixture()
def secured(tmp_path):
    server = RedisServer(directory=tmp_path / "redis-auth", password=PASSWORD).start()
    yield server
    server.cleanup()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://:pw@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://user:pw@host:6379/0", "redis://user:***@host:6379/0"),
        ("rediss://default:a-long!pass@10.0.0.5:6380/2", "rediss://default:***@10.0.0.5:6380/2"),
        ("redis://:p@ss@host/0", "redis://:***@host/0"),  # a raw '@' in the password: hide all of it
        ("redis://:pw@host", "redis://:***@host"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("redis://user@host:6379/0", "redis://user@host:6379/0"),
        ("redis://host:6379/0?name=a@b", "redis://host:6379/0?name=a@b"),
    ],
)
def test_redact(url: str, expected: str) -> None:
    assert redact(url) == expected


def test_connect_to_a_closed_port_says_what_to_do() -> None:
    port = free_port()
    url = f"redis://:hidden-pw@127.0.0.1:{port}/0"
    with pytest.raises(RedisUnavailable) as err:
        connect(url, retries=1)
    msg = str(err.value)
    assert "cannot reach Redis" in msg
    assert f"redis://:***@127.0.0.1:{port}/0" in msg
    assert "--redis-url" in msg and ENV_URL in msg
    assert "hidden-pw" not in msg


def test_check_false_does_not_touch_the_server() -> None:
    c = connect(f"redis://127.0.0.1:{free_port()}/0", check=False, retries=0)  # no error yet
    with pytest.raises(redis.ConnectionError):
        c.ping()
    c.close()


def test_invalid_url_is_reported() -> None:
    with pytest.raises(RedisUnavailable, match="invalid Redis URL"):
        connect("http://:pw@host:6379/0")


def connections_made(secured: RedisServer):
    """A counter of the connections the secured server accepts from others (its own client aside)."""
    admin = redis.Redis.from_url(secured.url)
    before = admin.info("stats")["total_connections_received"]
    return lambda: admin.info("stats")["total_connections_received"] - before


def test_password_protected_server_without_password(secured: RedisServer) -> None:
    url = f"redis://127.0.0.1:{secured.port}/0"
    made = connections_made(secured)
    with pytest.raises(RedisUnavailable) as err:
        connect(url)
    msg = str(err.value)
    assert "password" in msg and "in the URL" in msg
    assert "redis://:PASSWORD@" in msg
    assert url in msg
    assert PASSWORD not in msg
    # A refused login is not retried: one connection, where each backoff retry would open another.
    assert made() == 1


def test_password_protected_server_with_a_wrong_password(secured: RedisServer) -> None:
    url = f"redis://:wrong-pw@127.0.0.1:{secured.port}/0"
    made = connections_made(secured)
    with pytest.raises(RedisUnavailable) as err:
        connect(url)
    msg = str(err.value)
    assert "put the password in the URL" in msg
    assert "wrong-pw" not in msg and PASSWORD not in msg
    assert f"redis://:***@127.0.0.1:{secured.port}/0" in msg
    assert made() == 1  # refused credentials are not retried


def test_password_in_the_url_works(secured: RedisServer) -> None:
    assert PASSWORD in secured.url
    c = connect(secured.url)
    c.set("k", "v")
    assert c.get("k") == b"v"
    c.close()
    b = connect(f"redis://default:{PASSWORD}@127.0.0.1:{secured.port}/0", blocking=True)
    assert b.ping() is True
    b.close()


def test_a_password_to_a_redis_that_asks_for_none_is_named_once(secured: RedisServer, redis_url: str,
                                                                  caplog) -> None:
    """Redis accepts a password it does not ask for: the URL's password would protect nothing, and
    connect says so once per process and server; a server that asks for it gets no such line."""
    caplog.set_level("WARNING", logger="aesrl_queue.connection")
    connect(secured.url).close()
    assert "without a password" not in caplog.text
    open_url = redis_url.replace("redis://", f"redis://:{PASSWORD}@")
    for _ in range(2):
        connect(open_url).close()
    lines = [r.getMessage() for r in caplog.records if "without a password" in r.getMessage()]
    assert len(lines) == 1 and PASSWORD not in lines[0] and ":***@" in lines[0], lines
    # an rq worker makes its own client from `-u URL`: it says so too, and runs on
    w = subprocess.run([sys.executable, "-m", "rq.cli", "worker", "-w", "workers.AesrlWorker", "-u", open_url,
                        "--burst", "aesrl-es"], capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=60)
    assert w.returncode == 0 and "accepts connections without a password" in w.stderr + w.stdout, w.stderr
    assert PASSWORD not in w.stderr + w.stdout


def test_resolve_url_order(monkeypatch) -> None:
    monkeypatch.delenv(ENV_URL, raising=False)
    assert resolve_url(None) == "redis://127.0.0.1:6379/0"
    monkeypatch.setenv(ENV_URL, "redis://envhost:1/0")
    assert resolve_url(None) == "redis://envhost:1/0"
    assert resolve_url("redis://given:2/0") == "redis://given:2/0"


def test_socket_timeouts(redis_url: str) -> None:
    normal = connect(redis_url)
    blocking = connect(redis_url, blocking=True)
    assert normal.connection_pool.connection_kwargs["socket_timeout"] == 30.0
    assert blocking.connection_pool.connection_kwargs["socket_timeout"] is None
    normal.close()
    blocking.close()


@pytest.mark.slow
def test_blocking_client_reads_longer_than_redis_py_default_timeout(redis_url: str) -> None:
    # redis-py 8 gives clients a 5 s socket timeout by default: a 6 s XREAD BLOCK would fail there.
    c = connect(redis_url, blocking=True)
    t0 = time.monotonic()
    got = c.xread({"aesrl:test:stream": "0-0"}, block=6000, count=1)
    elapsed = time.monotonic() - t0
    assert not got
    assert elapsed >= 5.9
    # The same client still works after the long block, and a write wakes a blocked read.
    c.xadd("aesrl:test:stream", {"a": 1})
    assert c.xread({"aesrl:test:stream": "0-0"}, block=6000, count=1)
    c.close()


def test_large_values_round_trip_through_the_packer(client) -> None:
    """Commands with a value past the cutoff go the pure-Python way (no copy); the bytes must arrive intact,
    whether given as bytes or as a memoryview of an array, alone or in a pipeline with small commands."""
    import numpy as np

    from aesrl_queue import codec
    from aesrl_queue.connection import LARGE_VALUE, PACKER

    conn = client.connection_pool.get_connection()
    try:
        assert conn._command_packer is PACKER
    finally:
        client.connection_pool.release(conn)
    arr = np.random.default_rng(0).standard_normal(129_306).astype(np.float32)
    view = codec.array_view(arr)
    assert isinstance(view, memoryview) and len(view) == arr.nbytes
    edge = b"x" * LARGE_VALUE + b"y"
    pipe = client.pipeline()
    pipe.set("small", "héllo")
    pipe.hset("dist", mapping={"mu": view, "var": codec.array_view(arr[::-1]), "version": 3})
    pipe.set("edge", edge)
    pipe.set("exact", b"z" * LARGE_VALUE)
    pipe.execute()
    client.set("alone", view)
    assert client.hget("dist", "mu") == arr.tobytes() == client.get("alone")
    assert client.hget("dist", "var") == arr[::-1].tobytes()
    assert client.get("edge") == edge and client.get("exact") == b"z" * LARGE_VALUE
    assert client.get("small").decode() == "héllo" and client.hget("dist", "version") == b"3"


def test_a_unix_socket_url_works(tmp_path) -> None:
    """redis-py refuses TCP keepalive options on a Unix socket; connect() must not pass them there."""
    sock = tmp_path / "redis.sock"
    server = RedisServer(directory=tmp_path / "redis-unix", extra_args=["--unixsocket", str(sock)]).start()
    try:
        c = connect(f"unix://{sock}?db=0")
        c.set("k", b"v" * 10_000)
        assert c.get("k") == b"v" * 10_000
        c.close()
    finally:
        server.cleanup()


def test_a_private_server_in_a_relative_folder_starts(tmp_path, monkeypatch) -> None:
    """redis-server changes into --dir before it opens --logfile: a relative folder (as in
    `aesrl-queue run --out runs/x`) must still work."""
    monkeypatch.chdir(tmp_path)
    server = RedisServer(directory="runs/x/redis").start()
    try:
        c = connect(server.url)
        assert c.ping()
        assert (tmp_path / "runs/x/redis/redis.log").exists()
        c.close()
    finally:
        server.cleanup()


def test_a_client_without_retries_raises_where_the_usual_one_resends(client) -> None:
    """The scheduler's apply pipeline must not be resent when the link drops after it was sent (a
    resend after a lost EXEC reply would apply a batch twice): its client raises; the usual client
    resends on a new connection. The link is cut while Redis holds the EXEC (CLIENT PAUSE WRITE)."""
    import threading

    from aesrl_queue.connection import without_retries

    once = without_retries(client)
    other = redis.Redis(**{k: v for k, v in client.connection_pool.connection_kwargs.items()
                           if k in ("host", "port", "db", "password")})

    def cut_while_paused(target: redis.Redis) -> threading.Thread:
        cid = target.client_id()
        other.client_pause(3000, all=False)  # WRITE pause: the EXEC waits in Redis

        def cut() -> None:
            time.sleep(0.5)
            other.client_kill_filter(_id=cid)
            other.client_unpause()

        t = threading.Thread(target=cut)
        t.start()
        return t

    t = cut_while_paused(client)
    pipe = client.pipeline()
    pipe.incr("n")
    assert pipe.execute() == [1]  # resent on a new connection once the first link was cut
    t.join()
    t = cut_while_paused(once)
    pipe = once.pipeline()
    pipe.incr("n")
    with pytest.raises(redis.ConnectionError):
        pipe.execute()
    t.join()
    assert client.get("n") == b"1"  # the cut transaction did not run, and nothing resent it
    pipe = once.pipeline()  # the next transaction works on a new connection
    pipe.incr("n")
    assert pipe.execute() == [2]
    other.close()
