"""Learning per hour: AES-RL against our TD3 and serial CEM-RL, f(μ) against steps and wall clock.

Each (environment, algorithm, seed) is one `aesrl-queue run` (embedded Redis, local critic and
workers) writing a run folder; the table reads the folders, and `aesrl-queue plot` draws the curves.
Budgets and network sizes are cut to fit a 2-core machine and are printed with the table.

Usage: python bench/learning.py [--quick] [--envs Pendulum-v1,HalfCheetah-v5] [--seeds 2] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

DEFAULT_DIR = ROOT / "bench" / "results" / "learning"
ALGOS = ("aesrl", "td3", "cemrl")

# Budgets that fit this machine (2 cores: workers, critic daemon and scheduler share them).
SETTINGS = {
    "full": {
        "Pendulum-v1": {"steps": 20_000, "hidden": "64,64", "critic_hidden": "256,256", "initial_steps": 2_000,
                        "td3_start_steps": 2_000, "td3_eval_every": 1_000},
        "HalfCheetah-v5": {"steps": 30_000, "hidden": "64,64", "critic_hidden": "256,256", "initial_steps": 5_000,
                           "td3_start_steps": 5_000, "td3_eval_every": 2_000},
    },
    "quick": {
        "Pendulum-v1": {"steps": 1_200, "hidden": "16,16", "critic_hidden": "32,32", "initial_steps": 400,
                        "td3_start_steps": 400, "td3_eval_every": 200, "batch_size": 32, "critic_chunk": 50, "rl_steps_max": 100},
    },
}


def run_folder(out_dir: Path, env: str, algo: str, seed: int) -> Path:
    return out_dir / env / f"{algo}-s{seed}"


def launch(out_dir: Path, env: str, algo: str, seed: int, settings: dict[str, Any], workers: int,
           timeout: float) -> tuple[Path, float, int]:
    """One `aesrl-queue run`; returns (run folder, wall seconds, exit code)."""
    run_id = f"learn-{env.split('-')[0].lower()}-{algo}-s{seed}"
    dest = out_dir / env
    dest.mkdir(parents=True, exist_ok=True)
    cfg = {k: v for k, v in settings.items() if k not in ("steps", "hidden", "critic_hidden")}
    cfg_file = dest / f".{algo}-s{seed}.json"
    cfg_file.write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "cli.main", "run", "--env", env, "--algo", algo, "--seed", str(seed),
           "--steps", str(settings["steps"]), "--hidden", settings["hidden"],
           "--critic-hidden", settings["critic_hidden"], "--workers", str(workers), "--out", str(dest),
           "--run-id", run_id, "--config", str(cfg_file)]
    env_vars = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env_vars.pop("AESRL_REDIS_URL", None)
    t0 = time.monotonic()
    with open(dest / f".{algo}-s{seed}.log", "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, env=env_vars, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    wall = time.monotonic() - t0
    folder = dest / run_id
    if folder.exists():
        final = run_folder(out_dir, env, algo, seed)
        if final.exists():
            import shutil

            shutil.rmtree(final)
        folder.rename(final)
        folder = final
    return folder, wall, proc.returncode


def f_mu_at(evals: list[dict[str, Any]], key: str, x: float) -> float:
    """Mean f(μ) of the evaluations in the last 10% of [0, x] on axis `key` (NaN if none)."""
    pts = [(r[key], r["f_mu"]) for r in evals if isinstance(r.get(key), int | float) and r[key] <= x]
    if not pts:
        return math.nan
    lo = 0.9 * x
    window = [f for k, f in pts if k >= lo] or [pts[-1][1]]
    return float(np.mean(window))


def summarise(folder: Path, budget: int, wall_marks: list[float]) -> dict[str, Any]:
    from cli.plot import load_run

    run = load_run(folder)
    evals = run.evals
    out = {"folder": str(folder.relative_to(ROOT)) if folder.is_relative_to(ROOT) else str(folder),
           "evals": len(evals), "elapsed_s": max((r.get("elapsed") or 0.0) for r in evals)}
    for frac in (0.25, 0.5, 1.0):
        out[f"f_mu_steps_{int(frac * 100)}"] = f_mu_at(evals, "steps", frac * budget)
    for w in wall_marks:
        out[f"f_mu_wall_{int(w)}s"] = f_mu_at(evals, "elapsed", w)
    return out


def render(rows: list[dict[str, Any]], wall_marks: list[float]) -> str:
    head = ["env", "algo", "seeds", "f(μ)@25%", "f(μ)@50%", "f(μ)@100%"] + [f"f(μ)@{int(w)}s" for w in wall_marks]
    head += ["wall s"]
    lines = [" | ".join(f"{h:>14}" for h in head), "-+-".join("-" * 14 for _ in head)]

    def cell(vals: list[float]) -> str:
        vals = [v for v in vals if math.isfinite(v)]
        if not vals:
            return "-"
        return f"{np.mean(vals):.1f}±{np.std(vals):.1f}" if len(vals) > 1 else f"{vals[0]:.1f}"

    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["env"], r["algo"]), []).append(r)
    for (env, algo), rs in groups.items():
        cells = [env, algo, str(len(rs))]
        cells += [cell([r[f"f_mu_steps_{p}"] for r in rs]) for p in (25, 50, 100)]
        cells += [cell([r[f"f_mu_wall_{int(w)}s"] for r in rs]) for w in wall_marks]
        cells += [f"{np.mean([r['wall_s'] for r in rs]):.0f}"]
        lines.append(" | ".join(f"{c:>14}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="Pendulum-v1 only, tiny budget, one seed: about a minute")
    ap.add_argument("--envs", default="", help="comma-separated environments (default: all of the mode)")
    ap.add_argument("--algos", default=",".join(ALGOS), help="comma-separated algorithms")
    ap.add_argument("--seeds", type=int, default=0, help="seeds per algorithm (default 2, quick 1)")
    ap.add_argument("--workers", type=int, default=2, help="workers per run")
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_DIR, help="where run folders, plots and JSON go")
    args = ap.parse_args(argv)
    mode = "quick" if args.quick else "full"
    settings = SETTINGS[mode]
    envs = [e for e in args.envs.split(",") if e] or list(settings)
    for e in envs:
        if e not in settings:
            ap.error(f"--envs: no {mode} settings for {e!r}; known: {', '.join(settings)}")
    algos = [a for a in args.algos.split(",") if a]
    seeds = args.seeds or (1 if args.quick else 2)
    out_dir = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    print(f"machine: {os.cpu_count()} cores, {platform.platform()}; {mode} mode; {args.workers} workers per run",
          flush=True)
    rows: list[dict[str, Any]] = []
    plots = {}
    for env in envs:
        s = settings[env]
        print(f"{env}: budget {s['steps']} stored steps, actor {s['hidden']}, critic {s['critic_hidden']}, "
              f"random phase {s['initial_steps']} (TD3 start steps {s['td3_start_steps']})", flush=True)
        folders = []
        for algo in algos:
            for seed in range(1, seeds + 1):
                timeout = 120 + s["steps"] * (0.2 if env.startswith("HalfCheetah") else 0.05)
                folder, wall, rc = launch(out_dir, env, algo, seed, s, args.workers, timeout)
                print(f"  {algo:6s} seed {seed}: exit {rc} in {wall:.0f}s -> {folder}", flush=True)
                if rc != 0 or not folder.exists():
                    raise SystemExit(f"run {algo} seed {seed} on {env} failed (exit {rc}); see "
                                     f"{out_dir / env / f'.{algo}-s{seed}.log'}")
                folders.append(folder)
                rows.append({"env": env, "algo": algo, "seed": seed, "wall_s": wall, "budget": s["steps"]})
        walls = sorted(r["wall_s"] for r in rows if r["env"] == env)
        # Wall-clock marks: a third and two thirds of the fastest run, so every run has data there.
        marks = [round(walls[0] / 3), round(2 * walls[0] / 3)]
        for r, folder in zip([r for r in rows if r["env"] == env], folders, strict=True):
            r.update(summarise(folder, s["steps"], marks))
            r["wall_marks"] = marks
        png = out_dir / f"{env}.png"
        proc = subprocess.run([sys.executable, "-m", "cli.main", "plot", *map(str, folders), "-o", str(png),
                               "--title", f"{env}: {', '.join(algos)} ({mode} budget, {seeds} seed(s))"],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise SystemExit(f"aesrl-queue plot failed: {proc.stderr[-2000:]}")
        plots[env] = str(png)
        print(render([r for r in rows if r["env"] == env], marks))
        print(f"  plot: {png}", flush=True)
    out = {"mode": mode, "settings": {e: settings[e] for e in envs}, "algos": algos, "seeds": seeds,
           "workers": args.workers, "rows": rows, "plots": plots, "seconds": time.time() - t_start,
           "machine": {"cores": os.cpu_count(), "platform": platform.platform(), "loadavg": os.getloadavg()}}
    (out_dir / "learning.json").write_text(json.dumps(out, indent=1, default=float))
    print("- f(μ)@x%: mean f(μ) over the last tenth of [0, x% of the budget] of stored steps; f(μ)@Ns: the "
          "same over wall clock since the run's first result; ± is the std over seeds. TD3's f(μ) is its "
          "deterministic actor, evaluated every td3_eval_every steps.")
    print(f"wrote {out_dir / 'learning.json'} ({time.time() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
