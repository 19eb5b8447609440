"""A parallel TD3 in virtual time, the third column of issue 47's measurement (bench/virtual.py measure
--algos ptd3): N environment workers feeding one learner at the learner's rate, as the paper's Table 1
puts TD3 beside AES-RL and P-CEM-RL.

No queue algorithm runs it: it is a bench, on the same pieces as the runtime (the learner and its actor
of `--algo td3 --learner X`, aesrl_queue.learners.Agent; the replay buffer; the cost model of the
virtual executor, aesrl_queue/cost_model.py), in one process and in virtual time:

- a free worker takes the actor as last published, plays one episode with it now (real compute),
  unless the learner trails the stored steps by more than critic_lag (after the random phase): then
  it waits until the learner has caught up, as aesrl's workers wait for its critic (critic_lag 0:
  never; the workers then run ahead of a slower learner),
  with Gaussian exploration noise (expl_noise), or uniform random actions while the episodes handed
  out hold fewer than initial_steps interactions; the episode ends at dispatch + the cost model's
  job_seconds(its steps) (times its duration_spread factor), and the worker is free again worker_gap_s
  later;
- an episode's transitions enter the replay when it ends (results_latency_s later), in completion
  order; the learner trains from when the replay first holds initial_steps, at learner_steps_per_s,
  one TD3 iteration (critic step, policy step every policy_delay) per step, and publishes its actor
  after the steps due at each episode end, visible publish_latency_s later;
- every td3_eval_every interactions the actor as published is evaluated (one deterministic episode,
  not counted as interactions) for the f(μ) curve.

The run folder holds metrics.jsonl (one "update" record per episode, in the fields bench/virtual.py's
score reads: t in virtual seconds, interactions, f_mu, lag = actor versions published while the
episode ran), policy.npz (the final actor, which `aesrl-queue evaluate` and the protocol's scoring
read) and summary.json. Same config, N and cost model: the same metrics.jsonl.
"""

from __future__ import annotations

import heapq
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np


