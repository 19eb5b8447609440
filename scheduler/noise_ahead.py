"""ε of dispatched ES jobs, computed on background threads while the jobs run. InFlight (scheduler/
inflight.py) submits a job's ε when it registers the job and takes it when the job settles."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from aesrl_queue import kernels, noise


class NoiseAhead:
    """Computes the ε of dispatched ES jobs on a background thread while the jobs run.

    An ES result names only (version, seed); rebuilding z = μ_v + σ_v·ε(seed) is dominated by ε
    (about 1 ms at 129k parameters), which depends on the seed alone. Starting it at dispatch
    takes it off the path from result to update. Bounded: at most `max_bytes` of ε held.
    """

    # Below this many parameters ε costs less than handing it to a thread (and the thread would
    # compete for the GIL with the loop): it is computed when the result arrives.
    MIN_DIM = 16384

    def __init__(self, dim: int, max_bytes: int = 256 << 20) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.dim = dim
        self.limit = max(0, max_bytes // max(1, 4 * dim)) if dim >= self.MIN_DIM else 0
        # ε is numpy's PCG64 words and the compiled Box-Muller, both outside the GIL: threads on the
        # cores the loop leaves spread it (~1 ms a job at 129k parameters; 1,000 results/s need ~1 core).
        threads = max(1, min(4, (os.cpu_count() or 1) - 1))
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="aesrl-noise") if self.limit else None
        self._futures: dict[str, Any] = {}

    def submit(self, job: str, seed: int) -> None:
        if self._pool is not None and len(self._futures) < self.limit:
            self._futures[job] = (seed, self._pool.submit(noise.job_noise, seed, self.dim,
                                                                   kernels.perturbation))

    def take(self, job: str, seed: int) -> np.ndarray | None:
        """ε of `job` if it was computed for this very seed, else None."""
        got = self._futures.pop(job, None)
        if got is None:
            return None
        ahead_seed, fut = got
        if ahead_seed != seed:
            fut.cancel()
            return None
        try:
            return fut.result()
        except Exception:  # a bad seed: the caller recomputes and gets the error there
            return None

    def wait(self, job: str) -> None:
        """Block until ε of `job` is computed (benchmarks use this to time the apply alone)."""
        got = self._futures.get(job)
        if got is not None:
            got[1].exception()

    def drop(self, jobs) -> None:
        for job in jobs:
            got = self._futures.pop(job, None)
            if got is not None:
                got[1].cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._futures.clear()
