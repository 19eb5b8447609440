"""How much crossq-sac's deterministic actor swings under further policy steps, at two actor learning rates.

From one checkpoint of a `td3 --learner crossq-sac` run (its actor, log-std, α, critic and optimizers, as
the run stored them) and that run's replay (the run folder's Redis), train the learner on the replay alone
for --updates more iterations (a critic step each, a policy step every third, as the run trains) at each
--actor-lr, and every --every iterations score the deterministic actor (tanh of the policy's mean) on
fixed start states. A swing shows as a score far below its neighbours. Offline: no new data enters the
replay, so this isolates the policy and critic steps from exploration.

    python bench/actor_swing.py --run-dir RUN_FOLDER --run-id RUN_ID [--ckpt CKPT.pkl] \\
        [--actor-lr 1e-3,3e-4] [--updates 6000] [--every 300] [--starts 10000,10001,10002] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def replay_rows(run_dir: str, run_id: str):
    """The run's config, its replay as arrays and its td3 checkpoint (the last one: a finished run
    writes its final networks there, a stopped one what it had), read from its Redis, started on a
    copy of the folder's data."""
    import numpy as np

    from aesrl_queue.connection import connect
    from aesrl_queue.redis_server import folder_copy
    from aesrl_queue.store import Store

    with folder_copy(Path(run_dir)) as server:
        store = Store(connect(server.url), run_id)
        cfg = store.config()
        parts = {k: [] for k in ("obs", "act", "rew", "next_obs", "done")}
        after = "0-0"
        while True:
            got = store.read_stream("replay", after, count=200)
            if not got:
                break
            for entry_id, fields in got:
                ep = store.decode_episode(entry_id, fields)
                for k in parts:
                    parts[k].append(np.asarray(ep[k], np.float32))
                after = entry_id
        return cfg, {k: np.concatenate(v) for k, v in parts.items()}, store.load_checkpoint("td3")


def one(args: tuple) -> dict:
    cfg, rows, ckpt, lr, updates, every, starts, seed = args
    import numpy as np
    import torch

    from aesrl_queue.learners import Agent
    from aesrl_queue.nets import NetSpec, get_flat
    from aesrl_queue.td3 import ReplayBuffer
    from bench.actor_average import score

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    spec = NetSpec.from_config(cfg)
    agent = Agent(spec, cfg.learner, lr=cfg.actor_lr)
    agent.load_state(ckpt)
    for group in agent.actor_opt.param_groups:
        group["lr"] = lr
    replay = ReplayBuffer(cfg.obs_dim, cfg.act_dim, len(rows["obs"]))
    replay.add_batch(rows["obs"], rows["act"], rows["rew"], rows["next_obs"], rows["done"])
    gen = torch.Generator().manual_seed(seed)
    scores = []
    for i in range(updates + 1):
        if i % every == 0:
            rets = score(cfg, get_flat(agent.actor), starts)  # the actor, not the average the run publishes
            scores.append({"updates": i, "returns": rets, "mean": round(float(np.mean(rets)), 1)})
        if i < updates:
            agent.train_step(replay.sample(cfg.batch_size, generator=gen))
    means = [s["mean"] for s in scores]
    return {"actor_lr": lr, "scores": scores, "min": min(means), "max": max(means),
            "below_half_of_median": sum(m < 0.5 * float(np.median(means)) for m in means)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--ckpt", help="a pickled td3 checkpoint (Store.load_checkpoint('td3')); default the run "
                    "folder's own, the last the run wrote")
    ap.add_argument("--actor-lr", default="1e-3,3e-4")
    ap.add_argument("--updates", type=int, default=6000)
    ap.add_argument("--every", type=int, default=300)
    ap.add_argument("--starts", default="10000,10001,10002")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args()
    cfg, rows, ckpt = replay_rows(args.run_dir, args.run_id)
    if args.ckpt:
        ckpt = pickle.loads(Path(args.ckpt).read_bytes())
    if ckpt is None:
        raise SystemExit(f"{args.run_dir} holds no td3 checkpoint (the run never wrote one): pass --ckpt")
    lrs = [float(x) for x in args.actor_lr.split(",")]
    starts = [int(s) for s in args.starts.split(",")]
    jobs = [(cfg, rows, ckpt, lr, args.updates, args.every, starts, args.seed) for lr in lrs]
    with ProcessPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(one, jobs))
    print(f"{cfg.env_id} {args.run_id}: checkpoint at {ckpt.get('total')} steps, {len(rows['obs'])} replay rows, "
          f"{args.updates} more iterations on the replay alone")
    print(f"{'actor lr':>9} {'min':>7} {'max':>7} {'below half the median':>22}  means every {args.every}")
    for r in results:
        print(f"{r['actor_lr']:>9g} {r['min']:>7.0f} {r['max']:>7.0f} {r['below_half_of_median']:>22}  "
              + " ".join(f"{s['mean']:.0f}" for s in r["scores"]))
    if args.out:
        Path(args.out).write_text(json.dumps({"run_id": args.run_id, "ckpt_steps": ckpt.get("total"),
                                              "updates": args.updates, "every": args.every, "starts": starts,
                                              "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
