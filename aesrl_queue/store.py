"""The Redis schema (docs/architecture.md) behind named operations, and every Lua script.

Every key of a run lives under `aesrl:{run_id}:` and has a lifetime or a bound. The scheduler is
the only writer of μ/var and of the state it owns; workers append episodes and results; the
critic daemon publishes weights. Every reader validates what it reads.
"""

from __future__ import annotations

import base64
import logging
import math
import secrets
import time
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from aesrl_queue import codec
from aesrl_queue.codec import CodecError
from aesrl_queue.config import RunConfig, load_config_blob

log = logging.getLogger(__name__)

RUNS_KEY = "aesrl:runs"  # zset run_id -> created_at: every run on this Redis
WORKERS_KEY = "aesrl:workers"  # set of worker names that heartbeat
WORKER_KEY = "aesrl:worker:{name}"  # hash with a short TTL, refreshed by the worker's heartbeat
WORKER_TTL = 10  # seconds a worker counts as live after its last heartbeat
HOSTS_KEY = "aesrl:hosts"  # set of the hosts whose replica reports (workers/host_replica.py)
HOST_KEY = "aesrl:host:{name}"  # hash with WORKER_TTL: the host replica's link, lag and restarts
QUEUE_RL = "aesrl-rl"
QUEUE_ES = "aesrl-es"
# Names under a run's prefix (Store.key) of its streams and of the version each started job uses; the
# overhead benchmark reads these raw to measure what travels and what is kept (bench/rawkeys.py).
HISTORY, RESULTS, REPLAY, REFS = "history", "results", "replay", "refs"
# The pub/sub channel under a run's prefix on which each published version is announced (its number),
# right after the commit that writes it: replicas deliver it to their subscribers after the bytes.
ANNOUNCE = "versions"
# The names under a run's prefix that only the fan-out instance holds (a run with one: FANOUT_FIELD in
# its state): the current version's number (the primary keeps it in `state`), and the replay's
# observations that RL jobs sample, with the index that bounds them as `replay:index` bounds the replay.
CURRENT, OBS = "current", "obs"
FANOUT_FIELD = "fanout"  # state field: the fan-out instance of the run (its address, no password)
# rl_steps_max 0: how many of the critic daemon's last published actors stay under ind:policy-{version} for
# RL jobs to copy as their individuals (288 KB each for HalfCheetah's 256-256 actor)
POLICIES_KEPT = 8
# save_checkpoint's parts: the key under the run's prefix, and what a decoding error names.
CHECKPOINTS = {"optimizer": ("optimizer", "optimizer state"), "critic": ("critic:ckpt", "critic checkpoint"),
               "td3": ("td3:ckpt", "td3 checkpoint")}
STATUSES = ("created", "running", "draining", "finished", "stopped", "failed")
EPISODE_FIELDS = ("obs", "act", "rew", "next_obs", "done")


def dist_name(version: int) -> str:
    """The name under a run's prefix of the hash of μ/var version `version` (the Lua scripts below
    spell it too)."""
    return f"dist:{version}"


# Integer and float fields of the state hash (everything else is kept as text).
STATE_INTS = (
    "version", "n_rl", "n_es", "steps", "interactions", "critic_version", "critic_steps",
    "replay_held", "results_applied", "rejected", "failed", "replaced", "stale", "dispatched",
    "rl_applied", "es_applied", "f_mu_version", "generation", "td3_updates", "critic_request", "prev_gen_steps",
)
STATE_FLOATS = ("f_mu", "best_fitness", "started_at", "updated_at", "finished_at", "critic_loss",
                "critic_steps_per_s", "last_p_rl", "last_p_es",
                "critic_updated_at", "r_used")

# Append one episode (Lua table `ep` of field/value args, `n` transitions, `extra` evaluation-only
# interactions) to the replay stream, count its steps, and drop whole old episodes once the stream
# holds more than `cap` transitions (an index list keeps "id len" per entry). Returns the entry id and
# the counters `steps` and `interactions` after this episode. KEYS: replay, state, replay:index.
_APPEND_EPISODE = """
local function append_episode(ep, n, extra, cap)
  local id = redis.call('XADD', KEYS[1], '*', unpack(ep))
  local steps = redis.call('HINCRBY', KEYS[2], 'steps', n)
  local inter = redis.call('HINCRBY', KEYS[2], 'interactions', n + extra)
  local held = redis.call('HINCRBY', KEYS[2], 'replay_held', n)
  redis.call('RPUSH', KEYS[3], id .. ' ' .. n)
  while held > cap do
    local head = redis.call('LPOP', KEYS[3])
    if not head then break end
    local sp = string.find(head, ' ')
    redis.call('XDEL', KEYS[1], string.sub(head, 1, sp - 1))
    held = redis.call('HINCRBY', KEYS[2], 'replay_held', -tonumber(string.sub(head, sp + 1)))
  end
  return id, steps, inter
end
"""

# Store one episode atomically. ARGV: capacity, n, extra interactions, episode args...
_STORE_EPISODE = _APPEND_EPISODE + """
local id = append_episode({unpack(ARGV, 4)}, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[1]))
return id
"""

