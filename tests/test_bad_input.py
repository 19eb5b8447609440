"""Bad input from every side, on a real Redis with real processes: forged or broken results, an
environment that returns NaN, a truncated blob, a job for a different run spec, foreign functions
and pickles planted in Redis, invalid configs. Each is refused with a clear message and a counter,
and μ/var never change because of it.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import zlib

import pytest
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from aesrl_queue import codec
from aesrl_queue.store import QUEUE_ES, Store
from tests.conftest import ROOT, child_env, wait_for
from tests.faults import write_config


def aq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True,
                          env=child_env(), cwd=ROOT, timeout=timeout)


def _status_json(url: str, run: str) -> dict:
    out = aq("status", "--redis-url", url, "--run", run, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _dist(client, store: Store, version: int = 0) -> tuple[bytes, bytes]:
    return tuple(client.hmget(store.key(f"dist:{version}"), ["mu", "var"]))


def _es_run(tmp_path, procs, url: str, run: str, env_id: str = "AesrlNull-v0", **fields) -> None:
    """An ES-only run (no critic needed) on a cheap environment; the scheduler as users start it."""
    cfg = write_config(tmp_path / f"{run}.json", env_id, algo="es", hidden=[8, 8], total_steps=100_000,
                       result_ttl=30, failure_ttl=120, **fields)
    procs.cli("scheduler", "scheduler", "start", "--redis-url", url, "--config", str(cfg), "--run-id", run)


def _es_run_without_workers(tmp_path, procs, url: str, client, run: str) -> Store:
    """`_es_run`, then wait until its scheduler has jobs in flight (no worker will take them)."""
    _es_run(tmp_path, procs, url, run)
    store = Store(client, run)
    wait_for(lambda: store.exists() and client.hlen(store.key("inflight")) >= 2, 60, what="jobs in flight",
             on_fail=procs.logs)
    return store


# -- forged results: no worker at all, results planted in the stream --------------------------------
def test_forged_results_are_rejected_and_mu_never_moves(tmp_path, redis_url, client, procs):
    run = "bad-results"
    store = _es_run_without_workers(tmp_path, procs, redis_url, client, run)
    cfg = store.config()
    mu0 = _dist(client, store)

    def in_flight() -> list[str]:
        return sorted(store.inflight())

    def plant(**fields) -> None:
        base = {"status": "ok", "kind": "es", "version": 0, "seed": 1, "fitness": 1.0, "len": 50, "f_mu": 0.0,
                "f_mu_version": 0, "worker": "forger", "spec_hash": cfg.spec_hash}
        base.update(fields)
        client.xadd(store.key("results"), {k: v for k, v in base.items() if v is not None})

    def rejected(n: int) -> None:
        wait_for(lambda: store.state()["rejected"] >= n, 30, interval=0.1, what=f"{n} rejections",
                 on_fail=procs.logs)

    job = in_flight()[0]
    plant(job=job, fitness="nan")
    rejected(1)
    job = wait_for(in_flight, 60)[0]
    plant(job=job, fitness="inf")
    rejected(2)
    job = wait_for(in_flight, 60)[0]
    plant(job=job, spec_hash="0123456789abcdef")
    rejected(3)
    # An RL result whose trained parameters have the wrong length, and one naming a key of another run.
    job = wait_for(in_flight, 60)[0]
    client.set(store.key(f"ind:{job}"), codec.encode_array([0.5] * (cfg.actor_dim - 3)), ex=60)
    plant(job=job, kind="rl", ind=store.key(f"ind:{job}"))
    rejected(4)
    job = wait_for(in_flight, 60)[0]
    client.set(f"aesrl:other:ind:{job}", codec.encode_array([0.5] * cfg.actor_dim), ex=60)
    plant(job=job, kind="rl", ind=f"aesrl:other:ind:{job}")
    rejected(5)
    # Malformed entries: a number that is not one, an unknown kind, no job at all.
    plant(job=wait_for(in_flight, 60)[0], version="twelve")
    plant(job=wait_for(in_flight, 60)[0], kind="evil")
    client.xadd(store.key("results"), {"kind": "es", "status": "ok", "hello": "world"})
    rejected(8)

    st = store.state()
    assert st["results_applied"] == 0 and st["version"] == 0, st
    assert _dist(client, store) == mu0  # μ and var untouched, byte for byte
    assert client.exists(store.key("dist:1")) == 0
    log = procs.log("scheduler")
    for text in ("has fitness nan", "has fitness inf", "has spec_hash 0123456789abcdef", "unusable",
                 "is not an ind: key of run bad-results", "is not a number", "is not es/rl", "has no field 'job'"):
        assert text in log, (text, log[-3000:])
    shown = _status_json(redis_url, run)
    assert shown["rejected"] == 8 and shown["results_applied"] == 0, shown
    # The run goes on: every rejected job's slot was refilled.
    assert len(in_flight()) >= 2


def test_a_result_written_twice_in_one_batch_is_applied_once(tmp_path, redis_url, client, procs):
    """Two ok results of one job that reach the scheduler in the same read (one MULTI here): the
    first is applied, the second counted stale, even though the batch is written to Redis at once."""
    store = _es_run_without_workers(tmp_path, procs, redis_url, client, "twice")
    cfg = store.config()
    job = sorted(store.inflight())[0]
    fields = {"job": job, "status": "ok", "kind": "es", "version": 0, "seed": 7, "fitness": 5.0, "len": 10,
              "f_mu": 0.0, "f_mu_version": 0, "worker": "twice", "spec_hash": cfg.spec_hash}
    pipe = client.pipeline(transaction=True)
    pipe.xadd(store.key("results"), fields)
    pipe.xadd(store.key("results"), fields)
    pipe.execute()
    wait_for(lambda: store.state()["stale"] >= 1, 30, interval=0.1, what="the second copy to be dropped",
             on_fail=procs.logs)
    st = store.state()
    assert st["results_applied"] == 1 and st["es_applied"] == 1 and st["stale"] == 1, st
    assert [h["job"] for _, h in store.history()].count(job) == 1
    assert job not in store.inflight()


# -- real workers ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_nan_environment_fails_jobs_and_is_counted(tmp_path, redis_url, client, procs):
    run = "bad-nan-env"
    _es_run(tmp_path, procs, redis_url, run, env_id="AesrlNaN-v0")
    procs.rq_worker("w0", redis_url)
    store = Store(client, run)
    wait_for(lambda: store.exists() and store.state()["failed"] >= 3, 90, what="failed NaN jobs", on_fail=procs.logs)
    st = store.state()
    assert st["results_applied"] == 0 and st["version"] == 0 and st["steps"] == 0, st
    assert client.exists(store.key("dist:1")) == 0
    assert "non-finite reward" in procs.log("scheduler") or "non-finite" in procs.log("scheduler"), procs.logs()
    assert _status_json(redis_url, run)["failed"] >= 3
    assert procs.procs["w0"].poll() is None  # the worker keeps serving


@pytest.mark.slow
def test_truncated_blob_and_wrong_spec_hash_are_refused_by_workers(tmp_path, redis_url, client, procs):
    run = "bad-blobs"
    _es_run(tmp_path, procs, redis_url, run)
    store = Store(client, run)
    wait_for(lambda: store.exists() and client.hlen(store.key("inflight")) >= 2, 60, what="jobs in flight",
             on_fail=procs.logs)
    cfg = store.config()
    mu_ok, var_ok = _dist(client, store)
    client.hset(store.key("dist:0"), "mu", mu_ok[:-6])  # truncated mid-float
    procs.rq_worker("w0", redis_url)
    wait_for(lambda: store.state()["failed"] >= 2, 60, what="jobs failing on the truncated μ", on_fail=procs.logs)
    assert store.state()["version"] == 0 and store.state()["results_applied"] == 0
    log = procs.log("scheduler")
    assert f"dist:0 mu has {len(mu_ok[:-6])} bytes, not a multiple of 4" in log, log[-2000:]

    # Repaired: the run goes on from the same μ.
    client.hset(store.key("dist:0"), "mu", mu_ok)
    wait_for(lambda: store.state()["results_applied"] >= 3, 60, what="results after the repair", on_fail=procs.logs)

    # A job for an in-flight slot but with another spec_hash (a worker of another env version, a
    # forged job): the worker refuses to evaluate it and says why; the scheduler counts it failed.
    st = store.state()
    consumed = st["failed"] + st["stale"]
    target = sorted(store.inflight())[-1]
    Queue(QUEUE_ES, connection=client, serializer=JSONSerializer).enqueue(
        "workers.jobs.evaluate", kwargs={"run": run, "job": target, "kind": "es", "version": 0, "seed": 5,
                                         "spec_hash": "ffffffffffffffff"},
        job_timeout=60, result_ttl=30, failure_ttl=120, at_front=True)

    def refusal() -> bytes | None:
        for _id, fields in client.xrange(store.key("results")):
            if b"spec_hash ffffffffffffffff" in fields.get(b"error", b""):
                return fields[b"error"]
        return None

    wait_for(refusal, 60, what="the mismatching job refused", on_fail=procs.logs)
    assert f"spec_hash ffffffffffffffff of the job does not match run {run}'s {cfg.spec_hash}".encode() in refusal()
    # Consumed without moving μ: failed if its slot was still in flight when it ran, else stale (the
    # real job of that slot, at the null env's speed, may have finished first).
    wait_for(lambda: store.state()["failed"] + store.state()["stale"] > consumed, 30, what="the refusal consumed",
             on_fail=procs.logs)
    assert procs.procs["w0"].poll() is None


@pytest.mark.slow
def test_worker_refuses_foreign_functions_callbacks_and_pickles(tmp_path, redis_url, client, procs):
    marker = tmp_path / "pwned"
    procs.rq_worker("w0", redis_url)
    q = Queue(QUEUE_ES, connection=client, serializer=JSONSerializer)
    # 1. A JSON job naming a function outside workers.jobs.
    j1 = q.enqueue("os.system", f"touch {marker}", job_timeout=30, result_ttl=30, failure_ttl=120)
    # 2. An allowed function with a callback that would run a foreign function.
    from rq import Callback

    j2 = q.enqueue("workers.jobs.noop", on_success=Callback("os.getpid"), job_timeout=30, result_ttl=30,
                   failure_ttl=120)

    # 3. A pickle planted as the data of a job: unpickling it would run `touch marker`.
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    j3 = q.enqueue("workers.jobs.noop", job_timeout=30, result_ttl=30, failure_ttl=120)
    client.hset(f"rq:job:{j3.id}", "data", zlib.compress(pickle.dumps(Evil())))
    # 4. An allowed job after them: the worker is still serving.
    j4 = q.enqueue("workers.jobs.noop", kwargs={"job": "still-alive"}, job_timeout=30, result_ttl=30,
                   failure_ttl=120)

    def status(job) -> str:
        return (client.hget(f"rq:job:{job.id}", "status") or b"").decode()

    wait_for(lambda: status(j4) == "finished", 90, what="the allowed job after the bad ones", on_fail=procs.logs)
    for job in (j1, j2, j3):
        assert status(job) == "failed", (job.id, status(job))
    assert not marker.exists(), "a planted job ran code on the worker"
    log = procs.log("w0")
    assert "refusing to run 'os.system'" in log, log[-3000:]
    assert "callbacks are not allowed" in log, log[-3000:]
    exc = Job.fetch(j3.id, connection=client, serializer=JSONSerializer)
    assert exc is not None  # RQ could still read the job's metadata; its data was refused
    assert "DeserializationError" in log or "Could not deserialize" in log or "deserializ" in log.lower(), log[-3000:]
    assert procs.procs["w0"].poll() is None


# -- pickles planted in the run's own keys, and invalid configs ----------------------------------------
def test_pickle_planted_in_run_keys_is_refused(redis_url, client, tmp_path):
    run = "planted"
    client.set(f"aesrl:{run}:config", pickle.dumps({"env_id": "AesrlNull-v0"}))
    client.zadd("aesrl:runs", {run: 1.0})
    out = aq("status", "--redis-url", redis_url, "--run", run)
    assert out.returncode == 2 and "holds a pickle" in out.stderr, out.stderr
    out = aq("scheduler", "start", "--redis-url", redis_url, "--run", run)
    assert out.returncode == 2 and "holds a pickle" in out.stderr and "Traceback" not in out.stderr, out.stderr
    out = aq("critic", "start", "--redis-url", redis_url, "--run", run, "--wait", "1")
    assert out.returncode == 2 and "holds a pickle" in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"env_id": "NoSuchEnv-v3"}, "env_id"),
        ({"env_id": "AesrlSleep-v0", "env_kwargs": {"mean_s": -1}}, "env_id"),
        ({"env_id": "AesrlSleep-v0", "env_kwargs": {"colour": "red"}}, "env_kwargs"),
        ({"env_id": "AesrlNull-v0", "speed": 3}, "speed"),
        ({"env_id": "AesrlNull-v0", "var_init": -0.1}, "var_init"),
        ({"env_id": "AesrlNull-v0", "job_timeout": "soon"}, "job_timeout"),
    ],
)
def test_invalid_config_file_is_refused_before_anything_is_enqueued(tmp_path, redis_url, client, fields, name):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(fields))
    out = aq("scheduler", "start", "--redis-url", redis_url, "--config", str(path))
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert f"error: {name}:" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert client.dbsize() == 0, list(client.scan_iter())


def test_unreadable_run_config_file(tmp_path, redis_url, client):
    path = tmp_path / "bad.toml"
    path.write_text("env_id = [unclosed")
    out = aq("scheduler", "start", "--redis-url", redis_url, "--config", str(path))
    assert out.returncode == 2 and "error: file:" in out.stderr, out.stderr
    assert client.dbsize() == 0

