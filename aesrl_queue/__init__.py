"""aesrl-queue: AES-RL (asynchronous ES + TD3) on a Redis/RQ task queue.

This package is the library: update rules, distributions, networks, rollouts, config, codec, store,
and the Python API (`train`, `load`, `Run`; docs/api.md), which starts a local run's processes.
"""

__version__ = "0.1.0"

__all__ = ["ConfigError", "Run", "RunError", "load", "train"]


def __getattr__(name: str):
    # Imported on first use: the workers and the scheduler import this package's modules and need
    # none of the API's (redis, the launcher, tqdm).
    if name in ("Run", "RunError", "load", "train"):
        from aesrl_queue import api

        return getattr(api, name)
    if name == "ConfigError":
        from aesrl_queue.config import ConfigError

        return ConfigError
    raise AttributeError(f"module 'aesrl_queue' has no attribute {name!r}")