# The end of a successful job in one round trip: store its episodes as _STORE_EPISODE does, each its
# own entry (or, for a group with no episode args, only count its steps: a run without a critic keeps
# no replay), count `extra` interactions that are not stored, then append the result with the
# counters as they stand after this (the scheduler reads steps from results instead of polling).
# KEYS: replay, state, replay:index, results. ARGV: capacity, extra interactions, results maxlen,
# number of episodes, then per episode its n, number of args and args..., then the result args.
_FINISH_JOB = _APPEND_EPISODE + """
local cap, extra = tonumber(ARGV[1]), tonumber(ARGV[2])
local i = 5
local steps, inter, _
for _e = 1, tonumber(ARGV[4]) do
  local n, na = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  if na > 0 then
    _, steps, inter = append_episode({unpack(ARGV, i + 2, i + 1 + na)}, n, 0, cap)
  else
    steps = redis.call('HINCRBY', KEYS[2], 'steps', n)
    inter = redis.call('HINCRBY', KEYS[2], 'interactions', n)
  end
  i = i + 2 + na
end
if extra ~= 0 then inter = redis.call('HINCRBY', KEYS[2], 'interactions', extra) end
local res = {}
for j = i, #ARGV do res[#res + 1] = ARGV[j] end
res[#res + 1] = 'steps'
res[#res + 1] = steps
res[#res + 1] = 'interactions'
res[#res + 1] = inter
return redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*', unpack(res))
"""

# The bound of the observations on the fan-out instance (`cap` transitions, as the replay's), run in
# the MULTI/EXEC that appends their entries with plain XADDs: the blobs never pass through Lua, which
# copies each argument (173 µs of Redis per 68 KB entry against 35 for the XADD alone). The index
# holds each entry's length in stream order, so dropping its k oldest is an exact trim to XLEN - k.
# KEYS: obs, obs:count, obs:index. ARGV: capacity, then the n of each entry just appended.
_BOUND_OBS = """
local cap = tonumber(ARGV[1])
local held = 0
for i = 2, #ARGV do
  redis.call('RPUSH', KEYS[3], ARGV[i])
  held = redis.call('HINCRBY', KEYS[2], 'held', tonumber(ARGV[i]))
end
local k = 0
while held > cap do
  local head = redis.call('LPOP', KEYS[3])
  if not head then break end
  held = redis.call('HINCRBY', KEYS[2], 'held', -tonumber(head))
  k = k + 1
end
if k > 0 then redis.call('XTRIM', KEYS[1], 'MAXLEN', redis.call('XLEN', KEYS[1]) - k) end
return held
"""

# A worker starts a job: atomically check the job is still wanted, and record which version this job
# uses, so the scheduler keeps that version until the result is in. Returns the version and the
# critic's version: the primary decides which version the job uses; its μ/var bytes are read apart
# (`dist_blobs`, from the host's replica or the primary), never through Lua, where a 1 MB reply costs
# Redis ~2 ms against ~0.1 ms for a plain HMGET. The third value is the run's token as that version
# holds it (`tag`): a copy of dist:{v} with another token belongs to an earlier run of the same id.
# KEYS: state, inflight, started, refs. ARGV: job, started info, run prefix.
_START_JOB = """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return false end
local v = redis.call('HGET', KEYS[1], 'version')
if not v then return false end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[1], v)
return {v, redis.call('HGET', ARGV[3] .. 'critic', 'version'), redis.call('HGET', ARGV[3] .. 'dist:' .. v, 'tag')}
"""
# Read-only: the current version and its μ (for the evaluation of the mean). KEYS: state (or, on the
# fan-out instance, `current`). ARGV: prefix.
_READ_MU = """
local v = redis.call('HGET', KEYS[1], 'version')
if not v then return false end
return {v, redis.call('HGET', ARGV[1] .. 'dist:' .. v, 'mu')}
"""
@dataclass
class Result:
    """One entry of the results stream, decoded and validated."""

    job: str
    kind: str  # "es" or "rl"
    status: str  # "ok" or "failed"
    version: int
    seed: int
    fitness: float
    length: int
    f_mu: float
    f_mu_version: int
    ind: str  # RL jobs: the key of the trained individual
    worker: str
    spec_hash: str
    error: str
    eval_steps: int  # steps of the f(μ) episodes (stored steps where the run keeps a replay)
    duration: float
    steps: int = -1  # the run's stored steps right after this job's episode was stored (-1: unknown)
    interactions: int = -1
    # antithetic ES jobs (es_antithetic): the return and length of μ − σ·ε (NaN, 0 otherwise)
    mirror_fitness: float = math.nan
    mirror_len: int = 0
    policy: int = 0  # RL jobs of rl_steps_max 0: the critic version whose published actor the individual is

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def decode_result(entry_id: bytes | str, fields: dict) -> Result:
    """Validate one results-stream entry. Non-finite numbers pass through: the caller rejects them."""
    f = {_text(k): v for k, v in fields.items()}

    def num(name: str, cast=float, default=None):
        if name not in f:
            if default is None:
                raise CodecError(f"result {_text(entry_id)} has no field {name!r}")
            return default
        try:
            return cast(_text(f[name]))
        except ValueError:
            raise CodecError(f"result {_text(entry_id)}: field {name!r} is not a number: {f[name]!r}") from None

    status = _text(f.get("status", b"ok"))
    kind = _text(f.get("kind", b""))
    if status not in ("ok", "failed"):
        raise CodecError(f"result {_text(entry_id)}: status {status!r} is not ok/failed")
    if kind not in ("es", "rl"):
        raise CodecError(f"result {_text(entry_id)}: kind {kind!r} is not es/rl")
    if "job" not in f:
        raise CodecError(f"result {_text(entry_id)} has no field 'job'")
    return Result(
        job=_text(f["job"]),
        kind=kind,
        status=status,
        version=num("version", int),
        seed=num("seed", int),
        fitness=num("fitness", float, math.nan),
        length=num("len", int, 0),
        f_mu=num("f_mu", float, math.nan),
        f_mu_version=num("f_mu_version", int, -1),
        ind=_text(f.get("ind", b"")),
        worker=_text(f.get("worker", b"")),
        spec_hash=_text(f.get("spec_hash", b"")),
        error=_text(f.get("error", b"")),
        eval_steps=num("eval_steps", int, 0),
        duration=num("duration", float, 0.0),
        steps=num("steps", int, -1),
        interactions=num("interactions", int, -1),
        mirror_fitness=num("mirror_fitness", float, math.nan),
        mirror_len=num("mirror_len", int, 0),
        policy=num("policy", int, 0),
    )


