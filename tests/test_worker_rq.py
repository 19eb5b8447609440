"""AesrlWorker keeps RQ's records as RQ's own SimpleWorker does, in fewer Redis commands per job.

`AesrlWorker` pipelines and throttles RQ's worker-key refresh and skips rewriting an unchanged
"idle" state (workers/worker.py). These tests run real `rq worker` processes on a private Redis and
read what RQ itself reads: registries, job hashes, the worker's key, `Worker.all`.
"""

from __future__ import annotations

import sys
import time

from rq import Queue, Worker
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from aesrl_queue.store import live_workers
from tests.conftest import wait_for

N = 60


def enqueue(client, queue: str, n: int, bad: int = 0) -> list[str]:
    q = Queue(queue, connection=client, serializer=JSONSerializer)
    datas = [Queue.prepare_data("workers.jobs.noop", kwargs={"run": "t", "job": f"{queue}-{i}"}, timeout=60,
                                result_ttl=600, failure_ttl=600, job_id=f"{queue}-{i}") for i in range(n)]
    # A job whose function raises (an unexpected argument): RQ's failure path.
    datas += [Queue.prepare_data("workers.jobs.noop", kwargs={"nope": 1}, timeout=60, result_ttl=600,
                                 failure_ttl=600, job_id=f"{queue}-bad{i}") for i in range(bad)]
    q.enqueue_many(datas)
    return [d.job_id for d in datas]


def command_counts(client) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in client.info("commandstats").items()}


def burst(procs, name: str, url: str, worker_class: str, queue: str) -> None:
    p = procs.start(name, [sys.executable, "-m", "rq.cli", "worker", "-w", worker_class, "--serializer", "json",
                           "--burst", "-u", url, queue])
    assert p.wait(120) == 0, procs.log(name)


def test_rq_records_are_complete_and_cost_fewer_commands_than_simpleworker(client, redis_url, procs) -> None:
    """Same jobs, same records in RQ's keys; RQ's worker-key refresh no longer runs 3 times per job."""
    used = {}
    for name, cls in (("simple", "rq.worker.SimpleWorker"), ("aesrl", "workers.AesrlWorker")):
        ids = enqueue(client, f"q-{name}", N, bad=1)
        before = command_counts(client)
        burst(procs, name, redis_url, cls, f"q-{name}")
        after = command_counts(client)
        used[name] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        ok, bad = ids[:N], ids[N:]
        for jid in ok:
            job = Job.fetch(jid, connection=client, serializer=JSONSerializer)
            assert job.get_status() == JobStatus.FINISHED, (name, jid)
            assert job.ended_at and job.started_at and job.last_heartbeat, (name, jid)
            assert job.last_heartbeat >= job.started_at, (name, jid)  # written at the end, not only at the start
            assert job.return_value() == {"job": jid}
        failed = Job.fetch(bad[0], connection=client, serializer=JSONSerializer)
        assert failed.get_status() == JobStatus.FAILED and "TypeError" in (failed.latest_result().exc_string or "")
        assert set(FinishedJobRegistry(f"q-{name}", connection=client).get_job_ids()) == set(ok)
        assert FailedJobRegistry(f"q-{name}", connection=client).get_job_ids() == bad
        assert StartedJobRegistry(f"q-{name}", connection=client).get_job_ids() == []
    total = {name: sum(c.values()) for name, c in used.items()}
    # SimpleWorker refreshes its key with HSET + 2 EXPIRE three times per job; AesrlWorker at most once.
    assert used["simple"]["expire"] >= 6 * N, used["simple"]
    assert used["aesrl"]["expire"] <= used["simple"]["expire"] - 4 * N, (used["aesrl"]["expire"], used["simple"]["expire"])
    assert total["aesrl"] <= total["simple"] - 6 * N, total


def test_a_live_worker_looks_alive_to_rq(client, redis_url, procs) -> None:
    """`rq info` reads Worker.all(): the worker is listed, idle after its jobs, with a fresh heartbeat,
    its counts, and a key that outlives the refresh interval many times over."""
    procs.rq_worker("w", redis_url)
    wait_for(lambda: len(Worker.all(connection=client)) == 1, 60, what="the worker to register with RQ",
             on_fail=procs.logs)
    ids = enqueue(client, "aesrl-es", N, bad=1)
    wait_for(lambda: len(FinishedJobRegistry("aesrl-es", connection=client)) == N
             and len(FailedJobRegistry("aesrl-es", connection=client)) == 1, 60, what="the jobs to finish",
             on_fail=procs.logs)
    [w] = Worker.all(connection=client)
    wait_for(lambda: (w.refresh() or True) and w.get_state() == "idle", 60, what="state idle")
    assert w.successful_job_count == N and w.failed_job_count == 1
    done = [Job.fetch(j, connection=client, serializer=JSONSerializer) for j in ids[:N]]
    assert all(job.worker_name == w.name for job in done)
    # Fresh: RQ's key was refreshed as the last (failing) job started, after every ok job had ended,
    # not left at the worker's birth.
    assert w.last_heartbeat is not None and w.last_heartbeat >= max(job.ended_at for job in done), (
        w.last_heartbeat, max(job.ended_at for job in done))
    assert client.ttl(w.key) > 300  # worker_ttl + 60 by default; refreshed, never left to lapse
    # The project's own heartbeat (what `status` lists) counts every job, the failed one included,
    # and names no job once the worker is idle.
    ours = live_workers(client)
    assert list(ours) == [w.name], ours
    wait_for(lambda: live_workers(client)[w.name].get("jobs_done") == str(N + 1), 10,
             what="the heartbeat to count the jobs", on_fail=lambda: str(live_workers(client)))
    beat = live_workers(client)[w.name]
    assert beat["job"] == "" and beat["kind"] == "" and beat["run"] == "", beat


def test_rq_suspend_still_stops_the_worker_taking_jobs(client, redis_url, procs) -> None:
    """`rq suspend` is checked before every job, as in RQ. (An idle worker is already blocked waiting
    for a job when the suspension comes: RQ lets it run that one, then it stops taking jobs.)"""
    from rq.suspension import resume, suspend

    procs.rq_worker("w", redis_url)
    wait_for(lambda: len(Worker.all(connection=client)) == 1, 60, what="the worker to register with RQ",
             on_fail=procs.logs)
    suspend(client)
    time.sleep(1.5)
    enqueue(client, "aesrl-es", 5)
    time.sleep(2.0)
    assert len(FinishedJobRegistry("aesrl-es", connection=client)) <= 1
    resume(client)
    wait_for(lambda: len(FinishedJobRegistry("aesrl-es", connection=client)) == 5, 30,
             what="the jobs to run after `rq resume`", on_fail=procs.logs)
