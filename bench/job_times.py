"""Job times of the paper's environments (issue 46, item 4): the seconds per job that docs/scaling.md's
capacity figures multiply by (workers = results per second × seconds per job).

For each environment, two short real runs with one worker on an embedded Redis (`aesrl-queue run`):

- `--algo es`: its jobs as they come (an individual's episode and μ's paired episode);
- the default `aesrl` with `critic_lag` 0 and 5 000 random steps: its antithetic ES pairs and its RL
  jobs that play the daemon's actor. `critic_lag` only holds jobs back while the critic trails the
  stored steps; a job, once it runs, does the same work either way, and without it the run is not paced
  by this machine's learner.

From each run's metrics.jsonl, per kind of job (random-action jobs apart): the jobs, the median episode
length, the median duration, and the median seconds per interaction (a job's duration over the
interactions it played). A full-length job (every episode 1 000 steps, what a policy that stays up
plays) takes that rate × its interactions: **computed**, not measured, wherever the runs' episodes were
shorter. The table then gives the workers one run keeps busy at each limit docs/scaling.md measured:

- `es` at ~1,550 results/s (the scheduler's loop thread);
- the default `aesrl` at ~500 results/s (Redis's command thread with a fan-out instance);
- the default `aesrl` paced by one learner at UTD 1: stored steps per second = the learner's steps per
  second (--learner-rates: an H200's 576, calibrate's CUDA-graph figure; one core of this machine's
  measured by each run's daemon), so workers = learner rate ÷ (interactions per job ÷ job seconds).

    python bench/job_times.py [--envs HalfCheetah-v5,Hopper-v5,...] [--steps 30000] [--runs DIR] [--out FILE] [--reuse]

It records the processor, the BLAS kernel and the load average: job times are this machine's, on one
worker process, beside whatever else ran (the load column).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.learning import machine_facts  # noqa: E402

PAPER_ENVS = "HalfCheetah-v5,Hopper-v5,Walker2d-v5,Ant-v5,Swimmer-v5,Humanoid-v5"
ES_LIMIT, AESRL_LIMIT = 1550.0, 500.0  # results/s per run: docs/scaling.md, "The sizing rule" and "The scale table"
RUNS = {"es": ["--algo", "es"], "aesrl": ["--algo", "aesrl", "--initial-steps", "5000"]}


def job_rows(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per applied result with the interactions its job played (the step in the cumulative count)."""
    rows, before = [], 0
    for r in metrics:
        if r.get("type") != "update" or not isinstance(r.get("interactions"), int):
            continue
        played, before = r["interactions"] - before, r["interactions"]
        if played > 0 and isinstance(r.get("duration"), int | float):
            rows.append({"kind": r["kind"], "random": bool(r.get("random")), "len": r.get("len"),
                         "duration": float(r["duration"]), "played": played})
    return rows


def summarise(rows: list[dict[str, Any]], full_episode: int) -> dict[str, Any]:
    """Per kind (random jobs apart): jobs, median length and duration, and the seconds of the same job
    with every episode `full_episode` steps long. Where the jobs' interactions spread (the longest at
    least twice the shortest) that is a least-squares line, duration = per_job + per_interaction ×
    interactions, read at full length: short episodes carry a job's fixed costs (the result's trip, a
    reset) over few steps. Otherwise the median seconds per interaction × the full-length interactions."""
    import numpy as np

    out = {}
    for kind in sorted({r["kind"] for r in rows}):
        mine = [r for r in rows if r["kind"] == kind and not r["random"]]
        if not mine:
            continue
        played = np.array([r["played"] for r in mine], dtype=float)
        took = np.array([r["duration"] for r in mine])
        episodes = statistics.median(round(r["played"] / max(1, r["len"] or 1)) for r in mine)
        full = episodes * full_episode
        if len(mine) >= 5 and played.max() >= 2 * played.min():
            per_interaction, per_job = np.polyfit(played, took, 1)
            how = "line"
        else:
            per_interaction, per_job, how = float(np.median(took / played)), 0.0, "ratio"
        out[kind] = {"jobs": len(mine), "len_median": statistics.median(r["len"] for r in mine),
                     "interactions_median": float(np.median(played)),
                     "duration_median_s": round(float(np.median(took)), 4), "episodes_per_job": episodes,
                     "s_per_interaction": float(per_interaction), "s_per_job": float(per_job), "fit": how,
                     "full_length_s": round(float(per_job + per_interaction * full), 4)}
    return out


def episode_cap(env: str) -> int:
    """The environment's time limit: the length of every episode of a policy that never falls."""
    import gymnasium as gym

    return int(gym.spec(env).max_episode_steps)


def critic_rate(metrics: list[dict[str, Any]]) -> float | None:
    """The daemon's median learner steps per second over its records, where they say."""
    from aesrl_queue.cost_model import critic_rates

    rates = critic_rates(metrics)
    return round(statistics.median(rates), 1) if rates else None