def individual_ttl(cfg: RunConfig) -> int:
    """Seconds an individual (`ind:{job}`, the daemon's `policy_name` actors) outlives its writer's last
    touch: a scheduler that is down for ten minutes, or a job's whole timeout, still finds it."""
    return max(600, int(cfg.job_timeout))


def policy_name(version: int) -> str:
    """The individual (`Store.get_individual`) the critic daemon's actor of critic `version` is kept as
    (rl_steps_max 0: RL jobs copy it as theirs, the scheduler reads it once)."""
    return f"policy-{int(version)}"


def run_token(cfg: RunConfig) -> str:
    """What tells a run from an earlier one of the same id (its creation time): published versions
    and critics carry it, so a host's copy of a deleted run's data is never taken for this run's."""
    return repr(float(cfg.created_at))


def incarnation_token(cfg: RunConfig) -> str:
    """The run token and a random part of one scheduler incarnation (each setup): what the versions a
    run with a fan-out instance publishes carry, on the primary and on the fan-out instance alike. The
    fan-out copy is written before the primary's commit, so a commit that then fails can leave a
    version there that a restart publishes again under the same number with other bytes: its tag
    differs from the one the primary names, so no job takes it. The part before ':' is the run token."""
    return f"{run_token(cfg)}:{secrets.token_hex(6)}"


def same_run(tag: bytes, token: bytes) -> bool:
    """Whether a version's `tag` (a run token, or an incarnation token) is of the run of `token`."""
    return tag.split(b":", 1)[0] == token


def announce(store: Store, version: int) -> None:
    """Tell the hosts that `version` of the store's run is published (after the commit that wrote it:
    a replica delivers the message after the bytes). A hint only: a job waiting for a version also
    looks again every 0.1 s."""
    store.r.publish(store.key(ANNOUNCE), version)


