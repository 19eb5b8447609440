"""One copy of a run's published data per host: a relay that follows the primary and writes into a
Redis on this host's loopback, which the host's workers read as they would read a replica
(workers/replica.py, `AESRL_READ_URL`).

A replica receives every write of the run (each episode, each RL individual, RQ's bookkeeping); the
relay copies only what the host's workers read: the config, each published μ/var version once, the
critic when its version changes, and the replay only for runs that make RL jobs (ES-only runs need
none of it). The keys and their names are the primary's, so the workers' reads do not change, and
they are correct under lag for the replica's reasons: every key copied is immutable once written
(`dist:{v}`, `config`, replay entries) or checked against the version the primary named (`critic`);
a version the relay has not copied yet is read from the primary after a bounded wait.

`aesrl-queue worker --processes N` starts a loopback redis-server and this relay beside its workers.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from aesrl_queue.codec import CodecError
from aesrl_queue.config import load_config_blob
from aesrl_queue.optimizers import uses_rl
from aesrl_queue.store import RUNS_KEY, Store, dist_name

log = logging.getLogger(__name__)

# Seconds between looks at the primary's current versions: a job then waits at most this long for
# its μ/var to reach the host (one HMGET per followed run per look: 200 a second per host).
POLL_S = 0.005
# Seconds a copied μ/var version stays on the host: a job reads its version right after the primary
# names it, so only the newest few are ever read.
DIST_TTL_S = 120
RUNS_EVERY_S = 1.0  # seconds between looks for runs to follow (new, finished)
ACTIVE = (b"created", b"running", b"draining")


class _Run:
    def __init__(self, primary: redis.Redis, run_id: str) -> None:
        self.store = Store(primary, run_id)
        self.version = -1
        self.critic = -1
        self.replay_last = "0-0"
        self.rl: bool | None = None  # known once the config is copied


class Relay:
    """Copies what workers read from `primary` into `local`, run by run, until `stop` is set."""

    def __init__(self, primary: redis.Redis, local: redis.Redis, stop: threading.Event | None = None) -> None:
        self.primary = primary
        self.local = local
        self.stop = stop or threading.Event()
        self.runs: dict[str, _Run] = {}
        self._runs_at = 0.0
        self.stats = {"versions": 0, "bytes": 0, "critics": 0, "replay_entries": 0, "errors": 0}

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.step()
            except (redis.RedisError, OSError, CodecError) as exc:
                self.stats["errors"] += 1
                log.warning("relay: %s; trying again in 1s", exc)
                self.stop.wait(1.0)
                continue
            self.stop.wait(POLL_S)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="aesrl-relay", daemon=True)
        thread.start()
        return thread

    def step(self) -> None:
        """One look at the primary: copy every new version, critic and replay entry of the followed runs."""
        now = time.monotonic()
        if now - self._runs_at > RUNS_EVERY_S:
            self._follow_runs()
            self._runs_at = now
        if not self.runs:
            return
        runs = list(self.runs.values())
        pipe = self.primary.pipeline(transaction=False)
        for r in runs:
            pipe.hget(r.store.key("state"), "version")
            pipe.hget(r.store.key("critic"), "version")
        replies = pipe.execute()
        for i, r in enumerate(runs):
            version, critic = replies[2 * i], replies[2 * i + 1]
            if version is not None and int(version) != r.version:
                self._copy_dist(r, int(version))
            if critic is not None and int(critic) != r.critic:
                self._copy_critic(r)
            if r.rl:
                self._copy_replay(r)

    def _follow_runs(self) -> None:
        ids = [k.decode() if isinstance(k, bytes) else k for k in self.primary.zrange(RUNS_KEY, 0, -1)]
        pipe = self.primary.pipeline(transaction=False)
        for run_id in ids:
            pipe.hget(f"aesrl:{run_id}:state", "status")
        active = {run_id for run_id, status in zip(ids, pipe.execute(), strict=True) if status in ACTIVE}
        for run_id in set(self.runs) - active:
            del self.runs[run_id]
        for run_id in active - set(self.runs):
            r = _Run(self.primary, run_id)
            blob = r.store.config_blob()
            if blob is None:
                continue
            r.rl = uses_rl(load_config_blob(blob))
            self.local.set(r.store.key("config"), blob)
            last = self.local.xrevrange(r.store.key("replay"), count=1)  # a relay that restarted
            if last:
                r.replay_last = last[0][0].decode()
            self.runs[run_id] = r
            log.info("relay: following run %s (%s)", run_id, "versions, critic and replay" if r.rl else "versions")

    def _copy_dist(self, r: _Run, version: int) -> None:
        blobs = r.store.dist_blobs(version)
        if blobs is None:  # superseded before this look: the next look copies the newer one
            return
        key = r.store.key(dist_name(version))
        pipe = self.local.pipeline(transaction=False)
        pipe.hset(key, mapping={"mu": blobs[0], "var": blobs[1], "version": version})
        pipe.expire(key, DIST_TTL_S)
        pipe.hset(r.store.key("state"), "version", version)  # what an unpaired f(μ) reads as current
        pipe.execute()
        r.version = version
        self.stats["versions"] += 1
        self.stats["bytes"] += len(blobs[0]) + len(blobs[1])

    def _copy_critic(self, r: _Run) -> None:
        got = r.store.critic_blob()
        if got is None:
            return
        version, blob = got
        self.local.hset(r.store.key("critic"), mapping={"version": version, "weights": blob})
        r.critic = version
        self.stats["critics"] += 1
        self.stats["bytes"] += len(blob)

    def _copy_replay(self, r: _Run) -> None:
        """The replay entries stored since the last look, under their own ids."""
        key = r.store.key("replay")
        copied = False
        while True:
            rows = r.store.read_stream("replay", r.replay_last, count=500)
            if not rows:
                break
            pipe = self.local.pipeline(transaction=False)
            for entry_id, fields in rows:
                pipe.xadd(key, fields, id=entry_id)
                self.stats["bytes"] += sum(len(v) for v in fields.values())
            pipe.execute()
            r.replay_last = rows[-1][0]
            self.stats["replay_entries"] += len(rows)
            copied = True
        if copied:  # the primary drops whole old episodes past its capacity; so does the copy
            first = self.primary.xrange(key, count=1)
            if first:
                self.local.xtrim(key, minid=first[0][0])
