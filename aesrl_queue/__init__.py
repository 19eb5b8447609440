"""aesrl-queue: AES-RL (asynchronous ES + TD3) on a Redis/RQ task queue.

This package is the pure library: update rules, distributions, networks, rollouts, config, codec, store.
"""

__version__ = "0.1.0"
