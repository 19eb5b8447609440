"""One copy of a run's published data per host: a relay that follows the primary and writes into a
Redis on this host's loopback, which the host's workers read as they would read a replica
(workers/replica.py, `AESRL_READ_URL`).

A replica receives every write of the run (each episode, each RL individual, RQ's bookkeeping); the
relay copies only what the host's workers read: the config, each published μ/var version once, the
critic when its version changes, and the replay's observations only for runs that make RL jobs
(ES-only runs need none of it). The keys and their names are the primary's, so the workers' reads
do not change, and they are correct under lag for the replica's reasons: every key copied is
immutable once written (`dist:{v}`, `config`, replay entries) or checked against the version the
primary named (`critic`); a version the relay has not copied yet is read from the primary after a
bounded wait (0.25 s), and a relay that is down is skipped the same way.

`aesrl-queue worker --processes N` starts a loopback redis-server and this relay beside its workers.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import redis

from aesrl_queue import codec
from aesrl_queue.codec import CodecError
from aesrl_queue.config import load_config_blob
from aesrl_queue.optimizers import uses_rl
from aesrl_queue.store import Store, decode_dist, list_runs, relay_beat

log = logging.getLogger(__name__)

# Seconds between looks at the primary's current versions: a job then waits at most this long for
# its μ/var to reach the host (one HGET per followed run per look, two for RL runs: 200-400 commands a
# second per host).
POLL_S = 0.005
# Seconds a copied μ/var version stays on the host once superseded: a job reads its version right
# after the primary names it, so only the newest few are ever read.
DIST_TTL_S = 120
RUNS_EVERY_S = 1.0  # seconds between looks for runs to follow (new, finished)
BEAT_S = 2.0  # seconds between the relay's heartbeats (what it has copied, for `status`)
ACTIVE = ("created", "running", "draining")


class _Run:
    def __init__(self, primary: redis.Redis, local: redis.Redis, run_id: str) -> None:
        self.store = Store(primary, run_id)
        self.copy = Store(local, run_id)  # the same keys on the host
        self.version = -1
        self.critic = -1
        self.replay_last = "0-0"
        self.rl = False


class Relay:
    """Copies what workers read from `primary` into `local`, run by run, until `stop` is set."""

    def __init__(self, primary: redis.Redis, local: redis.Redis, stop: threading.Event | None = None) -> None:
        self.primary = primary
        self.local = local
        self.stop = stop or threading.Event()
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.runs: dict[str, _Run] = {}
        self._runs_at = -RUNS_EVERY_S
        # bytes: the payload received from the primary (μ/var, critic weights, replay observations);
        # replay_bytes: of it, the replay's (they follow the results, the rest the versions)
        self.stats = {"versions": 0, "bytes": 0, "critics": 0, "replay_reads": 0, "replay_bytes": 0, "errors": 0}

    def run(self) -> None:
        beat_at = -BEAT_S
        while not self.stop.is_set():
            try:
                self.step()
                if time.monotonic() - beat_at >= BEAT_S:  # only after a look that went through
                    self.beat()
                    beat_at = time.monotonic()
            except (redis.RedisError, OSError, CodecError) as exc:
                self.stats["errors"] += 1
                log.warning("relay: %s; trying again in 1s", exc)
                self.stop.wait(1.0)
                continue
            self.stop.wait(POLL_S)

    def beat(self) -> None:
        """What this host's copy holds, for `aesrl-queue status`: written after a look that went through,
        so its age says how long ago the relay last followed the primary (gone WORKER_TTL after it stops)."""
        relay_beat(self.primary, self.name, {
            "host": socket.gethostname(), "pid": os.getpid(), "runs": len(self.runs),
            "versions": self.stats["versions"], "mb": round(self.stats["bytes"] / 1e6, 1),
            "errors": self.stats["errors"]})

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
        for r in list(self.runs.values()):
            version = r.store.current_version()
            if version != r.version:
                self._copy_dist(r, version)
            if r.rl:
                critic = r.store.critic_version()  # the version a job's start script names
                if critic > 0 and critic != r.critic:
                    self._copy_critic(r)
                self._copy_replay(r)

    def _follow_runs(self) -> None:
        active = {run_id for run_id, _t in list_runs(self.primary)
                  if Store(self.primary, run_id).status() in ACTIVE}
        for run_id in set(self.runs) - active:
            del self.runs[run_id]
        for run_id in active - set(self.runs):
            r = _Run(self.primary, self.local, run_id)
            blob = r.store.config_blob()
            if blob is None:
                continue
            cfg = load_config_blob(blob)
            r.rl = uses_rl(cfg)
            r.copy.write_config(cfg)
            self.runs[run_id] = r
            log.info("relay: following run %s (%s)", run_id, "versions, critic and replay" if r.rl else "versions")

    def _copy_dist(self, r: _Run, version: int) -> None:
        blobs = r.store.dist_blobs(version)
        if blobs is None:  # superseded before this look: the next look copies the newer one
            return
        mu, var = decode_dist(version, *blobs, r.store.config().actor_dim)
        pipe = self.local.pipeline(transaction=False)
        r.copy.publish_dist(version, mu, var, pipe=pipe)
        if r.version >= 0:  # superseded: jobs that named it a moment ago still find it
            r.copy.drop_dists([r.version], ttl=DIST_TTL_S, pipe=pipe)
        r.copy.set_state(pipe=pipe, version=version)  # what an unpaired f(μ) reads as current
        pipe.execute()
        r.version = version
        self.stats["versions"] += 1
        self.stats["bytes"] += len(blobs[0]) + len(blobs[1])

    def _copy_critic(self, r: _Run) -> None:
        got = r.store.critic_blob()
        if got is None:
            return
        version, blob = got
        r.copy.publish_critic(version, codec.unpack(blob, what="critic weights"))
        r.critic = version
        self.stats["critics"] += 1
        self.stats["bytes"] += len(blob)

    def _copy_replay(self, r: _Run) -> None:
        """The replay entries stored since the last look, under their own ids, with the fields the
        workers' replay mirrors keep (observations: 68 of 168 KB per HalfCheetah episode)."""
        while True:
            got = r.store.relay_replay(self.local, r.replay_last, count=500)
            if got is None:
                return
            r.replay_last = got[0]
            self.stats["replay_reads"] += 1
            self.stats["bytes"] += got[1]
            self.stats["replay_bytes"] += got[1]
