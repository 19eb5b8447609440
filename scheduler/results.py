"""Reading results: the stream entries workers append, each decoded where it is told (`decode`), and
the individual each one stands for (`individual`)."""

from __future__ import annotations

import math

import numpy as np
import redis

from aesrl_queue import kernels, noise
from aesrl_queue.codec import CodecError
from aesrl_queue.store import POLICIES_KEPT, Result, Store, decode_result, policy_name
from scheduler.dists import DistCache


class ResultReader:
    """Reads the run's `results` stream on the blocking client (a read may wait up to `block_ms`)."""

    def __init__(self, store: Store, blocking_client: redis.Redis) -> None:
        self.store = store
        self.rb = blocking_client

    def read(self, after: str, block_ms: int | None, count: int = 200) -> list[tuple[str, dict]]:
        """(entry id, raw fields) of up to `count` entries after `after`, as XREAD gives them (no block
        when `block_ms` is None)."""
        return self.store.read_stream("results", after, count=count, block_ms=block_ms, client=self.rb)


def decode(entry_id: str, fields: dict) -> tuple[Result | None, str]:
    """(the result, "") of a stream entry, or (None, why) when it is malformed."""
    try:
        return decode_result(entry_id, fields), ""
    except CodecError as exc:
        return None, str(exc)


class PolicyCache:
    """The critic daemon's published actors (rl_steps_max 0) by version, each read once from the key the
    daemon keeps it as (`policy_name`), for the RL results that played it: the same bytes as
    each result's own copy, read once per version instead of once per result."""

    def __init__(self, store: Store, keep: int = POLICIES_KEPT) -> None:
        self.store, self.keep = store, keep
        self._cache: dict[int, np.ndarray] = {}

    def get(self, version: int) -> np.ndarray | None:
        """A copy of the actor of `version`; None when the daemon's key of it is gone."""
        z = self._cache.get(version)
        if z is None:
            try:
                z = self.store.get_individual(policy_name(version))
            except CodecError:
                return None
            self._cache[version] = z
            for old in sorted(self._cache)[:-self.keep]:
                del self._cache[old]
        return z.copy()


def individual(res: Result, eps: np.ndarray | None, dists: DistCache, store: Store,
               policies: PolicyCache | None = None) -> noise.Individual:
    """The evaluated parameters: rebuilt from (version, seed) for ES (with the mirror of an antithetic
    job, one with a finite mirror_fitness; `eps` is ε when computed ahead, else `rebuild` computes it),
    downloaded for RL (whose μ it leaves unread: the version may be gone by the time a long RL job
    reports); an RL job that played the daemon's actor of a version (`res.policy`) is that actor, from
    `policies` while the daemon keeps it. Raises CodecError when they cannot be had."""
    if res.kind == "rl":
        if not res.ind:
            raise CodecError(f"RL result of {res.job} names no individual key")
        z = policies.get(res.policy) if policies is not None and res.policy > 0 else None
        return noise.Individual(store.get_individual(res.ind) if z is None else z, None, None)
    mu, std = dists.get_std(res.version)
    return noise.rebuild(mu, res.seed, std=std, antithetic=math.isfinite(res.mirror_fitness), eps=eps,
                         perturb=kernels.perturbation)


def distance(res: Result, ind: noise.Individual, dists: DistCache) -> float:
    """dist_after of an RL result: ‖z − μ‖ for the version its job was drawn from (how far training, or
    the daemon's actor, is from it), NaN for ES or where that μ cannot be read. A started job keeps its
    version's dist:{v} in Redis until it is told, so the read rarely misses."""
    if res.kind != "rl":
        return math.nan
    try:
        mu, _ = dists.get(res.version)
    except CodecError:
        return math.nan
    return float(np.linalg.norm(ind.z.astype(np.float64) - mu))