def run(cfg, workers: int, cost, out_dir: str | Path) -> tuple[Path, dict[str, Any]]:
    """Run `cfg` (a resolved RunConfig of --algo td3: env, sizes, learner, budget in total_steps) with
    `workers` virtual workers under `cost` (a CostModel). Returns the run folder and its summary."""
    import gymnasium as gym
    import torch

    import aesrl_queue.envs  # noqa: F401  (registers the Aesrl* test environments)
    from aesrl_queue.codec import json_default
    from aesrl_queue.learners import Agent
    from aesrl_queue.nets import NetSpec
    from aesrl_queue.rollout import run_episodes
    from aesrl_queue.td3 import ReplayBuffer

    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    run_dir = Path(out_dir) / cfg.run_id
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    torch.set_num_threads(1)  # one thread, as a worker and the critic daemon on a CPU have
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed + 11)
    spec = NetSpec.from_config(cfg)
    agent = Agent(spec, cfg.learner, lr=cfg.actor_lr, gamma=cfg.gamma, tau=cfg.tau, policy_noise=cfg.policy_noise,
                  noise_clip=cfg.noise_clip)
    replay = ReplayBuffer(cfg.obs_dim, cfg.act_dim, cfg.replay_capacity)
    env = gym.make(cfg.env_id, **cfg.env_kwargs)
    env.action_space.seed(cfg.seed)
    actor = spec.make_numpy_actor()
    eval_actor = spec.make_numpy_actor()
    max_a, budget = cfg.max_action, cfg.total_steps

    # published actors: (visible from, version, params); a dispatch at t takes the last visible at t
    published = [(0.0, 0, agent.actor_params())]
    free = [(0.0, w) for w in range(workers)]  # (virtual time the worker is free, worker)
    heapq.heapify(free)
    done: list[tuple[float, int, dict[str, Any]]] = []  # (completion, episode number, what it played)
    handed, stored, episodes, updates = 0, 0, 0, 0
    learn_from: float | None = None  # virtual time the replay first held initial_steps
    next_eval, f_mu = cfg.td3_eval_every, math.nan
    t_wall = time.monotonic()
    metrics = open(run_dir / "metrics.jsonl", "w")  # noqa: SIM115 - written to the end of the run

    def actor_at(t: float) -> tuple[int, np.ndarray]:
        for visible, version, params in reversed(published):
            if visible <= t:
                return version, params
        return published[0][1], published[0][2]

    def play(t: float, number: int) -> dict[str, Any]:
        random = handed < cfg.initial_steps
        version, params = actor_at(t)
        actor.set_params(params)
        obs, _ = env.reset(seed=(cfg.seed * 1_000_003 + number) % 2**31)
        rows: dict[str, list] = {k: [] for k in ("obs", "act", "rew", "next_obs", "done")}
        ret = 0.0
        for step in range(cfg.max_episode_steps):
            if random:
                act = env.action_space.sample().astype(np.float32)
            else:
                act = actor.act(np.asarray(obs, np.float32)) + rng.normal(0.0, cfg.expl_noise * max_a, cfg.act_dim)
                act = np.clip(act, -max_a, max_a).astype(np.float32)
            next_obs, rew, terminated, truncated, _ = env.step(act)
            for k, v in (("obs", obs), ("act", act), ("rew", rew), ("next_obs", next_obs), ("done", float(terminated))):
                rows[k].append(v)
            ret += float(rew)
            obs = next_obs
            if terminated or truncated or step + 1 >= cfg.max_episode_steps:
                break
        return {"tr": {k: np.asarray(v, np.float32) for k, v in rows.items()}, "ret": ret, "version": version,
                "random": random, "dispatched": t}

    def learn(until: float) -> None:
        nonlocal updates
        if learn_from is None or len(replay) < cfg.batch_size:
            return
        due = int((until - learn_from) * cost.learner_steps_per_s)
        while updates < due:
            agent.train_step(replay.sample(cfg.batch_size, generator=gen))
            updates += 1

    def caught_up(t: float) -> float:
        """When the learner trails the stored steps by no more than critic_lag (t if it does at t)."""
        if not cfg.critic_lag or learn_from is None or stored - cfg.critic_lag <= 0:
            return t
        return max(t, learn_from + (stored - cfg.critic_lag) / cost.learner_steps_per_s)

    try:
        while stored < budget:
            # hand out episodes to every worker free before the next completion, up to the budget
            while free and handed < budget and (not done or free[0][0] <= done[0][0]):
                t, w = heapq.heappop(free)
                ready = caught_up(t)
                if ready > t:  # held for the learner: free again when it has caught up
                    heapq.heappush(free, (ready, w))
                    if not done:  # nothing else happens before: the learner trains up to then
                        learn(ready)
                        if updates != published[-1][1]:
                            published.append((ready, updates, agent.actor_params()))
                    continue
                ep = play(t, episodes + len(done))
                n = len(ep["tr"]["rew"])
                handed += n
                job = f"{cfg.run_id}-e{episodes + len(done)}"
                seconds = cost.job_seconds(n, 0) * cost.spread(cfg.seed, job)
                heapq.heappush(done, (t + seconds, episodes + len(done), {**ep, "worker": w, "duration": seconds}))
            if not done:
                break
            t_end, _, ep = heapq.heappop(done)
            heapq.heappush(free, (t_end + cost.worker_gap_s, ep["worker"]))
            t_in = t_end + cost.result_latency_s
            learn(t_in)
            tr = ep["tr"]
            replay.add_batch(tr["obs"], tr["act"], tr["rew"], tr["next_obs"], tr["done"])
            stored += len(tr["rew"])
            episodes += 1
            if learn_from is None and stored >= cfg.initial_steps:
                learn_from = t_in
            if updates and updates != published[-1][1]:  # the actor moved: publish it
                published.append((t_in + cost.publish_latency_s, updates, agent.actor_params()))
            if stored >= next_eval or stored >= budget:
                eval_actor.set_params(published[-1][2])
                f_mu = float(run_episodes(cfg.env_id, eval_actor, k=1, seed=(cfg.seed + episodes) % 2**31,
                                          store=False, env_kwargs=cfg.env_kwargs).returns[0])
                next_eval = (stored // cfg.td3_eval_every + 1) * cfg.td3_eval_every
            lag = sum(1 for visible, _, _ in published if ep["dispatched"] < visible <= t_in)
            metrics.write(json.dumps({
                "type": "update", "t": t_in, "elapsed": t_in, "steps": stored, "interactions": stored,
                "version": ep["version"], "kind": "td3", "f_z": ep["ret"],
                "f_mu": f_mu if math.isfinite(f_mu) else None, "len": len(tr["rew"]),
                "job": f"{cfg.run_id}-e{episodes - 1}", "worker": f"virtual-{ep['worker']}", "random": ep["random"],
                "duration": ep["duration"], "lag": lag, "updates": updates}, default=json_default) + "\n")
    finally:
        metrics.close()
    params = agent.actor_params()
    with open(run_dir / "policy.npz", "wb") as fh:
        np.savez(fh, config=json.dumps(cfg.to_dict(), default=json_default), mu=params,
                 var=np.zeros_like(params), version=updates, f_mu=f_mu, f_mu_version=updates)
    summary = {"run": cfg.run_id, "status": "finished" if stored >= budget else "stopped", "steps": stored,
               "interactions": stored, "episodes": episodes, "updates": updates, "f_mu": f_mu,
               "virtual": {"workers": workers, "virtual_s": t_in if episodes else 0.0, "cost_model": cost.to_dict()},
               "wall_s": round(time.monotonic() - t_wall, 1)}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=json_default))
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), default=json_default, indent=1))
    return run_dir, summary