class Store:
    """Named operations on the keys of one run."""

    def __init__(self, client: redis.Redis, run_id: str) -> None:
        self.r = client
        self.run_id = run_id
        self.prefix = f"aesrl:{run_id}:"
        self._config: RunConfig | None = None
        self._store_episode = client.register_script(_STORE_EPISODE)
        self._finish_job = client.register_script(_FINISH_JOB)
        self._start_job = client.register_script(_START_JOB)
        self._read_mu = client.register_script(_READ_MU)

    def key(self, name: str) -> str:
        return self.prefix + name

    # -- config -------------------------------------------------------------------------------
    def write_config(self, cfg: RunConfig) -> bool:
        """Write the config once (SET NX). False when the run already has one."""
        blob = codec.pack(cfg.to_dict())
        pipe = self.r.pipeline()
        pipe.set(self.key("config"), blob, nx=True)
        pipe.zadd(RUNS_KEY, {cfg.run_id: cfg.created_at or time.time()}, nx=True)
        pipe.hsetnx(self.key("state"), "status", "created")
        created = pipe.execute()[0]
        if created:
            self._config = cfg
        return bool(created)

    def replace_config(self, cfg: RunConfig) -> None:
        """Overwrite the stored config (a resume that changes the budget; the spec must not change)."""
        if cfg.spec_hash != self.config().spec_hash:
            raise ValueError(f"run {self.run_id}: a new config must keep the spec {self.config().spec_hash}")
        self.r.set(self.key("config"), codec.pack(cfg.to_dict()))
        self._config = cfg

    def exists(self) -> bool:
        return bool(self.r.exists(self.key("config")))

    def config(self) -> RunConfig:
        """The run's config (cached after the first read); CodecError if missing or malformed."""
        if self._config is None:
            blob = self.r.get(self.key("config"))
            if blob is None:
                raise CodecError(f"run {self.run_id!r} has no config on this Redis")
            self._config = load_config_blob(blob)
        return self._config

    # -- state --------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        raw = self.r.hgetall(self.key("state"))
        out: dict[str, Any] = {}
        for k, v in raw.items():
            name = _text(k)
            text = _text(v)
            try:
                if name in STATE_INTS:
                    out[name] = int(text)
                elif name in STATE_FLOATS:
                    out[name] = float(text)
                else:
                    out[name] = text
            except ValueError:
                log.warning("state field %s=%r is not a number; ignored", name, text)
        for name in STATE_INTS:
            out.setdefault(name, 0)
        return out

    def state_field(self, name: str, cast=int, default=0):
        value = self.r.hget(self.key("state"), name)
        return default if value is None else cast(_text(value))

    def set_state(self, pipe=None, **fields: Any) -> None:
        """Write state fields; a field given as None is removed, a `status` must be one of STATUSES."""
        if "status" in fields and fields["status"] not in STATUSES:
            raise ValueError(f"status {fields['status']!r} is not one of {', '.join(STATUSES)}")
        c = pipe or self.r
        kept = {k: _fmt(v) for k, v in fields.items() if v is not None}
        if kept:
            c.hset(self.key("state"), mapping=kept)
        gone = [k for k, v in fields.items() if v is None]
        if gone:
            c.hdel(self.key("state"), *gone)

    def incr(self, name: str, amount: int = 1, pipe=None) -> None:
        (pipe or self.r).hincrby(self.key("state"), name, amount)

    def status(self) -> str:
        value = self.r.hget(self.key("state"), "status")
        return _text(value) if value is not None else "unknown"

    # -- search distribution versions -------------------------------------------------------------
    def publish_dist(self, version: int, mu: np.ndarray, var: np.ndarray, pipe=None, read_refs: bool = False,
                     tag: str | None = None) -> None:
        """Write dist:{version} carrying `tag` (default: the run token); with `read_refs` also queue an
        HVALS of `refs` (the version each started job uses) on `pipe`, read in the same transaction."""
        c = pipe or self.r
        c.hset(
            self.key(dist_name(version)),
            # Views, not copies: the pipeline sends them before anyone could change the arrays.
            mapping={"mu": codec.array_view(mu), "var": codec.array_view(var), "version": version,
                     "tag": tag or run_token(self.config())},
        )
        if read_refs:
            c.hvals(self.key("refs"))

    def read_dist(self, version: int, client: redis.Redis | None = None) -> tuple[np.ndarray, np.ndarray]:
        """μ and var of `version`; CodecError if the version is gone or its blobs are malformed."""
        dim = self.config().actor_dim
        mu, var = (client or self.r).hmget(self.key(dist_name(version)), ["mu", "var"])
        if mu is None or var is None:
            raise CodecError(f"distribution version {version} of run {self.run_id} is not in Redis (expired?)")
        mu, var = decode_dist(version, mu, var, dim)
        if np.any(var <= 0):
            raise CodecError(f"dist:{version} var holds non-positive values")
        return mu, var

    def current_version(self, client: redis.Redis | None = None) -> int:
        value = (client or self.r).hget(self.key("state"), "version")
        return int(_text(value)) if value is not None else 0

    # -- in-flight jobs ---------------------------------------------------------------------------
    def add_inflight(self, job: str, info: dict[str, Any], pipe=None) -> None:
        (pipe or self.r).hset(self.key("inflight"), job, codec.pack(info))

    def inflight(self) -> dict[str, dict[str, Any]]:
        out = {}
        for k, v in self.r.hgetall(self.key("inflight")).items():
            try:
                out[_text(k)] = codec.unpack(v, what=f"inflight {_text(k)}")
            except CodecError as exc:
                log.warning("dropping malformed in-flight entry: %s", exc)
                self.r.hdel(self.key("inflight"), k)
        return out

    def started(self) -> dict[str, dict[str, Any]]:
        out = {}
        for k, v in self.r.hgetall(self.key("started")).items():
            try:
                out[_text(k)] = codec.unpack(v, what="started entry")
            except CodecError:
                self.r.hdel(self.key("started"), k)
        return out

    def forget_jobs(self, jobs: list[str], pipe=None) -> None:
        """Drop jobs from `inflight`, `started` and `refs` (the version each one used)."""
        if not jobs:
            return
        p = pipe if pipe is not None else self.r.pipeline()
        for name in ("inflight", "started", "refs"):
            p.hdel(self.key(name), *jobs)
        if pipe is None:
            p.execute()

    # -- a worker's side of the job protocol -------------------------------------------------------
    def start_job(self, job: str, info: bytes) -> list | None:
        """Register `job` as started on the primary: [version, critic version] (the version's μ/var
        blobs are then read with `dist_blobs`: dist:{version} stays while the job runs); None if the
        job is no longer wanted."""
        keys = [self.key("state"), self.key("inflight"), self.key("started"), self.key("refs")]
        return self._start_job(keys=keys, args=[job, info, self.prefix]) or None

    def read_current_mu(self, client: redis.Redis | None = None, pointer: str = "state") -> list | None:
        """[current version, its μ blob] in one atomic read (on `client`, e.g. a replica); `pointer` is
        the hash whose `version` names it (CURRENT on a fan-out instance)."""
        return self._read_mu(keys=[self.key(pointer)], args=[self.prefix], client=client or self.r) or None

    def dist_blobs(self, version: int, client: redis.Redis | None = None,
                   tag: bytes | None = None) -> tuple[bytes, bytes] | None:
        """The raw μ and var blobs of dist:{version} (immutable once written), None if absent or, with
        `tag`, if the copy there carries another run token (an earlier run of the same id)."""
        if tag is None:
            mu, var = (client or self.r).hmget(self.key(dist_name(version)), ["mu", "var"])
        else:
            mu, var, held = (client or self.r).hmget(self.key(dist_name(version)), ["mu", "var", "tag"])
            if held is not None and held != tag:  # untagged: written before versions carried tags
                return None
        return None if mu is None or var is None else (mu, var)

    def critic_blob(self, client: redis.Redis | None = None, tag: bytes | None = None) -> tuple[int, bytes] | None:
        """(version, raw weights blob) of the published critic, None if there is none or, with `tag`,
        if it carries another run token."""
        version, blob, held = (client or self.r).hmget(self.key("critic"), ["version", "weights", "tag"])
        if tag is not None and held is not None and held != tag:
            return None
        return None if version is None or blob is None else (int(_text(version)), blob)

    # -- replay ---------------------------------------------------------------------------------
    def finish_job(self, transitions: dict[str, np.ndarray], job: str, result: dict[str, Any],
                   extra_interactions: int = 0, keep: bool = True,
                   more: list[tuple[str, dict[str, np.ndarray]]] = ()) -> str:
        """Store the job's episode, then each (name, transitions) of `more` as an entry of its own,
        count `extra_interactions` unstored steps, and append the result (with steps/interactions
        after it), atomically. With `keep` False the episodes' steps are counted but nothing is
        stored (a run without a critic has no reader for them).

        Returns the result's entry id. Equivalent to append_episode + append_result in one round trip."""
        cfg = self.config()
        args: list[Any] = []
        for name, tr in [(job, transitions), *more]:
            n, ep = _episode_args(tr, name) if keep else (int(tr["rew"].shape[0]), [])
            args += [n, len(ep), *ep]
        for k, v in result.items():
            if k not in ("steps", "interactions"):
                args += [k, _fmt(v)]
        entry = self._finish_job(
            keys=[self.key("replay"), self.key("state"), self.key("replay:index"), self.key("results")],
            args=[cfg.replay_capacity, int(extra_interactions), cfg.history_max, 1 + len(more), *args],
        )
        return _text(entry)

    def append_episode(self, transitions: dict[str, np.ndarray], job: str, extra_interactions: int = 0,
                       pipe=None) -> str | None:
        """Store one episode's transitions; counts `steps` and trims old episodes, atomically.

        Returns the entry id, or None when queued on `pipe` (its reply carries the id)."""
        cfg = self.config()
        n, fields = _episode_args(transitions, job)
        entry = self._store_episode(
            keys=[self.key("replay"), self.key("state"), self.key("replay:index")],
            args=[cfg.replay_capacity, n, extra_interactions, *fields], client=pipe,
        )
        return None if pipe is not None else _text(entry)

    def decode_episode(self, entry_id: Any, fields: dict, obs_only: bool = False) -> dict[str, np.ndarray]:
        cfg = self.config()
        f = {_text(k): v for k, v in fields.items()}
        try:
            n = int(_text(f["len"]))
        except (KeyError, ValueError):
            raise CodecError(f"replay entry {_text(entry_id)} has no valid 'len'") from None
        sizes = {"obs": cfg.obs_dim, "next_obs": cfg.obs_dim, "act": cfg.act_dim, "rew": 1, "done": 1}
        out = {}
        for name in ("obs",) if obs_only else EPISODE_FIELDS:
            arr = codec.decode_array(f.get(name), size=n * sizes[name], what=f"replay {_text(entry_id)} {name}")
            out[name] = arr.reshape(n, sizes[name]) if sizes[name] > 1 or name in ("obs", "next_obs", "act") else arr
        return out

    def read_stream(self, name: str, after: str = "0-0", count: int = 100, block_ms: int | None = None,
                    client: redis.Redis | None = None) -> list[tuple[str, dict]]:
        """Up to `count` entries of the `replay` or `results` stream after `after` (raw fields; decode
        them with decode_episode or decode_result); blocks up to block_ms when given and nothing is new."""
        if name not in (REPLAY, RESULTS, OBS):
            raise ValueError(f"read_stream reads replay, results or obs, not {name!r}")
        c = client or self.r
        if block_ms is None:
            rows = c.xrange(self.key(name), min=f"({after}" if after != "0-0" else "-", count=count)
            return [(_text(i), f) for i, f in rows]
        resp = c.xread({self.key(name): after}, count=count, block=block_ms)
        return [(_text(i), f) for _, entries in resp for i, f in entries] if resp else []

    # -- results --------------------------------------------------------------------------------
    def append_result(self, fields: dict[str, Any], extra_interactions: int = 0) -> str:
        pipe = self.r.pipeline()
        pipe.xadd(self.key("results"), {k: _fmt(v) for k, v in fields.items()},
                  maxlen=self.config().history_max)
        if extra_interactions:
            pipe.hincrby(self.key("state"), "interactions", extra_interactions)
        return _text(pipe.execute()[0])

    # -- individuals ------------------------------------------------------------------------------
    def individual_key(self, job: str) -> str:
        """The key an RL job stores its trained individual under."""
        return self.key(f"ind:{job}")

    def put_individual(self, job: str, params: np.ndarray, ttl: int, copy_of: str | None = None) -> str:
        """ind:{job}, its key returned: a copy made inside Redis (no upload) of the individual named
        `copy_of` (`policy_name(v)`: the critic daemon's actor) where Redis holds it, else `params`."""
        key = self.individual_key(job)
        if copy_of is not None:
            pipe = self.r.pipeline(transaction=True)
            pipe.copy(self.individual_key(copy_of), key, replace=True)
            pipe.expire(key, max(1, int(ttl)))
            if pipe.execute()[0]:
                return key
        self.r.set(key, codec.encode_array(params), ex=max(1, int(ttl)))
        return key

    def put_policy(self, version: int, actor: np.ndarray, ttl: int, keep: int = POLICIES_KEPT, pipe=None) -> None:
        """The critic daemon's actor of `version` as the individual `policy_name(version)`, and the one
        `keep` versions older deleted: a job reads its policy at its start and copies it at its end,
        seconds later (one whose version is gone by then uploads its own). `ttl` bounds what a daemon
        that stops leaves behind."""
        p = pipe or self.r
        p.set(self.individual_key(policy_name(version)), codec.encode_array(actor), ex=max(1, int(ttl)))
        if version > keep:
            p.delete(self.individual_key(policy_name(version - keep)))

    def get_individual(self, key: str) -> np.ndarray:
        """The individual an RL job stored: `key` as its result names it, or the job's id (no ':')."""
        if ":" not in key:
            key = self.key(f"ind:{key}")
        if not key.startswith(self.prefix + "ind:"):
            raise CodecError(f"individual key {key!r} is not an ind: key of run {self.run_id}")
        return codec.decode_array(self.r.get(key), size=self.config().actor_dim, what=key)

    # -- critic -----------------------------------------------------------------------------------
    def publish_critic(self, version: int, weights: dict[str, np.ndarray] | None, pipe=None) -> None:
        """The critic's version and weights (without weights, a run with a fan-out instance, which holds
        them: the primary names the version only)."""
        fields = {"version": version, "tag": run_token(self.config())}
        if weights is not None:
            fields["weights"] = codec.pack(weights)
        (pipe or self.r).hset(self.key("critic"), mapping=fields)

    def critic_version(self, client: redis.Redis | None = None) -> int:
        value = (client or self.r).hget(self.key("critic"), "version")
        return int(_text(value)) if value is not None else 0

    def read_critic(self, client: redis.Redis | None = None) -> tuple[int, dict[str, np.ndarray]] | None:
        version, blob = (client or self.r).hmget(self.key("critic"), ["version", "weights"])
        if version is None or blob is None:
            return None
        weights = codec.unpack(blob, what="critic weights")
        for k, v in weights.items():
            codec.check_array(v, what=f"critic weight {k}")
        return int(_text(version)), weights

    # -- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, part: str, payload: dict[str, Any], pipe=None) -> None:
        """Plain-data state of `part` (CHECKPOINTS): the optimizer's (without μ/var, which live in
        dist:{version}), the critic daemon's, or the TD3 baseline's networks, optimizers and counters
        (its replay is the `replay` stream)."""
        (pipe or self.r).set(self.key(CHECKPOINTS[part][0]), codec.pack(payload))

    def load_checkpoint(self, part: str) -> dict[str, Any] | None:
        """What save_checkpoint(part) stored, None before the first; CodecError if malformed."""
        name, what = CHECKPOINTS[part]
        blob = self.r.get(self.key(name))
        return None if blob is None else codec.unpack(blob, what=what)

    # -- what the scheduler keeps beside the optimizer ------------------------------------------
    def dist_versions(self) -> list[int]:
        """Every dist:{version} still in Redis."""
        out = []
        for key in self.r.scan_iter(match=self.key("dist:*"), count=1000):
            tail = _text(key).rsplit(":", 1)[1]
            if tail.isdigit():
                out.append(int(tail))
        return out

    def drop_dists(self, versions: list[int], ttl: int = 0, pipe=None) -> None:
        """Delete superseded versions now (ttl 0), or give them `ttl` seconds (a job that just read one
        still finishes)."""
        if not versions:
            return
        if not ttl:
            (pipe or self.r).delete(*(self.key(dist_name(v)) for v in versions))
            return
        p = pipe if pipe is not None else self.r.pipeline(transaction=False)
        for v in versions:
            p.expire(self.key(dist_name(v)), ttl)
        if pipe is None:
            p.execute()

    def append_history(self, entry: dict[str, Any], pipe=None) -> None:
        (pipe or self.r).xadd(self.key("history"), {"d": codec.pack(entry)}, maxlen=self.config().history_max)

    def keep_best(self, best: dict[str, Any], pipe=None) -> None:
        """The best non-random individual so far (for `aesrl-queue export --which best`)."""
        fields = {k: v for k, v in best.items() if k != "params"}
        (pipe or self.r).hset(self.key("best"), mapping={"params": codec.encode_array(best["params"]),
                                                          **{k: _fmt(v) for k, v in fields.items()}})

    def read_best(self) -> dict[str, Any] | None:
        """The best individual the scheduler kept (`best` hash: params decoded, fitness, version,
        steps, job, kind), or None when there is none or it is unusable."""
        raw = self.r.hgetall(self.key("best"))
        if not raw or b"params" not in raw:
            return None
        try:
            params = codec.decode_array(raw[b"params"], size=self.config().actor_dim, what="best individual")
        except CodecError as exc:
            log.warning("best individual unusable: %s", exc)
            return None
        out: dict[str, Any] = {"params": params}
        for k, v in ((_text(k), _text(v)) for k, v in raw.items() if k != b"params"):
            try:
                out[k] = float(v) if k == "fitness" else int(v) if k in ("version", "steps") else v
            except ValueError:
                out[k] = v
        return out

    def inflight_count(self) -> int:
        return int(self.r.hlen(self.key("inflight")))

    def counters(self, names: tuple[str, ...]) -> dict[str, int]:
        """Integer state fields in one read (absent fields are 0)."""
        return {n: int(_text(v)) if v is not None else 0
                for n, v in zip(names, self.r.hmget(self.key("state"), list(names)), strict=True)}

    # -- history and runs -------------------------------------------------------------------------
    def history(self, count: int | None = None, after: str = "-",
                newest: bool = False) -> list[tuple[str, dict[str, Any]]]:
        """(id, entry) of the history from `after` on, oldest first; with `newest` the last `count`
        entries instead (still oldest first). Malformed entries are skipped."""
        if newest:
            rows = self.r.xrevrange(self.key("history"), count=count)[::-1]
        else:
            rows = self.r.xrange(self.key("history"), min=after, count=count)
        out = []
        for i, f in rows:
            try:
                out.append((_text(i), codec.unpack(f[b"d"], what="history entry")))
            except (CodecError, KeyError):
                continue
        return out

    def delete(self) -> int:
        """Remove every key of this run (and its entry in the runs index)."""
        keys = list(self.r.scan_iter(match=self.prefix + "*", count=1000))
        n = self.r.delete(*keys) if keys else 0
        self.r.zrem(RUNS_KEY, self.run_id)
        return n


