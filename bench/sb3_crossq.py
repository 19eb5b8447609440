"""sb3-contrib's CrossQ (SAC-based, its actor stochastic) as an outside reference for our `crossq` learner.

Our `crossq` trains a deterministic TD3-style actor (ES perturbs it as a flat vector) with CrossQ's
batch-renormalised critic and no target network. This script trains the published family's actor
(squashed Gaussian with entropy tuning, BatchRenorm in the actor too) under the learning protocol's
budget and scores it as the protocol scores a snapshot: the deterministic policy (the Gaussian's
mean), one episode from each of the 10 fixed start states (reset seeds 10 000-10 009), after 25 000,
50 000 and 100 000 training steps. Its actor cannot be written as our flat numpy actor (it has batch
renormalisation layers), so it is scored here, not through snapshots.

Settings: sb3-contrib's CrossQ defaults (lr 1e-3, Adam betas 0.5/0.999, policy delay 3, batch 256,
BatchRenorm momentum 0.01 and 100 000 warm-up steps, actor 256-256 ReLU) except the protocol's
10 000 uniform-random start steps and the critic width (`--critic-hidden`, default 256,256: a CPU
budget; the paper's is 2048,2048). One torch thread.

Needs the `bench` extra and sb3-contrib (`pip install sb3-contrib`); nothing in the package imports it.

Usage: python bench/sb3_crossq.py --env Hopper-v5 --seed 1 --out FILE.json [--steps 100000]
           [--critic-hidden 256,256] [--start-steps 10000] [--no-actor-bn]
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
from sb3_contrib import CrossQ  # noqa: E402
from sb3_contrib.crossq.policies import Actor, CrossQPolicy  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402

from bench import learning  # noqa: E402

EVAL_SEEDS = learning.PROTOCOL["eval_seeds"]


def score(model: CrossQ, env_id: str) -> list[float]:
    env = gym.make(env_id)
    returns = []
    for s in EVAL_SEEDS:
        obs, _ = env.reset(seed=s)
        done, ret = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            ret += float(reward)
            done = terminated or truncated
        returns.append(round(ret, 3))
    return returns


class PlainActorPolicy(CrossQPolicy):
    """CrossQ's policy with an actor without BatchRenorm layers (a plain MLP trunk, as our flat actors
    are); the critic keeps them."""

    def make_actor(self, features_extractor=None) -> Actor:
        kwargs = self._update_features_extractor(self.actor_kwargs, features_extractor)
        return Actor(**{**kwargs, "batch_norm": False}).to(self.device)


class Milestones(BaseCallback):
    def __init__(self, env_id: str, marks: list[int], row: dict, out: Path) -> None:
        super().__init__()
        self.env_id, self.marks, self.row, self.out, self.t0 = env_id, set(marks), row, out, time.time()

    def _on_step(self) -> bool:
        if self.num_timesteps in self.marks:
            returns = score(self.model, self.env_id)
            self.row["scores"][str(self.num_timesteps)] = {"returns": returns, "mean": round(float(np.mean(returns)), 3)}
            self.row["wall_s"] = round(time.time() - self.t0, 1)
            self.out.write_text(json.dumps(self.row, indent=1) + "\n")
            print(f"{self.env_id} steps {self.num_timesteps}: mean {np.mean(returns):.1f} on the fixed starts, "
                  f"{time.time() - self.t0:.0f} s", flush=True)
        return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True, help="JSON row, rewritten at each milestone")
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--critic-hidden", default="256,256")
    ap.add_argument("--start-steps", type=int, default=10_000)
    ap.add_argument("--no-actor-bn", action="store_true", help="an actor without BatchRenorm layers (a plain "
                    "MLP, as the flat actors ES perturbs); the critic keeps them")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    critic = [int(n) for n in args.critic_hidden.split(",")]
    marks = [args.steps // 4, args.steps // 2, args.steps]
    row = {"algo": "sb3-crossq", "env": args.env, "seed": args.seed, "steps": args.steps, "critic_hidden": critic,
           "learning_starts": args.start_steps, "actor_bn": not args.no_actor_bn, "scores": {},
           "versions": {m.__name__: m.__version__ for m in (gym, np, torch)}, "machine": learning.machine_facts()}
    model = CrossQ(PlainActorPolicy if args.no_actor_bn else "MlpPolicy", args.env, learning_starts=args.start_steps, seed=args.seed, device="cpu",
                   policy_kwargs={"net_arch": {"pi": [256, 256], "qf": critic}})
    model.learn(total_timesteps=args.steps, callback=Milestones(args.env, marks, row, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
