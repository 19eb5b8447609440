"""The TD3 baseline in one process (no workers, no critic daemon): one gradient update per env step
after the random start steps, with the networks and update step of aesrl_queue.td3.

It writes the run's keys like the other loops — episodes to `replay` (which counts `steps`),
`state`, and one `history` entry per episode with f(μ) = the deterministic actor's return — so
`aesrl-queue status`, `runs` and the run folder work unchanged. `scheduler start --run` resumes it.
"""

from __future__ import annotations

import logging
import math
import threading
import time

import gymnasium as gym
import numpy as np
import redis
import torch

import aesrl_queue.envs  # noqa: F401  (registers the Aesrl* test environments)
from aesrl_queue.config import RunConfig
from aesrl_queue.learners import Agent
from aesrl_queue.nets import NetSpec, get_flat
from aesrl_queue.rollout import run_episodes
from aesrl_queue.store import Store
from aesrl_queue.td3 import ReplayBuffer, pick_device

log = logging.getLogger(__name__)


class TD3Baseline:
    """One TD3 run: `run()` returns "finished", "stopped" or "failed". Resumable like the critic daemon:
    its networks, optimizers and counters are checkpointed to `td3:ckpt` (every `checkpoint_every`
    seconds at an episode's end, and when it stops); its replay is the run's `replay` stream."""

    def __init__(self, client: redis.Redis, cfg: RunConfig, stop_event: threading.Event | None = None,
                 device: str | None = "auto", checkpoint_every: float = 10.0) -> None:
        self.r = client
        self.cfg = cfg
        self.store = Store(client, cfg.run_id)
        self.stop_event = stop_event or threading.Event()
        self.device = pick_device(device)
        self.checkpoint_every = checkpoint_every
        self._last_ckpt = time.monotonic()

    def setup(self) -> None:
        """Create the run's keys, or load a stopped run: checkpointed networks, replay from Redis.

        Episodes stored after the last checkpoint stay stored and counted (the networks lose only
        the updates made since), so the budget is never spent twice."""
        cfg, store = self.cfg, self.store
        created = store.write_config(cfg)
        if not created:
            self.cfg = cfg = store.config()
        torch.manual_seed(cfg.seed)
        self.spec = NetSpec.from_config(cfg)
        # the learner's own policy delay: TD3's every second critic step, CrossQ's every third
        # On CUDA each iteration is replayed from a captured graph (Agent.graph_step): a CrossQ step is
        # hundreds of small kernels, whose launches from Python set the pace (bench/learners.py micro)
        self.graphed = self.device.type == "cuda"
        self.agent = Agent(self.spec, cfg.learner, lr=cfg.actor_lr, gamma=cfg.gamma, tau=cfg.tau,
                           policy_noise=cfg.policy_noise, noise_clip=cfg.noise_clip, device=self.device,
                           capturable=self.graphed, actor_average=cfg.actor_average)
        self.replay = ReplayBuffer(cfg.obs_dim, cfg.act_dim, cfg.replay_capacity, device=self.device)
        state = store.state()
        self.total, self.episodes, self.version = state["steps"], state["results_applied"], state["version"]
        self.interactions = state["interactions"]
        self.updates = 0
        self.train_stats: dict[str, float] = {}
        self.f_mu = state.get("f_mu", math.nan) if self.version > 0 else math.nan
        self.best = state.get("best_fitness", -math.inf)
        self.next_eval = cfg.initial_steps
        if created or (self.total == 0 and store.dist_blobs(0) is None):
            mu = get_flat(self.agent.actor)
            pipe = self.r.pipeline()
            # dist:0 holds the initial actor so the run folder and `status` find a "μ"; var is unused.
            store.publish_dist(0, mu, np.full_like(mu, cfg.var_init), pipe=pipe)
            store.set_state(pipe=pipe, version=0, f_mu=math.nan, f_mu_version=-1, n_rl=1, n_es=1,
                            best_fitness=-math.inf, started_at=time.time(), status="running", td3_updates=0,
                            updated_at=time.time())
            pipe.execute()
            return
        ckpt = store.load_checkpoint("td3")
        if ckpt is not None:
            self.agent.load_state(ckpt)
            self.updates = int(ckpt["updates"])
        for entry_id, fields in self._replay_entries():
            ep = store.decode_episode(entry_id, fields)
            self.replay.add_batch(ep["obs"], ep["act"], ep["rew"], ep["next_obs"], ep["done"])
        # The next episode's end evaluates the actor again (the last evaluation may predate the checkpoint).
        self.next_eval = max(cfg.initial_steps, self.total)
        store.set_state(status="running", updated_at=time.time())
        log.info("run %s: td3 resumed at %d env steps, %d episodes, %d updates (%s), %d transitions reloaded",
                 cfg.run_id, self.total, self.episodes, self.updates,
                 "from its checkpoint" if ckpt else "no checkpoint yet: fresh networks", len(self.replay))

    def _replay_entries(self):
        after = "0-0"
        while True:
            rows = self.store.read_stream("replay", after, count=500)
            if not rows:
                return
            yield from rows
            after = rows[-1][0]

    def checkpoint(self, pipe=None) -> None:
        self.store.save_checkpoint("td3", {
            **self.agent.state(), "updates": self.updates, "total": self.total, "episodes": self.episodes,
            "t": time.time()}, pipe=pipe)
        self._last_ckpt = time.monotonic()

    def run(self) -> str:
        self.setup()
        cfg, store, agent, replay = self.cfg, self.store, self.agent, self.replay
        if store.status() == "finished" or self.total >= cfg.total_steps:
            store.set_state(status="finished", updated_at=time.time())
            return "finished"
        env = gym.make(cfg.env_id, **cfg.env_kwargs)
        actor_np = self.spec.make_numpy_actor()
        # A resumed run continues on fresh random streams (seeded by the episodes done so far).
        rng = np.random.default_rng([cfg.seed, self.episodes])
        gen = torch.Generator().manual_seed(cfg.seed + 11 + self.episodes)
        env.action_space.seed(cfg.seed + self.episodes)
        obs, _ = env.reset(seed=cfg.seed + self.episodes)
        ep = {k: [] for k in ("obs", "act", "rew", "next_obs", "done")}
        ep_ret, t0 = 0.0, time.time()
        status = "finished"
        while self.total < cfg.total_steps:
            if self.stop_event.is_set():
                status = "stopped"
                break
            if self.total < cfg.initial_steps:
                act = env.action_space.sample().astype(np.float32)
            else:
                act = agent.explore(obs, rng, cfg.expl_noise)
            next_obs, rew, terminated, truncated, _ = env.step(act)
            ep_len = len(ep["rew"]) + 1
            done = float(terminated)  # a time limit is not a terminal state
            for k, v in (("obs", obs), ("act", act), ("rew", rew), ("next_obs", next_obs), ("done", done)):
                ep[k].append(v)
            replay.add_batch(np.asarray(obs, np.float32)[None], act[None], np.array([rew], np.float32),
                             np.asarray(next_obs, np.float32)[None], np.array([done], np.float32))
            self.total += 1
            ep_ret += float(rew)
            obs = next_obs
            if self.total > cfg.initial_steps and len(replay) >= cfg.batch_size:
                if self.graphed:
                    agent.graph_step(replay, cfg.batch_size)
                else:
                    self.train_stats = agent.train_step(replay.sample(cfg.batch_size, generator=gen))
                self.updates += 1
            if terminated or truncated or ep_len >= cfg.max_episode_steps:
                self.episodes += 1
                transitions = {k: np.asarray(v, dtype=np.float32) for k, v in ep.items()}
                self.best = max(self.best, ep_ret)
                evaluated = False
                if self.total >= self.next_eval or self.total >= cfg.total_steps:
                    # f(μ) of TD3: the deterministic actor, like the μ evaluations of the ES loops.
                    actor_np.set_params(agent.actor_params())
                    ev = run_episodes(cfg.env_id, actor_np, k=cfg.mean_eval_episodes,
                                      seed=(cfg.seed + self.episodes) % 2**31, store=False, env_kwargs=cfg.env_kwargs)
                    self.f_mu = float(np.mean(ev.returns))
                    store.incr("interactions", int(sum(ev.lengths)))
                    self.interactions += int(sum(ev.lengths))
                    # the next multiple of td3_eval_every: evaluations (and the actor that `run
                    # --snapshot-steps` writes) fall at the first episode end past each multiple
                    self.next_eval = (self.total // cfg.td3_eval_every + 1) * cfg.td3_eval_every
                    self.version += 1
                    evaluated = True
                self._record(transitions, ep_ret, ep_len, evaluated, t0)
                obs, _ = env.reset()
                ep = {k: [] for k in ep}
                ep_ret = 0.0
        mu = agent.actor_params()
        pipe = self.r.pipeline()
        store.publish_dist(self.version, mu, np.full_like(mu, cfg.var_init), pipe=pipe)
        fields = {"version": self.version, "status": status, "td3_updates": self.updates, "updated_at": time.time()}
        if status == "finished":
            fields["finished_at"] = time.time()
        store.set_state(pipe=pipe, **fields)
        self.checkpoint(pipe=pipe)
        pipe.execute()
        log.info("run %s: td3 %s after %d env steps, %d updates, f(μ) %.1f", cfg.run_id, status, self.total,
                 self.updates, self.f_mu)
        return status

    def _learner_stats(self) -> dict[str, float]:
        """The learner's state at this episode's end, for metrics.jsonl: the last critic step's loss and
        mean Q1 (not read back on the CUDA-graph path) and a stochastic learner's temperature α."""
        out = {k: float(v) for k, v in (("critic_loss", self.train_stats.get("loss")),
                                          ("q1_mean", self.train_stats.get("q1_mean"))) if v is not None}
        log_alpha = getattr(self.agent.learner, "log_alpha", None)
        if log_alpha is not None:
            out["alpha"] = float(log_alpha.detach().exp())
        return out

    def _record(self, transitions: dict[str, np.ndarray], ret: float, length: int, evaluated: bool,
                t0: float) -> None:
        """Store one training episode with its history entry (the same fields as the ES loops' entries)
        and the counters, in one transaction; a checkpoint rides along every `checkpoint_every` s."""
        cfg, store = self.cfg, self.store
        episode, version = self.episodes, self.version
        self.interactions += length
        job = f"{cfg.run_id}-e{episode}"
        entry = {"job": job, "kind": "td3", "steps": self.total, "interactions": self.interactions, "version": version, "p": 0.0,
                 "f_z": ret, "f_mu": self.f_mu, "len": length, "t": time.time(), "worker": "td3", "sigma_mean": 0.0,
                 "sigma_min": 0.0, "sigma_max": 0.0, "moved": 0.0, "duration": 0.0,
                 "random": self.total <= cfg.initial_steps, "rl_steps": 0, "updates": self.updates,
                 "evaluated": evaluated, **self._learner_stats()}
        pipe = self.r.pipeline()
        store.append_episode(transitions, job, pipe=pipe)
        if evaluated:
            # The evaluated actor is this run's "μ" version, so the run folder's policy.npz finds it.
            mu = self.agent.actor_params()
            store.publish_dist(version, mu, np.full_like(mu, cfg.var_init), pipe=pipe)
            store.drop_dists([version - 1], ttl=60, pipe=pipe)
        fields = {"td3_updates": self.updates, "best_fitness": self.best, "updated_at": time.time(),
                  "version": version, "results_applied": episode}
        if math.isfinite(self.f_mu):
            fields.update(f_mu=self.f_mu, f_mu_version=version)
        store.set_state(pipe=pipe, **fields)
        store.append_history(entry, pipe=pipe)
        if time.monotonic() - self._last_ckpt > self.checkpoint_every:
            self.checkpoint(pipe=pipe)
        pipe.execute()
