"""Learning benchmark: AES-RL (adaptive and paper r) against our TD3, serial CEM-RL and SB3's TD3.

Full mode runs HalfCheetah-v5 and Hopper-v5 at 100,000 stored steps with seeds 1, 2, 3 for the
algorithms `aesrl` (the default), `aesrl-paper` (the paper's r and returns: `--r paper --fitness-shift 0`), `td3`, `cemrl` and
`sb3-td3` (Stable-Baselines3's TD3 with our TD3's settings, bench/sb3_td3.py), and `--algo es` on
Pendulum-v1 at 1,000,000 stored steps (target: mean f(μ) ≥ −400). Every algorithm of an environment
shares the same networks (actor 256-256, critic 256-256) and the paper's 10,000 random steps; queue
runs use 2 workers. Not the paper's 400-300: on one thread a 400-300 twin critic trains at ~50
steps/s here, so one 100k cell took over 30 minutes for the critic alone; 256-256 (our TD3's and
the official CEM-RL TD3 config's size) halves that, for every algorithm alike.

Each (env, algo, seed) cell is one subprocess (`python -m cli.main run ...`, or bench/sb3_td3.py)
writing a run folder. As soon as a cell finishes, one row is appended to learning.json, and a rerun
skips the cells already there, so the table fills over several sittings. A failed or timed-out cell
is reported and not recorded.

Layout (OUT = bench/results; --quick: a new temporary folder unless --out-dir is given):
    OUT/learning.json                          {"rows": [row, ...]}, one row per finished cell
    OUT/learning/<env>/<algo>-s<seed>/         run folder (git-ignored), beside it .log and .config.json
    OUT/learning-repeats.json                  --repeat: rows of cells run again ("counts": true for the
                                               main algorithms), the report's every-run table
    OUT/learning/<env>/<algo>-s<seed>-r<time>/ --repeat: that run's folder
    OUT/learning/curves-<env>.png              f(μ) against stored steps, wall clock and interactions
    OUT/learning/curves-<env>-variants.png     the same for the variants, beside the default
A row: {"env", "algo", "seed", "budget_steps", "interactions", "final", "q25", "q50", "wall_s"} where
final/qNN = mean f(μ) over the last tenth of [0, NN % of budget_steps] of stored steps (μ evaluations of
the run folder; for td3 and sb3-td3 the deterministic actor, 5 episodes every 5,000 steps) and
interactions = every environment step, f(μ) evaluation episodes included; plus "steps", "curve"
([stored steps, interactions, elapsed s, f(μ)], block means, at most 200 points), "settings",
"command", "date", "commit", "versions" (of mujoco, gymnasium, torch, numpy and SB3), "loadavg_start",
"loadavg_end", "cores"; HalfCheetah rows also "final_posture" ({"turned_over": share of steps on its
back, "speed", "return"} of the final policy over 3 episodes: a cheetah on its back is the ~1 500 plateau).

Usage:
    python bench/learning.py                       run every missing cell (seed-major), then report
    python bench/learning.py --max-hours 2.5       ... but start no new cell after 2.5 hours
    python bench/learning.py --cells Hopper-v5:td3:1,Hopper-v5:aesrl:1
    python bench/learning.py --envs Hopper-v5 --algos aesrl,td3 --seeds 1,2
    python bench/learning.py --report              tables and plots from learning.json only
    python bench/learning.py --cells HalfCheetah-v5:td3:2 --repeat --note "why"   run a cell again
    python bench/learning.py --postures            HalfCheetah rows' final policies: upright or on the back
    python bench/learning.py --quick               tiny Pendulum-v1 budget, temporary folder
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

RESULTS = ROOT / "bench" / "results"
ALGOS = ("aesrl", "aesrl-paper", "td3", "cemrl", "sb3-td3", "es")
# `aesrl-queue run` options of each algorithm (sb3-td3 runs bench/sb3_td3.py instead).
RUN_ARGS = {
    "aesrl": ["--algo", "aesrl"],
    "aesrl-paper": ["--algo", "aesrl", "--r", "paper", "--fitness-shift", "0"],
    "td3": ["--algo", "td3"],
    "cemrl": ["--algo", "cemrl"],
    "es": ["--algo", "es"],
}
# Variants of the default AES-RL, run only when named (--cells or --algos): each changes one thing, so a
# row next to `aesrl` on the same seed shows what that one thing does (docs/performance.md §3).
# name -> (`aesrl-queue run` options, RunConfig fields given through --config). The AES-RL variants
# measured before r_kinds = "es" became aesrl's default keep r_kinds = "all" (R_ALL), so that a rerun
# of one of their cells runs what its row records.
R_ALL = {"r_kinds": "all"}
VARIANTS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "aesrl-fixed-linear": (["--algo", "aesrl", "--mean-rule", "fixed-linear"], R_ALL),
    "aesrl-rl80": (["--algo", "aesrl", "--rl-ratio", "0.8"], R_ALL),
    "aesrl-mean5": (["--algo", "aesrl"], {**R_ALL, "mean_eval_episodes": 5, "mean_eval_paired": False}),
    "aesrl-rl-no-var": (["--algo", "aesrl"], {**R_ALL, "rl_var_update": False}),
    # RL jobs train the paper's sum of the last 10 episode lengths (10 000 here) instead of the default
    # 2 000: five actor steps per stored step overall, where the default makes one and TD3 0.5
    "aesrl-rl10k": (["--algo", "aesrl"], {**R_ALL, "rl_steps_max": 10_000}),
    # the paper's (1+1)-ES with RL individuals: μ jumps to a better individual (p is 0 or 1), and the
    # variance follows the success rule, so an RL individual's distance from μ never widens it
    "opo": (["--algo", "opo"], {}),
    # the paper's asynchronous, rank-based CEM on the same runtime (Table 2): μ moves a tenth of the way
    # to the weighted mean of the best 5 of the last 10 individuals. CEM-RL's μ on Hopper (seed 2,
    # a diagnostic rerun) stayed a policy that hops and falls (f(μ) 375-711) for 60k steps while its RL
    # members learned to hop (single episodes to 2895 over 60-70k); aesrl's sharp selection of one
    # result at a time finds standing (1000) by 20-30k and stays there
    "acemrl": (["--algo", "acemrl"], {}),
    # the paper's p_positive (Eq. 10) at 0.25: μ moves at most a quarter of the way to any individual.
    # On Hopper aesrl's μ stands by 20-30k: ES individuals that stay up longer than μ are many r above
    # it and move μ with p 0.8-0.9, where CEM-RL's μ, a share of the way to a generation's best half,
    # stayed a policy that hops and falls until its RL members learned to hop (docs/performance.md §3)
    "aesrl-pp25": (["--algo", "aesrl"], {"positive_ratio": 0.25}),
    # returns judged with the survival bonus, as the paper does (fitness_shift 0; aesrl's default before
    # the twelfth sitting, whose Hopper rows carry renamed_from "aesrl"): on Hopper standing still for
    # 1 000 steps then beats every policy that hops and falls, and every seed stood by 20-40k. On
    # HalfCheetah, which pays no survival bonus, it is the default itself, so it has no rows there
    "aesrl-bonus": (["--algo", "aesrl"], {"fitness_shift": 0.0}),
    # the critic learns the environment's rewards (critic_shift false; aesrl's default before the thirteenth
    # sitting, whose Hopper rows carry renamed_from "aesrl"): it values staying up, and Hopper's RL jobs
    # learned to stand (1 000 steps, returns 1 000-1 060), which the shifted rule scores 220-260 below a
    # μ that hops for 200 steps. On HalfCheetah, which pays no survival bonus, it is the default itself
    "aesrl-critic-env": (["--algo", "aesrl"], {"critic_shift": False}),
    # the fixed-linear mean rule on the then default (fitness_shift "alive", critic_shift false): p = Δ/r
    # for an individual above μ, 0 for one below. Baseline-relative gives an individual no better than μ
    # p = 0.5 and one up to r below it p > 0, so μ also walks towards its worse neighbours
    # (aesrl-fixed-linear measured this rule under r_kinds "all" before critic_lag, one seed)
    "aesrl-linear": (["--algo", "aesrl", "--mean-rule", "fixed-linear"], {"critic_shift": False}),
    # σ never below 0.01 (var_floor 1e-4; CEM-RL's members were at σ 0.008-0.017 on Hopper) on the then
    # default: ES individuals at the paper's floor (0.003) store near-identical episodes of μ, so the
    # critic sees little spread of actions; aesrl-floor1e-4 measured it with the survival bonus
    "aesrl-floor1e-4-alive": (["--algo", "aesrl"], {"var_floor": 1e-4, "critic_shift": False}),
    # RL individuals judged on two start states (rl_eval_pairs 2: z and μ once more, unstored) on today's
    # default: a trained RL individual lies 10-15 from μ, so one episode in which μ happens to fall lets
    # an individual that falls elsewhere take μ half the way or more (Hopper seed 1's final μ scored 971
    # after a median f(μ) of 1980 over 90-100k, docs/performance.md §3, the thirteenth sitting)
    "aesrl-rl-pairs2": (["--algo", "aesrl"], {"rl_eval_pairs": 2}),
    # today's default with 14 workers instead of 2 (the GPU run): every result meets a μ that
    # has moved more since its individual was drawn; on 2 cores the jobs take 7× as long in wall clock,
    # but the staleness in versions, what the update rule sees, is like the GPU run's
    "aesrl-w14": (["--algo", "aesrl"], {"critic_lag_room": True, "random_cap": False}),
    # ... with random_cap (no more random episodes than initial_steps, counting those in flight)
    "aesrl-w14-cap": (["--algo", "aesrl"], {"critic_lag_room": True, "random_cap": True}),
    # ... and also without critic_lag_room: the lag gate opens to a burst of jobs drawn from one μ
    "aesrl-w14-burst-cap": (["--algo", "aesrl"], {"critic_lag_room": False, "random_cap": True}),
    "aesrl-w14-burst": (["--algo", "aesrl"], {"critic_lag_room": False, "random_cap": False}),
    # random_cap at 2 workers, with and without critic_lag_room
    "aesrl-cap": (["--algo", "aesrl"], {"critic_lag_room": True, "random_cap": True}),
    "aesrl-lag-burst-cap": (["--algo", "aesrl"], {"critic_lag_room": False, "random_cap": True}),
    "aesrl-lag-burst": (["--algo", "aesrl"], {"critic_lag_room": False, "random_cap": False}),
    "aesrl-lag-room": (["--algo", "aesrl"], {"critic_lag_room": True, "random_cap": False}),
    "aesrl-fixed-linear-rl-no-var": (["--algo", "aesrl", "--mean-rule", "fixed-linear"],
                                     {**R_ALL, "rl_var_update": False}),
    # the published code: jobs never wait for the critic, which on a CPU falls far behind the replay
    "aesrl-no-lag": (["--algo", "aesrl"], {**R_ALL, "critic_lag": 0}),
    # a variance floor of 1e-4 (σ 0.01) instead of the paper's 1e-5 (σ 0.003): on Hopper's stand-still
    # plateau ES individuals at the floor store near-identical episodes, and RL individuals trained on
    # that narrow data fall within tens of steps
    "aesrl-floor1e-4": (["--algo", "aesrl"], {**R_ALL, "var_floor": 1e-4}),
    # σ never below var_init's 0.03 (CEM-RL's initial spread): on Hopper the ES individuals at the
    # paper's floor (σ 0.003) return within a few points of μ and store near-identical episodes, so the
    # critic sees no spread of actions around μ's and every RL individual trained on it falls
    # (Hopper seed 3: median gap -700, none above μ after 15k steps)
    "aesrl-floor1e-3": (["--algo", "aesrl"], {**R_ALL, "var_floor": 1e-3}),
    # the adaptive r from every told gap, RL individuals' included: aesrl's default until the sixth
    # sitting. On Hopper's plateau RL gaps near −800 beside ES gaps near 0 made r grow to 300–430, and
    # RL individuals a few hundred below μ then moved it (aesrl-floor1e-3 seed 3: μ 1074 → 254)
    "aesrl-r-all": (["--algo", "aesrl"], R_ALL),
    # ES jobs as antithetic pairs (es_antithetic): no μ episode for them, about 1.5 interactions per
    # stored step instead of 2
    "aesrl-antithetic": (["--algo", "aesrl"], {**R_ALL, "es_antithetic": True}),
    # TD3's exploration noise (0.1 of the action bound) on every ES individual's stored episode and on
    # its paired f(μ) episode (same draws); RL jobs, and the reported f(μ), stay noise-free. On Hopper's
    # stand-still plateau the replay otherwise holds the deterministic actions of near-identical
    # policies, and bench/rl_probe.py found the critic rating every trained actor above μ while each
    # one fell
    "aesrl-action-noise": (["--algo", "aesrl"], {"action_noise": 0.1}),
    # twice that noise: on Hopper the one seed of three that never stood still (0.1, seed 3: episodes
    # of 150-400 steps to 70k, single μ episodes up to 3350 at the end) took CEM-RL's path off the plateau
    "aesrl-action-noise2": (["--algo", "aesrl"], {"action_noise": 0.2}),
    # three times that noise: of six noisy Hopper runs, the two that never stood still (0.1 seed 3, 0.2
    # seed 2) ended highest (1448, 1828); more noise makes standing harder to find and keep
    "aesrl-action-noise3": (["--algo", "aesrl"], {"action_noise": 0.3}),
    # and a trust region for RL jobs: training stops once the actions moved 0.3 of the bound (RMS) from
    # the sampled individual's, at actor lr 1e-4 (about 12 steps against a Hopper critic). Without it
    # an RL job on Hopper's plateau saturates its actions (one fresh-Adam step at lr 1e-3 moves them
    # 0.32 of the bound, 500 steps 0.8), ends ~15 from μ in parameter norm and falls
    "aesrl-noise-tr": (["--algo", "aesrl"], {"action_noise": 0.1, "rl_action_limit": 0.3, "actor_lr": 1e-4}),
    # RL individuals told with the (1+1) rule: μ jumps to one that beat its f(μ) and ignores a worse one,
    # and the variance stays. HalfCheetah seed 3 (30k-step probe): an RL individual 16 above μ (-158)
    # told with p 0.53 left μ at -204, worse than both, and one 67 below μ still got p 0.24
    "aesrl-rl-jump": (["--algo", "aesrl"], {"rl_jump": True}),
    # σ 0.01 at the start instead of the paper's 0.032 (var_init 1e-3): on HalfCheetah ES individuals at
    # 0.032 lie 8.5 from μ and scored 175-250 below it in six of eight jobs of seed 3's first quarter;
    # with p = 0 the variance is never updated, so ES jobs kept sampling there until μ first moved at 22k
    "aesrl-var1e-4": (["--algo", "aesrl"], {"var_init": 1e-4}),
    # RL jobs continue one persistent actor and the critic learns that actor's Q (TD3 fed by every job's
    # episodes) instead of a fresh sample climbing a critic of μ: on Hopper every default run stands
    # still by 20-30k steps, where RL individuals 14-15 from μ fall (gaps near -1000) and ES ones at σ
    # 0.0034 stand (gaps ±5), so nothing moves μ off the plateau
    "aesrl-rl-actor": (["--algo", "aesrl"], {"rl_actor": True}),
    # pair_shift for single ES individuals: one drawn before μ moved is told by its offset from the μ it
    # came from. Hopper aesrl-rl-actor seed 3: an ES individual told after μ moved 63 towards the actor
    # took σ from 0.0035 to 0.113, and ES individuals fell for the next 13k steps
    "aesrl-shift": (["--algo", "aesrl"], {"pair_shift": True}),
    "aesrl-rl-actor-shift": (["--algo", "aesrl"], {"rl_actor": True, "pair_shift": True}),
    # RL jobs also evaluate the points half and three quarters of the way from μ to their trained z and
    # report the best of the three: on HalfCheetah at 30k steps (bench/rl_probe.py --interpolate) two
    # trained z scored 313 and 567 with μ at 12, the points at t = 0.75 587 and 771, at 0.5 192 and 360
    "aesrl-line": (["--algo", "aesrl"], {"rl_line": [0.5, 0.75, 1.0]}),
    # the same, storing the reported point's episode only (the others are interactions, as f(μ) episodes
    # are): aesrl-line made each HalfCheetah RL job 3 000 stored steps, and μ moved 24 times in 100k
    "aesrl-line-best": (["--algo", "aesrl"], {"rl_line": [0.5, 0.75, 1.0], "rl_line_store": "best"}),
    # RL gaps count towards the adaptive scale until it has five ES gaps: on HalfCheetah that takes ~10
    # jobs, and RL individuals above μ before then leave it where it is (aesrl-line seed 3: +124 at 32k)
    "aesrl-lend": (["--algo", "aesrl"], {"r_lend_rl": True}),
    # RL individuals judged on the spread of RL gaps, ES ones on that of ES gaps: on Hopper's plateau ES
    # gaps shrink to ±1 (r 0.1-0.9, aesrl-line seed 3), and RL individuals 5-46 above μ on one episode
    # got p 0.88-0.99 and moved μ all the way; the last such move took f(μ) from 1055 to ~450
    "aesrl-r-own": (["--algo", "aesrl"], {"r_kinds": "own"}),
    # two CEM-RL settings that differ from aesrl's, one at a time, on the default rules (r_kinds "es"): RL
    # individuals trained for the paper's 10 000 actor steps (CEM-RL's RL members train up to as many),
    # and ES individuals never nearer μ than σ 0.03 (CEM-RL's damping and elite spread kept its members
    # at σ 0.008-0.017 on Hopper, aesrl's floor lets them shrink to 0.003). CEM-RL leaves Hopper's
    # stand-still plateau on two seeds of three after 50k steps; the default never does. aesrl-rl10k and
    # aesrl-floor1e-3 measured the same settings under r_kinds "all", where RL individuals far below μ
    # still moved it
    "aesrl-rl10k-es": (["--algo", "aesrl"], {"rl_steps_max": 10_000}),
    "aesrl-floor-es": (["--algo", "aesrl"], {"var_floor": 1e-3}),
    # Pendulum-v1: ES alone with one paired μ episode per job (the es default before antithetic jobs)
    "es-mu-episode": (["--algo", "es"], {"es_antithetic": False, "positive_ratio": 1.0, "var_init": 1e-3,
                                         "var_floor": 1e-3}),
    # Pendulum-v1: antithetic ES jobs with p_positive 1.0 (the es default before p_positive 0.25)
    "es-pp100": (["--algo", "es"], {"positive_ratio": 1.0, "pair_shift": False, "var_init": 1e-3, "var_floor": 1e-3}),
    # Pendulum-v1: p_positive 0.25 at σ 0.03, without pair_shift (a late pair pulls μ towards z, the
    # paper's rule) and with it; the es default has both and σ 0.1
    "es-no-shift": (["--algo", "es"], {"pair_shift": False, "var_init": 1e-3, "var_floor": 1e-3}),
    "es-floor1e-3": (["--algo", "es"], {"var_init": 1e-3, "var_floor": 1e-3}),
}
# The aesrl variants measured before fitness_shift = "alive" became aesrl's default (the twelfth sitting)
# compared returns with the survival bonus; they keep it, so that a rerun of one of their Hopper cells runs
# what its row records (HalfCheetah pays no bonus, so nothing changes there).
WITH_BONUS = ("aesrl-fixed-linear", "aesrl-rl80", "aesrl-mean5", "aesrl-rl-no-var", "aesrl-rl10k", "aesrl-pp25",
              "aesrl-fixed-linear-rl-no-var", "aesrl-no-lag", "aesrl-floor1e-4", "aesrl-floor1e-3", "aesrl-r-all",
              "aesrl-antithetic", "aesrl-action-noise", "aesrl-action-noise2", "aesrl-action-noise3",
              "aesrl-noise-tr", "aesrl-rl-jump", "aesrl-var1e-4", "aesrl-rl-actor", "aesrl-shift",
              "aesrl-rl-actor-shift", "aesrl-line", "aesrl-line-best", "aesrl-lend", "aesrl-r-own",
              "aesrl-rl10k-es", "aesrl-floor-es")
for _name in WITH_BONUS:
    VARIANTS[_name] = (VARIANTS[_name][0], {**VARIANTS[_name][1], "fitness_shift": 0.0})
ES_VARIANTS = tuple(name for name in VARIANTS if name.startswith("es-"))  # the Pendulum ones


def variants_for(env: str) -> tuple[str, ...]:
    """The named variants an environment runs (only when asked for by name)."""
    if env in MUJOCO:
        return tuple(name for name in VARIANTS if name not in ES_VARIANTS)
    return ES_VARIANTS if env == "Pendulum-v1" else ()

RUN_ARGS.update({name: args for name, (args, _) in VARIANTS.items()})
MUJOCO = ("HalfCheetah-v5", "Hopper-v5")
ROW_FIELDS = ("env", "algo", "seed", "budget_steps", "interactions", "final", "q25", "q50", "wall_s")
MARKS = {"q25": 0.25, "q50": 0.5, "final": 1.0}
ES_TARGET = -400.0  # issue 14: `--algo es` learns Pendulum-v1 to a mean f(μ) ≥ −400 within 1M steps
CURVE_POINTS = 200


@dataclass(frozen=True)
class EnvSettings:
    """What every algorithm of one environment shares; None keeps the project's preset."""

    steps: int  # budget of stored environment steps
    algos: tuple[str, ...]
    hidden: str | None = None  # actor hidden layers
    critic_hidden: str | None = None
    random_steps: int | None = None  # initial_steps (ES, AES-RL, CEM-RL) and td3_start_steps (TD3, SB3)
    eval_every: int = 5000  # td3, sb3-td3: stored steps between evaluations of the deterministic actor
    extra: dict[str, Any] = field(default_factory=dict)  # other RunConfig fields (quick mode)
    timeout_min: float = 90.0  # a cell still running after this is killed and not recorded

    def describe(self) -> str:
        parts = [f"{self.steps:,} stored steps"]
        if self.hidden:
            parts.append(f"actor {self.hidden.replace(',', '-')}, critic {self.critic_hidden.replace(',', '-')}")
        else:
            parts.append("the project's preset networks")
        if self.random_steps is not None:
            parts.append(f"{self.random_steps:,} random steps for every algorithm")
        if "td3" in self.algos or "sb3-td3" in self.algos:
            parts.append(f"TD3/SB3 f(μ) every {self.eval_every:,} steps")
        parts += [f"{k}={v}" for k, v in self.extra.items()]
        return "; ".join(parts)


