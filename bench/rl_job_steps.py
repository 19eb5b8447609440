"""An RL job's actor steps offline: how its actor scores against μ along the steps, on a finished run.

Takes a finished (or stopped) run folder with a critic (from a copy of its Redis data): its last μ,
its last published critic (with crossq-sac, the log-std and α too) and its replay's observations.
From μ it takes the RL job's actor steps (the job's own step and Adam, the run's learner and
learning rate) for --steps, and every --every steps scores the actor, and a Polyak average of it
(--rate per step), deterministically on fixed start states, beside μ's own score there.

    python bench/rl_job_steps.py RUN_FOLDER [--steps 2000] [--every 250] [--rate 0.005]
        [--seeds 1,2] [--starts 10000,10001,10002] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def trace(folder: Path, steps: int, every: int, rate: float, seeds: list[int], starts: list[int]) -> dict[str, Any]:
    import numpy as np
    import torch

    from aesrl_queue.learners import learner_class
    from aesrl_queue.nets import get_flat, set_flat
    from aesrl_queue.td3 import _actor_step
    from bench.actor_average import score
    from bench.daemon_alpha import open_run
    from workers.jobs import critic_module

    torch.set_num_threads(1)
    daemon, version, mu, critic = open_run(folder)
    if critic is None:
        raise SystemExit(f"{folder}: the run published no critic (it ended in its random phase)")
    critic_version, weights = critic
    cfg, spec = daemon.cfg, daemon.spec
    learner = learner_class(cfg.learner)
    critic = critic_module(cfg, weights)  # the critic an RL job of the run rebuilds from these weights
    out: dict[str, Any] = {"folder": folder.name, "env": cfg.env_id, "learner": cfg.learner, "mu_version": version,
                           "critic_version": critic_version, "starts": starts, "mu": score(cfg, mu, starts), "seeds": []}
    for seed in seeds:
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        actor = spec.make_actor()
        set_flat(actor, mu)
        avg = np.array(mu, dtype=np.float64)
        opt = torch.optim.Adam(actor.parameters(), lr=cfg.actor_lr, betas=learner.betas)
        points = []
        for step in range(1, steps + 1):
            _actor_step(actor, critic, opt, daemon.buffer.sample(cfg.batch_size, generator=gen)["obs"])
            avg += rate * (get_flat(actor) - avg)
            if step % every == 0:
                points.append({"steps": step, "actor": score(cfg, get_flat(actor), starts),
                               "average": score(cfg, avg.astype(np.float32), starts)})
        out["seeds"].append({"seed": seed, "points": points})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--every", type=int, default=250)
    ap.add_argument("--rate", type=float, default=0.005)
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--starts", default="10000,10001,10002")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    got = trace(args.folder, args.steps, args.every, args.rate, [int(s) for s in args.seeds.split(",")],
                [int(s) for s in args.starts.split(",")])
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(f"{got['folder']} ({got['env']}, {got['learner']}): μ v{got['mu_version']} scores {mean(got['mu']):.0f} "
          f"on starts {got['starts']}; critic v{got['critic_version']}")
    print(f"{'seed':>4} {'steps':>6} {'actor':>8} {'average':>8}")
    for s in got["seeds"]:
        for p in s["points"]:
            print(f"{s['seed']:>4} {p['steps']:>6} {mean(p['actor']):>8.0f} {mean(p['average']):>8.0f}")
    if args.out:
        args.out.write_text(json.dumps(got, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
