"""The fan-out instance (docs/decisions.md): a second redis-server beside the primary that holds what
every host reads, and that the hosts' replicas follow instead of the primary. On real processes: a
run whose host replica follows it gets versions, critic and observations but none of the primary's
RQ, episode or individual keys; a version left there by a commit that failed is never served under
the number a restarted scheduler publishes again; the replica refuses a client without credentials."""

from __future__ import annotations

import re
import signal

import numpy as np
import pytest
import redis

from aesrl_queue.config import RunConfig
from aesrl_queue.connection import _FANOUT, FANOUT_ENV, connect
from aesrl_queue.store import CURRENT, FANOUT_FIELD, Fanout, Store, incarnation_token, live_workers, run_token
from tests.conftest import password_server, wait_for
from tests.faults import check_exactly_once, sleep_config, wait_pid_exit
from workers import host_replica, jobs, replica

PW, FPW, HPW = "primary-pw", "fanout-pw", "host-pw"
RUN = "fanout-run"
# What a host may hold of a run: versions, the current version, the critic, the replay's observations.
HOST_KEYS = re.compile(r"^aesrl:[^:]+:(dist:\d+|current|critic|obs|obs:count|obs:index)$")


@pytest.fixture()
def primary(tmp_path):
    yield from password_server(tmp_path / "primary", PW)


@pytest.fixture()
def fanout(tmp_path):
    yield from password_server(tmp_path / "fanout", FPW)


@pytest.fixture()
def fresh(monkeypatch):
    """This process's readers, contexts and fan-out clients start empty (and are left empty)."""
    for cache in (replica._READERS, jobs._CONTEXTS, _FANOUT):
        cache.clear()
    yield monkeypatch
    for cache in (replica._READERS, jobs._CONTEXTS, _FANOUT):
        cache.clear()


def _keys(c: redis.Redis) -> list[str]:
    return sorted(k.decode() for k in c.scan_iter(count=1000))


@pytest.mark.slow
def test_a_host_following_the_fanout_gets_versions_and_critic_and_nothing_else(primary, fanout, procs, tmp_path,
                                                                              monkeypatch):
    """scheduler, critic daemon and `aesrl-queue worker` with --fanout-url; the scheduler is killed and
    started again mid-run; every result applied exactly once."""
    monkeypatch.setenv(host_replica.PASSWORD_ENV, HPW)
    p, f = connect(primary.url), connect(fanout.url)
    # RL jobs that train a sample (rl_steps_max > 0) sample the replay's observations, which the fan-out
    # instance carries to the hosts; the daemon's own actor (the default) needs none. Half the jobs ES
    # (the paper's ρ*): the fitness scale is set a few jobs after the random phase, so μ moves well
    # before the budget ends and the second scheduler below has moves of its own to publish.
    cfg = sleep_config(tmp_path / "run.json", mean_s=0.1, total_steps=4000, initial_steps=300, rl_steps_max=2000,
                       learner="td3", rl_ratio=0.5)
    procs.cli("workers", "worker", "--redis-url", primary.url, "--fanout-url", fanout.url, "--processes", "2")
    wait_for(lambda: len(live_workers(p)) == 2, 90, what="both workers", on_fail=procs.logs)
    found = re.search(r"host replica on redis://:\*\*\*@127\.0\.0\.1:(\d+)/0 \(replicaof redis://:\*\*\*@127\.0\.0\.1:"
                      rf"{fanout.port}/0, in sync\)", procs.log("workers"))
    assert found, procs.log("workers")
    host = redis.Redis(port=int(found.group(1)), password=HPW)
    sched = ["scheduler", "start", "--redis-url", primary.url, "--fanout-url", fanout.url]
    procs.cli("scheduler-1", *sched, "--config", str(cfg), "--run-id", RUN)
    procs.cli("critic", "critic", "start", "--redis-url", primary.url, "--fanout-url", fanout.url, "--run", RUN)
    store = Store(p, RUN)
    wait_for(lambda: store.exists() and store.state()["rl_applied"] >= 2, 120, interval=0.5,
             what="RL results", on_fail=procs.logs)
    assert store.state_field(FANOUT_FIELD, cast=str, default="") == f"redis://:***@127.0.0.1:{fanout.port}/0"
    # kill -9 the scheduler mid-run, start it again: a new incarnation tags what it publishes anew
    s1 = procs.procs["scheduler-1"]
    s1.send_signal(signal.SIGKILL)
    assert wait_pid_exit(s1.pid)
    version_before = store.state()["version"]
    tag_before = p.hget(store.key(f"dist:{version_before}"), "tag")
    procs.cli("scheduler-2", *sched, "--run", RUN)
    wait_for(lambda: store.status() == "finished", 240, interval=0.5, what="the run to finish", on_fail=procs.logs)
    out = check_exactly_once(p, store)
    st = out["state"]
    assert st["rl_applied"] >= 4 and st["es_applied"] >= 4, st
    tag_after = p.hget(store.key(f"dist:{st['version']}"), "tag")
    assert tag_before.split(b":")[0] == tag_after.split(b":")[0] == run_token(store.config()).encode()
    # Two incarnations: the versions the second one published carry its tag.
    assert st["version"] > version_before and tag_before != tag_after, (version_before, st["version"])
    # The primary has no replica: the hosts follow the fan-out instance.
    assert p.info("replication")["connected_slaves"] == 0
    assert f.info("replication")["connected_slaves"] == 1
    # The host holds versions, the critic and the observations of the run, and nothing else.
    wait_for(lambda: host.info("replication")["master_link_status"] == "up", 10, what="the host's link")
    held = _keys(host)
    assert any(k.endswith(":critic") for k in held) and any(":dist:" in k for k in held), held
    assert host.xlen(store.key("obs")) > 0
    assert all(HOST_KEYS.match(k) for k in held), [k for k in held if not HOST_KEYS.match(k)]
    assert not any(k.startswith("rq:") for k in held)
    # Its versions are the primary's: same bytes and tag, none the primary lacks.
    for k in held:
        if ":dist:" in k:
            assert host.hgetall(k) == p.hgetall(k), k
    # The primary names the critic's version; its weights live on the fan-out instance alone.
    assert p.hget(store.key("critic"), "weights") is None and f.hget(store.key("critic"), "weights")
    # Jobs read from the host (the fan-out instance is a fallback they seldom need).
    assert host.info("stats")["keyspace_hits"] > 0
    # The replica of the fan-out instance refuses a client without its password.
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=int(found.group(1))).get(store.key("critic"))
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=fanout.port).get(store.key("critic"))