PAPER = dict(hidden="256,256", critic_hidden="256,256", random_steps=10_000, eval_every=5000)
MODES: dict[str, dict[str, EnvSettings]] = {
    "full": {
        "HalfCheetah-v5": EnvSettings(100_000, ALGOS[:5], **PAPER),
        "Hopper-v5": EnvSettings(100_000, ALGOS[:5], **PAPER),
        "Pendulum-v1": EnvSettings(1_000_000, ("es",)),  # the ES alone, with the Pendulum preset
    },
    "quick": {
        "Pendulum-v1": EnvSettings(1_200, ("aesrl", "td3", "cemrl", "sb3-td3", "es"), hidden="16,16",
                                   critic_hidden="32,32", random_steps=400, eval_every=200, timeout_min=3.0,
                                   extra={"batch_size": 32, "critic_chunk": 50, "rl_steps_max": 100}),
    },
}
FULL_SEEDS = (1, 2, 3)
WORKERS = 2
WORKERS_OF = {"aesrl-w14": 14, "aesrl-w14-cap": 14, "aesrl-w14-burst-cap": 14, "aesrl-w14-burst": 14}  # variants that run another number of workers


@dataclass(frozen=True)
class Cell:
    env: str
    algo: str
    seed: int

    def __str__(self) -> str:
        return f"{self.env}:{self.algo}:{self.seed}"


