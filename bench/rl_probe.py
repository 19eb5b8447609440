"""What an RL job does to μ, measured on a finished run: the critic's Q against the true return.

Loads a run folder left by `aesrl-queue run` (its Redis files: μ, var, the last critic and the replay),
draws individuals from N(μ, var) as RL jobs do, trains each against the frozen critic's Q1 as
`workers.jobs` does (`td3.train_actor`, fresh Adam) for several (actor steps, learning rate), and
prints for each: the distance it moved from μ, the critic's mean Q(s, actor(s)) on replay states, and
its mean return over fixed start states. The reference row is μ itself. A critic that rates the
trained actors above μ while their returns fall below it is a critic that RL jobs cannot climb.

A setting may carry a third field, α (`2000:1e-3:0.3`): the individual then trains on TD3+BC's actor
loss with its own starting actions as the reference (`td3.train_actor`'s anchor), −α·Q1/mean|Q1| plus
the mean squared change of its actions, so it climbs the critic only as far as it stays near its start.

With --action-change it prints instead how far an RL job's actions move from the sampled
individual's: for each actor learning rate and number of fresh-Adam steps, the root mean square
change of the actions on replay states (a fraction of the action bound, what `rl_action_limit`
bounds), the distance moved in parameters, and the critic's Q gain.

With --interpolate it trains --samples individuals as the run's RL jobs do (its rl_steps_max and
actor_lr) and prints the return of the policies between μ and each, μ + t·(z − μ) for t in --ts: the
mean rules move μ to such a point with t = p, and two policies 10-20 apart in parameters need not
have good policies between them (what `rl_jump` avoids).

Usage: python bench/rl_probe.py RUN_FOLDER [--run-id ID] [--settings 2000:1e-3,500:1e-3,2000:1e-3:0.3] [--samples 2]
       python bench/rl_probe.py RUN_FOLDER --action-change [--lrs 1e-3,1e-4] [--steps 1,5,25]
       python bench/rl_probe.py RUN_FOLDER --interpolate [--samples 3] [--ts 0,0.25,0.5,0.75,1]
(RUN_FOLDER: e.g. bench/results/learning/Hopper-v5/aesrl-s2; the run id defaults to its name)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import redis  # noqa: E402
import torch  # noqa: E402

from aesrl_queue import codec, noise  # noqa: E402
from aesrl_queue.nets import NetSpec, set_flat  # noqa: E402
from aesrl_queue.redis_server import RedisServer  # noqa: E402
from aesrl_queue.rollout import run_episodes  # noqa: E402
from aesrl_queue.store import Store  # noqa: E402
from aesrl_queue.td3 import action_change, train_actor  # noqa: E402

EVAL_STARTS = [10**6 + i for i in range(5)]


def load(folder: Path, run: str):
    """(config, version, μ, var, critic, replay observations) from a copy of the run's Redis files."""
    tmp = Path(tempfile.mkdtemp(prefix="rl-probe-"))
    shutil.copytree(folder / "redis", tmp / "redis")
    server = RedisServer(directory=tmp / "redis", appendonly=True).start()
    try:
        client = redis.Redis.from_url(server.url)
        store = Store(client, run)
        cfg = store.config()
        version = store.current_version()
        mu, var = store.read_dist(version)
        got = store.read_critic()
        if got is None:
            sys.exit(f"run {run} has no critic: nothing to probe")
        obs, last = [], "0-0"
        while rows := store.read_stream("replay", last, count=500):
            for entry_id, fields in rows:
                last = entry_id
                obs.append(store.decode_episode(entry_id, fields, obs_only=True)["obs"])
        return cfg, version, mu, var, got, np.concatenate(obs)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--settings", default="2000:1e-3,2000:3e-4,500:1e-3,200:1e-3",
                    help="actor steps:learning rate[:anchor α] to train with (α > 0: train_actor's anchor, "
                         "the actor loss held near the sample's actions)")
    ap.add_argument("--samples", type=int, default=2, help="individuals drawn per setting")
    ap.add_argument("--action-change", action="store_true",
                    help="print how far fresh-Adam steps move an individual's actions (see --lrs, --steps)")
    ap.add_argument("--lrs", default="1e-3,3e-4,1e-4,3e-5", help="--action-change: actor learning rates")
    ap.add_argument("--steps", default="1,5,25,100,500", help="--action-change: numbers of actor steps")
    ap.add_argument("--interpolate", action="store_true",
                    help="print the returns of μ + t·(z − μ) for RL-trained individuals z (see --ts)")
    ap.add_argument("--ts", default="0,0.25,0.5,0.75,1", help="--interpolate: the points t between μ and z")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    run = args.run_id or args.folder.name
    cfg, version, mu, var, (critic_version, weights), obs = load(args.folder, run)
    tspec = NetSpec.from_config(cfg)
    critic = tspec.make_critic()
    set_flat(critic, codec.check_array(weights["critic"], what="critic weights"))
    for p in critic.parameters():
        p.requires_grad_(False)
    actor = tspec.make_numpy_actor()
    rng = np.random.default_rng(0)
    probe_obs = torch.from_numpy(obs[rng.integers(len(obs), size=4000)])

    def q(params: np.ndarray) -> float:
        with torch.no_grad():
            return float(critic.q1(probe_obs, torch_actor(tspec, params)(probe_obs)).mean())

    def returns(params: np.ndarray) -> tuple[float, float]:
        actor.set_params(params)
        eps = [run_episodes(cfg.env_id, actor, k=1, seed=s, store=False, env_kwargs=cfg.env_kwargs) for s in EVAL_STARTS]
        return float(np.mean([e.returns[0] for e in eps])), float(np.mean([e.lengths[0] for e in eps]))

    print(f"{cfg.env_id}, run {run}: μ version {version}, critic version {critic_version}, replay {len(obs):,} states, "
          f"σ mean {float(np.sqrt(var).mean()):.4f}; return: mean over {len(EVAL_STARTS)} fixed start states")
    if args.action_change:
        return print_action_change(tspec, critic, mu, var, obs, probe_obs,
                                   [float(x) for x in args.lrs.split(",")], [int(x) for x in args.steps.split(",")])
    if args.interpolate:
        return print_interpolation(cfg, tspec, critic, mu, var, obs, returns, args.samples,
                                   [float(t) for t in args.ts.split(",")])
    ret_mu, len_mu = returns(mu)
    q_mu = q(mu)
    print(f"{'individual':>25} | {'‖z − μ‖':>8} | {'Q(s, a)':>8} | {'Q − Q(μ)':>8} | {'return':>7} | "
          f"{'− f(μ)':>7} | {'length':>6} | {'train s':>7}")
    print(f"{'μ (reference)':>25} | {0.0:>8.1f} | {q_mu:>8.2f} | {0.0:>8.2f} | {ret_mu:>7.0f} | {0.0:>7.0f} | "
          f"{len_mu:>6.0f} | {'':>7}")
    for item in args.settings.split(","):
        parts = item.split(":")
        steps, lr, alpha = int(parts[0]), float(parts[1]), float(parts[2]) if len(parts) > 2 else 0.0
        name = f"RL {steps} steps, lr {lr:g}" + (f", α {alpha:g}" if alpha else "")
        for i in range(args.samples):
            seed = 1000 + i
            t0 = time.monotonic()
            zt = train_like_rl_job(tspec, critic, obs, noise.sample(mu, var, seed), seed, steps, lr, cfg.batch_size,
                                   anchor=alpha)
            secs = time.monotonic() - t0
            qz, (ret, length) = q(zt), returns(zt)
            print(f"{name:>25} | {np.linalg.norm(zt - mu):>8.1f} | {qz:>8.2f} | "
                  f"{qz - q_mu:>8.2f} | {ret:>7.0f} | {ret - ret_mu:>7.0f} | {length:>6.0f} | {secs:>7.1f}", flush=True)
    return 0


