"""ES alone on Pendulum-v1: which AES-RL rules let the distribution learn without RL individuals.

The same `AesrlDistribution` the scheduler uses, driven in one process with no Redis and no
asynchrony (each individual is told before the next is drawn), so one 1M-step run takes about a
minute and the rules can be compared over several seeds. Each individual is one episode of
z ~ N(μ, var); f(μ) is measured as the scheduler's jobs measure it (paired: one episode of μ from
the individual's start state; unpaired: k episodes from other start states); every 100 individuals
μ is evaluated on 10 fixed start states for the table.

Variants (what `--algo es` used before and after issue 14, and the steps between):
    paper        r = 200 (the old Pendulum preset), 3 unpaired f(μ) episodes, var floor 1e-5
    adaptive     the adaptive scale, paired f(μ), var floor 1e-5
    floor        the adaptive scale, paired f(μ), var floor 1e-3
    linear       as floor, with the fixed-linear mean rule (p = Δ/r for Δ > 0, else 0)
    linear-floor3e-4, linear-floor3e-3   as linear, with another variance floor
    pp50, pp25   as linear, with the paper's p_positive = 0.5 or 0.25 (μ moves at most half or a
                 quarter of the way to the best individual: one episode's luck is averaged out)
    mirror       as linear, but each job runs z and μ − σ·ε from one start state (both stored); f(μ) is
                 the pair's mean and both are told, the worse first (`es_antithetic`, the es default)
    starts2      as linear, with z and μ each evaluated on two start states
    mirror-pp50, mirror-pp25, mirror-pp10   as mirror, with p_positive 0.5, 0.25 or 0.1: μ moves that
                 share of the way the rule asks towards the better of the pair
    mirror-floor1e-2, mirror-pp25-floor1e-2   as mirror and mirror-pp25, with var floor 1e-2 (σ 0.1)
    openai-es    the reference, not an AES-RL rule: a synchronous OpenAI-ES (Salimans et al. 2017) with
                 20 pairs μ ± σ·ε per generation (each pair from one start state), centred-rank
                 utilities over the 40 returns, Adam (lr 0.1) on the gradient estimate, fixed σ = 0.1,
                 L2 0.005 (the best of six settings tried on seed 0: lr 0.03/0.1 × σ 0.0316/0.1 × 5/20
                 pairs). The same network, episodes and budget: it tells whether −400 is within reach of
                 ES at 1M steps, with a whole population per step

Usage: python bench/es_rules.py [--quick] [--seeds 0,1,2] [--steps 1000000] [--variants ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from aesrl_queue.distributions import make_distribution  # noqa: E402
from aesrl_queue.nets import init_actor_params  # noqa: E402
from aesrl_queue.numpy_actor import NumpyActor  # noqa: E402
from aesrl_queue.rollout import env_dims, run_episodes  # noqa: E402

ENV = "Pendulum-v1"
HIDDEN = (64, 64)  # the Pendulum preset's actor
VARIANTS = {
    "paper": dict(r=200.0, mean_rule="baseline-relative", var_floor=1e-5, paired=False, k=3),
    "adaptive": dict(r="adaptive", mean_rule="baseline-relative", var_floor=1e-5, paired=True, k=1),
    "floor": dict(r="adaptive", mean_rule="baseline-relative", var_floor=1e-3, paired=True, k=1),
    "linear": dict(r="adaptive", mean_rule="fixed-linear", var_floor=1e-3, paired=True, k=1),
    "linear-floor3e-4": dict(r="adaptive", mean_rule="fixed-linear", var_floor=3e-4, paired=True, k=1),
    "linear-floor3e-3": dict(r="adaptive", mean_rule="fixed-linear", var_floor=3e-3, paired=True, k=1),
    "pp50": dict(r="adaptive", mean_rule="fixed-linear", var_floor=1e-3, paired=True, k=1, positive_ratio=0.5),
    "pp25": dict(r="adaptive", mean_rule="fixed-linear", var_floor=1e-3, paired=True, k=1, positive_ratio=0.25),
    "starts2": dict(r="adaptive", mean_rule="fixed-linear", var_floor=1e-3, paired=True, k=1, starts=2),
    "mirror": dict(r="adaptive", mean_rule="fixed-linear", var_floor=1e-3, paired=True, k=1, mirror=True),
    "mirror-pp50": dict(r="adaptive", mean_rule="fixed-linear", var_floor=1e-3, paired=True, k=1, mirror=True,
                        positive_ratio=0.5),
    "mirror-pp25": dict(r="adaptive", mean_rule="fixed-linear", var_floor=1e-3, paired=True, k=1, mirror=True,
                        positive_ratio=0.25),
    "mirror-pp10": dict(r="adaptive", mean_rule="fixed-linear", var_floor=1e-3, paired=True, k=1, mirror=True,
                        positive_ratio=0.1),
    "mirror-floor1e-2": dict(r="adaptive", mean_rule="fixed-linear", var_floor=1e-2, paired=True, k=1, mirror=True),
    "mirror-pp25-floor1e-2": dict(r="adaptive", mean_rule="fixed-linear", var_floor=1e-2, paired=True, k=1,
                                  mirror=True, positive_ratio=0.25),
    "openai-es": dict(population=True, pairs=20, sigma=0.1, lr=0.1, l2=0.005),
}
EVAL_STARTS = [10**6 + i for i in range(10)]


def centred_ranks(x: np.ndarray) -> np.ndarray:
    """Utilities in [−0.5, 0.5] by rank: the best gets 0.5, whatever the returns' scale."""
    ranks = np.empty(len(x))
    ranks[np.argsort(x)] = np.arange(len(x))
    return ranks / (len(x) - 1) - 0.5


