"""Redis as docs/security.md asks users to run it: with a password, with an ACL user that may only
touch the `aesrl:*` and `rq:*` keys, and over TLS with a certificate made here. Each runs a real
scheduler, real rq workers and `status`, and shows what is refused.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import redis

from aesrl_queue.redis_server import RedisServer
from aesrl_queue.store import Store
from tests.conftest import ROOT, child_env, wait_for
from tests.faults import check_exactly_once, write_config

ADMIN_PW = "admin-Secret-1"
USER_PW = "worker-Secret-2"
# The ACL rule docs/security.md recommends for the user every component connects as.
ACL_RULE = ["on", f">{USER_PW}", "resetkeys", "~aesrl:*", "~rq:*", "resetchannels", "&rq:*", "&aesrl:*",
            "+@all", "-@dangerous", "+info"]


def aq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True,
                          env=child_env(), cwd=ROOT, timeout=timeout)


def _run(tmp_path, procs, url: str, run: str, admin: redis.Redis, rl: bool = False) -> Store:
    """A short run on the null environment: scheduler, two workers (and the critic for RL)."""
    fields = dict(hidden=[8, 8], critic_hidden=[16, 16], env_kwargs={"episode_len": 20}, mean_eval_episodes=1,
                  result_ttl=30, failure_ttl=60)
    if rl:
        fields.update(total_steps=1200, initial_steps=200, batch_size=32, critic_chunk=100)
    else:
        fields.update(algo="es", total_steps=400)
    cfg = write_config(tmp_path / f"{run}.json", "AesrlNull-v0", **fields)
    procs.rq_worker(f"{run}-w0", url)
    procs.rq_worker(f"{run}-w1", url)
    procs.cli(f"{run}-scheduler", "scheduler", "start", "--redis-url", url, "--config", str(cfg), "--run-id", run)
    if rl:
        procs.cli(f"{run}-critic", "critic", "start", "--redis-url", url, "--run", run)
    store = Store(admin, run)
    wait_for(lambda: store.exists() and store.status() == "finished", 180, interval=0.5, what=f"run {run} to finish",
             on_fail=procs.logs)
    assert procs.procs[f"{run}-scheduler"].wait(30) == 0, procs.log(f"{run}-scheduler")
    check_exactly_once(admin, store)
    out = aq("status", "--redis-url", url, "--run", run)
    assert out.returncode == 0 and "finished" in out.stdout, out.stderr
    return store


@pytest.mark.slow
def test_requirepass(tmp_path, procs):
    with RedisServer(directory=tmp_path / "redis", password=ADMIN_PW) as server:
        admin = redis.Redis.from_url(server.url)
        _run(tmp_path, procs, server.url, "auth-run", admin)
        bare = f"redis://127.0.0.1:{server.port}/0"
        out = aq("status", "--redis-url", bare)
        assert out.returncode == 2 and "put the password in the URL" in out.stderr, out.stderr
        out = aq("status", "--redis-url", f"redis://:not-it@127.0.0.1:{server.port}/0")
        assert out.returncode == 2 and "refused the credentials" in out.stderr, out.stderr
        assert "not-it" not in out.stderr  # passwords never reach a message
        # A worker with a wrong password stops at once with that message instead of retrying forever.
        w = subprocess.run([sys.executable, "-m", "rq.cli", "worker", "-w", "workers.AesrlWorker", "-u",
                            f"redis://:not-it@127.0.0.1:{server.port}/0", "--burst", "aesrl-es"],
                           capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=60)
        assert w.returncode != 0 and "not-it" not in w.stdout + w.stderr


@pytest.mark.slow
def test_acl_user_limited_to_aesrl_and_rq_keys(tmp_path, procs):
    with RedisServer(directory=tmp_path / "redis", password=ADMIN_PW) as server:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command("ACL", "SETUSER", "aesrl", *ACL_RULE)
        url = f"redis://aesrl:{USER_PW}@127.0.0.1:{server.port}/0"
        admin.execute_command("ACL", "LOG", "RESET")
        store = _run(tmp_path, procs, url, "acl-run", admin, rl=True)
        st = store.state()
        assert st["rl_applied"] > 0 and st["critic_version"] > 0, st  # every component, RL jobs included
        # Nothing the system does was denied ...
        denied = admin.execute_command("ACL", "LOG")
        assert not denied, denied
        out = aq("runs", "--redis-url", url)
        assert out.returncode == 0 and "acl-run" in out.stdout, out.stderr
        # ... and the user can do nothing outside its keys and channels.
        user = redis.Redis.from_url(url)
        admin.set("secret", "x")
        for call in (lambda: user.get("secret"), lambda: user.set("other:key", 1), lambda: user.flushall(),
                     lambda: user.config_get("requirepass"), lambda: user.keys("*"),
                     lambda: user.execute_command("PUBLISH", "other-channel", "x"),
                     lambda: user.execute_command("ACL", "SETUSER", "aesrl", "~*")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                call()
        assert admin.get("secret") == b"x"


def _make_certs(d) -> dict[str, str]:
    """A CA and a server certificate for 127.0.0.1 signed by it, made with openssl."""
    d.mkdir()

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d, timeout=60)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
        "-subj", "/CN=aesrl-test-ca")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.crt", "-days", "1", "-extfile", "san.ext")
    return {name: str(d / f"{name}") for name in ("ca.crt", "server.crt", "server.key")}


class TlsRedisServer(RedisServer):
    """RedisServer listening only on a TLS port (no plain-text port at all)."""

    def __init__(self, certs: dict[str, str], **kw) -> None:
        super().__init__(**kw)
        self.certs = certs
        self.extra_args += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", certs["server.crt"],
                            "--tls-key-file", certs["server.key"], "--tls-ca-cert-file", certs["ca.crt"],
                            "--tls-auth-clients", "no"]

    @property
    def url(self) -> str:
        return f"rediss://:{self.password}@127.0.0.1:{self.port}/0?ssl_ca_certs={self.certs['ca.crt']}"


def start_tls_server(tmp_path, **kw) -> TlsRedisServer:
    """A started TlsRedisServer with certificates under tmp_path/certs; the test is skipped where
    openssl or redis-server's TLS support is missing."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: cannot make a test certificate")
    server = TlsRedisServer(_make_certs(tmp_path / "certs"), **kw)
    try:
        return server.start()
    except RuntimeError as exc:
        if "tls" in str(exc).lower():
            pytest.skip(f"this redis-server was built without TLS support: {exc}")
        raise


@pytest.mark.slow
def test_tls(tmp_path, procs):
    server = start_tls_server(tmp_path, directory=tmp_path / "redis", password=ADMIN_PW)
    try:
        admin = redis.Redis.from_url(server.url)
        assert admin.ping()
        _run(tmp_path, procs, server.url, "tls-run", admin)
        # The plain-text protocol is refused on the TLS port.
        plain = redis.Redis(host="127.0.0.1", port=server.port, password=ADMIN_PW, socket_timeout=2,
                            socket_connect_timeout=2, retry=None)
        with pytest.raises(redis.exceptions.ConnectionError):
            plain.ping()
        # A client that does not trust the CA is refused too.
        untrusting = redis.Redis.from_url(f"rediss://:{ADMIN_PW}@127.0.0.1:{server.port}/0", socket_timeout=2,
                                          retry=None)
        with pytest.raises(redis.exceptions.ConnectionError, match="(?i)certificate"):
            untrusting.ping()
    finally:
        server.cleanup()