def train_like_rl_job(tspec: NetSpec, critic, obs: np.ndarray, z: np.ndarray, seed: int, steps: int, lr: float,
                      batch_size: int, anchor: float = 0.0) -> np.ndarray:
    """z trained as an RL job trains it: `steps` fresh-Adam steps at `lr` against the frozen critic,
    on batches of replay states drawn from `seed` (anchor: train_actor's α)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return train_actor(z, tspec, critic, lambda n: obs[torch.randint(len(obs), (n,), generator=gen).numpy()],
                           steps=steps, batch_size=batch_size, lr=lr, anchor=anchor)


def torch_actor(tspec: NetSpec, params: np.ndarray) -> torch.nn.Module:
    """A torch actor holding the flat parameter vector params."""
    actor = tspec.make_actor()
    set_flat(actor, params)
    return actor


def print_action_change(tspec: NetSpec, critic, mu: np.ndarray, var: np.ndarray, obs: np.ndarray,
                        probe_obs: torch.Tensor, lrs: list[float], step_counts: list[int]) -> int:
    """The RMS action change (fraction of the bound), ‖Δz‖ and Q gain of one individual after n
    fresh-Adam steps, for each learning rate: how far an RL job moves before any trust region."""
    z = noise.sample(mu, var, 1000)
    start, mean = torch_actor(tspec, z), torch_actor(tspec, mu)
    with torch.no_grad():
        q0 = float(critic.q1(probe_obs, start(probe_obs)).mean())
    print(f"a sample of N(μ, var) differs from μ by {action_change(start, mean, probe_obs, tspec.max_action):.3f} "
          "of the action bound (RMS)")
    print("cells: RMS action change from the sample / ‖Δz‖ / critic's Q gain")
    print(f"{'actor lr':>9} | " + " | ".join(f"{n:>5} steps{'':>9}" for n in step_counts))
    for lr in lrs:
        cells = []
        for n in step_counts:
            zt = train_like_rl_job(tspec, critic, obs, z, 1, n, lr, batch_size=256)
            a = torch_actor(tspec, zt)
            with torch.no_grad():
                dq = float(critic.q1(probe_obs, a(probe_obs)).mean()) - q0
            cells.append(f"{action_change(a, start, probe_obs, tspec.max_action):.2f} / "
                         f"{np.linalg.norm(zt - z):5.2f} / {dq:+5.2f}")
        print(f"{lr:>9g} | " + " | ".join(f"{c:>20}" for c in cells), flush=True)
    return 0


def print_interpolation(cfg, tspec: NetSpec, critic, mu: np.ndarray, var: np.ndarray, obs: np.ndarray, returns,
                        samples: int, ts: list[float]) -> int:
    """The return of μ + t·(z − μ) for individuals z trained as the run's RL jobs are (rl_steps_max
    actor steps at actor_lr, fresh Adam, against the frozen critic): where a mean rule with p = t would
    put μ."""
    print(f"RL individuals: {cfg.rl_steps_max} actor steps at lr {cfg.actor_lr:g}; cells: return of μ + t·(z − μ)")
    print(f"{'individual':>10} | {'‖z − μ‖':>7} | " + " | ".join(f"{f't = {t:g}':>8}" for t in ts))
    for i in range(samples):
        seed = 2000 + i
        zt = train_like_rl_job(tspec, critic, obs, noise.sample(mu, var, seed), seed, cfg.rl_steps_max, cfg.actor_lr,
                               cfg.batch_size)
        cells = []
        for t in ts:
            point = (mu.astype(np.float64) + t * (zt.astype(np.float64) - mu)).astype(np.float32)
            cells.append(f"{returns(point)[0]:>8.0f}")
        print(f"{f'RL {i + 1}':>10} | {np.linalg.norm(zt - mu):>7.1f} | " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