def _config(run_id: str = "inc") -> RunConfig:
    return RunConfig.from_preset("AesrlNull-v0", algo="es", run_id=run_id, hidden=(8, 8), created_at=1000.0,
                                 env_kwargs={"episode_len": 5}, mean_eval_episodes=1).resolve()


def test_a_version_left_by_a_failed_commit_is_never_served_under_its_number(primary, fanout, tmp_path, fresh):
    """Incarnation A writes dist:6 to the fan-out instance, then its commit fails (the primary never
    names 6). Incarnation B publishes another dist:6: a job that the primary hands version 6 never gets
    A's bytes, not from the host replica, not from the fan-out instance; B's once they are there."""
    p, f = connect(primary.url), connect(fanout.url)
    host = host_replica.HostReplica(fanout.url, directory=tmp_path / "host").start()
    try:
        assert host.wait_synced(20)
        cfg = _config()
        store, fan = Store(p, cfg.run_id), None
        assert store.write_config(cfg)
        fan = Fanout(store, f)
        dim = cfg.actor_dim
        tag_a, tag_b = incarnation_token(cfg), incarnation_token(cfg)
        assert tag_a != tag_b and tag_a.split(":")[0] == run_token(cfg)
        fan.publish_dist(6, np.full(dim, 1.0, np.float32), np.full(dim, 1e-3, np.float32), tag_a)  # A's, never committed
        store.publish_dist(6, np.full(dim, 2.0, np.float32), np.full(dim, 1e-3, np.float32), tag=tag_b)  # B's commit
        store.set_state(status="running", version=6, **{FANOUT_FIELD: "fan-out"})
        store.add_inflight("j1", {"kind": "es", "version": 6, "seed": 1})
        fresh.setenv(FANOUT_ENV, fanout.url)
        fresh.setenv(replica.READ_URL_ENV, host.url)
        fresh.setenv(replica.WAIT_ENV, "0.05")
        wait_for(lambda: host.client().exists(store.key("dist:6")), 10, what="A's dist:6 on the host")
        ctx = jobs._context(p, cfg.run_id)
        with pytest.raises(jobs.CodecError):  # A's copy is on the host and the fan-out: neither is taken
            ctx.begin("j1", b"info")
        fan.publish_dist(6, np.full(dim, 2.0, np.float32), np.full(dim, 1e-3, np.float32), tag_b)
        version, mu, _ = ctx.begin("j1", b"info")
        assert version == 6 and float(mu[0]) == 2.0
        # A restarted scheduler sweeps what the primary does not hold (a commit's that failed).
        fan.publish_dist(7, np.full(dim, 3.0, np.float32), np.full(dim, 1e-3, np.float32), tag_a)
        assert fan.sweep({6}) == 1 and not f.exists(store.key("dist:7"))
    finally:
        host.stop()


