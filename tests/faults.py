"""Helpers of the fault-injection tests: run configs on the cheap environments, finding a worker in
the middle of a job, and the exactly-once checks every fault test ends with.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import redis

from aesrl_queue.store import WORKER_KEY, WORKERS_KEY, Store


def write_config(path: Path, env_id: str, **fields: Any) -> Path:
    """A JSON config file (the same fields as `--config` takes)."""
    path.write_text(json.dumps({"env_id": env_id, **fields}))
    return path


def sleep_config(path: Path, mean_s: float, episode_len: int = 50, **fields: Any) -> Path:
    """AesrlSleep-v0 with tiny networks and a small critic, so RL jobs start within seconds."""
    base = dict(env_kwargs={"episode_len": episode_len, "mean_s": mean_s}, hidden=[8, 8], critic_hidden=[16, 16],
                batch_size=32, critic_chunk=100, mean_eval_episodes=1, result_ttl=30, failure_ttl=120)
    base.update(fields)
    return write_config(path, "AesrlSleep-v0", **base)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def workers_in_job(client: redis.Redis, store: Store, kind: str | None = None) -> list[dict[str, str]]:
    """Live workers whose current job of this run has started (registered in `started`)."""
    started = store.started()
    out = []
    for name in client.smembers(WORKERS_KEY):
        fields = {_text(k): _text(v) for k, v in client.hgetall(WORKER_KEY.format(name=_text(name))).items()}
        if not fields or fields.get("run") != store.run_id:
            continue
        if kind is not None and fields.get("kind") != kind:
            continue
        if fields.get("job") in started:
            out.append(fields)
    return out


def signal_worker(fields: dict[str, str], sig: int) -> int:
    pid = int(fields["pid"])
    os.kill(pid, sig)
    return pid


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie (our child, not yet reaped) also counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def results(client: redis.Redis, store: Store) -> list[tuple[str, dict[str, str]]]:
    return [(_text(i), {_text(k): _text(v) for k, v in f.items()}) for i, f in client.xrange(store.key("results"))]


def _added(client: redis.Redis, key: str) -> int:
    """Entries ever added to a stream (XINFO's entries-added; trimming does not lower it)."""
    if not client.exists(key):
        return 0
    return int(client.xinfo_stream(key)["entries-added"])


def check_exactly_once(client: redis.Redis, store: Store) -> dict[str, Any]:
    """Every results entry consumed exactly once, every job applied at most once, versions in order.

    Returns the state and the applied history for further checks.
    """
    st = store.state()
    entries = results(client, store)
    # Streams are capped (history_max): count what was ever added, check what is still there.
    written = _added(client, store.key("results"))
    consumed = st["results_applied"] + st["failed"] + st["rejected"] + st["stale"]
    assert consumed == written, ("results consumed != results written", consumed, written, st)
    if entries:
        assert st.get("last_result_id") == entries[-1][0], (st.get("last_result_id"), entries[-1][0])
    history = [h for _i, h in store.history()]
    assert _added(client, store.key("history")) == st["results_applied"], st["results_applied"]
    per_job = collections.Counter(h["job"] for h in history)
    dup = [j for j, n in per_job.items() if n > 1]
    assert not dup, f"jobs applied more than once: {dup}"
    # Each applied job had exactly one ok result in the stream (a second would be a duplicate).
    ok_per_job = collections.Counter(f.get("job") for _i, f in entries if f.get("status", "ok") == "ok")
    trimmed = written > len(entries)
    for job in per_job:
        assert trimmed or ok_per_job[job] >= 1, f"{job} applied without an ok result"
    versions = [h["version"] for h in history]
    assert versions == sorted(versions), "versions out of order"
    first = versions[:1] if trimmed else [0]
    steps = [b - a for a, b in zip(first + versions, versions, strict=False)]
    # one version per individual told: an antithetic pair tells two (its history entry names the worse)
    most = [2 if "f_pair_worse" in h else 1 for h in history]
    assert all(0 <= s <= m for s, m in zip(steps, most, strict=True)), f"version sequence skips: {versions}"
    assert not versions or versions[-1] == st["version"]
    return {"state": st, "history": history, "results": entries}


def check_td3_exactly_once(client: redis.Redis, store: Store) -> dict[str, Any]:
    """check_exactly_once for td3, whose results are its own episodes (it has no jobs): every episode
    stored in `replay` and recorded in `history` exactly once, numbered without a gap or a repeat,
    `steps` counting each stored episode once, versions in order.

    Returns the state and the history for further checks.
    """
    st = store.state()
    history = [h for _i, h in store.history()]
    episodes = st["results_applied"]
    assert episodes > 0, st
    assert _added(client, store.key("replay")) == _added(client, store.key("history")) == episodes, (
        "episodes stored, recorded and counted differ", _added(client, store.key("replay")),
        _added(client, store.key("history")), st)
    replay_jobs = [_text(f[b"job"]) for _i, f in client.xrange(store.key("replay"))]
    expected = [f"{store.run_id}-e{i}" for i in range(1, episodes + 1)]
    assert [h["job"] for h in history] == expected, "episodes recorded out of order, twice or not at all"
    assert replay_jobs == expected, "episodes stored out of order, twice or not at all"
    steps = [h["steps"] for h in history]
    assert steps == list(itertools.accumulate(h["len"] for h in history)), "steps counted twice or skipped"
    assert steps[-1] == st["steps"], (steps[-1], st["steps"])
    versions = [h["version"] for h in history]
    assert versions == sorted(versions) and versions[-1] == st["version"], (versions, st)
    assert all(b - a in (0, 1) for a, b in zip(versions, versions[1:], strict=False)), versions
    return {"state": st, "history": history}


def wait_pid_exit(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pid_gone(pid):
            return True
        time.sleep(0.05)
    return False


__all__ = ["check_exactly_once", "pid_gone", "results", "signal", "signal_worker", "sleep_config",
           "wait_pid_exit", "workers_in_job", "write_config"]
