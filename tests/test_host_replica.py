"""The host's replica (workers/host_replica.py) on real redis-servers, and the failures of the relay it
replaced, each on real processes: a run started over under the same id, a corrupt run beside a good
one, a killed replica, a client without the password, memory per run, `status` per host."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import time

import numpy as np
import pytest
import redis

from aesrl_queue import codec
from aesrl_queue.config import RunConfig
from aesrl_queue.connection import connect
from aesrl_queue.store import Store, host_beat, live_workers, run_token, worker_beat
from tests.conftest import password_server, wait_for
from tests.faults import check_exactly_once
from workers import host_replica, jobs, replica

PW = "primary-pw"


@pytest.fixture()
def primary(tmp_path):
    yield from password_server(tmp_path / "primary", PW)


@pytest.fixture()
def host(primary, tmp_path):
    h = host_replica.HostReplica(primary.url, primary=connect(primary.url), directory=tmp_path / "host").start()
    assert h.wait_synced(20)
    yield h
    h.stop()


@pytest.fixture()
def reading(host, monkeypatch):
    """Jobs of this process read through `host` (a short wait for what it lacks)."""
    monkeypatch.setenv(replica.READ_URL_ENV, host.url)
    monkeypatch.setenv(replica.WAIT_ENV, "0.05")
    replica._READERS.clear()
    jobs._CONTEXTS.clear()
    yield host
    replica._READERS.clear()
    jobs._CONTEXTS.clear()


def _synced(p: redis.Redis, r: redis.Redis) -> bool:
    return r.info("replication").get("slave_repl_offset", -1) >= p.info("replication")["master_repl_offset"]


def _run(client, run_id: str, algo: str, created_at: float, mu: float, version: int = 5) -> Store:
    cfg = RunConfig.from_preset("AesrlNull-v0", algo=algo, run_id=run_id, hidden=(8, 8), created_at=created_at,
                                env_kwargs={"episode_len": 5}, mean_eval_episodes=1).resolve()
    store = Store(client, run_id)
    assert store.write_config(cfg)
    store.set_state(status="running", version=version)
    store.publish_dist(version, np.full(cfg.actor_dim, mu, np.float32), np.full(cfg.actor_dim, 1e-3, np.float32))
    return store


def _job(store: Store, job: str, version: int = 5) -> dict:
    store.add_inflight(job, {"kind": "es", "version": version, "seed": 1})
    return dict(run=store.run_id, job=job, kind="es", version=version, seed=1, spec_hash=store.config().spec_hash)


def test_the_replica_refuses_a_client_without_its_password_and_keeps_it_off_the_command_line(host, primary):
    p = connect(primary.url)
    p.set("k", "v")
    r = host.client()
    wait_for(lambda: r.get("k") == b"v", 10, interval=0.05, what="the write to reach the host")  # replicated through masterauth: the primary asks for a password
    bare = redis.Redis(host="127.0.0.1", port=host.server.port)
    with pytest.raises(redis.AuthenticationError):
        bare.get("k")
    with pytest.raises(redis.AuthenticationError):
        bare.set("k", "forged")
    with pytest.raises(redis.exceptions.ReadOnlyError):
        r.set("k", "forged")  # even with the password: the host's copy only follows the primary
    cmdline = open(f"/proc/{host.server.proc.pid}/cmdline", "rb").read()
    assert host.password.encode() not in cmdline and PW.encode() not in cmdline
    conf = host.server.directory / "replica.conf"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600


def test_a_killed_replica_is_started_again_within_10_s_and_a_host_can_follow_another(host, primary, tmp_path):
    p = connect(primary.url)
    old = host.server.proc.pid
    os.kill(old, signal.SIGKILL)
    # restarts counts a replica once it answers (the new process exists a moment before that)
    wait_for(lambda: host.restarts >= 1 and host.alive() and host.server.proc.pid != old, 10, interval=0.1,
             what="the replica restarted")
    assert host.restarts == 1
    assert host.wait_synced(10)
    p.set("after", "1")
    # A second host follows the first one's replica (a tree of hosts), with that replica's password.
    leaf = host_replica.HostReplica(host.url, directory=tmp_path / "leaf").start()
    try:
        assert leaf.wait_synced(20)
        wait_for(lambda: leaf.client().get("after") == b"1", 10, what="the write to reach the second host")
        # the source's replication PINGs move its offset every few seconds: the lag is 0 between them
        wait_for(lambda: leaf.report()["link"] == "up" and leaf.report()["lag_bytes"] == 0, 10,
                 what="the second host to report no lag")
    finally:
        leaf.stop()


def test_a_run_started_over_under_its_id_reads_its_own_config_and_versions(primary, reading):
    p = connect(primary.url)
    old = _run(p, "again", "es", created_at=1000.0, mu=5.0)
    args = _job(old, "j1")
    assert jobs.evaluate(**args, client=p)["job"] == "j1"
    wait_for(lambda: _synced(p, reading.client()), 10, what="the host to hold the old run")
    # The host's copy stops following: it still holds the old run's dist:5 and config.
    reading.client().execute_command("REPLICAOF", "NO", "ONE")
    old.delete()
    new = _run(p, "again", "aesrl", created_at=2000.0, mu=-5.0)
    ctx = jobs._context(p, "again")
    assert ctx.cfg.algo == "es"  # the worker's cached context of the old run
    args = _job(new, "j2")
    assert jobs.evaluate(**args, client=p)["job"] == "j2"
    ctx = jobs._context(p, "again")
    assert ctx.cfg.algo == "aesrl" and ctx.token == run_token(new.config()).encode()
    version, mu, _var = ctx.begin("j2", b"info")
    assert version == 5 and float(mu[0]) == -5.0  # the new run's μ, from the primary: the host's is tagged old
    assert replica.reader_for(p).stats["primary"] >= 1


def test_a_corrupt_entry_of_one_run_does_not_stop_another(primary, reading):
    p = connect(primary.url)
    bad = _run(p, "bad", "es", created_at=1.0, mu=1.0)
    good = _run(p, "good", "es", created_at=2.0, mu=2.0)
    p.hset(bad.key("dist:5"), "mu", b"not an array")
    wait_for(lambda: _synced(p, reading.client()), 10, what="the host to hold both runs")
    with pytest.raises(codec.CodecError):
        jobs.evaluate(**_job(bad, "b1"), client=p)
    out = jobs.evaluate(**_job(good, "g1"), client=p)
    assert out["job"] == "g1" and not out.get("skipped")
    assert reading.report()["link"] == "up"


def test_status_shows_each_host_and_a_problem_line_when_one_falls_back(client):
    from cli.report import gather, render, render_line

    _run(client, "st", "es", created_at=1.0, mu=0.0)
    host_beat(client, "hostA:1", {"host": "hostA", "pid": 1, "link": "up", "lag_bytes": 0, "io_s": 0, "restarts": 0})
    worker_beat(client, "w1", {"name": "w1", "host": "hostA", "pid": 2, "fallbacks": 0})
    s = gather(client, "st")
    assert [h["link"] for h in s["hosts"]] == ["up"] and not s["problem"]
    assert re.search(r"host replicas 1\n\s+hostA:1\s+link up\s+lag\s+0 B\s+fallbacks 0", render(s))
    worker_beat(client, "w1", {"name": "w1", "host": "hostA", "pid": 2, "fallbacks": 7})
    s = gather(client, "st")
    assert s["problem"].startswith("host hostA reads from the primary: 7 fallbacks")
    assert "problem: host hostA" in render(s)
    assert "problem: host hostA falls back to the primary" in render_line(s)  # `status --watch` off a terminal


@pytest.mark.slow
def test_the_worker_command_runs_a_run_through_its_replica_and_restarts_it(redis_url, client, procs, tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv(host_replica.PASSWORD_ENV, "host-pw")
    procs.cli("workers", "worker", "--redis-url", redis_url, "--processes", "2")
    wait_for(lambda: len(live_workers(client)) == 2, 90, what="both workers", on_fail=procs.logs)
    found = re.search(r"host replica on redis://:\*\*\*@127\.0\.0\.1:(\d+)/0 \(replicaof .*, in sync\)",
                      procs.log("workers"))
    assert found, procs.log("workers")
    port = int(found.group(1))
    local = redis.Redis(port=port, password="host-pw")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=port).get("x")
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"env_id": "AesrlSleep-v0", "env_kwargs": {"episode_len": 50, "mean_s": 0.05},
                               "mean_eval_episodes": 1}))
    # A HalfCheetah-sized actor (400-300: ~122k parameters, 0.98 MB of μ and var per version).
    procs.cli("scheduler", "scheduler", "start", "--redis-url", redis_url, "--config", str(cfg), "--algo", "es",
              "--run-id", "host-run", "--steps", "20000", "--hidden", "400,300")
    store = Store(client, "host-run")
    wait_for(lambda: store.exists() and store.state_field("results_applied") >= 5, 120, interval=0.5,
             what="five results", on_fail=procs.logs)

    def run_bytes() -> int:
        keys = list(local.scan_iter(match=store.prefix + "*", count=1000))
        return sum(local.memory_usage(k) or 0 for k in keys)

    peak = run_bytes()
    assert local.info("stats")["keyspace_hits"] >= 5, procs.logs()  # the workers read their versions from it
    pid = local.info("server")["process_id"]
    os.kill(pid, signal.SIGKILL)  # the host's copy dies mid-run
    wait_for(lambda: _pid(local) not in (None, pid), 10, interval=0.2, what="the replica restarted within 10 s",
             on_fail=procs.logs)
    applied = store.state_field("results_applied")
    served_after = False  # the restarted replica serves the workers again before the run ends
    while store.status() != "finished":
        peak = max(peak, run_bytes())
        served_after = served_after or (local.info("stats")["keyspace_hits"] >= 3)
        time.sleep(1.0)
        assert store.status() in ("running", "draining", "finished"), procs.logs()
        if store.state_field("results_applied") <= applied:
            wait_for(lambda: store.state_field("results_applied") > applied or store.status() == "finished", 120,
                     interval=0.5, what="results after the restart", on_fail=procs.logs)
    check_exactly_once(client, store)
    assert store.state_field("results_applied") > applied  # jobs went on after the restart
    print(f"the host held at most {peak / 1e6:.1f} MB of the run")
    assert peak <= 50e6, f"the host held {peak / 1e6:.1f} MB of the run"
    assert "starting it again" in procs.log("workers")
    from cli.report import gather

    def host_up():
        hosts = gather(client, "host-run")["hosts"]
        return hosts if hosts and hosts[0]["link"] == "up" else None

    hosts = wait_for(host_up, 10, what="the host to report its link up again")
    assert len(hosts) == 1 and hosts[0]["restarts"] == 1 and hosts[0]["lag_bytes"] >= 0
    # The replica started again by the supervisor thread dies with the worker command, even by kill -9.
    restarted = _pid(local)
    os.kill(procs.procs["workers"].pid, signal.SIGKILL)
    wait_for(lambda: not _alive(restarted), 10, interval=0.1, what="the host replica to end with its worker command")
    assert served_after, "no job read from the replica after its restart"


def _pid(c: redis.Redis) -> int | None:
    try:
        return int(c.info("server")["process_id"])
    except redis.RedisError:
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


@pytest.mark.slow
def test_the_replica_follows_a_tls_primary_over_tls(tmp_path):
    from tests.test_security import start_tls_server

    server = start_tls_server(tmp_path, directory=tmp_path / "primary", password=PW,
                              extra_args=["--repl-diskless-sync-delay", "0"])
    h = host_replica.HostReplica(server.url, directory=tmp_path / "host")
    try:
        h.start()
        assert h.wait_synced(20), h.server._log_tail()
        redis.Redis.from_url(server.url).set("k", "over tls")
        wait_for(lambda: h.client().get("k") == b"over tls", 10, what="the write to reach the host over TLS")
        assert "tls-replication yes" in (h.server.directory / "replica.conf").read_text()
    finally:
        h.stop()
        server.cleanup()