def test_a_restarted_scheduler_copies_its_version_and_sweeps_the_fanout(primary, fanout, fresh):
    """Scheduler.setup with a fan-out instance: the current version copied there with the primary's tag,
    a version only the fan-out holds deleted, the pointer and the state field written."""
    from scheduler.loop import Scheduler

    p, f = connect(primary.url), connect(fanout.url)
    cfg = _config("setup")
    store = Store(p, cfg.run_id)
    f.xadd(store.key("obs"), {"len": 1, "obs": b"an earlier run's"})  # a namesake's, deleted at the start
    s1 = Scheduler(p, connect(primary.url, blocking=True), cfg, fanout=f)
    s1.setup()
    assert not f.exists(store.key("obs"))
    v = store.current_version()
    assert f.hgetall(store.key(f"dist:{v}")) == p.hgetall(store.key(f"dist:{v}"))
    assert int(f.hget(store.key(CURRENT), "version")) == v
    first = p.hget(store.key(f"dist:{v}"), "tag")
    f.hset(store.key(f"dist:{v + 1}"), mapping={"mu": b"x", "var": b"y", "tag": b"stale"})  # a failed commit's
    f.delete(store.key(f"dist:{v}"))
    s2 = Scheduler(p, connect(primary.url, blocking=True), cfg, fanout=f)
    s2.setup()
    assert not f.exists(store.key(f"dist:{v + 1}"))
    assert f.hget(store.key(f"dist:{v}"), "tag") == first  # the primary's copy, as committed
    assert s2.tag != s1.tag and s2.tag.split(":")[0] == first.decode().split(":")[0]
    # A scheduler without one removes the field: workers then read the primary.
    Scheduler(p, connect(primary.url, blocking=True), cfg).setup()
    assert store.state_field(FANOUT_FIELD, cast=str, default=None) is None


def test_a_worker_without_the_fanout_url_fails_the_job_with_what_to_do(primary, fresh):
    p = connect(primary.url)
    cfg = _config("nourl")
    store = Store(p, cfg.run_id)
    assert store.write_config(cfg)
    store.publish_dist(5, np.zeros(cfg.actor_dim, np.float32), np.full(cfg.actor_dim, 1e-3, np.float32))
    store.set_state(status="running", version=5, **{FANOUT_FIELD: "redis://:***@10.0.0.9:6380/0"})
    store.add_inflight("j1", {"kind": "es", "version": 5, "seed": 1})
    fresh.delenv(FANOUT_ENV, raising=False)
    with pytest.raises(jobs.JobRejected, match="fan-out instance redis://:\\*\\*\\*@10.0.0.9:6380/0.*--fanout-url"):
        jobs.evaluate(run=cfg.run_id, job="j1", kind="es", version=5, seed=1, spec_hash=cfg.spec_hash, client=p)
    failed = store.read_stream("results")
    assert failed and failed[0][1][b"status"] == b"failed"


def test_a_fanout_that_fails_a_write_is_brought_back_in_line_later(primary, fanout, fresh, caplog):
    """The scheduler goes on when the fan-out instance does not answer, writes nothing there for
    FANOUT_RETRY_S, then copies the current version from the primary again."""
    from aesrl_queue.redis_server import free_port
    from scheduler import loop

    p, f = connect(primary.url), connect(fanout.url)
    cfg = _config("outage")
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2)
    s = loop.Scheduler(p, connect(primary.url, blocking=True), cfg, fanout=dead)
    now = [1000.0]
    s.clock = lambda: now[0]
    s.setup()  # the fan-out instance does not answer: the run starts anyway
    store = Store(p, cfg.run_id)
    assert s.fan_behind and store.status() == "running" and "fan-out instance failed a write" in caplog.text
    s.fan = Fanout(store, f)  # the instance answers again
    s._to_fanout(lambda: pytest.fail("a write tried while the instance is behind"))
    now[0] += loop.FANOUT_RETRY_S
    s._fanout_sync()
    v = store.current_version()
    assert not s.fan_behind and f.hgetall(store.key(f"dist:{v}")) == p.hgetall(store.key(f"dist:{v}"))
    assert int(f.hget(store.key(CURRENT), "version")) == v


