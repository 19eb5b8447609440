"""An environment whose step raises, made as "tests.raising_env:AesrlRaise-v0" (the custom-env form):
every job that runs it fails inside the worker's job function."""

from __future__ import annotations

import gymnasium as gym

from aesrl_queue.envs import NullEnv

MESSAGE = "the simulator lost its state"


class RaisingEnv(NullEnv):
    def step(self, action):
        if self._t >= 2:
            raise RuntimeError(f"{MESSAGE} at step {self._t}")
        return super().step(action)


if "AesrlRaise-v0" not in gym.registry:
    gym.register(id="AesrlRaise-v0", entry_point=RaisingEnv)