def run(env: str, algo: str, steps: int, runs: Path, reuse: bool) -> Path:
    from bench.virtual import _finished

    run_id = f"jt-{env.split('-')[0].lower()}-{algo}"
    folder = runs / run_id
    if reuse and _finished(folder):
        return folder
    runs.mkdir(parents=True, exist_ok=True)
    extra = []
    if algo == "aesrl":
        cfg = runs / "critic-lag-0.json"
        cfg.write_text(json.dumps({"critic_lag": 0}))
        extra = ["--config", str(cfg)]
    cmd = [sys.executable, "-m", "cli.main", "run", "--env", env, *RUNS[algo], "--steps", str(steps), *extra, "--workers", "1",
           "--seed", "1", "--snapshot-every", "0", "--out", str(runs), "--run-id", run_id, "--force"]
    print(f"{env} {algo}: aesrl-queue {' '.join(cmd[3:])}", flush=True)
    with open(runs / f"{run_id}.log", "w") as log:
        code = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if code != 0:
        raise SystemExit(f"{run_id} exited with {code}; see {runs / f'{run_id}.log'}")
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--envs", default=PAPER_ENVS)
    ap.add_argument("--learner-rates", default="576", help="learner steps/s to size the learner-paced column by "
                    "(default: an H200's, calibrate's figure in bench/results/gpu/virtual-n14/cost-model-h200.json)")
    ap.add_argument("--steps", type=int, default=30_000, help="stored steps per run")
    ap.add_argument("--runs", default="runs/job-times")
    ap.add_argument("--out", default="bench/results/job-times.json")
    ap.add_argument("--reuse", action="store_true", help="keep finished run folders")
    args = ap.parse_args()
    from aesrl_queue.metrics import read_metrics

    runs, out = Path(args.runs), Path(args.out)
    rates = [float(x) for x in args.learner_rates.split(",")]
    old = json.loads(out.read_text()) if args.reuse and out.is_file() else {}
    before = old.get("envs", {})
    results: dict[str, Any] = {"commands": [*old.get("commands", []), " ".join(["python", *sys.argv])],
                               "machine": old.get("machine") or machine_facts(),
                               "limits": {"es": ES_LIMIT, "aesrl": AESRL_LIMIT}, "learner_rates": rates, "envs": {}}
    for env in args.envs.split(","):
        cell: dict[str, Any] = {}
        for algo in RUNS:
            load = os.getloadavg()[0]
            t0 = time.monotonic()
            folder = run(env, algo, args.steps, runs, args.reuse)
            metrics = read_metrics(folder)
            ran = {"load_before": round(load, 2), "wall_s": round(time.monotonic() - t0, 1)}
            if args.reuse and algo in before.get(env, {}):  # a reused run keeps the load and wall it ran with
                ran = {k: before[env][algo][k] for k in ran}
            cell[algo] = {"run_dir": str(folder), **ran, "kinds": summarise(job_rows(metrics), episode_cap(env)),
                          "critic_steps_per_s": critic_rate(metrics)}
        results["envs"][env] = {**cell, "episode_cap": episode_cap(env)}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")
    print_table(results)


def capacity(cell: dict[str, Any], rates: list[float]) -> dict[str, Any]:
    """Workers per run at each limit, computed from the full-length job times."""
    es = cell["es"]["kinds"].get("es", {})
    kinds = cell["aesrl"]["kinds"]
    share = {"rl": 0.9, "es": 0.1}  # the default's rl_ratio
    mean_job = sum(share[k] * kinds[k]["full_length_s"] for k in share if k in kinds) if set(share) <= set(kinds) else None
    steps_per_job = (sum(share[k] * kinds[k]["episodes_per_job"] * cell["episode_cap"] for k in share)
                     if set(share) <= set(kinds) else None)
    out = {"es_workers": round(ES_LIMIT * es["full_length_s"]) if es else None,
           "aesrl_mean_job_s": mean_job,
           "aesrl_workers_redis": round(AESRL_LIMIT * mean_job) if mean_job else None}
    own = cell["aesrl"].get("critic_steps_per_s")
    for rate in rates + ([own] if own else []):
        key = f"aesrl_workers_learner_{rate:g}"
        out[key] = round(rate / (steps_per_job / mean_job), 3) if mean_job else None
    return out


def per_job(k: dict[str, Any]) -> str:
    return "–" if k["fit"] == "ratio" else f"{1000 * k['s_per_job']:.1f}"


def print_table(results: dict[str, Any]) -> None:
    m = results["machine"]
    print(f"\n{m['cpu']}, {m['cores']} cores, BLAS {m['env'] or 'defaults'}")
    print("| env | run | kind | jobs | median len | median s | ms per job | ms per interaction | fit | full-length job s | load |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|")
    for env, cell in results["envs"].items():
        for algo, r in ((a, cell[a]) for a in RUNS):
            for kind, k in r["kinds"].items():
                print(f"| {env} | {algo} | {kind} | {k['jobs']} | {k['len_median']:g} | {k['duration_median_s']:.3f} | "
                      f"{per_job(k)} | {1000 * k['s_per_interaction']:.3f} | {k['fit']} | "
                      f"{k['full_length_s']:.3f} | {r['load_before']} |")
    rates = results["learner_rates"]
    print("\n| env | es workers at 1,550 results/s | aesrl mean job s | aesrl workers at 500 results/s | "
          + " | ".join(f"aesrl workers a learner of {r:g} steps/s keeps busy" for r in rates)
          + " | this core's learner: steps/s, workers |")
    print("|---|---:|---:|---:|" + "---:|" * len(rates) + "---|")
    for env, cell in results["envs"].items():
        c = capacity(cell, rates)
        own = cell["aesrl"].get("critic_steps_per_s")
        print(f"| {env} | {c['es_workers']} | {c['aesrl_mean_job_s'] and round(c['aesrl_mean_job_s'], 3)} | "
              f"{c['aesrl_workers_redis']} | " + " | ".join(str(c[f'aesrl_workers_learner_{r:g}']) for r in rates)
              + f" | {own}, {c.get(f'aesrl_workers_learner_{own:g}') if own else None} |")


if __name__ == "__main__":
    main()