def run_population(variant: str, seed: int, steps: int, eval_every: int = 100) -> dict:
    """The synchronous OpenAI-ES reference: a population's rank-shaped gradient estimate, Adam steps."""
    v = VARIANTS[variant]
    obs_dim, act_dim, max_action, _ = env_dims(ENV)
    actor = NumpyActor(obs_dim, act_dim, max_action, HIDDEN, "tanh")
    mu = init_actor_params(obs_dim, act_dim, max_action, HIDDEN, "tanh", seed=seed).astype(np.float64)
    rng = np.random.default_rng(seed)
    m, s2, b1, b2 = np.zeros_like(mu), np.zeros_like(mu), 0.9, 0.999
    stored, gen, t0 = 0, 0, time.monotonic()
    curve, next_eval = [], 0

    def evaluate() -> float:
        actor.set_params(mu.astype(np.float32))
        return float(np.mean([run_episodes(ENV, actor, k=1, seed=s, store=False).returns[0] for s in EVAL_STARTS]))

    while stored < steps:
        if stored >= next_eval:
            curve.append((stored, evaluate()))
            next_eval += eval_every * 200  # the same spacing in stored steps as the one-result variants
        eps = rng.standard_normal((v["pairs"], mu.size))
        rets = np.empty(2 * v["pairs"])
        for i in range(v["pairs"]):
            start = int(rng.integers(2**31))
            for j, sign in enumerate((1.0, -1.0)):
                actor.set_params((mu + sign * v["sigma"] * eps[i]).astype(np.float32))
                ep = run_episodes(ENV, actor, k=1, seed=start, store=False)
                stored += ep.lengths[0]
                rets[2 * i + j] = ep.returns[0]
        u = centred_ranks(rets)
        grad = (u[0::2] - u[1::2]) @ eps / (2 * v["pairs"] * v["sigma"]) - v["l2"] * mu
        gen += 1
        m = b1 * m + (1 - b1) * grad
        s2 = b2 * s2 + (1 - b2) * grad**2
        mu = mu + v["lr"] * (m / (1 - b1**gen)) / (np.sqrt(s2 / (1 - b2**gen)) + 1e-8)  # ascent
    curve.append((stored, evaluate()))
    last = [f for x, f in curve if x >= 0.9 * stored] or [curve[-1][1]]
    return {"variant": variant, "seed": seed, "steps": stored, "interactions": stored,
            "f_mu_start": curve[0][1], "f_mu_final": float(np.mean(last)), "best": max(f for _, f in curve),
            "sigma_final": float(v["sigma"]), "p_mean": float("nan"), "r_final": float("nan"),
            "generations": gen, "seconds": time.monotonic() - t0, "curve": curve}