def decode_dist(version: int, mu: bytes, var: bytes, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """μ and var of `dim` values each from the raw blobs of dist:{version} (as a job's start script
    returns them)."""
    return (codec.decode_array(mu, size=dim, what=f"dist:{version} mu"),
            codec.decode_array(var, size=dim, what=f"dist:{version} var"))


def _episode_args(transitions: dict[str, np.ndarray], job: str) -> tuple[int, list[Any]]:
    n = int(transitions["rew"].shape[0])
    fields: list[Any] = ["len", n, "job", job]
    for name in EPISODE_FIELDS:
        arr = np.ascontiguousarray(transitions[name], dtype="<f4")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"episode field {name} holds non-finite values; not stored")
        fields += [name, arr.tobytes()]
    return n, fields


def rq_job_key(job: str) -> str:
    """RQ's own hash of `job` (its fields are RQ's; read them only through RQ or the helpers here)."""
    return f"rq:job:{job}"


def rq_results_key(job: str) -> str:
    """RQ's stream of the results of `job`."""
    return f"rq:results:{job}"


def rq_job_status(pipe, job: str) -> None:
    """Queue a read of RQ's own status of `job` (its `rq:job:{id}` hash) on `pipe`."""
    pipe.hget(rq_job_key(job), "status")


def rq_failure_text(client: redis.Redis, job: str) -> str:
    """The exception text RQ stored for a failed job (its latest result), read without RQ's
    serializer: only the plain, compressed exc_string field is decoded."""
    try:
        entries = client.xrevrange(rq_results_key(job), count=1)
        raw = entries[0][1].get(b"exc_string") if entries else None
        return zlib.decompress(base64.b64decode(raw)).decode(errors="replace") if raw else "RQ marked it failed"
    except (redis.RedisError, ValueError, zlib.error, IndexError) as exc:
        return f"RQ marked it failed (its error is unreadable: {exc})"


