"""Stable-Baselines3 TD3 as the external reference of bench/learning.py, with our TD3's settings.

It reads the same config as `aesrl-queue run --algo td3` (preset + its registry entry + the options given
here): hidden layers, activations (actor tanh, critic leaky ReLU 0.01), learning rate, batch, replay
size, τ, γ, target-policy noise and clip, Gaussian exploration noise expl_noise · max_action, and
uniform-random start steps. Every `--eval-every` steps after the start steps (as our td3), and at
25/50/100 % of the budget, the deterministic actor runs `--eval-episodes` episodes (default
mean_eval_episodes: 5 on MuJoCo); their mean return is its f(μ).

The output is a run folder that `cli.plot.load_run` (and `aesrl-queue plot`) reads: config.json and
metrics.jsonl with one {"type": "mu_eval", "steps", "interactions", "elapsed", "f_mu"} per evaluation,
where interactions = training steps + every evaluation step so far. With `--snapshot-steps N,...`
(and `--snapshot-interactions`), the actor after training step N is written as
snapshots/steps-N.npz (interactions-N.npz) in the layout of `aesrl-queue run`'s snapshots, so the
learning protocol scores it like every other algorithm's; the interactions it needs to learn are its
training steps (its evaluation episodes only report progress), so both files hold the same actor.

SB3 is a benchmark dependency only (`pip install -e .[bench]`); nothing in the package imports it.

Usage: python bench/sb3_td3.py --env HalfCheetah-v5 --seed 1 --steps 100000 --out DIR
           [--hidden 400,300] [--critic-hidden 400,300] [--start-steps 10000] [--eval-every 5000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from stable_baselines3 import TD3  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.noise import NormalActionNoise  # noqa: E402
from stable_baselines3.common.policies import ContinuousCritic  # noqa: E402
from stable_baselines3.td3.policies import Actor, TD3Policy  # noqa: E402
from torch import nn  # noqa: E402

import aesrl_queue.envs  # noqa: E402,F401  (registers the project's test environments)
from aesrl_queue.config import RunConfig  # noqa: E402
from aesrl_queue.nets import NetSpec  # noqa: E402

LEAKY_SLOPE = 0.01  # aesrl_queue.numpy_actor.LEAKY_SLOPE, nn.LeakyReLU's default


class LeakyReLU(nn.LeakyReLU):
    def __init__(self) -> None:
        super().__init__(LEAKY_SLOPE)


class OurNetsPolicy(TD3Policy):
    """SB3's TD3 policy with our activations: tanh hidden layers in the actor, leaky ReLU in the critics."""

    def make_actor(self, features_extractor=None) -> Actor:
        kwargs = self._update_features_extractor(self.actor_kwargs, features_extractor)
        kwargs["activation_fn"] = nn.Tanh
        return Actor(**kwargs).to(self.device)

    def make_critic(self, features_extractor=None) -> ContinuousCritic:
        kwargs = self._update_features_extractor(self.critic_kwargs, features_extractor)
        kwargs["activation_fn"] = LeakyReLU
        return ContinuousCritic(**kwargs).to(self.device)


def evaluate(model: TD3, env: gym.Env, episodes: int, seed: int) -> tuple[float, int]:
    """Mean return of the deterministic actor over `episodes` episodes, and the env steps they took."""
    returns, steps = [], 0
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        done, ret = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            ret += float(reward)
            steps += 1
            done = terminated or truncated
        returns.append(ret)
    return float(np.mean(returns)), steps


def actor_flat(model: TD3) -> np.ndarray:
    """The actor's parameters in aesrl_queue's flat layout: each Linear's weight (out, in) row-major,
    then its bias. SB3's actor ends in tanh and scales to the action bounds, as ours does."""
    layers = [m for m in model.actor.mu if isinstance(m, nn.Linear)]
    return np.concatenate([t.detach().cpu().numpy().reshape(-1) for m in layers for t in (m.weight, m.bias)])


def write_snapshot(model: TD3, cfg: RunConfig, path: Path) -> None:
    """`path` as `aesrl-queue run` writes a snapshot (config, mu, version), after checking that our
    numpy actor with these parameters acts as SB3's deterministic policy does."""
    flat = actor_flat(model).astype(np.float32)
    actor = NetSpec.from_config(cfg).make_numpy_actor()
    actor.set_params(flat)
    obs = np.asarray(model.get_env().observation_space.sample(), dtype=np.float64)
    ours, theirs = actor.act(obs), model.predict(obs, deterministic=True)[0]
    if not np.allclose(ours, theirs, atol=1e-4):
        raise RuntimeError(f"snapshot layout: our actor gives {ours}, SB3's {theirs}")
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, config=json.dumps(cfg.to_dict(), default=str), mu=flat, var=np.zeros_like(flat), version=0,
             steps=model.num_timesteps, needed_interactions=model.num_timesteps)


