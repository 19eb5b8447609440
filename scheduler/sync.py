"""Names that cli/ imported from the synchronous loop, which is gone: cemrl and pcemrl now run on the one
loop of scheduler/loop.py with aesrl_queue/optimizers/cem.py. Kept until cli/ imports from there.
"""

from __future__ import annotations

from aesrl_queue.optimizers import SYNC_ALGOS, generation_seed, needs_critic_daemon, needs_workers
from aesrl_queue.optimizers.cem import build_cem
from scheduler.loop import make_scheduler as make_sync_scheduler

__all__ = ["SYNC_ALGOS", "build_cem", "generation_seed", "make_sync_scheduler", "needs_critic_daemon",
           "needs_workers"]