def list_runs(client: redis.Redis) -> list[tuple[str, float]]:
    return [(_text(k), float(s)) for k, s in client.zrange(RUNS_KEY, 0, -1, withscores=True)]


def worker_beat(client: redis.Redis, name: str, fields: dict[str, Any]) -> None:
    """One heartbeat: replace the worker's hash with `fields`, give it WORKER_TTL, list its name."""
    _beat(client, WORKER_KEY.format(name=name), WORKERS_KEY, name, fields)


def host_beat(client: redis.Redis, name: str, fields: dict[str, Any]) -> None:
    """A host's replica says how it follows its source (`status` lists it), as a worker's heartbeat does."""
    _beat(client, HOST_KEY.format(name=name), HOSTS_KEY, name, fields)


def _beat(client: redis.Redis, key: str, members: str, name: str, fields: dict[str, Any]) -> None:
    pipe = client.pipeline()
    pipe.delete(key)
    pipe.hset(key, mapping=fields)
    pipe.expire(key, WORKER_TTL)
    pipe.sadd(members, name)
    pipe.execute()


def worker_gone(client: redis.Redis, name: str) -> None:
    """A worker that stops on its own removes its heartbeat at once instead of letting it expire."""
    client.delete(WORKER_KEY.format(name=name))
    client.srem(WORKERS_KEY, name)


