"""crossq-sac's critic daemon offline: what its entropy temperature α does around a run's μ.

Loads a stopped run's replay (from a copy of its Redis data), fixes the daemon's target policy to the
run's last μ (or μ₀ with --mu mu0), and trains the daemon's learner on that replay as the daemon does
(a critic step, then the log-std and α step around μ), printing log α, the critic's loss, its mean Q1,
the log-std and μ's mean |pre-tanh| every --every steps, for each way of tuning α:

    gaussian   α on the entropy of the Gaussian before the squash (the daemon's own rule)
    squashed   α on the squashed policy's entropy (the `td3` baseline's rule, SAC's)
    capped     as squashed, with log α held at or below 0 (α at most its start, 1)

    python bench/daemon_alpha.py RUN_FOLDER [--steps 4000] [--every 500] [--rules gaussian,squashed,capped]
        [--mu last|mu0] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RULES = ("gaussian", "squashed", "capped")


def _squashed_rule(learner, capped: bool) -> None:
    """Tune `learner`'s α on the squashed policy's entropy with the mean held too (capped: log α ≤ 0)."""
    import torch

    learner.alpha_logp = lambda logp, log_std, noise, mean_trains: logp
    if capped:
        step = learner.alpha_opt.step

        def capped_step(*args, **kwargs):
            step(*args, **kwargs)
            with torch.no_grad():
                learner.log_alpha.clamp_(max=0.0)

        learner.alpha_opt.step = capped_step


def open_run(folder: Path):
    """(the critic daemon of a stopped run, its last μ version, that μ, (critic version, weights)), read
    from a copy of the folder's Redis data; the daemon's replay mirrors the whole run's."""
    import torch

    from aesrl_queue.connection import connect
    from aesrl_queue.redis_server import folder_copy
    from workers.critic import CriticDaemon

    with folder_copy(folder) as server:
        client = connect(server.url)
        torch.manual_seed(0)  # the daemon's fresh critic and log-std: the same initial weights each time
        daemon = CriticDaemon(client, client, folder.name, device="cpu", cuda_graph=False)
        while daemon.sync():
            pass
        version = daemon.store.current_version()
        return daemon, version, daemon.store.read_dist(version)[0], daemon.store.read_critic()


def trace(folder: str, rule: str, which_mu: str, steps: int, every: int) -> dict[str, Any]:
    import torch

    from aesrl_queue.nets import set_flat

    torch.set_num_threads(1)
    daemon, _, last, _ = open_run(Path(folder))
    if daemon.cfg.learner != "crossq-sac":
        raise SystemExit(f"{folder}: the run's learner is {daemon.cfg.learner}, not crossq-sac")
    set_flat(daemon.target_actor, daemon.spec.init_actor_params(daemon.cfg.seed) if which_mu == "mu0" else last)
    learner = daemon.learner
    if rule != "gaussian":
        _squashed_rule(learner, capped=rule == "capped")
    points, t0 = [], time.monotonic()
    for done in range(every, steps + 1, every):
        stats = daemon.train_chunk(every)
        with torch.no_grad():
            obs = daemon.buffer.sample(512, generator=daemon.gen)["obs"]
            pre = daemon.target_actor.pre_tanh(obs).abs().mean().item()
            log_std = learner.log_std(obs).mean().item()
        points.append({"steps": done, "log_alpha": round(learner.log_alpha.item(), 3), "loss": round(stats["loss"], 2),
                       "q1": round(stats["q1_mean"], 1), "log_std": round(log_std, 3), "mu_abs_pre_tanh": round(pre, 3)})
    return {"rule": rule, "mu": which_mu, "replay": int(daemon.buffer.total_added), "seconds": round(time.monotonic() - t0, 1),
            "points": points}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--mu", choices=("last", "mu0"), default="last")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rules = [r for r in args.rules.split(",") if r]
    if bad := [r for r in rules if r not in RULES]:
        raise SystemExit(f"--rules: unknown {bad}; known {list(RULES)}")
    with ProcessPoolExecutor(max_workers=min(len(rules), os.cpu_count() or 1)) as pool:
        runs = list(pool.map(trace, [args.folder] * len(rules), rules, [args.mu] * len(rules),
                             [args.steps] * len(rules), [args.every] * len(rules)))
    print(f"{Path(args.folder).name}: replay {runs[0]['replay']} rows, target policy μ = {args.mu}")
    print(f"{'rule':9} {'steps':>6} {'log α':>7} {'loss':>12} {'mean Q1':>9} {'log-std':>8} {'|pre-tanh μ|':>13}")
    for run in runs:
        for p in run["points"]:
            print(f"{run['rule']:9} {p['steps']:>6} {p['log_alpha']:>7.2f} {p['loss']:>12.4g} {p['q1']:>9.1f} "
                  f"{p['log_std']:>8.2f} {p['mu_abs_pre_tanh']:>13.2f}")
    if args.out:
        args.out.write_text(json.dumps({"folder": Path(args.folder).name, "steps": args.steps, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
