"""How AES-RL learns with many workers (issue 47, item 3): virtual runs (aesrl_queue/virtual.py) over a
grid of environments, algorithms, worker counts and seeds, each cell in its own process.

A skeleton of the measurement: it runs the cells and writes one JSON line per cell with what the
issue asks of it, read off the cell's metrics.jsonl (`aesrl-queue plot` draws the folders):

- f(μ) at --interactions needed interactions: the mean of the last 10 f(μ) estimates up to the first
  update at or past that mark (the learning protocol's fixed-start-state scoring is not applied yet);
- the virtual seconds until that mean first reaches each of --thresholds;
- the staleness: quantiles of `lag` (versions μ moved while an individual ran) over the run.

Not here yet: the parallel TD3 cells (N environment workers feeding one learner at the learner's rate),
which are no queue algorithm, and the results file and plot of docs/scaling.md.

    python bench/virtual.py --envs HalfCheetah-v5,Walker2d-v5 --algos aesrl,pcemrl --workers 2,16,128,1024 \\
        --seeds 1,2 --steps 100000 --cost-model cost-model.json [--jobs 2] [--runs DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WINDOW = 10  # f(μ) estimates averaged, as the progress line's f(μ)~


def score(metrics: list[dict[str, Any]], interactions: int, thresholds: list[float]) -> dict[str, Any]:
    """What one cell's metrics.jsonl says: f(μ)~ at `interactions`, virtual seconds to each threshold, lags."""
    updates = [r for r in metrics if r.get("type") == "update"]
    recent: list[float] = []
    at_mark = None
    reached: dict[str, float | None] = {str(t): None for t in thresholds}
    for u in updates:
        if isinstance(u.get("f_mu"), int | float):
            recent = (recent + [float(u["f_mu"])])[-WINDOW:]
        if not recent:
            continue
        mean = sum(recent) / len(recent)
        if at_mark is None and (u.get("interactions") or 0) >= interactions:
            at_mark = mean
        for t in thresholds:
            if reached[str(t)] is None and mean >= t:
                reached[str(t)] = u["t"]
    lags = sorted(int(u["lag"]) for u in updates if isinstance(u.get("lag"), int))

    def q(p: float) -> int | None:
        return lags[min(len(lags) - 1, int(p * len(lags)))] if lags else None

    return {"f_mu_at_mark": at_mark, "virtual_s_to": reached, "lag_p50": q(0.5), "lag_p90": q(0.9),
            "lag_max": lags[-1] if lags else None, "updates": len(updates)}


def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """One virtual run in this (pool) process; its line of the results."""
    from aesrl_queue.config import RunConfig
    from aesrl_queue.cost_model import resolve
    from aesrl_queue.metrics import read_metrics
    from aesrl_queue.virtual import VirtualRun

    run_id = f"v-{cell['env'].split('-')[0].lower()}-{cell['algo']}-n{cell['workers']}-s{cell['seed']}"
    cfg = RunConfig.from_preset(cell["env"], algo=cell["algo"], seed=cell["seed"], run_id=run_id,
                                total_steps=cell["steps"]).resolve()
    t0 = time.monotonic()
    run = VirtualRun(cfg, cell["workers"], resolve(cell["cost_model"]), out_dir=cell["runs"])
    summary = run.run()
    return {**{k: cell[k] for k in ("env", "algo", "workers", "seed", "steps")}, "run_dir": str(run.run_dir),
            "status": summary.get("status"), "virtual_s": summary.get("virtual", {}).get("virtual_s"),
            "wall_s": round(time.monotonic() - t0, 1),
            **score(read_metrics(run.run_dir), cell["interactions"], cell["thresholds"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--envs", default="HalfCheetah-v5,Walker2d-v5")
    ap.add_argument("--algos", default="aesrl,pcemrl")
    ap.add_argument("--workers", default="2,16,128,1024")
    ap.add_argument("--seeds", default="1,2", help="development seeds only")
    ap.add_argument("--steps", type=int, default=100_000, help="budget of stored steps per cell")
    ap.add_argument("--interactions", type=int, default=100_000, help="where f(μ)~ is read")
    ap.add_argument("--thresholds", default="1000,2000,3000", help="f(μ)~ levels timed in virtual seconds")
    ap.add_argument("--cost-model", default=None, help="a cost-model file (default: nominal durations)")
    ap.add_argument("--jobs", type=int, default=1, help="cells at once, each in its own process")
    ap.add_argument("--runs", default="runs/virtual", help="folder of the cells' run folders")
    ap.add_argument("--out", default="bench/results/virtual.jsonl")
    args = ap.parse_args()
    cells = [{"env": env, "algo": algo, "workers": int(n), "seed": int(seed), "steps": args.steps,
              "interactions": args.interactions, "thresholds": [float(t) for t in args.thresholds.split(",")],
              "cost_model": args.cost_model, "runs": args.runs}
             for env, algo, n, seed in itertools.product(args.envs.split(","), args.algos.split(","),
                                                          args.workers.split(","), args.seeds.split(","))]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool, open(out, "a") as fh:
        for line in pool.map(run_cell, cells):
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