def worker_ages(client: redis.Redis, names: list[str], key_format: str = WORKER_KEY) -> list[float | None]:
    """Seconds since each worker's (or with HOST_KEY, host replica's) last heartbeat, from its key's TTL
    (Redis's clock, not the host's); None where the key is gone or has no TTL."""
    if not names:
        return []
    pipe = client.pipeline(transaction=False)
    for n in names:
        pipe.pttl(key_format.format(name=n))
    return [max(0.0, WORKER_TTL - ttl / 1000.0) if isinstance(ttl, int) and ttl >= 0 else None
            for ttl in pipe.execute()]


def live_workers(client: redis.Redis) -> dict[str, dict[str, str]]:
    """Workers whose heartbeat key still exists, with their fields; prunes the dead from the set."""
    return _live(client, WORKERS_KEY, WORKER_KEY)


def live_hosts(client: redis.Redis) -> dict[str, dict[str, str]]:
    """The hosts whose replica reports, with its link and lag; prunes the dead from the set."""
    return _live(client, HOSTS_KEY, HOST_KEY)


def _live(client: redis.Redis, members: str, key_format: str) -> dict[str, dict[str, str]]:
    names = [_text(n) for n in client.smembers(members)]
    if not names:
        return {}
    pipe = client.pipeline(transaction=False)
    for n in names:
        pipe.hgetall(key_format.format(name=n))
    out, dead = {}, []
    for n, fields in zip(names, pipe.execute(), strict=True):
        if fields:
            out[n] = {_text(k): _text(v) for k, v in fields.items()}
        else:
            dead.append(n)
    if dead:
        client.srem(members, *dead)
    return out


