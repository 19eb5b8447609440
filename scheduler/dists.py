"""μ and σ of recent versions, in memory: an ES result names only (version, seed), and its individual
is rebuilt from them (scheduler/results.py)."""

from __future__ import annotations

import numpy as np

from aesrl_queue import noise
from aesrl_queue.store import Store


class DistCache:
    """μ/var of recent versions, in memory, for rebuilding ES individuals from (version, seed)."""

    def __init__(self, store: Store, keep: int = 16) -> None:
        self.store = store
        self.keep = keep
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._std: dict[int, np.ndarray] = {}

    def put(self, version: int, mu: np.ndarray, var: np.ndarray, std: np.ndarray | None = None) -> None:
        """Cache a version; `std`, when given, must be sqrt(var) in float32 (saves computing it)."""
        self._cache[version] = (mu, var)
        if std is None:
            self._std.pop(version, None)
        else:
            self._std[version] = std

    def get(self, version: int) -> tuple[np.ndarray, np.ndarray]:
        got = self._cache.get(version)
        if got is None:
            got = self.store.read_dist(version)
            self._cache[version] = got
        return got

    def get_std(self, version: int) -> tuple[np.ndarray, np.ndarray]:
        """(μ, sqrt(var)) as float32, the square root computed once per version."""
        mu, var = self.get(version)
        std = self._std.get(version)
        if std is None:
            mu32, std = noise.scale(mu, var)
            self._std[version] = std
            return mu32, std
        return np.asarray(mu, dtype=np.float32), std

    def prune(self, current: int, referenced: set[int]) -> list[int]:
        """Drop versions nobody refers to (keeping the newest `keep`); return those dropped."""
        dropped = []
        for v in sorted(self._cache):
            if v == current or v in referenced or v > current - self.keep:
                continue
            del self._cache[v]
            self._std.pop(v, None)
            dropped.append(v)
        return dropped