def run(variant: str, seed: int, steps: int, eval_every: int = 100) -> dict:
    v = VARIANTS[variant]
    if v.get("population"):
        return run_population(variant, seed, steps, eval_every)
    obs_dim, act_dim, max_action, _ = env_dims(ENV)
    actor = NumpyActor(obs_dim, act_dim, max_action, HIDDEN, "tanh")
    mu0 = init_actor_params(obs_dim, act_dim, max_action, HIDDEN, "tanh", seed=seed)
    dist = make_distribution("aesrl", mu0, mean_rule=v["mean_rule"], var_rule="adaptive", r=v["r"],
                             var_init=1e-3, var_floor=v["var_floor"], positive_ratio=v.get("positive_ratio", 1.0))
    rng = np.random.default_rng(seed)
    stored, interactions, jobs, t0 = 0, 0, 0, time.monotonic()
    curve, ps = [], []

    def evaluate() -> float:
        actor.set_params(dist.mean)
        return float(np.mean([run_episodes(ENV, actor, k=1, seed=s, store=False).returns[0] for s in EVAL_STARTS]))

    curve.append((0, evaluate()))
    while stored < steps:
        s = int(rng.integers(2**31))
        z = dist.sample(s)
        if v.get("mirror"):
            # antithetic pair from one start state, both stored: z' = 2μ − z, and f(μ) is estimated
            # as the mean of the pair, so no episode is spent on μ alone
            z2 = (2.0 * dist.mean.astype(np.float64) - z).astype(np.float32)
            rets = []
            for zz in (z, z2):
                actor.set_params(zz)
                ep = run_episodes(ENV, actor, k=1, seed=s, store=False)
                stored += ep.lengths[0]
                interactions += ep.lengths[0]
                rets.append(ep.returns[0])
            f_hat = float(np.mean(rets))
            order = sorted(range(2), key=lambda i: rets[i])  # the loser first: it leaves μ where it is
            for i in order:
                ps.append(dist.tell((z, z2)[i], rets[i], f_hat))
            jobs += 1
            if jobs % max(1, eval_every // 2) == 0:
                curve.append((stored, evaluate()))
            continue
        n_starts = v.get("starts", 1)
        actor.set_params(z)
        ep = run_episodes(ENV, actor, k=n_starts, seed=s, store=False)
        actor.set_params(dist.mean)
        ev = run_episodes(ENV, actor, k=v["k"] * n_starts, seed=s if v["paired"] else s + 1, store=False)
        stored += sum(ep.lengths)
        interactions += sum(ep.lengths) + sum(ev.lengths)
        ps.append(dist.tell(z, float(np.mean(ep.returns)), float(np.mean(ev.returns))))
        jobs += 1
        if jobs % eval_every == 0:
            curve.append((stored, evaluate()))
    last = [f for x, f in curve if x >= 0.9 * stored] or [curve[-1][1]]
    return {"variant": variant, "seed": seed, "steps": stored, "interactions": interactions,
            "f_mu_start": curve[0][1], "f_mu_final": float(np.mean(last)), "best": max(f for _, f in curve),
            "sigma_final": float(np.sqrt(dist.var).mean()), "p_mean": float(np.mean(ps)),
            "r_final": float(dist.r), "seconds": time.monotonic() - t0, "curve": curve}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20,000 steps, one seed, four variants (seconds)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON output (default bench/results/es_rules.json; --quick: a temporary folder)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.variants = "0", 20_000, "paper,linear,mirror-pp25,openai-es"
    seeds = [int(s) for s in args.seeds.split(",") if s]
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; known: {', '.join(VARIANTS)}")
    out = args.out or (Path(tempfile.mkdtemp(prefix="es-rules-")) / "es_rules.json" if args.quick
                       else ROOT / "bench" / "results" / "es_rules.json")
    rows = []
    for v in variants:
        for seed in seeds:
            row = run(v, seed, args.steps, eval_every=20 if args.quick else 100)
            rows.append(row)
            print(f"  {v} seed {seed}: f(μ) {row['f_mu_start']:7.0f} -> {row['f_mu_final']:7.0f} "
                  f"(best {row['best']:5.0f}), σ {row['sigma_final']:.4f}, mean p {row['p_mean']:.2f}, "
                  f"{row['seconds']:.0f} s", flush=True)
    print(f"\n{ENV}, ES alone, {args.steps:,} stored steps, actor {HIDDEN}; f(μ): mean return of μ on 10 fixed "
          "start states, averaged over the last tenth of the run; ± std over seeds")
    w = max(9, *(len(v) for v in variants))
    print(f"{'variant':>{w}} | {'seeds':>5} | {'f(μ) start':>11} | {'f(μ) final':>12} | {'best':>6} | {'σ final':>8} | "
          f"{'mean p':>6} | {'interactions/step':>17}")
    ref = None
    for v in variants:
        rs = [r for r in rows if r["variant"] == v]
        fin = [r["f_mu_final"] for r in rs]
        ref = np.mean(fin) if ref is None else ref
        print(f"{v:>{w}} | {len(rs):>5} | {np.mean([r['f_mu_start'] for r in rs]):>11.0f} | "
              f"{np.mean(fin):>6.0f} ± {np.std(fin):<4.0f} | {np.mean([r['best'] for r in rs]):>6.0f} | "
              f"{np.mean([r['sigma_final'] for r in rs]):>8.4f} | {np.mean([r['p_mean'] for r in rs]):>6.2f} | "
              f"{np.mean([r['interactions'] / r['steps'] for r in rs]):>17.1f}")
    print("target (issue 14): mean f(μ) ≥ −400 within 1M stored steps over 3 seeds")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Incremental: rows of other (variant, seed) pairs already in the file at this budget are kept.
    kept = []
    if out.exists():
        old = json.loads(out.read_text())
        if old.get("steps") == args.steps:
            done = {(r["variant"], r["seed"]) for r in rows}
            kept = [r for r in old.get("rows", []) if (r["variant"], r["seed"]) not in done]
    out.write_text(json.dumps({"env": ENV, "hidden": HIDDEN, "steps": args.steps, "rows": kept + rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
