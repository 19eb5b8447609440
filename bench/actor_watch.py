"""μ and the critic daemon's own actor over a run: snapshots of a live run, then their scores.

With `rl_steps_max = 0` the daemon trains the learner's actor and RL individuals are that actor, so a
run that stalls can be the learner stalling or μ's rule not following it. `watch` reads the current μ
and the published actor from a live run's Redis every --every seconds into OUT/snap-<steps>.npz until
the budget is stored (or the server goes away); `score` plays each snapshot's μ and actor
deterministically from the fixed start states 10 000, 10 001, ... and prints one line per snapshot.

    python bench/actor_watch.py watch REDIS_URL RUN_ID OUT [--every 150]
    python bench/actor_watch.py score RUN_FOLDER OUT [--episodes 3] [--stride 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def watch(url: str, run_id: str, out: Path, every: float) -> None:
    import redis

    from aesrl_queue.connection import connect
    from aesrl_queue.store import Store

    out.mkdir(parents=True, exist_ok=True)
    store = Store(connect(url), run_id)
    budget = store.config().total_steps
    while True:
        try:
            steps, version = store.state_field("steps"), store.current_version()
            mu, var = store.read_dist(version)
            published = store.read_critic()
        except (redis.ConnectionError, OSError):
            return
        actor = np.zeros(0, np.float32) if published is None else published[1].get("actor", np.zeros(0, np.float32))
        np.savez(out / f"snap-{steps:07d}.npz", mu=mu, var=var, actor=actor, version=version,
                 critic_version=-1 if published is None else published[0])
        print(f"{steps} stored: μ v{version}, critic v{-1 if published is None else published[0]}", flush=True)
        if steps >= budget:
            return
        time.sleep(every)


def score(folder: Path, snaps: Path, episodes: int, stride: int) -> None:
    from aesrl_queue.config import RunConfig
    from aesrl_queue.nets import NetSpec
    from aesrl_queue.rollout import run_episodes

    cfg = RunConfig.from_dict(json.loads((folder / "config.json").read_text()))
    actor = NetSpec.from_config(cfg).make_numpy_actor()

    def returns(flat: np.ndarray) -> float:
        if flat.size == 0:
            return float("nan")
        actor.set_params(flat.astype(np.float32))
        return float(np.mean([run_episodes(cfg.env_id, actor, 1, seed=10_000 + i, store=False,
                                           env_kwargs=cfg.env_kwargs).returns[0] for i in range(episodes)]))

    files = sorted(snaps.glob("snap-*.npz"))
    print(f"{'stored':>8} {'μ v':>5} {'critic v':>8} {'σ mean':>7} {'f(μ)':>8} {'f(actor)':>8} {'|μ - actor|':>11}")
    for f in files[::stride] + files[-1:] * bool((len(files) - 1) % stride):
        d = np.load(f)
        gap = float(np.linalg.norm(d["mu"] - d["actor"])) if d["actor"].size else float("nan")
        print(f"{int(f.stem.split('-')[1]):>8} {int(d['version']):>5} {int(d['critic_version']):>8} "
              f"{float(np.sqrt(d['var']).mean()):>7.4f} {returns(d['mu']):>8.1f} {returns(d['actor']):>8.1f} {gap:>11.2f}",
              flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("watch", help="snapshot μ and the daemon's actor of a live run")
    w.add_argument("url")
    w.add_argument("run_id")
    w.add_argument("out", type=Path)
    w.add_argument("--every", type=float, default=150.0, help="seconds between snapshots (default 150)")
    s = sub.add_parser("score", help="score the snapshots of a run")
    s.add_argument("folder", type=Path, help="the run folder (its config.json)")
    s.add_argument("out", type=Path, help="the snapshots' folder")
    s.add_argument("--episodes", type=int, default=3, help="start states per score (default 3)")
    s.add_argument("--stride", type=int, default=1, help="score every n-th snapshot and the last (default 1)")
    args = ap.parse_args()
    if args.cmd == "watch":
        watch(args.url, args.run_id, args.out, args.every)
    else:
        score(args.folder, args.out, args.episodes, args.stride)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
