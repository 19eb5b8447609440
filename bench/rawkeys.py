"""Raw reads of a run's keys for the overhead benchmark: sizes of what travels and what is kept.

The key names come from aesrl_queue/store.py (Store.key, dist_name and the stream names); only the
benchmark reads entries raw, so these reads live here rather than on Store.
"""

from __future__ import annotations

from aesrl_queue.store import HISTORY, REFS, REPLAY, RESULTS, Store, dist_name


def dist_sizes(store: Store, version: int) -> tuple[int, int]:
    """Bytes of the encoded μ and var of `version` as stored."""
    key = store.key(dist_name(version))
    return int(store.r.hstrlen(key, "mu")), int(store.r.hstrlen(key, "var"))


def last_entry(store: Store, stream: str) -> dict[bytes, bytes]:
    """The newest entry of the run's `history`, `results` or `replay` stream (raw fields)."""
    if stream not in (HISTORY, RESULTS, REPLAY):
        raise ValueError(f"no stream {stream!r}")
    return store.r.xrevrange(store.key(stream), count=1)[0][1]


def result_entry(store: Store, entry_id: str) -> dict[bytes, bytes]:
    """One results-stream entry by id (raw fields)."""
    return store.r.xrange(store.key(RESULTS), min=entry_id, max=entry_id)[0][1]


def set_ref(store: Store, job: str, version: int) -> None:
    """Record that `job` uses `version`, as the worker's start-job script does."""
    store.r.hset(store.key(REFS), job, version)
