"""Every algorithm of the paper on Pendulum-v1 on one runtime: f(μ) at fixed stored-step and wall-clock
budgets, several seeds each. Prints a table and writes bench/results/compare.json.

One private Redis and one pool of `rq worker` processes serve every run; each run gets its own
scheduler (and critic daemon where the algorithm needs one) as forked processes, one run at a time.

Usage: python bench/compare.py [--quick] [--seeds 0,1,2] [--steps S] [--wall T] [--algos a,b] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing as mp
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before numpy/torch load their thread pools

import numpy as np  # noqa: E402

from aesrl_queue.config import ALGOS, RunConfig  # noqa: E402
from aesrl_queue.connection import connect  # noqa: E402
from aesrl_queue.procs import stop_all  # noqa: E402
from aesrl_queue.redis_server import RedisServer  # noqa: E402
from aesrl_queue.store import Store, live_workers  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "compare.json"
ENV_ID = "Pendulum-v1"

MODES = {
    # Full: three seeds of every algorithm in ~25 minutes on two loaded cores. That needs smaller
    # networks than the Pendulum preset (a 256-256 twin critic trains at ~20 steps/s on one loaded
    # core here) and than TD3's 256-256: actor 32-32 and critic 64-64 for every algorithm, 10 000 steps.
    "full": {"steps": 10000, "wall": 60.0, "seeds": (0, 1, 2), "workers": 2, "timeout": 240.0,
             "config": {"initial_steps": 1000, "td3_start_steps": 1000, "td3_eval_every": 500,
                        "hidden": (32, 32), "critic_hidden": (64, 64), "rl_steps_max": 1000},
             "note": "reduced from the Pendulum-v1 preset to fit ~25 min on 2 cores: actor 32-32, critic 64-64 "
                     "(TD3 too, instead of 256-256), 10 000 stored steps (preset 40 000), 1000 random start steps, "
                     "rl_steps <= 1000"},
    # Quick: a smoke run of every algorithm (rows, not numbers): about a minute on 2 quiet cores; the
    # timeout per run is a guard far above that (a slow, loaded host took ~4x).
    "quick": {"steps": 2000, "wall": 5.0, "seeds": (0,), "workers": 2, "timeout": 180.0,
              "config": {"initial_steps": 200, "td3_start_steps": 200, "td3_eval_every": 200, "population": 4,
                         "hidden": (8, 8), "critic_hidden": (16, 16), "mean_eval_episodes": 1,
                         "rl_steps_max": 100, "critic_chunk": 100, "critic_wait": 20.0},
              "note": "smoke run: tiny networks and budget, population 4, one seed; the numbers mean nothing"},
}


# -- child processes (forked: torch and the project are imported once, here) ------------------------
def _child_logging(path: Path) -> None:
    logging.basicConfig(level=logging.INFO, filename=str(path), force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _scheduler_main(url: str, cfg_dict: dict[str, Any], log_path: str) -> None:
    import threading

    import torch

    from aesrl_queue.procs import install_signal_handlers
    from scheduler.loop import make_scheduler

    torch.set_num_threads(1)
    _child_logging(Path(log_path))
    cfg = RunConfig.from_dict(cfg_dict)
    stop = threading.Event()
    install_signal_handlers(stop)
    client, blocking = connect(url), connect(url, blocking=True)
    status = make_scheduler(client, blocking, cfg, stop_event=stop).run()
    sys.exit(0 if status == "finished" else 1)


def _critic_main(url: str, run_id: str, log_path: str) -> None:
    import threading

    import torch

    from aesrl_queue.procs import install_signal_handlers
    from workers.critic import CriticDaemon

    torch.set_num_threads(1)
    _child_logging(Path(log_path))
    stop = threading.Event()
    install_signal_handlers(stop)
    CriticDaemon(connect(url), connect(url, blocking=True), run_id, device="cpu", stop_event=stop).run()


# -- one run ------------------------------------------------------------------------------------------
def run_config(algo: str, seed: int, mode: dict[str, Any], steps: int, run_id: str) -> RunConfig:
    overrides = dict(mode["config"], algo=algo, seed=seed, total_steps=steps, run_id=run_id)
    return RunConfig.from_preset(ENV_ID, **overrides).resolve()


def f_at(series: list[tuple[int, float, float]], *, steps: float | None = None, wall: float | None = None) -> float:
    """The latest finite f(μ) recorded at or before a step count or a wall-clock time (NaN if none)."""
    best = math.nan
    for s, t, f in series:
        if (steps is not None and s > steps) or (wall is not None and t > wall):
            break
        if math.isfinite(f):
            best = f
    return best


def one_run(url: str, algo: str, seed: int, mode: dict[str, Any], steps: int, wall: float, log_dir: Path) -> dict:
    from aesrl_queue.optimizers import needs_critic_daemon

    ctx = mp.get_context("fork")
    run_id = f"cmp-{algo}-s{seed}-{uuid.uuid4().hex[:6]}"
    cfg = run_config(algo, seed, mode, steps, run_id)
    client = connect(url)
    store = Store(client, run_id)
    # The config is written before the processes start, so the critic finds the run at once.
    store.write_config(cfg)
    kids = [ctx.Process(target=_scheduler_main, args=(url, cfg.to_dict(), str(log_dir / f"{run_id}-scheduler.log")),
                        name="scheduler")]
    if needs_critic_daemon(cfg):
        kids.append(ctx.Process(target=_critic_main, args=(url, run_id, str(log_dir / f"{run_id}-critic.log")),
                                name="critic"))
    t0 = time.monotonic()
    timed_out = False
    try:
        for k in kids:
            k.start()
        sched = kids[0]
        sched.join(mode["timeout"])
        timed_out = sched.is_alive()
    finally:
        for k in kids:
            if k.is_alive():
                os.kill(k.pid, signal.SIGTERM)
        for k in kids:
            k.join(20)
            if k.is_alive():
                k.kill()
                k.join(5)
    st = store.state()
    started = st.get("started_at", 0.0)
    series = [(int(h["steps"]), float(h["t"]) - started, float(h["f_mu"]))
              for _i, h in store.history() if isinstance(h.get("f_mu"), float)]
    elapsed = (st.get("finished_at") or st.get("updated_at") or time.time()) - started
    row = {
        "algo": algo, "seed": seed, "run": run_id, "status": st.get("status"), "timed_out": timed_out,
        "steps": st["steps"], "interactions": st["interactions"], "elapsed_s": round(elapsed, 2),
        "process_s": round(time.monotonic() - t0, 2), "rl_applied": st["rl_applied"], "es_applied": st["es_applied"],
        "critic_steps": st["critic_steps"], "f_mu_final": st.get("f_mu", math.nan),
        "f_at_steps": {str(b): f_at(series, steps=b) for b in (steps // 2, steps)},
        "f_at_wall": {str(b): f_at(series, wall=b) for b in (wall / 2, wall)},
        "steps_per_s": round(st["steps"] / elapsed, 1) if elapsed > 0 else 0.0,
        # At most ~200 points of the curve, for plots.
        "series": series[:: max(1, len(series) // 200)] + series[-1:],
    }
    client.close()
    return row


# -- the table ------------------------------------------------------------------------------------------
def _agg(values: list[float]) -> dict[str, Any]:
    good = [v for v in values if isinstance(v, float | int) and math.isfinite(v)]
    if not good:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": float(np.mean(good)), "std": float(np.std(good)), "n": len(good)}


def summarize(runs: list[dict], algos: list[str], steps: int, wall: float) -> list[dict]:
    table = []
    for algo in algos:
        rs = [r for r in runs if r["algo"] == algo]
        row = {"algo": algo, "runs": len(rs), "finished": sum(r["status"] == "finished" for r in rs)}
        for b in (steps // 2, steps):
            row[f"f@{b}steps"] = _agg([r["f_at_steps"][str(b)] for r in rs])
        for b in (wall / 2, wall):
            row[f"f@{b:g}s"] = _agg([r["f_at_wall"][str(b)] for r in rs])
        row["steps_per_s"] = _agg([r["steps_per_s"] for r in rs])
        row["elapsed_s"] = _agg([r["elapsed_s"] for r in rs])
        table.append(row)
    return table


def render(table: list[dict]) -> str:
    keys = [k for k in table[0] if k.startswith("f@")] + ["steps_per_s", "elapsed_s"]

    def cell(a: dict) -> str:
        if a["mean"] is None:
            return "-"
        return f"{a['mean']:.0f} ± {a['std']:.0f}" if a["n"] > 1 else f"{a['mean']:.0f}"

    head = f"{'algo':8} {'done':>5} " + " ".join(f"{k:>16}" for k in keys)
    lines = [head, "-" * len(head)]
    for row in table:
        lines.append(f"{row['algo']:8} {row['finished']:>2}/{row['runs']:<2} " + " ".join(f"{cell(row[k]):>16}" for k in keys))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    mode = dict(MODES["quick" if args.quick else "full"])
    steps = args.steps or mode["steps"]
    wall = args.wall or mode["wall"]
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(mode["seeds"])
    algos = args.algos.split(",") if args.algos else list(ALGOS)
    unknown = sorted(set(algos) - set(ALGOS))
    if unknown:
        raise SystemExit(f"--algos: unknown {', '.join(unknown)}; choose from {', '.join(ALGOS)}")
    workdir = Path(tempfile.mkdtemp(prefix="aesrl-compare-"))
    server = RedisServer(directory=workdir / "redis").start()
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("AESRL_REDIS_URL", None)
    workers = [subprocess.Popen([sys.executable, "-m", "rq.cli", "worker", "-w", "workers.AesrlWorker", "-u", server.url,
                                 "--logging_level", "WARNING", "aesrl-rl", "aesrl-es"], cwd=ROOT, env=env,
                                stdout=open(workdir / f"worker-{i}.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                start_new_session=True)
               for i in range(args.workers or mode["workers"])]
    runs: list[dict] = []
    t_start = time.monotonic()
    try:
        client = connect(server.url)
        deadline = time.monotonic() + 60
        while len(live_workers(client)) < len(workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        import torch

        from aesrl_queue.td3 import warm_up_torch

        torch.set_num_threads(1)
        warm_up_torch()  # torch's lazy imports paid once here, before the forks
        for seed in seeds:
            for algo in algos:
                row = one_run(server.url, algo, seed, mode, steps, wall, workdir)
                runs.append(row)
                print(f"  {algo:7} seed {seed}: {row['status']:9} {row['steps']:>6} steps in {row['elapsed_s']:6.1f}s  "
                      f"f(μ) at {steps} steps {row['f_at_steps'][str(steps)]:8.1f}  at {wall:g}s "
                      f"{row['f_at_wall'][str(wall)]:8.1f}", file=sys.stderr, flush=True)
    finally:
        stop_all(((f"worker-{i}", w) for i, w in enumerate(workers)), grace=15.0)
        server.cleanup()
    table = summarize(runs, algos, steps, wall)
    return {
        "benchmark": "compare", "mode": "quick" if args.quick else "full", "env": ENV_ID,
        "budgets": {"steps": steps, "wall_s": wall}, "seeds": seeds, "workers": len(workers),
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in mode["config"].items()},
        "note": mode["note"],
        "command": " ".join(["python", "bench/compare.py", *sys.argv[1:]]),
        "total_s": round(time.monotonic() - t_start, 1), "machine": {"cpus": os.cpu_count(),
                                                                      "python": platform.python_version()},
        "date": datetime.now().isoformat(timespec="seconds"), "table": table, "runs": runs, "logs": str(workdir),
    }


def _json_safe(x: Any) -> Any:
    """NaN/inf become null (strict JSON)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_safe(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny networks and budgets, one seed; a minute or two")
    ap.add_argument("--seeds", default="", help="comma-separated run seeds (default by mode: 0,1,2 or 0)")
    ap.add_argument("--steps", type=int, default=0, help="stored-step budget per run (default by mode)")
    ap.add_argument("--wall", type=float, default=0.0, help="wall-clock budget in seconds to report f(μ) at")
    ap.add_argument("--algos", default="", help=f"comma-separated subset of {','.join(ALGOS)}")
    ap.add_argument("--workers", type=int, default=0, help="rq worker processes (default 2)")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON results path (default: bench/results/compare.json; --quick: a temporary folder)")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="aesrl-bench-")) / DEFAULT_OUT.name if args.quick else DEFAULT_OUT
    # SIGTERM unwinds like Ctrl-C, so the workers, schedulers and Redis this run started are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    result = run(args)
    print(f"Pendulum-v1, {result['mode']} mode: f(μ) (mean ± std over seeds {result['seeds']}) at "
          f"{result['budgets']['steps'] // 2} and {result['budgets']['steps']} stored steps and at "
          f"{result['budgets']['wall_s'] / 2:g} and {result['budgets']['wall_s']:g} s of wall clock; "
          f"{result['workers']} workers; total {result['total_s']:.0f}s\n{result['note']}")
    print(render(result["table"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(_json_safe(result), indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