def _fmt(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


class VirtualJobs:
    """The arguments of the jobs a virtual run dispatched (aesrl_queue/virtual.py), held in the commit's
    MULTI/EXEC beside their `inflight` entries, so that a resumed virtual run runs again those that
    had not reported. Apart from Store, which holds what every run has."""

    def __init__(self, store: Store) -> None:
        self.r, self.key = store.r, store.key("virtual_jobs")

    def hold(self, kwargs: list[dict[str, Any]], pipe=None) -> None:
        if kwargs:
            (pipe or self.r).hset(self.key, mapping={k["job"]: codec.pack(k) for k in kwargs})

    def all(self) -> dict[str, dict[str, Any]]:
        return {_text(k): codec.unpack(v, what=f"virtual job {_text(k)}") for k, v in self.r.hgetall(self.key).items()}

    def drop(self, jobs: list[str]) -> None:
        if jobs:
            self.r.hdel(self.key, *jobs)


class Fanout:
    """A run's keys on its fan-out instance (docs/decisions.md): the Redis beside the primary that the
    hosts' replicas follow instead of the primary, holding only what hosts read: dist:{v} as the
    primary holds it (tag included), `current` (the current version's number) and its announcements,
    the critic's weights, and `obs` (the replay's observations that RL jobs sample). Its writers write
    it outside the primary's transactions. Apart from Store, which holds what every run has."""

    def __init__(self, store: Store, client: redis.Redis) -> None:
        self.store, self.r = store, client
        self._bound_obs = client.register_script(_BOUND_OBS)

    def publish_dist(self, version: int, mu: np.ndarray, var: np.ndarray, tag: str) -> None:
        """dist:{version} with the tag of the incarnation that publishes it (incarnation_token), before
        the primary's commit that makes it current."""
        self.store.publish_dist(version, mu, var, pipe=self.r, tag=tag)

    def copy_dist(self, version: int) -> bool:
        """dist:{version} copied from the primary as it is there, bytes and tag (a restarted scheduler's
        current version); False when the primary does not hold it."""
        key = self.store.key(dist_name(version))
        raw = self.store.r.hgetall(key)
        if raw:
            self.r.hset(key, mapping=raw)
        return bool(raw)

    def make_current(self, version: int, dropped: list[int] = (), announce: bool = True) -> None:
        """After the primary's commit: drop the versions it dropped, name `version` current, and
        announce it (NoPermissionError, raised last, where the user may not publish)."""
        pipe = self.r.pipeline(transaction=False)
        if dropped:
            pipe.delete(*(self.store.key(dist_name(v)) for v in dropped))
        pipe.hset(self.store.key(CURRENT), "version", version)
        if announce:
            pipe.publish(self.store.key(ANNOUNCE), version)
        pipe.execute()

    def drop(self, versions: list[int]) -> None:
        if versions:
            self.r.delete(*(self.store.key(dist_name(v)) for v in versions))

    def sweep(self, keep: set[int]) -> int:
        """Delete the versions the primary does not hold (left by a commit that failed); their number."""
        gone = []
        for key in self.r.scan_iter(match=self.store.key("dist:*"), count=1000):
            tail = _text(key).rsplit(":", 1)[1]
            if tail.isdigit() and int(tail) not in keep:
                gone.append(int(tail))
        self.drop(gone)
        return len(gone)

    def publish_critic(self, version: int, weights: dict[str, np.ndarray]) -> None:
        self.store.publish_critic(version, weights, pipe=self.r)

    def critic_version(self) -> int:
        return self.store.critic_version(client=self.r)

    def append_obs(self, episodes: list[tuple[str, dict[str, np.ndarray]]]) -> None:
        """The observations of (entry name, transitions) episodes, each its own entry of `obs`, trimmed to
        the run's replay capacity as the replay is."""
        if not episodes:
            return
        keys = [self.store.key(OBS), self.store.key("obs:count"), self.store.key("obs:index")]
        pipe = self.r.pipeline(transaction=True)
        sizes = []
        for name, tr in episodes:
            obs = np.ascontiguousarray(tr["obs"], dtype="<f4")
            sizes.append(int(obs.shape[0]))
            pipe.xadd(keys[0], {"len": sizes[-1], "job": name, "obs": codec.array_view(obs.reshape(-1))})
        self._bound_obs(keys=keys, args=[self.store.config().replay_capacity, *sizes], client=pipe)
        pipe.execute()

    def delete(self) -> int:
        """Remove every key of the run from the fan-out instance."""
        keys = list(self.r.scan_iter(match=self.store.prefix + "*", count=1000))
        return self.r.delete(*keys) if keys else 0
