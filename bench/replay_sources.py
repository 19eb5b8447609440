"""Which of a run's episodes a fresh learner's critic can be trained on offline without diverging.

Reads a stopped run's replay (from a copy of its Redis data) up to --upto stored steps, tags each
episode with its source, and trains a fresh agent of the run's learner (actor and critic, as the
`td3` baseline trains them, its initial weights from --seeds) on subsets of it, printing the critic's
loss and mean Q1 every --every steps. Sources:

    random      the individuals' episodes of the random phase (uniform random actions)
    random_mu   μ's episodes during the random phase (μ₀, deterministic)
    es, rl      the ES and RL individuals' episodes after it
    mu          μ's episodes after it

A subset is `all`, or `all` less sources: `all-mu-random_mu` is every episode but μ's.

    python bench/replay_sources.py RUN_FOLDER [--upto 15000] [--steps 3000] [--every 500]
        [--subsets all,all-mu-random_mu] [--seeds 0,1] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SOURCES = ("random", "random_mu", "es", "rl", "mu")


def read_episodes(folder: Path, upto: int) -> tuple[Any, list[tuple[str, dict]]]:
    """(the run's config, [(source, episode)]) for the replay's first entries up to `upto` stored steps."""
    from aesrl_queue.connection import connect
    from aesrl_queue.redis_server import folder_copy
    from aesrl_queue.store import Store

    with folder_copy(folder) as server:
        store = Store(connect(server.url), folder.name)
        cfg = store.config()
        kinds = {f[b"job"].decode(): f[b"kind"].decode() for _, f in store.read_stream("results", count=10**7)}
        episodes, stored, after = [], 0, "0-0"
        while stored < upto:
            rows = store.read_stream("replay", after, count=500)
            if not rows:
                break
            for entry_id, fields in rows:
                after, job = entry_id, fields[b"job"].decode()
                ep = store.decode_episode(entry_id, fields)
                mu, random_phase = job.endswith(":mu"), stored < cfg.initial_steps
                kind = kinds.get(job.split(":")[0])
                if kind is None:  # an episode whose result is not in the results stream (trimmed)
                    raise SystemExit(f"{folder}: no result for job {job}")
                source = ("random_mu" if mu else "random") if random_phase else ("mu" if mu else kind)
                episodes.append((source, ep))
                stored += len(ep["rew"])
                if stored >= upto:
                    break
    return cfg, episodes


def subset_sources(name: str) -> set[str]:
    head, *dropped = name.split("-")
    bad = [s for s in dropped if s not in SOURCES]
    if head != "all" or bad:
        raise SystemExit(f"--subsets: {name!r}: 'all' or 'all' less sources of {SOURCES}")
    return set(SOURCES) - set(dropped)


def train(cfg, episodes: list[tuple[str, dict]], sources: set[str], seed: int, steps: int, every: int) -> dict:
    import torch

    from aesrl_queue.learners import Agent
    from aesrl_queue.nets import NetSpec
    from aesrl_queue.td3 import ReplayBuffer

    torch.manual_seed(seed)
    buffer = ReplayBuffer(cfg.obs_dim, cfg.act_dim, max(1, sum(len(ep["rew"]) for _, ep in episodes)))
    for source, ep in episodes:
        if source in sources:
            buffer.add_batch(ep["obs"], ep["act"], ep["rew"], ep["next_obs"], ep["done"])
    agent = Agent(NetSpec.from_config(cfg), cfg.learner, lr=cfg.actor_lr, gamma=cfg.gamma, tau=cfg.tau,
                  policy_noise=cfg.policy_noise, noise_clip=cfg.noise_clip)
    gen, points, t0 = torch.Generator().manual_seed(seed), [], time.monotonic()
    for it in range(1, steps + 1):
        out = agent.train_step(buffer.sample(cfg.batch_size, generator=gen))
        if it % every == 0:
            points.append({"steps": it, "loss": round(out["loss"], 1), "q1": round(out["q1_mean"], 1)})
    return {"size": len(buffer), "seconds": round(time.monotonic() - t0, 1), "points": points}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="a stopped run's folder")
    ap.add_argument("--upto", type=int, default=15_000, help="stored steps of the replay to read (default 15000)")
    ap.add_argument("--steps", type=int, default=3_000, help="training steps per subset and seed (default 3000)")
    ap.add_argument("--every", type=int, default=500, help="print every this many steps (default 500)")
    ap.add_argument("--subsets", default="all,all-mu-random_mu", help="comma-separated subsets (see above)")
    ap.add_argument("--seeds", default="0,1", help="torch seeds of the fresh agent's initial weights")
    ap.add_argument("--out", type=Path, help="write the results here as JSON")
    args = ap.parse_args(argv)
    if args.steps < args.every or args.every < 1:
        raise SystemExit("--steps must be at least --every, and --every at least 1")
    import torch

    torch.set_num_threads(1)
    subsets = {name: subset_sources(name) for name in args.subsets.split(",")}
    seeds = [int(s) for s in args.seeds.split(",")]
    cfg, episodes = read_episodes(args.folder, args.upto)
    sizes = {s: sum(len(ep["rew"]) for src, ep in episodes if src == s) for s in SOURCES}
    print(f"{args.folder.name} ({cfg.env_id}, {cfg.learner}): first {sum(sizes.values())} stored steps: "
          + ", ".join(f"{s} {n}" for s, n in sizes.items()))
    marks = list(range(args.every, args.steps + 1, args.every))
    print(f"{'subset':28} {'seed':>4} {'size':>6}  " + " ".join(f"{'Q1@' + str(m):>9}" for m in marks)
          + f"  {'loss@' + str(marks[-1]):>12}")
    results = []
    for name, sources in subsets.items():
        for seed in seeds:
            got = train(cfg, episodes, sources, seed, args.steps, args.every)
            results.append({"subset": name, "seed": seed, **got})
            print(f"{name:28} {seed:>4} {got['size']:>6}  " + " ".join(f"{p['q1']:>9.1f}" for p in got["points"])
                  + f"  {got['points'][-1]['loss']:>12.1f}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"benchmark": "replay_sources", "run": args.folder.name, "env": cfg.env_id,
                                        "learner": cfg.learner, "upto": args.upto, "sizes": sizes,
                                        "steps": args.steps, "results": results}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