class EvalCallback(BaseCallback):
    """Evaluates at the given training steps and appends a mu_eval record to metrics.jsonl; writes the
    snapshots of `snapshots` ({step: [file names]}) under `out`."""

    def __init__(self, env_id: str, points: set[int], episodes: int, seed: int, metrics: Path,
                 cfg: RunConfig | None = None, snapshots: dict[int, list[str]] | None = None) -> None:
        super().__init__()
        self.eval_env = gym.make(env_id)
        self.points, self.episodes, self.seed = points, episodes, seed
        self.metrics = metrics
        self.cfg, self.snapshots = cfg, snapshots or {}
        self.eval_steps = 0
        self.t0 = time.time()

    def _on_step(self) -> bool:
        steps = self.num_timesteps
        for name in self.snapshots.get(steps, ()):
            write_snapshot(self.model, self.cfg, self.metrics.parent / "snapshots" / name)
        if steps in self.points:
            f_mu, used = evaluate(self.model, self.eval_env, self.episodes, seed=self.seed * 1000 + steps)
            self.eval_steps += used
            now = time.time()
            rec = {"type": "mu_eval", "t": now, "elapsed": round(now - self.t0, 3), "steps": steps,
                   "interactions": steps + self.eval_steps, "eval_steps": used, "f_mu": f_mu}
            with self.metrics.open("a") as fh:
                fh.write(json.dumps(rec) + "\n")
            print(f"steps {steps:>8}  f(μ) {f_mu:9.1f}  {now - self.t0:7.0f} s", flush=True)
        return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True, help="training env steps (the stored-step budget)")
    ap.add_argument("--out", type=Path, required=True, help="the run folder to write")
    ap.add_argument("--hidden", default=None, help="actor hidden sizes (default: as `--algo td3`)")
    ap.add_argument("--critic-hidden", default=None, help="critic hidden sizes (default: as `--algo td3`)")
    ap.add_argument("--start-steps", type=int, default=None, help="uniform-random steps before learning")
    ap.add_argument("--eval-every", type=int, default=5000)
    ap.add_argument("--eval-episodes", type=int, default=None,
                    help="episodes per evaluation (default: mean_eval_episodes, as our td3: 5 on MuJoCo)")
    ap.add_argument("--config", type=Path, default=None, help="JSON of RunConfig fields (as `aesrl-queue run`)")
    ap.add_argument("--snapshot-steps", default="", help="N,N,...: the actor after training step N to "
                    "snapshots/steps-N.npz")
    ap.add_argument("--snapshot-interactions", default="", help="N,N,...: the same as interactions-N.npz "
                    "(its needed interactions are its training steps)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    overrides = json.loads(args.config.read_text()) if args.config else {}
    options = dict(hidden=args.hidden, critic_hidden=args.critic_hidden, initial_steps=args.start_steps)
    overrides.update(algo="td3", total_steps=args.steps, seed=args.seed,
                     **{k: v for k, v in options.items() if v is not None})  # an option not given keeps the file's
    cfg = RunConfig.from_preset(args.env, **overrides).resolve()

    args.out.mkdir(parents=True, exist_ok=True)
    metrics = args.out / "metrics.jsonl"
    metrics.write_text("")
    settings = {
        "algo": "sb3-td3", "env_id": cfg.env_id, "seed": cfg.seed, "total_steps": cfg.total_steps,
        "hidden": list(cfg.hidden), "critic_hidden": list(cfg.critic_hidden), "activation": cfg.activation,
        "critic_activation": cfg.critic_activation, "learning_rate": cfg.actor_lr, "batch_size": cfg.batch_size,
        "buffer_size": cfg.replay_capacity, "learning_starts": cfg.initial_steps, "tau": cfg.tau,
        "gamma": cfg.gamma, "target_policy_noise": cfg.policy_noise, "target_noise_clip": cfg.noise_clip,
        "policy_delay": 2, "action_noise_std": cfg.expl_noise * cfg.max_action, "eval_every": args.eval_every,
        "eval_episodes": args.eval_episodes or cfg.mean_eval_episodes, "torch_threads": 1,
    }
    (args.out / "config.json").write_text(json.dumps(settings, indent=1))

    env = gym.make(cfg.env_id)
    n_act = env.action_space.shape[0]
    noise = NormalActionNoise(mean=np.zeros(n_act), sigma=np.full(n_act, settings["action_noise_std"]))
    model = TD3(
        OurNetsPolicy, env, learning_rate=cfg.actor_lr, buffer_size=cfg.replay_capacity,
        learning_starts=cfg.initial_steps, batch_size=cfg.batch_size, tau=cfg.tau, gamma=cfg.gamma,
        train_freq=1, gradient_steps=1, action_noise=noise, policy_delay=2,
        target_policy_noise=cfg.policy_noise, target_noise_clip=cfg.noise_clip,
        policy_kwargs={"net_arch": {"pi": list(cfg.hidden), "qf": list(cfg.critic_hidden)}},
        seed=cfg.seed, device="cpu", verbose=0,
    )
    # Like our td3: evaluations every eval_every steps once the random start steps are over, and
    # at 25/50/100 % of the budget.
    n, start = cfg.total_steps, cfg.initial_steps
    points = {p for p in range(args.eval_every, n + 1, args.eval_every) if p >= start} | {n // 4, n // 2, n}
    snapshots: dict[int, list[str]] = {}
    for kind, text in (("steps", args.snapshot_steps), ("interactions", args.snapshot_interactions)):
        for mark in sorted({int(x) for x in text.split(",") if x.strip()}):
            if mark <= cfg.total_steps:  # a milestone past the budget is never reached
                snapshots.setdefault(mark, []).append(f"{kind}-{mark}.npz")
    callback = EvalCallback(cfg.env_id, points, settings["eval_episodes"], cfg.seed, metrics, cfg, snapshots)
    model.learn(total_timesteps=n, callback=callback)
    summary = {"status": "finished", "steps": model.num_timesteps,
               "interactions": model.num_timesteps + callback.eval_steps, "eval_interactions": callback.eval_steps,
               "elapsed_s": time.time() - callback.t0}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