@pytest.mark.slow  # two CLI starts: over a minute on a loaded 2-core machine
def test_a_run_is_resumed_with_the_fanout_choice_it_started_with(primary, fanout, tmp_path):
    """`scheduler start --run` refuses (exit 2, one line) to resume a run with a fan-out instance
    without its URL, and one without with a URL: its workers decided where to read from its state."""
    import subprocess
    import sys

    from tests.conftest import ROOT, child_env

    p = connect(primary.url)
    cfg = _config("resume-choice")
    store = Store(p, cfg.run_id)
    assert store.write_config(cfg)
    store.set_state(status="stopped", started_at=1.0, **{FANOUT_FIELD: "redis://:***@127.0.0.1:1/0"})
    start = [sys.executable, "-m", "cli.main", "scheduler", "start", "--redis-url", primary.url, "--run", cfg.run_id]
    out = subprocess.run(start, capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "was started with the fan-out instance redis://:***@127.0.0.1:1/0" in out.stderr
    store.set_state(**{FANOUT_FIELD: None})
    out = subprocess.run([*start, "--fanout-url", fanout.url], capture_output=True, text=True, env=child_env(),
                         cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "was started without a fan-out instance" in out.stderr, out.stderr


def test_the_fanout_acl_user_of_the_docs_writes_and_replicates(fanout, primary, tmp_path):
    """docs/security.md's one user of the fan-out instance: the scheduler's, critic's and workers' writes
    there (scripts and the announcement included) and a host replica following it as that user."""
    admin = connect(fanout.url)
    admin.execute_command("ACL", "SETUSER", "aesrl", "on", ">fan-user-pw", "resetkeys", "~aesrl:*", "resetchannels",
                          "&aesrl:*", "+@all", "-@dangerous", "+info", "+psync", "+replconf", "+ping")
    url = f"redis://aesrl:fan-user-pw@127.0.0.1:{fanout.port}/0"
    host = host_replica.HostReplica(url, directory=tmp_path / "host").start()
    try:
        assert host.wait_synced(20), (host.server.directory / "replica.conf").read_text()
        cfg = _config("acl")
        store = Store(connect(primary.url), cfg.run_id)
        assert store.write_config(cfg)
        fan = Fanout(store, connect(url))
        dim = cfg.actor_dim
        fan.publish_dist(3, np.zeros(dim, np.float32), np.ones(dim, np.float32), incarnation_token(cfg))
        fan.make_current(3)
        fan.publish_critic(1, {"critic": np.zeros(4, np.float32)})
        ep = {"obs": np.zeros((5, cfg.obs_dim), np.float32)}
        fan.append_obs([("j1", ep), ("j1:mu", ep)])
        wait_for(lambda: host.client().xlen(store.key("obs")) == 2, 10, what="the observations on the host")
        assert host.client().hget(store.key(CURRENT), "version") == b"3"
        assert not [e for e in admin.acl_log() if e.get("username") == "aesrl"], admin.acl_log()
        with pytest.raises(redis.exceptions.NoPermissionError):
            connect(url).set("other", "x")
    finally:
        host.stop()


def test_the_observations_are_bounded_by_the_replay_capacity_oldest_first(fanout, primary, fresh):
    """Entries of varied lengths: what stays is the newest entries whose lengths sum to at most the
    capacity, each decodable as a job's mirror reads it."""
    cfg = RunConfig.from_preset("AesrlNull-v0", algo="aesrl", run_id="bound", hidden=(8, 8), replay_capacity=100,
                                env_kwargs={"episode_len": 5}).resolve()
    store = Store(connect(primary.url), cfg.run_id)
    assert store.write_config(cfg)
    f = connect(fanout.url)
    fan = Fanout(store, f)
    lengths = [30, 50, 10, 40, 5, 70, 20, 20, 1]
    for i, n in enumerate(lengths):
        obs = np.full((n, cfg.obs_dim), float(i), np.float32)
        fan.append_obs([(f"j{i}", {"obs": obs})] + ([(f"j{i}:mu", {"obs": obs[:1]})] if i % 2 else []))
    added = [e for i, n in enumerate(lengths) for e in [(f"j{i}", n)] + ([(f"j{i}:mu", 1)] if i % 2 else [])]
    kept, total = [], 0
    for name, n in reversed(added):
        if total + n > cfg.replay_capacity:
            break
        kept.insert(0, name)
        total += n
    rows = store.read_stream("obs", count=1000, client=f)
    assert [r[1][b"job"].decode() for r in rows] == kept
    assert int(f.hget(store.key("obs:count"), "held")) == total == sum(int(r[1][b"len"]) for r in rows)
    ep = store.decode_episode(*rows[-1], obs_only=True)
    assert ep["obs"].shape == (1, cfg.obs_dim) and float(ep["obs"][0, 0]) == len(lengths) - 1


def test_a_restarted_critic_daemon_never_reuses_a_number_the_fanout_holds(primary, fanout, fresh):
    """A daemon that wrote version 5 to the fan-out instance and died before the primary named it: its
    successor publishes 6, weights on the fan-out instance, the version alone on the primary."""
    from workers.critic import CriticDaemon, FanoutMissing

    p, f = connect(primary.url), connect(fanout.url)
    cfg = RunConfig.from_preset("AesrlNull-v0", run_id="critic-fan", hidden=(8, 8), critic_hidden=(16, 16),
                                batch_size=32).resolve()
    store = Store(p, cfg.run_id)
    assert store.write_config(cfg)
    store.set_state(**{FANOUT_FIELD: "redis://127.0.0.1:1/0"})
    with pytest.raises(FanoutMissing, match="--fanout-url"):
        CriticDaemon(p, p, cfg.run_id, device="cpu")
    store.publish_critic(3, None)
    Fanout(store, f).publish_critic(5, {"critic": np.zeros(4, np.float32)})  # the dead daemon's last
    d = CriticDaemon(p, p, cfg.run_id, device="cpu", fanout=f)
    d.restore()
    assert d.version == 5
    d.publish({"loss": 0.0})
    assert store.critic_version() == 6 and Fanout(store, f).critic_version() == 6
    assert p.hget(store.key("critic"), "weights") is None
    ctx_weights = store.critic_blob(client=f, tag=run_token(cfg).encode())
    assert ctx_weights is not None and ctx_weights[0] == 6


def test_the_daemons_first_actor_waits_for_the_schedulers_set_up(primary, fanout, fresh):
    """With no random phase (initial_steps 0) the daemon's untrained actor is due at once; it is published
    only once the scheduler's set-up is done, which empties the run's keys on the fan-out instance: one
    published before would be deleted there while the primary names it, and RL jobs could not read it."""
    import threading

    from workers.critic import CriticDaemon

    p, f = connect(primary.url), connect(fanout.url)
    cfg = RunConfig.from_preset("AesrlNull-v0", run_id="critic-first", hidden=(8, 8), critic_hidden=(16, 16),
                                batch_size=32).resolve()
    assert cfg.initial_steps == 0 and cfg.rl_steps_max == 0
    store = Store(p, cfg.run_id)
    assert store.write_config(cfg) and store.status() == "created"
    stop = threading.Event()
    d = CriticDaemon(p, p, cfg.run_id, device="cpu", fanout=f, stop_event=stop)
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    try:
        stop.wait(1.5)
        assert store.critic_version() == 0 and Fanout(store, f).critic_version() == 0
        store.set_state(status="running")  # what the scheduler's set-up commits last
        wait_for(lambda: store.critic_version() == 1, 10, what="the daemon's first actor")
        assert Fanout(store, f).critic_version() == 1
    finally:
        stop.set()
        t.join(10)


def test_status_names_the_fanout_instance_as_what_a_host_falls_back_to(primary):
    from aesrl_queue.store import host_beat, worker_beat
    from cli.report import gather

    p = connect(primary.url)
    cfg = _config("st-fan")
    store = Store(p, cfg.run_id)
    assert store.write_config(cfg)
    store.set_state(status="running", **{FANOUT_FIELD: "redis://:***@10.0.0.2:6380/0"})
    host_beat(p, "hostA:1", {"host": "hostA", "pid": 1, "link": "up", "lag_bytes": 0, "io_s": 0, "restarts": 0})
    worker_beat(p, "w1", {"name": "w1", "host": "hostA", "pid": 2, "fallbacks": 3})
    s = gather(p, cfg.run_id)
    assert s["problem"].startswith("host hostA reads from the fan-out instance: 3 fallbacks")
    assert s["problem_hint"] == "host hostA falls back to the fan-out instance"
