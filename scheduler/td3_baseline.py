"""The TD3 baseline in one process (no workers, no critic daemon): one gradient update per env step
after the random start steps, with the networks and update step of aesrl_queue.td3.

It writes the run's keys like the other loops — episodes to `replay` (which counts `steps`),
`state`, and one `history` entry per episode with f(μ) = the deterministic actor's return — so
`aesrl-queue status`, `runs` and the run folder work unchanged.
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
from aesrl_queue import codec
from aesrl_queue.config import RunConfig
from aesrl_queue.nets import NetSpec
from aesrl_queue.rollout import run_episodes
from aesrl_queue.store import Store
from aesrl_queue.td3 import ReplayBuffer, TD3Agent

log = logging.getLogger(__name__)

POLICY_FREQ = 2  # TD3's delayed actor/target updates (every second critic step)


class TD3Baseline:
    """One TD3 run: `run()` returns "finished", "stopped" or "failed"."""

    def __init__(self, client: redis.Redis, cfg: RunConfig, stop_event: threading.Event | None = None,
                 device: str = "cpu") -> None:
        self.r = client
        self.cfg = cfg
        self.store = Store(client, cfg.run_id)
        self.stop_event = stop_event or threading.Event()
        self.device = device

    def setup(self) -> bool:
        """Create the run's keys; False when the run already exists (a TD3 run cannot be resumed)."""
        cfg, store = self.cfg, self.store
        if not store.write_config(cfg):
            self.cfg = store.config()
            if store.state()["steps"] > 0 or store.status() in ("finished", "failed"):
                return False
        from aesrl_queue.nets import get_flat

        torch.manual_seed(cfg.seed)
        self.spec = NetSpec.from_config(self.cfg)
        self.agent = TD3Agent(self.spec, lr=self.cfg.actor_lr, gamma=self.cfg.gamma, tau=self.cfg.tau,
                              policy_noise=self.cfg.policy_noise, noise_clip=self.cfg.noise_clip,
                              policy_freq=POLICY_FREQ, device=self.device)
        mu = get_flat(self.agent.actor)
        pipe = self.r.pipeline()
        # dist:0 holds the initial actor so the run folder and `status` find a "μ"; var is unused.
        store.publish_dist(0, mu, np.full_like(mu, self.cfg.var_init), pipe=pipe)
        store.set_state(pipe=pipe, version=0, f_mu=math.nan, f_mu_version=-1, n_rl=1, n_es=1,
                        best_fitness=-math.inf, started_at=time.time(), status="running", td3_updates=0,
                        updated_at=time.time())
        pipe.execute()
        return True

    def run(self) -> str:
        if not self.setup():
            log.error("run %s exists and has stored steps: a td3 run keeps its networks and replay in the "
                      "process and cannot be resumed; start a new run", self.cfg.run_id)
            return "failed"
        cfg, store, agent = self.cfg, self.store, self.agent
        env = gym.make(cfg.env_id, **cfg.env_kwargs)
        actor_np = self.spec.make_numpy_actor()
        replay = ReplayBuffer(cfg.obs_dim, cfg.act_dim, cfg.replay_capacity, device=self.device)
        rng = np.random.default_rng(cfg.seed)
        gen = torch.Generator().manual_seed(cfg.seed + 11)
        env.action_space.seed(cfg.seed)
        max_a = cfg.max_action
        total, updates, episodes, version = 0, 0, 0, 0
        f_mu, next_eval, best = math.nan, cfg.td3_start_steps, -math.inf
        obs, _ = env.reset(seed=cfg.seed)
        ep = {k: [] for k in ("obs", "act", "rew", "next_obs", "done")}
        ep_ret, t0 = 0.0, time.time()
        status = "finished"
        while total < cfg.total_steps:
            if self.stop_event.is_set():
                status = "stopped"
                break
            if total < cfg.td3_start_steps:
                act = env.action_space.sample().astype(np.float32)
            else:
                with torch.no_grad():
                    a = agent.actor(torch.as_tensor(obs, dtype=torch.float32, device=self.device)[None])[0]
                act = a.cpu().numpy() + rng.normal(0.0, cfg.expl_noise * max_a, size=cfg.act_dim)
                act = np.clip(act, -max_a, max_a).astype(np.float32)
            next_obs, rew, terminated, truncated, _ = env.step(act)
            ep_len = len(ep["rew"]) + 1
            done = float(terminated)  # a time limit is not a terminal state
            for k, v in (("obs", obs), ("act", act), ("rew", rew), ("next_obs", next_obs), ("done", done)):
                ep[k].append(v)
            replay.add_batch(np.asarray(obs, np.float32)[None], act[None], np.array([rew], np.float32),
                             np.asarray(next_obs, np.float32)[None], np.array([done], np.float32))
            total += 1
            ep_ret += float(rew)
            obs = next_obs
            if total > cfg.td3_start_steps and len(replay) >= cfg.batch_size:
                agent.train_step(replay.sample(cfg.batch_size, generator=gen))
                updates += 1
            if terminated or truncated or ep_len >= cfg.max_episode_steps:
                episodes += 1
                transitions = {k: np.asarray(v, dtype=np.float32) for k, v in ep.items()}
                store.append_episode(transitions, f"{cfg.run_id}-e{episodes}")
                best = max(best, ep_ret)
                evaluated = False
                if total >= next_eval or total >= cfg.total_steps:
                    # f(μ) of TD3: the deterministic actor, like the μ evaluations of the ES loops.
                    actor_np.set_params(agent.actor_params())
                    ev = run_episodes(cfg.env_id, actor_np, k=cfg.mean_eval_episodes, seed=(cfg.seed + episodes) % 2**31,
                                      store=False, env_kwargs=cfg.env_kwargs)
                    f_mu = float(np.mean(ev.returns))
                    store.incr("interactions", int(sum(ev.lengths)))
                    next_eval = total + cfg.td3_eval_every
                    version += 1
                    evaluated = True
                self._record(episodes, ep_ret, ep_len, f_mu, version, updates, best, evaluated, t0)
                obs, _ = env.reset()
                ep = {k: [] for k in ep}
                ep_ret = 0.0
        mu = agent.actor_params()
        pipe = self.r.pipeline()
        store.publish_dist(version, mu, np.full_like(mu, cfg.var_init), pipe=pipe)
        fields = {"version": version, "status": status, "td3_updates": updates, "updated_at": time.time()}
        if status == "finished":
            fields["finished_at"] = time.time()
        store.set_state(pipe=pipe, **fields)
        pipe.execute()
        log.info("run %s: td3 %s after %d env steps, %d updates, f(μ) %.1f", cfg.run_id, status, total, updates,
                 f_mu)
        return status

    def _record(self, episode: int, ret: float, length: int, f_mu: float, version: int, updates: int, best: float,
                evaluated: bool, t0: float) -> None:
        """One history entry per training episode, with the same fields as the ES loops' entries."""
        cfg, store = self.cfg, self.store
        steps, inter = self.r.hmget(store.key("state"), ["steps", "interactions"])
        entry = {"job": f"{cfg.run_id}-e{episode}", "kind": "td3", "steps": int(steps or 0),
                 "interactions": int(inter or 0), "version": version, "p": 0.0, "f_z": ret, "f_mu": f_mu,
                 "len": length, "t": time.time(), "worker": "td3", "sigma_mean": 0.0, "sigma_min": 0.0,
                 "sigma_max": 0.0, "moved": 0.0, "duration": 0.0, "random": int(steps or 0) <= cfg.td3_start_steps,
                 "rl_steps": 0, "updates": updates, "evaluated": evaluated}
        pipe = self.r.pipeline()
        if evaluated:
            # The evaluated actor is this run's "μ" version, so the run folder's policy.npz finds it.
            mu = self.agent.actor_params()
            store.publish_dist(version, mu, np.full_like(mu, cfg.var_init), pipe=pipe)
            pipe.expire(store.key(f"dist:{version - 1}"), 60)
        fields = {"td3_updates": updates, "best_fitness": best, "updated_at": time.time(),
                  "version": version, "results_applied": episode}
        if math.isfinite(f_mu):
            fields.update(f_mu=f_mu, f_mu_version=version)
        store.set_state(pipe=pipe, **fields)
        pipe.xadd(store.key("history"), {"d": codec.pack(entry)}, maxlen=cfg.history_max)
        pipe.execute()
