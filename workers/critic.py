"""The critic daemon: mirrors the replay stream onto its device, trains the run's learner (TD3's twin
critics, or CrossQ's) with the current μ as target policy, and republishes the weights after every chunk.
With rl_steps_max 0 it trains an actor of its own beside the critic, as the `td3` baseline does (the
critic's target policy is then that actor), and publishes it with the critic: RL jobs take it as is.

Restartable: it reloads `critic:ckpt` (the learner's networks and Adam state) and rebuilds its mirror.
"""

from __future__ import annotations

import logging
import threading
import time
from operator import itemgetter

import numpy as np
import redis
import torch

from aesrl_queue.codec import CodecError
from aesrl_queue.config import critic_due
from aesrl_queue.connection import FANOUT_ENV, wait_until_reachable
from aesrl_queue.learners import Agent, capture_step, make_learner
from aesrl_queue.nets import NetSpec, set_flat
from aesrl_queue.store import FANOUT_FIELD, Fanout, Store, individual_ttl
from aesrl_queue.td3 import ReplayBuffer, pick_device

log = logging.getLogger(__name__)

DONE_STATUSES = ("finished", "failed")


class FanoutMissing(ValueError):
    """The run has a fan-out instance and this daemon was not given its URL."""


class CriticDaemon:
    """Trains one run's critic until the run finishes or `stop_event` is set."""

    def __init__(self, client: redis.Redis, blocking_client: redis.Redis, run_id: str, device: str | None = None,
                 stop_event: threading.Event | None = None, checkpoint_every: float = 10.0,
                 cuda_graph: bool = True, fanout: redis.Redis | None = None) -> None:
        self.r = client
        self.rb = blocking_client
        self.store = Store(client, run_id)
        self.cfg = self.store.config()
        # With a fan-out instance (docs/decisions.md) the weights go there, and the primary names the version.
        named = self.store.state_field(FANOUT_FIELD, cast=str, default=None)
        if named and fanout is None:
            raise FanoutMissing(f"run {run_id} keeps what hosts read on its fan-out instance {named}: give the "
                             f"critic daemon its URL (--fanout-url, or ${FANOUT_ENV})")
        self.fan = Fanout(self.store, fanout) if fanout is not None else None
        self.device = pick_device(device)
        self.stop_event = stop_event or threading.Event()
        self.checkpoint_every = checkpoint_every
        cfg = self.cfg
        self.spec = NetSpec.from_config(cfg)
        # On CUDA one critic step is ~100 small kernels, and launching them from Python, not the GPU, sets
        # the pace (~300 steps/s on an H200 for 400-300). Captured once as a CUDA graph and replayed, the
        # same step runs ~7× as fast (docs/performance.md, bench/gpu.py). Adam keeps its step count on the
        # device for that (capturable).
        self.cuda_graph = cuda_graph and self.device.type == "cuda"
        # rl_steps_max 0: the daemon's own actor, trained as the `td3` baseline trains its one
        self.agent = None if cfg.rl_steps_max else Agent(
            self.spec, cfg.learner, lr=cfg.actor_lr, gamma=cfg.gamma, tau=cfg.tau, policy_noise=cfg.policy_noise,
            noise_clip=cfg.noise_clip, device=self.device, capturable=self.cuda_graph)
        self.learner = (make_learner(cfg, self.spec, self.device, capturable=self.cuda_graph)
                        if self.agent is None else self.agent.learner)
        self.graph: torch.cuda.CUDAGraph | None = None
        if self.cuda_graph:  # what the graph reads and writes in place: the replay's size, [loss, Q1] sums
            self._size = torch.zeros((), device=self.device)
            self._sums = torch.zeros(2, device=self.device)
        self.target_actor = self.spec.make_actor(self.device)
        self.target_version = -1  # the version of μ used as TD3's target policy
        self.buffer = ReplayBuffer(cfg.obs_dim, cfg.act_dim, cfg.replay_capacity, device=self.device)
        # critic_shift: the mirror holds the rewards the update rule judges by (fitness_shift), each
        # step's less shift_per_step, so the critic learns them; the replay stream keeps the environment's
        self.reward_shift = cfg.shift_per_step if cfg.critic_shift else 0.0
        self.mirror_last = "0-0"
        self.version = 0
        self.trained = 0  # critic gradient steps so far
        self.gen = torch.Generator(device="cpu").manual_seed(cfg.seed + 7)
        self._last_ckpt = 0.0
        self.steps_per_s = 0.0

    # -- restart -------------------------------------------------------------------------------
    def restore(self) -> bool:
        try:
            ckpt = self.store.load_checkpoint("critic")
        except CodecError as exc:
            log.warning("critic checkpoint unreadable (%s); starting a fresh critic", exc)
            return False
        # A number the fan-out instance already holds is never used again for other weights (one
        # published there by a daemon that died before the primary named it).
        published = max(self.store.critic_version(), self.fan.critic_version() if self.fan is not None else 0)
        if not ckpt:
            self.version = published
            return False
        (self.learner if self.agent is None else self.agent).load_state(ckpt)
        self.version = max(int(ckpt["version"]), published)
        self.trained = int(ckpt["trained"])
        log.info("critic of run %s restored: version %d, %d steps trained", self.cfg.run_id, self.version,
                 self.trained)
        return True

    def checkpoint(self) -> None:
        state = (self.learner if self.agent is None else self.agent).state()
        self.store.save_checkpoint("critic", {**state, "version": self.version,
                                              "trained": self.trained, "t": time.time()})
        self._last_ckpt = time.monotonic()

    # -- replay mirror ----------------------------------------------------------------------------
    def sync(self, block_ms: int | None = None) -> int:
        added = 0
        while True:
            rows = self.store.read_stream("replay", self.mirror_last, count=200, block_ms=block_ms,
                                          client=self.rb if block_ms else None)
            block_ms = None  # block at most once per call
            if not rows:
                return added
            for entry_id, fields in rows:
                self.mirror_last = entry_id
                try:
                    ep = self.store.decode_episode(entry_id, fields)
                except CodecError as exc:
                    log.warning("skipping malformed replay entry: %s", exc)
                    continue
                rew = ep["rew"] - self.reward_shift if self.reward_shift else ep["rew"]
                self.buffer.add_batch(ep["obs"], ep["act"], rew, ep["next_obs"], ep["done"])
                added += len(ep["rew"])

    def refresh_target_policy(self) -> None:
        """Use the current μ as TD3's target policy (the daemon's own actor is its own)."""
        if self.agent is not None:
            return
        version = self.store.current_version()
        if version == self.target_version:
            return
        try:
            mu, _ = self.store.read_dist(version)
        except CodecError as exc:
            log.warning("cannot read μ version %d for the target policy: %s", version, exc)
            return
        set_flat(self.target_actor, mu)
        self.target_version = version

    def target_name(self) -> str:
        """The policy whose Q the critic learns: "mu <version>", or "actor" (the daemon's own)."""
        return "actor" if self.agent is not None else f"mu {self.target_version}"

    # -- training -------------------------------------------------------------------------------
    def train_chunk(self, n: int) -> dict[str, float]:
        if self.agent is not None:
            return self._train_agent(n)
        if self.cuda_graph:
            try:
                return self._train_chunk_graph(n)
            except RuntimeError as exc:  # a torch or driver that cannot capture: train step by step
                log.warning("critic on %s: CUDA graph failed (%s); training without one", self.device, exc)
                self.cuda_graph, self.graph = False, None
        return self._eager(n, lambda batch: self.learner.critic_step(batch, self.target_actor).tolist())

    def _eager(self, n: int, step) -> dict[str, float]:
        """n steps without a graph, each `step(batch)` -> (loss, Q1 mean) on a batch sampled from the mirror."""
        losses = []
        t0 = time.perf_counter()
        for _ in range(n):
            loss, q1_mean = step(self.buffer.sample(self.cfg.batch_size, generator=self.gen))
            losses.append(loss)
        return self._chunk_done(n, t0, float(np.mean(losses)), q1_mean)

    def _train_agent(self, n: int) -> dict[str, float]:
        """n iterations of the daemon's own actor and critic (a policy step every policy_delay); on CUDA
        all but the last replayed from the Agent's captured graphs, the last eager for its loss and Q1."""
        if self.cuda_graph:
            t0 = time.perf_counter()
            for _ in range(n - 1):
                self.agent.graph_step(self.buffer, self.cfg.batch_size)
            out = self.agent.train_step(self.buffer.sample(self.cfg.batch_size, generator=self.gen))
            return self._chunk_done(n, t0, out["loss"], out["q1_mean"])
        return self._eager(n, lambda batch: itemgetter("loss", "q1_mean")(self.agent.train_step(batch)))

    def _graph_step(self) -> torch.Tensor:
        cfg = self.cfg
        stats = self.learner.critic_step(self.buffer.sample_in_graph(cfg.batch_size, self._size), self.target_actor)
        self._sums.add_(stats)
        return stats

    def _capture(self, warm: int) -> None:
        """Run `warm` eager steps (Adam's state must exist before the capture), then capture one step
        as self.graph (learners.capture_step). A capture runs nothing: only the warm-up steps train."""
        self.graph = capture_step(self._graph_step, self.device, self.learner.opt, warm)
        log.info("critic on %s: one step captured as a CUDA graph", self.device)

    def _train_chunk_graph(self, n: int) -> dict[str, float]:
        """n critic steps, each a replay of one captured step (sample, target, twin critics, Adam, soft
        update); the loss and Q1 are summed on the device and read once per chunk."""
        t0 = time.perf_counter()
        self._sums.zero_()
        self._size.fill_(float(len(self.buffer)))
        warm = 0
        if self.graph is None:
            warm = min(n, 3)
            self._capture(warm)
        for _ in range(n - warm):
            self.graph.replay()
        loss_sum, q1_sum = self._sums.tolist()  # the warm-up steps' too
        return self._chunk_done(n, t0, loss_sum / n, q1_sum / n)

    def _chunk_done(self, n: int, t0: float, loss: float, q1_mean: float) -> dict[str, float]:
        dt = time.perf_counter() - t0
        self.steps_per_s = n / dt if dt > 0 else 0.0
        self.trained += n
        return {"loss": loss, "q1_mean": q1_mean, "seconds": dt}

    def publish(self, stats: dict[str, float]) -> None:
        self.version += 1
        # rl_steps_max 0: RL jobs play the daemon's actor (as the learner alone plays it) and train
        # nothing, so only the policy is published; the critic stays in the daemon (and its checkpoint)
        weights = self.learner.weights() if self.agent is None else self.agent.policy_weights()
        actor = None if self.agent is None else weights["actor"]
        if self.fan is not None:
            # To the fan-out instance first: the primary names only versions whose weights are there.
            try:
                self.fan.publish_critic(self.version, weights)
            except (redis.RedisError, OSError) as exc:
                log.warning("critic version %d did not reach the fan-out instance (%s); the next one tries again",
                            self.version, exc)
                return
            weights = None
        pipe = self.r.pipeline()
        self.store.publish_critic(self.version, weights, pipe=pipe)
        if actor is not None:  # on the primary, for RL jobs to copy as their individuals
            self.store.put_policy(self.version, actor, ttl=individual_ttl(self.cfg), pipe=pipe)
        self.store.set_state(pipe=pipe, critic_version=self.version, critic_steps=self.trained,
                             critic_loss=stats["loss"], critic_updated_at=time.time(),
                             critic_steps_per_s=round(self.steps_per_s, 1), critic_device=str(self.device),
                             critic_target=self.target_name())
        pipe.execute()

    def run(self) -> str:
        cfg = self.cfg
        self.restore()
        self.sync()
        log.info("critic daemon for run %s on %s: %d transitions mirrored", cfg.run_id, self.device, len(self.buffer))
        while True:
            try:
                return self._loop()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                # Redis restarting: keep the weights and the mirror in memory and go on when it is back.
                if not wait_until_reachable(self.r, f"critic daemon of run {cfg.run_id}", exc, self.stop_event):
                    return "stopped"

    def next_chunk(self, steps_per_s: float) -> int:
        """The steps of the next chunk (0: none yet). Never ahead of the environment steps stored (one
        critic step per stored step); serial CEM-RL / P-CEM-RL train exactly the steps the scheduler
        asked for between generations (state `critic_request`, a total), then idle (docs/decisions.md).
        A published chunk is all the scheduler sees of the critic's progress, and one that takes longer
        than critic_wait reads as a stopped critic (the lag gate opens): at `steps_per_s`, the rate last
        measured, a chunk takes at most a quarter of critic_wait (a loaded CPU, a large critic)."""
        cfg = self.cfg
        if cfg.critic_on_request:
            limit, smallest = self.store.state_field("critic_request"), 1
        else:
            limit, smallest = critic_due(cfg, self.store.state_field("steps")), min(cfg.critic_chunk, 100)
        n = min(cfg.critic_chunk, max(0, limit - self.trained))
        if len(self.buffer) < cfg.batch_size or n < smallest:
            return 0
        return min(n, max(1, int(steps_per_s * cfg.critic_wait / 4))) if steps_per_s > 0 else n

    def publish_first_actor(self, status: str | None = None) -> bool:
        """The daemon's own actor: its untrained actor is published when the random phase ends, so that RL
        jobs can start before the first chunk is due (none is due while the stored steps are exactly
        initial_steps), and never before the scheduler's set-up (status "created" until then), which empties
        the run's keys on a fan-out instance: with no random phase it would delete this version there.
        `status` is the run's, when the caller has read it (read here otherwise, and only at version 0).
        Whether it published."""
        if self.agent is None or self.version != 0:
            return False
        if (status if status is not None else self.store.status()) == "created" or \
                self.store.state_field("steps") < self.cfg.initial_steps:
            return False
        self.sync()
        self.publish({"loss": 0.0, "q1_mean": 0.0, "seconds": 0.0})
        return True

    def _loop(self) -> str:
        cfg = self.cfg
        while not self.stop_event.is_set():
            status = self.store.status()
            if status in DONE_STATUSES:
                self.checkpoint()
                log.info("run %s is %s; critic daemon exits at version %d", cfg.run_id, status, self.version)
                return status
            if self.publish_first_actor(status):
                continue
            chunk = self.next_chunk(self.steps_per_s)
            if not chunk:
                self.sync(block_ms=200 if cfg.critic_on_request else 1000)
                continue
            self.sync()
            self.refresh_target_policy()
            stats = self.train_chunk(chunk)
            self.publish(stats)
            if time.monotonic() - self._last_ckpt > self.checkpoint_every:
                self.checkpoint()
            self.sync()
        self.checkpoint()
        return "stopped"