# -- which cells ---------------------------------------------------------------------------------------
def select_cells(settings: dict[str, EnvSettings], envs: list[str], algos: list[str], seeds: list[int],
                 order: str) -> list[Cell]:
    cells = [Cell(env, algo, seed) for env, s in settings.items() if not envs or env in envs
             for algo in (*s.algos, *variants_for(env))
             if (algo in algos if algo in VARIANTS else not algos or algo in algos) for seed in seeds]
    if order == "seed":  # seed 1 of every env and algo first: a partial bench still covers everything
        cells.sort(key=lambda c: c.seed)  # stable: env and algo keep their order within a seed
    return cells


def parse_cells(text: str, settings: dict[str, EnvSettings]) -> list[Cell]:
    cells = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        try:
            env, algo, seed = item.split(":")
            cell = Cell(env, algo, int(seed))
        except ValueError:
            raise SystemExit(f"--cells: expected env:algo:seed, got {item!r}") from None
        if env not in settings or (algo not in settings[env].algos and algo not in variants_for(env)):
            known = ", ".join(f"{e}:{{{','.join(s.algos)}}}" for e, s in settings.items())
            raise SystemExit(f"--cells: {item!r} is not a cell of this mode; known: {known}")
        cells.append(cell)
    return cells


# -- learning.json ---------------------------------------------------------------------------------------
def load_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return data["rows"] if isinstance(data, dict) else data


def update_rows(path: Path, change: Callable[[list[dict[str, Any]]], bool]) -> None:
    """Read the file's rows, let `change` edit the list in place, and write them back if it says it
    changed them. Under an exclusive lock, so that two sittings run side by side (say SB3 cells beside
    queue cells) cannot drop each other's rows by reading before the other's write; written to a
    temporary file and renamed, so an interrupted write loses nothing. Other keys (an "about") are kept."""
    with open(path.with_suffix(".json.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text()) if path.exists() else {}
        data = data if isinstance(data, dict) else {"rows": data}
        data.setdefault("rows", [])
        if change(data["rows"]):
            tmp = path.with_suffix(f".json.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, default=_json_default) + "\n")
            os.replace(tmp, path)


def append_row(path: Path, row: dict[str, Any]) -> None:
    """Append one row (see update_rows)."""
    def add(rows: list[dict[str, Any]]) -> bool:
        rows.append(row)
        return True

    update_rows(path, add)


def row_key(env: str, algo: str, seed: int, budget: int) -> tuple[str, str, int, int]:
    return (env, algo, int(seed), int(budget))


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


# -- one cell --------------------------------------------------------------------------------------------
def cell_command(cell: Cell, s: EnvSettings, env_dir: Path, cfg_file: Path | None, suffix: str = "") -> list[str]:
    name = f"{cell.algo}-s{cell.seed}{suffix}"
    if cell.algo == "sb3-td3":
        cmd = [sys.executable, str(ROOT / "bench" / "sb3_td3.py"), "--env", cell.env, "--seed", str(cell.seed),
               "--steps", str(s.steps), "--out", str(env_dir / name), "--eval-every", str(s.eval_every)]
        if s.random_steps is not None:
            cmd += ["--start-steps", str(s.random_steps)]
    else:
        cmd = [sys.executable, "-m", "cli.main", "run", "--env", cell.env, *RUN_ARGS[cell.algo],
               "--seed", str(cell.seed), "--steps", str(s.steps), "--workers", str(WORKERS_OF.get(cell.algo, WORKERS)),
               "--out", str(env_dir), "--run-id", name]
    if s.hidden:
        cmd += ["--hidden", s.hidden, "--critic-hidden", s.critic_hidden]
    if cfg_file is not None:
        cmd += ["--config", str(cfg_file)]
    return cmd


def cell_config(cell: Cell, s: EnvSettings) -> dict[str, Any]:
    """RunConfig fields given through --config: the shared random phase, TD3's evaluation period, extras."""
    cfg = dict(s.extra)
    if cell.algo in VARIANTS:
        cfg.update(VARIANTS[cell.algo][1])
    if s.random_steps is not None:
        cfg.update(initial_steps=s.random_steps, td3_start_steps=s.random_steps)
    if cell.algo in ("td3", "sb3-td3"):
        cfg["td3_eval_every"] = s.eval_every
    if cfg and cell.algo != "sb3-td3":
        cfg["env_id"] = cell.env  # `--config FILE` needs the environment in the file
    return cfg


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the cell's process group (the run stops its workers, critic and Redis), SIGKILL after 30 s."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            pass


def run_cell(cell: Cell, s: EnvSettings, runs_dir: Path, suffix: str = "") -> tuple[Path, float, str, list[str]]:
    """Run one cell in its own process group; returns (run folder, wall s, outcome, command).
    `suffix` names a repeat's folder apart from the cell's own."""
    env_dir = runs_dir / cell.env
    env_dir.mkdir(parents=True, exist_ok=True)
    name = f"{cell.algo}-s{cell.seed}{suffix}"
    folder, log_path = env_dir / name, env_dir / f"{name}.log"
    if folder.exists():  # left by a failed or interrupted attempt
        shutil.rmtree(folder)
    cfg = cell_config(cell, s)
    cfg_file = None
    if cfg:
        cfg_file = env_dir / f"{name}.config.json"
        cfg_file.write_text(json.dumps(cfg))
    cmd = cell_command(cell, s, env_dir, cfg_file, suffix)
    env_vars = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env_vars.pop("AESRL_REDIS_URL", None)  # every cell starts its own embedded Redis
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env_vars, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=s.timeout_min * 60)
            outcome = "ok" if rc == 0 else f"exit {rc}"
        except subprocess.TimeoutExpired:
            kill_group(proc)
            outcome = f"timed out after {s.timeout_min:g} min"
        except BaseException:  # Ctrl-C or SIGTERM of the bench: take the cell down with it
            kill_group(proc)
            raise
    return folder, time.monotonic() - t0, outcome, cmd


# -- reading a finished run ------------------------------------------------------------------------------
def window_mean(xs: np.ndarray, ys: np.ndarray, x: float) -> float:
    """Mean of ys over the last tenth of [0, x] of xs (xs sorted); the last value before x when that
    tenth is empty; NaN when nothing came before x. Evaluations after the budget (jobs that were
    running when it ran out) never count."""
    inside = (xs >= 0.9 * x) & (xs <= x)
    if inside.any():
        return float(ys[inside].mean())
    before = xs <= x
    return float(ys[before][-1]) if before.any() else math.nan


def thin(points: np.ndarray, n: int = CURVE_POINTS) -> np.ndarray:
    """At most n rows: means of consecutive blocks of rows."""
    if len(points) <= n:
        return points
    return np.vstack([b.mean(axis=0) for b in np.array_split(points, n)])


def summarise(folder: Path, budget: int) -> dict[str, Any]:
    """q25/q50/final, interactions and the thinned curve of one run folder."""
    from cli.plot import load_run

    run = load_run(folder)
    pts = np.array([[e["steps"], e.get("interactions") or np.nan, e.get("elapsed") or np.nan, e["f_mu"]]
                    for e in run.evals], dtype=float)
    out: dict[str, Any] = {k: window_mean(pts[:, 0], pts[:, 3], frac * budget)
                           for k, frac in MARKS.items()}
    summary_path = folder / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    counted = [r.get("interactions") for r in run.updates + run.evals]
    out["interactions"] = int(summary.get("interactions") or max(x for x in counted if x is not None))
    out["steps"] = int(summary.get("steps") or pts[:, 0].max())
    out["n_evals"] = len(pts)
    out["curve"] = [[round(float(v), 3) for v in p] for p in thin(pts)]
    return out


def cheetah_posture(folder: Path, episodes: int = 3) -> dict[str, float]:
    """How the final policy of a HalfCheetah run folder runs: the share of steps with the torso turned
    over (|root angle| > 90°, the cheetah on its back) and the mean forward speed (m/s), over a few
    deterministic episodes. A cheetah running on its back tops out near 1 500 to 2 000: the plateau at
    which some HalfCheetah runs stop (docs/performance.md §3, the sixteenth sitting)."""
    from cli.export import load_policy, numpy_actor

    payload = load_policy(folder)
    return posture_of(numpy_actor(payload), payload["env_id"], payload["env_kwargs"], episodes)


def posture_of(actor: Any, env_id: str, env_kwargs: dict[str, Any] | None = None, episodes: int = 3,
               seed: int = 10**6) -> dict[str, float]:
    """`turned_over` (share of steps on its back), `speed` and `return` of a numpy actor on HalfCheetah;
    episode i resets with seed + i."""
    import gymnasium as gym

    env = gym.make(env_id, **(env_kwargs or {}))
    turned, speed, returns = [], [], []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        ret, done = 0.0, False
        while not done:
            obs, r, term, trunc, _ = env.step(actor.act(np.asarray(obs, dtype=np.float64)))
            ret, done = ret + float(r), term or trunc
            data = env.unwrapped.data
            angle = math.remainder(float(data.qpos[2]), 2 * math.pi)  # rooty, wrapped into [-π, π]
            turned.append(abs(angle) > math.pi / 2)
            speed.append(float(data.qvel[0]))
        returns.append(ret)
    env.close()
    return {"turned_over": round(float(np.mean(turned)), 3), "speed": round(float(np.mean(speed)), 3),
            "return": round(float(np.mean(returns)), 1)}


def row_folder(row: dict[str, Any], runs_dir: Path) -> Path | None:
    """The run folder a row was measured from (from its command's --run-id, or --out for SB3)."""
    words = str(row.get("command", "")).split()
    for flag in ("--run-id", "--out"):
        if flag in words and words.index(flag) + 1 < len(words):
            return runs_dir / row["env"] / Path(words[words.index(flag) + 1]).name
    return None


def add_postures(paths: list[Path], runs_dir: Path) -> int:
    """Give `final_posture` to the HalfCheetah rows whose run folder is still here and that lack it
    (rows written by a sitting that ran before the posture was measured); returns how many got one."""
    added = 0

    def measure(rows: list[dict[str, Any]]) -> bool:
        nonlocal added
        before = added
        for row in rows:
            folder = row_folder(row, runs_dir)
            if (row["env"].startswith("HalfCheetah") and "final_posture" not in row and folder is not None
                    and (folder / "policy.npz").exists()):
                row["final_posture"] = cheetah_posture(folder)
                added += 1
        return added > before

    for path in paths:
        if path.exists():
            update_rows(path, measure)
    return added


def mu_on_fixed_starts(folder: Path, n: int = 10) -> float:
    """The final μ of a run folder (its policy.npz), scored as bench/es_rules.py scores it: the mean
    return over n fixed start states. A run's own f(μ) is a per-job estimate; for antithetic ES jobs it
    is the mean of each pair, which sits below f(μ) wherever perturbing μ costs return."""
    from cli.export import evaluate_policy

    return evaluate_policy(folder, episodes=n, seed=10**6)["mean"]  # episode i resets with seed 10**6 + i


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def package_versions() -> dict[str, str]:
    """The versions a cell's learning depends on beyond the code: the simulator above all (MuJoCo 4.0.0
    came out during the table's sittings, and a row must say which physics it measured)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("mujoco", "gymnasium", "torch", "numpy", "stable-baselines3"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


# -- report ----------------------------------------------------------------------------------------------
def groups(rows: list[dict[str, Any]]) -> dict[tuple[str, int, str], list[dict[str, Any]]]:
    """Rows by (env, budget, algo), in the order of ALGOS."""
    out: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    rank = {a: i for i, a in enumerate(ALGOS)}
    for r in sorted(rows, key=lambda r: (r["env"], r["budget_steps"], rank.get(r["algo"], 99), r["seed"])):
        out.setdefault((r["env"], r["budget_steps"], r["algo"]), []).append(r)
    return out


def mean_std(vals: list[float]) -> str:
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    if not vals:
        return "-"
    return f"{np.mean(vals):.0f} ± {np.std(vals):.0f}" if len(vals) > 1 else f"{vals[0]:.0f}"


def render(head: list[str], body: list[list[str]]) -> str:
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    lines = [" | ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)),
             "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(c.rjust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    return "\n".join(lines)


def table_steps(rows: list[dict[str, Any]]) -> str:
    head = ["env", "algo", "seeds", "stored steps", "interactions", "f(μ) @25%", "@50%", "@100%", "wall min"]
    body = [[env, algo, str(len(rs)), f"{budget:,}", f"{np.mean([r['interactions'] for r in rs]):,.0f}",
             mean_std([r["q25"] for r in rs]), mean_std([r["q50"] for r in rs]), mean_std([r["final"] for r in rs]),
             f"{np.mean([r['wall_s'] for r in rs]) / 60:.1f}"]
            for (env, budget, algo), rs in groups(rows).items()]
    return render(head, body)


def at_interactions(row: dict[str, Any], x: float) -> float:
    """f(μ) of one run over the last tenth of [0, x] environment interactions (NaN if it never got there)."""
    curve = np.array(row["curve"], dtype=float)
    if row["interactions"] < x or not len(curve):
        return math.nan
    ok = np.isfinite(curve[:, 1])
    return window_mean(curve[ok, 1], curve[ok, 3], x)


def table_interactions(rows: list[dict[str, Any]]) -> str:
    """Per env: f(μ) at the interactions the cheapest run reached, and at interactions = the step budget."""
    envs = sorted({(r["env"], r["budget_steps"]) for r in rows})
    lines = []
    for env, budget in envs:
        env_rows = [r for r in rows if r["env"] == env and r["budget_steps"] == budget]
        if len({r["algo"] for r in env_rows}) < 2:
            continue
        cheapest = min(env_rows, key=lambda r: r["interactions"])
        common = cheapest["interactions"]
        marks = sorted({common, budget})
        head = ["env", "algo", "seeds", "interactions at end"] + [f"f(μ) @{m:,} inter." for m in marks]
        body = [[env, algo, str(len(rs)), f"{np.mean([r['interactions'] for r in rs]):,.0f}"]
                + [mean_std([at_interactions(r, m) for r in rs]) for m in marks]
                for (e, b, algo), rs in groups(env_rows).items()]
        lines.append(f"{env}: {common:,} = the fewest interactions of any run ({cheapest['algo']} seed "
                     f"{cheapest['seed']}); {budget:,} = the stored-step budget")
        lines.append(render(head, body))
    return "\n".join(lines)


def es_line(rows: list[dict[str, Any]]) -> str:
    es = [r for r in rows if r["env"] == "Pendulum-v1" and r["algo"] == "es"]
    if not es:
        return "Pendulum-v1 --algo es: no finished seed yet"
    lines = []
    for budget in sorted({r["budget_steps"] for r in es}):
        rs = [r for r in es if r["budget_steps"] == budget]
        # The verdict is on μ's own return from 10 fixed start states at the end of the run: with
        # antithetic jobs the run's f(μ) is each pair's mean return, which sits below f(μ) by the
        # cost of the perturbations (σ 0.1: about 350 on Pendulum), so it is printed beside it.
        direct = [r["mu_final_fixed_starts"] for r in rs if "mu_final_fixed_starts" in r]
        judged = direct if len(direct) == len(rs) else [r["final"] for r in rs]
        mean = float(np.mean(judged))
        verdict = "met" if mean >= ES_TARGET else "missed"
        per_seed = ", ".join(f"{x:.0f}" for x in judged)
        what = "final μ on 10 fixed start states" if judged is direct else "final f(μ)"
        lines.append(f"Pendulum-v1 --algo es at {budget:,} stored steps: {what} {mean_std(judged)} over {len(rs)} "
                     f"seed(s) (per seed: {per_seed}); run's f(μ) estimate {mean_std([r['final'] for r in rs])}; "
                     f"target mean ≥ {ES_TARGET:.0f}: {verdict}")
        # the final μ on 10 fixed start states, beside each ES variant's (the reference: --algo es)
        for algo in ("es", *ES_VARIANTS):
            vs = [r for r in rows if r["env"] == "Pendulum-v1" and r["algo"] == algo and r["budget_steps"] == budget
                  and "mu_final_fixed_starts" in r]
            if vs:
                fixed = [r["mu_final_fixed_starts"] for r in vs]
                lines.append(f"  {algo}: final μ on 10 fixed start states {mean_std(fixed)} (per seed: "
                             f"{', '.join(f'{x:.0f}' for x in fixed)}); f(μ) {mean_std([r['final'] for r in vs])}; "
                             f"{_mean(vs, 'interactions') / budget:.1f} interactions per stored step")
    return "\n".join(lines)


def _mean(rs: list[dict[str, Any]], key: str) -> float:
    vals = [r[key] for r in rs if r.get(key) is not None and math.isfinite(r[key])]
    return float(np.mean(vals)) if vals else math.nan


def quarter_drops(row: dict[str, Any], random_steps: int) -> list[tuple[int, int, float, float]]:
    """(start, end, f(μ) at start, f(μ) at end) of each part of the budget after the random phase
    (random phase → 25 %, 25 → 50, 50 → 75, 75 → 100 %) that ended below its start."""
    curve = np.array(row["curve"], dtype=float)
    if not len(curve):
        return []
    ok = np.isfinite(curve[:, 3])
    xs, ys = curve[ok, 0], curve[ok, 3]
    budget = row["budget_steps"]
    marks = [m for m in (random_steps, budget // 4, budget // 2, 3 * budget // 4, budget) if m >= random_steps]
    out = []
    for a, b in zip(marks, marks[1:], strict=False):
        fa, fb = window_mean(xs, ys, a), window_mean(xs, ys, b)
        if math.isfinite(fa) and math.isfinite(fb) and fb < fa:
            out.append((a, b, fa, fb))
    return out


def targets(rows: list[dict[str, Any]]) -> str:
    """Issue 14's targets, each with its measured figures and met / missed / open (cells missing)."""
    lines = []
    envs = sorted({(r["env"], r["budget_steps"]) for r in rows if r["algo"] in ("aesrl", "td3", "cemrl")})
    g = groups(rows)
    for env, budget in envs:
        def rs(algo, env=env, budget=budget):
            return g.get((env, budget, algo), [])
        a = rs("aesrl")
        for other in ("td3", "cemrl"):
            o = rs(other)
            if a and o:
                ok = _mean(a, "final") >= _mean(o, "final")
                lines.append(f"{env}: aesrl {_mean(a, 'final'):.0f} ({len(a)} seeds) >= {other} "
                             f"{_mean(o, 'final'):.0f} ({len(o)} seeds) at 100 %: {'met' if ok else 'missed'}")
        pa = rs("aesrl-paper")
        if a and pa:
            parts = [f"{q}: {_mean(a, k):.0f} vs {_mean(pa, k):.0f}" for q, k in (("25 %", "q25"), ("50 %", "q50"),
                                                                                   ("100 %", "final"))]
            ok = all(_mean(a, k) >= _mean(pa, k) for k in ("q25", "q50", "final"))
            lines.append(f"{env}: aesrl >= aesrl-paper at 25/50/100 % ({'; '.join(parts)}): "
                         f"{'met' if ok else 'missed'}")
        # the issue asks for the same budget and seeds: compare on the seeds both have run
        both = sorted({r["seed"] for r in rs("td3")} & {r["seed"] for r in rs("sb3-td3")})
        t = [r for r in rs("td3") if r["seed"] in both]
        sb = [r for r in rs("sb3-td3") if r["seed"] in both]
        if t and sb:
            ft, fs = _mean(t, "final"), _mean(sb, "final")
            ok = ft >= fs or ft >= fs - 0.15 * abs(fs)
            lines.append(f"{env}: td3 {ft:.0f} vs sb3-td3 {fs:.0f} on seeds {', '.join(map(str, both))} "
                         f"(within 15 % or ahead): {'met' if ok else 'missed'}")
        for algo in ("aesrl",):
            for r in rs(algo):
                random_steps = int(r.get("settings", {}).get("random_steps", 0) or 0)
                drops = quarter_drops(r, random_steps)
                verdict = "met" if not drops else "missed: " + "; ".join(
                    f"{a0:,}→{b0:,} steps {fa:.0f}→{fb:.0f}" for a0, b0, fa, fb in drops)
                lines.append(f"{env}: {algo} seed {r['seed']} never ends a quarter below its start: {verdict}")
    return "\n".join(lines) if lines else "  (no comparable cells yet)"


def counted_repeats(repeats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The repeats that are runs of the algorithm as its table row ran it (`"counts": true`), not variants."""
    return [r for r in repeats if r.get("counts") and r["algo"] in ALGOS]


def on_its_back(row: dict[str, Any]) -> bool | None:
    """Whether the run's final policy ran turned over (HalfCheetah rows with `final_posture`), else None."""
    posture = row.get("final_posture")
    return None if not posture else posture["turned_over"] > 0.5


def per_seed_medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One pseudo-row per seed: the median of that seed's runs at 25 / 50 / 100 % (and their finals)."""
    out = []
    for seed in sorted({r["seed"] for r in runs}):
        rs = [r for r in runs if r["seed"] == seed]
        out.append({"seed": seed, "runs": len(rs), "finals": [r["final"] for r in rs],
                    "back": [on_its_back(r) for r in rs],
                    **{k: float(np.median([r[k] for r in rs])) for k in ("q25", "q50", "final")}})
    return out


def table_every_run(rows: list[dict[str, Any]], repeats: list[dict[str, Any]]) -> str:
    """The main algorithms with every counted run of a seed: each seed's median run, then mean ± std over
    seeds, beside the table's one-run-per-seed figures; and the 100 % targets on that footing."""
    extra = counted_repeats(repeats)
    if not extra:
        return ""
    envs = {(r["env"], r["budget_steps"]) for r in extra}
    head = ["env", "algo", "seeds", "runs", "f(μ) @25%", "@50%", "@100%", "@100% (table)", "on its back",
            "finals per seed (b: on its back)"]
    body, medians = [], {}
    for (env, budget, algo), rs in groups(rows).items():
        if algo not in ALGOS or (env, budget) not in envs:
            continue
        runs = rs + [r for r in extra if (r["env"], r["budget_steps"], r["algo"]) == (env, budget, algo)]
        med = medians[(env, budget, algo)] = per_seed_medians(runs)
        body.append([env, algo, str(len(med)), str(len(runs)), mean_std([m["q25"] for m in med]),
                     mean_std([m["q50"] for m in med]), mean_std([m["final"] for m in med]),
                     mean_std([r["final"] for r in rs]),
                     f"{sum(b is True for m in med for b in m['back'])} of "
                     f"{sum(b is not None for m in med for b in m['back'])}",
                     "; ".join(f"s{m['seed']}: " + ", ".join(f"{x:.0f}" + ("b" if b else "")
                                                            for x, b in zip(m["finals"], m["back"], strict=True))
                               for m in med)])
    lines = [render(head, body)]
    for (env, budget, algo), med in medians.items():
        if algo != "aesrl":
            continue
        a = float(np.mean([m["final"] for m in med]))
        for other in ("td3", "cemrl"):
            if (env, budget, other) in medians:
                o = float(np.mean([m["final"] for m in medians[(env, budget, other)]]))
                lines.append(f"{env}: with every run (median per seed), aesrl {a:.0f} >= {other} {o:.0f} at 100 %: "
                             f"{'met' if a >= o else 'missed'}")
    return "\n".join(lines)


def settings_lines(rows: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, str] = {}
    for r in rows:
        seen.setdefault(f"{r['env']} ({r['budget_steps']:,} steps)", r.get("settings", {}).get("describe", "?"))
    return [f"  {k}: {v}" for k, v in seen.items()]


def plot_env(rows: list[dict[str, Any]], env: str, path: Path, title: str = "") -> None:
    """f(μ) against stored steps, wall clock and interactions: mean ± std over seeds, from the rows' curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_spec = [(0, "stored env steps", 1.0), (2, "wall clock (min)", 1 / 60), (1, "env interactions", 1.0)]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5))
    budgets = sorted({r["budget_steps"] for r in rows if r["env"] == env})
    for (e, budget, algo), rs in groups(rows).items():
        if e != env:
            continue
        label = f"{algo} ({len(rs)} seed{'s' if len(rs) > 1 else ''})"
        if len(budgets) > 1:
            label += f", budget {budget:,}"
        for ax, (col, xlabel, scale) in zip(axes, axes_spec, strict=True):
            curves = [np.array(r["curve"], dtype=float) for r in rs]
            curves = [c[np.isfinite(c[:, col])] for c in curves]
            curves = [c for c in curves if len(c)]
            if not curves:
                continue
            hi = min(c[:, col].max() for c in curves)
            grid = np.linspace(min(c[:, col].min() for c in curves), hi, 100)
            ys = np.vstack([np.interp(grid, c[:, col], c[:, 3], left=np.nan) for c in curves])
            mean, std = np.nanmean(ys, axis=0), np.nanstd(ys, axis=0)
            line, = ax.plot(grid * scale, mean, label=label)
            ax.fill_between(grid * scale, mean - std, mean + std, color=line.get_color(), alpha=0.2)
            ax.set_xlabel(xlabel)
    axes[0].set_ylabel("f(μ)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{env}{title}: f(μ), mean ± std over seeds (budget {', '.join(f'{b:,}' for b in budgets)} "
                 "stored steps)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report(rows: list[dict[str, Any]], runs_dir: Path, repeats: list[dict[str, Any]] | None = None) -> None:
    if not rows:
        print("no finished cells yet")
        return
    print("\nAt equal stored steps (f(μ): mean over the last tenth of each part of the budget; mean ± std over "
          "seeds; interactions: every env step, f(μ) episodes included):")
    print(table_steps(rows))
    print("\nAt equal environment interactions (the same window, on the interactions axis):")
    print(table_interactions(rows) or "  (needs two algorithms of one environment)")
    print("\nTargets (issue 14):")
    print(targets(rows))
    every = table_every_run(rows, repeats or [])
    if every:
        print("\nWith the same-seed repeats (learning-repeats.json, the runs marked as counting): each seed's "
              "median run, then mean ± std over seeds; '@100% (table)' is the one-run-per-seed figure above:")
        print(every)
    print()
    print(es_line(rows))
    print("\nSettings (the same for every algorithm of an environment; queue runs use "
          f"{rows[0].get('settings', {}).get('workers', WORKERS)} workers):")
    print("\n".join(settings_lines(rows)))
    # the algorithms in one figure; the variants, beside the default, in another (two dozen
    # curves in one legend hide the comparison the table is about)
    main_rows = [r for r in rows if r["algo"] in ALGOS]
    variant_rows = [r for r in rows if r["algo"] not in ALGOS or r["algo"] in ("aesrl", "es")]
    for env in sorted({r["env"] for r in rows}):
        has_variants = any(r["env"] == env and r["algo"] not in ALGOS for r in rows)
        for suffix, subset, title, draw in (("", main_rows, "", any(r["env"] == env for r in main_rows)),
                                            ("-variants", variant_rows, " variants", has_variants)):
            if draw:
                png = runs_dir / f"curves-{env}{suffix}.png"
                plot_env(subset, env, png, title)
                print(f"plot: {png}")
    total = sum(r["wall_s"] for r in rows)
    print(f"total compute: {total / 3600:.2f} h of wall clock over {len(rows)} cells "
          f"(first {min(r.get('date', '?') for r in rows)}, last {max(r.get('date', '?') for r in rows)})")


# -- main ------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("--quick", action="store_true", help="Pendulum-v1, tiny budget, seed 1 (about two minutes)")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="where learning.json and learning/ go (default bench/results; --quick: a temporary folder)")
    ap.add_argument("--cells", default="", help="comma-separated env:algo:seed cells (instead of the filters)")
    ap.add_argument("--envs", default="", help="comma-separated environments (default: all of the mode)")
    ap.add_argument("--algos", default="", help=f"comma-separated algorithms out of {','.join(ALGOS)}; the variants "
                    f"{','.join(VARIANTS)} run only when named here or in --cells")
    ap.add_argument("--seeds", default="", help="comma-separated seeds (default 1,2,3; --quick 1)")
    ap.add_argument("--order", choices=("seed", "env"), default="seed",
                    help="seed: seed 1 of every env and algo first, then seed 2, ...; env: env by env")
    ap.add_argument("--max-hours", type=float, default=None, help="start no new cell after this many hours")
    ap.add_argument("--timeout-min", type=float, default=None,
                    help="kill a cell after this many minutes (default 90; --quick 3)")
    ap.add_argument("--report", action="store_true", help="only print the tables and draw the plots")
    ap.add_argument("--dry-run", action="store_true", help="list the cells that would run, and stop")
    ap.add_argument("--repeat", action="store_true",
                    help="run the cells even if learning.json has them, and append their rows to "
                         "learning-repeats.json (counted in the report's every-run table) instead")
    ap.add_argument("--postures", action="store_true",
                    help="measure how the final policy of each HalfCheetah row whose run folder is still here runs "
                         "(turned over or upright: final_posture), then report")
    ap.add_argument("--note", default="", help="with --repeat: a note stored in the row (what this run checks)")
    args = ap.parse_args(argv)
    if args.note and not args.repeat:
        ap.error("--note goes with --repeat")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwinds through run_cell

    mode = "quick" if args.quick else "full"
    settings = MODES[mode]
    if args.timeout_min is not None:
        settings = {env: replace(s, timeout_min=args.timeout_min) for env, s in settings.items()}
    out_dir = args.out_dir or (Path(tempfile.mkdtemp(prefix="aesrl-learning-")) if args.quick else RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, runs_dir = out_dir / "learning.json", out_dir / "learning"
    repeats_path = out_dir / "learning-repeats.json"
    print(f"results: {json_path}; run folders and plots: {runs_dir}", flush=True)
    if args.postures:
        print(f"final_posture added to {add_postures([json_path, repeats_path], runs_dir)} row(s)", flush=True)
    if args.report or args.postures:
        report(load_rows(json_path), runs_dir, load_rows(repeats_path))
        return 0

    if args.cells:
        cells = parse_cells(args.cells, settings)
    else:
        seeds = [int(s) for s in args.seeds.split(",") if s] or ([1] if args.quick else list(FULL_SEEDS))
        envs = [e for e in args.envs.split(",") if e]
        algos = [a for a in args.algos.split(",") if a]
        for name, given, known in (("envs", envs, settings), ("algos", algos, (*ALGOS, *VARIANTS))):
            if bad := [x for x in given if x not in known]:
                ap.error(f"--{name}: unknown {', '.join(bad)} in {mode} mode; known: {', '.join(known)}")
        cells = select_cells(settings, envs, algos, seeds, args.order)
    if importlib.util.find_spec("stable_baselines3") is None and any(c.algo == "sb3-td3" for c in cells):
        print("stable-baselines3 is not installed (pip install -e '.[bench]'): sb3-td3 cells left out", flush=True)
        cells = [c for c in cells if c.algo != "sb3-td3"]
    done = {row_key(r["env"], r["algo"], r["seed"], r["budget_steps"]) for r in load_rows(json_path)}
    todo = cells if args.repeat else \
        [c for c in cells if row_key(c.env, c.algo, c.seed, settings[c.env].steps) not in done]
    print(f"{mode} mode, {os.cpu_count()} cores: {len(cells)} cells selected, {len(cells) - len(todo)} already in "
          f"{json_path.name}, {len(todo)} to run" + (f" as repeats into {repeats_path.name}" if args.repeat else ""),
          flush=True)
    for env in dict.fromkeys(c.env for c in todo):
        print(f"  {env}: {settings[env].describe()}", flush=True)
    if args.dry_run:
        print("\n".join(f"  {c}" for c in todo))
        return 0

    t_start, failed = time.monotonic(), []
    for i, cell in enumerate(todo, 1):
        hours = (time.monotonic() - t_start) / 3600
        if args.max_hours is not None and hours >= args.max_hours:
            print(f"--max-hours {args.max_hours:g} reached after {hours:.2f} h: {len(todo) - i + 1} cells left "
                  "for the next sitting", flush=True)
            break
        s = settings[cell.env]
        cell_commit = git_commit()  # per cell: a sitting can span commits, and each cell runs the tree as it is
        load_start = os.getloadavg()
        print(f"[{i}/{len(todo)}] {cell} ...", end=" ", flush=True)
        suffix = time.strftime("-r%Y%m%d-%H%M%S") + f"-{os.getpid()}" if args.repeat else ""
        folder, wall, outcome, cmd = run_cell(cell, s, runs_dir, suffix)
        log_path = folder.with_name(folder.name + ".log")
        if outcome == "ok":
            try:
                stats = summarise(folder, s.steps)
                if cell.env == "Pendulum-v1" and cell.algo in ("es", *ES_VARIANTS):
                    stats["mu_final_fixed_starts"] = mu_on_fixed_starts(folder)
                if cell.env.startswith("HalfCheetah") and (folder / "policy.npz").exists():
                    stats["final_posture"] = cheetah_posture(folder)
            except Exception as exc:  # an unreadable or empty run folder: report, do not record
                outcome = f"no result ({exc})"
        if outcome != "ok":
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:] if log_path.exists() else []
            print(f"FAILED: {outcome} after {wall:.0f} s; log {log_path}", flush=True)
            print("\n".join(f"    {line}" for line in tail), flush=True)
            failed.append(cell)
            continue
        row = {"env": cell.env, "algo": cell.algo, "seed": cell.seed, "budget_steps": s.steps,
               "wall_s": round(wall, 1), **stats,
               "settings": {**asdict(s), "describe": s.describe(), "workers": WORKERS_OF.get(cell.algo, WORKERS),
                            "mode": mode},
               "command": " ".join(Path(c).name if c == sys.executable else c for c in cmd),
               "date": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": cell_commit, "versions": package_versions(),
               "loadavg_start": [round(x, 2) for x in load_start],
               "loadavg_end": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count()}
        if args.repeat:
            row.update(counts=cell.algo in ALGOS,
                       note=args.note or f"a repeat of the cell with the code at {cell_commit}")
        append_row(repeats_path if args.repeat else json_path, row)
        print(f"ok in {wall / 60:.1f} min: f(μ) q25 {row['q25']:.0f}, q50 {row['q50']:.0f}, final {row['final']:.0f}; "
              f"{row['interactions']:,} interactions", flush=True)

    report(load_rows(json_path), runs_dir, load_rows(repeats_path))
    if failed:
        print(f"{len(failed)} cell(s) failed and were not recorded: {', '.join(map(str, failed))}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
